//! Host maintenance on a real systemd manager, journald and gateway: `pdctl host drain` takes a
//! host's workers out of the gateway and stops them (refused without `--allow-outage` when no
//! other worker of a role serves), the host refuses any other rollout meanwhile, and after a
//! "reboot" (the units started again by their manager, pdctld started again) pdctld brings every
//! worker back through the restart's gates by itself. With `[fleet]`, update agents on three
//! hosts ask the FleetLock endpoint at once and the fleet's budget lets one host at a time go.

use std::path::Path;
use std::time::Duration;

use pdctl_tests::fleet_hosts::*;
use pdctl_tests::host_maintenance::{host_status, newest, passed, reboot};
use pdctl_tests::pdctl_sandbox::etcd::Etcd;
use pdctl_tests::pdctl_sandbox::stack::Pdctld;
use pdctl_tests::JsonRun;
use serde_json::Value;

#[path = "maintenance/fleetlock.rs"]
mod fleetlock;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(180);

fn cli(d: &Pdctld, config: &Path, args: &[&str]) -> JsonRun {
    pdctl_tests::pdctl_daemon(d, config, args, LIMIT)
}

#[test]
fn a_host_is_drained_for_maintenance_and_after_its_reboot_resumed_through_every_gate() {
    let (s, config, d) = pdctl_tests::stack_with_pdctld();
    let before = (s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d"));
    let router = s.router.clone().expect("router");
    // The stack's config accepts outages; this host does not.
    std::fs::write(config.parent().expect("dir").join("config.d/41-no-outage.toml"), "[rollout]\nallow_outage = false\n").expect("fragment");

    refused_alone(&s, &config, &d, &before);
    let sock = d.socket.display().to_string();

    // The `next` it gave, run (with a reason).
    let r = cli(&d, &config, &["host", "drain", "--allow-outage", "--reason", "kernel 6.8.0-51", "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    for u in [P, D] {
        assert_eq!(s.show(u, "ActiveState").expect("state"), "inactive", "{u} stopped");
        // How long the stop took, measured: systemd unloads the stopped unit (nothing references
        // it here) and its timestamps with it; the stop job's own time stands in.
        let stop = &r.event(u, "stop", "passed")["detail"]["stop"];
        assert!(stop["stop_ms"].as_u64().is_some(), "{u}'s stop took a measured time: {stop:#}");
    }
    assert!(r.index(D, "stop", "passed") < r.index(P, "stop", "passed"), "the decode stops before the prefill");
    assert!(r.index(P, "drain", "passed") < r.index(D, "stop", "passed"), "every worker out of the gateway before the first stop");
    assert!(healthy_on(&router.url).is_empty(), "the gateway sends nothing to the host");
    let st = host_status(&d);
    assert_eq!(st["maintenance"]["phase"], "down", "{st:#}");
    assert_eq!(st["maintenance"]["by"].as_str().map(|b| b.starts_with("uid ")), Some(true), "{st:#}");

    // A dry run now says it would be refused (exit 4).
    let (code, out, _) = pdctl(&config, &["host", "drain", "--dry-run", "--socket", &sock]);
    assert_eq!(code, 4, "{out}");
    assert!(out.lines().last().is_some_and(|l| l.contains("refused") && l.contains("next: pdctl host status")), "{out}");

    // The host in maintenance is said everywhere: a restart's dry run is refused as the
    // restart is (it used to say `peer_role_down`, exit 1), and `pdctl status` says why its
    // workers do not serve and what to do (it used to say "idle" and `next: pdctl check`).
    let (code, out, _) = pdctl(&config, &["restart", "--rolling", "--dry-run", "--socket", &sock]);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("in maintenance"), "{out}");
    let (code, out, _) = pdctl(&config, &["status", "--socket", &sock]);
    assert_eq!(code, 1, "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(last.contains("this host is in maintenance (down") && last.contains("next: `pdctl host status`"), "{out}");

    // Nothing else is rolled on a host in maintenance.
    let r = cli(&d, &config, &["restart", "--rolling", "--json"]);
    assert_eq!(r.code, 4, "{:#}", r.summary);
    assert!(r.stderr.contains("in maintenance") || r.summary.to_string().contains("in_maintenance"), "{:#}\n{}", r.summary, r.stderr);

    // The reboot: pdctld finds its workers running again and resumes by itself.
    reboot(&s, &d);
    assert!(until(LIMIT, || host_status(&d)["maintenance"].is_null()), "resumed: {:#}", host_status(&d));
    let rec = newest(&d);
    assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("host_resume"), Some("succeeded")), "{rec:#}");
    for u in [P, D] {
        for step in ["start", "ready", "health", "router", "soak"] {
            assert!(passed(&rec, u, step), "{u} passed {step}: {rec:#}");
        }
    }
    assert!(passed(&rec, P, "pair") || passed(&rec, D, "pair"), "the pair probed: {rec:#}");
    // Both were started by the boot: verified together, not one after the other's soak (the
    // decode waited for the prefill's router gate and soak, 5.2 s).
    resumed_together(&rec);

    assert_ne!(s.show(P, "InvocationID").expect("p"), before.0, "a new run after the reboot");
    assert_eq!(s.wait_router_healthy(2, Duration::from_secs(60)).expect("router"), 2, "both admitted again");
    let (code, out, err) = pdctl(&config, &["host", "status", "--socket", &d.socket.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.lines().last().is_some_and(|l| l.contains("in service")), "{out}");
}

/// Alone behind its gateway, a host drain without `--allow-outage`: the dry run predicts the
/// refusal (decodes first), the drain is refused the same way touching nothing, and the `next`
/// it gives is the same verb with what it lacks.
fn refused_alone(s: &pdctl_tests::pdctl_sandbox::stack::Stack, config: &Path, d: &Pdctld, before: &(String, String)) {
    // Alone behind its gateway: the dry run runs the drain's own preflight and predicts its
    // refusal (it used to say `"refused": null`, exit 0), decodes first, touching nothing.
    let sock = d.socket.display().to_string();
    let (code, out, err) = pdctl(config, &["host", "drain", "--dry-run", "--json", "--socket", &sock]);
    let lines: Vec<Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let dry = lines.last().cloned().unwrap_or_default();
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(dry["failed"]["cause_code"], "only_worker_of_role", "{out}");
    let order: Vec<&str> = lines.iter().filter(|e| e["step"] == "preflight" && e["status"] == "started").filter_map(|e| e["unit"].as_str()).collect();
    assert_eq!(order, [D], "decodes first, and the decode is the first refused: {out}");

    // The drain itself: refused the same way, nothing touched; its sentence speaks of the
    // reboot and its `next` is the same verb with what it lacks (it used to suggest a restart).
    let r = cli(d, config, &["host", "drain", "--json"]);
    assert_eq!(r.code, 2, "{:#}", r.summary);
    assert_eq!(r.summary["failed"]["cause_code"], "only_worker_of_role", "{:#}", r.summary);
    assert_eq!(r.summary["failed"]["cause_code"], dry["failed"]["cause_code"], "the dry run said it");
    let cause = r.summary["failed"]["cause"].as_str().unwrap_or_default();
    assert!(cause.contains("reboot") && cause.contains("the gateway admits 0 other decode worker(s) of 1 it lists"), "{cause}");
    let next = r.summary["failed"]["next"].as_str().unwrap_or_default();
    assert!(next.starts_with("`pdctl host drain --allow-outage`"), "{next}");
    assert_eq!((s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d")), *before, "a refusal restarts nothing");
    assert_eq!(host_status(d)["maintenance"], Value::Null, "a refusal records nothing");
    let (code, out, err) = pdctl(config, &["host", "drain", "--dry-run", "--allow-outage", "--socket", &sock]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.lines().last().is_some_and(|l| l.contains("next: pdctl host drain --allow-outage")), "{out}");
}

/// A FleetLock request as Zincati sends it: `POST {base}/v1/{what}`, the protocol header, the
/// client's id and group. Status and body.
fn fleetlock(base: &str, what: &str, id: &str, group: &str) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let r = pdctl_tests::http()
            .post(format!("{base}/v1/{what}"))
            .header("fleet-lock-protocol", "true")
            .json(&serde_json::json!({"client_params": {"id": id, "group": group}}))
            .send()
            .await
            .expect("FleetLock request");
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or(Value::Null))
    })
}

/// The resume of a 1P1D host whose boot started both workers verified them together: both
/// admitted before either soak ended. Prints the window from the later ready line to the later
/// re-admission (4.1 s one after the other, 1.07 s together).
fn resumed_together(rec: &Value) {
    let events = rec["events"].as_array().cloned().unwrap_or_default();
    let index = |u: &str, step: &str| events.iter().position(|e| e["unit"] == u && e["step"] == step && e["status"] == "passed");
    let at = |u: &str, step: &str| {
        let e = events.iter().find(|e| e["unit"] == u && e["step"] == step && e["status"] == "passed").expect("passed");
        humantime::parse_rfc3339(e["at"].as_str().expect("at")).expect("RFC 3339")
    };
    // When each logged its ready line (journald's receive time), not when pdctl got to it.
    let line = |u: &str| {
        let e = events.iter().find(|e| e["unit"] == u && e["step"] == "ready" && e["status"] == "passed").expect("ready");
        std::time::UNIX_EPOCH + Duration::from_micros(e["detail"]["journal_realtime_us"].as_u64().expect("journal_realtime_us"))
    };
    let (ready, admitted) = (line(P).max(line(D)), at(P, "router").max(at(D, "router")));
    println!("1P1D resume: both ready lines → both admitted {:?}", admitted.duration_since(ready).unwrap_or_default());
    assert!(index(D, "router") < index(P, "soak") && index(P, "router") < index(D, "soak"), "both admitted before either soak ended: {rec:#}");
}

/// pdctld SIGKILLed in the middle of a host drain (the decode stopped, the prefill out of the
/// gateway or stopping): at its next start the maintenance record says `draining`, and pdctld
/// brings the host back by itself — every worker started and through its gates, the record gone.
#[test]
fn pdctld_sigkilled_mid_host_drain_brings_the_host_back_at_its_next_start() {
    let (s, config, d) = pdctl_tests::stack_with_pdctld();
    let mut c = pdctl_tests::live_daemon(&d, &config, &["host", "drain", "--allow-outage", "--json"]);
    c.wait_line(LIMIT, |e| e["unit"] == D && e["step"] == "stop" && e["status"] == "passed").expect("the decode stopped");
    pdctl_tests::kill_and_wait(&s, &d.unit);
    let _ = c.finish(Duration::from_secs(20));
    let st = std::fs::read_to_string(d.state.join("drains/maintenance/host.json")).expect("the record outlives pdctld");
    assert!(st.contains("\"draining\""), "{st}");
    s.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    assert!(until(LIMIT, || host_status(&d)["maintenance"].is_null()), "brought back: {:#}", host_status(&d));
    let rec = newest(&d);
    assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("host_resume"), Some("succeeded")), "{rec:#}");
    assert!(passed(&rec, D, "start") && passed(&rec, D, "ready"), "the stopped decode started and ready again: {rec:#}");
    assert_eq!(s.wait_router_healthy(2, Duration::from_secs(60)).expect("router"), 2, "both admitted again");
    // The cut drain is over: its record says what pdctld's start did, and pasting `rollout
    // resume` of it (what the cut CLI suggested) is refused, naming `pdctl host drain`, and
    // stops nothing — it used to print "✓ succeeded … all 0 unit(s) restarted and verified".
    let (_, list) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    let drain = list["rollouts"].as_array().and_then(|a| a.iter().find(|r| r["kind"] == "host_drain")).expect("the drain's record").clone();
    let id = drain["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert!(rec["notes"].to_string().contains("this drain is over"), "the drain's record says it was undone: {rec:#}");
    let r = cli(&d, &config, &["rollout", "resume", id, "--json"]);
    assert_ne!(r.code, 0, "{:#} {}", r.summary, r.stderr);
    assert!(format!("{} {}", r.summary, r.stderr).contains("pdctl host drain"), "the refusal names the verb: {:#} {}", r.summary, r.stderr);
    for u in [P, D] {
        assert_eq!(s.show(u, "ActiveState").expect("state"), "active", "{u} still serves");
    }
    // The history's columns hold `host_resume`; the resume pdctld made by itself says so.
    let table = text(&d, &config, &["rollout", "history"]);
    let head = table.lines().next().expect("a header");
    let at = |l: &str, col: &str| head.find(col).map(|i| l.get(i..).unwrap_or("").split_whitespace().next().unwrap_or("").to_string());
    for l in table.lines().skip(1) {
        assert!(["restart", "apply", "host_drain", "host_resume"].contains(&at(l, "KIND").unwrap_or_default().as_str()), "KIND at its column: {l}\n{table}");
        assert!(
            ["succeeded", "failed", "rolled_back", "interrupted", "aborted"].contains(&at(l, "STATE").unwrap_or_default().as_str()),
            "STATE at its column: {l}\n{table}"
        );
    }
    let shown = text(&d, &config, &["rollout", "show", newest(&d)["id"].as_str().expect("id")]);
    let by = shown.lines().find(|l| l.starts_with("by ")).unwrap_or_default().to_string();
    assert!(by.contains("pdctld itself") && by.contains("pdctld's start"), "{shown}");
    let shown = text(&d, &config, &["rollout", "show", id]);
    assert!(shown.lines().any(|l| l.starts_with("by ") && l.contains("uid 0")), "{shown}");
}

/// What the CLI prints for people (stdout and stderr).
fn text(d: &Pdctld, config: &Path, args: &[&str]) -> String {
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl");
    let o = std::process::Command::new(bin)
        .args(args)
        .args(["--config", config.to_str().expect("utf-8"), "--socket", d.socket.to_str().expect("utf-8")])
        .output()
        .expect("pdctl runs");
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A reboot that lost the journal and set the clock back. A volatile journal
/// (`/run/log/journal`, journald's default without `/var/log/journal`) is gone after the reboot,
/// and with it every entry the cursors recorded before the stops point at; `sd_journal_seek_cursor`
/// then places such a cursor by its wall-clock time alone (neither its seqnum id nor its boot id
/// matches), and a clock set back across the reboot (a wrong RTC before NTP) puts it after the new
/// runs' ready lines. The resume looks for them from this boot's first entry instead.
#[test]
fn after_a_reboot_that_lost_the_journal_and_set_the_clock_back_the_resume_still_finds_the_ready_lines() {
    let (s, config, d) = pdctl_tests::stack_with_pdctld();
    let r = cli(&d, &config, &["host", "drain", "--allow-outage", "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    s.sandbox.systemctl(&["stop", &d.unit]).expect("stop pdctld");
    // The record as the last boot left it: another boot id, and each cursor in a journal that is
    // gone (another seqnum id and boot id), a day ahead of this boot's clock.
    let path = d.state.join("drains/maintenance/host.json");
    let mut rec: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("the record")).expect("JSON");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    let ahead_us = now.as_micros() + 86_400_000_000;
    let gone = format!("s={:032x};i=1;b={:032x};m=1;t={ahead_us:x};x=1", now.as_nanos() ^ 0x5eed, now.as_nanos() ^ 0xb007);
    assert!(rec["boot_id"].is_string(), "the drain recorded its boot: {rec:#}");
    rec["boot_id"] = Value::String(format!("{:032x}", now.as_nanos() ^ 0xb007));
    let mut replaced = 0;
    for u in rec["units"].as_array_mut().expect("units") {
        assert!(u["cursor"].is_string(), "the drain recorded a cursor: {u}");
        u["cursor"] = Value::String(gone.clone());
        replaced += 1;
    }
    assert_eq!(replaced, 2);
    std::fs::write(&path, rec.to_string()).expect("rewrite the record");
    for u in [P, D] {
        s.sandbox.systemctl(&["start", "--no-block", u]).expect("start unit");
    }
    s.sandbox.systemctl(&["start", &d.unit]).expect("start pdctld");
    assert!(until(LIMIT, || host_status(&d)["maintenance"].is_null()), "resumed: {:#}", host_status(&d));
    let rec = newest(&d);
    assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("host_resume"), Some("succeeded")), "{rec:#}");
    for u in [P, D] {
        let ready = rec["events"]
            .as_array()
            .and_then(|es| es.iter().find(|e| e["unit"] == u && e["step"] == "ready" && e["status"] == "passed"))
            .map(|e| e["detail"].clone())
            .unwrap_or_default();
        assert_eq!(ready["pid"].as_u64().map(|p| p.to_string()), s.show(u, "MainPID").ok(), "{u}: the new run's ready line: {ready:#}");
    }
}

/// Two hosts of three behind one gateway, one slot of each role: host a's decode cannot start
/// after its reboot (a flag its server refuses). a's resume fails at the decode's ready gate and
/// a keeps its slots (pdctl_host_maintenance_failed = 1); host b's drain then waits for them and
/// stops nothing. Once a's decode is fixed, `pdctl host resume` passes and gives them back.
#[test]
fn a_host_whose_decode_fails_after_its_reboot_keeps_its_slots_and_the_next_host_waits() {
    let etcd = Etcd::start().expect("etcd");
    let hosts = three_hosts_behind_one_gateway(&etcd, |_| Vec::new());
    for (_, c, _) in &hosts {
        std::fs::write(c.parent().expect("dir").join("config.d/42-slot-wait.toml"), "[fleet]\nslot_timeout = \"15s\"\n").expect("slot wait");
    }
    let ((sa, ca, da), (sb, cb, db)) = (&hosts[0], &hosts[1]);
    let r = cli(da, ca, &["host", "drain", "--reason", "nvidia 570.133", "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    // The update changed something the decode cannot start with.
    let opts = pdctl_tests::pdctl_sandbox::stack::StackOptions { decode_args: vec!["--model-path".into(), "/models/dsv4".into()], ..Default::default() };
    let exec = sa.worker_unit(&sa.decode, &opts, &["--bogus-flag".into()]).lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
    let drop_in = sa.drop_in(D, "50-bad-flag", &format!("[Service]\nExecStart=\n{exec}\n")).expect("drop-in");
    reboot(sa, da);
    assert!(until(LIMIT, || host_status(da)["maintenance"]["phase"] == "failed"), "{:#}", host_status(da));
    let rec = newest(da);
    let failed = &rec["summary"]["failed"];
    assert_eq!((failed["unit"].as_str(), failed["step"].as_str()), (Some(D), Some("ready")), "{rec:#}");
    let metrics = pdctl_tests::pdctl_sandbox::stack::http_get(&da.metrics_url).expect("metrics").1;
    assert!(metrics.lines().any(|l| l == "pdctl_host_maintenance_failed 1"), "the alert's metric");
    let st = fleet_status(ca);
    assert!(st["slots"].to_string().contains("(host maintenance)"), "a still holds its slots: {st:#}");

    // b waits for the slots a keeps, and stops nothing.
    let b_runs = (sb.show(P, "InvocationID").expect("p"), sb.show(D, "InvocationID").expect("d"));
    let r = cli(db, cb, &["host", "drain", "--json"]);
    assert_eq!(r.summary["failed"]["cause_code"], "slot_timeout", "{:#}", r.summary);
    assert!(r.summary["failed"]["cause"].as_str().is_some_and(|c| c.contains("gpu-node-a/")), "a is named: {:#}", r.summary);
    assert_eq!((sb.show(P, "InvocationID").expect("p"), sb.show(D, "InvocationID").expect("d")), b_runs, "b stopped nothing");
    assert!(host_status(db)["maintenance"].is_null(), "b is not in maintenance");

    // Fixed: the resume passes and gives a's slots back.
    std::fs::remove_file(drop_in).expect("remove the drop-in");
    sa.sandbox.daemon_reload().expect("reload");
    let r = cli(da, ca, &["host", "resume", "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert!(host_status(da)["maintenance"].is_null());
    assert!(!fleet_status(ca)["slots"].to_string().contains("(host maintenance)"), "a's slots are given back");
}

/// One answer to "is this the only worker of its role?": a second pair behind the same gateway
/// stands for another host's (pdctld knows this host's pair only), `allow_outage = false`. A
/// restart of this host's prefill and a drain of this host count the other host's admitted
/// prefill alike and go ahead (the restart used to be refused as "the only prefill worker" while
/// the drain of both was allowed); with that prefill out of the gateway both refuse, each saying
/// the count it used.
#[test]
fn a_prefill_on_another_host_counts_for_a_restart_and_a_host_drain_alike() {
    let (s, config, d) = pdctl_tests::stack_with_pdctld_opts(&pdctl_tests::pdctl_sandbox::stack::StackOptions { pairs: 2, ..Default::default() });
    for path in [config.clone(), d.config.clone()] {
        let text = std::fs::read_to_string(&path).expect("config");
        std::fs::write(&path, pdctl_tests::fleet_hosts::config_with_only(&text, &[P, D])).expect("config");
    }
    std::fs::write(config.parent().expect("dir").join("config.d/41-no-outage.toml"), "[rollout]\nallow_outage = false\n").expect("fragment");
    s.sandbox.systemctl(&["restart", &d.unit]).expect("pdctld starts again with this host's pair");
    assert!(until(LIMIT, || pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1["reconciling"] == false), "pdctld started");
    let sock = d.socket.display().to_string();

    let r = cli(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    assert_eq!(r.code, 0, "the other host's prefill serves: {:#} {}", r.summary, r.stderr);
    let (code, out, err) = pdctl(&config, &["host", "drain", "--dry-run", "--socket", &sock]);
    assert_eq!(code, 0, "{out}{err}");

    let router = s.router.clone().expect("router").url;
    let other = s.workers().into_iter().find(|w| w.role == "prefill" && w.unit != P).expect("the other prefill").clone();
    pdctl_tests::fleet_hosts::gateway_worker(&router, &other, false);
    let counted = "the gateway admits 0 other prefill worker(s) of 1 it lists";
    let (code, out, _) = pdctl(&config, &["restart", "--rolling", "--unit", P, "--dry-run", "--socket", &sock]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(counted), "{out}");
    let (code, out, _) = pdctl(&config, &["host", "drain", "--dry-run", "--socket", &sock]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(counted), "{out}");
    assert!(healthy_on(&router).len() == 3, "nothing else was touched");
}
