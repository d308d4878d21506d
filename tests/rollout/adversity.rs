//! What goes wrong around the units: a crash loop that reaches systemd's start limit, metrics
//! that hang, a gateway that is down, journald restarted or its files rotated and vacuumed while
//! the ready gate follows it, an account the socket and the bus refuse, a decode stopped by
//! someone else, a traceback before a good ready line.

use super::*;

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
