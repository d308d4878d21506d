//! pdctld as a unit of the sandbox's manager (Type=notify: its READY must reach systemd): rollouts
//! through the control socket, one at a time, detach and re-attach, SIGKILL mid-rollout →
//! interrupted → resume, abort, config rollouts through pdctl-rollout.service with rollback, its
//! metrics and its journald fields.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack};
use pdctl_tests::{pdctl_run, JsonRun, LivePdctl, RouterWatch};
use serde_json::Value;

#[path = "daemon/guards.rs"]
mod guards;

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
