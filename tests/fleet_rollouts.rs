//! Fleet rollouts (`pdctl fleet restart`, `fleet weights`) across hosts coordinated through a real
//! etcd: every host's part through its own gates with an audit trail, a long history pruned, the
//! canary (failed, slow), the bake's revert, a restart storm's pause, a stale pair repaired by the
//! other host, new weights in step, and a model change switched with no mixed pair.

use std::path::PathBuf;
use std::time::Duration;

use pdctl_tests::fleet_hosts::*;
use pdctl_tests::pdctl_sandbox::etcd::Etcd;
use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack, StackOptions};
use pdctl_tests::{pdctl_daemon, raw_api};
use serde_json::Value;

#[path = "fleet_rollouts/switch.rs"]
mod switch;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

#[test]
fn a_fleet_rollout_runs_every_hosts_part_serialized_by_slots_with_an_audit_trail() {
    let etcd = Etcd::start().expect("etcd");
    // A long history (5,000 finished fleet rollouts, more than one range read may carry) and a
    // corrupt host's liveness value: neither stops the fleet, and retention prunes the history.
    seed_history(&etcd.url(), &["gpu-node-a", "gpu-node-b"], 5_000);
    let (_a, ca, da) = host(&etcd.url(), "gpu-node-a");
    let (_b, _cb, db) = host(&etcd.url(), "gpu-node-b");
    // Both hosts alive in etcd before the request names them.
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(&ca);
        alive(&s, "gpu-node-a") && alive(&s, "gpu-node-b")
    }));
    let (code, lines, err) = fleet_restart(&ca, &da, &["--reason", "new flags for dsv4"]);
    assert_eq!(code, 0, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["result"], "succeeded", "{last:#}");
    assert_eq!(last["hosts"]["gpu-node-a"], "succeeded");
    assert_eq!(last["hosts"]["gpu-node-b"], "succeeded");
    for h in ["gpu-node-a", "gpu-node-b"] {
        for u in [P, D] {
            assert!(lines.iter().any(|e| e["host"] == h && is(e, u, "soak", "passed")), "{h} {u} verified");
        }
    }
    for role in ["prefill", "decode"] {
        let (max, seen) = max_holders_ever(&etcd.url(), role);
        assert_eq!(max, 1, "{role}: never two at once across hosts: {seen:?}");
    }
    // Each host's record says who started it and why.
    for d in [&da, &db] {
        let (_, h) = raw_api(&d.socket, "GET", "/v1/rollouts", "");
        let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|r| r["id"].as_str()).expect("a rollout").to_string();
        let (_, rec) = raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
        let by = &rec["started_by"];
        assert_eq!(by["fleet_rollout"], last["id"], "{rec:#}");
        assert!(by["fleet_by"].as_str().unwrap_or("").starts_with("uid 0 on gpu-node-a"), "{by}");
        assert_eq!(by["reason"], "new flags for dsv4");
    }
    // Retention at each pdctld's start kept the newest 200 finished rollouts (`keep_rollouts`'
    // default) of the 5,000; with this one, 201.
    assert!(until(Duration::from_secs(120), || requests_in_etcd(&etcd.url()) <= 201), "pruned to 200: {}", requests_in_etcd(&etcd.url()));
    let (code, out, err) = pdctl(&ca, &["fleet", "watch", last["id"].as_str().expect("id"), "--json"]);
    assert_eq!(code, 0, "the new rollout is kept: {out}{err}");
}

#[test]
fn a_failed_canary_halts_the_fleet_rollout_before_any_other_host_starts() {
    let etcd = Etcd::start().expect("etcd");
    let (a, ca, da) = host(&etcd.url(), "gpu-node-a");
    let (b, _cb, _db) = host(&etcd.url(), "gpu-node-b");
    std::fs::write(ca.parent().expect("dir").join("config.d/31-canary.toml"), "[fleet]\ncanary = \"gpu-node-a\"\n").expect("canary");
    // The canary's prefill gets a flag its SGLang does not know: it fails at start.
    a.drop_in(
        P,
        "50-bad-flag",
        &format!(
            "[Service]\nExecStart=\n{}\n",
            a.worker_unit(&a.prefill, &StackOptions::default(), &["--bogus-flag".into()]).lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart")
        ),
    )
    .expect("drop-in");
    let b_prefill = b.show(P, "InvocationID").expect("b prefill");
    let b_decode = b.show(D, "InvocationID").expect("b decode");
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(&ca);
        alive(&s, "gpu-node-a") && alive(&s, "gpu-node-b")
    }));
    let (code, lines, err) = fleet_restart(&ca, &da, &["--load-changes"]);
    assert_eq!(code, 1, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["result"], "failed", "{last:#}");
    assert_eq!(last["hosts"]["gpu-node-a"], "failed");
    assert_eq!(last["hosts"]["gpu-node-b"], "not_started");
    assert!(!lines.iter().any(|e| e["host"] == "gpu-node-b"), "host b printed no event: it never started");
    let failed = lines.iter().find(|e| e["host"] == "gpu-node-a" && e["status"] == "failed").expect("a's failed step");
    assert_eq!((failed["unit"].as_str(), failed["step"].as_str()), (Some(P), Some("ready")), "the bad flag is rejected at start: {failed:#}");
    assert_eq!(b.show(P, "InvocationID").expect("b prefill"), b_prefill);
    assert_eq!(b.show(D, "InvocationID").expect("b decode"), b_decode);
}

/// Three hosts serving the same traffic; the canary's change makes its prefill 3× slower after a
/// good start. Its soak judges it against the other hosts' prefills over the same window (read
/// from their liveness keys): the canary halts on `slo_regression` and no other host starts.
#[test]
fn a_slow_canary_is_judged_against_the_other_hosts_and_stops_the_fleet_before_any_other_host() {
    let etcd = Etcd::start().expect("etcd");
    let opts = StackOptions { prefill_args: vec!["--sim-prefill-secs".into(), "0.3".into()], ..Default::default() };
    let hosts: Vec<(Stack, PathBuf, Pdctld)> = ["gpu-node-a", "gpu-node-b", "gpu-node-c"].iter().map(|h| host_with(&etcd.url(), h, &opts)).collect();
    for (_, c, _) in &hosts {
        std::fs::write(
            c.parent().expect("dir").join("config.d/32-slo.toml"),
            "[rollout]\nmin_healthy = \"3s\"\n[verify.slo]\nmin_requests = 20\nmax_wait = \"60s\"\n",
        )
        .expect("slo");
    }
    let (a, ca, _) = &hosts[0];
    std::fs::write(ca.parent().expect("dir").join("config.d/31-canary.toml"), "[fleet]\ncanary = \"gpu-node-a\"\n").expect("canary");
    a.drop_in(P, "50-slow", "[Service]\nEnvironment=SGLANG_SIM_SLOWDOWN=3\n").expect("drop-in");
    let before: Vec<(String, String)> =
        hosts[1..].iter().map(|(s, _, _)| (s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d"))).collect();
    let (code, lines, err) = fleet_restart_under_load(&hosts, &["--load-changes"]);
    assert_eq!(code, 1, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["result"], "failed", "{last:#}");
    assert_eq!(
        (last["hosts"]["gpu-node-a"].as_str(), last["hosts"]["gpu-node-b"].as_str(), last["hosts"]["gpu-node-c"].as_str()),
        (Some("failed"), Some("not_started"), Some("not_started")),
        "{last:#}"
    );
    let failed = lines.iter().find(|e| e["host"] == "gpu-node-a" && e["status"] == "failed").expect("a's failed step");
    assert_eq!((failed["unit"].as_str(), failed["step"].as_str()), (Some(P), Some("soak")), "{failed:#}");
    assert_eq!(failed["detail"]["cause_code"], "slo_regression", "{failed:#}");
    let cause = failed["detail"]["cause"].as_str().expect("cause");
    assert!(cause.contains("gpu-node-b/") && cause.contains("gpu-node-c/") && cause.contains("end-to-end latency p50"), "{cause}");
    assert!(!lines.iter().any(|e| e["host"] == "gpu-node-b" || e["host"] == "gpu-node-c"), "no other host printed an event: none started");
    for ((s, _, _), (p0, d0)) in hosts[1..].iter().zip(&before) {
        assert_eq!((&s.show(P, "InvocationID").expect("p"), &s.show(D, "InvocationID").expect("d")), (p0, d0));
    }
}

/// Three hosts under load; on every host a change makes the decode fail 30 % of its requests 45 s
/// after a good start (`SGLANG_SIM_FAULTS_AFTER`): each soak passes — the service gate sees the
/// change serve well — and the fleet rollout ends every host's part. The bake after the last
/// host judges every changed worker against its own figures from before its drain, sees the
/// breach, and reverts every changed host, the last to finish first, each through its gates:
/// the drop-ins are moved aside, the decodes restarted, the prefills (unchanged) left alone.
#[test]
fn a_breach_during_the_bake_reverts_every_changed_host_the_last_first() {
    let etcd = Etcd::start().expect("etcd");
    let names = ["gpu-node-a", "gpu-node-b", "gpu-node-c"];
    let hosts: Vec<(Stack, PathBuf, Pdctld)> = names.iter().map(|h| host(&etcd.url(), h)).collect();
    for (s, c, _) in &hosts {
        std::fs::write(
            c.parent().expect("dir").join("config.d/32-slo.toml"),
            "[rollout]\nmin_healthy = \"3s\"\n[verify.slo]\nmin_requests = 20\nmax_wait = \"60s\"\n[fleet]\nbake = \"60s\"\n",
        )
        .expect("slo and bake");
        // A change that fails 30 % of requests, late: an hour after its start — brought forward
        // to the moment the bake begins (`/sim/faults_now`), so that it sets in after every
        // host's gates however slow the machine, and within the bake however fast.
        s.drop_in(D, "50-late-fail", "[Service]\nEnvironment=SGLANG_SIM_FAIL_FRACTION=0.3\nEnvironment=SGLANG_SIM_FAULTS_AFTER=3600\n").expect("drop-in");
    }
    let (_, ca, _) = &hosts[0];
    let decodes: Vec<String> = hosts.iter().map(|(s, _, _)| s.workers().iter().find(|w| w.role == "decode").expect("a decode").url.clone()).collect();
    let mut late = false;
    let (code, lines, err) = fleet_restart_under_load_watching(&hosts, &["--load-changes"], |l| {
        if !late && l["bake"]["state"] == "baking" {
            late = true;
            for u in &decodes {
                http_post(&format!("{u}/sim/faults_now"), &Value::Null);
            }
        }
    });
    assert!(late, "the bake began: {lines:#?}");
    assert_eq!(code, 1, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    let failures: Vec<&Value> = lines.iter().filter(|e| e["status"] == "failed" || e.get("revert").is_some() || e.get("reverted").is_some()).collect();
    assert_eq!(last["result"], "rolled_back", "{last:#}\nfailed steps and reverts: {failures:#?}");
    for h in names {
        assert_eq!(last["hosts"][h], "succeeded", "every part passed its gates: {last:#}");
        assert_eq!(last["reverted"][h], "succeeded", "every changed host was reverted: {last:#}");
        for u in [P, D] {
            assert!(lines.iter().any(|e| e["host"] == h && is(e, u, "soak", "passed")), "{h} {u}: its soak passed before the fault set in");
        }
    }
    let bake = last["bake"].as_str().unwrap_or("");
    // The decode's failures are the pair's: either worker's figures may be the first judged.
    assert!(bake.starts_with("breach on gpu-node-") && (bake.contains(D) || bake.contains(P)) && bake.contains("error rate"), "{bake}");
    // The revert goes from the last host to finish to the first, each after the one before it.
    let revert = lines.iter().find_map(|l| l.get("revert")).cloned().expect("the revert request");
    let order: Vec<String> = revert["order"].as_array().expect("order").iter().filter_map(|h| h.as_str().map(String::from)).collect();
    let finished: Vec<String> = lines.iter().filter_map(|l| l.get("reverted")).filter_map(|r| r["host"].as_str().map(String::from)).collect();
    assert_eq!(finished, order, "reverts ended in the request's order");
    assert_eq!(order.len(), 3);
    let at = |f: &dyn Fn(&Value) -> bool| lines.iter().position(f).unwrap_or(usize::MAX);
    for h in names {
        // Each revert's own steps reach the fleet's watchers: its files put back, then its gates.
        let restored = at(&|e: &Value| e["host"] == h && is(e, D, "rollback", "passed"));
        let reverted = at(&|l: &Value| l["reverted"]["host"] == h);
        assert!(at(&|l: &Value| l.get("revert").is_some()) < restored && restored < reverted, "{h}: the request, its restore, its end, in order");
        assert!(lines[restored]["detail"]["restored"].as_array().is_some_and(|r| r.iter().any(|x| x.as_str().unwrap_or("").contains("50-late-fail.conf"))));
    }
    // An operator's view of the same rollout: the bake, the breach and the revert, then the
    // outcome and what to do next.
    let id = last["id"].as_str().expect("id");
    let (code, out, _) = pdctl(ca, &["fleet", "watch", id]);
    eprintln!("{out}");
    assert_eq!(code, 1, "{out}");
    assert!(out.lines().any(|l| l.contains("bake breach:") && l.contains("error rate")), "{out}");
    assert!(out.lines().any(|l| l.contains("bake breach on gpu-node-") && l.contains("reverting")), "{out}");
    let end = out.lines().last().unwrap_or("");
    assert!(
        end.starts_with(&format!("pdctl: ✗ fleet rollout {id} rolled back: bake breach on gpu-node-")) && end.contains("next: pdctl fleet status"),
        "{end}"
    );
    for (s, _, d) in &hosts {
        reverted_on_disk_and_on_record(s, d, &last["id"]);
    }
}

/// After a bake's revert, on one host: the decode's drop-in moved aside (not deleted) and its
/// fault gone; its record a verified revert of fleet rollout `fleet_id`'s part that restarted
/// only the decode.
fn reverted_on_disk_and_on_record(s: &Stack, d: &Pdctld, fleet_id: &Value) {
    // The decode runs its files from before: the drop-in is moved aside, the fault is gone.
    let dir = s.sandbox.unit_dir().join(format!("{D}.d"));
    assert!(!dir.join("50-late-fail.conf").exists(), "the change's drop-in is gone");
    let aside =
        std::fs::read_dir(&dir).expect("drop-in dir").flatten().any(|e| e.file_name().to_string_lossy().starts_with("50-late-fail.conf.pdctl-rejected-"));
    assert!(aside, "moved aside, not deleted");
    assert!(!s.show(D, "Environment").expect("env").contains("SGLANG_SIM_FAIL_FRACTION"));
    // Its record: a revert of the fleet rollout's part, verified; only the decode restarted.
    let (_, h) = raw_api(&d.socket, "GET", "/v1/rollouts", "");
    let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|r| r["id"].as_str()).expect("a rollout").to_string();
    let (_, rec) = raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("revert"), Some("succeeded")), "{rec:#}");
    assert_eq!(rec["plan"], serde_json::json!([D]), "the unchanged prefill is not restarted again: {rec:#}");
    assert_eq!(&rec["started_by"]["fleet_rollout"], fleet_id);
    assert!(rec["started_by"]["reason"].as_str().unwrap_or("").contains("bake"), "{rec:#}");
}

/// Five restarts pdctl did not make within a minute (a decode of host b crash-looping under
/// `Restart=always`; the rule: more than 4 within 1m) pause the fleet — no slot is granted —
/// and the pause says why, naming the host and unit. Once the loop is stopped an operator
/// unpauses, and the same restarts do not pause it again.
#[test]
fn a_restart_storm_on_one_host_pauses_the_fleet_and_says_why() {
    let etcd = Etcd::start().expect("etcd");
    let (_a, ca, _da) = host(&etcd.url(), "gpu-node-a");
    let (b, cb, _db) = host(&etcd.url(), "gpu-node-b");
    for c in [&ca, &cb] {
        std::fs::write(c.parent().expect("dir").join("config.d/33-storm.toml"), "[fleet.storm]\nrestarts = 4\nwithin = \"1m\"\n").expect("storm");
    }
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(&ca);
        alive(&s, "gpu-node-a") && alive(&s, "gpu-node-b") && s["paused"].is_null()
    }));
    let crash = b
        .drop_in(
            D,
            "50-crash-loop",
            "[Unit]\nStartLimitIntervalSec=0\n[Service]\nEnvironment=SGLANG_SIM_CRASH_AFTER_READY=0.2\nRestart=always\nRestartSec=100ms\n",
        )
        .expect("drop-in");
    b.sandbox.systemctl(&["restart", D]).expect("restart");
    let mut status = Value::Null;
    let paused = until(Duration::from_secs(90), || {
        status = fleet_status(&ca);
        !status["paused"].is_null()
    });
    assert!(paused, "the fleet was paused: {status:#}");
    let reason = status["paused"]["reason"].as_str().unwrap_or("");
    assert!(reason.starts_with("restart storm") && reason.contains(&format!("gpu-node-b/{D} ×")), "{reason}");
    assert!(status["paused"]["by"].as_str().unwrap_or("").starts_with("pdctld on gpu-node-"), "{status:#}");
    // The operator's view names them too.
    let (code, out, _) = pdctl(&ca, &["fleet", "status"]);
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.contains("restarts pdctl did not make") && l.contains(&format!("{D} ×"))), "{out}");
    assert!(out.contains("PAUSED by pdctld on") && out.contains("restart storm"), "{out}");
    // The loop stopped (no new restart: a manual start would count as one), an operator
    // unpauses; the same restarts do not pause it again.
    std::fs::remove_file(&crash).expect("remove the drop-in");
    b.sandbox.daemon_reload().expect("reload");
    b.sandbox.systemctl(&["stop", D]).expect("stop");
    let (code, out, err) = pdctl(&ca, &["fleet", "unpause"]);
    assert_eq!(code, 0, "{out}{err}");
    // Two liveness periods (5 s each) of every host's pdctld.
    let repaused = until(Duration::from_secs(12), || !fleet_status(&ca)["paused"].is_null());
    assert!(!repaused, "not paused again for the restarts it was paused for");
}

#[test]
fn a_stale_decode_on_another_host_is_repaired_by_that_hosts_pdctld_through_the_fleet() {
    let etcd = Etcd::start().expect("etcd");
    let (a, ca, da) = host(&etcd.url(), "gpu-node-a");
    // Host b's decode is of an SGLang release before PR 36029.
    let (b, cb, db) = {
        let (stack, config, d) =
            pdctl_tests::stack_with_pdctld_opts(&StackOptions { decode_args: vec!["--sim-pair-cache".into(), "stale".into()], ..Default::default() });
        let frag = config.parent().expect("dir").join("config.d/30-fleet.toml");
        std::fs::write(
            &frag,
            format!("[fleet]\netcd = [\"{}\"]\nname = \"t\"\nhost = \"gpu-node-b\"\n[fleet.max_unavailable]\nprefill = 1\ndecode = 1\n", etcd.url()),
        )
        .expect("fleet");
        (stack, config, d)
    };
    // One gateway in front of both hosts: a's; b's workers join it, b's pdctld uses it.
    let ra = a.router.clone().expect("router");
    std::fs::write(
        cb.parent().expect("dir").join("config.d/40-router.toml"),
        format!("[router]\nurl = \"{}\"\nmetrics_url = \"{}\"\n", ra.url, ra.metrics_url),
    )
    .expect("router");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (boot_a, boot_b) = (a.prefill.bootstrap_port.expect("a bootstrap"), b.prefill.bootstrap_port.expect("b bootstrap"));
    rt.block_on(async {
        for (url, kind, bp) in [(&b.prefill.url, "prefill", Some(boot_b)), (&b.decode.url, "decode", None)] {
            let mut body = serde_json::json!({"url": url, "worker_type": kind});
            if let Some(p) = bp {
                body["bootstrap_port"] = serde_json::json!(p);
            }
            let r = pdctl_tests::http().post(format!("{}/workers", ra.url)).json(&body).send().await.expect("register");
            assert!(r.status().is_success(), "{}", r.status());
        }
        // b's decode has paired with a's prefill (the gateway would do this any time).
        let pair = serde_json::json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot_a, "bootstrap_room": 77});
        let (p, d) = tokio::join!(
            pdctl_tests::http().post(format!("{}/generate", a.prefill.url)).json(&pair).send(),
            pdctl_tests::http().post(format!("{}/generate", b.decode.url)).json(&pair).send()
        );
        assert_eq!(d.expect("decode").status(), 200);
        assert_eq!(p.expect("prefill").status(), 200);
    });
    assert!(until(Duration::from_secs(60), || healthy_on(&ra.url).len() == 4), "the gateway admits all four workers");
    assert!(
        until(Duration::from_secs(30), || {
            let s = fleet_status(&ca);
            s["hosts"].as_array().is_some_and(|h| {
                h.iter().any(|h| h["host"] == "gpu-node-b" && h["workers"].as_array().is_some_and(|w| w.iter().any(|w| w["url"] == b.decode.url.as_str())))
            })
        }),
        "host b's liveness names its decode's URL"
    );
    let d_b = b.show(D, "InvocationID").expect("b decode");
    let d_a = a.show(D, "InvocationID").expect("a decode");
    let r = pdctl_daemon(&da, &ca, &["restart", "--rolling", "--unit", P, "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let remote = format!("gpu-node-b/{D}");
    assert_eq!(r.summary["repairs"][&remote], P, "{:#}", r.summary);
    let pair = r.event(P, "pair", "passed");
    assert!(pairs_stale(pair).contains(&remote), "{pair:#}");
    assert_ne!(b.show(D, "InvocationID").expect("b decode"), d_b, "host b's pdctld restarted its decode");
    assert_eq!(a.show(D, "InvocationID").expect("a decode"), d_a, "a's own decode refreshed by itself: not restarted");
    // Host b's record of that repair says who asked and why.
    let (_, h) = raw_api(&db.socket, "GET", "/v1/rollouts", "");
    let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|x| x["id"].as_str()).expect("b's rollout").to_string();
    let (_, rec) = raw_api(&db.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert!(rec["started_by"]["reason"].as_str().unwrap_or("").contains(&format!("stale pairing with gpu-node-a/{P}")), "{rec:#}");
    assert_eq!(rec["plan"], serde_json::json!([D]));
}

/// `pdctl fleet weights` on three hosts behind **one shared gateway** (host a's: every host's
/// workers registered in it, every pdctld's `[router]` pointed at it, all load through it, so
/// any prefill pairs with any host's decode) under load: every host pauses, all load, all
/// continue only once every host serves the new weights — no request failed, none decoded KV of
/// another version (each decode's simulator counter), nothing restarted. A host whose decode
/// cannot load them makes every host load its previous weights back.
#[test]
fn fleet_weights_go_into_every_host_in_step_and_a_failed_host_puts_every_host_back() {
    for fail in [false, true] {
        let etcd = Etcd::start().expect("etcd");
        let hosts = three_hosts_behind_one_gateway(&etcd, |h| if fail && h == "gpu-node-c" { vec!["--sim-weights-fail".into()] } else { Vec::new() });
        let runs: Vec<(String, String)> =
            hosts.iter().map(|(s, _, _)| (s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d"))).collect();
        let (_, ca, da) = &hosts[0];
        let names: Vec<String> = hosts.iter().map(|(_, c, _)| host_of(c)).collect();
        let shared = hosts[0].0.router.clone().expect("router");
        let loads: Vec<pdctl_tests::Load> = (0..3).map(|_| pdctl_tests::Load::start(&shared.url, 8.0, 4)).collect();
        let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
        let out = std::process::Command::new(bin)
            .args(["fleet", "weights", "--model-path", "/models/dsv4-ft-1127", "--version", "ft-1127", "--json", "--socket"])
            .arg(&da.socket)
            .arg("--config")
            .arg(ca)
            .output()
            .expect("run pdctl");
        let mut failed = 0;
        for l in loads {
            failed += l.stop().1;
        }
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let last = lines.last().cloned().unwrap_or(Value::Null);
        assert_eq!(failed, 0, "every request was answered (fail = {fail})");
        let expected = if fail { "default" } else { "ft-1127" };
        for (i, (s, _, _)) in hosts.iter().enumerate() {
            for url in [&s.prefill.url, &s.decode.url] {
                let m = http_json(&format!("{url}/model_info"));
                assert_eq!(m["weight_version"], expected, "{} {url} (fail = {fail}): {last:#}", names[i]);
            }
            let metrics = http_text(&format!("{}/metrics", s.decode.url));
            let value =
                |name: &str| metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse::<f64>().ok());
            let (decoded, mixed) = (value("sglang_sim_pd_decoded_requests_total"), value("sglang_sim_pd_mixed_version_requests_total"));
            assert!(decoded.is_some_and(|d| d >= 10.0), "{}: PD requests were decoded: {decoded:?}", names[i]);
            assert_eq!(mixed, Some(0.0), "{}: no request decoded KV of another version", names[i]);
            assert_eq!((s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d")), runs[i], "nothing restarted");
        }
        if fail {
            assert_ne!(out.status.code(), Some(0), "{last:#}");
            assert_eq!(last["hosts"]["gpu-node-c"], "failed", "{last:#}");
            assert_eq!(last["result"], "failed", "{last:#}");
        } else {
            assert_eq!(out.status.code(), Some(0), "{lines:#?}");
            assert_eq!(last["result"], "succeeded", "{last:#}");
        }
    }
}
