//! PD pairs across restarts, on the sandbox (real systemd, journald, D-Bus, the real router) with
//! simulated SGLang servers that really pair (a decode fetches each room's KV from its prefill
//! through the prefill's bootstrap server; docs/sglang-sim.md): the pair gate, stale-pair repair,
//! stranded KV and pairing compatibility.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack, StackOptions};
use pdctl_tests::{assert_recorded, http, pdctl_daemon, poll_until, raw_api, JsonRun, RouterWatch};
use serde_json::{json, Value};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const P2: &str = "sglang-dsv4-prefill-2.service";
const D2: &str = "sglang-dsv4-decode-2.service";
const LIMIT: Duration = Duration::from_secs(150);

fn up(opts: StackOptions) -> (Stack, PathBuf, Pdctld) {
    pdctl_tests::stack_with_pdctld_opts(&opts)
}

fn run(d: &Pdctld, config: &Path, args: &[&str]) -> JsonRun {
    pdctl_daemon(d, config, args, LIMIT)
}

/// A decode of an SGLang release before PR 36029 (it keeps a prefill's bootstrap info).
fn old_decode() -> StackOptions {
    StackOptions { decode_args: vec!["--sim-pair-cache".into(), "stale".into()], ..Default::default() }
}

/// `n` requests through the router, one after the other: how many answered 200.
fn through_router(stack: &Stack, n: usize) -> usize {
    let url = format!("{}/generate", stack.router.as_ref().expect("router").url);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut ok = 0;
        for _ in 0..n {
            let r = http().post(&url).json(&json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}})).timeout(Duration::from_secs(20)).send().await;
            ok += usize::from(r.is_ok_and(|r| r.status() == 200));
        }
        ok
    })
}

fn pairs_of(e: &Value) -> Vec<(String, String, String)> {
    e["detail"]["pairs"]
        .as_array()
        .expect("pairs")
        .iter()
        .map(|p| (p["prefill"].as_str().unwrap_or("").into(), p["decode"].as_str().unwrap_or("").into(), p["result"].as_str().unwrap_or("").into()))
        .collect()
}

/// SGLang 0.5.23 with its default timing (a 300 s waiting timeout, 5 s heartbeats, a failed
/// send dropping the cached prefill): a prefill restart needs no repair and yields no stale
/// verdict; preflight says that the default `pair_timeout` (30 s) cannot cover the decode's
/// waiting timeout and what to set.
#[test]
fn with_sglang_defaults_a_prefill_restart_needs_no_repair_and_preflight_names_the_timing() {
    let (stack, config, d) = up(StackOptions { waiting_timeout_secs: 300.0, ..Default::default() });
    assert_eq!(through_router(&stack, 2), 2, "serving before");
    let decode_run = stack.show(D, "InvocationID").unwrap();
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(stack.show(D, "InvocationID").unwrap(), decode_run, "the decode was not restarted");
    assert!(r.summary["repairs"].as_array().is_none_or(|a| a.is_empty()), "no repair: {:#}", r.summary);
    assert!(pairs_of(r.event(P, "pair", "passed")).iter().all(|(_, _, result)| result != "stale"), "{:#}", r.event(P, "pair", "passed"));
    // The decode's own preflight is not run (only the prefill restarts): check it with a dry run.
    let dry = run(&d, &config, &["restart", "--rolling", "--unit", D, "--dry-run", "--json"]);
    let pre = &dry.event(D, "preflight", "passed")["detail"];
    assert!(pre["warnings"].to_string().contains("SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300s") && pre["warnings"].to_string().contains("310s"), "{pre:#}");
    assert_eq!(through_router(&stack, 2), 2, "serving after");
}

#[test]
fn a_stale_decode_is_found_by_the_pair_gate_repaired_and_serving_proven() {
    let (stack, config, d) = up(old_decode());
    assert_eq!(through_router(&stack, 2), 2, "serving before");
    let watch = RouterWatch::start(&stack);
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    let seen = watch.finish();
    assert_recorded(&d.socket, &r);
    // The repair takes the decode down while the prefill waits drained: both roles at once (1P1D).
    seen.assert_down(1, 1);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let pair = r.event(P, "pair", "passed");
    assert_eq!(pairs_of(pair), vec![(P.into(), D.into(), "stale".into())]);
    assert_eq!(pair["detail"]["stale"], json!([D]));
    assert_eq!(pair["detail"]["pairs"][0]["probes"].as_array().map(Vec::len), Some(2), "probed again: a fixed decode would have refreshed");
    // The decode went through every gate as a repair, its own pair gate included, while the
    // prefill waited out of the router.
    for step in ["drain", "restart", "ready", "health", "pair", "router", "metrics", "stranded_kv", "soak"] {
        assert_eq!(r.event(D, step, "passed")["repair_of"], P, "{step}");
    }
    assert!(r.index(D, "soak", "passed") < r.index(P, "router", "passed"));
    assert_eq!(pairs_of(r.event(D, "pair", "passed")), vec![(P.into(), D.into(), "paired".into())]);
    assert_eq!(r.summary["repairs"], json!({D: P}));
    assert_eq!(r.summary["units"], json!([D, P]));
    assert_eq!(through_router(&stack, 3), 3, "serving proven at the end");
    // The record says the same.
    let id = r.summary["id"].as_str().expect("id");
    let rec = pdctl_tests::record(&d.socket, id);
    assert!(rec["events"].as_array().expect("events").iter().any(|e| e["unit"] == D && e["step"] == "soak" && e["repair_of"] == P));
    assert_eq!(rec["summary"]["repairs"], json!({D: P}));
    // pdctl status: the decode pairs with the prefill, by the last probe.
    let (_, st) = raw_api(&d.socket, "GET", "/v1/status", "");
    let pairs = st["pairs"].as_array().expect("status lists pairs");
    assert!(pairs.iter().any(|p| p["decode"] == D && p["prefill"] == P && p["ok"] == true), "{st:#}");
}

#[test]
fn on_stale_pair_halt_stops_naming_the_decode_and_leaves_it_alone() {
    let (stack, config, d) = up(old_decode());
    let frag = config.parent().expect("dir").join("config.d/20-halt.toml");
    std::fs::write(&frag, "[rollout]\non_stale_pair = \"halt\"\n").expect("fragment");
    let watch = RouterWatch::start(&stack);
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    let seen = watch.finish();
    assert_recorded(&d.socket, &r);
    seen.assert_down(1, 0);
    assert_eq!(r.code, 1, "{:#}", r.summary);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("pair"), Some("stale_pair")));
    assert!(f["cause"].as_str().unwrap_or("").starts_with(&format!("{D} still uses the bootstrap info of {P}")), "{f:#}");
    assert!(!r.touched(D), "the decode is not restarted");
    // What the operator is told is true: requests through the router fail until the decode restarts.
    assert_eq!(through_router(&stack, 1), 0);
}

#[test]
fn a_fixed_decode_refreshes_by_itself_and_needs_no_repair() {
    let (stack, config, d) = up(StackOptions::default());
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(pairs_of(r.event(P, "pair", "passed")), vec![(P.into(), D.into(), "refreshed".into())]);
    assert!(!r.touched(D));
    assert!(r.summary.get("repairs").is_none(), "{:#}", r.summary);
    assert_eq!(through_router(&stack, 3), 3);
}

#[test]
fn a_decode_killed_mid_request_strands_prefill_kv_until_the_bootstrap_timeout() {
    // The prefill holds a room 30 s: longer than the decode's restart up to the stranded-KV gate.
    let (stack, config, d) = up(StackOptions { bootstrap_timeout_secs: 30.0, ..Default::default() });
    // The decode's next request waits before its transfer (a full prealloc queue), so it is in
    // flight when pdctl restarts the decode; the prefill already holds that room's KV.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let boot = stack.prefill.bootstrap_port.expect("bootstrap port");
    let (purl, durl) = (stack.prefill.url.clone(), stack.decode.url.clone());
    let held = rt.block_on(async {
        http().post(format!("{durl}/sim/stall_transfers?secs=60")).send().await.expect("stall");
        let body = json!({"text": "a request in flight", "sampling_params": {"max_new_tokens": 8}, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": 4242});
        for url in [&purl, &durl] {
            let (u, b) = (format!("{url}/generate"), body.clone());
            tokio::spawn(async move { http().post(u).json(&b).send().await.map(|r| r.status().as_u16()) });
        }
        poll_until(Duration::from_secs(20), Duration::from_millis(100), || async {
            let t = http().get(format!("{purl}/metrics")).send().await.ok()?.text().await.ok()?;
            t.lines().any(|l| l.starts_with("sglang:num_prefill_bootstrap_queue_reqs{") && l.ends_with(" 1.0")).then_some(())
        })
        .await
    });
    assert!(held.is_some(), "the prefill holds the room for the decode");
    let watch = RouterWatch::start(&stack);
    let r = run(&d, &config, &["restart", "--rolling", "--unit", D, "--json"]);
    let seen = watch.finish();
    assert_recorded(&d.socket, &r);
    seen.assert_down(0, 1);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let s = &r.event(D, "stranded_kv", "passed")["detail"];
    // At least the stranded request (a probe request in flight through the router when the old
    // decode stopped is stranded the same way).
    assert!(s["held_at_start"][P]["held_reqs"].as_f64().unwrap_or(0.0) >= 1.0, "reported: {s:#}");
    assert_eq!(s["held_at_start"][P]["source"], "/v1/loads", "read from the live load snapshot, not the lagging gauges: {s:#}");
    assert_eq!(s["released"], true, "then released at the prefill's bootstrap timeout: {s:#}");
    assert!(s["waited_ms"].as_u64().unwrap_or(0) > 0);
    assert_eq!(s["limit_ms"], 40_000, "the prefill unit's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (30 s) + 10 s");
}

#[test]
fn a_page_size_change_on_the_prefill_only_is_refused_in_preflight() {
    let opts = StackOptions::default();
    let (stack, config, d) = up(opts.clone());
    let unit = stack.worker_unit(&stack.prefill, &opts, &["--page-size".into(), "16".into()]);
    let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart");
    stack.drop_in(P, "50-page-size", &format!("[Service]\nExecStart=\n{exec}\n")).expect("drop-in");
    let watch = RouterWatch::start(&stack);
    let r = run(&d, &config, &["rollout", "apply", "--json"]);
    let seen = watch.finish();
    assert_recorded(&d.socket, &r);
    seen.assert_down(0, 0);
    assert_eq!(r.code, 1, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("preflight"), Some("incompatible_change")));
    let cause = f["cause"].as_str().unwrap_or("");
    assert!(cause.contains(&format!("page_size 16 ({P} new) vs 1 ({D} running)")), "{cause}");
    assert!(!r.touched(P) && !r.touched(D), "nothing restarted");
    assert_eq!(through_router(&stack, 1), 1);
}

#[test]
fn in_2p2d_the_pair_gate_probes_every_pair_of_a_restarted_worker_and_no_other() {
    let (_stack, config, d) = up(StackOptions { pairs: 2, ..Default::default() });
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P2, "--unit", D2, "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let probed = |unit: &str| -> BTreeSet<(String, String)> { pairs_of(r.event(unit, "pair", "passed")).into_iter().map(|(p, d, _)| (p, d)).collect() };
    let set = |v: &[(&str, &str)]| -> BTreeSet<(String, String)> { v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect() };
    assert_eq!(probed(P2), set(&[(P2, D), (P2, D2)]));
    assert_eq!(probed(D2), set(&[(P, D2), (P2, D2)]));
    let all_pair_events = r.events.iter().filter(|e| e["step"] == "pair" && e["status"] == "passed").count();
    assert_eq!(all_pair_events, 2, "only the restarted workers ran a pair gate");
    assert!(!r.touched(P) && !r.touched(D));
}

/// SGLang 0.5.23 reports resolved settings in `/server_info` and what it was asked in
/// `launch_command`: a pair asked for `mooncake_tcp` reports `mooncake`. An unchanged unit is
/// compared by what it asks with what its peer was asked, and restarts.
#[test]
fn an_unchanged_mooncake_tcp_pair_restarts_although_server_info_reports_mooncake() {
    let tcp = || vec!["--disaggregation-transfer-backend".to_string(), "mooncake_tcp".to_string()];
    let (stack, config, d) = up(StackOptions { prefill_args: tcp(), decode_args: tcp(), ..Default::default() });
    let info: Value = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async { http().get(format!("{}/server_info", stack.decode.url)).send().await.expect("server_info").json().await.expect("json") });
    assert_eq!(info["disaggregation_transfer_backend"], "mooncake", "resolved, as 0.5.23 reports it");
    assert!(info["launch_command"].as_str().is_some_and(|c| c.contains("--disaggregation-transfer-backend mooncake_tcp")), "{}", info["launch_command"]);
    let r = run(&d, &config, &["restart", "--rolling", "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let checked = &r.event(P, "preflight", "passed")["detail"]["pairing"][0];
    assert_eq!((checked["peer"].as_str(), checked["compared"].as_bool()), (Some(D), Some(true)), "{checked:#}");
    assert_eq!(checked["settings"]["transfer_backend"], "mooncake_tcp", "what was asked on both sides: {checked:#}");
}

/// SGLang 0.5.23 forces `page_size` 256 for a DeepSeek-V4 model whatever `--page-size` says
/// (`arg_groups/model_overrides/deepseek_v4.py`; the simulator does too, from the model's
/// `config.json`). Both units ask for 64 and run with 256: no change, a plain restart passes; a
/// prefill that asks for 128 is refused, by what was asked.
#[test]
fn a_deepseek_v4_page_size_override_is_no_change_and_a_real_change_is_still_refused() {
    let page = |n: &str| vec!["--page-size".to_string(), n.to_string()];
    let opts = StackOptions {
        model_config: Some(r#"{"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}"#.into()),
        prefill_args: page("64"),
        decode_args: page("64"),
        ..Default::default()
    };
    let (stack, config, d) = up(opts.clone());
    let info: Value = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async { http().get(format!("{}/server_info", stack.decode.url)).send().await.expect("server_info").json().await.expect("json") });
    assert_eq!(info["page_size"], 256, "resolved by the model override");
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    // A real change of what is asked is still refused before anything restarts.
    let unit = stack.worker_unit(&stack.prefill, &opts, &page("128"));
    let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart");
    stack.drop_in(P, "50-page-size", &format!("[Service]\nExecStart=\n{exec}\n")).expect("drop-in");
    let r = run(&d, &config, &["rollout", "apply", "--json"]);
    assert_eq!(r.code, 1, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!(f["cause_code"], "incompatible_change", "{f:#}");
    assert!(f["cause"].as_str().unwrap_or("").contains(&format!("page_size 128 ({P} new) vs 64 ({D} running)")), "{f:#}");
    assert!(!r.touched(P) && !r.touched(D), "nothing restarted");
}

/// With SGLang's default timing (a 300 s bootstrap and waiting timeout) and pdctl's default
/// `pair_timeout` (30 s), a stale pair costs one probe: the probe that got no answer aborts its
/// own request on both servers, so the new prefill holds no room for it (it would until its
/// bootstrap timeout, and the stranded-KV gate after the decode's repair would wait that out:
/// 311 s in all, measured before) and the repair waits for nothing.
#[test]
fn a_stale_pairs_probe_aborts_its_own_request_so_the_repair_waits_for_nothing() {
    let (stack, config, d) = up(StackOptions { waiting_timeout_secs: 300.0, bootstrap_timeout_secs: 300.0, ..old_decode() });
    assert_eq!(through_router(&stack, 2), 2, "serving before");
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let probe = &r.event(P, "pair", "passed")["detail"]["pairs"][0]["probes"][0];
    assert_eq!((probe["prefill"]["answer"].as_str(), probe["decode"]["answer"].as_str()), (Some("no_answer"), Some("no_answer")), "{probe:#}");
    assert_eq!(probe["abandoned"], format!("its request pdctl-pair-{} aborted on both servers", probe["room"]), "{probe:#}");
    assert_eq!(r.summary["repairs"], json!({D: P}));
    // The decode's repair found no room held by the prefill: nothing to wait for.
    assert_eq!(r.event(D, "stranded_kv", "passed")["detail"]["held"], json!({}), "{:#}", r.event(D, "stranded_kv", "passed"));
    assert_eq!(through_router(&stack, 3), 3, "serving after");
}
