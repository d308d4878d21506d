//! A failed start is reported with its own last words: the line that explains it (an argparse
//! rejection, as the journal has it just before systemd's exit line) is the failure's cause and
//! is among the failure's last log lines, under `on_failure = "rollback"` and a unit that systemd
//! restarts by itself (`Restart=on-failure`, as production units are written), where the lines of
//! later starts (the crash loop's, the rollback's) follow it in the journal. On the sandbox (real
//! systemd, journald, D-Bus) behind the real gateway.

use std::path::Path;
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::StackOptions;
use pdctl_tests::{pdctl_daemon, stack_with_pdctld_opts};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn an_unknown_flag_fails_as_its_own_fatal_line_and_shows_it_among_the_last_lines_under_restart_on_failure_and_rollback() {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { restart: "on-failure".into(), ..StackOptions::default() });
    std::fs::write(config.parent().unwrap().join("config.d/10-rollback.toml"), "[rollout]\non_failure = \"rollback\"\n").unwrap();
    let text = std::fs::read_to_string(stack.sandbox.unit_dir().join(P)).unwrap();
    let exec = text.lines().find(|l| l.starts_with("ExecStart=")).unwrap().to_string();
    // Each start says its number first: the failed start pdctl made is number 1; systemd starts
    // number 2 at once after it failed (no start limit; each later start waits 0.3 s after
    // saying its number, so that the loop does not keep the manager busy). Start 1 then waits
    // (10 s at most) for the forger below to be done, so that its lines lie within this run.
    let counter = stack.sandbox.dir().join("starts");
    let done = stack.sandbox.dir().join("forged");
    let pre = format!(
        "/bin/sh -c 'n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; echo \"start number $n\"; if [ $n -eq 1 ]; then i=0; while [ ! -e {f} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; else sleep 0.3; fi'",
        c = counter.display(),
        f = done.display()
    );
    stack
        .drop_in(
            P,
            "50-turbo",
            &format!("[Unit]\nStartLimitIntervalSec=0\n[Service]\nRestartSec=0\nExecStartPre={pre}\nExecStart=\n{exec} --enable-turbo-mode\n"),
        )
        .unwrap();
    // While the failed start runs (after its manager's "Starting", before its end: the window
    // its last words are read from), a local account writes lines "about" the unit (`logger
    // --journald UNIT=…`): not the unit's, so never among its last words.
    let forged = std::sync::atomic::AtomicBool::new(false);
    let r = std::thread::scope(|sc| {
        sc.spawn(|| forge_during_start_one(&stack, &counter, &done, &forged));
        pdctl_daemon(&d, &config, &["rollout", "apply", "--if-changed", "--json"], LIMIT)
    });
    assert!(forged.load(std::sync::atomic::Ordering::SeqCst), "the forged lines were written during the failed start: the test observed what it is about");
    // They are in the journal under the unit's name, as a reader trusting `USER_UNIT=` would take them.
    let by_name = stack.sandbox.journalctl(&[&format!("USER_UNIT={P}"), "--no-pager", "-o", "cat"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    assert!(by_name.is_ok_and(|j| j.contains("FORGED 24 by nobody")), "the forged lines are in the journal under the unit's name: the test observed");
    assert_eq!(r.summary["result"], "rolled_back", "{:#?} {}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!(f["unit"], P, "{f:#}");
    assert_eq!(f["step"], "ready", "{f:#}");
    assert_eq!(f["cause_code"], "fatal_line", "{f:#}");
    assert!(f["cause"].as_str().unwrap().contains("unrecognized arguments: --enable-turbo-mode"), "{f:#}");
    let last: Vec<&str> = f["last_lines"].as_array().unwrap().iter().filter_map(|l| l.as_str()).collect();
    assert!(last.iter().any(|l| l.contains("unrecognized arguments: --enable-turbo-mode")), "{last:#?}");
    assert!(last.iter().any(|l| l.contains("start number 1")) && !last.iter().any(|l| l.contains("start number 2")), "this start's lines only: {last:#?}");
    assert!(!last.iter().any(|l| l.contains("FORGED")), "another account's line is not the unit's: {last:#?}");
    let starts: u32 = std::fs::read_to_string(&counter).unwrap().trim().parse().unwrap();
    assert!(starts >= 2, "systemd started it again after the failure ({starts} starts): the test observed what it is about");
    // The worker was down after its failed start; the rollback re-admitted it: no step failed
    // but the start (the reconcile before it says it waits for the rollback).
    let failed: Vec<&serde_json::Value> = r.events.iter().filter(|e| e["status"] == "failed").collect();
    assert!(failed.len() == 1 && failed[0]["step"] == "ready", "{failed:#?}");
    assert!(r.events.iter().any(|e| e["step"] == "reconcile" && e["status"] == "skipped"), "{:#?}", r.events);
    // Why it restarted rather than loading in place names the flag, not new weights.
    let notes = r.summary.to_string() + &pdctl_tests::record(&d.socket, r.summary["id"].as_str().unwrap())["notes"].to_string();
    assert!(!notes.contains("new weights in only some PD workers") && notes.contains("not loaded in place: sglang-dsv4-prefill.service: "), "{notes}");
    // The record keeps the same failure; the human summary shows the line.
    let rec = pdctl_tests::record(&d.socket, r.summary["id"].as_str().unwrap());
    assert_eq!(rec["summary"]["failed"]["last_lines"], f["last_lines"], "{rec:#}");
    let shown = std::process::Command::new(pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap())
        .args(["rollout", "show", r.summary["id"].as_str().unwrap(), "--config", &s(&config), "--socket", &s(&d.socket)])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("unrecognized arguments: --enable-turbo-mode"), "{shown}");
    // When the only prefill left the gateway: deferred by its drain, taken out in its stop.
    assert!(shown.contains("taken out: deferred: the only prefill worker") && shown.contains("taken out at its server's first drain check"), "{shown}");
}

/// Once start number 1 runs, write lines "about" the prefill as nobody (`logger --journald
/// UNIT=…`), as many as a failure keeps; `forged` says one was written; `done` lets start 1 end.
fn forge_during_start_one(stack: &pdctl_tests::pdctl_sandbox::stack::Stack, counter: &Path, done: &Path, forged: &std::sync::atomic::AtomicBool) {
    let first = pdctl_tests::until(Duration::from_secs(60), Duration::from_millis(20), || std::fs::read_to_string(counter).is_ok_and(|n| n.trim() == "1"));
    if !first {
        return;
    }
    for i in 0..25 {
        let mut c = stack.sandbox.command("/usr/bin/setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "logger", "--journald"]).stdin(std::process::Stdio::piped());
        if let Ok(mut child) = c.spawn() {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = std::io::Write::write_all(&mut stdin, format!("MESSAGE=FORGED {i} by nobody\nUNIT={P}\nUSER_UNIT={P}\n").as_bytes());
            }
            if child.wait().is_ok_and(|st| st.success()) {
                forged.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
    std::fs::write(done, "").unwrap();
}

/// A halted rolling restart's `next` retries what the rollout has left — the failed unit and
/// those not started — with the flags it ran with, and runs as printed (it named the failed unit
/// alone and dropped `--allow-outage`, which this host's config does not give).
#[test]
fn a_halted_restarts_next_retries_what_is_left_with_its_flags_and_runs_as_printed() {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld();
    std::fs::write(config.parent().unwrap().join("config.d/41-no-outage.toml"), "[rollout]\nallow_outage = false\n").unwrap();
    let text = std::fs::read_to_string(stack.sandbox.unit_dir().join(P)).unwrap();
    let exec = text.lines().find(|l| l.starts_with("ExecStart=")).unwrap().to_string();
    stack.drop_in(P, "50-turbo", &format!("[Service]\nExecStart=\n{exec} --enable-turbo-mode\n")).unwrap();
    let (code, out) = text_of(&config, &d.socket, &["restart", "--rolling", "--allow-outage", "--load-changes"]);
    assert_eq!(code, 1, "{out}");
    let last = out.lines().last().unwrap_or_default().to_string();
    assert!(last.contains("halted") && last.contains(&format!("`pdctl restart --rolling --unit {P} --unit {D} --allow-outage --load-changes`")), "{out}");
    // Fixed, the command as printed (the text between the backticks after "then").
    std::fs::remove_file(stack.sandbox.unit_dir().join(format!("{P}.d/50-turbo.conf"))).unwrap();
    let cmd = last.split("then `").nth(1).and_then(|r| r.split('`').next()).unwrap_or_else(|| panic!("a command in {last}"));
    let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
    let (code, out) = text_of(&config, &d.socket, &args);
    assert_eq!(code, 0, "{cmd}\n{out}");
    assert!(out.lines().last().is_some_and(|l| l.contains("✓ succeeded") && l.contains("all 2 unit(s)")), "{out}");
}

fn text_of(config: &Path, socket: &Path, args: &[&str]) -> (i32, String) {
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let o = std::process::Command::new(bin).args(args).args(["--config", &s(config), "--socket", &s(socket)]).output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr));
    assert!(!out.is_empty(), "pdctl {args:?} printed nothing on stdout: {err}");
    (o.status.code().unwrap_or(-1), out)
}
