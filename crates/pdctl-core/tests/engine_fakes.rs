//! The rollout state machine against in-memory fakes of systemd, the journal and the probes:
//! ordering, halting, pairs, the gateway's take-out, and what is never touched. (The same gates
//! are proven against the real parts in tests/rollout.rs.)

mod fakes;

use fakes::*;

#[tokio::test]
async fn restarts_in_role_order_one_at_a_time_and_skips_the_old_ready_line() {
    let w = world();
    let (summary, events) = run(&w, settings()).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service", "d.service"]);
    let pos = |u: &str, s: Step, st: Status| events.iter().position(|e| e.unit == u && e.step == s && e.status == st).unwrap();
    assert!(pos("p.service", Step::Soak, Status::Passed) < pos("d.service", Step::Restart, Status::Started));
    let ready = &events[pos("p.service", Step::Ready, Status::Passed)].detail;
    assert_eq!(ready["pid"], 101, "the new run's line, not the old process's flush");
    assert_eq!(ready["ignored_ready_lines_of_other_runs"], 1);
}

#[tokio::test]
async fn a_failed_gate_halts_and_the_next_unit_is_never_touched() {
    let w = world();
    w.lock().unwrap().unhealthy.push("http://p".into());
    let (summary, events) = run(&w, settings()).await;
    assert_eq!(summary.result, Outcome::Failed);
    let f = summary.failed.unwrap();
    assert_eq!((f.unit.as_str(), f.step), ("p.service", Step::Health));
    assert_eq!(f.cause_code, "health_timeout");
    assert_eq!(f.last_lines, vec!["last line"]);
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "decode never restarted");
    assert!(!events.iter().any(|e| e.unit == "d.service" && e.step != Step::Preflight));
}

#[tokio::test]
async fn overlapping_gpus_are_refused_before_anything_restarts() {
    let w = world();
    // The units' own CUDA_VISIBLE_DEVICES (config cannot see these; preflight reads them).
    w.lock().unwrap().env.insert("d.service".into(), vec!["CUDA_VISIBLE_DEVICES=3,4,5,6,7".into()]);
    let (summary, _) = run(&w, settings()).await;
    let f = summary.failed.unwrap();
    assert_eq!((f.unit.as_str(), f.step), ("d.service", Step::Preflight));
    assert!(f.cause.contains("overlap"), "{}", f.cause);
    assert_eq!(f.cause_code, "gpu_overlap");
    assert!(w.lock().unwrap().restarted.is_empty());
}

#[tokio::test]
async fn unknown_unit_is_a_config_failure() {
    let w = world();
    w.lock().unwrap().states.remove("d.service");
    let (summary, _) = run(&w, settings()).await;
    let f = summary.failed.unwrap();
    assert_eq!(f.kind, pdctl_core::events::FailureKind::Config);
    assert_eq!(f.cause_code, "unit_missing");
    assert!(w.lock().unwrap().restarted.is_empty());
}

#[tokio::test]
async fn a_drain_of_a_crash_looping_worker_is_reported_not_waited_for() {
    use pdctl_core::state::drain_ledger::{Drain, Ledger};
    let w = world();
    w.lock().unwrap().unhealthy.push("http://p".into());
    if let Some(st) = w.lock().unwrap().states.get_mut("p.service") {
        st.active_state = "activating".into();
        st.sub_state = "auto-restart".into();
    }
    let dir = std::env::temp_dir().join(format!("pdctl-fake-ledger-{}", std::process::id()));
    let ledger = Ledger::open(&dir).unwrap();
    let d = Drain {
        unit: "p.service".into(),
        url: "http://p".into(),
        role: pdctl_core::config::Role::Prefill,
        bootstrap_port: None,
        invocation_id: "old".into(),
        router_id: "w1".into(),
        rollout_id: "r1".into(),
        drained_at: 0,
        hold: None,
    };
    ledger.record(&d).unwrap();
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: settings(), coordinator: None };
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    // A budget of 5 minutes: a crash loop is not coming up, so it must not be waited out (the
    // rollout lock is held meanwhile). The bound only keeps a regression from hanging the suite.
    let r = tokio::time::timeout(Duration::from_secs(60), engine.reconcile(&d, &ledger, Duration::from_secs(300), &tx)).await.expect("not waited out");
    let cause = r.unwrap_err();
    assert_eq!(cause.code(), "drain_not_restored");
    assert!(cause.sentence().contains("auto-restart"), "{}", cause.sentence());
    assert!(ledger.get("p.service").is_some(), "the drain stays on record");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_stale_decode_found_by_the_pair_gate_is_repaired_before_the_prefill_is_re_admitted() {
    let w = world();
    w.lock().unwrap().stale_cache = true;
    let (summary, events) = run_only(&w, settings(), &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service", "d.service"], "the decode restarted as a repair");
    assert_eq!(summary.units, vec!["d.service", "p.service"]);
    assert_eq!(summary.repairs.get("d.service").map(String::as_str), Some("p.service"));
    let pos = |u: &str, s: Step, st: Status| events.iter().position(|e| e.unit == u && e.step == s && e.status == st).unwrap();
    let pair = &events[pos("p.service", Step::Pair, Status::Passed)];
    assert_eq!(pair.detail["stale"][0], "d.service");
    // Two probes: a fixed decode would have answered the second.
    assert_eq!(pair.detail["pairs"][0]["probes"].as_array().unwrap().len(), 2);
    // The decode went through every gate (its own pair gate included) before the prefill's router gate.
    assert!(pos("d.service", Step::Soak, Status::Passed) < pos("p.service", Step::Router, Status::Started));
    assert!(pos("d.service", Step::Pair, Status::Passed) < pos("d.service", Step::Soak, Status::Passed));
    assert!(events.iter().filter(|e| e.unit == "d.service" && e.step != Step::Preflight).all(|e| e.repair_of.as_deref() == Some("p.service")));
    assert!(events.iter().filter(|e| e.unit == "p.service").all(|e| e.repair_of.is_none()));
}

#[tokio::test]
async fn on_stale_pair_halt_stops_naming_the_decode_and_restarts_nothing_else() {
    let w = world();
    w.lock().unwrap().stale_cache = true;
    let (summary, _) = run_only(&w, with("on_stale_pair = \"halt\"\n"), &["p.service".into()]).await;
    let f = summary.failed.expect("halted");
    assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Pair, "stale_pair"));
    assert!(f.cause.starts_with("d.service still uses the bootstrap info of p.service"), "{}", f.cause);
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"]);
}

#[tokio::test]
async fn a_fixed_decode_needs_no_repair_and_the_pair_gate_probes_only_the_restarted_workers_pairs() {
    let w = world();
    let (summary, events) = run_only(&w, settings(), &["d.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert!(summary.repairs.is_empty());
    assert_eq!(w.lock().unwrap().pairs, vec![("http://p".to_string(), "http://d".to_string())]);
    assert!(events.iter().any(|e| e.unit == "d.service" && e.step == Step::StrandedKv && e.status == Status::Passed));
}

#[tokio::test]
async fn a_stale_decode_that_is_the_only_one_is_not_repaired_without_allow_outage() {
    let w = world();
    w.lock().unwrap().stale_cache = true;
    w.lock().unwrap().states.insert("p2.service".into(), state("old2", 30));
    w.lock().unwrap().env.insert("p2.service".into(), vec!["CUDA_VISIBLE_DEVICES=8".into()]);
    let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"p2.service\"\nrole = \"prefill\"\nurl = \"http://p2\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n";
    let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
    let plan = Plan::new(&s, &["p.service".into()]).unwrap();
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let abort = std::sync::atomic::AtomicBool::new(false);
    let run = rollout_of(&plan, &abort, false, false);
    let f = engine.execute(run, &tx).await.summary.failed.expect("halted");
    assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Pair, "repair_blocked"));
    assert!(f.cause.contains("only decode worker") && f.cause.contains("--allow-outage"), "{}", f.cause);
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "the decode is not restarted");
}

/// A plain restart does not load a unit change systemd has not loaded yet: refused in preflight
/// (`changes_pending`, naming `--load-changes`), nothing reloaded or restarted; with
/// `load_changes` (a config rollout, or the flag) it reloads and restarts.
#[tokio::test]
async fn a_plain_restart_refuses_changes_it_would_load() {
    for load_changes in [false, true] {
        let w = world();
        w.lock().unwrap().need_reload.push("p.service".into());
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
             [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
             [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\nallow_outage = true\n\
             [verify]\nrouter = false\n";
        let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
        let plan = Plan::new(&s, &["p.service".into()]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = rollout_of(&plan, &abort, true, load_changes);
        let summary = engine.execute(run, &tx).await.summary;
        let world = w.lock().unwrap();
        if load_changes {
            assert!(summary.failed.is_none(), "{summary:?}");
            assert_eq!((world.reloads, world.restarted.clone()), (1, vec!["p.service".to_string()]));
        } else {
            let f = summary.failed.expect("refused");
            assert_eq!((f.step, f.cause_code.as_str()), (Step::Preflight, "changes_pending"));
            assert!(f.cause.contains("NeedDaemonReload") && f.next.contains("--load-changes"), "{f:?}");
            assert_eq!((world.reloads, world.restarted.len()), (0, 0), "nothing reloaded or restarted");
        }
    }
}

/// The first-day baseline (what a running process started with, the revision a rollback
/// restores) is taken only from a settled run: one that a crash loop replaces within
/// `min_healthy` is not recorded as good; a run that stays up is, after waiting out the rest.
#[tokio::test]
async fn a_crash_looping_run_is_never_recorded_as_the_good_revision() {
    for crash in [true, false] {
        let w = world();
        let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
        w.lock().unwrap().states.get_mut("p.service").unwrap().exec_main_start_us = now_us;
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n[rollout]\nmin_healthy = \"1s\"\n";
        let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let dir = std::env::temp_dir().join(format!("pdctl-baseline-{}-{crash}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if crash {
            // systemd restarts it 300 ms later (Restart=on-failure): a new run.
            let w2 = w.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut w = w2.lock().unwrap();
                let st = w.states.get_mut("p.service").unwrap();
                st.invocation_id = "crashed-and-restarted".into();
                st.n_restarts = 1;
            });
        }
        engine.staleness(&dir).await.unwrap();
        assert_eq!(pdctl_core::state::revisions::load(&dir, "p.service").is_some(), !crash, "crash loop: {crash}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test]
async fn a_worker_the_gateway_lists_failed_is_removed_and_re_added() {
    let w = world();
    let s = with_router(&w, true);
    // The prefill's re-registration comes up `failed` (smg gives up on it); the next one is fine.
    w.lock().unwrap().router.as_mut().unwrap().statuses = vec!["failed".into()];
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let router = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Router && e.status == Status::Passed).expect("router gate passed");
    assert_eq!(router.detail["re_added_after"], "failed", "{}", router.detail);
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    assert_eq!(log.iter().filter(|l| l.starts_with("register http://p")).count(), 2, "registered, removed, registered again: {log:?}");
    assert!(log.iter().any(|l| l.starts_with("deregister w3")), "the failed entry was removed: {log:?}");
}

#[tokio::test]
async fn the_only_worker_of_its_role_is_taken_out_by_its_restart_not_before_it() {
    let w = world();
    let s = with_router(&w, true);
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let passed = |step: Step| events.iter().find(|e| e.unit == "p.service" && e.step == step && e.status == Status::Passed).expect("passed").detail.clone();
    let drain = passed(Step::Drain);
    assert!(drain["taken_out"].as_str().is_some_and(|t| t.starts_with("deferred")), "{drain}");
    let restart = passed(Step::Restart);
    assert!(restart["taken_out"]["when"].as_str().is_some_and(|t| t.contains("restart job ended")), "no drain check in these logs: {restart}");
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    let at = |prefix: &str| log.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {log:?}"));
    assert!(at("settle_now w1") < at("deregister w1 after 1 restart(s)"), "settle 0 set first, the removal during the restart: {log:?}");
    // The drain was written down before anything touched the gateway, and undone at re-admission.
    assert!(w.lock().unwrap().router.as_ref().unwrap().workers.iter().any(|x| x.url == "http://p"), "re-admitted");
}

/// A deferred worker whose old process is gone before any drain check was logged (killed,
/// crashed) serves nothing: it is taken out then, not when the restart job ends.
#[tokio::test]
async fn a_deferred_worker_whose_old_process_is_gone_is_taken_out_then() {
    let w = world();
    let s = with_router(&w, true);
    w.lock().unwrap().restart_takes = Some(Duration::from_secs(2));
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let restart =
        events.iter().find(|e| e.unit == "p.service" && e.step == Step::Restart && e.status == Status::Passed).expect("restart passed").detail.clone();
    assert!(restart["taken_out"]["when"].as_str().is_some_and(|t| t.contains("old process was gone")), "{restart}");
    assert!(restart["taken_out"]["after_ms"].as_u64().is_some_and(|ms| ms < 2000), "before the job ended: {restart}");
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    assert!(log.iter().any(|l| l.starts_with("deregister w1 after 0 restart(s)")), "out while the restart job ran: {log:?}");
}

/// A deferred worker whose stop logs no drain check (the fake's journal has none) and whose old
/// process keeps running is taken out at its deadline after SIGTERM — 5 s × (1 − the share of
/// looks that found it busy), 5 s for this idle one — not only when the restart job ends.
#[tokio::test]
async fn a_deferred_worker_is_taken_out_by_its_deadline_when_no_drain_check_comes() {
    let w = world();
    let s = with_router(&w, true);
    {
        let mut world = w.lock().unwrap();
        (world.restart_takes, world.old_process_stays) = (Some(Duration::from_secs(7)), true);
    }
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let passed = |step: Step| events.iter().find(|e| e.unit == "p.service" && e.step == step && e.status == Status::Passed).expect("passed").detail.clone();
    assert_eq!(passed(Step::Drain)["take_out_by_ms"], 5000, "idle in every look");
    let restart = passed(Step::Restart);
    let taken = &restart["taken_out"];
    assert!(taken["when"].as_str().is_some_and(|t| t.starts_with("5.0 s after its SIGTERM")), "{restart}");
    assert!(taken["after_ms"].as_u64().is_some_and(|ms| (5000..7000).contains(&ms)), "at its deadline, before the job ended: {restart}");
}

/// A stop that would SIGKILL the only worker of its role before SGLang's first drain check (5 s
/// after SIGTERM) would kill it while the gateway still routes to it: its drain takes it out
/// before the stop, as for any other worker, and says why it was not deferred.
#[tokio::test]
async fn the_only_worker_whose_stop_ends_before_the_first_drain_check_is_taken_out_before_it() {
    let w = world();
    let s = with_router(&w, true);
    w.lock().unwrap().timeout_stop.insert("p.service".into(), Duration::from_secs(1));
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let drain = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Drain && e.status == Status::Passed).expect("drain passed").detail.clone();
    assert!(drain["not_deferred"].as_str().is_some_and(|t| t.contains("TimeoutStopSec=1.0s")), "{drain}");
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    let at = |prefix: &str| log.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {log:?}"));
    assert!(at("deregister w1 after 0 restart(s)") < at("register http://p"), "out before its restart: {log:?}");
}

/// Where the servers serve `/ready` (0.5.23), a PD worker's health gate and its pair gate's
/// check of the peer ask `/ready` alone: 0.5.23's `/health` sleeps 1 s in its generate, and the
/// pair gate's PD request proves generation. Without `/ready` both ask `/health`, as before.
#[tokio::test]
async fn pd_health_and_the_pair_peer_check_ask_ready_where_it_is_served() {
    let w = world();
    w.lock().unwrap().ready_served = true;
    let (summary, events) = run_only(&w, settings(), &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let health = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Health && e.status == Status::Passed).expect("health passed");
    assert_eq!(health.detail["checked"], serde_json::json!(["/ready"]), "{}", health.detail);
    assert!(w.lock().unwrap().pairs.iter().any(|(p, d)| p == "http://p" && d == "http://d"), "the pair was probed");
    assert_eq!(w.lock().unwrap().health_asked, Vec::<String>::new(), "no /health: neither the worker's nor its peer's");

    let w = world();
    let (summary, _) = run_only(&w, settings(), &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let asked = w.lock().unwrap().health_asked.clone();
    assert!(asked.iter().any(|u| u == "http://p") && asked.iter().any(|u| u == "http://d"), "without /ready: /health of both: {asked:?}");
}

#[tokio::test]
async fn re_admitting_a_prefill_while_the_gateway_lists_no_decode_ends_at_once() {
    let w = world();
    let s = with_router(&w, false);
    w.lock().unwrap().router.as_mut().unwrap().smoke_fails = true;
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Failed, "{summary:?}");
    let f = summary.failed.as_ref().expect("a failure");
    assert_eq!((f.step, f.cause_code.as_str()), (Step::Router, "peer_role_down"), "{f:?}");
    let failed = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Router && e.status == Status::Failed).expect("router gate failed");
    assert!(failed.detail["ended_early"].as_str().unwrap_or("").contains("lists no decode worker"), "{}", failed.detail);
    assert!(
        w.lock().unwrap().router.as_ref().unwrap().workers.iter().any(|x| x.url == "http://p" && x.status.as_deref() == Some("ready")),
        "the prefill is left admitted"
    );
}

#[tokio::test]
async fn a_stale_decodes_requests_left_after_the_drain_are_aborted_before_its_repair() {
    let w = world();
    // The gateway (the settings below add drain_timeout = 1s to those of `with_router`).
    let _ = with_router(&w, true);
    // The decode's requests wait for KV from the restarted prefill's old process: they never end.
    w.lock().unwrap().stale_cache = true;
    w.lock().unwrap().in_flight.insert("http://d".into(), 2);
    let text = "[router]\nurl = \"http://r:1\"\n[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\ndrain_timeout = \"1s\"\nallow_outage = true\n\
         [verify]\nmetrics = \"off\"\navailability_probe = \"off\"\n";
    let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert_eq!(w.lock().unwrap().aborted, vec!["http://d"], "only the stale decode's requests were aborted");
    let drain = events.iter().find(|e| e.unit == "d.service" && e.step == Step::Drain && e.status == Status::Passed).expect("the repair drained the decode");
    assert_eq!(drain.detail["aborted"], 2, "{}", drain.detail);
    assert!(drain.detail["aborted_why"].as_str().unwrap_or("").contains("stale"), "{}", drain.detail);
    let p_drain = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Drain && e.status == Status::Passed).expect("the prefill's drain");
    assert_eq!(p_drain.detail["aborted"], serde_json::Value::Null, "nothing aborted outside a repair by default");
}

#[tokio::test]
async fn the_stranded_kv_wait_covers_the_gauges_idle_publish_only_when_read_from_gauges() {
    // A prefill holds one room when the decode restarts; the next read finds it released.
    for (source, limit_ms) in [("/v1/loads", 310_000), ("/metrics", 340_000)] {
        let w = world();
        w.lock().unwrap().held = vec![PdQueues { held_reqs: 1.0, used_tokens: 9.0, source }];
        let (summary, events) = run(&w, settings()).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let s = &events
            .iter()
            .find(|e| e.unit == "d.service" && e.step == Step::StrandedKv && e.status == Status::Passed)
            .expect("the stranded-KV gate ran")
            .detail;
        assert_eq!(s["held_at_start"]["p.service"]["source"], source, "{s}");
        assert_eq!(s["released"], true, "{s}");
        // The bootstrap timeout's default (300 s) + 10 s, + SGLang's 30 s idle publish when the
        // held rooms were read from the lagging gauges.
        assert_eq!(s["limit_ms"], limit_ms, "{s}");
    }
}
