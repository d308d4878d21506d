//! Today's gateway and the first one, and single-worker roles told the truth: pdctl behind
//! `smg` 1.13.0 and `sglang-router` 0.3.2 (both real, from PyPI), on the sandbox.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack, StackOptions};
use pdctl_tests::pdctl_sandbox::Gateway;
use pdctl_tests::{assert_recorded, pdctl_daemon, pdctl_run, JsonRun, RouterWatch};

#[path = "gateway/alone.rs"]
mod alone;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn up(opts: StackOptions) -> (Stack, PathBuf, Pdctld) {
    pdctl_tests::stack_with_pdctld_opts(&opts)
}

fn run(d: &Pdctld, config: &Path, args: &[&str]) -> JsonRun {
    pdctl_daemon(d, config, args, LIMIT)
}

#[test]
fn the_only_worker_of_a_role_is_refused_without_allow_outage_and_restarted_with_it() {
    let (stack, config, d) = up(StackOptions::default());
    // This operator has not said that an interruption is acceptable.
    std::fs::write(config.parent().unwrap().join("config.d/30-no-outage.toml"), "[rollout]\nallow_outage = false\n").unwrap();
    let (p0, d0) = (stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap());
    let dry = pdctl_run(&["restart", "--rolling", "--dry-run", "--json", "--config", config.to_str().unwrap()], LIMIT, |_| {});
    assert_eq!(dry.code, 2, "the dry run shows the refusal: {:#?}", dry.summary);
    let refused = run(&d, &config, &["restart", "--rolling", "--json"]);
    assert_eq!(refused.code, 2, "{:#?} {}", refused.summary, refused.stderr);
    let f = &refused.summary["failed"];
    assert_eq!((f["step"].as_str(), f["cause_code"].as_str(), f["unit"].as_str()), (Some("preflight"), Some("only_worker_of_role"), Some(P)));
    let cause = f["cause"].as_str().unwrap();
    assert!(cause.contains("only prefill worker") && cause.contains("--allow-outage"), "one sentence naming unit, role and what to do: {cause}");
    assert!(!refused.touched(P) && !refused.touched(D));
    assert_eq!((stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap()), (p0, d0), "nothing was touched");
    let ok = run(&d, &config, &["restart", "--rolling", "--allow-outage", "--json"]);
    assert_eq!(ok.code, 0, "{:#?} {}", ok.summary, ok.stderr);
    let outage = ok.event(P, "preflight", "passed")["detail"]["outage"].as_str().unwrap_or_default().to_string();
    assert!(outage.contains("only prefill worker") && outage.contains("serving stops"), "the outage is said, not hidden: {outage}");
    // pdctld measured each window out of the router (drain → re-admitted): the next refusal
    // names it as the interruption to expect — the window, not the start alone — and so does the
    // dry run, which asks pdctld.
    let at = |step: &str, status: &str| humantime::parse_rfc3339(ok.event(P, step, status)["at"].as_str().unwrap()).unwrap();
    let window = at("router", "passed").duration_since(pdctl_tests::out_of_router_since(&ok, P)).unwrap();
    let again = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    assert_eq!(again.code, 2);
    let said_secs = |cause: &str| -> u64 {
        assert!(cause.contains("its last measured window out of the router"), "{cause}");
        cause.split("about ").nth(1).and_then(|r| r.split('s').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{cause}"))
    };
    let secs = said_secs(again.summary["failed"]["cause"].as_str().unwrap());
    assert!(secs * 1000 + 1000 >= window.as_millis() as u64 && secs * 1000 <= window.as_millis() as u64 + 1000, "{secs} s said vs a {window:?} window");
    let dry = pdctl_run(
        &["restart", "--rolling", "--unit", P, "--dry-run", "--json", "--config", config.to_str().unwrap(), "--socket", d.socket.to_str().unwrap()],
        LIMIT,
        |_| {},
    );
    assert_eq!(dry.code, 2, "{:#?}", dry.summary);
    assert_eq!(said_secs(dry.summary["failed"]["cause"].as_str().unwrap()), secs, "the dry run says what the real run says");
}

/// The router gives up on a prefill that is down when it starts; pdctl re-registers it after
/// its gates (the drain finds nothing to drain).
fn re_registers_a_worker_the_router_dropped(gateway: Gateway) {
    let (stack, config, d) = up(StackOptions { gateway, router_startup_timeout_secs: 3, ..Default::default() });
    stack.sandbox.systemctl(&["stop", P]).unwrap();
    stack.sandbox.systemctl(&["restart", "sglang-router.service"]).unwrap();
    // Past the router's startup retries (3 s) with the prefill still down.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(500));
    }
    stack.sandbox.systemctl(&["start", P]).unwrap();
    stack.wait_ready(Duration::from_secs(60)).unwrap();
    let r = run(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    assert!(r.index(P, "drain", "skipped").is_some(), "the router did not list it: {:#?}", r.events);
    assert_eq!(r.event(P, "router", "passed")["detail"]["re_registered"], true);
    assert_eq!(stack.wait_router_healthy(2, Duration::from_secs(30)).unwrap(), 2);
}

#[test]
fn re_registers_a_worker_the_router_dropped_on_smg_1_13() {
    re_registers_a_worker_the_router_dropped(Gateway::Smg113);
}

#[test]
fn re_registers_a_worker_the_router_dropped_on_sglang_router_0_3_2() {
    re_registers_a_worker_the_router_dropped(Gateway::SglangRouter032);
}

/// A request in flight through the router when the drain starts finishes before the restart.
fn drain_under_load(gateway: Gateway) {
    // 2P2D: another decode serves meanwhile, so the drain takes this one out before its stop and
    // waits for what it runs (the only worker of a role serves through its stop instead: below).
    let (stack, config, d) = up(StackOptions { gateway, pairs: 2, ..Default::default() });
    // ~8 s of decoding at the simulator's 200 tokens/s, in flight before the rollout starts: it
    // outlasts smg's 5 s drain settle (the drain waits for the gateway to unlist the worker
    // first), and ends within the test config's 10 s drain_timeout.
    let (load, busy) = pdctl_tests::load::request_in_flight_on(&stack, 1600);
    let r = run(&d, &config, &["restart", "--rolling", "--unit", &busy, "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let drain = &r.event(&busy, "drain", "passed")["detail"];
    assert_eq!(drain["taken_out"], serde_json::Value::Null, "another decode serves: taken out before the stop: {drain}");
    assert_eq!(drain["in_flight_left"], 0, "{drain}");
    assert!(drain["in_flight_at_start"].as_u64().is_some_and(|n| n >= 1), "the drain saw the request in flight (from /v1/loads): {drain}");
    assert!(drain["waited_for_requests_ms"].as_u64().unwrap() > 100, "the drain waited for the request: {drain}");
    assert_eq!(load.join().unwrap(), Some(200), "the request in flight finished");
}

/// A request through the gateway of `tokens` tokens (200 tokens/s in the simulator), on the decode
/// before this returns. Returns the thread that ends with its status.
fn request_in_flight(stack: &Stack, tokens: u32) -> std::thread::JoinHandle<Option<u16>> {
    let (load, unit) = pdctl_tests::load::request_in_flight_on(stack, tokens);
    assert_eq!(unit, stack.decode.unit, "1P1D: the one decode runs it");
    load
}

/// A request that outlives the drain's wait (`drain_timeout` is 10 s in the test config; this
/// one decodes for ~16 s).
fn long_request(stack: &Stack) -> std::thread::JoinHandle<Option<u16>> {
    request_in_flight(stack, 3200)
}

/// SGLang 0.5.23's stop waits for the requests in flight (its SIGTERM watchdog checks every 5 s):
/// the restart job lasts that long, the request finishes, and the restart step says why. The
/// decode is the only one of its role and busy when looked at; its `TimeoutStopSec=40` covers
/// `drain_timeout` and two drain checks, so its drain is deferred to its stop: it serves through
/// its SIGTERM instead of waiting out a drain out of the gateway, and leaves it during the stop. Margins that hold on a
/// loaded machine: the request decodes for ~25 s, more than the 5 s to the server's first check
/// and less than the unit's `TimeoutStopSec=40`.
#[test]
fn a_busy_only_worker_serves_until_its_stop_which_waits_for_its_request_and_says_why() {
    let (stack, config, d) = up(StackOptions { timeout_stop_secs: 40, ..Default::default() });
    let load = request_in_flight(&stack, 5000);
    let r = run(&d, &config, &["restart", "--rolling", "--unit", D, "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let drain = &r.event(D, "drain", "passed")["detail"];
    assert!(drain["taken_out"].as_str().is_some_and(|t| t.starts_with("deferred: the only decode worker")), "deferred however busy: {drain}");
    assert!(
        drain["looks"].as_u64().is_some_and(|n| n >= 1) && drain["busy_looks"] == drain["looks"],
        "busy when looked at: deferred all the same (its TimeoutStopSec covers the wait): {drain}"
    );
    let restart = &r.event(D, "restart", "passed")["detail"];
    assert!(restart["taken_out"].is_object(), "the restart took it out: {restart:#}");
    let stop = &restart["stop"];
    assert!(stop["requests_at_first_check"].as_u64().is_some_and(|n| n >= 1), "the server reported the request at its watchdog check: {restart:#}");
    assert!(stop["stop_ms"].as_u64().is_some_and(|ms| ms >= 1000), "the stop lasted while the request finished: {stop}");
    assert_eq!(stop["killed"], false);
    assert!(stop["why"].as_str().unwrap_or("").contains("SGLang waited for"), "{stop}");
    let timeout_stop = stop["timeout_stop_ms"].as_u64().expect("the unit's TimeoutStopSec was read");
    assert!(restart["job_limit_ms"].as_u64().unwrap() > timeout_stop, "the job's wait covers TimeoutStopSec plus the start: {restart}");
    assert_eq!(load.join().unwrap(), Some(200), "the request in flight finished: the stop waited for it");
}

/// With `abort_after_drain_timeout = true` what the drain left is aborted through SGLang's
/// `/abort_request` and recorded; the stop then has nothing to wait for.
#[test]
fn abort_after_drain_timeout_aborts_what_the_drain_left() {
    let (stack, config) = pdctl_tests::stack_with_config(&StackOptions::default());
    std::fs::write(config.parent().unwrap().join("config.d/40-abort.toml"), "[rollout]\nabort_after_drain_timeout = true\n").unwrap();
    let d = stack.start_pdctld().expect("pdctld starts");
    let load = long_request(&stack);
    let r = run(&d, &config, &["restart", "--rolling", "--unit", D, "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let drain = &r.event(D, "drain", "passed")["detail"];
    assert_eq!(drain["aborted"], 1, "{drain}");
    assert_eq!(drain["aborted_why"], "abort_after_drain_timeout = true");
    let stop = &r.event(D, "restart", "passed")["detail"]["stop"];
    assert_eq!(stop["requests_at_first_check"], 0, "nothing was left for the stop: {stop}");
    assert_ne!(load.join().unwrap(), Some(200), "the request was aborted");
}

/// A stop that outlives `TimeoutStopSec=` is SIGKILLed by systemd: the restart step passes (the
/// new run is up) with the `stop_slow` warning, and preflight said it could happen.
#[test]
fn a_stop_killed_at_timeout_stop_sec_is_reported_as_stop_slow() {
    let (stack, config, d) = up(StackOptions::default());
    stack.drop_in(D, "60-timeout-stop", "[Service]\nTimeoutStopSec=3s\n").expect("drop-in");
    let load = long_request(&stack);
    let r = run(&d, &config, &["restart", "--rolling", "--unit", D, "--load-changes", "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let pre = &r.event(D, "preflight", "passed")["detail"];
    assert!(pre["warnings"].to_string().contains("TimeoutStopSec=3s is shorter than SGLang's 5 s SIGTERM watchdog"), "{pre}");
    let restart = &r.event(D, "restart", "passed")["detail"];
    assert_eq!(restart["cause_code"], "stop_slow", "{restart:#}");
    assert_eq!(restart["stop"]["killed"], true, "{restart:#}");
    assert!(restart["warning"].as_str().unwrap_or("").contains("SIGKILL at TimeoutStopSec=3s"), "{restart:#}");
    assert_ne!(load.join().unwrap(), Some(200), "the request was lost");
}

/// smg 1.13 marks a registered worker that fails its health checks `not_ready`, then `failed`
/// (3 × its failure threshold more failures: ~12 s at the stack's 1 s interval), and never
/// takes a `failed` worker back. Without the drain (`drain = false`) a restart that keeps the
/// decode down longer than that leaves it `failed`: the router gate removes and re-adds it
/// instead of waiting out `router_timeout`.
#[test]
fn a_worker_smg_lists_failed_after_its_restart_is_removed_and_re_added() {
    let (stack, config) = pdctl_tests::stack_with_config(&StackOptions { gateway: Gateway::Smg113, ..Default::default() });
    std::fs::write(config.parent().unwrap().join("config.d/40-no-drain.toml"), "[rollout]\ndrain = false\n").unwrap();
    let d = stack.start_pdctld().expect("pdctld starts");
    stack.drop_in(D, "60-slow-start", "[Service]\nExecStartPre=/bin/sleep 16\n").expect("drop-in");
    let r = run(&d, &config, &["restart", "--rolling", "--unit", D, "--load-changes", "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let router = &r.event(D, "router", "passed")["detail"];
    assert_eq!(router["re_added_after"], "failed", "smg listed it failed; pdctl removed and re-added it: {router:#}");
    assert_eq!(router["re_registered"], true, "{router:#}");
}

#[test]
fn drain_waits_for_requests_in_flight_on_smg_1_13() {
    drain_under_load(Gateway::Smg113);
}

#[test]
fn drain_waits_for_requests_in_flight_on_sglang_router_0_3_2() {
    drain_under_load(Gateway::SglangRouter032);
}

#[test]
fn together_restarts_a_1p1d_pair_at_once_and_verifies_both() {
    let (stack, config, d) = up(StackOptions::default());
    std::fs::write(config.parent().unwrap().join("config.d/50-together.toml"), "[rollout]\nsingle_pair = \"together\"\n").unwrap();
    let (p0, d0) = (stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap());
    // The human dry run says how: both at once, one interruption.
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let out =
        std::process::Command::new(bin).args(["restart", "--rolling", "--dry-run", "--config"]).arg(&config).arg("--socket").arg(&d.socket).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    assert!(text.contains(&format!("{P} is the only prefill worker: restarted together with {D} (single_pair = \"together\"): serving stops once")), "{text}");
    assert!(!text.contains('\u{1b}'), "no colour codes into a pipe: {text:?}");
    let r = run(&d, &config, &["restart", "--rolling", "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    for u in [P, D] {
        for step in ["drain", "restart", "ready", "health", "router", "metrics", "soak"] {
            r.event(u, step, "passed");
        }
    }
    assert!(r.index(D, "restart", "started").unwrap() < r.index(P, "soak", "passed").unwrap(), "both at once: one interruption, not two");
    assert_ne!(stack.show(P, "InvocationID").unwrap(), p0);
    assert_ne!(stack.show(D, "InvocationID").unwrap(), d0);
    assert_eq!(r.summary["units"].as_array().unwrap().len(), 2);
}

/// The restarted worker is healthy but fails every request: the gateway's circuit breaker opens
/// and the router gate halts on it, naming the breaker (the trap: `is_healthy: true` while the
/// breaker refuses everything).
fn circuit_breaker_open(gateway: Gateway) {
    let (stack, config, d) = up(StackOptions { gateway, ..Default::default() });
    std::fs::write(config.parent().unwrap().join("config.d/40-router.toml"), "[rollout]\nrouter_timeout = \"8s\"\n").unwrap();
    let d0 = stack.show(D, "InvocationID").unwrap();
    let fail_url = format!("{}/sim/fail_generate?secs=120", stack.prefill.url);
    let watch = RouterWatch::start(&stack);
    let r = pdctl_tests::rollout_with_fault(&d, &config, (P, "router", "started"), vec![fail_url], LIMIT);
    let seen = watch.finish();
    assert_eq!(r.code, 1, "{:#?} {}", r.summary, r.stderr);
    assert_eq!(r.summary["failed"]["step"], "router");
    assert_recorded(&d.socket, &r);
    seen.assert_down(1, 0);
    let code = r.summary["failed"]["cause_code"].as_str().unwrap();
    let cause = r.summary["failed"]["cause"].as_str().unwrap();
    eprintln!("{}: {code}: {cause}", gateway.name());
    assert_eq!(code, "circuit_open", "{cause}");
    assert!(cause.contains("circuit breaker is open"), "{cause}");
    assert!(!r.touched(D));
    assert_eq!(stack.show(D, "InvocationID").unwrap(), d0);
}

#[test]
fn a_worker_whose_requests_fail_halts_at_the_router_gate_on_smg_1_13() {
    circuit_breaker_open(Gateway::Smg113);
}

#[test]
fn a_worker_whose_requests_fail_halts_at_the_router_gate_on_sglang_router_0_3_2() {
    circuit_breaker_open(Gateway::SglangRouter032);
}

/// A worker whose in-flight requests cannot be read (no load endpoint pdctl knows) is not
/// restarted blind: the drain fails `load_unknown`, the worker keeps its run and is re-admitted.
#[test]
fn a_drain_that_cannot_read_the_load_is_a_cause_not_a_silent_skip() {
    let (stack, config, d) = up(StackOptions { decode_args: vec!["--sim-no-load-endpoint".into()], ..Default::default() });
    let d0 = stack.show(D, "InvocationID").unwrap();
    let r = run(&d, &config, &["restart", "--rolling", "--unit", D, "--json"]);
    assert_eq!(r.code, 1, "{:#?} {}", r.summary, r.stderr);
    assert_eq!((r.summary["failed"]["step"].as_str(), r.summary["failed"]["cause_code"].as_str()), (Some("drain"), Some("load_unknown")), "{:#?}", r.summary);
    assert_eq!(stack.show(D, "InvocationID").unwrap(), d0, "not restarted");
    assert!(r.index(D, "reconcile", "passed").is_some(), "re-admitted: {:#?}", r.events);
}

/// With `unknown_load = "warn"` the drain says it could not read the load and the restart goes on
/// (SGLang's own stop still waits for what it runs).
#[test]
fn an_unreadable_load_is_a_warning_by_the_setting() {
    let (stack, config) = pdctl_tests::stack_with_config(&StackOptions { decode_args: vec!["--sim-no-load-endpoint".into()], ..Default::default() });
    std::fs::write(config.parent().unwrap().join("config.d/40-load.toml"), "[rollout]\nunknown_load = \"warn\"\n").unwrap();
    let d = stack.start_pdctld().expect("pdctld starts");
    let r = run(&d, &config, &["restart", "--rolling", "--unit", D, "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let drain = &r.event(D, "drain", "passed")["detail"];
    assert_eq!(drain["cause_code"], "load_unknown", "{drain}");
    assert!(drain["warning"].as_str().unwrap_or("").contains("cannot tell how many requests"), "{drain}");
    assert_eq!(drain["in_flight_left"], serde_json::Value::Null, "not measured is not zero: {drain}");
}
