//! `pdctl role set` on the simulator behind the real gateway, through pdctld: a worker changed
//! between prefill and decode at run time (`--enable-pd-role-switch`) or by a restart, its unit's
//! role drop-in kept through a later restart, refusals that touch nothing (by pdctl, or by the
//! server while a request still runs), a failed rebuild
//! brought back in its old role, and three fleet hosts changing ratio one at a time on the slots.

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_tests::{pdctl_daemon, stack_with_pdctld_opts, JsonRun};
use serde_json::Value;

const P2: &str = "sglang-dsv4-prefill-2.service";
const D2: &str = "sglang-dsv4-decode-2.service";
const LIMIT: Duration = Duration::from_secs(240);

/// The worker at `url` as the gateway lists it: its type.
fn gateway_type(stack: &Stack, url: &str) -> Option<String> {
    let router = &stack.router.as_ref().expect("a gateway").url;
    let (_, body) = pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{router}/workers")).unwrap_or_default();
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["workers"].as_array()?.iter().find(|w| w["url"] == url)?["worker_type"].as_str().map(String::from)
}

/// The role the server at `url` runs now (its `/model_info`).
fn running_role(url: &str) -> Option<String> {
    let (_, body) = pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{url}/model_info")).unwrap_or_default();
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["disaggregation_mode"].as_str().map(String::from)
}

fn url_of<'a>(stack: &'a Stack, unit: &str) -> &'a str {
    &stack.workers().into_iter().find(|w| w.unit == unit).expect("a worker of the stack").url
}

fn drop_in(stack: &Stack, unit: &str) -> std::path::PathBuf {
    stack.sandbox.unit_dir().join(format!("{unit}.d")).join("90-pdctl-role.conf")
}

fn passed_path(r: &JsonRun, unit: &str) -> String {
    r.event(unit, "role", "passed")["detail"]["path"].as_str().unwrap_or_default().to_string()
}

fn ok(r: &JsonRun) {
    assert_eq!(r.code, 0, "{:#} {}", r.summary, r.stderr);
    assert_eq!(r.summary["result"], "succeeded", "{:#}", r.summary);
}

/// Every prefill is also started with `--disaggregation-decode-enable-radix-cache`, so it too can
/// become a decode at run time (with its radix cache on and unaccounted for, it cannot:
/// [`a_prefill_with_its_radix_cache_on_becomes_a_decode_by_a_restart_and_a_ratio_prefers_one_that_switches_live`]).
fn role_opts(decode_args: &[&str]) -> StackOptions {
    StackOptions {
        pairs: 2,
        role_switch: true,
        prefill_args: vec!["--disaggregation-decode-enable-radix-cache".into()],
        decode_args: decode_args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// Default flags (a prefill's radix cache on, as SGLang resolves it): a run-time flip of a
/// prefill to decode would lose KV on sglang 0.5.23 and the server would exit at its next idle
/// check (measured on the real server: `pdctl_core::sglang::role_switch::decode_refusal`). So the
/// dry run of `role set prefill-1 decode` says the restart path and why, and `--ratio 1:3` too;
/// after `--ratio 3:1` has made a decode a prefill, `--ratio 2:2` flips that one back at run time
/// — it was born a decode, its cache resolved off — even when it is the busier prefill.
#[test]
fn a_prefill_with_its_radix_cache_on_becomes_a_decode_by_a_restart_and_a_ratio_prefers_one_that_switches_live() {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { pairs: 2, role_switch: true, ..Default::default() });
    let prefill = stack.workers().into_iter().find(|w| w.role == "prefill").map(|w| w.unit.clone()).expect("a prefill");
    let radix_reason = |flip: &Value| flip["restart_because"].as_str().is_some_and(|w| w.contains("radix cache") && w.contains("--disable-radix-cache"));
    for args in [vec!["role", "set", prefill.as_str(), "decode"], vec!["role", "set", "--ratio", "1:3"]] {
        let dry = pdctl_daemon(&d, &config, &[args.as_slice(), &["--dry-run", "--json"]].concat(), LIMIT);
        assert_eq!(dry.code, 0, "{:#} {}", dry.summary, dry.stderr);
        let flip = dry.summary["flips"][0].clone();
        assert_eq!(flip["path"], "restart", "{args:?}: {flip:#}");
        assert!(radix_reason(&flip), "{args:?}: {flip:#}");
    }
    let dry = pdctl_daemon(&d, &config, &["role", "set", "--ratio", "3:1", "--dry-run", "--json"], LIMIT);
    let flipped = dry.summary["flips"][0]["unit"].as_str().unwrap_or_default().to_string();
    ok(&pdctl_daemon(&d, &config, &["role", "set", "--ratio", "3:1", "--json"], LIMIT));
    assert_eq!(running_role(url_of(&stack, &flipped)).as_deref(), Some("prefill"), "{flipped}");
    // The flipped one is the busier prefill now (a request no decode fetches stays queued on it
    // until its bootstrap timeout); the born prefills are idle.
    let url = url_of(&stack, &flipped).to_string();
    let held = url.clone();
    let _direct = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let body = serde_json::json!({"text": "held", "sampling_params": {"max_new_tokens": 1}, "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 7});
            let c = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
            c.post(format!("{held}/generate")).json(&body).send().await.map(|r| r.status().as_u16()).ok()
        })
    });
    let queued = || pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{url}/v1/loads")).is_ok_and(|(_, b)| !b.contains("\"num_waiting_reqs\":0"));
    assert!(pdctl_tests::until(Duration::from_secs(5), Duration::from_millis(20), queued), "the request is queued on {flipped}");
    let dry = pdctl_daemon(&d, &config, &["role", "set", "--ratio", "2:2", "--dry-run", "--json"], LIMIT);
    assert_eq!(dry.code, 0, "{:#} {}", dry.summary, dry.stderr);
    let flip = &dry.summary["flips"][0];
    assert_eq!((flip["unit"].as_str(), flip["path"].as_str()), (Some(flipped.as_str()), Some("runtime")), "{:#}", dry.summary);
}

/// 2P2D, every server started with `--enable-pd-role-switch`: `--ratio 3:1` flips one decode
/// (the dry run says which, and that it switches at run time); the run drains it, writes its
/// unit's drop-in, switches it without a restart (its run goes on: the same InvocationID), and
/// passes every gate in its new role — the gateway lists it as a prefill, its server says prefill.
/// A later restart of that unit keeps the role (the drop-in), and `role set UNIT decode` brings
/// the host back to 2:2 with the drop-in naming decode.
#[test]
fn a_ratio_flips_a_decode_at_run_time_and_its_role_survives_a_restart() {
    let (stack, config, d) = stack_with_pdctld_opts(&role_opts(&[]));
    let dry = pdctl_daemon(&d, &config, &["role", "set", "--ratio", "3:1", "--dry-run", "--json"], LIMIT);
    assert_eq!(dry.code, 0, "{:#} {}", dry.summary, dry.stderr);
    let flips = dry.summary["flips"].as_array().cloned().unwrap_or_default();
    assert_eq!(flips.len(), 1, "{:#}", dry.summary);
    let unit = flips[0]["unit"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        (flips[0]["from"].as_str(), flips[0]["to"].as_str(), flips[0]["path"].as_str()),
        (Some("decode"), Some("prefill"), Some("runtime")),
        "{flips:?}"
    );
    assert!(flips[0]["expected_out"].as_str().is_some_and(|o| o.contains("no stop, no start")), "{flips:?}");
    let url = url_of(&stack, &unit).to_string();
    let invocation = stack.show(&unit, "InvocationID").unwrap_or_default();

    let r = pdctl_daemon(&d, &config, &["role", "set", "--ratio", "3:1", "--json"], LIMIT);
    ok(&r);
    assert_eq!(passed_path(&r, &unit), "runtime");
    assert_eq!(r.event(&unit, "restart", "skipped")["unit"], unit.as_str());
    for step in ["drain", "health", "pair", "router", "metrics", "soak"] {
        r.event(&unit, step, "passed");
    }
    assert_eq!(running_role(&url).as_deref(), Some("prefill"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("prefill"));
    let same_run = stack.show(&unit, "InvocationID").unwrap_or_default();
    assert_eq!(same_run, invocation, "switched at run time: the same run");
    let text = std::fs::read_to_string(drop_in(&stack, &unit)).expect("the role drop-in");
    assert!(text.contains("--disaggregation-mode prefill"), "{text}");
    // `pdctl status` counts each role by what its workers run, with the figures behind it.
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let o = std::process::Command::new(&bin)
        .args(["status", "--json", "--config", &config.display().to_string(), "--socket", &d.socket.display().to_string()])
        .output()
        .expect("pdctl status");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let roles = &v["roles"];
    assert_eq!((roles["prefill"]["workers"].as_u64(), roles["decode"]["workers"].as_u64()), (Some(3), Some(1)), "{roles:#}");
    assert!(roles["why"].as_str().is_some_and(|w| !w.is_empty()), "{roles:#}");

    // The role is the unit's now: a restart keeps it, and its gates hold it to prefill.
    let again = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", &unit, "--json"], LIMIT);
    ok(&again);
    assert_eq!(running_role(&url).as_deref(), Some("prefill"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("prefill"));

    let back = pdctl_daemon(&d, &config, &["role", "set", &unit, "decode", "--json"], LIMIT);
    ok(&back);
    assert_eq!(running_role(&url).as_deref(), Some("decode"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("decode"));
    let text = std::fs::read_to_string(drop_in(&stack, &unit)).expect("the role drop-in");
    assert!(text.contains("--disaggregation-mode decode"), "{text}");
    let check = pdctl_daemon(&d, &config, &["check", "--json"], LIMIT);
    assert_eq!(check.code, 0, "{:#} {}", check.summary, check.stderr);
}

/// Refusals touch nothing: a ratio that leaves a role empty, a count that is not this host's,
/// the only worker of its role — each refused before any drain, no drop-in written. Without
/// the flag (a server started without `--enable-pd-role-switch`) the dry run says the restart
/// path and why; a unit the run's preflight refuses (changes on disk its process does not run)
/// fails the dry run the same way.
#[test]
fn a_role_left_empty_is_refused_touching_nothing_and_without_the_flag_the_way_is_a_restart() {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { pairs: 2, ..Default::default() });
    for args in [&["role", "set", "--ratio", "4:0", "--json"][..], &["role", "set", "--ratio", "2:1", "--json"][..]] {
        let r = pdctl_daemon(&d, &config, args, LIMIT);
        assert_ne!(r.code, 0, "{args:?}: {:#}", r.summary);
        assert!(r.events.is_empty(), "{args:?}: nothing runs: {:#?}", r.events);
        assert!(r.stderr.contains("nothing was touched") || r.summary.to_string().contains("nothing was touched"), "{args:?}: {} {:#}", r.stderr, r.summary);
    }
    for w in stack.workers() {
        assert!(!drop_in(&stack, &w.unit).exists(), "{}", w.unit);
    }
    let dry = pdctl_daemon(&d, &config, &["role", "set", P2, "decode", "--dry-run", "--json"], LIMIT);
    assert_eq!(dry.code, 0, "{:#} {}", dry.summary, dry.stderr);
    let flip = &dry.summary["flips"][0];
    assert_eq!(flip["path"], "restart", "{flip:#}");
    assert!(flip["restart_because"].as_str().is_some_and(|w| w.contains("--enable-pd-role-switch")), "{flip:#}");
    // Its expected time out: a restart's, not measured on this host yet (said, not a number).
    assert!(
        flip["expected_out"]
            .as_str()
            .is_some_and(|o| o.starts_with("out of the gateway as long as its drain, stop, start") && o.contains("not measured here yet")),
        "{flip:#}"
    );
    // A unit changed on disk after its process started (here its KillMode): the dry run runs the
    // run's own preflight and stops where the run stops, with the same cause; the run touches
    // nothing.
    let dir = stack.sandbox.unit_dir().join(format!("{P2}.d"));
    std::fs::create_dir_all(&dir).expect("drop-in dir");
    std::fs::write(dir.join("50-kill.conf"), "[Service]\nKillMode=control-group\n").expect("drop-in");
    stack.sandbox.systemctl(&["daemon-reload"]).expect("reload");
    let dry = pdctl_daemon(&d, &config, &["role", "set", P2, "decode", "--dry-run", "--json"], LIMIT);
    let run = pdctl_daemon(&d, &config, &["role", "set", P2, "decode", "--json"], LIMIT);
    assert_eq!(dry.code, run.code, "the same exit: {:#} {:#}", dry.summary, run.summary);
    for r in [&dry, &run] {
        assert_eq!(r.code, 2, "a config refusal: {:#} {}", r.summary, r.stderr);
        assert_eq!(
            (r.summary["failed"]["step"].as_str(), r.summary["failed"]["cause_code"].as_str()),
            (Some("preflight"), Some("changes_pending")),
            "{:#}",
            r.summary
        );
    }
    assert!(!drop_in(&stack, P2).exists(), "refused in preflight: no role drop-in");
    assert!(run.events.iter().all(|e| e["step"] == "preflight"), "nothing but the preflight ran: {:#?}", run.events);
}

/// Without the flag the same verb restarts the worker with its unit's new role: a prefill of a
/// 2P2D host becomes a decode through every gate, the gateway lists it as one.
#[test]
fn without_the_flag_a_prefill_becomes_a_decode_by_a_restart_through_every_gate() {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { pairs: 2, ..Default::default() });
    let url = url_of(&stack, P2).to_string();
    let r = pdctl_daemon(&d, &config, &["role", "set", P2, "decode", "--json"], LIMIT);
    ok(&r);
    assert_eq!(passed_path(&r, P2), "restart");
    for step in ["drain", "restart", "ready", "health", "pair", "router", "metrics", "soak"] {
        r.event(P2, step, "passed");
    }
    assert_eq!(running_role(&url).as_deref(), Some("decode"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("decode"));
    let check = pdctl_daemon(&d, &config, &["check", "--json"], LIMIT);
    assert_eq!(check.code, 0, "{:#} {}", check.summary, check.stderr);
    // Its way back is a restart too, and now its time out was measured: the dry run says it.
    let dry = pdctl_daemon(&d, &config, &["role", "set", P2, "prefill", "--dry-run", "--json"], LIMIT);
    let out = dry.summary["flips"][0]["expected_out"].as_str().unwrap_or_default().to_string();
    assert!(out.starts_with("out of the gateway about ") && out.contains("its last measured window"), "{:#}", dry.summary);
}

/// A rebuild that fails after the teardown leaves the server unhealthy ("restart required"):
/// pdctl fails the change with `role_switch_failed`, puts the unit's files back (no drop-in),
/// restarts it in its old role through every gate, and the host passes `check` again.
#[test]
fn a_failed_rebuild_is_restarted_in_its_old_role_and_the_unit_files_put_back() {
    let (stack, config, d) = stack_with_pdctld_opts(&role_opts(&["--sim-role-switch-fail"]));
    let url = url_of(&stack, D2).to_string();
    let r = pdctl_daemon(&d, &config, &["role", "set", D2, "prefill", "--json"], LIMIT);
    assert_eq!(r.code, 1, "{:#} {}", r.summary, r.stderr);
    let failed = &r.summary["failed"];
    assert_eq!(
        (failed["unit"].as_str(), failed["step"].as_str(), failed["cause_code"].as_str()),
        (Some(D2), Some("role"), Some("role_switch_failed")),
        "{failed:#}"
    );
    assert!(!drop_in(&stack, D2).exists(), "the drop-in is taken back");
    let notes = pdctl_tests::record(&d.socket, r.summary["id"].as_str().unwrap_or_default())["notes"].to_string();
    assert!(notes.contains("restarted in its old role"), "{notes}");
    assert_eq!(running_role(&url).as_deref(), Some("decode"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("decode"));
    let check = pdctl_daemon(&d, &config, &["check", "--json"], LIMIT);
    assert_eq!(check.code, 0, "{:#} {}", check.summary, check.stderr);
}

/// Servers that capture CUDA graphs: a prefill's flip to decode is given the footprint a serving
/// decode reports (`sglang:graph_memory_usage_gb{phase="decode"}`, 2.5 GB here) — the dry run
/// says it, the role step passes it — and the new decode reports its own graphs after.
#[test]
fn a_flip_to_decode_is_given_the_graph_footprint_a_serving_decode_reports() {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { cuda_graphs: true, ..role_opts(&[]) });
    let dry = pdctl_daemon(&d, &config, &["role", "set", P2, "decode", "--dry-run", "--json"], LIMIT);
    let flip = &dry.summary["flips"][0];
    assert_eq!((flip["path"].as_str(), flip["graph_memory_gb"].as_f64()), (Some("runtime"), Some(2.5)), "{:#}", dry.summary);
    let r = pdctl_daemon(&d, &config, &["role", "set", P2, "decode", "--json"], LIMIT);
    ok(&r);
    assert_eq!(r.event(P2, "role", "passed")["detail"]["graph_memory_gb"].as_f64(), Some(2.5));
    let url = url_of(&stack, P2).to_string();
    assert_eq!(running_role(&url).as_deref(), Some("decode"));
    let (_, metrics) = pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{url}/metrics")).unwrap_or_default();
    assert!(
        metrics.lines().any(|l| l.starts_with("sglang:graph_memory_usage_gb{") && l.contains("phase=\"decode\"") && l.ends_with(" 2.5")),
        "its own graphs now"
    );
}

/// The footprint does not fit (the decodes report 20 GB, a prefill has 12.4 GB free): SGLang's
/// preparation check refuses after the drain, before anything is torn down; the drop-in is taken
/// back and the prefill re-admitted as it runs, no restart.
#[test]
fn a_flip_to_decode_without_the_headroom_is_refused_and_the_worker_readmitted_as_it_runs() {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { cuda_graphs: true, ..role_opts(&["--sim-graph-memory-gb", "20"]) });
    let url = url_of(&stack, P2).to_string();
    let before = stack.show(P2, "InvocationID").unwrap_or_default();
    let r = pdctl_daemon(&d, &config, &["role", "set", P2, "decode", "--json"], LIMIT);
    assert_eq!(r.code, 1, "{:#} {}", r.summary, r.stderr);
    let failed = &r.summary["failed"];
    assert_eq!((failed["step"].as_str(), failed["cause_code"].as_str()), (Some("role"), Some("role_switch_failed")), "{failed:#}");
    assert!(failed["cause"].as_str().is_some_and(|c| c.contains("insufficient decode CUDA graph headroom")), "{failed:#}");
    assert!(!drop_in(&stack, P2).exists(), "the drop-in is taken back");
    assert_eq!(running_role(&url).as_deref(), Some("prefill"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("prefill"));
    let after = stack.show(P2, "InvocationID").unwrap_or_default();
    assert_eq!(after, before, "nothing was torn down: re-admitted as it runs, not restarted");
    let check = pdctl_daemon(&d, &config, &["check", "--json"], LIMIT);
    assert_eq!(check.code, 0, "{:#} {}", check.summary, check.stderr);
}

/// pdctld SIGKILLed in the middle of a change of role (after its drop-in is written, while the
/// simulator's switch takes 6 s): the CLI says interrupted; when pdctld starts again it does not
/// re-admit the worker as a role it does not run; `pdctl rollout resume ID` verifies it in its
/// unit's new role (restarted into it if the switch never happened) and the host converges: the
/// worker serves as a prefill, the gateway lists it so, `check` passes.
#[test]
fn pdctld_killed_mid_switch_is_resumed_into_the_role_its_unit_says() {
    let (stack, config, d) = stack_with_pdctld_opts(&role_opts(&["--sim-role-switch-secs", "6"]));
    let url = url_of(&stack, D2).to_string();
    let mut cli = pdctl_tests::live_daemon(&d, &config, &["role", "set", D2, "prefill", "--json"]);
    cli.wait_line(LIMIT, |e| e["unit"] == D2 && e["step"] == "role" && e["status"] == "started").expect("the role step began");
    let written = pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(20), || drop_in(&stack, D2).exists());
    assert!(written, "the drop-in is written first");
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    assert_eq!(cli.finish(Duration::from_secs(20)), Some(3), "interrupted");
    let last = cli.seen.last().cloned().unwrap_or_default();
    assert_eq!(last["result"], "interrupted", "{last}");
    let id = last["id"].as_str().unwrap_or_default().to_string();
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    // pdctld first reconciles what it drained: re-admitted only as the role its server runs.
    let settled = || pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1["reconciling"] == false;
    assert!(pdctl_tests::until(Duration::from_secs(120), Duration::from_millis(200), settled), "pdctld reconciled");
    let r = pdctl_daemon(&d, &config, &["rollout", "resume", &id, "--json"], LIMIT);
    ok(&r);
    let steps: Vec<String> =
        r.events.iter().filter(|e| e["unit"] == D2 && e["status"] != "started").map(|e| format!("{} {}", e["step"], e["status"])).collect();
    println!("the resume of {D2}: {}", steps.join(", "));
    r.event(D2, "health", "passed");
    assert_eq!(running_role(&url).as_deref(), Some("prefill"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("prefill"));
    let check = pdctl_daemon(&d, &config, &["check", "--json"], LIMIT);
    assert_eq!(check.code, 0, "{:#} {}", check.summary, check.stderr);
}

/// A fleet of three 2P2D hosts, each with its own gateway, all asked `--ratio 3:1` at once: each
/// flip takes its old role's slot of the fleet's budget (`[fleet.max_unavailable] decode = 1`), so
/// the decodes change one host at a time — etcd's history of the decode slot never shows two
/// holders, and shows each host's — and every host ends 3:1 with every gate passed.
#[test]
fn a_fleet_of_three_hosts_changes_ratio_one_host_at_a_time_on_the_slots() {
    use pdctl_tests::fleet_hosts::{alive, fleet_status, host_with, max_holders_ever, until};
    let etcd = pdctl_tests::pdctl_sandbox::etcd::Etcd::start().expect("etcd");
    let names = ["gpu-node-a", "gpu-node-b", "gpu-node-c"];
    let hosts: Vec<_> = names.iter().map(|h| host_with(&etcd.url(), h, &role_opts(&[]))).collect();
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(&hosts[0].1);
        names.iter().all(|h| alive(&s, h))
    }));
    let runs: Vec<JsonRun> = std::thread::scope(|sc| {
        let started: Vec<_> =
            hosts.iter().map(|(_, config, d)| sc.spawn(move || pdctl_daemon(d, config, &["role", "set", "--ratio", "3:1", "--json"], LIMIT))).collect();
        started.into_iter().map(|t| t.join().expect("a host's role set")).collect()
    });
    for (r, h) in runs.iter().zip(names) {
        ok(r);
        let flipped: Vec<&Value> = r.events.iter().filter(|e| e["step"] == "role" && e["status"] == "passed").collect();
        assert_eq!(flipped.len(), 1, "{h}: one decode flipped: {:#?}", r.events);
        let unit = flipped[0]["unit"].as_str().unwrap_or_default();
        r.event(unit, "slot", "passed");
        r.event(unit, "soak", "passed");
    }
    let (max, seen) = max_holders_ever(&etcd.url(), "decode");
    assert_eq!(max, 1, "never two hosts' decodes out at once: {seen:?}");
    for h in names {
        assert!(seen.iter().any(|s| s.iter().any(|x| x.starts_with(h))), "{h} held the decode slot in its turn: {seen:?}");
    }
    let (pmax, pseen) = max_holders_ever(&etcd.url(), "prefill");
    assert_eq!(pmax, 0, "a decode becoming a prefill takes no prefill slot: {pseen:?}");
    for (stack, _, _) in &hosts {
        let prefills = stack.workers().into_iter().filter(|w| running_role(&w.url).as_deref() == Some("prefill")).count();
        assert_eq!(prefills, 3, "3:1 on every host");
    }
}

/// A decode still running a request when its drain's wait ends (`drain_timeout` 2 s, the
/// request ~16 s): SGLang's preparation check refuses the switch ("instance is not idle"),
/// nothing is torn down — the drop-in is taken back, the decode re-admitted as it runs (the same
/// InvocationID) and its request finishes.
#[test]
fn a_switch_while_a_request_still_runs_is_refused_by_the_server_and_nothing_is_torn_down() {
    let (stack, config, d) = stack_with_pdctld_opts(&role_opts(&[]));
    let frag = config.parent().expect("dir").join("config.d/40-short-drain.toml");
    std::fs::write(frag, "[rollout]\ndrain_timeout = \"2s\"\n").expect("fragment");
    let (load, busy) = pdctl_tests::load::request_in_flight_on(&stack, 3200);
    let url = url_of(&stack, &busy).to_string();
    let before = stack.show(&busy, "InvocationID").unwrap_or_default();
    let r = pdctl_daemon(&d, &config, &["role", "set", &busy, "prefill", "--json"], LIMIT);
    assert_eq!(r.code, 1, "{:#} {}", r.summary, r.stderr);
    let drain = &r.event(&busy, "drain", "passed")["detail"];
    assert!(drain["waited_ms"].as_u64().is_some_and(|ms| ms >= 2000), "the drain waited its whole drain_timeout: {drain}");
    assert!(drain["in_flight_left"].as_u64().is_some_and(|n| n >= 1) && drain["timed_out"] == true, "and measured the request left: {drain}");
    let failed = &r.summary["failed"];
    assert_eq!((failed["step"].as_str(), failed["cause_code"].as_str()), (Some("role"), Some("role_switch_failed")), "{failed:#}");
    assert!(failed["cause"].as_str().is_some_and(|c| c.contains("instance is not idle")), "the server's own refusal: {failed:#}");
    assert!(!drop_in(&stack, &busy).exists(), "the drop-in is taken back");
    assert_eq!(stack.show(&busy, "InvocationID").unwrap_or_default(), before, "nothing torn down: the same run");
    assert_eq!(running_role(&url).as_deref(), Some("decode"));
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("decode"), "re-admitted as it runs");
    assert_eq!(load.join().expect("the request"), Some(200), "its request finished");
}

/// `[maintenance] balance_roles`: a long answer fills a decode's KV (its pool is 500 tokens)
/// while both prefills are idle, so the roles' pressure suggests 1:3. Outside every maintenance
/// window the change waits, and pdctld's status says so; once the window is gone from the config
/// and the suggestion has stood for `balance_after` (3 s), pdctld changes the ratio by itself —
/// a `role` rollout it started, the figures as its reason — through every gate, and the request
/// is answered. Its status says what it did.
#[test]
fn with_balance_roles_pdctld_changes_the_ratio_by_itself_once_the_suggestion_stood() {
    let (stack, config) = pdctl_tests::stack_with_config(&role_opts(&["--sim-max-total-tokens", "500"]));
    let frag = config.parent().expect("dir").join("config.d/45-balance.toml");
    let balance = "[maintenance]\nfleetlock_listen = \"\"\nbalance_roles = true\nbalance_after = \"3s\"\n";
    // A window twelve hours from now: closed.
    let hour = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() / 3600 + 12) % 24;
    std::fs::write(&frag, format!("{balance}windows = [\"* {hour:02}:00-{hour:02}:01 UTC\"]\n")).expect("fragment");
    let d = stack.start_pdctld().expect("pdctld");
    let (load, _busy) = pdctl_tests::load::request_in_flight_on(&stack, 4000);
    let said = || pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1["role_balance"].as_str().unwrap_or_default().to_string();
    let waits = pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(250), || said().contains("due, waits: outside every maintenance window"));
    assert!(waits, "the due change waits for a window: {}", said());
    assert!(said().starts_with("1:3 suggested for"), "{}", said());
    let (_, h) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    assert_eq!(h["rollouts"].as_array().map(Vec::len), Some(0), "nothing started outside the window: {h}");
    std::fs::write(&frag, balance).expect("fragment");
    let mut id = String::new();
    let started = pdctl_tests::until(Duration::from_secs(60), Duration::from_millis(250), || {
        let (_, h) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
        let role = h["rollouts"].as_array().and_then(|a| a.iter().find(|r| r["kind"] == "role").cloned());
        id = role.and_then(|r| r["id"].as_str().map(String::from)).unwrap_or_default();
        !id.is_empty()
    });
    assert!(started, "pdctld started a change of ratio: {}", pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1);
    let r = pdctl_daemon(&d, &config, &["rollout", "watch", &id, "--json"], LIMIT);
    ok(&r);
    let rec = pdctl_tests::record(&d.socket, &id);
    let by = &rec["started_by"];
    assert_eq!(by["pdctld"], true, "{by}");
    assert!(by["reason"].as_str().is_some_and(|w| w.starts_with("role balance: decodes are short, prefills have one to spare")), "{by}");
    let prefills: Vec<String> = stack.workers().into_iter().filter(|w| running_role(&w.url).as_deref() == Some("prefill")).map(|w| w.unit.clone()).collect();
    assert_eq!(prefills.len(), 1, "1:3 now: {prefills:?}");
    assert_eq!(load.join().expect("the request"), Some(200), "the long answer was not touched");
    let status = pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1;
    assert!(status["role_balance"].as_str().is_some_and(|b| b.contains(&format!("changed to 1:3 by rollout {id}"))), "{status:#}");
}

/// Behind sglang-router 0.3.2 (which lists a worker's type and bootstrap port as smg does, and
/// takes a worker out at once): under client load, `--ratio 3:1` flips a decode at run time,
/// the gateway lists it as a prefill afterwards, and no client request failed.
#[test]
fn the_ratio_changes_under_load_behind_sglang_router_0_3_2_with_no_failed_request() {
    let opts = StackOptions { gateway: pdctl_tests::pdctl_sandbox::Gateway::SglangRouter032, ..role_opts(&[]) };
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    let router = stack.router.as_ref().expect("a gateway").url.clone();
    let load = pdctl_tests::Load::start(&router, 8.0, 16);
    let r = pdctl_daemon(&d, &config, &["role", "set", "--ratio", "3:1", "--json"], LIMIT);
    let (sent, failed) = load.stop();
    ok(&r);
    let unit = r.events.iter().find(|e| e["step"] == "role" && e["status"] == "passed").and_then(|e| e["unit"].as_str()).unwrap_or_default().to_string();
    assert_eq!(passed_path(&r, &unit), "runtime");
    let url = url_of(&stack, &unit).to_string();
    assert_eq!(gateway_type(&stack, &url).as_deref(), Some("prefill"));
    assert_eq!(running_role(&url).as_deref(), Some("prefill"));
    assert!(sent >= 20, "the load ran through the change: {sent} sent");
    assert_eq!(failed, 0, "{failed} of {sent} client requests failed");
}

/// pdctld SIGKILLed just after a switch at run time passed (before the later gates): `pdctl
/// rollout resume ID` verifies the worker again without a restart (the same InvocationID) and
/// records its unit's files, the role drop-in newer than its process included, as its good
/// revision — so a later plain restart of it is not refused as a change on disk its process does
/// not run.
#[test]
fn a_switch_resumed_after_it_passed_is_recorded_so_a_later_restart_is_not_refused() {
    let (stack, config, d) = stack_with_pdctld_opts(&role_opts(&[]));
    let url = url_of(&stack, D2).to_string();
    let mut cli = pdctl_tests::live_daemon(&d, &config, &["role", "set", D2, "prefill", "--json"]);
    cli.wait_line(LIMIT, |e| e["unit"] == D2 && e["step"] == "role" && e["status"] == "passed").expect("the switch passed");
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    assert_eq!(cli.finish(Duration::from_secs(20)), Some(3), "interrupted");
    let id = cli.seen.last().and_then(|l| l["id"].as_str().map(String::from)).unwrap_or_default();
    let invocation = stack.show(D2, "InvocationID").unwrap_or_default();
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    let settled = || pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1["reconciling"] == false;
    assert!(pdctl_tests::until(Duration::from_secs(120), Duration::from_millis(200), settled), "pdctld reconciled");
    let r = pdctl_daemon(&d, &config, &["rollout", "resume", &id, "--json"], LIMIT);
    ok(&r);
    assert_eq!(stack.show(D2, "InvocationID").unwrap_or_default(), invocation, "verified again, not restarted");
    let notes = pdctl_tests::record(&d.socket, r.summary["id"].as_str().unwrap_or_default())["notes"].to_string();
    assert!(notes.contains(&format!("recorded the revision {D2} runs with")) && notes.contains("90-pdctl-role.conf"), "{notes}");
    let again = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", D2, "--json"], LIMIT);
    ok(&again);
    assert_eq!(running_role(&url).as_deref(), Some("prefill"));
}
