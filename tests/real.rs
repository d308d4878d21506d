//! The real-server tier: pdctl against the released `sglang==0.5.23` server on this CPU (a tiny
//! model made by scripts/setup, PD over mooncake's TCP transport), behind the real smg 1.13, the
//! units in the sandbox's real systemd. Where the simulator and the real server disagree, these
//! tests say what the real one does.
//!
//! One real stack at a time (`.config/nextest.toml`: ~3 GB of memory per server). Each failure
//! names the gate and prints the servers' last lines.

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Server, Stack, StackOptions};
use pdctl_tests::{pdctl_daemon, stack_with_pdctld_opts, JsonRun, Load};
use serde_json::Value;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";

/// The real 1P1D stack. The decode waits 30 s for a room's KV and the prefill holds a room 30 s
/// (SGLang's defaults are 300 s each): a failed transfer shows within a test's time.
fn real_opts() -> StackOptions {
    StackOptions { server: Server::Real, waiting_timeout_secs: 30.0, bootstrap_timeout_secs: 30.0, ..Default::default() }
}

/// The last lines of each unit and of the gateway, for a failure report.
fn logs(stack: &Stack) -> String {
    let mut units: Vec<String> = stack.workers().iter().map(|w| w.unit.clone()).collect();
    units.extend(stack.router.iter().map(|r| r.unit.clone()));
    units
        .iter()
        .map(|u| {
            let out = stack.sandbox.journalctl(&["-u", u, "-n", "60", "--no-pager", "-o", "short-precise"]);
            format!("--- {u}:\n{}\n", out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_else(|e| e.to_string()))
        })
        .collect()
}

/// What failed, by gate, with the servers' last lines.
fn explain(stack: &Stack, r: &JsonRun) -> String {
    let f = &r.summary["failed"];
    format!(
        "exit {}: {} failed at {} ({}): {}\nsummary: {:#}\nstderr: {}\n{}",
        r.code,
        f["unit"],
        f["step"],
        f["cause_code"],
        f["cause"],
        r.summary,
        r.stderr,
        logs(stack)
    )
}

#[test]
fn a_rolling_restart_of_the_unchanged_real_pair_passes_every_gate_under_load() {
    let (stack, config, d) = stack_with_pdctld_opts(&real_opts());
    let router = stack.router.clone().expect("router");
    let load = Load::start(&router.url, 2.0, 8);
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], Duration::from_secs(900));
    let (sent, failed) = load.stop();
    println!("clients through smg during the rollout: {sent} sent, {failed} failed");
    assert_eq!(r.code, 0, "{}", explain(&stack, &r));
    // Every gate of each worker passed, on the real server's own evidence.
    for unit in [P, D] {
        for step in ["preflight", "drain", "restart", "ready", "health", "pair", "router", "metrics", "soak"] {
            r.event(unit, step, "passed");
        }
        // The preflight compared what was asked with what was asked: the unit is unchanged
        // although /server_info reports the transfer backend resolved (`mooncake`).
        let pre = &r.event(unit, "preflight", "passed")["detail"];
        assert_eq!(pre["kill_mode"], "mixed", "{pre:#}");
        // The ready line of this start, from its new main process.
        let ready = &r.event(unit, "ready", "passed")["detail"];
        let pid = stack.show(unit, "MainPID").expect("MainPID");
        assert_eq!(ready["pid"].as_u64().map(|p| p.to_string()), Some(pid), "{ready:#}");
        // The stop was SGLang's drain (KillMode=mixed), not a crash and not the manager's SIGKILL.
        let stop = &r.event(unit, "restart", "passed")["detail"]["stop"];
        assert_eq!(stop["ended_by"], "drained", "{stop:#}\n{}", logs(&stack));
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
}
