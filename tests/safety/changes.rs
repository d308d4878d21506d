//! Bad changes never make it worse: a flag the server rejects is rolled back (on its first day,
//! or before pdctld ever started) and then quarantined; records that cannot be written are
//! retried; a refusal (bad config, preflight, the rollback policy, a stopped peer) moves no file
//! and restarts nothing; an abort, a dry run and a drain the gateway undid say what happened.

use super::*;

/// `pdctl-rollout.service`, as the timer starts it: `rollout apply --if-changed`.
fn timer_service(stack: &Stack, d: &Pdctld) {
    let pdctl = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    stack
        .sandbox
        .write_unit(
            "pdctl-rollout.service",
            &format!(
                "[Unit]\nRequires=pdctld.service\nAfter=pdctld.service\n[Service]\nType=oneshot\nExecStart={} rollout apply --if-changed --config {} --socket {}\n",
                pdctl.display(),
                s(&d.config),
                s(&d.socket)
            ),
        )
        .unwrap();
    stack.sandbox.daemon_reload().unwrap();
}

fn bad_flag_drop_in(stack: &Stack) -> PathBuf {
    let text = std::fs::read_to_string(stack.sandbox.unit_dir().join(P)).unwrap();
    let exec = text.lines().find(|l| l.starts_with("ExecStart=")).unwrap().to_string();
    let dir = stack.sandbox.unit_dir().join(format!("{P}.d"));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("50-turbo.conf");
    std::fs::write(&p, format!("[Service]\nExecStart=\n{exec} --bogus-turbo\n")).unwrap();
    p
}

fn rollback_policy(config: &Path) {
    std::fs::write(config.parent().unwrap().join("config.d/10-rollback.toml"), "[rollout]\non_failure = \"rollback\"\n").unwrap();
}

/// Run the command after "next: " in `line` as printed (up to a `;`, `,` or " (" that ends it),
/// against this pdctld (its socket added; its config when the command names none): exit code and
/// everything it printed.
fn run_next(line: &str, config: &Path, d: &Pdctld) -> (i32, String) {
    let next = line.split("next: ").nth(1).unwrap_or_else(|| panic!("no next in {line}"));
    let cmd = next.split([';', ',']).next().unwrap_or(next).split(" (").next().unwrap_or(next).trim();
    let mut words = cmd.split_whitespace();
    assert_eq!(words.next(), Some("pdctl"), "{cmd}");
    let args: Vec<&str> = words.collect();
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let mut c = std::process::Command::new(bin);
    c.args(&args).args(["--socket", &s(&d.socket)]);
    if !args.contains(&"--config") {
        c.args(["--config", &s(config)]);
    }
    let o = c.output().unwrap();
    (o.status.code().unwrap_or(-1), format!("{cmd}\n{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// pdctl's CLI as an operator runs it (human output): exit code and stdout lines.
fn human(d: &Pdctld, config: &Path, args: &[&str]) -> (i32, Vec<String>, String) {
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let o = std::process::Command::new(bin).args(args).args(["--config", &s(config), "--socket", &s(&d.socket)]).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn a_bad_drop_in_added_after_pdctld_started_is_rolled_back_on_the_first_day_then_quarantined() {
    let (stack, config, d) = stack_with_pdctld();
    rollback_policy(&config);
    let p0 = stack.show(P, "InvocationID").unwrap();
    let d0 = stack.show(D, "InvocationID").unwrap();
    // No `apply --all` first: pdctld recorded what the prefill runs with when it started.
    let bad = bad_flag_drop_in(&stack);
    timer_service(&stack, &d);
    let watch = RouterWatch::start(&stack);
    assert!(stack.sandbox.systemctl(&["start", "pdctl-rollout.service"]).is_err(), "the change did not go through: the oneshot fails");
    watch.finish().assert_down(1, 0);
    let (_, h) = raw(&d.socket, "GET", "/v1/rollouts", "");
    let rec = h["rollouts"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(rec["state"], "rolled_back", "{rec:#}");
    assert!(!bad.exists(), "the drop-in was moved aside");
    assert_eq!(stack.show(P, "ActiveState").unwrap(), "active");
    assert!(!stack.show(P, "ExecStart").unwrap().contains("--bogus-turbo"), "serving on its old command line");
    assert_ne!(stack.show(P, "InvocationID").unwrap(), p0);
    let full = record(&d, rec["id"].as_str().unwrap());
    let notes = full["notes"].to_string();
    assert!(notes.contains("moved") && notes.contains("50-turbo.conf") && notes.contains("passed every gate"), "the record says what was restored: {notes}");
    let (code, shown, _) = human(&d, &config, &["rollout", "show", rec["id"].as_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(shown.iter().any(|l| l.starts_with("state") && l.contains("rolled_back")), "{shown:?}");
    assert!(shown.iter().any(|l| l.contains("ready") && l.contains("failed")), "each step is listed: {shown:?}");
    assert!(shown.iter().any(|l| l.starts_with("note") && l.contains("50-turbo.conf")), "{shown:?}");
    back_in_router(&stack);
    // The same failing change again (config management puts it back): not rolled out twice.
    let bad = bad_flag_drop_in(&stack);
    let (code, out, err) = human(&d, &config, &["rollout", "apply", "--if-changed"]);
    assert_eq!(code, 0, "{out:?} {err}");
    assert!(out.last().unwrap().contains("quarantined"), "{out:?}");
    let (code, out, _) = human(&d, &config, &["rollout", "diff"]);
    assert_eq!(code, 0);
    assert!(out.iter().any(|l| l.contains("quarantined")), "{out:?}");
    assert!(bad.exists(), "left alone: an operator decides");
    let (_, st, _) = human(&d, &config, &["status"]);
    assert!(st.iter().any(|l| l.contains("change that failed")), "status shows the quarantine: {st:?}");
    // A plain restart does not load it either: the dry run and the real run refuse, naming the
    // drop-in, the quarantine and the flag that accepts it; nothing restarts.
    let p0 = stack.show(P, "InvocationID").unwrap();
    let (code, out, err) = human(&d, &config, &["restart", "--rolling", "--dry-run"]);
    assert_eq!(code, 2, "{out:?} {err}");
    let said = format!("{out:?} {err}");
    assert!(said.contains("changes_pending") && said.contains("50-turbo.conf") && said.contains("quarantined") && said.contains("--load-changes"), "{said}");
    let (code, out, err) = human(&d, &config, &["restart", "--rolling"]);
    assert_eq!(code, 2, "{out:?} {err}");
    let said = format!("{out:?} {err}");
    assert!(said.contains("changes_pending") && said.contains("quarantined") && said.contains("--load-changes"), "{said}");
    assert_eq!(stack.show(P, "InvocationID").unwrap(), p0, "the prefill was not restarted");
    assert_eq!(stack.show(P, "ActiveState").unwrap(), "active");
    assert_eq!(stack.show(D, "InvocationID").unwrap(), d0, "the decode was never touched");
}

#[test]
fn a_bad_drop_in_written_before_pdctld_ever_started_is_rolled_back_and_the_summary_says_so() {
    let (stack, config) = pdctl_tests::stack_with_config(&StackOptions::default());
    rollback_policy(&config);
    let bad = bad_flag_drop_in(&stack);
    // The dry run of a plain restart refuses it, naming the drop-in systemd has not loaded (as
    // `rollout diff` does); with --load-changes it says the real run would reload and load it.
    let dry = pdctl_run(&["restart", "--rolling", "--dry-run", "--json", "--config", &s(&config)], LIMIT, |_| {});
    assert_eq!(dry.code, 2, "{}", dry.stderr);
    assert_eq!(dry.summary["failed"]["cause_code"], "changes_pending", "{:#?}", dry.summary);
    assert!(dry.summary["failed"]["cause"].as_str().unwrap().contains("50-turbo.conf is not loaded by systemd"), "{:#?}", dry.summary);
    let dry = pdctl_run(&["restart", "--rolling", "--dry-run", "--load-changes", "--json", "--config", &s(&config)], LIMIT, |_| {});
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let pre = &dry.event(P, "preflight", "passed")["detail"];
    assert!(pre["drop_ins_not_loaded"].to_string().contains("50-turbo.conf") && pre["daemon_reload"] == true, "{pre}");
    let d = stack.start_pdctld().expect("pdctld starts");
    let (code, out, err) = human(&d, &config, &["rollout", "apply", "--if-changed"]);
    assert_eq!(code, 1, "{out:?} {err}");
    assert!(!bad.exists(), "moved aside although no revision was ever recorded before it");
    let last = out.last().unwrap();
    assert!(last.starts_with("pdctl: ↩ rolled back") && last.contains("next: pdctl rollout diff"), "the last line states the outcome and what to do: {last}");
    assert!(out.iter().any(|l| l.contains("moved") && l.contains("50-turbo.conf")), "what was restored is shown: {out:?}");
    assert_eq!(stack.show(P, "ActiveState").unwrap(), "active");
    back_in_router(&stack);
}

#[test]
fn records_that_cannot_be_written_are_reported_retried_and_consistent_after_a_restart() {
    let (stack, config, d) = stack_with_pdctld();
    let state = s(&d.state.join("rollouts"));
    let mut c = live_daemon(&d, &config, &["restart", "--rolling", "--json"]);
    c.wait_line(LIMIT, |e| is(e, P, "restart", "passed")).expect("the prefill restarted");
    let id = running_id(&d);
    // Read-only for pdctld only: a bind mount inside the sandbox's mount namespace.
    let mount = |args: &[&str]| {
        let o = stack.sandbox.command("mount").args(args).output().unwrap();
        assert!(o.status.success(), "mount {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    mount(&["--bind", &state, &state]);
    // A remount read-only is refused (EBUSY) while pdctld has a record file open for writing
    // (its atomic write's temporary file): tried again until it is not, at most 10 s.
    let read_only = || stack.sandbox.command("mount").args(["-o", "remount,bind,ro", &state]).output().is_ok_and(|o| o.status.success());
    assert!(pdctl_tests::until(Duration::from_secs(10), Duration::from_millis(20), read_only), "the state's rollouts/ became read-only");
    assert_eq!(c.finish(LIMIT), Some(0), "the rollout itself goes on: {:#?}", c.seen.last());
    let (_, st) = raw(&d.socket, "GET", "/v1/status", "");
    assert!(st["record_error"].is_string(), "status says records are not being saved: {st}");
    let (_, h) = raw(&d.socket, "GET", "/v1/rollouts", "");
    assert_eq!(h["rollouts"].as_array().unwrap().last().unwrap()["state"], "succeeded", "history tells the truth from memory: {h}");
    let (status, refused) = raw(&d.socket, "POST", "/v1/rollouts", r#"{"kind":"restart","units":[]}"#);
    assert_eq!((status, refused["cause_code"].as_str()), (503, Some("records_failing")), "{refused}");
    let m = http_get(&d.metrics_url).unwrap().1;
    assert!(m.contains("pdctl_records_failing 1"), "{m}");
    mount(&["-o", "remount,bind,rw", &state]);
    let t0 = Instant::now();
    while raw(&d.socket, "GET", "/v1/status", "").1["record_error"] != Value::Null {
        assert!(t0.elapsed() < Duration::from_secs(30), "the record is saved once the directory is writable again");
        std::thread::sleep(Duration::from_millis(200));
    }
    stack.sandbox.systemctl(&["restart", &d.unit]).unwrap();
    let rec = record(&d, &id);
    assert_eq!(rec["lifecycle"]["state"], "succeeded", "not `interrupted` after the restart: {rec:#}");
}

#[test]
fn a_corrupt_record_is_listed_not_dropped() {
    let (_stack, config, d) = stack_with_pdctld();
    std::fs::write(d.state.join("rollouts/r1000000000.json"), "{\"id\":\"r1").unwrap();
    let h = pdctl_daemon(&d, &config, &["rollout", "history", "--json"], LIMIT);
    assert_eq!(h.code, 0, "{}", h.stderr);
    let (_, hist) = raw(&d.socket, "GET", "/v1/rollouts", "");
    assert!(hist["corrupt"].as_array().unwrap().iter().any(|c| c["file"].as_str().unwrap().ends_with("r1000000000.json")), "{hist}");
    let (code, out, _) = human(&d, &config, &["rollout", "history"]);
    assert_eq!(code, 0);
    assert!(out.iter().any(|l| l.contains("corrupt") && l.contains("r1000000000.json")), "{out:?}");
}

#[test]
fn abort_summary_says_what_was_not_started_and_status_ends_quietly_on_a_closed_pipe() {
    let (stack, config, d) = stack_with_pdctld();
    let d0 = stack.show(D, "InvocationID").unwrap();
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let child = std::process::Command::new(&bin)
        .args(["restart", "--rolling", "--config", &s(&config), "--socket", &s(&d.socket)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Abort once the prefill has restarted.
    let t0 = Instant::now();
    let id = loop {
        assert!(t0.elapsed() < LIMIT, "the prefill restarts");
        let (_, h) = raw(&d.socket, "GET", "/v1/rollouts", "");
        if let Some(id) = h["running"].as_str() {
            let rec = record(&d, id);
            if rec["events"].as_array().unwrap().iter().any(|e| is(e, P, "restart", "passed")) {
                break id.to_string();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (status, _) = raw(&d.socket, "POST", &format!("/v1/rollouts/{id}/abort"), "");
    assert_eq!(status, 202);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(5));
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap();
    assert!(last.contains("aborted") && last.contains(&format!("not started: {D}")) && last.contains(&format!("verified {P}")), "{last}");
    assert!(!text.contains("all 1 unit(s) restarted and verified"), "an abort is not a success: {text}");
    assert_eq!(stack.show(D, "InvocationID").unwrap(), d0);
    // Its `next` runs as printed: the rest of the plan, by name.
    let (code, out) = run_next(last, &config, &d);
    assert_eq!(code, 0, "{last}\n{out}");
    assert_ne!(stack.show(D, "InvocationID").unwrap(), d0, "the rest was restarted: {out}");
    // `pdctl status | head -1`: no panic, no error on the closed pipe.
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{} status --config {} --socket {} | head -1", bin.display(), s(&config), s(&d.socket)))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1);
}

#[test]
fn each_bad_config_value_is_exit_2_naming_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("pdctl-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("config.d")).unwrap();
    let main = dir.join("pdctl.toml");
    let base = "[router]\nurl = \"http://127.0.0.1:30001\"\n[[worker]]\nunit = \"a.service\"\nrole = \"prefill\"\nurl = \"http://127.0.0.1:1\"\ngpus = \"0-3\"\n[[worker]]\nunit = \"b.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:2\"\ngpus = \"4-7\"\n";
    std::fs::write(&main, base).unwrap();
    let frag = dir.join("config.d/10-x.toml");
    for (text, line, key) in [
        ("[rollout]\nmin_healthy = \"0s\"\n", 2, "rollout.min_healthy"),
        ("[rollout]\nready_pattern = \"\"\n", 2, "rollout.ready_pattern"),
        ("[rollout]\nready_pattern = \"Uvicorn running\"\n", 2, "rollout.ready_pattern"),
        ("[router]\nurl = \"http://\"\n", 2, "router.url"),
        ("[router]\nurl = \"unix:/run/router.sock\"\n", 2, "router.url"),
    ] {
        std::fs::write(&frag, text).unwrap();
        let run = pdctl_run(&["restart", "--rolling", "--json", "--config", main.to_str().unwrap()], LIMIT, |_| {});
        assert_eq!(run.code, 2, "{text}: {}", run.stderr);
        assert!(run.stderr.contains(&format!("{}:{line}: {key}", frag.display())), "{text}: {}", run.stderr);
    }
    std::fs::remove_file(&frag).unwrap();
    std::fs::write(&main, base.replace("gpus = \"4-7\"", "gpus = \"3-7\"")).unwrap();
    let run = pdctl_run(&["restart", "--rolling", "--json", "--config", main.to_str().unwrap()], LIMIT, |_| {});
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains(&format!("{}:12: worker.gpus of b.service", main.display())), "{}", run.stderr);
    let _ = std::fs::remove_dir_all(dir);
}

/// A change refused in preflight is a refusal: even under `on_failure = "rollback"` it is left
/// where it is (never moved aside, nothing reloaded or restarted), and the output says so.
#[test]
fn a_change_refused_in_preflight_is_left_in_place_and_nothing_restarts() {
    let (stack, config, d) = stack_with_pdctld();
    rollback_policy(&config);
    let p0 = stack.show(P, "InvocationID").unwrap();
    // A drop-in that drops --enable-metrics while the metrics gate is required.
    let text = std::fs::read_to_string(stack.sandbox.unit_dir().join(P)).unwrap();
    let exec = text.lines().find(|l| l.starts_with("ExecStart=")).unwrap().replace(" --enable-metrics", "");
    let dir = stack.sandbox.unit_dir().join(format!("{P}.d"));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("60-no-metrics.conf");
    std::fs::write(&bad, format!("[Service]\nExecStart=\n{exec}\n")).unwrap();
    let (code, out, err) = human(&d, &config, &["rollout", "apply", "--if-changed"]);
    assert_eq!(code, 1, "{out:?} {err}");
    assert!(bad.exists(), "the refused drop-in is where the operator put it");
    assert!(out.iter().any(|l| l.contains("moved no file")), "{out:?}");
    assert!(!out.last().unwrap().contains("rolled back"), "{out:?}");
    assert_eq!(stack.show(P, "InvocationID").unwrap(), p0, "nothing was restarted");
}

/// A drain left behind when the gateway went away mid-rollout is cleared, and written in the
/// rollout's record, once the gateway lists the worker admitted again (here: it came back with its
/// configured workers): `status` and `pdctl_drained_workers` stop saying the worker is out, and
/// nothing is restarted for it.
#[test]
fn a_drain_the_gateway_undid_is_reconciled_without_a_restart() {
    let (stack, config, d) = stack_with_pdctld();
    std::fs::write(config.parent().unwrap().join("config.d/10-short.toml"), "[rollout]\nrouter_timeout = \"5s\"\n").unwrap();
    let mut c = live_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    // The gateway goes away right after the prefill's drain: pdctl cannot re-admit it.
    c.wait_line(LIMIT, |e| is(e, P, "drain", "passed")).expect("the prefill is drained");
    stack.sandbox.systemctl(&["stop", "sglang-router.service"]).unwrap();
    let code = c.finish(LIMIT);
    assert_ne!(code, Some(0), "the rollout cannot succeed without its gateway: {:#?}", c.seen.last());
    let id = c.seen.last().and_then(|l| l["id"].as_str()).expect("the summary names the rollout").to_string();
    let drained = || http_get(&d.metrics_url).map(|(_, m)| m.lines().any(|l| l == "pdctl_drained_workers 1")).unwrap_or(false);
    assert!(drained(), "the drain is still pdctl's to undo while the gateway is down");
    let p1 = stack.show(P, "InvocationID").unwrap();
    // The gateway comes back with its configured workers, the prefill among them.
    stack.sandbox.systemctl(&["start", "sglang-router.service"]).unwrap();
    assert!(pdctl_tests::until(Duration::from_secs(60), Duration::from_millis(200), || in_router(&stack, &stack.prefill.url)), "the gateway lists the prefill");
    assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || !drained()), "pdctld clears the drain within its idle check");
    let (_, st, _) = human(&d, &config, &["status"]);
    assert!(!st.iter().any(|l| l.contains("by pdctl's hand")), "{st:?}");
    let rec = pdctl_tests::record(&d.socket, &id);
    assert!(rec["notes"].to_string().contains("reconciled: the gateway lists"), "{rec:#}");
    assert_eq!(stack.show(P, "InvocationID").unwrap(), p1, "nothing was restarted for it");
}

/// With `on_failure = "rollback"`, a refusal before any worker is restarted touches nothing: a
/// plain restart refused for the unloaded drop-in (`changes_pending`) and a config rollout refused
/// for the only worker of its role (`only_worker_of_role`) leave every file where it was, reload
/// nothing, restart nothing, and the record is not `rolled_back`.
#[test]
fn a_refusal_under_the_rollback_policy_moves_no_file_and_restarts_nothing() {
    let (stack, config, d) = stack_with_pdctld();
    rollback_policy(&config);
    let (p0, d0) = (stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap());
    let bad = bad_flag_drop_in(&stack);
    let (code, out, err) = human(&d, &config, &["restart", "--rolling"]);
    assert_eq!(code, 2, "{out:?} {err}");
    assert!(format!("{out:?} {err}").contains("changes_pending"), "{out:?} {err}");
    assert!(bad.exists(), "the drop-in was left where it was: {out:?}");
    // A valid change, refused: the prefill is the only worker of its role.
    std::fs::remove_file(&bad).unwrap();
    let good = stack.drop_in(P, "60-env", "[Service]\nEnvironment=SGLANG_SIM_TOKENS_PER_SEC=210\n").unwrap();
    std::fs::write(config.parent().unwrap().join("config.d/20-no-outage.toml"), "[rollout]\nallow_outage = false\n").unwrap();
    std::fs::write(d.config.parent().unwrap().join("config.d/20-no-outage.toml"), "[rollout]\nallow_outage = false\n").unwrap();
    let (code, out, err) = human(&d, &config, &["rollout", "apply"]);
    assert_eq!(code, 2, "{out:?} {err}");
    assert!(format!("{out:?} {err}").contains("only_worker_of_role"), "{out:?} {err}");
    assert!(good.exists(), "a valid drop-in was left where it was: {out:?}");
    assert!(!out.iter().any(|l| l.contains(" aside to ") || l.contains("rolling back") || l.contains("↩ rolled back")), "{out:?}");
    assert!(out.iter().any(|l| l.contains("moved no file")), "the record says the policy did nothing: {out:?}");
    let (_, h) = raw(&d.socket, "GET", "/v1/rollouts", "");
    assert!(h["rollouts"].as_array().unwrap().iter().all(|r| r["state"] != "rolled_back"), "{h:#}");
    assert_eq!((stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap()), (p0, d0), "nothing restarted");
}

/// With the decode stopped, a restart of the prefill could not pass its pair gate: the dry run
/// and the real run refuse it in preflight (`peer_role_down`, naming the stopped decode), nothing
/// is restarted — not even by the rollback policy, which has nothing to restore.
#[test]
fn a_stopped_peer_fails_preflight_and_nothing_restarts() {
    let (stack, config, d) = stack_with_pdctld();
    rollback_policy(&config);
    stack.sandbox.systemctl(&["stop", D]).unwrap();
    let p0 = stack.show(P, "InvocationID").unwrap();
    for args in [&["restart", "--rolling", "--dry-run", "--json"][..], &["restart", "--rolling", "--json"]] {
        let r = pdctl_tests::pdctl_daemon(&d, &config, args, LIMIT);
        assert_ne!(r.code, 0, "{args:?}: {:#}", r.summary);
        let f = &r.summary["failed"];
        assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("preflight"), Some("peer_role_down")), "{args:?}: {f:#}");
        assert!(f["cause"].as_str().is_some_and(|c| c.contains(D) && c.contains("nothing touched")), "{f:#}");
        assert!(!r.touched(P) && !r.touched(D), "{args:?}: a refusal touches nothing");
        assert!(!r.events.iter().any(|e| e["step"] == "rollback" && e["status"] == "passed"), "nothing rolled back: {:#?}", r.events);
    }
    assert_eq!(stack.show(P, "InvocationID").unwrap(), p0, "the prefill was not restarted");
    assert_eq!(stack.show(D, "ActiveState").unwrap(), "inactive", "the decode was left as the operator left it");
    // As the sentence says: the decode brought back, the same restart passes its preflight.
    stack.sandbox.systemctl(&["start", D]).unwrap();
    assert!(
        pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || http_get(&format!("{}/health", stack.decode.url))
            .is_ok_and(|(s, _)| s == 200)),
        "the decode serves"
    );
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--dry-run", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
}

/// A dry run that passes names the command that does what it previewed, with the same flags: a
/// pending change previewed with --load-changes is rolled out by the `next` it prints, as
/// printed (it was `pdctl restart --rolling`, which then refused the change).
#[test]
fn a_dry_runs_next_keeps_its_flags_and_runs_as_printed() {
    let (stack, config, d) = stack_with_pdctld();
    stack.drop_in(D, "60-env", "[Service]\nEnvironment=SGLANG_SIM_TOKENS_PER_SEC=210\n").unwrap();
    let d0 = stack.show(D, "InvocationID").unwrap();
    let (code, out, err) = human(&d, &config, &["restart", "--rolling", "--unit", D, "--dry-run", "--load-changes"]);
    assert_eq!(code, 0, "{out:?} {err}");
    let last = out.last().unwrap();
    assert!(last.contains("✓ preflight passed") && last.contains(&format!("--unit {D}")) && last.contains("--load-changes"), "{last}");
    let (code, said) = run_next(last, &config, &d);
    assert_eq!(code, 0, "{said}");
    assert_ne!(stack.show(D, "InvocationID").unwrap(), d0, "it restarted the decode: {said}");
    assert!(stack.show(D, "Environment").unwrap().contains("SGLANG_SIM_TOKENS_PER_SEC=210"), "with the change");
}
