//! `pdctl restart --rolling` on the sandbox (real systemd, journald, D-Bus) with the real router:
//! the 1P1D happy path, and each failure halts with its cause while the other unit is untouched.

use std::path::PathBuf;
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_tests::pdctl_sandbox::Gateway;
use pdctl_tests::{assert_recorded, pdctl_run, stack_up, JsonRun, Observed, RouterWatch};

#[path = "rollout/adversity.rs"]
mod adversity;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

/// The stack, pdctld as a unit of the sandbox, and the (outside) config path.
fn up(opts: StackOptions) -> (Stack, PathBuf) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stack = rt.block_on(stack_up(&opts));
    let config = stack.write_pdctl_config().unwrap();
    stack.start_pdctld().expect("pdctld starts (READY=1 reaches systemd)");
    (stack, config)
}

/// pdctld's socket for a stack config.
fn socket(config: &std::path::Path) -> String {
    config.parent().unwrap().join("pdctl.sock").display().to_string()
}

fn fragment(config: &std::path::Path, name: &str, text: &str) {
    std::fs::write(config.parent().unwrap().join("config.d").join(name), text).unwrap();
}

/// A rolling restart that loads what the test changed in the units (a fault injected by a
/// drop-in is a change: a plain restart would refuse it as `changes_pending`).
fn rollout(config: &std::path::Path) -> JsonRun {
    pdctl_run(&["restart", "--rolling", "--load-changes", "--json", "--config", config.to_str().unwrap(), "--socket", &socket(config)], LIMIT, |_| {})
}

/// [`rollout`] while the test watches the router; asserts that pdctld recorded it as it said.
fn watched(stack: &Stack, config: &std::path::Path) -> (JsonRun, Observed) {
    let watch = RouterWatch::start(stack);
    let run = rollout(config);
    let seen = watch.finish();
    assert_recorded(std::path::Path::new(&socket(config)), &run);
    (run, seen)
}

fn inv(stack: &Stack, unit: &str) -> String {
    stack.show(unit, "InvocationID").unwrap()
}

/// The decode unit was not restarted or drained, and its run is the same.
fn assert_untouched(stack: &Stack, run: &JsonRun, unit: &str, before: &str) {
    assert!(!run.touched(unit), "{unit} must not be touched after a failure: {:#?}", run.events);
    assert_eq!(inv(stack, unit), before, "{unit} kept its run");
    assert_eq!(stack.show(unit, "ActiveState").unwrap(), "active");
}

fn assert_failed(run: &JsonRun, unit: &str, step: &str, cause_has: &str) {
    assert_eq!(run.code, 1, "exit 1 for a failed gate; stderr: {}", run.stderr);
    assert_eq!(run.summary["result"], "failed", "{:#?}", run.summary);
    assert_eq!(run.summary["failed"]["unit"], unit, "{:#?}", run.summary);
    assert_eq!(run.summary["failed"]["step"], step, "{:#?}", run.summary);
    let cause = run.summary["failed"]["cause"].as_str().unwrap();
    assert!(cause.contains(cause_has), "cause {cause:?} should mention {cause_has:?}");
    assert!(!run.summary["failed"]["last_lines"].as_array().unwrap().is_empty(), "the unit's last log lines are attached");
    assert_eq!(run.summary["failed"]["cause_code"].as_str().map(|c| !c.is_empty()), Some(true), "a stable cause code: {:#?}", run.summary);
    // Those lines are the unit's own and its manager's: none of pdctld's step sentences.
    let steps = ["preflight", "drain", "restart", "ready", "health", "router", "metrics", "soak"];
    for l in run.summary["failed"]["last_lines"].as_array().unwrap() {
        let l = l.as_str().unwrap();
        assert!(!steps.iter().any(|s| l.starts_with(&format!("{unit}: {s} "))) && l != "step", "pdctld's own line among the unit's: {l:?}");
    }
}

#[test]
fn happy_path_restarts_prefill_then_decode_through_every_gate() {
    happy_path(Gateway::Smg113);
}

#[test]
fn happy_path_on_sglang_router_0_3_2() {
    happy_path(Gateway::SglangRouter032);
}

fn happy_path(gateway: Gateway) {
    let (stack, config) = up(StackOptions { gateway, ..Default::default() });
    let (p0, d0) = (inv(&stack, P), inv(&stack, D));
    let (run, seen) = watched(&stack, &config);
    assert_eq!(run.code, 0, "stderr: {}\n{:#?}", run.stderr, run.summary);
    assert_eq!(run.summary["result"], "succeeded");
    // 1P1D: each worker was out of the router once, never both at the same time.
    seen.assert_down(1, 1);
    // SGLang 0.5.23 serves /ready: the health gate of a PD worker asks it alone (0.5.23's /health
    // sleeps 1 s in its generate; the pair gate's PD request that follows proves generation).
    assert_eq!(run.event(P, "health", "passed")["detail"]["checked"], serde_json::json!(["/ready"]));
    assert_eq!(seen.both_down, 0, "prefill and decode were never out of the router together: {seen:?}");
    assert_eq!(run.summary["units"], serde_json::json!([P, D]));
    assert!(run.summary["id"].as_str().is_some_and(|id| id.starts_with('r')), "the summary names pdctld's rollout id");
    for u in [P, D] {
        for step in ["preflight", "drain", "restart", "ready", "health", "router", "metrics", "soak"] {
            let e = run.event(u, step, "passed");
            assert!(e["elapsed_ms"].is_u64());
        }
    }
    // One unit at a time: decode is drained only after prefill's soak passed.
    assert!(run.index(P, "soak", "passed").unwrap() < run.index(D, "drain", "started").unwrap());
    // Both restarted: new runs.
    let (p1, d1) = (inv(&stack, P), inv(&stack, D));
    assert_ne!(p0, p1);
    assert_ne!(d0, d1);
    // The ready step came from the journal follower: the new main process's line, its journald
    // timestamp, and the detection delay measured from it.
    for (u, new_inv) in [(P, &p1), (D, &d1)] {
        let ready = &run.event(u, "ready", "passed")["detail"];
        assert!(ready["line"].as_str().unwrap().ends_with("The server is fired up and ready to roll!"));
        assert_eq!(ready["pid"].to_string(), stack.show(u, "MainPID").unwrap());
        assert!(ready["journal_realtime_us"].as_u64().unwrap() > 0);
        assert!(ready["detect_ms"].as_f64().unwrap() < 1000.0, "{ready}");
        assert_eq!(&run.event(u, "restart", "passed")["detail"]["invocation_id"], new_inv.as_str());
        let router = &run.event(u, "router", "passed")["detail"];
        assert_eq!(router["re_registered"], true, "drained, then re-added with worker_type");
        assert_eq!(router["smoke_request"], "200");
        let m = &run.event(u, "metrics", "passed")["detail"];
        assert!(m["max_total_tokens"].as_f64().unwrap() > 0.0);
    }
    // check and status work on the rolled stack.
    let check = pdctl_run(&["check", "--json", "--config", config.to_str().unwrap()], LIMIT, |_| {});
    assert_eq!(check.code, 0, "{:#?} {}", check.summary, check.stderr);
    assert!(!check.touched(P) && !check.touched(D));
    assert_eq!(inv(&stack, P), p1, "check restarts nothing");
    let status = pdctl_run(&["status", "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)], LIMIT, |_| {});
    assert_eq!(status.code, 0, "{}", status.stderr);
    // One JSON object: pdctld's state and every worker.
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let o = std::process::Command::new(&bin).args(["status", "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)]).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["workers"].as_array().map(Vec::len), v["serving"].as_bool()), (Some(2), Some(true)), "{v:#}");
    // Without pdctld the workers are still shown, and the exit says pdctld is not reachable (3).
    let o = std::process::Command::new(&bin).args(["status", "--config", config.to_str().unwrap(), "--socket", "/nonexistent/pdctl.sock"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(out.contains("not reachable") && out.contains(P), "{out}");
}

#[test]
fn dry_run_touches_nothing() {
    let (stack, config) = up(StackOptions { router: false, ..Default::default() });
    let (p0, d0) = (inv(&stack, P), inv(&stack, D));
    let run = pdctl_run(&["restart", "--rolling", "--dry-run", "--json", "--config", config.to_str().unwrap()], LIMIT, |_| {});
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.event(P, "preflight", "passed")["detail"]["dry_run"], true);
    assert!(!run.touched(P) && !run.touched(D));
    assert_eq!((inv(&stack, P), inv(&stack, D)), (p0, d0));
}

#[test]
fn unit_that_exits_at_start_halts_at_ready() {
    let (stack, config) = up(StackOptions::default());
    let d0 = inv(&stack, D);
    // A bad flag rolled out in a drop-in: SGLang's argparse rejects it at start (exit 2).
    // The unit file is edited (not reloaded): preflight sees NeedDaemonReload and, since the
    // restart is asked to load changes, reloads.
    stack.append_to_unit(P, "Environment=SGLANG_SIM_EXIT_CODE=3\n").unwrap();
    let watch = RouterWatch::start(&stack);
    let run =
        pdctl_run(&["restart", "--rolling", "--load-changes", "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)], LIMIT, |_| {});
    let seen = watch.finish();
    assert_recorded(std::path::Path::new(&socket(&config)), &run);
    assert_eq!(run.event(P, "preflight", "passed")["detail"]["daemon_reload"], true, "NeedDaemonReload → Reload");
    // Whichever arrives first halts it: the fatal line in the journal, or the unit's failure.
    assert_failed(&run, P, "ready", "");
    let cause = run.summary["failed"]["cause"].as_str().unwrap();
    assert!(cause.contains("fatal line") || cause.contains("status 3"), "{cause}");
    seen.assert_down(1, 0);
    assert_untouched(&stack, &run, D, &d0);
}

#[test]
fn never_ready_halts_at_the_deadline() {
    let (stack, config) = up(StackOptions::default());
    let d0 = inv(&stack, D);
    stack.drop_in(P, "50-hang", "[Service]\nEnvironment=SGLANG_SIM_NEVER_READY=1\n").unwrap();
    fragment(&config, "10-short.toml", "[rollout]\nready_timeout = \"4s\"\n");
    let (run, seen) = watched(&stack, &config);
    assert_failed(&run, P, "ready", "no ready line");
    assert_eq!(run.summary["failed"]["cause_code"], "ready_timeout");
    assert!(run.event(P, "ready", "failed")["elapsed_ms"].as_u64().unwrap() >= 4000);
    seen.assert_down(1, 0);
    assert_untouched(&stack, &run, D, &d0);
}

#[test]
fn crash_during_soak_is_caught_although_restart_hides_it() {
    let (stack, config) = up(StackOptions::default());
    let d0 = inv(&stack, D);
    stack.drop_in(P, "50-crash", "[Service]\nEnvironment=SGLANG_SIM_CRASH_AFTER_READY=10\nRestart=on-failure\nRestartSec=200ms\n").unwrap();
    fragment(&config, "10-soak.toml", "[rollout]\nmin_healthy = \"25s\"\n");
    let (run, seen) = watched(&stack, &config);
    assert_failed(&run, P, "soak", "restarted it");
    assert_eq!(run.summary["failed"]["cause_code"], "crashed");
    // systemd brings it back (Restart=on-failure): a final state check alone would call it fine.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let back = rt.block_on(pdctl_tests::poll_until(Duration::from_secs(20), Duration::from_millis(100), || async {
        (stack.show(P, "NRestarts").unwrap().parse::<u32>().unwrap() >= 1 && stack.show(P, "ActiveState").unwrap() == "active").then_some(())
    }));
    assert!(back.is_some(), "Restart=on-failure brought the unit back to active");
    seen.assert_down(1, 0);
    assert_untouched(&stack, &run, D, &d0);
}

#[test]
fn health_stuck_at_503_halts_at_health() {
    let (stack, config) = up(StackOptions::default());
    let d0 = inv(&stack, D);
    stack.drop_in(P, "50-unhealthy", "[Service]\nEnvironment=SGLANG_SIM_HEALTH_FAIL_AFTER_READY=0 SGLANG_SIM_HEALTH_GENERATE_MS=50\n").unwrap();
    fragment(&config, "10-short.toml", "[rollout]\nhealth_timeout = \"4s\"\n");
    let (run, seen) = watched(&stack, &config);
    assert_failed(&run, P, "health", "503");
    assert_eq!(run.summary["failed"]["cause_code"], "health_timeout");
    seen.assert_down(1, 0);
    assert_untouched(&stack, &run, D, &d0);
}

#[test]
fn router_that_never_readmits_halts_at_router() {
    never_readmits(Gateway::Smg113);
}

#[test]
fn router_that_never_readmits_halts_at_router_on_sglang_router_0_3_2() {
    never_readmits(Gateway::SglangRouter032);
}

fn never_readmits(gateway: Gateway) {
    let (stack, config) = up(StackOptions { gateway, ..Default::default() });
    let d0 = inv(&stack, D);
    let router_pid = stack.show("sglang-router.service", "MainPID").unwrap();
    let host_pid = stack.sandbox.host_pid(router_pid.parse().unwrap()).expect("the router's host pid").to_string();
    fragment(&config, "10-short.toml", "[rollout]\nrouter_timeout = \"5s\"\n");
    // The router hangs (SIGSTOP) right after the prefill restart: it never re-admits the worker.
    let mut stopped = false;
    let watch = RouterWatch::start(&stack);
    let run = pdctl_run(&["restart", "--rolling", "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)], LIMIT, |e| {
        if !stopped && e["unit"] == P && e["step"] == "restart" && e["status"] == "passed" {
            // The drained prefill is seen out of the router before the router is made to hang.
            watch.wait_until("sample with the drained prefill out", Duration::from_secs(60), |o| o.down("prefill") >= 1);
            watch.silence(true);
            std::process::Command::new("kill").args(["-STOP", &host_pid]).status().unwrap();
            stopped = true;
        }
    });
    std::process::Command::new("kill").args(["-CONT", &host_pid]).status().unwrap();
    watch.silence(false);
    let seen = watch.finish();
    assert!(stopped);
    assert_recorded(std::path::Path::new(&socket(&config)), &run);
    // While it hung it answered nothing; before and after, only the prefill was out.
    assert!(seen.unreachable_while_silent > 0, "{seen:?}");
    seen.assert_down(1, 0);
    assert_failed(&run, P, "router", "did not admit");
    assert_eq!(run.summary["failed"]["cause_code"], "router_never_admits");
    assert_untouched(&stack, &run, D, &d0);
}

#[test]
fn metrics_disabled_is_refused_in_preflight_and_nothing_restarts() {
    let (stack, config) = up(StackOptions { decode_metrics: false, ..Default::default() });
    let (p0, d0) = (inv(&stack, P), inv(&stack, D));
    let (run, seen) = watched(&stack, &config);
    assert_failed(&run, D, "preflight", "--enable-metrics is not in the ExecStart");
    assert_eq!(run.summary["failed"]["cause_code"], "metrics_disabled");
    assert!(!run.touched(P) && !run.touched(D));
    seen.assert_down(0, 0);
    assert_eq!((inv(&stack, P), inv(&stack, D)), (p0, d0));
}

#[test]
fn older_sglang_metric_names_pass() {
    let old = vec!["--sim-version".to_string(), "0.5.6".to_string()];
    let (stack, config) = up(StackOptions { prefill_args: old.clone(), decode_args: old, ..Default::default() });
    let (run, seen) = watched(&stack, &config);
    assert_eq!(run.code, 0, "{:#?}\n{}", run.summary, run.stderr);
    seen.assert_down(1, 1);
    for u in [P, D] {
        let names = run.event(u, "metrics", "passed")["detail"]["names"].to_string();
        assert!(names.contains("sglang:num_used_tokens") && !names.contains("kv_used_tokens"), "{names}");
        // 0.5.6 serves no /ready: the health gate says it used /health alone.
        assert_eq!(run.event(u, "health", "passed")["detail"]["checked"], serde_json::json!(["/health"]));
    }
}

#[test]
fn ready_line_flushed_by_the_old_process_is_not_taken_for_the_new_run() {
    let flush = vec!["--sim-flush-ready-on-stop".to_string()];
    let (stack, config) = up(StackOptions { prefill_args: flush.clone(), decode_args: flush, load_secs: 2.0, ..Default::default() });
    let run = rollout(&config);
    assert_eq!(run.code, 0, "{:#?}\n{}", run.summary, run.stderr);
    for u in [P, D] {
        let ready = &run.event(u, "ready", "passed")["detail"];
        assert!(ready["ignored_ready_lines_of_other_runs"].as_u64().unwrap() >= 1, "the old run's flushed line was seen and ignored: {ready}");
        assert!(ready["since_restart_ms"].as_u64().unwrap() >= 2000, "accepted only after the new run loaded: {ready}");
        assert_eq!(ready["pid"].to_string(), stack.show(u, "MainPID").unwrap());
    }
}

#[test]
fn unknown_unit_is_a_config_error_and_nothing_restarts() {
    let (stack, config) = up(StackOptions { router: false, ..Default::default() });
    let (p0, d0) = (inv(&stack, P), inv(&stack, D));
    fragment(&config, "20-typo.toml", "[[worker]]\nunit = \"sglang-dsv4-decod.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:1\"\n");
    let run = rollout(&config);
    assert_eq!(run.code, 2, "an unknown unit is a config error: {:#?}", run.summary);
    assert_eq!(run.summary["failed"]["unit"], "sglang-dsv4-decod.service");
    assert!(run.summary["failed"]["cause"].as_str().unwrap().contains("does not exist"));
    assert_eq!(run.summary["failed"]["cause_code"], "unit_missing");
    assert_eq!((inv(&stack, P), inv(&stack, D)), (p0, d0));
}

#[test]
fn invalid_config_names_file_line_and_key() {
    let dir = tempfile_dir();
    let main = dir.join("pdctl.toml");
    std::fs::create_dir_all(dir.join("config.d")).unwrap();
    std::fs::write(&main, "[[worker]]\nunit = \"a.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    let frag = dir.join("config.d/10-x.toml");
    std::fs::write(&frag, "[rollout]\nmin_healthy = \"10s\"\nready_timout = \"5m\"\n").unwrap();
    let run = pdctl_run(&["restart", "--rolling", "--json", "--config", main.to_str().unwrap()], LIMIT, |_| {});
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains(&format!("{}:3:", frag.display())), "{}", run.stderr);
    assert!(run.stderr.contains("ready_timout"), "{}", run.stderr);
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "pdctl-cfg-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

// --- The fault matrix's remaining rows (docs/reliability.md) ---
