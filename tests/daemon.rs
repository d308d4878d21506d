//! pdctld as a unit of the sandbox's manager (Type=notify: its READY must reach systemd): rollouts
//! through the control socket, one at a time, detach and re-attach, SIGKILL mid-rollout →
//! interrupted → resume, abort, config rollouts through pdctl-rollout.service with rollback, its
//! metrics and its journald fields.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack};
use pdctl_tests::{pdctl_run, JsonRun, LivePdctl, RouterWatch};
use serde_json::Value;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn up() -> (Stack, PathBuf, Pdctld) {
    pdctl_tests::stack_with_pdctld()
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn cli(d: &Pdctld, config: &Path, args: &[&str]) -> JsonRun {
    pdctl_tests::pdctl_daemon(d, config, args, LIMIT)
}

fn live(d: &Pdctld, config: &Path, args: &[&str]) -> LivePdctl {
    pdctl_tests::live_daemon(d, config, args)
}

fn history(d: &Pdctld, config: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let o = std::process::Command::new(bin).args(["rollout", "history", "--json", "--config", &s(config), "--socket", &s(&d.socket)]).output().unwrap();
    assert!(o.status.success(), "history: {}", String::from_utf8_lossy(&o.stderr));
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        out.push(serde_json::from_str(l).unwrap());
    }
    out
}

fn inv(stack: &Stack, unit: &str) -> String {
    stack.show(unit, "InvocationID").unwrap()
}

fn is(e: &Value, unit: &str, step: &str, status: &str) -> bool {
    e["unit"] == unit && e["step"] == step && e["status"] == status
}

#[test]
fn one_rollout_at_a_time_with_status_metrics_and_journald_fields() {
    let (stack, config, d) = up();
    assert_eq!(stack.show(&d.unit, "ActiveState").unwrap(), "active", "Type=notify: active only after READY=1");
    assert_eq!(stack.show(&d.unit, "StatusText").unwrap(), "idle");
    let mut first = live(&d, &config, &["restart", "--rolling", "--json"]);
    first.wait_line(LIMIT, |e| is(e, P, "restart", "started")).expect("the first rollout runs");
    let id = history(&d, &config).into_iter().find(|r| r["state"] == "running").expect("a running record")["id"].as_str().unwrap().to_string();
    assert!(stack.show(&d.unit, "StatusText").unwrap().contains(&id), "STATUS= names the rollout");
    let second = cli(&d, &config, &["restart", "--rolling", "--json"]);
    assert_eq!(second.code, 4, "busy: {}", second.stderr);
    assert!(second.stderr.contains(&format!("another rollout is running: {id}")), "{}", second.stderr);
    assert_eq!(first.finish(LIMIT), Some(0), "{:#?}", first.seen);
    assert_eq!(first.seen.last().unwrap()["result"], "succeeded");

    let text = http_get(&d.metrics_url);
    assert!(text.contains("pdctl_rollouts_total{result=\"succeeded\"} 1"), "{text}");
    assert!(text.contains("pdctl_units_restarted_total 2"), "{text}");
    assert!(text.contains("pdctl_step_duration_seconds_count{step=\"ready\"} 2"), "{text}");
    assert!(text.contains("pdctl_last_success_timestamp_seconds"), "{text}");
    assert!(text.contains("pdctl_rollout_running 0"), "{text}");

    let j = stack.sandbox.journalctl(&["-o", "json", &format!("PDCTL_ROLLOUT_ID={id}")]).unwrap();
    let entries: Vec<Value> = String::from_utf8_lossy(&j.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(
        entries.iter().any(|e| e["PDCTL_UNIT"] == P && e["PDCTL_STEP"] == "ready"),
        "journalctl PDCTL_ROLLOUT_ID={id} shows its steps: {} entries",
        entries.len()
    );
    // Each entry reads as a sentence (unit, step, status, duration), and none carries UNIT=,
    // which `journalctl -u` and a failure's last lines would match.
    let ready = entries
        .iter()
        .find(|e| e["PDCTL_UNIT"] == P && e["PDCTL_STEP"] == "ready" && e["MESSAGE"].as_str().is_some_and(|m| m.contains("passed")))
        .expect("the ready step passed");
    assert!(ready["MESSAGE"].as_str().unwrap().starts_with(&format!("{P}: ready passed in ")), "{ready}");
    assert!(entries.iter().all(|e| e.get("UNIT").is_none()), "pdctld's entries must not carry UNIT=");
}

fn http_get(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async { pdctl_tests::http().get(url).send().await.unwrap().text().await.unwrap() })
}

/// Whether `url` answers 200 within 3 s (never hangs, never panics).
fn http_get_ok(url: &str) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(3), pdctl_tests::http().get(url).send()).await.is_ok_and(|r| r.is_ok_and(|r| r.status().is_success()))
    })
}

#[test]
fn ctrl_c_detaches_and_watch_replays_from_the_beginning() {
    let (stack, config, d) = up();
    let d0 = inv(&stack, D);
    let mut cli1 = live(&d, &config, &["restart", "--rolling", "--json"]);
    cli1.wait_line(LIMIT, |e| is(e, P, "restart", "passed")).expect("prefill restarted");
    cli1.signal("INT");
    assert_eq!(cli1.finish(Duration::from_secs(10)), Some(130), "Ctrl-C detaches (130, as a shell reports SIGINT)");
    let id = history(&d, &config).into_iter().last().unwrap()["id"].as_str().unwrap().to_string();
    let w = cli(&d, &config, &["rollout", "watch", &id, "--json"]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    assert!(is(&w.events[0], P, "preflight", "started"), "replayed from the first event: {:?}", w.events[0]);
    assert_eq!(w.summary["result"], "succeeded", "the rollout went on without the CLI");
    assert_ne!(inv(&stack, D), d0);
}

#[test]
fn sigkill_mid_rollout_is_reported_interrupted_then_resumed() {
    let (stack, config, d) = up();
    let d0 = inv(&stack, D);
    let watch = RouterWatch::start(&stack);
    let mut cli1 = live(&d, &config, &["restart", "--rolling", "--json"]);
    cli1.wait_line(LIMIT, |e| is(e, P, "restart", "passed")).expect("prefill restarted");
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    // The CLI that followed it says the rollout is interrupted, its id and how to go on (exit 3).
    assert_eq!(cli1.finish(Duration::from_secs(20)), Some(3));
    let last = cli1.seen.last().cloned().unwrap_or_default();
    assert_eq!(last["result"], "interrupted", "{last}");
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    let rec = history(&d, &config).into_iter().last().unwrap();
    assert_eq!(last["id"], rec["id"], "{last}");
    assert!(last["next"].as_str().is_some_and(|n| n.contains(&format!("pdctl rollout resume {}", rec["id"].as_str().unwrap()))), "{last}");
    assert_eq!(rec["state"], "interrupted", "{rec:#}");
    assert_eq!(rec["interrupted"]["unit"], P, "{rec:#}");
    assert!(rec["interrupted"]["step"].is_string());
    assert_eq!(rec["interrupted"]["units"].as_array().unwrap().len(), 2, "each unit's state is reported");
    assert_eq!(inv(&stack, D), d0, "nothing resumed by itself");
    let id = rec["id"].as_str().unwrap();
    // Interrupted and not yet resumed: only the prefill was ever out of the router.
    watch.finish().assert_down(1, 0);
    // pdctld first re-admits the prefill it had drained (no rollout starts meanwhile: exit 4).
    let t0 = std::time::Instant::now();
    let r = loop {
        let r = cli(&d, &config, &["rollout", "resume", id, "--json"]);
        if r.code != 4 || t0.elapsed() > Duration::from_secs(60) {
            break r;
        }
        assert!(r.stderr.contains("re-admitting"), "{}", r.stderr);
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    assert!(r.index(P, "health", "passed").is_some(), "the interrupted unit is re-verified first");
    // Every gate it had not passed, its pairs included (it stopped right after its restart).
    assert!(
        r.index(P, "pair", "passed").is_some_and(|i| r.index(P, "health", "passed").is_some_and(|h| h < i)),
        "the pair gate is re-verified: {:#?}",
        r.events
    );
    assert!(r.index(D, "soak", "passed").is_some());
    assert_ne!(inv(&stack, D), d0, "the rest of the plan ran");
    let last = history(&d, &config).into_iter().last().unwrap();
    assert_eq!(last["kind"], "resume");
    // An id is resumed once: the second resume would restart the decode again.
    let d1 = inv(&stack, D);
    let again = cli(&d, &config, &["rollout", "resume", id, "--json"]);
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert!(again.stderr.contains("only once"), "{}", again.stderr);
    assert_eq!(inv(&stack, D), d1);
}

#[test]
fn abort_stops_after_the_current_unit_is_verified() {
    let (stack, config, d) = up();
    let d0 = inv(&stack, D);
    let mut cli1 = live(&d, &config, &["restart", "--rolling", "--json"]);
    cli1.wait_line(LIMIT, |e| is(e, P, "restart", "passed")).expect("prefill restarted");
    let id = history(&d, &config).into_iter().last().unwrap()["id"].as_str().unwrap().to_string();
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let a = std::process::Command::new(bin).args(["rollout", "abort", &id, "--socket", &s(&d.socket)]).output().unwrap();
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(String::from_utf8_lossy(&a.stdout).contains("aborting after the current unit"));
    assert_eq!(cli1.finish(LIMIT), Some(5), "exit 5: aborted");
    assert_eq!(cli1.seen.last().unwrap()["result"], "aborted");
    assert!(cli1.seen.iter().any(|e| is(e, P, "soak", "passed")), "the unit in progress was verified");
    assert_eq!(inv(&stack, D), d0, "decode untouched");
}

fn exec_start_line(stack: &Stack, unit: &str) -> String {
    let text = std::fs::read_to_string(stack.sandbox.unit_dir().join(unit)).unwrap();
    text.lines().find(|l| l.starts_with("ExecStart=")).unwrap().to_string()
}

fn raw_drop_in(stack: &Stack, unit: &str, name: &str, body: &str) -> PathBuf {
    let dir = stack.sandbox.unit_dir().join(format!("{unit}.d"));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.conf"));
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn bad_flag_applied_by_the_timer_service_is_rolled_back() {
    let (stack, config, d) = up();
    std::fs::write(config.parent().unwrap().join("config.d/10-rollback.toml"), "[rollout]\non_failure = \"rollback\"\n").unwrap();
    let base = cli(&d, &config, &["rollout", "apply", "--all", "--json"]);
    assert_eq!(base.code, 0, "baseline: {:#?}", base.summary);
    let d0 = inv(&stack, D);
    // A bad flag rolled out in a drop-in (not reloaded: pdctl finds it itself).
    let bad = raw_drop_in(&stack, P, "50-bad-flag", &format!("[Service]\nExecStart=\n{} --bogus-flag\n", exec_start_line(&stack, P)));
    let diff = std::process::Command::new(pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap())
        .args(["rollout", "diff", "--json", "--socket", &s(&d.socket)])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&diff.stdout);
    assert!(diff.status.success() && out.contains("50-bad-flag.conf is new"), "{out}");
    let v: Value = serde_json::from_str(out.trim()).expect("one Diff object");
    assert!(v["workers"].as_array().is_some_and(|w| w.len() == 2), "{v:#}");
    // pdctl-rollout.service, as the timer would start it.
    let pdctl = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    stack.sandbox.write_unit("pdctl-rollout.service", &format!("[Unit]\nRequires=pdctld.service\nAfter=pdctld.service\n[Service]\nType=oneshot\nExecStart={} rollout apply --if-changed --config {} --socket {}\n", pdctl.display(), s(&d.config), s(&d.socket))).unwrap();
    stack.sandbox.daemon_reload().unwrap();
    let watch = RouterWatch::start(&stack);
    let r = stack.sandbox.systemctl(&["start", "pdctl-rollout.service"]);
    let seen = watch.finish();
    assert!(r.is_err(), "the oneshot fails (exit 1): the change did not go through");
    seen.assert_down(1, 0);
    let rec = history(&d, &config).into_iter().last().unwrap();
    assert_eq!(rec["kind"], "apply");
    assert_eq!(rec["state"], "rolled_back", "{rec:#}");
    assert_eq!(rec["failed"]["unit"], P);
    // The failed start's own last words, not the rollback's start that followed it.
    assert_eq!(rec["failed"]["cause_code"], "fatal_line", "{rec:#}");
    let last = rec["failed"]["last_lines"].to_string();
    assert!(last.contains("unrecognized arguments: --bogus-flag"), "{last}");
    // The failure's note that its drain is kept is no longer so once the rollback re-admitted it.
    let (_, full) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{}", rec["id"].as_str().unwrap()), "");
    let notes = full["notes"].to_string();
    assert!(!notes.contains("keeps its drain on record") && notes.contains("re-admitted it (its drain is cleared)"), "{notes}");
    assert!(!bad.exists(), "the bad drop-in was moved aside");
    assert_eq!(stack.show(P, "ActiveState").unwrap(), "active");
    assert!(!stack.show(P, "ExecStart").unwrap().contains("--bogus-flag"), "runs the old config");
    let m = http_get(&d.metrics_url);
    assert!(m.contains("pdctl_rollouts_total{result=\"rolled_back\"} 1"), "{m}");
    assert!(m.contains("pdctl_gate_failures_total{step=\"ready\",cause="), "{m}");
    assert_eq!(inv(&stack, D), d0, "decode untouched");
}

#[test]
fn a_good_change_is_rolled_out_to_the_stale_worker_only_and_recorded() {
    let (stack, config, d) = up();
    let base = cli(&d, &config, &["rollout", "apply", "--all", "--json"]);
    assert_eq!(base.code, 0, "baseline: {:#?}", base.summary);
    let p0 = inv(&stack, P);
    raw_drop_in(&stack, D, "60-kv", "[Service]\nEnvironment=SGLANG_SIM_MAX_TOTAL_TOKENS=100000\n");
    let r = cli(&d, &config, &["rollout", "apply", "--if-changed", "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    assert_eq!(r.summary["units"], serde_json::json!([D]));
    assert!(!r.touched(P));
    assert_eq!(inv(&stack, P), p0);
    let m = &r.event(D, "metrics", "passed")["detail"];
    assert_eq!(m["max_total_tokens"], 100000.0, "the new config is live");
    let again = cli(&d, &config, &["rollout", "apply", "--if-changed", "--json"]);
    assert_eq!(again.code, 0);
    assert_eq!(again.summary["units"], serde_json::json!([]), "recorded: nothing stale any more");
    // Nothing stale, with or without --if-changed: no record of a rollout that did not happen.
    let before = history(&d, &config).len();
    let plain = cli(&d, &config, &["rollout", "apply", "--json"]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    assert_eq!(history(&d, &config).len(), before, "no empty record");
    // `rollout show` of the rollout that did happen: where it ended is the result line (no
    // stale "at"), every passed step has a detail, and what clients saw is there.
    let id = r.summary["id"].as_str().unwrap();
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let o = std::process::Command::new(bin).args(["rollout", "show", id, "--socket", &s(&d.socket)]).output().unwrap();
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(!shown.lines().any(|l| l.starts_with("at ")), "{shown}");
    assert!(shown.lines().any(|l| l.starts_with("availability")), "{shown}");
    let ready = shown.lines().find(|l| l.contains(" ready ") && l.contains("passed")).unwrap_or_else(|| panic!("{shown}"));
    assert!(ready.contains("pid="), "the DETAIL column says what the step saw: {ready}");
}

#[test]
fn missing_daemon_is_exit_3_with_the_command_to_start_it() {
    let dir = std::env::temp_dir().join(format!("pdctl-nodaemon-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("pdctl.toml");
    std::fs::write(&cfg, "[[worker]]\nunit = \"a.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    let r = pdctl_run(&["restart", "--rolling", "--json", "--config", &s(&cfg), "--socket", &s(&dir.join("none.sock"))], LIMIT, |_| {});
    assert_eq!(r.code, 3);
    assert!(r.stderr.contains("systemctl start pdctld"), "{}", r.stderr);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn shipped_units_are_valid_and_pdctld_is_hardened() {
    let units = pdctl_tests::pdctl_sandbox::repo_root().join("units");
    // pdctld (root, restarts units) and the timer's client (root, only talks to pdctld).
    for (unit, most) in [("pdctld.service", 3.0), ("pdctl-rollout.service", 2.0)] {
        let out = std::process::Command::new("systemd-analyze").args(["security", "--offline=true"]).arg(units.join(unit)).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.contains("Overall exposure level")).unwrap_or_else(|| panic!("{text}"));
        let level: f64 = line.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        eprintln!("systemd-analyze security {unit}: {line}");
        assert!(level <= most, "{unit}: exposure {level} > {most}: {line}");
    }
    for u in ["pdctld.service", "pdctl-rollout.service", "pdctl-rollout.timer", "sglang-prefill.service", "sglang-decode.service"] {
        let o = std::process::Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(units.join(u)).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let bad: Vec<&str> = err.lines().filter(|l| l.contains("Unknown") || l.contains("Invalid") || l.contains("Failed to parse")).collect();
        assert!(bad.is_empty(), "{u}: {bad:?}");
    }
}

/// The CLI plans with the config it is given; pdctld rolls out its own. When they differ every
/// verb that acts is refused (exit 2, both paths named), never run on pdctld's silently — a
/// weights rollout would otherwise pause every worker; an invalid
/// `--config` is a config error for `rollout diff` too.
#[test]
fn a_config_other_than_pdctlds_is_refused_not_run_silently() {
    let (stack, config, d) = up();
    let (p0, d0) = (inv(&stack, P), inv(&stack, D));
    let run = |cfg: &Path, args: &[&str]| {
        let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
        let o = std::process::Command::new(bin).args(args).args(["--config", &s(cfg), "--socket", &s(&d.socket)]).output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let other_dir = config.parent().unwrap().join("other");
    std::fs::create_dir_all(&other_dir).unwrap();
    let other = other_dir.join("pdctl.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    // The same but for one setting (a comment or the bus address would not count).
    std::fs::write(&other, text.replace("min_healthy = \"3s\"", "min_healthy = \"4s\"")).unwrap();
    assert_ne!(std::fs::read_to_string(&other).unwrap(), text);
    // Every command that asks pdctld to act: weights, revert and resume too (the ids need not
    // exist: the config is checked first).
    let verbs: [&[&str]; 6] = [
        &["restart", "--rolling"],
        &["rollout", "apply"],
        &["rollout", "diff"],
        &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127"],
        &["rollout", "revert", "20261203-000000-aaaa"],
        &["rollout", "resume", "20261203-000000-aaaa"],
    ];
    for args in verbs {
        let (code, out, err) = run(&other, args);
        assert_eq!(code, Some(2), "{args:?}: {out} {err}");
        let theirs = config.parent().unwrap().join("inside.toml");
        assert!(err.contains(&s(&other)) && err.contains(&s(&theirs)) && err.contains("not the one pdctld runs with"), "{args:?}: {err}");
    }
    assert_eq!((inv(&stack, P), inv(&stack, D)), (p0, d0), "nothing restarted");
    let bad = other_dir.join("bad.toml");
    std::fs::write(&bad, "[rollout]\nbogus = 1\n").unwrap();
    let (code, _, err) = run(&bad, &["rollout", "diff"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bogus") && err.contains("bad.toml"), "{err}");
    let (code, _, err) = run(&config, &["rollout", "diff"]);
    assert_eq!(code, Some(0), "pdctld's own config: {err}");
}

/// A decode that crashes after every start, brought back each time by systemd's `Restart=`:
/// pdctld counts the restarts it did not make (`pdctl_self_restarts_total`), and once there are
/// more than the storm rule allows (5 within 10 min on a single host) it refuses a new rollout
/// with `restart_storm` (exit 4) naming the unit, touching nothing.
#[test]
fn a_restart_storm_refuses_a_new_rollout_with_exit_4_naming_the_unit() {
    let (stack, config, d) = up();
    let p0 = inv(&stack, P);
    stack
        .drop_in(
            D,
            "50-crash-loop",
            "[Unit]\nStartLimitIntervalSec=0\n[Service]\nEnvironment=SGLANG_SIM_CRASH_AFTER_READY=0.2\nRestart=always\nRestartSec=100ms\n",
        )
        .unwrap();
    // The drop-in takes effect at the decode's next start (the first one is the operator's,
    // outside any rollout: it counts too).
    stack.sandbox.systemctl(&["restart", D]).unwrap();
    let stormy =
        pdctl_tests::until(Duration::from_secs(90), Duration::from_millis(500), || http_get(&d.metrics_url).lines().any(|l| l == "pdctl_restart_storm 1"));
    let m = http_get(&d.metrics_url);
    assert!(stormy, "pdctld saw the storm: {m}");
    let restarts: f64 =
        m.lines().filter(|l| l.starts_with("pdctl_self_restarts_total{") && l.contains(D)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    assert!(restarts > 5.0, "more than 5 self-restarts counted: {m}");
    let r = cli(&d, &config, &["restart", "--rolling", "--json"]);
    assert_eq!(r.code, 4, "refused like a busy host: {:#?} {}", r.summary, r.stderr);
    let text = format!("{} {}", r.summary, r.stderr);
    assert!(text.contains("restart storm") && text.contains(&format!("{D} ×")), "the cause names the unit: {text}");
    assert_eq!(inv(&stack, P), p0, "nothing was touched");
}

/// What `show` and `watch` say when there is nothing to show: with `--json` the one line on stdout
/// is the `ApiError` (as a refused start's is), its exit code the one the process exits with; a
/// `--socket` that is a regular file is named as the wrong path, not as a stopped pdctld.
#[test]
fn show_and_watch_errors_are_one_json_line_and_a_wrong_socket_is_named() {
    let (_stack, config, d) = up();
    let pdctl = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let run = |socket: &Path, args: &[&str]| {
        let out = std::process::Command::new(&pdctl).args(args).arg("--config").arg(&config).arg("--socket").arg(socket).output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    for verb in ["show", "watch"] {
        let (code, out, err) = run(&d.socket, &["rollout", verb, "r1764500000", "--json"]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{verb}: one line: {out:?} {err}");
        let v: Value = serde_json::from_str(lines[0]).expect("JSON");
        assert_eq!(v["cause_code"], "no_such_rollout", "{verb}: {v:#}");
        assert_eq!(v["exit_code"].as_i64(), Some(i64::from(code)), "{verb}: {v:#}");
        assert!(err.contains("no rollout r1764500000"), "{verb}: {err}");
    }
    let (code, out, err) = run(Path::new("/etc/passwd"), &["rollout", "show", "r1764500000", "--json"]);
    let v: Value = serde_json::from_str(out.trim()).expect("one JSON line");
    assert_eq!((v["cause_code"].as_str(), v["exit_code"].as_i64()), (Some("pdctld_unreachable"), Some(i64::from(code))), "{v:#}");
    assert!(err.contains("/etc/passwd is a regular file, not a socket") && !err.contains("not running"), "{err}");
}

/// `GET /v1/ping` through the control socket within `limit`: whether it answered 200 (never hangs).
fn pings(socket: &Path, limit: Duration) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut c) = std::os::unix::net::UnixStream::connect(socket) else { return false };
    let _ = c.set_read_timeout(Some(limit));
    let _ = c.set_write_timeout(Some(limit));
    if c.write_all(b"GET /v1/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    c.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// Nobody on the host freezes pdctld through its metrics port or with slow requests. pdctld runs
/// with a 256-descriptor limit (small enough to reach): 400 idle connections to the metrics port
/// (before: the metrics listener accepted without a cap or a timeout, ran out of descriptors, and
/// the control socket stopped accepting), then 260 requests on the control socket that send their
/// head and one byte of their body (before: each held a slot for ever, and 256 held them all).
/// The control socket answers throughout or within the body timeout, the metrics endpoint once
/// its idle connections timed out, and pdctld is still the same process (its watchdog, which now
/// pings through the socket itself, was fed).
#[test]
fn idle_metrics_connections_and_slow_bodies_do_not_freeze_the_control_socket() {
    let (stack, _config, d) = up();
    stack.drop_in("pdctld.service", "50-fds", "[Service]\nLimitNOFILE=256\n").unwrap();
    stack.sandbox.systemctl(&["restart", "pdctld.service"]).unwrap();
    assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pings(&d.socket, Duration::from_secs(2))), "pdctld is back");
    let pid = stack.show("pdctld.service", "MainPID").unwrap();
    let addr = d.metrics_url.trim_start_matches("http://").trim_end_matches("/metrics").to_string();
    let idle: Vec<std::net::TcpStream> = (0..400).filter_map(|_| std::net::TcpStream::connect(&addr).ok()).collect();
    assert!(idle.len() >= 300, "the idle connections were made: {}", idle.len());
    for i in 0..3 {
        assert!(pings(&d.socket, Duration::from_secs(5)), "ping {i} while {} idle metrics connections are held", idle.len());
    }
    let slow: Vec<std::os::unix::net::UnixStream> = (0..260)
        .filter_map(|_| {
            use std::io::Write as _;
            let mut c = std::os::unix::net::UnixStream::connect(&d.socket).ok()?;
            c.write_all(b"POST /v1/rollouts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{").ok()?;
            Some(c)
        })
        .collect();
    assert!(!slow.is_empty(), "slow requests were sent");
    assert!(
        pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(500), || pings(&d.socket, Duration::from_secs(2))),
        "the control socket answers again within the body timeout ({} slow requests held)",
        slow.len()
    );
    assert!(
        pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(500), || http_get_ok(&d.metrics_url)),
        "the metrics endpoint answers once its idle connections timed out"
    );
    assert_eq!(stack.show("pdctld.service", "MainPID").unwrap(), pid, "the same pdctld: not restarted, not crashed");
    drop((idle, slow));
}

/// One pdctld per state directory and per socket: a second one started on the same state
/// directory, or on its own state directory and the same socket (by hand, or a second unit),
/// exits at once naming the PID that holds it — before it touches the socket, which the first
/// keeps serving (before: the second unlinked the first's socket and bound its own).
#[test]
fn a_second_pdctld_on_the_same_state_directory_or_socket_exits_naming_the_first() {
    let (stack, config, d) = up();
    let pid = stack.show("pdctld.service", "MainPID").unwrap();
    let second = |state: &Path| {
        let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctld", "PDCTLD_BIN").unwrap();
        let mut second = std::process::Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(&d.socket)
            .arg("--state-dir")
            .arg(state)
            .arg("--metrics-listen")
            .arg("off")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(st) = second.try_wait().unwrap() {
                break Some(st);
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = second.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(second.stderr.as_mut().unwrap(), &mut err).unwrap();
        (status.expect("the second pdctld exits by itself").code(), err)
    };
    // The same state directory.
    let (code, err) = second(&d.state);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains(&format!("another pdctld (PID {pid}) already runs with the state directory")), "{err}");
    assert!(pings(&d.socket, Duration::from_secs(5)), "the first still serves its socket");
    // Its own state directory, the same socket: it used to unlink the first's socket and bind its
    // own (the first kept running, unreachable).
    let other = d.state.with_file_name("state-of-a-second-pdctld");
    let (code, err) = second(&other);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains(&format!("another pdctld (PID {pid}) already listens on {}", d.socket.display())), "{err}");
    assert!(pings(&d.socket, Duration::from_secs(5)), "the first still serves its socket");
    assert_eq!(stack.show("pdctld.service", "MainPID").unwrap(), pid);
    let _ = std::fs::remove_dir_all(&other);
}

/// A `paused.json` that does not read (a torn write, a disk error) cannot say which workers a
/// weights rollout paused: the starting pdctld continues every configured worker (a continue of
/// a worker that is not paused changes nothing) and then forgets it (before: it was ignored,
/// and a paused worker stayed paused).
#[test]
fn a_paused_record_that_does_not_read_continues_every_worker_at_start() {
    let (stack, _config, d) = up();
    let file = d.state.join("revisions").join("paused.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"[{\"unit\": \"sglang-dsv4-pre").unwrap();
    stack.sandbox.systemctl(&["restart", "pdctld.service"]).unwrap();
    assert!(
        pdctl_tests::until(Duration::from_secs(60), Duration::from_millis(200), || !file.exists()),
        "the unreadable record was acted on (every worker continued) and removed"
    );
    assert!(
        pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1["reconciling"]
            == false),
        "then rollouts may start again"
    );
    let log = stack
        .sandbox
        .journalctl(&["-u", "pdctld.service", "-o", "cat", "--no-pager"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(log.contains("does not read") && log.contains("every configured worker is continued"), "{log}");
}

/// Who may do what: with `--socket-group nogroup --operate-group root`, user nobody reaches the
/// socket and may read (rollout history) but not act — an abort is refused (`not_allowed`,
/// exit 3) before anything is looked up — while root may; the group membership is the kernel's
/// word (SO_PEERCRED), not the client's.
#[test]
fn a_member_of_the_socket_group_may_read_but_only_the_operate_group_may_act() {
    let dir = tempfile_dir("pdctld-operate");
    let (sock, state) = (dir.join("pdctl.sock"), dir.join("state"));
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctld", "PDCTLD_BIN").unwrap();
    let mut daemon = std::process::Command::new(bin)
        .args(["--config", &s(&dir.join("none.toml")), "--socket", &s(&sock), "--state-dir", &s(&state), "--metrics-listen", "off"])
        .args(["--socket-group", "nogroup", "--operate-group", "root"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(pdctl_tests::until(Duration::from_secs(20), Duration::from_millis(100), || pings(&sock, Duration::from_secs(2))), "pdctld serves");
    let pdctl = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let cli = |user: Option<&str>, args: &[&str]| {
        let mut c = std::process::Command::new("/usr/bin/setpriv");
        match user {
            Some(u) => c.args([&format!("--reuid={u}"), &format!("--regid={u}"), "--clear-groups"]),
            None => c.args(["--reuid=0"]),
        };
        let o = c.arg(&pdctl).args(args).arg("--socket").arg(&sock).output().unwrap();
        (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, err) = cli(Some("65534"), &["rollout", "history"]);
    assert_eq!(code, 0, "nobody reads: {err}");
    let (code, err) = cli(Some("65534"), &["rollout", "abort", "r1764500000"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("uid 65534 may read pdctld's state but not act") && err.contains("member of root"), "{err}");
    // Root may act: the abort is looked at (no such rollout), not refused.
    let (code, err) = cli(None, &["rollout", "abort", "r1764500000"]);
    assert!(code != 3 && err.contains("no rollout r1764500000"), "{code}: {err}");
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir(prefix: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A forged journal entry cannot fail a rollout: while the decode's new run starts, user nobody
/// writes systemd's "Main process exited" for it with `logger --journald` — its MESSAGE_ID, the
/// new run's InvocationID (world-readable) and the unit's name. Before: the ready gate took it for
/// the manager's word and failed the restart; now a manager's message counts only with a root
/// `_UID`, which journald sets itself, and the restart passes.
#[test]
fn a_forged_process_exited_entry_does_not_fail_the_ready_gate() {
    let opts = pdctl_tests::pdctl_sandbox::stack::StackOptions { decode_args: vec!["--sim-load-secs".into(), "4".into()], ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let before = inv(&stack, D);
    let forged = std::sync::atomic::AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            let ok = pdctl_tests::until(Duration::from_secs(60), Duration::from_millis(20), || {
                let now = stack.show(D, "InvocationID").unwrap_or_default();
                !now.is_empty() && now != before
            });
            if !ok {
                return;
            }
            let new = stack.show(D, "InvocationID").unwrap_or_default();
            let fields = format!(
                "MESSAGE_ID=98e322203f7a4ed290d09fe03c09fe15\nMESSAGE={D}: Main process exited, code=killed, status=9/KILL\nINVOCATION_ID={new}\nUSER_INVOCATION_ID={new}\nUNIT={D}\nUSER_UNIT={D}\n"
            );
            let mut c = stack.sandbox.command("/usr/bin/setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "logger", "--journald"]).stdin(std::process::Stdio::piped());
            if let Ok(mut child) = c.spawn() {
                if let Some(mut stdin) = child.stdin.take() {
                    let _ = std::io::Write::write_all(&mut stdin, fields.as_bytes());
                }
                if child.wait().is_ok_and(|st| st.success()) {
                    forged.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        cli(&d, &config, &["restart", "--rolling", "--unit", D, "--json"])
    });
    assert!(forged.load(std::sync::atomic::Ordering::SeqCst), "the forged entry was written while the decode started (else this test observes nothing)");
    let log = stack
        .sandbox
        .journalctl(&["USER_UNIT=sglang-dsv4-decode.service", "_UID=65534", "-o", "cat", "--no-pager"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(log.contains("Main process exited"), "the journal holds the forged entry: {log:?}");
    assert_eq!(r.code, 0, "{:#} {}", r.summary, r.stderr);
}
