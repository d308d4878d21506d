//! Never make it worse: pdctld stopped, killed or failing after a drain never leaves a worker out
//! of the router; one rollout at a time, atomically; a control socket that cannot be starved;
//! strict API input. On the sandbox (real systemd, journald, D-Bus) with the real router.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pdctl_tests::pdctl_sandbox::stack::{http_get, Pdctld, Stack, StackOptions};
use pdctl_tests::{live_daemon, pdctl_daemon, pdctl_run, raw_api as raw, stack_with_pdctld, RouterWatch};
use serde_json::Value;

#[path = "safety/changes.rs"]
mod changes;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn is(e: &Value, unit: &str, step: &str, status: &str) -> bool {
    e["unit"] == unit && e["step"] == step && e["status"] == status
}

/// Is `url` listed healthy by the router now?
fn in_router(stack: &Stack, url: &str) -> bool {
    let r = stack.router.as_ref().unwrap();
    http_get(&format!("{}/workers", r.url))
        .ok()
        .and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
        .and_then(|v| {
            v["workers"].as_array().map(|l| l.iter().any(|w| w["url"] == url && w["is_healthy"] == true && (w["status"].is_null() || w["status"] == "ready")))
        })
        .unwrap_or(false)
}

/// Wait (bounded) until the router lists the prefill healthy again; then a request through the
/// router must succeed. Returns how long it took.
fn back_in_router(stack: &Stack) -> Duration {
    let t0 = Instant::now();
    while !in_router(stack, &stack.prefill.url) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the prefill is back in the router within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = t0.elapsed();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = format!("{}/generate", stack.router.as_ref().unwrap().url);
    let ok = rt.block_on(pdctl_tests::poll_until(Duration::from_secs(20), Duration::from_millis(200), || async {
        let r = pdctl_tests::http().post(&url).json(&serde_json::json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}})).send().await.ok()?;
        (r.status() == 200).then_some(())
    }));
    assert!(ok.is_some(), "a request through the router succeeds");
    took
}

/// The record of `id`, once pdctld is done re-admitting drained workers (bounded).
fn record(d: &Pdctld, id: &str) -> Value {
    let t0 = Instant::now();
    while raw(&d.socket, "GET", "/v1/status", "").1["reconciling"] != false {
        assert!(t0.elapsed() < Duration::from_secs(60), "pdctld finished reconciling within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    pdctl_tests::record(&d.socket, id)
}

fn running_id(d: &Pdctld) -> String {
    let (_, h) = raw(&d.socket, "GET", "/v1/rollouts", "");
    h["rollouts"].as_array().unwrap().last().unwrap()["id"].as_str().unwrap().to_string()
}

/// The rollout of the one drain in pdctld's ledger (read from disk: pdctld may be down).
fn ledger_rollout(d: &Pdctld) -> String {
    let drains: Vec<PathBuf> = std::fs::read_dir(d.state.join("drains")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(drains.len(), 1, "the drain is in the ledger: {drains:?}");
    let v: Value = serde_json::from_slice(&std::fs::read(&drains[0]).unwrap()).unwrap();
    assert_eq!(v["unit"], P);
    v["rollout_id"].as_str().unwrap().to_string()
}

fn reconcile_event(rec: &Value, unit: &str) -> Value {
    rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| is(e, unit, "reconcile", "passed"))
        .cloned()
        .unwrap_or_else(|| panic!("a passed reconcile of {unit}: {rec:#}"))
}

#[test]
fn sigkill_right_after_a_drain_is_undone_at_the_next_start() {
    // 2P2D: the first prefill's drain takes it out before its stop (in 1P1D the only prefill's
    // drain is deferred to its stop's drain check: nothing is out yet right after the drain).
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&StackOptions { pairs: 2, ..Default::default() });
    let watch = RouterWatch::start(&stack);
    let mut c = live_daemon(&d, &config, &["restart", "--rolling", "--json"]);
    c.wait_line(LIMIT, |e| is(e, P, "drain", "passed")).expect("the prefill was drained");
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    let _ = c.finish(Duration::from_secs(20));
    // Read the ledger before pdctld starts again: the drain was written down.
    let id = ledger_rollout(&d);
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    let took = back_in_router(&stack);
    watch.finish().assert_down(1, 0);
    let rec = record(&d, &id);
    assert_eq!(rec["lifecycle"]["state"], "interrupted");
    let ev = reconcile_event(&rec, P);
    eprintln!("re-admitted {took:?} after pdctld's start (same run: {})", ev["detail"]["same_run"]);
    assert!(std::fs::read_dir(d.state.join("drains")).unwrap().next().is_none(), "the ledger is empty again");
    let (_, st) = raw(&d.socket, "GET", "/v1/status", "");
    assert_eq!(st["drained"], serde_json::json!([]), "{st}");
    assert_eq!(st["reconciling"], false);
    // The outage is on record: the interrupted rollout holds the prefill's window, from its
    // drain to the re-admission by the next pdctld (at least what was seen after that start).
    let window = rec["windows"][P]["total_ms"].as_u64().unwrap_or_else(|| panic!("the interrupted record has the window: {rec:#}"));
    assert!(window >= took.as_millis() as u64, "{window} ms against {took:?} seen after pdctld's start");
    assert!(rec["notes"].to_string().contains("pdctld re-admitted it at its start"), "{rec:#}");
    // And its resume's record says so too.
    let r = pdctl_daemon(&d, &config, &["rollout", "resume", &id, "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let resumed = record(&d, r.summary["id"].as_str().expect("id"));
    assert!(resumed["notes"].to_string().contains(&format!("in the interrupted rollout {id}: {P} was")), "{resumed:#}");
}

/// 1P1D: the only prefill's drain is deferred — written to the ledger, the worker left in the
/// gateway. pdctld SIGKILLed right then: the drain is found at the next start and reconciled (the
/// prefill admitted and serving, whatever its restart had reached), the ledger empty again.
#[test]
fn sigkill_right_after_a_deferred_drain_is_reconciled_at_the_next_start() {
    let (stack, config, d) = stack_with_pdctld();
    let mut c = live_daemon(&d, &config, &["restart", "--rolling", "--json"]);
    let drained = c.wait_line(LIMIT, |e| is(e, P, "drain", "passed")).expect("the prefill's drain passed");
    assert!(drained["detail"]["taken_out"].as_str().is_some_and(|t| t.starts_with("deferred")), "{drained}");
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    let _ = c.finish(Duration::from_secs(20));
    let id = ledger_rollout(&d);
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    back_in_router(&stack);
    let rec = record(&d, &id);
    assert_eq!(rec["lifecycle"]["state"], "interrupted");
    reconcile_event(&rec, P);
    assert!(std::fs::read_dir(d.state.join("drains")).unwrap().next().is_none(), "the ledger is empty again");
    let (_, st) = raw(&d.socket, "GET", "/v1/status", "");
    assert_eq!(st["drained"], serde_json::json!([]), "{st}");
}

#[test]
fn sigkill_while_the_drained_worker_restarts_re_admits_it_only_after_its_gates() {
    let (stack, config, d) = stack_with_pdctld();
    let mut c = live_daemon(&d, &config, &["restart", "--rolling", "--json"]);
    c.wait_line(LIMIT, |e| is(e, P, "restart", "passed")).expect("the prefill restarted");
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    let _ = c.finish(Duration::from_secs(20));
    let id = ledger_rollout(&d);
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    back_in_router(&stack);
    let rec = record(&d, &id);
    let ev = reconcile_event(&rec, P);
    assert_eq!(ev["detail"]["same_run"], false, "a new run: {ev}");
    assert_eq!(ev["detail"]["router"]["re_registered"], true, "re-registered by the reconcile: {ev}");
    // Nothing resumed by itself: the decode was not touched.
    assert!(!rec["events"].as_array().unwrap().iter().any(|e| e["unit"] == D && e["step"] == "restart"));
}

#[test]
fn stopping_pdctld_mid_rollout_undoes_the_drain_before_it_exits() {
    let (stack, config, d) = stack_with_pdctld();
    let mut c = live_daemon(&d, &config, &["restart", "--rolling", "--json"]);
    c.wait_line(LIMIT, |e| is(e, P, "drain", "passed")).expect("the prefill was drained");
    let id = running_id(&d);
    // SIGTERM (an upgrade, `systemctl restart pdctld`): stop returns once pdctld has exited.
    stack.sandbox.systemctl(&["stop", &d.unit]).unwrap();
    assert_eq!(stack.show(&d.unit, "ActiveState").unwrap(), "inactive");
    assert!(in_router(&stack, &stack.prefill.url), "pdctld put the prefill back before it exited");
    let _ = c.finish(Duration::from_secs(20));
    stack.sandbox.systemctl(&["start", &d.unit]).unwrap();
    let rec = record(&d, &id);
    assert_eq!(rec["lifecycle"]["state"], "interrupted", "{rec:#}");
    reconcile_event(&rec, P);
    back_in_router(&stack);
}

#[test]
fn a_gate_failing_after_the_drain_re_admits_the_worker() {
    let (stack, config, d) = stack_with_pdctld();
    // The restart job outlives pdctl's wait for it (the unit's TimeoutStopSec, 1 s here, plus
    // job_timeout): its start takes 5 s. The restart step fails (exit 3) after the drain, while
    // systemd goes on starting the unit.
    stack.drop_in(P, "50-slow-start", "[Service]\nTimeoutStopSec=1s\nExecStartPre=/bin/sleep 5\n").unwrap();
    std::fs::write(config.parent().unwrap().join("config.d/20-job.toml"), "[rollout]\njob_timeout = \"1s\"\n").unwrap();
    let run = pdctl_daemon(&d, &config, &["restart", "--rolling", "--load-changes", "--json"], LIMIT);
    assert_eq!(run.code, 3, "{:#?} {}", run.summary, run.stderr);
    assert_eq!(run.summary["failed"]["step"], "restart");
    assert_eq!(run.summary["failed"]["cause_code"], "systemd_timeout");
    assert!(run.index(P, "reconcile", "passed").is_some(), "the drain was undone on the error path: {:#?}", run.events);
    assert!(!run.touched(D), "nothing after the failed unit");
    back_in_router(&stack);
}

#[test]
fn concurrent_starts_get_one_202_and_the_rest_409_naming_it_and_a_resume_runs_once() {
    let (stack, config, d) = stack_with_pdctld();
    let watch = RouterWatch::start(&stack);
    let sock = d.socket.clone();
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let sock = sock.clone();
            std::thread::spawn(move || raw(&sock, "POST", "/v1/rollouts", r#"{"kind":"restart","units":[]}"#))
        })
        .collect();
    let answers: Vec<(u16, Value)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let accepted: Vec<&Value> = answers.iter().filter(|(s, _)| *s == 202).map(|(_, v)| v).collect();
    assert_eq!(accepted.len(), 1, "{answers:?}");
    let id = accepted[0]["id"].as_str().unwrap().to_string();
    for (status, v) in answers.iter().filter(|(s, _)| *s != 202) {
        assert_eq!(*status, 409, "{v}");
        assert_eq!(v["exit_code"], 4);
        assert_eq!(v["cause_code"], "busy");
        assert!(v["error"].as_str().unwrap().contains(&id), "names the running rollout: {v}");
    }
    let (_, h) = raw(&sock, "GET", "/v1/rollouts", "");
    assert_eq!(h["rollouts"].as_array().unwrap().len(), 1, "no phantom records: {h}");
    let w = pdctl_daemon(&d, &config, &["rollout", "watch", &id, "--json"], LIMIT);
    assert_eq!(w.code, 0, "{}", w.stderr);
    // One rollout ran: one worker out of the router at a time, never both.
    let seen = watch.finish();
    seen.assert_down(1, 1);
    assert_eq!(seen.both_down, 0, "{seen:?}");
    assert!(w.summary["elapsed_ms"].as_u64().unwrap() >= 4000, "the whole rollout's time (two 2 s soaks at least): {}", w.summary);
    assert!(w.events.iter().all(|e| e["at"].as_str().is_some_and(|t| t.ends_with('Z'))), "every event carries its wall-clock time");
    let again = pdctl_daemon(&d, &config, &["rollout", "resume", &id, "--json"], LIMIT);
    assert_eq!(again.code, 2, "a succeeded rollout cannot be resumed: {}", again.stderr);
}

#[test]
fn half_open_connections_do_not_starve_the_api_or_kill_pdctld() {
    let (stack, _config, d) = stack_with_pdctld();
    let pid0 = stack.show(&d.unit, "MainPID").unwrap();
    let mut held = Vec::new();
    for _ in 0..2000 {
        match UnixStream::connect(&d.socket) {
            Ok(c) => {
                let _ = (&c).write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n"); // never finished
                held.push(c);
            }
            Err(_) => break,
        }
    }
    assert!(held.len() >= 1000, "opened {} half-open connections", held.len());
    let t0 = Instant::now();
    let mut answered = false;
    while t0.elapsed() < Duration::from_secs(30) {
        if let Ok(mut c) = UnixStream::connect(&d.socket) {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = c.write_all(b"GET /v1/status HTTP/1.0\r\nHost: x\r\n\r\n");
            let mut out = String::new();
            if c.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.") && out.contains("\"reconciling\"") {
                answered = true;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("the API answered {:?} after {} half-open connections", t0.elapsed(), held.len());
    assert!(answered, "the API answers while {} half-open connections are held", held.len());
    drop(held);
    assert_eq!(stack.show(&d.unit, "MainPID").unwrap(), pid0, "pdctld was not killed or restarted");
    assert_eq!(stack.show(&d.unit, "NRestarts").unwrap(), "0");
}

#[test]
fn api_input_is_strict_and_every_rejection_is_the_json_error() {
    let (stack, _config, d) = stack_with_pdctld();
    let p0 = stack.show(P, "InvocationID").unwrap();
    let (status, v) = raw(&d.socket, "POST", "/v1/rollouts", r#"{"kind":"restart","unit":["x"]}"#);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["cause_code"], "bad_request");
    assert_eq!(v["exit_code"], 2);
    assert!(v["error"].as_str().unwrap().contains("unknown field `unit`"), "{v}");
    for (m, path, body) in [("POST", "/v1/rollouts", "not json"), ("GET", "/v2/nothing", ""), ("DELETE", "/v1/rollouts", ""), ("GET", "/v1/rollouts/nope", "")]
    {
        let (status, v) = raw(&d.socket, m, path, body);
        assert!(status >= 400, "{m} {path}: {status}");
        assert!(v["error"].is_string() && v["exit_code"].is_number() && v["cause_code"].is_string(), "{m} {path}: the documented error body: {v}");
    }
    assert_eq!(stack.show(P, "InvocationID").unwrap(), p0, "nothing was restarted");
}
