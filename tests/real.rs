//! The real-server tier: pdctl against the released `sglang==0.5.23` server on this CPU (a tiny
//! model made by scripts/setup, PD over mooncake's TCP transport), behind the real smg 1.13, the
//! units in the sandbox's real systemd. Where the simulator and the real server disagree, these
//! tests say what the real one does.
//!
//! One real stack at a time (`.config/nextest.toml`: ~3 GB of memory per server). Each failure
//! names the gate and prints the servers' last lines.

use std::path::Path;
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{http_get_with, Pdctld, Stack, StackOptions};
use pdctl_tests::real_stack::{explain, fragment, logs, real_opts};
use pdctl_tests::{http, live_daemon, pdctl_daemon, raw_api, stack_with_pdctld_opts, until, Load};
use serde_json::{json, Value};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";

// A real stack boots in ~40 s here, so the tests that need the same stack share one: each part
// is a function of its own below, run in turn, and a failure names its part (its line).

/// With API keys on both servers and on smg, and admin keys on both servers (the shape of a
/// shared cluster): a rolling restart under load, then new weights in place under load.
#[test]
fn with_keys_on_every_server_a_rolling_restart_and_new_weights_in_place_pass_under_load() {
    let keys = StackOptions { api_key: Some("real-s3cret".into()), admin_api_key: Some("real-adm1n".into()), ..real_opts() };
    let (stack, config, d) = stack_with_pdctld_opts(&keys);
    the_api_asks_for_the_key(&stack);
    a_rolling_restart_passes_every_gate_under_load(&stack, &config, &d);
    new_weights_go_in_place_under_load(&stack, &config, &d);
}

/// One unchanged real pair, in turn: a change it cannot pair with is refused (and a harmless
/// one rolls out), pdctld killed mid-drain is reconciled, the host is drained for maintenance
/// and resumed.
#[test]
fn one_real_pair_refuses_what_cannot_pair_reconciles_a_killed_pdctld_and_comes_back_from_maintenance() {
    let (stack, config, d) = stack_with_pdctld_opts(&real_opts());
    a_change_the_decode_cannot_pair_with_is_refused_and_a_harmless_flag_rolls_out(&stack, &config, &d);
    pdctld_killed_mid_drain_is_reconciled_at_its_next_start(&stack, &config, &d);
    a_host_drained_for_maintenance_stops_through_sglangs_drain_and_resumes_through_every_gate(&stack, &config, &d);
}

/// A rolling restart of the unchanged pair under load: every gate passes on the real server's
/// own evidence, the stops are SGLang's drain, the ready lines this start's.
fn a_rolling_restart_passes_every_gate_under_load(stack: &Stack, config: &Path, d: &Pdctld) {
    let router = stack.router.clone().expect("router");
    let load = Load::start_with_key(&router.url, 2.0, 8, stack.api_key.clone());
    let r = pdctl_daemon(d, config, &["restart", "--rolling", "--json"], Duration::from_secs(900));
    let (sent, failed) = load.stop();
    println!("clients through smg during the rollout: {sent} sent, {failed} failed");
    assert_eq!(r.code, 0, "{}", explain(stack, &r));
    // Every gate of each worker passed, on the real server's own evidence.
    for unit in [P, D] {
        for step in ["preflight", "drain", "restart", "ready", "health", "pair", "router", "metrics", "soak"] {
            r.event(unit, step, "passed");
        }
        // The preflight compared what was asked with what was asked: the unit is unchanged
        // although /server_info reports the transfer backend resolved (`mooncake`).
        let pre = &r.event(unit, "preflight", "passed")["detail"];
        assert_eq!(pre["kill_mode"], "mixed", "{pre:#}");
        // pdctl's own calls carry the key the server asks for.
        assert_eq!(pre["api_key_check"], "accepted", "{pre:#}");
        // The ready line of this start, from its new main process.
        let ready = &r.event(unit, "ready", "passed")["detail"];
        let pid = stack.show(unit, "MainPID").expect("MainPID");
        assert_eq!(ready["pid"].as_u64().map(|p| p.to_string()), Some(pid), "{ready:#}");
        // The stop was SGLang's drain (KillMode=mixed), not a crash and not the manager's SIGKILL.
        let stop = &r.event(unit, "restart", "passed")["detail"]["stop"];
        assert_eq!(stop["ended_by"], "drained", "{stop:#}\n{}", logs(stack));
        println!("{unit}: stop {} ms ({}); ready detected {} ms after journald had it", stop["stop_ms"], stop["why"], ready["detect_ms"]);
    }
    let stranded = &r.event(D, "stranded_kv", "passed")["detail"];
    println!("stranded KV after the decode's restart: {stranded}");
    let pair = &r.event(P, "pair", "passed")["detail"];
    println!("the prefill's pair gate: {pair}");
}

#[test]
fn a_unit_with_systemds_default_kill_mode_is_refused_before_anything_restarts() {
    // systemd's default KillMode=control-group: SIGTERM would reach SGLang's scheduler too.
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { kill_mode: "control-group", ..real_opts() });
    let before = stack.show(P, "InvocationID").expect("InvocationID");
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], Duration::from_secs(300));
    assert_eq!(r.code, 2, "{}", explain(&stack, &r));
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("preflight"), Some("kill_mode_unsafe")), "{f:#}");
    let cause = f["cause"].as_str().unwrap_or("");
    assert!(cause.contains("KillMode=mixed") && cause.contains(&format!("systemctl edit {P}")), "{cause}");
    assert!(!r.touched(P) && !r.touched(D), "a refusal touches nothing");
    assert_eq!(stack.show(P, "InvocationID").expect("InvocationID"), before, "the prefill was not restarted either");
    let next: Value = r.summary["failed"]["next"].clone();
    assert!(next.as_str().is_some_and(|n| n.contains("KillMode=mixed")), "{next}");
    // Restarted anyway (kill_mode = "warn"): the stop is SGLang killing its own tree after its
    // scheduler died of the SIGTERM, and the restart step says so — not a TimeoutStopSec kill.
    fragment(&config, "20-kill-mode", "[rollout]\nkill_mode = \"warn\"\n");
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", D, "--json"], Duration::from_secs(600));
    assert_eq!(r.code, 0, "{}", explain(&stack, &r));
    let pre = &r.event(D, "preflight", "passed")["detail"];
    assert!(pre["warnings"].as_array().is_some_and(|w| w.iter().any(|x| x.as_str().is_some_and(|s| s.contains("KillMode=control-group")))), "{pre:#}");
    let restart = &r.event(D, "restart", "passed")["detail"];
    println!("a stop under KillMode=control-group: {}", restart["stop"]);
    assert_eq!(restart["stop"]["ended_by"], "sglang_tree_kill", "{restart:#}\n{}", logs(&stack));
    assert_eq!(restart["stop"]["killed"], false, "not the manager's SIGKILL at TimeoutStopSec: {restart:#}");
    assert!(restart["warning"].as_str().is_some_and(|w| w.contains("SIGKILLed its own process tree")), "{restart:#}");
}

/// `n` requests of `tokens` tokens each through the gateway, sent now; each answers with its
/// status, the tokens it completed and when its answer came (µs since the epoch).
fn long_requests(stack: &Stack, n: usize, tokens: u32) -> Vec<std::thread::JoinHandle<(u16, u64, u64)>> {
    let url = format!("{}/generate", stack.router.as_ref().expect("router").url);
    let key = stack.api_key.clone();
    (0..n)
        .map(|i| {
            let (url, key) = (url.clone(), key.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async {
                    let body = json!({"text": format!("{i} a long answer, please"), "sampling_params": {"max_new_tokens": tokens, "min_new_tokens": tokens, "temperature": 0}});
                    let mut req = http().post(&url).json(&body).timeout(Duration::from_secs(300));
                    if let Some(k) = &key {
                        req = req.bearer_auth(k);
                    }
                    let now_us = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
                    match req.send().await {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let v: Value = r.json().await.unwrap_or(Value::Null);
                            (status, v["meta_info"]["completion_tokens"].as_u64().unwrap_or(0), now_us())
                        }
                        Err(_) => (0, 0, now_us()),
                    }
                })
            })
        })
        .collect()
}

/// When journald recorded `unit`'s last line containing `needle` (µs since the epoch).
fn last_line_at(stack: &Stack, unit: &str, needle: &str) -> Option<u64> {
    let out = stack.sandbox.journalctl(&["-u", unit, "-o", "json", "--no-pager"]).ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["MESSAGE"].as_str().is_some_and(|m| m.contains(needle)))
        .filter_map(|e| e["__REALTIME_TIMESTAMP"].as_str().and_then(|t| t.parse().ok()))
        .next_back()
}

/// [`long_requests`], once all `n` run on the decode (bounded: 60 s).
fn long_requests_on_the_decode(stack: &Stack, n: usize, tokens: u32) -> Vec<std::thread::JoinHandle<(u16, u64, u64)>> {
    let reqs = long_requests(stack, n, tokens);
    let running = until(Duration::from_secs(60), Duration::from_millis(100), || in_flight(stack, &stack.decode.url) >= n as u64);
    assert!(running, "{n} long request(s) run on the decode\n{}", logs(stack));
    reqs
}

/// Requests the server runs now (`/v1/loads`: `num_running_reqs` + `num_waiting_reqs`).
fn in_flight(stack: &Stack, url: &str) -> u64 {
    let (running, waiting) = loads(stack, url);
    running + waiting
}

/// `/v1/loads` of the server at `url`, every rank summed: `(num_running_reqs, num_waiting_reqs)`.
fn loads(stack: &Stack, url: &str) -> (u64, u64) {
    http_get_with(&format!("{url}/v1/loads"), stack.api_key.as_deref())
        .ok()
        .and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
        .and_then(|v| {
            v["loads"].as_array().map(|l| {
                let sum = |k: &str| l.iter().map(|x| x[k].as_u64().unwrap_or(0)).sum::<u64>();
                (sum("num_running_reqs"), sum("num_waiting_reqs"))
            })
        })
        .unwrap_or((0, 0))
}

#[test]
fn long_requests_finish_through_the_drain_and_through_a_stop_that_drains_the_server_itself() {
    // The gateway checks health every 30 s (smg's default is 60 s), not every second as the
    // sandbox's: its own checks do not take the draining decode out before pdctl does.
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { router_health_interval_secs: 30, ..real_opts() });
    // Its TimeoutStopSec (60 s) covers drain_timeout and two of SGLang's drain checks: pdctl lets
    // SGLang drain the decode, the only one of its role, in its stop.
    fragment(&config, "20-drain", "[rollout]\ndrain_timeout = \"45s\"\n");
    // 1. Two long requests run on the decode: it stays in the gateway through its stop's drain
    // and SGLang's own drain finishes both.
    let reqs = long_requests_on_the_decode(&stack, 2, 3500);
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", D, "--json"], Duration::from_secs(600));
    assert_eq!(r.code, 0, "{}", explain(&stack, &r));
    for (i, h) in reqs.into_iter().enumerate() {
        let (status, tokens, _) = h.join().expect("request thread");
        assert_eq!((status, tokens), (200, 3500), "long request {i} finished whole across the decode's restart\n{}", logs(&stack));
    }
    let drain = &r.event(D, "drain", "passed")["detail"];
    println!("drain: {drain}");
    assert!(drain["not_deferred"].is_null(), "the decode was left to SGLang's own drain: {drain:#}");
    let restart = &r.event(D, "restart", "passed")["detail"];
    let stop = &restart["stop"];
    println!("the stop after the drain: {stop}");
    assert_eq!(stop["ended_by"], "drained", "{stop:#}");
    // Its first drain check counted the requests still running: it served on, and was taken out
    // of the gateway a second before SGLang's next check, not at SIGTERM.
    let taken = &restart["taken_out"];
    println!("taken out of the gateway: {taken}");
    let when = taken["when"].as_str().unwrap_or("");
    assert!(when.contains("after its server's first drain check counted") && when.contains("before the next"), "{restart:#}\n{}", logs(&stack));
    assert!(taken["after_ms"].as_u64().is_some_and(|ms| ms >= 4000), "stayed through the first check: {taken}");
    // 2. Without pdctl's drain the server drains itself: SIGTERM reaches its main process only
    // (KillMode=mixed), and the request in flight on it finishes. The gateway is not told: with
    // its health checked every 30 s it keeps routing to the restarting decode, and smg's circuit
    // breakers open for their 60 s (`--cb-timeout-duration-secs`): the router gate would fail
    // `circuit_open`, truthfully (measured). What this part checks is the server's own drain.
    fragment(&config, "30-no-drain", "[rollout]\ndrain = false\n[verify]\nrouter = false\n");
    let reqs = long_requests_on_the_decode(&stack, 1, 3000);
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", D, "--json"], Duration::from_secs(600));
    assert_eq!(r.code, 0, "{}", explain(&stack, &r));
    let (status, tokens, answered_us) = reqs.into_iter().next().expect("one").join().expect("request thread");
    assert_eq!((status, tokens), (200, 3000), "the request in flight on the stopping server finished\n{}", logs(&stack));
    let stop = &r.event(D, "restart", "passed")["detail"]["stop"];
    println!("a stop with a request in flight on the server (KillMode=mixed): {stop}");
    assert_eq!(stop["ended_by"], "drained", "{stop:#}");
    // It spanned the stop: answered after the server logged its SIGTERM.
    let sigterm_us = last_line_at(&stack, D, "Draining requests and shutting down").expect("the decode logged its SIGTERM");
    assert!(answered_us > sigterm_us, "the request was answered {} ms after the SIGTERM", (answered_us as i64 - sigterm_us as i64) / 1000);
    println!("answered {} ms after the decode's SIGTERM", (answered_us - sigterm_us) / 1000);
}

/// The real server refuses its API without the key; /health, /ready and /metrics stay open.
fn the_api_asks_for_the_key(stack: &Stack) {
    let (status, _) = http_get_with(&format!("{}/v1/loads", stack.decode.url), None).expect("GET");
    assert_eq!(status, 401);
    assert_eq!(http_get_with(&format!("{}/health", stack.decode.url), None).expect("GET").0, 200);
}

/// A page size the running decode was not asked for is refused before anything restarts; a
/// harmless flag instead rolls out through every gate, and the server was asked for it.
fn a_change_the_decode_cannot_pair_with_is_refused_and_a_harmless_flag_rolls_out(stack: &Stack, config: &Path, d: &Pdctld) {
    let exec_with = |extra: &[&str]| -> String {
        let unit = stack.worker_unit(&stack.prefill, &real_opts(), &extra.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        unit.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string()
    };
    let before = stack.show(P, "InvocationID").expect("InvocationID");
    // A page size the running decode was not asked for: every transfer would fail.
    let bad = stack.drop_in(P, "50-change", &format!("[Service]\nExecStart=\n{}\n", exec_with(&["--page-size", "16"]))).expect("drop-in");
    let r = pdctl_daemon(d, config, &["rollout", "apply", "--json"], Duration::from_secs(300));
    assert_eq!(r.code, 1, "{}", explain(stack, &r));
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("preflight"), Some("incompatible_change")), "{f:#}");
    assert!(f["cause"].as_str().unwrap_or("").contains(&format!("page_size 16 ({P} new) vs 1 ({D} running)")), "{f:#}");
    assert!(!r.touched(P) && !r.touched(D));
    assert_eq!(stack.show(P, "InvocationID").expect("InvocationID"), before, "nothing restarted");
    // A harmless flag instead: rolled out through every gate, and the server was asked for it.
    std::fs::write(&bad, format!("[Service]\nExecStart=\n{}\n", exec_with(&["--max-running-requests", "64"]))).expect("drop-in");
    stack.sandbox.daemon_reload().expect("reload");
    let r = pdctl_daemon(d, config, &["rollout", "apply", "--json"], Duration::from_secs(600));
    assert_eq!(r.code, 0, "{}", explain(stack, &r));
    for step in ["preflight", "restart", "ready", "health", "pair", "router", "metrics", "soak"] {
        r.event(P, step, "passed");
    }
    let (_, body) = http_get_with(&format!("{}/server_info", stack.prefill.url), None).expect("server_info");
    let info: Value = serde_json::from_str(&body).expect("json");
    assert!(info["launch_command"].as_str().is_some_and(|c| c.contains("--max-running-requests 64")), "{}", info["launch_command"]);
}

/// pdctld killed while it drains the decode: at its next start it reconciles, the decode
/// serves behind the gateway again and the request in flight finished.
fn pdctld_killed_mid_drain_is_reconciled_at_its_next_start(stack: &Stack, config: &Path, d: &Pdctld) {
    fragment(config, "20-drain", "[rollout]\ndrain_timeout = \"120s\"\n");
    let reqs = long_requests_on_the_decode(stack, 1, 1500);
    let mut c = live_daemon(d, config, &["restart", "--rolling", "--unit", D, "--json"]);
    c.wait_line(Duration::from_secs(120), |e| e["unit"] == D && e["step"] == "drain" && e["status"] == "started").expect("the decode's drain started");
    pdctl_tests::kill_and_wait(stack, &d.unit);
    let _ = c.finish(Duration::from_secs(20));
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    // Reconciled: the decode serves behind the gateway, the ledger is empty, nothing is lost.
    assert!(
        until(Duration::from_secs(120), Duration::from_millis(200), || raw_api(&d.socket, "GET", "/v1/status", "").1["reconciling"] == false),
        "pdctld finished reconciling"
    );
    let (_, st) = raw_api(&d.socket, "GET", "/v1/status", "");
    assert_eq!(st["drained"], json!([]), "{st:#}");
    stack.wait_router_healthy(2, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}\n{}", logs(stack)));
    let (status, tokens, _) = reqs.into_iter().next().expect("one").join().expect("request thread");
    assert_eq!((status, tokens), (200, 1500), "the request in flight finished\n{}", logs(stack));
}

/// The stale pair on the real server, made certain: a decode whose heartbeat looks every 30 s
/// never misses the prefill's bootstrap server twice during its restart, so it keeps the old
/// process's ports (one run in six did so with the default 5 s heartbeat, the prefill back
/// within 10 s) and its first request from the new prefill hangs until the waiting timeout —
/// SGLang's default 300 s. pdctl does not wait that out: after one probe the pair is stale, the
/// decode is repaired (restarted through every gate), and then they pair.
#[test]
fn a_decode_that_kept_the_old_prefills_ports_is_repaired_not_waited_out() {
    let opts = StackOptions { waiting_timeout_secs: 300.0, decode_env: vec!["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=30".into()], ..real_opts() };
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    fragment(&config, "20-pair", "[verify]\npair_timeout = \"10s\"\n");
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"], Duration::from_secs(900));
    assert_eq!(r.code, 0, "{}", explain(&stack, &r));
    let pair = &r.event(P, "pair", "passed")["detail"];
    println!("the prefill's pair gate: {pair}");
    let first = &pair["pairs"][0];
    assert_eq!(first["result"], "stale", "{pair:#}");
    assert_eq!(first["probes"].as_array().map(Vec::len), Some(1), "one probe, not a second one waiting out 300 s: {pair:#}");
    assert_eq!(first["probes"][0]["decode"]["answer"], "no_answer", "{pair:#}");
    // The probe's own request aborted by its rid on both servers (0.5.23's `/abort_request`):
    // the new prefill holds no room for it until its bootstrap timeout.
    let abandoned = first["probes"][0]["abandoned"].as_str().unwrap_or("");
    assert!(abandoned.ends_with("aborted on both servers"), "{pair:#}");
    // Repaired: the decode went through every gate, then the pair was proven.
    for step in ["restart", "ready", "health", "pair", "router", "metrics"] {
        r.event(D, step, "passed");
    }
    assert_eq!(r.summary["repairs"][D].as_str().map(|s| !s.is_empty()), Some(true), "{:#}", r.summary);
}

/// `/model_info` of a worker: `(model_path, weight_version)`.
fn served(stack: &Stack, url: &str) -> (String, String) {
    let (_, body) = http_get_with(&format!("{url}/model_info"), stack.api_key.as_deref()).expect("model_info");
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    (v["model_path"].as_str().unwrap_or("").to_string(), v["weight_version"].as_str().unwrap_or("").to_string())
}

/// New weights in place under load, with keys on every server. After a retract pause 0.5.23's
/// decode asks the prefill to recompute its requests' KV through the prefill's /generate without
/// the key: 401, each fails (smg may retry it from the start, which hides it from the client).
/// pdctl pauses the decode in place instead. With an admin key, pause, continue, the load and the
/// flush take it, not the API key.
fn new_weights_go_in_place_under_load(stack: &Stack, config: &Path, d: &Pdctld) {
    // The decode paused in place still runs its two long requests after the continue, and its
    // cache is flushed only once it is idle, within `health_timeout`: with the default 30 s one
    // fresh-clone CI run (2026-12-06, the machine loaded) failed `weights_failed` while they
    // were still decoding. The bound a loaded machine needs, not the test's own timing.
    fragment(config, "20-flush", "[rollout]\nhealth_timeout = \"120s\"\n");
    let real = stack.real.clone().expect("the real server");
    let v2 = real.model_v2.display().to_string();
    let runs = || (stack.show(P, "InvocationID").expect("p"), stack.show(D, "InvocationID").expect("d"));
    let before = runs();
    let load = Load::start_with_key(&stack.router.as_ref().expect("router").url, 2.0, 8, stack.api_key.clone());
    // Long requests on the decode when the pause comes: retracted, recomputed, answered.
    let long = long_requests_on_the_decode(stack, 2, 3000);
    let r = pdctl_daemon(d, config, &["rollout", "weights", "--model-path", &v2, "--version", "v2", "--json"], Duration::from_secs(600));
    let (sent, failed) = load.stop();
    let long: Vec<(u16, u64, u64)> = long.into_iter().map(|h| h.join().expect("request thread")).collect();
    println!("clients through smg during the rollout: {sent} sent, {failed} failed; the long requests: {long:?}");
    assert_eq!(r.code, 0, "{}", explain(stack, &r));
    for (unit, pause) in [(D, "in_place"), (P, "retract")] {
        let step = &r.event(unit, "weights", "passed")["detail"];
        assert_eq!(step["to"]["weight_version"], "v2", "{step:#}");
        assert_eq!(step["pause"], pause, "{step:#}");
        let flushed = step["cache_flushed"].as_str().unwrap_or("");
        assert!(!flushed.is_empty() && !flushed.starts_with("not flushed"), "{unit}: the cache of the old weights was flushed: {step:#}");
        println!("{unit}: paused {} ms, cache flushed {flushed}", step["paused_ms"]);
    }
    for url in [&stack.prefill.url, &stack.decode.url] {
        assert_eq!(served(stack, url), (v2.clone(), "v2".to_string()), "{url} reports the weights it serves\n{}", logs(stack));
    }
    assert_eq!(runs(), before, "nothing was restarted");
    assert!(long.iter().all(|(s, n, _)| *s == 200 && *n == 3000), "every long request held by the pause finished: {long:?}\n{}", logs(stack));
    // They ran across the pause: answered after the decode's weights step started (its pause).
    let at = r.event(D, "weights", "started")["at"].as_str().and_then(|t| humantime::parse_rfc3339(t).ok()).expect("the step's time");
    let at_us = at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(u64::MAX);
    assert!(long.iter().all(|(_, _, answered)| *answered > at_us), "the long requests ran across the pause (answered after {at:?}): {long:?}");
    assert_eq!(failed, 0, "no client request failed ({sent} sent)\n{}", logs(stack));
    // Not even one the gateway retried: the decode never re-fetched KV through the prefill.
    let out = stack.sandbox.journalctl(&["-u", D, "--no-pager", "-o", "cat"]).expect("journal");
    let decode_log = String::from_utf8_lossy(&out.stdout);
    assert!(!decode_log.contains("PD rebootstrap prefill failed"), "{}", logs(stack));
    // The record says why the decode was paused in place.
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert!(rec["notes"].as_array().is_some_and(|n| n.iter().any(|x| x.as_str().is_some_and(|t| t.contains("paused in_place")))), "{rec:#}");
}

/// Host maintenance on the real server. `pdctl host drain` waits for a long request on the
/// decode, then stops both servers through SGLang's own drain (the decode first). After a
/// "reboot" (the manager starts the units again, pdctld starts again) pdctld brings them back by
/// itself through every gate: the ready line of the boot's own start, found from the cursor
/// recorded before the stop; the real PD pair; the gateway's re-admission.
fn a_host_drained_for_maintenance_stops_through_sglangs_drain_and_resumes_through_every_gate(stack: &Stack, config: &Path, d: &Pdctld) {
    use pdctl_tests::host_maintenance::{host_status, newest, passed, reboot};
    fragment(config, "20-drain", "[rollout]\ndrain_timeout = \"120s\"\n");
    let reqs = long_requests_on_the_decode(stack, 1, 1500);
    let args = ["host", "drain", "--allow-outage", "--reason", "driver update", "--json"];
    let r = pdctl_daemon(d, config, &args, Duration::from_secs(600));
    assert_eq!(r.code, 0, "{}", explain(stack, &r));
    let (status, tokens, _) = reqs.into_iter().next().expect("one").join().expect("request thread");
    assert_eq!((status, tokens), (200, 1500), "the request in flight finished through the host's drain\n{}", logs(stack));
    for unit in [P, D] {
        assert_eq!(stack.show(unit, "ActiveState").expect("ActiveState"), "inactive", "{unit} stopped");
        let stop = &r.event(unit, "stop", "passed")["detail"];
        println!("{unit}'s stop for maintenance: {stop}");
        assert_eq!(stop["stop"]["ended_by"], "drained", "SGLang's drain, not a crash or a SIGKILL: {stop:#}\n{}", logs(stack));
        assert!(stop["stop"]["stop_ms"].as_u64().is_some(), "the stop took a measured time: {stop:#}");
    }
    assert!(r.index(D, "stop", "passed") < r.index(P, "stop", "passed"), "the decode stops before the prefill");
    assert_eq!(host_status(d)["maintenance"]["phase"], "down");
    println!("the decode's drain for maintenance: {}", r.event(D, "drain", "passed")["detail"]);

    let rebooted = std::time::Instant::now();
    reboot(stack, d);
    let resumed = until(Duration::from_secs(600), Duration::from_millis(500), || host_status(d)["maintenance"].is_null());
    let rec = newest(d);
    assert!(resumed, "resumed by pdctld at its start: {:#}\n{}", host_status(d), logs(stack));
    println!("back in service {:.0} s after the reboot", rebooted.elapsed().as_secs_f64());
    assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("host_resume"), Some("succeeded")), "{rec:#}");
    for unit in [P, D] {
        for step in ["start", "ready", "health", "router", "metrics", "soak"] {
            assert!(passed(&rec, unit, step), "{unit} passed {step}: {rec:#}");
        }
        // The ready line is this boot's run's, from its main process.
        let ready = rec["events"]
            .as_array()
            .and_then(|es| es.iter().find(|e| e["unit"] == unit && e["step"] == "ready" && e["status"] == "passed"))
            .map(|e| e["detail"].clone())
            .unwrap_or_default();
        let pid = stack.show(unit, "MainPID").expect("MainPID");
        assert_eq!(ready["pid"].as_u64().map(|p| p.to_string()), Some(pid), "{ready:#}");
    }
    assert!(passed(&rec, P, "pair") || passed(&rec, D, "pair"), "the real pair probed: {rec:#}");
    stack.wait_router_healthy(2, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}\n{}", logs(stack)));
    let after = long_requests(stack, 1, 16).into_iter().next().expect("one").join().expect("request thread");
    assert_eq!((after.0, after.1), (200, 16), "a request through the gateway after the resume\n{}", logs(stack));
}
