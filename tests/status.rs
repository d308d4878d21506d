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

/// A decode switched to prefill by hand (`POST /pd_role_switch`, SGLang 0.5.23's runtime role
/// switch, on a server started with `--enable-pd-role-switch`) while its unit and pdctl's config
/// still say decode: `pdctl check` fails in preflight, before any request is sent, with
/// `role_mismatch` naming both roles;
/// `pdctl status` marks it not serving and says what it runs; the next step the failure names (a
/// restart of that unit) brings the configured role back, and `check` passes again.
#[test]
fn a_worker_switched_to_the_other_role_by_hand_is_found_and_its_named_restart_brings_it_back() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap().to_string();
    let opts = pdctl_tests::pdctl_sandbox::stack::StackOptions {
        decode_args: vec!["--enable-pd-role-switch".into(), "--disaggregation-bootstrap-port".into(), boot],
        ..Default::default()
    };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let switched = rt.block_on(async {
        let body = serde_json::json!({"new_role": "prefill"});
        let r = pdctl_tests::http().post(format!("{}/pd_role_switch", stack.decode.url)).json(&body).send().await.unwrap();
        (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap_or_default())
    });
    assert_eq!(switched.0, 200, "{}", switched.1);

    let check = pdctl_daemon(&d, &config, &["check", "--json"], LIMIT);
    assert_eq!(check.code, 1, "{:#} {}", check.summary, check.stderr);
    let failed = &check.summary["failed"];
    assert_eq!(
        (failed["unit"].as_str(), failed["step"].as_str(), failed["cause_code"].as_str()),
        (Some(D), Some("preflight"), Some("role_mismatch")),
        "{failed:#}"
    );
    assert!(failed["cause"].as_str().is_some_and(|c| c.contains("runs as prefill") && c.contains("says decode")), "{failed:#}");
    let next = failed["next"].as_str().unwrap_or_default().to_string();
    assert!(next.contains(&format!("pdctl restart --rolling --unit {D}")), "{next}");

    let (code, out) = human(&config, &d.socket, &["status"]);
    assert_eq!(code, 1, "{out}");
    let row = out.lines().find(|l| l.starts_with(D)).unwrap_or_else(|| panic!("the decode's row: {out}"));
    assert!(row.contains("decode (runs prefill)"), "{out}");

    // The named next step, run as written.
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", D, "--allow-outage", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#} {}", r.summary, r.stderr);
    let check = pdctl_daemon(&d, &config, &["check", "--json"], LIMIT);
    assert_eq!(check.code, 0, "{:#} {}", check.summary, check.stderr);
}
