//! `pdctl restart --rolling` on the sandbox (real systemd, journald, D-Bus) with the real router:
//! the 1P1D happy path, and each failure halts with its cause while the other unit is untouched.

use std::path::PathBuf;
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_tests::pdctl_sandbox::Gateway;
use pdctl_tests::{assert_recorded, pdctl_run, stack_up, JsonRun, Observed, RouterWatch};

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

#[test]
fn crash_loop_reaching_the_start_limit_halts_at_ready_and_the_next_rollout_resets_it() {
    let (stack, config) = up(StackOptions::default());
    let d0 = inv(&stack, D);
    // Restart= brings it back at once and again until systemd's start limit stops it for good.
    stack.drop_in(P, "40-limit", "[Unit]\nStartLimitIntervalSec=60\nStartLimitBurst=3\n[Service]\nRestart=on-failure\nRestartSec=100ms\n").unwrap();
    // The bad setting comes from an EnvironmentFile: fixing it needs no daemon-reload (which
    // would also reset systemd's start counter).
    let env = stack.sandbox.dir().join("prefill.env");
    std::fs::write(&env, "SGLANG_SIM_EXIT_CODE=3\n").unwrap();
    stack.drop_in(P, "50-env", &format!("[Service]\nEnvironmentFile={}\n", env.display())).unwrap();
    let (run, seen) = watched(&stack, &config);
    assert_failed(&run, P, "ready", "");
    let code = run.summary["failed"]["cause_code"].as_str().unwrap();
    assert!(["fatal_line", "crashed"].contains(&code), "{:#?}", run.summary);
    // The loop went on after the halt until systemd gave up on the unit ("Start request repeated
    // too quickly"; its Result stays the crash's own, exit-code).
    let limited = pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || {
        // The user manager's own lines about a unit carry USER_UNIT=, not UNIT=.
        let log = stack
            .sandbox
            .journalctl(&[&format!("USER_UNIT={P}"), "--no-pager", "-o", "cat"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        stack.show(P, "ActiveState").unwrap() == "failed" && log.contains("Start request repeated too quickly")
    });
    assert!(limited, "the crash loop reached the start limit: {} NRestarts={}", stack.show(P, "ActiveState").unwrap(), stack.show(P, "NRestarts").unwrap());
    seen.assert_down(1, 0);
    assert_untouched(&stack, &run, D, &d0);
    // Fixed, the next rollout resets the failed unit (systemd refuses to start it otherwise:
    // "start of the service was attempted too often"), restarts it and passes.
    std::fs::write(&env, "").unwrap();
    let again = pdctl_run(
        &["restart", "--rolling", "--load-changes", "--unit", P, "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)],
        LIMIT,
        |_| {},
    );
    assert_eq!(again.code, 0, "{:#?}\n{}", again.summary, again.stderr);
    assert_eq!(stack.show(P, "ActiveState").unwrap(), "active");
    assert_recorded(std::path::Path::new(&socket(&config)), &again);
}

#[test]
fn metrics_that_hang_halt_at_metrics_within_its_deadline() {
    let (stack, config) = up(StackOptions::default());
    let d0 = inv(&stack, D);
    // The restarted prefill accepts /metrics connections and never answers.
    stack.drop_in(P, "50-hang", "[Service]\nEnvironment=SGLANG_SIM_METRICS_HANG=1\n").unwrap();
    fragment(&config, "10-short.toml", "[rollout]\nmetrics_timeout = \"6s\"\n");
    let (run, seen) = watched(&stack, &config);
    assert_failed(&run, P, "metrics", "");
    assert_eq!(run.summary["failed"]["cause_code"], "metrics_unreachable", "{:#?}", run.summary);
    // Every call is bounded: the gate ends at its deadline plus at most one call's timeout.
    let ms = run.event(P, "metrics", "failed")["elapsed_ms"].as_u64().unwrap();
    assert!((6000..6000 + 11_000).contains(&ms), "the metrics gate took {ms} ms for a 6 s deadline");
    seen.assert_down(1, 0);
    assert_untouched(&stack, &run, D, &d0);
}

#[test]
fn router_down_is_refused_in_preflight_and_nothing_restarts() {
    let (stack, config) = up(StackOptions::default());
    let (p0, d0) = (inv(&stack, P), inv(&stack, D));
    stack.sandbox.systemctl(&["stop", "sglang-router.service"]).unwrap();
    let run = rollout(&config);
    assert_eq!(run.summary["failed"]["step"], "preflight", "{:#?}\n{}", run.summary, run.stderr);
    assert_eq!(run.summary["failed"]["cause_code"], "router_unreachable", "{:#?}", run.summary);
    assert_eq!(run.code, 3, "the router cannot be reached: exit 3");
    assert_recorded(std::path::Path::new(&socket(&config)), &run);
    // No router to watch: the workers' own runs show that nothing was touched.
    assert!(!run.touched(P) && !run.touched(D));
    assert_eq!((inv(&stack, P), inv(&stack, D)), (p0, d0));
}

/// Hold `unit`'s next start until `flag` exists (at most 60 s), then run its server with its
/// output on a new journal stream (`systemd-cat`, the same process: MainPID, unit and
/// invocation as before). The test decides when the ready line can come.
fn gate_start(stack: &Stack, unit: &str, flag: &std::path::Path) {
    let text = std::fs::read_to_string(stack.sandbox.unit_dir().join(unit)).unwrap();
    let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap().to_string();
    assert!(!exec.contains('\''), "the gate quotes the command in single quotes: {exec}");
    let script = format!(
        "i=0; while [ ! -e {flag} ]; do i=$$((i+1)); [ $$i -gt 1200 ] && exit 1; sleep 0.05; done; exec systemd-cat --identifier=sglang \"$$@\"",
        flag = flag.display()
    );
    // The server's own arguments stay separate words of the ExecStart, where preflight reads them.
    stack.drop_in(unit, "60-gate", &format!("[Service]\nExecStart=\nExecStart=/bin/sh -c '{script}' gate {exec}\n")).unwrap();
}

#[test]
fn journald_restarted_during_the_ready_follow_is_followed_through() {
    let (stack, config) = up(StackOptions::default());
    let flag = stack.sandbox.dir().join("go");
    gate_start(&stack, D, &flag);
    let mut restarted = None;
    let watch = RouterWatch::start(&stack);
    let run = pdctl_run(
        &["restart", "--rolling", "--load-changes", "--unit", D, "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)],
        LIMIT,
        |e| {
            if restarted.is_none() && e["unit"] == D && e["step"] == "ready" && e["status"] == "started" {
                // pdctl follows the journal now. Stop journald, start a new one, wait until it takes
                // a stream, then let the decode's server run and print its ready line.
                let old = stack.sandbox.host_pids_named("systemd-journal");
                assert_eq!(old.len(), 1, "one journald in the sandbox: {old:?}");
                std::process::Command::new("kill").args(["-TERM", &old[0].to_string()]).status().unwrap();
                let gone = pdctl_tests::until(Duration::from_secs(10), Duration::from_millis(50), || {
                    !std::path::Path::new(&format!("/proc/{}", old[0])).exists() || stack.sandbox.host_pids_named("systemd-journal").is_empty()
                });
                assert!(gone, "journald stopped within 10 s");
                let new = stack
                    .sandbox
                    .command("/lib/systemd/systemd-journald")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                let accepts = pdctl_tests::until(Duration::from_secs(10), Duration::from_millis(50), || {
                    stack
                        .sandbox
                        .command("/bin/sh")
                        .args(["-c", "echo pdctl-test: journald is back | systemd-cat -t pdctl-test"])
                        .status()
                        .is_ok_and(|s| s.success())
                });
                assert!(accepts, "the new journald took a stream within 10 s");
                std::fs::write(&flag, "").unwrap();
                restarted = Some(new);
            }
        },
    );
    watch.finish().assert_down(0, 1);
    assert!(restarted.is_some(), "journald was restarted during the ready gate: {:#?} {}", run.summary, run.stderr);
    assert_eq!(run.code, 0, "{:#?}\n{}", run.summary, run.stderr);
    let ready = &run.event(D, "ready", "passed")["detail"];
    assert_eq!(ready["pid"].to_string(), stack.show(D, "MainPID").unwrap(), "this run's line, read from the new journald: {ready}");
    assert_recorded(std::path::Path::new(&socket(&config)), &run);
}

#[test]
fn journal_rotated_and_vacuumed_during_the_ready_follow_is_followed_through() {
    let (stack, config) = up(StackOptions::default());
    let flag = stack.sandbox.dir().join("go");
    gate_start(&stack, D, &flag);
    let files = |stack: &Stack| -> Vec<String> {
        std::fs::read_dir(stack.sandbox.journal_dir()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    };
    let mut seen_files = None;
    let watch = RouterWatch::start(&stack);
    let run = pdctl_run(
        &["restart", "--rolling", "--load-changes", "--unit", D, "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)],
        LIMIT,
        |e| {
            if seen_files.is_none() && e["unit"] == D && e["step"] == "ready" && e["status"] == "started" {
                let before = files(&stack);
                // Rotate (the active file becomes an archive) and delete every archive.
                let out = stack.sandbox.command("journalctl").args(["--rotate", "--vacuum-size=1"]).output().unwrap();
                assert!(out.status.success(), "journalctl --rotate --vacuum-size=1: {}", String::from_utf8_lossy(&out.stderr));
                let after = files(&stack);
                std::fs::write(&flag, "").unwrap();
                seen_files = Some((before, after));
            }
        },
    );
    watch.finish().assert_down(0, 1);
    let (before, after) = seen_files.unwrap_or_else(|| panic!("the journal was rotated during the ready gate: {:#?}", run.summary));
    assert!(before.iter().any(|f| f == "system.journal"), "{before:?}");
    assert!(!after.iter().any(|f| f.starts_with("system@")), "every archive was vacuumed: {after:?}");
    assert_eq!(run.code, 0, "{:#?}\n{}", run.summary, run.stderr);
    let ready = &run.event(D, "ready", "passed")["detail"];
    assert_eq!(ready["pid"].to_string(), stack.show(D, "MainPID").unwrap(), "{ready}");
    assert_recorded(std::path::Path::new(&socket(&config)), &run);
}

#[test]
fn an_unprivileged_cli_is_refused_by_the_socket_and_by_a_bus_policy_with_exit_3() {
    let (stack, config) = up(StackOptions { router: false, ..Default::default() });
    let (p0, d0) = (inv(&stack, P), inv(&stack, D));
    let inside = config.parent().unwrap().join("inside.toml");
    // The CLI and its config where user nobody can read them.
    let dir = std::env::temp_dir().join(format!("pdctl-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("pdctl");
    std::fs::copy(pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap(), &bin).unwrap();
    let cfg = dir.join("pdctl.toml");
    std::fs::copy(&inside, &cfg).unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The user bus's policy (dbus-daemon reads /etc/dbus-1/session.d; replaced in the sandbox's
    // mount namespace only): any user may connect, nobody may not talk to systemd.
    let policy = dir.join("session.d");
    std::fs::create_dir_all(&policy).unwrap();
    std::fs::write(
        policy.join("pdctl-test.conf"),
        "<busconfig>\n  <policy context=\"default\"><allow user=\"*\"/></policy>\n  <policy user=\"nobody\">\n    <deny send_destination=\"org.freedesktop.systemd1\"/>\n  </policy>\n</busconfig>\n",
    )
    .unwrap();
    let run_in = |c: &mut std::process::Command| c.output().unwrap();
    let o = run_in(stack.sandbox.command("/bin/mount").args(["--bind", policy.to_str().unwrap(), "/etc/dbus-1/session.d"]));
    assert!(o.status.success(), "bind the policy: {}", String::from_utf8_lossy(&o.stderr));
    let o = run_in(stack.sandbox.command("busctl").args([
        "--user",
        "call",
        "org.freedesktop.DBus",
        "/org/freedesktop/DBus",
        "org.freedesktop.DBus",
        "ReloadConfig",
    ]));
    assert!(o.status.success(), "reload the bus's config: {}", String::from_utf8_lossy(&o.stderr));
    let cli = |user: Option<&str>, args: &[&str]| -> (i32, String, String) {
        let mut c = stack.sandbox.command("/usr/bin/setpriv");
        match user {
            Some(u) => c.args([&format!("--reuid={u}"), &format!("--regid={u}"), "--clear-groups"]),
            None => c.args(["--reuid=0"]),
        };
        let o = c.arg(&bin).args(args).arg("--config").arg(&cfg).output().unwrap();
        (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    // 1. pdctld's socket (mode 0660, root's group here): the CLI says so and what to do.
    let sock = socket(&config);
    let (code, _, err) = cli(Some("65534"), &["restart", "--rolling", "--json", "--socket", &sock]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("permission denied") && err.contains("member of the socket's group"), "{err}");
    // 2. The bus itself: the dry run's first call to systemd is denied by the policy; one
    //    sentence says so and what to do (no rollout exists: nothing to record).
    let (code, out, err) = cli(Some("65534"), &["restart", "--rolling", "--dry-run", "--json"]);
    assert_eq!(code, 3, "access denied is exit 3: {out}\n{err}");
    assert!(err.contains("permission denied") && err.contains("polkit"), "says what to do: {err}");
    // The same command as root passes: the policy is what refused nobody.
    let (code, out, err) = cli(None, &["restart", "--rolling", "--dry-run", "--json"]);
    assert_eq!(code, 0, "root's dry run: {out}\n{err}");
    assert_eq!((inv(&stack, P), inv(&stack, D)), (p0, d0), "nothing restarted");
    let _ = std::fs::remove_dir_all(dir);
}

/// With the decode stopped, `pdctl check` blames the decode (it is not running), not the prefill
/// whose smoke request cannot pass; and a restart of the prefill is refused in preflight naming
/// the decode role (`peer_role_down`), not as a prefill fault — nothing is restarted: its pair
/// gate could not pass.
#[test]
fn a_stopped_decode_is_blamed_for_itself() {
    let (stack, config) = up(StackOptions::default());
    fragment(&config, "10-short.toml", "[rollout]\nrouter_timeout = \"5s\"\n");
    stack.sandbox.systemctl(&["stop", D]).unwrap();
    let check = pdctl_run(&["check", "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)], LIMIT, |_| {});
    assert_failed(&check, D, "preflight", "is not running (inactive/dead)");
    assert_eq!(check.summary["failed"]["cause_code"], "unit_not_running");
    assert!(!check.events.iter().any(|e| e["unit"] == P && e["status"] == "failed"), "the prefill is not blamed: {:#?}", check.events);
    let p0 = inv(&stack, P);
    let run = pdctl_run(&["restart", "--rolling", "--unit", P, "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)], LIMIT, |_| {});
    assert_failed(&run, P, "preflight", "no decode worker serves");
    assert_eq!(run.summary["failed"]["cause_code"], "peer_role_down");
    assert_eq!(inv(&stack, P), p0, "the prefill was not restarted");
}

/// SGLang 0.5.23 logs some warnings with a traceback before its ready line: a start that goes on
/// to be ready passes (the ready step says so as a warning); a traceback is fatal only when the
/// run then exits (covered by the judge's unit tests and `fatal_line` after an exit).
#[test]
fn a_traceback_before_a_good_ready_line_is_not_a_failed_start() {
    let warn = vec!["--sim-warn-traceback".to_string()];
    let (stack, config) = up(StackOptions { prefill_args: warn, ..Default::default() });
    let run = pdctl_run(&["restart", "--rolling", "--unit", P, "--json", "--config", config.to_str().unwrap(), "--socket", &socket(&config)], LIMIT, |_| {});
    assert_eq!(run.code, 0, "{:#?} {}", run.summary, run.stderr);
    let ready = &run.event(P, "ready", "passed")["detail"];
    assert!(ready["warning"].as_str().is_some_and(|w| w.contains("traceback") && w.contains("Traceback (most recent call last)")), "{ready:#}");
    assert_eq!(stack.show(P, "ActiveState").unwrap(), "active");
}
