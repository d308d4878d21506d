//! `pdctl status` says what is true now: a pair probe is history, so a pair one of whose workers
//! is not serving does not read "ok"; and a worker whose port accepts and never answers costs the
//! command one bounded wait, said as such, not one wait per call; a worker's answer (its weight
//! version) that would drive the terminal is shown, its escapes made visible, not sent. On the sandbox (real systemd,
//! journald, D-Bus) behind the real gateway, with pdctld.

use std::path::Path;
use std::time::Duration;

use pdctl_tests::{pdctl_daemon, stack_with_pdctld};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn human(config: &Path, socket: &Path, args: &[&str]) -> (i32, String) {
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let o = std::process::Command::new(bin).args(args).args(["--config", &s(config), "--socket", &s(socket)]).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

#[test]
fn a_pair_with_a_stopped_decode_is_not_ok_escapes_are_shown_not_sent_and_a_silent_port_is_one_bounded_wait() {
    let (stack, config, d) = stack_with_pdctld();
    // A restart of the prefill probes its pair with the decode: pdctld keeps that probe.
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#} {}", r.summary, r.stderr);
    let (code, out) = human(&config, &d.socket, &["status"]);
    assert_eq!(code, 0, "{out}");
    let pairs = out.lines().find(|l| l.contains("pairs with:")).unwrap_or_else(|| panic!("the pair is shown: {out}")).to_string();
    assert!(pairs.contains(&format!("{P} ok (")), "{out}");

    // A worker's answer that would drive the terminal (its weight version): shown, made safe.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let model = stack.sandbox.dir().join("models/dsv4").display().to_string();
    let loaded = rt.block_on(async {
        let body = serde_json::json!({"model_path": model, "weight_version": "\u{1b}]0;PWNED\u{7}\u{1b}[2J"});
        pdctl_tests::http().post(format!("{}/update_weights_from_disk", stack.prefill.url)).json(&body).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
    });
    assert_eq!(loaded, 200, "the simulator took the version");
    let (_, out) = human(&config, &d.socket, &["status"]);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}') && out.contains("PWNED"), "escapes shown, not sent: {out:?}");

    // The decode stops: the probe is not news of now.
    stack.sandbox.systemctl(&["stop", D]).unwrap();
    let (code, out) = human(&config, &d.socket, &["status"]);
    assert_eq!(code, 1, "{out}");
    let pairs = out.lines().find(|l| l.contains("pairs with:")).unwrap_or_else(|| panic!("the pair is shown: {out}")).to_string();
    assert!(!pairs.contains(" ok (") && pairs.contains(&format!("not now: {D} is not serving")) && pairs.contains("last probe ok"), "{out}");
    assert!(out.lines().last().is_some_and(|l| l.contains("not serving") && l.contains("next:")), "the last line is the outcome: {out}");

    // A port that accepts and never answers in the decode's place: each call is bounded and
    // said, and all of them wait at once (it took 25 s).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let text = std::fs::read_to_string(&config).unwrap();
    let decode_url = stack.workers().iter().find(|w| w.unit == D).map(|w| w.url.clone()).unwrap();
    assert!(text.contains(&decode_url), "the config names the decode's URL");
    let silent_config = config.with_file_name("silent.toml");
    std::fs::write(&silent_config, text.replace(&decode_url, &url)).unwrap();
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap();
    let mut child = std::process::Command::new(bin)
        .args(["status", "--json", "--config", &s(&silent_config), "--socket", &s(&d.socket)])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ended = pdctl_tests::until(Duration::from_secs(15), Duration::from_millis(100), || child.try_wait().ok().flatten().is_some());
    if !ended {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(ended, "status ended within 15 s beside a silent port: {}", String::from_utf8_lossy(&out.stdout));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let row = v["workers"].as_array().and_then(|ws| ws.iter().find(|w| w["unit"] == D).cloned()).unwrap_or_else(|| panic!("the decode's row: {v:#}"));
    assert!(row["kv"]["error"].as_str().is_some_and(|e| e.contains("did not answer within 3s")), "{row:#}");
    drop(silent);
}
