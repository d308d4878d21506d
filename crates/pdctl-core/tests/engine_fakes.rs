//! The whole rollout against in-memory fakes of systemd, the journal and the probes: its order,
//! halting at a failed gate, refusals before anything restarts, and the first day's baseline.
//! Each gate's own tests sit next to it (`src/engine/gates/*.rs`, `mod over_fakes`); the same
//! gates are proven against the real parts in tests/rollout.rs.

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
