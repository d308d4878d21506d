//! The real-server tier in 2P2D (four real `sglang==0.5.23` servers, ~12 GB, behind smg 1.13)
//! under the load this CPU sustains: a rolling restart and a pair's host drain, and the P:D ratio
//! changed live through SGLang's runtime role switch. One real stack at a time
//! (`.config/nextest.toml`).

use std::time::Duration;

use pdctl_tests::capacity::LongStream;
use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack, StackOptions};
use pdctl_tests::real_stack::{explain, fragment, gateway_errors, real_opts};
use pdctl_tests::{pdctl_daemon, raw_api, stack_with_pdctld_opts, until, JsonRun, Load};
use serde_json::Value;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";

/// Long prompts sharing a system prompt, as the load of both tests sends them.
fn system_prompt() -> String {
    "You are a careful assistant for an operations team; answer briefly and name your sources. ".repeat(8)
}

/// Part 2 of [`in_2p2d_under_load_the_ratio_changes_live_then_a_rolling_restart_and_a_pairs_host_drain_lose_no_request`]:
/// clients send 3 req/s of prompts sharing a long system prompt while three more ask for
/// 600-token answers again and again (long answers in flight throughout): one worker of each
/// role (the second pair) restarted in turn through every gate while the other of its role
/// serves, then the first pair drained for its host's maintenance while the second serves
/// (pdctld told of that pair alone, as on a host of its own) and resumed — so each of the four
/// stops and starts once. Not one client request fails. 3 req/s is about a tenth of what this
/// stack sustains here (`scripts/bench-capacity`, [`pdctl_tests::capacity::sustained`]); why not
/// 80 %, docs/benchmarks.md.
fn a_rolling_restart_and_a_pairs_host_drain_lose_no_request(stack: &Stack, config: &std::path::Path, d: &Pdctld) {
    let router = stack.router.as_ref().expect("router").url.clone();
    let system = system_prompt();
    // About a tenth of what it sustains (`scripts/bench-capacity`): at 80 % of it a
    // rolling restart loses requests on this CPU (docs/benchmarks.md says why).
    let rate = 3.0;
    // 1. A rolling restart of the second pair (the first pair's stop and start is part 2's).
    let second: Vec<String> = stack.workers().into_iter().filter(|w| w.unit != P && w.unit != D).map(|w| w.unit.clone()).collect();
    assert_eq!(second.len(), 2, "{second:?}");
    let load = Load::start_with(&router, rate, 16, None, Some(system.clone()));
    let long = LongStream::start(&router, 3, 600);
    let mut args = vec!["restart", "--rolling", "--json"];
    for u in &second {
        args.extend(["--unit", u.as_str()]);
    }
    let r = pdctl_daemon(d, config, &args, Duration::from_secs(1500));
    let (sent, failed) = load.stop();
    let longs = long.stop();
    println!("the rolling restart at {rate:.1} req/s: {sent} sent, {failed} failed; {} long answers", longs.len());
    if failed > 0 {
        for e in r.events.iter().filter(|e| e["status"] != "started") {
            println!(
                "  {} {} {} {}",
                e["at"].as_str().unwrap_or(""),
                e["unit"].as_str().unwrap_or(""),
                e["step"].as_str().unwrap_or(""),
                e["status"].as_str().unwrap_or("")
            );
        }
    }
    assert_eq!(r.code, 0, "{}", explain(stack, &r));
    for w in stack.workers().into_iter().filter(|w| second.contains(&w.unit)) {
        for step in ["drain", "restart", "ready", "health", "pair", "router", "metrics", "soak"] {
            r.event(&w.unit, step, "passed");
        }
        let drain = &r.event(&w.unit, "drain", "passed")["detail"];
        // smg's own count of what it had in flight to the worker when the drain took it out.
        println!("{}: {} in flight at its drain (smg's count)", w.unit, drain["router_load"]);
        assert_eq!(r.event(&w.unit, "restart", "passed")["detail"]["stop"]["ended_by"], "drained");
    }
    assert!(sent as f64 >= rate * 10.0, "the load ran: {sent} sent");
    assert_eq!(failed, 0, "a second worker of each role served throughout\n{}", gateway_errors(stack));
    assert!(longs.iter().all(|&(status, tokens)| (status, tokens) == (200, 600)), "every long answer came back whole: {longs:?}\n{}", gateway_errors(stack));

    // 2. One pair's host drained for maintenance while the other pair serves, then resumed.
    for path in [config.to_path_buf(), d.config.clone()] {
        let text = std::fs::read_to_string(&path).expect("config");
        std::fs::write(&path, pdctl_tests::fleet_hosts::config_with_only(&text, &[P, D])).expect("config");
    }
    stack.sandbox.systemctl(&["restart", &d.unit]).expect("pdctld starts again");
    let settled = || raw_api(&d.socket, "GET", "/v1/status", "").1["reconciling"] == false;
    assert!(until(Duration::from_secs(120), Duration::from_millis(200), settled), "pdctld started");
    let load = Load::start_with(&router, rate, 16, None, Some(system.clone()));
    let long = LongStream::start(&router, 3, 600);
    let drained = pdctl_daemon(d, config, &["host", "drain", "--reason", "pair one's driver update", "--json"], Duration::from_secs(900));
    assert_eq!(drained.code, 0, "{}", explain(stack, &drained));
    for unit in [P, D] {
        assert_eq!(stack.show(unit, "ActiveState").expect("ActiveState"), "inactive", "{unit} stopped");
        assert_eq!(drained.event(unit, "stop", "passed")["detail"]["stop"]["ended_by"], "drained");
    }
    let resumed = pdctl_daemon(d, config, &["host", "resume", "--json"], Duration::from_secs(900));
    let (sent, failed) = load.stop();
    let longs = long.stop();
    println!("one pair's maintenance at {rate:.1} req/s: {sent} sent, {failed} failed; {} long answers", longs.len());
    println!("the decode's drain for maintenance: {}", drained.event(D, "drain", "passed")["detail"]);
    assert_eq!(resumed.code, 0, "{}", explain(stack, &resumed));
    assert_eq!(failed, 0, "the other pair served throughout\n{}", gateway_errors(stack));
    assert!(longs.iter().all(|&(status, tokens)| (status, tokens) == (200, 600)), "every long answer came back whole: {longs:?}\n{}", gateway_errors(stack));
}

/// When `e` happened (its `at`), in ms since the epoch.
fn at_ms(e: &Value) -> i64 {
    e["at"]
        .as_str()
        .and_then(|s| humantime::parse_rfc3339_weak(s.trim_end_matches('Z')).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64)
}

/// How long `unit`'s `step` took in `r` (started to passed), ms.
fn took(r: &JsonRun, unit: &str, step: &str) -> i64 {
    at_ms(r.event(unit, step, "passed")) - at_ms(r.event(unit, step, "started"))
}

/// Part 1 of [`in_2p2d_under_load_the_ratio_changes_live_then_a_rolling_restart_and_a_pairs_host_drain_lose_no_request`]:
/// the ratio changed live on the real servers under load: 2P2D → 3P1D → 2P2D through `pdctl role
/// set --ratio`, every server started with `--enable-pd-role-switch` and otherwise SGLang's
/// defaults. Each flip drains a worker of the role that has too many — one that can switch at run
/// time first (a born prefill's radix cache rules it out as a decode: the dry run says so), then
/// the least busy — switches it at run time (no restart: the same InvocationID), and passes every
/// gate in its new role; the switched decode serves prefills (its own journal's prefill batches
/// after the switch). No client request fails. The figures
/// per switch (drain, switch, re-admission) are printed for docs/benchmarks.md.
fn the_ratio_goes_to_3p1d_and_back_at_run_time_with_no_failed_request(stack: &Stack, config: &std::path::Path, d: &Pdctld) {
    let router = stack.router.as_ref().expect("router").url.clone();
    let rate = 3.0;
    // A server started as a prefill runs its radix cache (SGLang's default): as a decode after a
    // run-time flip, 0.5.23 loses KV and the server exits at its next idle check (measured here:
    // `pdctl_core::sglang::role_switch::decode_refusal`). The dry run says it takes the restart path.
    let born_prefill = stack.workers().into_iter().find(|w| w.role == "prefill").map(|w| w.unit.clone()).expect("a prefill");
    let dry = pdctl_daemon(d, config, &["role", "set", &born_prefill, "decode", "--dry-run", "--json"], Duration::from_secs(300));
    assert_eq!(dry.code, 0, "{}", explain(stack, &dry));
    let flip = &dry.summary["flips"][0];
    assert_eq!(flip["path"], "restart", "{flip:#}");
    assert!(flip["restart_because"].as_str().is_some_and(|w| w.contains("radix cache")), "{flip:#}");
    let load = Load::start_with(&router, rate, 16, None, Some(system_prompt()));
    let long = LongStream::start(&router, 2, 300);
    let mut flipped = Vec::new();
    for (ratio, to) in [("3:1", "prefill"), ("2:2", "decode")] {
        let r = pdctl_daemon(d, config, &["role", "set", "--ratio", ratio, "--json"], Duration::from_secs(900));
        assert_eq!(r.code, 0, "{}", explain(stack, &r));
        let unit = r.summary["units"][0].as_str().unwrap_or_default().to_string();
        let role = &r.event(&unit, "role", "passed")["detail"];
        assert_eq!((role["path"].as_str(), role["to"].as_str()), (Some("runtime"), Some(to)), "{role:#}");
        r.event(&unit, "restart", "skipped");
        println!(
            "{ratio}: {unit} -> {to}: drain {} ms, switch {} ms (SGLang's {} ms), health+pair {} ms, re-admission {} ms",
            took(&r, &unit, "drain"),
            took(&r, &unit, "role"),
            role["switch_ms"],
            took(&r, &unit, "health") + took(&r, &unit, "pair"),
            took(&r, &unit, "router")
        );
        flipped.push(unit);
    }
    // Back to 2:2, pdctl flips the one that can switch at run time: the decode it made a prefill.
    assert_eq!(flipped[0], flipped[1], "the same worker went back");
    let (sent, failed) = load.stop();
    let longs = long.stop();
    println!("2P2D -> 3P1D -> 2P2D at {rate:.1} req/s: {sent} sent, {failed} failed; {} long answers", longs.len());
    // Two switches take 10-20 s here (behind sglang-router 0.3.2, whose drain has no
    // draining state, about 10 s): the load ran throughout.
    assert!(sent as f64 >= rate * 5.0, "the load ran: {sent} sent");
    assert_eq!(failed, 0, "the other workers of each role served throughout\n{}", gateway_errors(stack));
    assert!(longs.iter().all(|&(status, tokens)| (status, tokens) == (200, 300)), "every long answer came back whole: {longs:?}\n{}", gateway_errors(stack));
    // The decode that ran as a prefill served prefills: its own journal's prefill batches
    // between its two switches.
    let unit = &flipped[0];
    let journal =
        stack.sandbox.journalctl(&["-u", unit, "--no-pager", "-o", "cat"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let after = journal.find("PD role switch succeeded: decode -> prefill").map(|i| &journal[i..]).unwrap_or("");
    let until_back = after.find("PD role switch succeeded: prefill -> decode").map(|i| &after[..i]).unwrap_or(after);
    assert!(until_back.contains("Prefill batch"), "{unit} ran prefill batches as a prefill:\n{}", &until_back[..until_back.len().min(3000)]);
    let check = pdctl_daemon(d, config, &["check", "--json"], Duration::from_secs(300));
    assert_eq!(check.code, 0, "{}", explain(stack, &check));
}

/// Four real servers (~12 GB, every one started with `--enable-pd-role-switch`, otherwise
/// SGLang's defaults) behind smg 1.13, one stack for both parts (a stack's start is most of a
/// minute): the P:D ratio changed live and back, then a rolling restart and a pair's host drain,
/// all under load with no failed client request.
#[test]
fn in_2p2d_under_load_the_ratio_changes_live_then_a_rolling_restart_and_a_pairs_host_drain_lose_no_request() {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { pairs: 2, role_switch: true, ..real_opts() });
    fragment(&config, "20-2p2d", "[rollout]\nallow_outage = false\ndrain_timeout = \"120s\"\n");
    the_ratio_goes_to_3p1d_and_back_at_run_time_with_no_failed_request(&stack, &config, &d);
    a_rolling_restart_and_a_pairs_host_drain_lose_no_request(&stack, &config, &d);
}
