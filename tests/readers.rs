//! Readers of pdctld cannot take it down: event streams are capped per account (one
//! socket-group member held 256 streams open during a rollout, every connection of the control
//! socket, the watchdog's ping among them, and systemd killed pdctld: the rollout ended
//! `interrupted`), and connections to the metrics port are capped per account (three accounts
//! took every slot). On the sandbox behind the real gateway, with pdctld.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use pdctl_tests::{live_daemon, raw_api};

const P: &str = "sglang-dsv4-prefill.service";
const LIMIT: Duration = Duration::from_secs(150);

/// `GET /v1/rollouts/ID/events` opened on the socket: the connection and the status line.
fn open_stream(socket: &std::path::Path, id: &str) -> (UnixStream, String) {
    let mut c = UnixStream::connect(socket).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    write!(c, "GET /v1/rollouts/{id}/events HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n") && c.read(&mut b).unwrap_or(0) == 1 {
        head.push(b[0]);
    }
    (c, String::from_utf8_lossy(&head).trim().to_string())
}

#[test]
fn one_account_holds_at_most_16_event_streams_and_pdctld_keeps_answering_and_rolling() {
    let (_stack, config, d) = pdctl_tests::stack_with_pdctld();
    // A soak long enough to hold the streams open while it runs.
    std::fs::write(config.parent().expect("dir").join("config.d/60-soak.toml"), "[rollout]\nmin_healthy = \"20s\"\n").expect("fragment");
    let mut c = live_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    c.wait_line(LIMIT, |e| e["unit"] == P && e["step"] == "soak" && e["status"] == "started").expect("the soak began");
    let (_, st) = raw_api(&d.socket, "GET", "/v1/status", "");
    let id = st["running"].as_str().expect("a running rollout").to_string();
    // The CLI that started it holds one stream of this account already.
    let mut open = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..24 {
        let (conn, status) = open_stream(&d.socket, &id);
        if status.contains(" 200 ") {
            open.push(conn);
        } else {
            let mut body = String::new();
            let mut conn = conn;
            let _ = conn.read_to_string(&mut body);
            refused.push(format!("{status} {body}"));
        }
    }
    assert_eq!(open.len(), 15, "16 in all with the CLI's own: {refused:#?}");
    assert_eq!(refused.len(), 9, "{refused:#?}");
    assert!(refused.iter().all(|r| r.contains(" 429 ") && r.contains("too_many_streams") && r.contains("uid 0")), "{refused:#?}");
    // pdctld answers meanwhile, and a stream given back is a slot again.
    assert_eq!(raw_api(&d.socket, "GET", "/v1/ping", "").0, 200);
    drop(open.pop());
    let again = pdctl_tests::until(Duration::from_secs(10), Duration::from_millis(100), || {
        let (conn, status) = open_stream(&d.socket, &id);
        let ok = status.contains(" 200 ");
        if ok {
            open.push(conn);
        }
        ok
    });
    assert!(again, "a closed stream's slot is given back");
    drop(open);
    assert_eq!(c.finish(LIMIT), Some(0), "the rollout ran to its end");
}

/// Holds `n` connections to `addr` open, opening a new one whenever pdctld closes one (as a
/// client denying the scrapers would); prints "holding" once it holds them all.
const HOLDER: &str = r#"
import socket, sys, time
addr, n = sys.argv[1].rsplit(":", 1), int(sys.argv[2])
conns, said = [], False
while True:
    alive = []
    for c in conns:
        try:
            closed = c.recv(1, socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            closed = False
        except OSError:
            closed = True
        if closed:
            c.close()
        else:
            alive.append(c)
    while len(alive) < n:
        alive.append(socket.create_connection((addr[0], int(addr[1]))))
    conns = alive
    if not said:
        print("holding", flush=True)
        said = True
    time.sleep(0.05)
"#;

/// Three local accounts holding 40 connections each to the metrics port (reopened as pdctld
/// closes them) took every one of its 32 slots: 0 of 30 scrapes were answered. Each account now
/// holds at most 4 (the kernel tells pdctld whose each connection is), and every scrape is
/// answered.
#[test]
fn three_accounts_holding_connections_cannot_deny_the_metrics_port() {
    let (_stack, _config, d) = pdctl_tests::stack_with_pdctld();
    let addr = d.metrics_url.trim_start_matches("http://").split('/').next().expect("address").to_string();
    let mut holders = Vec::new();
    for uid in ["40001", "40002", "40003"] {
        let mut c = std::process::Command::new("/usr/bin/setpriv");
        c.args([&format!("--reuid={uid}"), &format!("--regid={uid}"), "--clear-groups", "/usr/bin/python3", "-c", HOLDER, &addr, "40"]);
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
        let mut child = c.spawn().expect("setpriv");
        let out = child.stdout.take().expect("stdout");
        let said = pdctl_tests::line_reader(out, Some);
        assert_eq!(said.recv_timeout(Duration::from_secs(30)).ok().as_deref(), Some("holding"), "account {uid} holds its connections");
        holders.push(child);
    }
    let answered = (0..30).filter(|_| pdctl_tests::pdctl_sandbox::stack::http_get(&d.metrics_url).is_ok_and(|(s, b)| s == 200 && b.contains("pdctl_"))).count();
    for mut h in holders {
        let _ = h.kill();
        let _ = h.wait();
    }
    assert_eq!(answered, 30, "every scrape answered beside three accounts' 120 connections");
}
