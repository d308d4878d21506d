//! pdctld as its own user, as Zincati runs as `zincati`: on a private systemd *system* manager
//! (PID 1 of its own PID namespace, its own system bus, polkitd and journald — pdctl-sandbox's
//! `system`; this machine's PID 1 is not systemd, and a user manager never asks polkit), with the
//! package's own parts: the accounts of `units/pdctl.sysusers.conf` (created by
//! `systemd-sysusers`), the opt-in drop-in `units/pdctld-as-pdctl-user.conf`, and the rule
//! `pdctl polkit-rule` writes. pdctld runs as `pdctl` and drives a rolling restart, a rollback
//! (writing a drop-in back through the group-writable directory, reloading systemd) and a host
//! drain and resume, all through polkit; polkit refuses the same account a unit outside the config
//! and a verb outside the rule, and refuses another account everything.

use std::path::Path;
use std::time::{Duration, Instant};

use pdctl_tests::pdctl_sandbox::system::{Boot, SystemManager, SHARED, UNIT_DIR};
use pdctl_tests::pdctl_sandbox::{free_port, repo_root, workspace_bin};
use serde_json::Value;

const P: &str = "sglang-prefill.service";
const D: &str = "sglang-decode.service";

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn sim_unit(sim: &Path, role: &str, port: u16, bootstrap: Option<u16>) -> String {
    let b = bootstrap.map(|b| format!(" --disaggregation-bootstrap-port {b}")).unwrap_or_default();
    format!(
        "[Unit]\nDescription=SGLang {role} (sglang-sim)\nStartLimitIntervalSec=0\n[Service]\nType=simple\n\
         Environment=SGLANG_SIM_LOAD_SECS=0.5 SGLANG_SIM_WARMUP_SECS=0.2\n\
         Environment=SGLANG_DISAGGREGATION_WAITING_TIMEOUT=3 SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=8\n\
         ExecStart={sim} --model-path {SHARED}/model --served-model-name dsv4 --host 127.0.0.1 --port {port} --tp-size 4 \
         --disaggregation-mode {role} --trust-remote-code --mem-fraction-static 0.85 --enable-metrics{b}\n\
         Restart=no\nTimeoutStopSec=30\nKillMode=mixed\n",
        sim = s(sim)
    )
}

fn config(pp: u16, pb: u16, dp: u16) -> String {
    format!(
        "[[worker]]\nunit = \"{P}\"\nrole = \"prefill\"\nurl = \"http://127.0.0.1:{pp}\"\nbootstrap_port = {pb}\ngpus = \"0-3\"\n\n\
         [[worker]]\nunit = \"{D}\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:{dp}\"\ngpus = \"4-7\"\n\n\
         [rollout]\nready_timeout = \"60s\"\norder = [\"prefill\", \"decode\"]\nhealth_timeout = \"30s\"\nmetrics_timeout = \"40s\"\n\
         min_healthy = \"2s\"\ndrain_timeout = \"10s\"\nallow_outage = true\non_failure = \"rollback\"\n\n\
         [verify]\nmetrics = \"required\"\n"
    )
}

/// `pdctl ARGS --json` inside, as root (the operator); its exit code and its last JSON line.
fn pdctl(sm: &SystemManager, pdctl: &Path, args: &[&str]) -> (i32, Value, String) {
    let cfg = format!("{SHARED}/pdctl.toml");
    let mut argv = vec![pdctl.to_str().expect("path"), "--config", &cfg];
    argv.extend_from_slice(args);
    let out = sm.run(&argv).expect("pdctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = stdout.lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok()).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), last, format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

fn show(sm: &SystemManager, unit: &str, prop: &str) -> String {
    let out = sm.systemctl(&["show", "-p", prop, "--value", unit]).expect("systemctl show");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while !f() {
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

fn wait(what: &str, deadline: Duration, f: impl FnMut() -> bool) {
    assert!(until(deadline, f), "{what}: not within {deadline:?}");
}

/// `busctl call` of the manager as `account` (no agent: what polkit decides by rules alone).
fn bus_call(sm: &SystemManager, account: &str, method: &str, sig: &str, args: &[&str]) -> (bool, String) {
    let mut argv = vec!["busctl", "--system", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager", method, sig];
    argv.extend_from_slice(args);
    let out = sm.run_as(account, &argv).expect("busctl runs");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The rule, as an operator writes it from the config (`pdctl polkit-rule --write`).
fn rule_for(pdctl_bin: &Path, cfg: &str) -> String {
    let cfg_file = std::env::temp_dir().join(format!("pdctl-as-user-{}.toml", std::process::id()));
    std::fs::write(&cfg_file, cfg).unwrap();
    let rule = std::process::Command::new(pdctl_bin).args(["--config", &s(&cfg_file), "polkit-rule"]).output().unwrap();
    let _ = std::fs::remove_file(&cfg_file);
    assert!(rule.status.success(), "{}", String::from_utf8_lossy(&rule.stderr));
    String::from_utf8_lossy(&rule.stdout).into_owned()
}

/// The shipped unit, run from the built binary (copied into the shared directory: its
/// `PrivateTmp=yes` hides a checkout under /tmp or /var/tmp) with its config there too; the unit
/// directory writable for rollbacks (/etc/systemd/system on a host).
fn pdctld_unit(root: &Path, metrics_port: u16) -> String {
    let unit = std::fs::read_to_string(root.join("units/pdctld.service")).unwrap();
    unit.lines()
        .map(|l| match l {
            l if l.starts_with("ExecStart=") => format!(
                "ExecStart={SHARED}/bin/pdctld --config {SHARED}/pdctl.toml --socket-group pdctl --socket /run/pdctl/pdctl.sock --state-dir /var/lib/pdctl --metrics-listen 127.0.0.1:{metrics_port} --stop-timeout 20s"
            ),
            l if l.starts_with("ReadWritePaths=") => format!("{l} {UNIT_DIR}"),
            l if l.starts_with("ReadOnlyPaths=") => "ReadOnlyPaths=-/etc/pdctl".to_string(),
            l => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Boot the manager with both workers, an unrelated unit, pdctld as pdctl (the package's drop-in,
/// sysusers file and the rule for its config); wait until pdctld and the workers are up.
fn boot(pdctl_bin: &Path) -> SystemManager {
    let root = repo_root();
    let sim = workspace_bin("sglang-sim", "PDCTL_SIM_BIN").expect("sglang-sim built");
    let pdctld = workspace_bin("pdctld", "PDCTLD_BIN").expect("pdctld built");
    let (pp, pb, dp, mp) = (free_port().unwrap(), free_port().unwrap(), free_port().unwrap(), free_port().unwrap());
    let cfg = config(pp, pb, dp);
    let as_user = std::fs::read_to_string(root.join("units/pdctld-as-pdctl-user.conf")).unwrap();
    let boot = Boot {
        units: vec![
            (P.into(), sim_unit(&sim, "prefill", pp, Some(pb))),
            (D.into(), sim_unit(&sim, "decode", dp, None)),
            ("other.service".into(), "[Service]\nExecStart=/bin/sleep 100000\n".into()),
            ("pdctld.service".into(), pdctld_unit(&root, mp)),
            ("pdctld.service.d/20-as-pdctl-user.conf".into(), as_user),
            // A drop-in of root's a rollout will change and the rollback write back.
            (format!("{P}.d/10-env.conf"), "[Service]\nEnvironment=PDCTL_TEST_MARK=1\n".into()),
        ],
        files: vec![("pdctl.toml".into(), cfg.clone())],
        programs: vec![("bin/pdctld".into(), pdctld)],
        start: vec![P.into(), D.into(), "other.service".into(), "pdctld.service".into()],
        rules: vec![("50-pdctl.rules".into(), rule_for(pdctl_bin, &cfg))],
        sysusers: vec![root.join("units/pdctl.sysusers.conf")],
        // Each worker's drop-in directory: root's, writable by the group only pdctl is in.
        dirs: vec![
            ("units/sglang-prefill.service.d".into(), "0".into(), "pdctl-units".into(), 0o2775),
            ("units/sglang-decode.service.d".into(), "0".into(), "pdctl-units".into(), 0o2775),
            ("model".into(), "0".into(), "0".into(), 0o755),
        ],
    };
    let sm = SystemManager::boot(&boot).expect("a system manager with a bus, polkitd and journald");
    if !until(Duration::from_secs(30), || show(&sm, "pdctld.service", "ActiveState") == "active") {
        let log = sm
            .run(&["journalctl", "--no-pager", "-n", "30", "-u", "pdctld.service"])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!("pdctld not active within 30 s; its journal:\n{log}");
    }
    wait("both workers up", Duration::from_secs(60), || show(&sm, P, "ActiveState") == "active" && show(&sm, D, "ActiveState") == "active");
    sm
}

/// The line `systemd-analyze security` ends with.
fn exposure(out: std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).lines().find(|l| l.contains("Overall exposure")).unwrap_or("(no score)").to_string()
}

/// A rollback: a baseline, then a bad change to root's drop-in; pdctld writes it back (into a
/// directory of root's it may write through pdctl-units), reloads systemd and restarts.
fn rollback(sm: &SystemManager, pdctl_bin: &Path, uid: u32) {
    use std::os::unix::fs::MetadataExt as _;
    let (code, sum, out) = pdctl(sm, pdctl_bin, &["rollout", "apply", "--all", "--json"]);
    assert_eq!((code, sum["result"].as_str()), (0, Some("succeeded")), "baseline: {out}");
    let dropin = sm.shared().join(format!("units/{P}.d/10-env.conf"));
    let argv = show(sm, P, "ExecStart").split("argv[]=").nth(1).and_then(|a| a.split(" ;").next()).expect("ExecStart's argv").to_string();
    std::fs::write(&dropin, format!("[Service]\nEnvironment=PDCTL_TEST_MARK=1\nExecStart=\nExecStart={argv} --bogus-flag\n")).unwrap();
    let (code, sum, out) = pdctl(sm, pdctl_bin, &["rollout", "apply", "--if-changed", "--json"]);
    assert_eq!(sum["result"].as_str(), Some("rolled_back"), "exit {code}: {out}");
    assert_eq!(std::fs::read_to_string(&dropin).unwrap(), "[Service]\nEnvironment=PDCTL_TEST_MARK=1\n", "written back");
    let meta = std::fs::metadata(&dropin).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (uid, 0o644), "pdctl's now (not root: no CAP_CHOWN), its recorded mode kept");
    assert!(!show(sm, P, "ExecStart").contains("--bogus-flag") && show(sm, P, "ActiveState") == "active", "runs the old config again");
    let id = sum["id"].as_str().unwrap_or_default().to_string();
    let (_, _, shown) = pdctl(sm, pdctl_bin, &["rollout", "show", &id, "--json"]);
    assert!(shown.contains("pdctld is not root, so owner uid 0 was not kept"), "the record says whose the file is now: {shown}");
}

/// What polkit refuses pdctl: a unit outside the config, a verb outside the rule; and another
/// account everything, the configured units included.
fn refusals(sm: &SystemManager) {
    let (ok, why) = bus_call(sm, "pdctl", "RestartUnit", "ss", &["other.service", "replace"]);
    assert!(!ok && why.contains("Interactive authentication required"), "a unit outside the config: {why}");
    let (ok, why) = bus_call(sm, "pdctl", "KillUnit", "ssi", &[D, "all", "15"]);
    assert!(!ok && why.contains("Interactive authentication required"), "a verb outside the rule (kill): {why}");
    let (ok, why) = bus_call(sm, "nobody", "RestartUnit", "ss", &[D, "replace"]);
    assert!(!ok && why.contains("Interactive authentication required"), "another account: {why}");
    let (ok, why) = bus_call(sm, "pdctl", "RestartUnit", "ss", &[D, "replace"]);
    assert!(ok, "the rule lets pdctl restart a configured unit: {why}");
    assert_eq!(show(sm, "other.service", "ActiveState"), "active", "other.service untouched");
}

#[test]
fn pdctld_as_the_pdctl_user_restarts_rolls_back_and_drains_only_its_units_through_polkit() {
    let pdctl_bin = workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let sm = boot(&pdctl_bin);
    let uid = sm.id("passwd", "pdctl").unwrap();
    let ps = sm.run(&["ps", "-o", "uid=,user=", "-p", &show(&sm, "pdctld.service", "MainPID")]).unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout).trim().to_string();
    assert!(ps.starts_with(&uid.to_string()) && ps.ends_with("pdctl"), "pdctld runs as pdctl (uid {uid}): {ps}");
    let score = exposure(sm.run(&["systemd-analyze", "security", "--no-pager", "pdctld.service"]).unwrap());
    let shipped = std::process::Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(repo_root().join("units/pdctld.service"))
        .output()
        .unwrap();
    eprintln!("systemd-analyze security: as pdctl (running): {score}; as root (the shipped unit, offline): {}", exposure(shipped));

    // A rolling restart, both units restarted by pdctld through polkit.
    let (p0, d0) = (show(&sm, P, "InvocationID"), show(&sm, D, "InvocationID"));
    let (code, sum, out) = pdctl(&sm, &pdctl_bin, &["restart", "--rolling", "--json"]);
    assert_eq!((code, sum["result"].as_str()), (0, Some("succeeded")), "{out}");
    // The drop-in directories are root's and pdctl-units' (only pdctl is in it): not another's.
    assert!(!out.contains("an account other than root can replace"), "no warning of its own directories: {out}");
    assert!(show(&sm, P, "InvocationID") != p0 && show(&sm, D, "InvocationID") != d0, "both restarted");

    rollback(&sm, &pdctl_bin, uid);

    // A host drain and resume: both stopped, then started, by pdctld through polkit.
    let (code, sum, out) = pdctl(&sm, &pdctl_bin, &["host", "drain", "--json"]);
    assert_eq!((code, sum["result"].as_str()), (0, Some("succeeded")), "drain: {out}");
    assert_eq!((show(&sm, P, "ActiveState"), show(&sm, D, "ActiveState")), ("inactive".to_string(), "inactive".to_string()));
    let (code, sum, out) = pdctl(&sm, &pdctl_bin, &["host", "resume", "--json"]);
    assert_eq!((code, sum["result"].as_str()), (0, Some("succeeded")), "resume: {out}");
    assert_eq!((show(&sm, P, "ActiveState"), show(&sm, D, "ActiveState")), ("active".to_string(), "active".to_string()));

    refusals(&sm);
}
