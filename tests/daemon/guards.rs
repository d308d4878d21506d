//! pdctld guards itself and its socket: a missing daemon is named with the command that starts it,
//! the shipped units are hardened, another config or a restart storm is refused, slow or idle
//! connections cannot freeze the control socket, a second pdctld on the same state exits, a
//! paused record that does not read still continues every worker, the socket's groups decide who
//! may act, and a forged process line cannot fail the ready gate.

use super::*;

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
