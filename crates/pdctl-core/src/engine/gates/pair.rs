//! The pair gate: a PD request sent straight to each pair a restarted worker is in, judged with the
//! decode's own timing ([`crate::sglang::pairing`]).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cause::{Cause, Phase};
use crate::config::{Role, Worker};
use crate::details::{PairDetail, PairOutcome, PairResult};
use crate::engine::context::{Ctx, Stale};
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{crash_since, detail_of, within, Fail, Verdict, POLL};
use crate::engine::steps::{rule, NO_OTHER_ROLE};
use crate::events::Step;
use crate::ports::{Health, PairTarget, Probes, UnitState, Units};

/// The peers a worker pairs with: every configured worker of the other PD role.
pub(in crate::engine) fn peers<'e, U, L, P>(eng: &'e Engine<U, L, P>, w: &Worker) -> Vec<&'e Worker> {
    let other = match w.role {
        Role::Prefill => Role::Decode,
        Role::Decode => Role::Prefill,
        Role::Regular => return Vec::new(),
    };
    // Not itself: a worker changing role is still listed in its old one.
    eng.settings.workers.iter().filter(|o| o.role == other && o.unit != w.unit).collect()
}

/// The pair gate of a restarted worker: a PD request pair sent straight to it and each peer
/// that serves (a prefill with each decode, a decode with each prefill). A failed pair is
/// diagnosed from its signature; returns the decodes with a stale pairing when they are to
/// be repaired (`on_stale_pair = "restart-decode"`).
pub(in crate::engine) async fn pair<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    ctx: Ctx<'_>,
    after: &UnitState,
) -> Result<(Verdict<PairDetail>, Vec<Stale>), Fail> {
    if let Some(why) = rule(Step::Pair, &eng.settings).off_because {
        return Ok((Verdict::Skipped(why.to_string()), Vec::new()));
    }
    // This host's peers, and with [fleet] those of other hosts the gateway lists.
    let mut peers: Vec<(Worker, Option<(String, String)>)> = peers(eng, w).into_iter().map(|p| (p.clone(), None)).collect();
    peers.extend(gates::slot::remote_peers(eng, w).await);
    if peers.is_empty() {
        return Ok((Verdict::Skipped(NO_OTHER_ROLE.to_string()), Vec::new()));
    }
    let mut pairs = Vec::new();
    let mut stale: Vec<Stale> = Vec::new();
    let mut failed: Option<Fail> = None;
    for (peer, owner) in &peers {
        let (p, d) = if w.role == Role::Prefill { (w, peer) } else { (peer, w) };
        // A coherent switch pairs only workers of one model: a peer of the other group, or
        // one held out still running the old model, is not paired (its KV is another model's).
        if let Some(why) = other_model(peer, ctx) {
            pairs.push(PairResult { prefill: p.unit.clone(), decode: d.unit.clone(), result: PairOutcome::Skipped, why: Some(why), ..Default::default() });
            continue;
        }
        if let Err(why) = peer_serves(eng, peer, ctx.scope.together_with.is_some_and(|t| t.unit == peer.unit)).await {
            pairs.push(PairResult {
                prefill: p.unit.clone(),
                decode: d.unit.clone(),
                result: PairOutcome::Skipped,
                why: Some(format!("{} is not serving ({why}): its pairing is not checked", peer.unit)),
                ..Default::default()
            });
            continue;
        }
        let (verdict, refreshed, probes) = probe_pair(eng, p, d).await;
        pairs.push(PairResult {
            prefill: p.unit.clone(),
            decode: d.unit.clone(),
            result: if refreshed { PairOutcome::Refreshed } else { verdict.outcome() },
            probes: serde_json::to_value(&probes).ok(),
            at: Some(crate::lifecycle::now()),
            ..Default::default()
        });
        let cause = match verdict {
            crate::sglang::pairing::Verdict::Paired => continue,
            crate::sglang::pairing::Verdict::Stale
                if eng.settings.rollout.on_stale_pair == crate::config::OnStalePair::RestartDecode && w.role == Role::Prefill =>
            {
                stale.push(Stale { decode: d.clone(), owner: owner.clone() });
                continue;
            }
            v => failed_pair(v, p, d),
        };
        failed.get_or_insert(Fail { cause, detail: Value::Null, unit: None, last_lines: Vec::new() });
    }
    // A pair that failed because the restarted worker itself went down is that crash.
    if failed.is_some() {
        if let Some(crash) = crash_since(&eng.units, &w.unit, after, Phase::Pair).await? {
            failed = Some(crash);
        }
    }
    let detail =
        PairDetail { pairs, stale: stale.iter().map(|d| d.decode.unit.clone()).collect(), repair: (!stale.is_empty()).then(|| "restart-decode".to_string()) };
    match failed {
        Some(mut f) => {
            f.detail = detail_of(&detail);
            Err(f)
        }
        None => Ok((Verdict::passed(detail), stale)),
    }
}

/// The cause of a pair that did not pair (never `Paired`).
fn failed_pair(v: crate::sglang::pairing::Verdict, p: &Worker, d: &Worker) -> Cause {
    use crate::sglang::pairing::Verdict as V;
    let broken = |side: &str, error: String| Cause::PairBroken { prefill: p.unit.clone(), decode: d.unit.clone(), side: side.into(), error };
    match v {
        V::Paired | V::Stale => Cause::StalePair { decode: d.unit.clone(), prefill: p.unit.clone() },
        V::Incompatible(m) => {
            Cause::PairIncompatible { prefill: p.unit.clone(), decode: d.unit.clone(), detail: crate::sglang::pairing::describe(&m, &p.unit, &d.unit) }
        }
        V::PrefillBroken(e) => broken("prefill", e),
        V::DecodeBroken(e) => broken("decode", e),
        V::TransferFailed(e) => broken("transfer", e),
    }
}

/// Why the pair gate does not pair with `peer` in a coherent switch: it is outside the
/// group being verified, or held out of the router still running the old model.
pub(in crate::engine) fn other_model(peer: &Worker, ctx: Ctx<'_>) -> Option<String> {
    if ctx.scope.pair_scope.is_some_and(|g| !g.contains(&peer.unit)) {
        return Some(format!("{} is in the other group of the coherent switch (the old model): not paired", peer.unit));
    }
    let held_old = ctx.writes.ledger.and_then(|l| l.get(&peer.unit)).is_some_and(|d| d.hold == Some(crate::state::drain_ledger::Hold::Old));
    held_old.then(|| format!("{} is held out of the router by a coherent switch, still running the old model: not paired", peer.unit))
}

/// Whether a peer serves: `/ready` 200 where the server serves it (SGLang 0.5.23: not
/// shutting down, not paused, its warm-up generate succeeded — an instant answer), else
/// `/health` 200 (0.5.23's `/health` runs a generate and sleeps 1 s before it looks,
/// `entrypoints/http_server.py:722-800`: a second per pair gate). The probe that follows
/// proves the pair itself. One restarting at the same time is waited for, up to its ready and
/// health timeouts.
pub(in crate::engine) async fn peer_serves<U, L, P: Probes>(eng: &Engine<U, L, P>, peer: &Worker, restarting: bool) -> Result<(), String> {
    let t0 = Instant::now();
    let limit = if restarting { eng.settings.rollout.ready_timeout + eng.settings.rollout.health_timeout } else { Duration::ZERO };
    let cap = limit.max(Duration::from_secs(30));
    loop {
        let why = match within(t0, cap, eng.probes.ready(&peer.url)).await {
            Some(Some(Health::Up)) => return Ok(()),
            Some(Some(Health::Unavailable(s) | Health::Down(s))) => s,
            Some(None) => match within(t0, cap, eng.probes.health(&peer.url)).await {
                Some(Health::Up) => return Ok(()),
                Some(Health::Unavailable(s)) | Some(Health::Down(s)) => s,
                None => "no answer".into(),
            },
            None => "no answer".into(),
        };
        if t0.elapsed() >= limit {
            return Err(why);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// One PD request of `max_new_tokens` sent straight to `x` and `other` (the other role, in
/// either order) under a fresh room, bounded by `pair_timeout`.
pub(in crate::engine) async fn pair_request<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    x: &Worker,
    other: &Worker,
    max_new_tokens: u32,
) -> crate::sglang::pairing::PairProbe {
    let (p, d) = if x.role == Role::Prefill { (x, other) } else { (other, x) };
    let host = crate::sglang::pairing::bootstrap_host(&p.url);
    let t = PairTarget {
        prefill_url: &p.url,
        bootstrap_host: &host,
        bootstrap_port: p.bootstrap_port.unwrap_or(crate::sglang::BOOTSTRAP_PORT_DEFAULT),
        decode_url: &d.url,
        room: crate::sglang::pairing::room(),
        max_new_tokens,
    };
    eng.probes.pair(t, eng.settings.verify.pair_timeout).await
}

/// Probe one pair; a failure that a fixed decode recovers from by itself (SGLang with PR
/// 36029 drops the stale entry on the failed request) is probed once more. Returns the
/// verdict, whether the second probe found it refreshed, and the probes.
pub(in crate::engine) async fn probe_pair<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    p: &Worker,
    d: &Worker,
) -> (crate::sglang::pairing::Verdict, bool, Vec<crate::sglang::pairing::PairProbe>) {
    use crate::sglang::pairing::Verdict;
    let host = crate::sglang::pairing::bootstrap_host(&p.url);
    let target = |room| PairTarget {
        prefill_url: &p.url,
        bootstrap_host: &host,
        bootstrap_port: p.bootstrap_port.unwrap_or(crate::sglang::BOOTSTRAP_PORT_DEFAULT),
        decode_url: &d.url,
        room,
        max_new_tokens: 1,
    };
    let limit = eng.settings.verify.pair_timeout;
    let first = eng.probes.pair(target(crate::sglang::pairing::room()), limit).await;
    let v = judge_pair(eng, p, d, &first).await;
    if !matches!(v, Verdict::Stale | Verdict::TransferFailed(_)) {
        return (v, false, vec![first]);
    }
    // A decode that got no answer within pair_timeout may still be waiting on a stale cached
    // prefill that it drops by itself at its waiting timeout (SGLang 0.5.23): the second
    // probe is given that long when it is short; a longer one (300 s by default) is not
    // waited out — the pair is stale now and its repair is sooner.
    let timing = match eng.units.config(&d.unit).await {
        Ok(c) => crate::sglang::DecodeTiming::of(&c.environment),
        Err(_) => crate::sglang::DecodeTiming::of(&[]),
    };
    let Some(limit) = crate::sglang::pairing::second_probe_limit(&first, limit, &timing) else {
        return (v, false, vec![first]);
    };
    let second = eng.probes.pair(target(crate::sglang::pairing::room()), limit).await;
    let v2 = judge_pair(eng, p, d, &second).await;
    let refreshed = v2 == Verdict::Paired;
    (if refreshed { Verdict::Paired } else { v2 }, refreshed, vec![first, second])
}

pub(in crate::engine) async fn judge_pair<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    p: &Worker,
    d: &Worker,
    probe: &crate::sglang::pairing::PairProbe,
) -> crate::sglang::pairing::Verdict {
    use crate::sglang::pairing::{compare, diagnose, settings_of_info};
    if matches!(probe.decode, crate::sglang::pairing::Half::Answered { status: 200, .. }) {
        return diagnose(probe, &[], None);
    }
    let mismatches = match (eng.probes.server_info(&p.url).await, eng.probes.server_info(&d.url).await) {
        (Ok(a), Ok(b)) => compare(&settings_of_info(&a), &settings_of_info(&b)),
        _ => Vec::new(),
    };
    let older = match (eng.units.state(&d.unit).await, eng.units.state(&p.unit).await) {
        (Ok(ds), Ok(ps)) if ds.exec_main_start_us > 0 && ps.exec_main_start_us > 0 => Some(ds.exec_main_start_us < ps.exec_main_start_us),
        _ => None,
    };
    diagnose(probe, &mismatches, older)
}

/// The pair gate inside a rollout over fakes of systemd, the journal and the probes: a stale decode
/// repaired (or the halt, or the refusal without `--allow-outage`), only the restarted worker's pairs
/// probed.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

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
        let drain = event(&events, "d.service", Step::Drain, Status::Passed);
        assert_eq!(drain.detail["aborted"], 2, "{}", drain.detail);
        assert!(drain.detail["aborted_why"].as_str().unwrap_or("").contains("stale"), "{}", drain.detail);
        let p_drain = event(&events, "p.service", Step::Drain, Status::Passed);
        assert_eq!(p_drain.detail["aborted"], serde_json::Value::Null, "nothing aborted outside a repair by default");
    }
}
