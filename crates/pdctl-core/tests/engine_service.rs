//! The engine's service gate, the bake's look and new weights in place against in-memory fakes
//! of systemd, the journal and the probes (`fakes/`).

mod fakes;

use fakes::*;

#[tokio::test]
async fn alone_in_its_role_a_slower_worker_is_judged_against_its_own_figures_from_before_its_drain() {
    let w = world();
    // p's old process served 100 requests at 0.2-0.4 s; the new one starts at nothing and serves
    // 40 at 0.8-1.0 s (a change 3x slower). d is unchanged (its old process: 50 at 0.2-0.4 s).
    w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(40.0, 0.8, 1.0)]);
    let (summary, events) = run(&w, with_slo("min_requests = 20\n")).await;
    assert_eq!(summary.result, Outcome::Failed, "{summary:?}");
    let f = summary.failed.unwrap();
    assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Soak, "slo_regression"));
    assert!(
        f.cause.contains("its own figures from before its drain")
            && f.cause.contains("end-to-end latency p50 0.90 s vs 0.30 s (×3.0, limit ×1.5)")
            && f.cause.contains("over 40 and 100 requests"),
        "{}",
        f.cause
    );
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "no second unit after a failed gate");
    let failed = event(&events, "p.service", Step::Soak, Status::Failed);
    assert_eq!(failed.detail["slo"]["verdict"], "breach");
    assert_eq!(failed.detail["slo"]["figures"][0]["name"], "e2e_p50");
}

/// Too little traffic, by each `[verify.slo] unjudged`: `pass` says "not judged" and passes;
/// `fail` fails the soak (`slo_not_judged`); `probe` (the default) on a 1P1D host has no peer of
/// the role to sample against and fails the same, saying why — never a pass.
#[tokio::test]
async fn too_little_traffic_is_said_not_judged_and_a_same_speed_worker_passes() {
    for unjudged in ["fail", "probe"] {
        let w = world();
        w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(3.0, 0.8, 1.0)]);
        let (summary, _) = run(&w, with_slo(&format!("min_requests = 20\nmax_wait = \"0s\"\nunjudged = \"{unjudged}\"\n"))).await;
        let f = summary.failed.unwrap_or_else(|| panic!("{unjudged}: not judged is no pass"));
        assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Soak, "slo_not_judged"), "{unjudged}");
        assert_eq!(f.cause.contains("pdctl's own sample could not be sent: no other prefill worker serves"), unjudged == "probe", "{}", f.cause);
        assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "no second unit after a failed gate");
    }
    let w = world();
    w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(3.0, 0.8, 1.0)]);
    w.lock().unwrap().served.insert("http://d".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(30.0, 0.2, 0.4)]);
    let (summary, events) = run(&w, with_slo("min_requests = 20\nmax_wait = \"0s\"\nunjudged = \"pass\"\n")).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let soak = |u: &str| event(&events, u, Step::Soak, Status::Passed).detail.clone();
    let p = soak("p.service");
    assert_eq!(p["slo"]["verdict"], "not_judged");
    assert_eq!(p["note"], "p.service's service was not judged: 3 requests on the restarted worker, fewer than min_requests = 20");
    let d = soak("d.service");
    assert_eq!((d["slo"]["verdict"].as_str(), d["slo"]["requests"].as_u64(), d["slo"]["baseline_requests"].as_u64()), (Some("pass"), Some(30), Some(100)));
    assert!(d.get("note").is_none());
}

/// The fleet bake's look (`Engine::bake_look`): each watched worker's window since the bake began
/// against its own figures from before its drain — a slower one is a breach naming the figure and
/// both sample sizes, one whose baseline was not kept is "not judged" (never a pass), and an
/// unchanged one passes.
#[tokio::test]
async fn the_bakes_look_judges_each_changed_worker_against_its_own_figures_from_before_its_drain() {
    let w = world();
    // p: 3x slower since the bake began (40 more requests, at 0.8-1.0 s); d: same speed.
    w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(100.0, 0.2, 0.4).plus(&served(40.0, 0.8, 1.0))]);
    w.lock().unwrap().served.insert("http://d".into(), vec![served(50.0, 0.2, 0.4), served(90.0, 0.2, 0.4)]);
    let s = with_slo("min_requests = 20\n");
    let slo = s.verify.slo.expect("slo");
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
    let start = engine.bake_start(&["p.service".into(), "d.service".into()]).await;
    let before: std::collections::BTreeMap<String, ServiceScrape> =
        [("p.service".to_string(), served(500.0, 0.2, 0.4)), ("d.service".to_string(), served(300.0, 0.2, 0.4))].into();
    let looks = engine.bake_look(&start, &before, &slo).await;
    let by = |u: &str| looks.iter().find(|l| l.unit == u).expect("a look").clone();
    let p = by("p.service");
    assert!(matches!(p.report.verdict, pdctl_core::service::slo::Verdict::Breach { .. }), "{p:?}");
    assert_eq!(p.sentence(), "p.service: end-to-end latency p50 0.90 s vs 0.30 s (×3.0, limit ×1.5) (40 requests vs 500 before its drain)");
    assert_eq!(by("d.service").sentence(), "d.service: passed (40 requests vs 300 before its drain)");
    // Without its figures from before the drain (pdctld restarted since): not judged, said why.
    let looks = engine.bake_look(&start, &std::collections::BTreeMap::new(), &slo).await;
    assert!(looks.iter().all(|l| l.sentence().contains("not judged: its figures from before its drain were not kept")), "{looks:?}");
}

/// `pdctl rollout weights` on fakes: every worker is paused before any loads and continues only
/// after every one serves the new weights (so no request runs while two versions exist), nothing
/// restarts; a decode whose load fails puts the prefill back on its previous weights, and every
/// worker continues.
#[tokio::test]
async fn new_weights_pause_every_worker_load_them_all_then_continue_and_a_failed_load_puts_all_back() {
    use pdctl_core::engine::{RolloutRun, WeightsTarget};
    for fail in [false, true] {
        let w = world();
        if fail {
            w.lock().unwrap().weights_fail.push("http://d".into());
        }
        let s = settings();
        let plan = Plan::new(&s, &[]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = RolloutRun {
            work: pdctl_core::engine::Work::Weights {
                target: WeightsTarget { model_path: "/models/v2", version: Some("v2"), fleet_rollout: None, config: false },
            },
            ..rollout_of(&plan, &abort, true, false)
        };
        let summary = engine.execute(run, &tx).await.summary;
        drop(tx);
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        let log = w.lock().unwrap().weight_log.clone();
        let at = |p: &str| log.iter().position(|l| l.starts_with(p)).unwrap_or(usize::MAX);
        let last = |p: &str| log.iter().rposition(|l| l.starts_with(p)).unwrap_or(0);
        assert!(last("pause") < at("load"), "every worker paused before any loads: {log:?}");
        assert_eq!(at("pause http://d"), 0, "the decode first: {log:?}");
        assert!(w.lock().unwrap().restarted.is_empty(), "nothing restarted");
        let weights = w.lock().unwrap().weights.clone();
        if !fail {
            assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
            assert!(last("load") < at("continue"), "no worker continues before every one loaded: {log:?}");
            for u in ["http://p", "http://d"] {
                assert_eq!(weights.get(u), Some(&("/models/v2".to_string(), "v2".to_string())), "{u}");
            }
            let p = event(&events, "p.service", Step::Weights, Status::Passed);
            assert_eq!((p.detail["from"]["weight_version"].as_str(), p.detail["to"]["weight_version"].as_str()), (Some("default"), Some("v2")));
            assert!(events.iter().any(|e| e.unit == "p.service" && e.step == Step::Pair && e.status == Status::Passed), "the pair probed after the load");
        } else {
            let f = summary.failed.expect("failed");
            assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("d.service", Step::Weights, "weights_failed"));
            assert_eq!(weights.get("http://p"), Some(&("m".to_string(), "default".to_string())), "the prefill is back on its previous weights: {log:?}");
            assert!(log.iter().any(|l| l == "load http://p m"), "{log:?}");
            for u in ["http://p", "http://d"] {
                assert!(log.iter().any(|l| *l == format!("continue {u}")), "{u} continues: {log:?}");
            }
            assert!(events.iter().any(|e| e.unit == "p.service" && e.step == Step::Rollback && e.status == Status::Passed));
        }
    }
}

/// A config rollout's new weights that a worker does not take in place: with
/// `weights_fallback = "restart"` every worker first gets its previous weights back (and
/// continues), then the change is rolled out by restarting both through every gate; with the
/// default (`revert`) nothing restarts.
#[tokio::test]
async fn an_in_place_load_that_fails_falls_back_to_a_restart_only_when_configured() {
    use pdctl_core::config::WeightsFallback;
    use pdctl_core::engine::{RolloutRun, WeightsTarget};
    for fallback in [WeightsFallback::Revert, WeightsFallback::Restart] {
        let w = world();
        w.lock().unwrap().weights_fail.push("http://d".into());
        let mut s = settings();
        s.rollout.weights_fallback = fallback;
        let plan = Plan::new(&s, &[]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let dir = std::env::temp_dir().join(format!("pdctl-in-place-{}-{fallback:?}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let run = RolloutRun {
            work: pdctl_core::engine::Work::Weights { target: WeightsTarget { model_path: "/models/v2", version: None, fleet_rollout: None, config: true } },
            revisions: Some(&dir),
            ..rollout_of(&plan, &abort, true, true)
        };
        let finished = engine.execute(run, &tx).await;
        let weights = w.lock().unwrap().weights.clone();
        assert_eq!(weights.get("http://p"), Some(&("m".to_string(), "default".to_string())), "the prefill's previous weights are back first");
        let restarted = w.lock().unwrap().restarted.clone();
        match fallback {
            WeightsFallback::Revert => {
                assert_eq!(finished.summary.failed.map(|f| f.cause_code), Some("weights_failed".to_string()));
                assert!(restarted.is_empty() && finished.in_place, "{restarted:?}");
            }
            WeightsFallback::Restart => {
                assert_eq!(finished.summary.result, Outcome::Succeeded, "{:?}", finished.summary);
                assert_eq!(restarted, ["p.service", "d.service"], "restarted instead, in plan order");
                assert!(!finished.in_place && finished.notes.iter().any(|n| n.contains("rolled out by restarting instead")), "{:?}", finished.notes);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A prefill with an API key: decodes are paused `in_place`, not `retract` (0.5.23's decode
/// re-fetches a retracted request's KV through the prefill's `/generate` without the key, and
/// each would fail with 401); prefills are still retracted, and the record says why.
#[tokio::test]
async fn with_a_key_on_a_prefill_decodes_are_paused_in_place_and_the_notes_say_why() {
    use pdctl_core::engine::{RolloutRun, WeightsTarget};
    for keyed in [false, true] {
        let w = world();
        let mut s = settings();
        if keyed {
            for x in s.workers.iter_mut().filter(|x| x.role == pdctl_core::config::Role::Prefill) {
                x.api_key = Some(pdctl_core::config::KeySource::File("/etc/pdctl/prefill.key".into()));
            }
        }
        let plan = Plan::new(&s, &[]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = RolloutRun {
            work: pdctl_core::engine::Work::Weights {
                target: WeightsTarget { model_path: "/models/v2", version: Some("v2"), fleet_rollout: None, config: false },
            },
            ..rollout_of(&plan, &abort, true, false)
        };
        let out = engine.execute(run, &tx).await;
        assert_eq!(out.summary.result, Outcome::Succeeded, "{:?}", out.summary);
        let log = w.lock().unwrap().weight_log.clone();
        let decode = if keyed { "pause in_place http://d" } else { "pause http://d" };
        assert!(log.iter().any(|l| l == decode), "{keyed}: {log:?}");
        assert!(log.iter().any(|l| l == "pause http://p"), "a prefill is retracted either way: {log:?}");
        assert_eq!(out.notes.iter().any(|n| n.contains("paused in_place")), keyed, "{:?}", out.notes);
    }
}

/// On a decode-only host of a fleet (its prefills on other hosts, keyed), the decode is paused
/// `in_place`: a `retract` pause would have it re-fetch each retracted request's KV through a
/// prefill's `/generate` without the key (401). The keyed prefill is another host's, known only
/// from the gateway's list (it answers 401 without a key); this host's prefill has none.
#[tokio::test]
async fn a_decode_pauses_in_place_when_a_prefill_on_another_host_has_a_key() {
    use pdctl_core::engine::{RolloutRun, WeightsTarget};
    for keyed in [false, true] {
        let w = world();
        let mut r = FakeRouter::default();
        r.add("http://p", "prefill");
        r.add("http://d", "decode");
        r.add("http://other-host-p", "prefill");
        w.lock().unwrap().router = Some(r);
        if keyed {
            w.lock().unwrap().keyed.push("http://other-host-p".into());
        }
        let s = with("[router]\nurl = \"http://r:1\"\n[fleet]\netcd = [\"http://e:2379\"]\nname = \"f\"\nhost = \"a\"\n");
        let plan = Plan::new(&s, &[]).unwrap();
        let engine = Engine {
            units: FakeUnits(w.clone()),
            logs: FakeLogs(w.clone()),
            probes: FakeProbes(w.clone()),
            settings: s,
            coordinator: Some(std::sync::Arc::new(EmptyStore)),
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        drop(rx);
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = RolloutRun {
            work: pdctl_core::engine::Work::Weights { target: WeightsTarget { model_path: "/models/v2", version: None, fleet_rollout: None, config: false } },
            ..rollout_of(&plan, &abort, true, false)
        };
        let _ = engine.execute(run, &tx).await;
        let log = w.lock().unwrap().weight_log.clone();
        let want = if keyed { "pause in_place http://d" } else { "pause http://d" };
        assert_eq!(log.first().map(String::as_str), Some(want), "keyed: {keyed}: {log:?}");
    }
}
