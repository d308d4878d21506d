//! New weights without a restart (`pdctl rollout weights`), in runbook order: every worker of
//! the plan is read (`/model_info`: what it serves now, to go back to) and must be healthy;
//! all are paused — decodes first — with SGLang's `retract` mode (0.5.23 `scheduler.py`
//! `pause_generation`: new requests wait at their admission, running ones stop and their KV is
//! rebuilt under the weights served at the continue; a decode asks its prefill to recompute it)
//! — decodes `in_place` when a prefill has an API key ([`IN_PLACE_NOTE`]); all load the new
//! weights (`/update_weights_from_disk`, at once: while paused no
//! request runs anywhere); each must report them (`model_path`, and `weight_version` when one
//! was given); all continue. Then each prefill/decode pair is probed straight, and each worker
//! passes its health, router and metrics gates. No PD request can pair two versions — none
//! runs between the pause and the continue — and requests wait instead of failing.
//!
//! The load asks for no cache flush (`flush_cache: false`): 0.5.23's own flush after a load is
//! refused when the scheduler is busy — requests running in place, rooms in a decode's PD
//! queues, a deferred KV release — and then fails the call *after* the weights changed, with
//! `/model_info` still naming the old ones (measured on the real server). pdctl flushes each
//! worker's cache itself (`/flush_cache`): while paused where it is idle enough, else after the
//! continue under whatever load it serves — a plain flush, and for a `retract` worker a short
//! quiet window (paused alone, flushed, continued) — bounded by `health_timeout`; the step's
//! detail says how. A worker never flushed fails the rollout at its weights step, naming it (its
//! prefix cache may serve KV of the old weights until evicted); the new weights stay.
//!
//! A failure puts the previous weights back on every worker that loaded the new ones (step
//! `rollback`, paused again when they had continued) and continues every paused worker; the
//! rollout fails with `weights_failed` naming the worker.

use std::time::Instant;

use serde::Serialize;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::after_load::{loaded_notes, pause_mode, Served, IN_PLACE_NOTE};
use crate::engine::context::Notes;
use crate::engine::halt;
use crate::engine::plan_steps;
use crate::engine::runbook;
use crate::engine::work::WeightsTarget;
use crate::state::paused::paused_path;

/// Each worker's load: how long it took, and SGLang's message with the version it reports (or
/// why it did not take them).
type Load = (u64, Result<(String, String), String>);
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, Fail, StepRun};
use crate::events::{Outcome, Sink, Step, Summary};
use crate::names::FLEET;
use crate::plan::Plan;
use crate::ports::PauseMode;
use crate::ports::{Health, Logs, Probes, Units};

/// Weights a worker serves (`/model_info`): the preflight's detail, each side of a load, and a
/// load put back (with SGLang's message).
#[derive(Serialize)]
struct Weights<'a> {
    /// The checkpoint.
    model_path: &'a str,
    /// Its `weight_version`.
    weight_version: &'a str,
    /// What SGLang said of the load that put them back.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

/// The weights step's detail: what it served, what it serves, and the load.
#[derive(Serialize)]
struct Loaded<'a> {
    /// Before.
    from: Weights<'a>,
    /// After.
    to: Weights<'a>,
    /// How long its load took.
    load_ms: u64,
    /// How it was paused (`retract`, `in_place`).
    pause: &'a str,
    /// How long every worker was paused.
    paused_ms: u64,
    /// SGLang's message of the load.
    message: &'a str,
    /// When its cache was flushed (`None`: never).
    cache_flushed: Option<String>,
}

/// One pair probed after a load.
#[derive(Serialize)]
struct PairedAfterLoad<'a> {
    /// The prefill.
    prefill: &'a str,
    /// The decode.
    decode: &'a str,
    /// Always `paired` (a failure fails the step).
    result: &'static str,
}

/// The pair step after a load: every pair of the prefill.
#[derive(Serialize)]
struct PairsAfterLoad<'a> {
    /// Each decode it pairs with.
    pairs: Vec<PairedAfterLoad<'a>>,
}

/// The paused workers, and each one's open weights step with what it served and how it paused.
type Paused<'w> = (Vec<&'w Worker>, Vec<(StepRun<'w>, &'w Worker, Served, PauseMode)>);

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// Load `to` into every worker of `plan` at once (see the module's documentation).
    pub(in crate::engine) async fn update_weights(
        &self,
        plan: &Plan,
        to: WeightsTarget<'_>,
        dir: Option<&std::path::Path>,
        sink: &Sink,
        notes: &Notes,
    ) -> Summary {
        let t0 = Instant::now();
        let end = |result: Outcome, units: Vec<String>, failed| ended(t0, result, units, failed);
        // Preflight: what each serves now, and that it serves.
        let mut before = match self.what_each_serves(plan, sink).await {
            Ok(b) => b,
            Err(failure) => return end(Outcome::Failed, Vec::new(), Some(failure)),
        };
        // Decodes first: nothing new reaches a prefill's KV hand-off while it pauses.
        before.sort_by_key(|(w, _)| u8::from(w.role != Role::Decode));
        // The new checkpoint read into memory before anyone pauses: the loads read it from there.
        let new_to = before.iter().filter(|(_, served)| served.0 != to.model_path).map(|(w, _)| w.unit.as_str());
        let reads = crate::engine::gates::prefetch::for_load(to.model_path, new_to);
        plan_steps::prefetch(self, &reads, sink, &std::sync::atomic::AtomicBool::new(false), notes).await;
        self.long_load_ahead(&before, dir, notes).await;
        let (paused, steps) = match self.pause_all(&before, sink, notes).await {
            Ok(p) => p,
            Err(failure) => return end(Outcome::Failed, Vec::new(), Some(failure)),
        };
        // In a fleet: every host paused before any loads.
        if let Err(f) = self.paused_everywhere(to).await {
            for (s, ..) in steps {
                s.fail(&f);
            }
            let _ = self.resume_all(&paused, notes).await;
            return end(Outcome::Failed, Vec::new(), Some(halt::failure(self, FLEET, Step::Weights, f).await));
        }
        let paused_at = Instant::now();
        let loads = self.load_all(&before, to, dir).await;
        let loaded: Vec<&Worker> = before.iter().zip(&loads).filter(|(_, (_, r))| r.is_ok()).map(|((w, _), _)| *w).collect();
        // In a fleet: no host continues before every host serves the new weights.
        if let Err(why) = self.loaded_everywhere(to, &before, &loads).await {
            let why = format!("another host did not take them ({why}): every host loads its previous weights again");
            let failure = self.undo_loads(FLEET, Cause::WeightsFailed { unit: FLEET.into(), why }, steps, (&before, &loaded, &paused), sink, notes).await;
            return end(Outcome::Failed, Vec::new(), Some(failure));
        }
        if let Some(((w, _), (_, Err(why)))) = before.iter().zip(&loads).find(|(_, (_, r))| r.is_err()) {
            let cause = Cause::WeightsFailed { unit: w.unit.clone(), why: why.clone() };
            let failure = self.undo_loads(&w.unit, cause, steps, (&before, &loaded, &paused), sink, notes).await;
            return end(Outcome::Failed, Vec::new(), Some(failure));
        }
        // Every worker serves the new weights: flush what the old ones cached while no request
        // runs, where the scheduler lets it; then all continue.
        let limit = self.settings.rollout.health_timeout;
        let mut flushed = self.flush_paused(&before, limit).await;
        let resumed = self.resume_all(&paused, notes).await;
        let waited = paused_at.elapsed().as_millis() as u64;
        self.healthy_again(&paused, waited, notes).await;
        let modes: Vec<PauseMode> = steps.iter().map(|(_, _, _, m)| *m).collect();
        let stale_cache = self.flush_after_continue(&before, &mut flushed, &modes, limit).await;
        close_steps(steps, &loads, flushed, stale_cache.as_ref(), to, waited);
        loaded_notes(to, waited, notes);
        // A cache that still holds KV of the old weights: the rollout did not do what it says.
        // The new weights stay (putting the old ones back would leave KV of the new ones).
        if let Some((unit, f)) = stale_cache {
            notes.push(format!("every worker serves {}; {unit}'s prefix cache was not flushed (see the failure): the previous weights were not put back, which would leave KV of the new ones cached instead", to.model_path));
            let failure = halt::failure(self, &unit, Step::Weights, f).await;
            return end(Outcome::Failed, Vec::new(), Some(failure));
        }
        if let Err((w, f)) = resumed {
            let failure = halt::failure(self, &w, Step::Weights, f).await;
            self.put_back(&before, &loaded, true, sink, notes).await;
            return end(Outcome::Failed, Vec::new(), Some(failure));
        }
        // Verified as served: each pair straight, then each worker's own gates.
        if let Err((unit, step, f)) = self.weights_verify(plan, sink).await {
            let failure = halt::failure(self, &unit, step, f).await;
            self.put_back(&before, &loaded, true, sink, notes).await;
            return end(Outcome::Failed, Vec::new(), Some(failure));
        }
        end(Outcome::Succeeded, plan.workers.iter().map(|w| w.unit.clone()).collect(), None)
    }

    /// In a fleet: every host paused before any loads (this host's phase written, the others'
    /// waited for).
    async fn paused_everywhere(&self, to: WeightsTarget<'_>) -> Result<(), Fail> {
        let Some(id) = to.fleet_rollout else { return Ok(()) };
        let paused = self.weights_step(id, crate::engine::work::PhaseName::Paused, Ok(())).await;
        paused.map_err(|why| Fail::from(Cause::WeightsFailed { unit: FLEET.into(), why: format!("not every host paused: {why}") }))
    }

    /// In a fleet: this host's loads written as its phase, and every other host's waited for.
    /// `Err`: another host did not take them (a failed load of this host's own is not one: it
    /// fails here, after this).
    async fn loaded_everywhere(&self, to: WeightsTarget<'_>, before: &[(&Worker, Served)], loads: &[Load]) -> Result<(), String> {
        let Some(id) = to.fleet_rollout else { return Ok(()) };
        let mine = match before.iter().zip(loads).find(|(_, (_, r))| r.is_err()) {
            Some(((w, _), (_, Err(why)))) => Err(format!("{}: {why}", w.unit)),
            _ => Ok(()),
        };
        match (&mine, self.weights_step(id, crate::engine::work::PhaseName::Loaded, mine.clone()).await) {
            (Ok(()), Err(why)) => Err(why),
            _ => Ok(()),
        }
    }

    /// `unit` (a worker, or the fleet) did not take the new weights: every step fails (the others
    /// named as not kept), the previous weights go back where the new ones loaded, every paused
    /// worker continues. The failure, read before anything is put back.
    async fn undo_loads(
        &self,
        unit: &str,
        cause: Cause,
        steps: Vec<(StepRun<'_>, &Worker, Served, PauseMode)>,
        (before, loaded, paused): (&[(&Worker, Served)], &[&Worker], &[&Worker]),
        sink: &Sink,
        notes: &Notes,
    ) -> crate::events::Failure {
        let f = Fail::from(cause.clone());
        let failure = halt::failure(self, unit, Step::Weights, Fail::from(cause)).await;
        for (s, x, ..) in steps {
            if unit == FLEET || x.unit == unit {
                s.fail(&f);
            } else {
                s.fail(&Fail::from(Cause::WeightsFailed { unit: x.unit.clone(), why: format!("not kept: {unit} did not take them") }));
            }
        }
        self.put_back(before, loaded, false, sink, notes).await;
        let _ = self.resume_all(paused, notes).await;
        failure
    }

    /// Pause every worker in order, each in its [`PauseMode`] (a note says when one is paused in
    /// place); the first that cannot be paused fails, and those paused before it continue.
    async fn pause_all<'w>(&self, before: &[(&'w Worker, Served)], sink: &'w Sink, notes: &Notes) -> Result<Paused<'w>, crate::events::Failure> {
        let pause_limit = self.settings.rollout.health_timeout;
        let keyed = self.a_paired_prefill_is_keyed(before.iter().map(|(w, _)| *w)).await;
        let modes: Vec<PauseMode> = before.iter().map(|(w, _)| pause_mode(w, keyed)).collect();
        if modes.contains(&PauseMode::InPlace) {
            notes.push(IN_PLACE_NOTE.to_string());
        }
        let mut paused: Vec<&Worker> = Vec::new();
        let mut steps = Vec::new();
        for ((w, served), mode) in before.iter().zip(modes) {
            let s = StepRun::start(sink, &w.unit, Step::Weights);
            if let Err(e) = self.probes.pause(&w.url, mode, pause_limit).await {
                let f = Fail::from(Cause::WeightsFailed { unit: w.unit.clone(), why: format!("it could not be paused: {e}") });
                s.fail(&f);
                let _ = self.resume_all(&paused, notes).await;
                return Err(halt::failure(self, &w.unit, Step::Weights, f).await);
            }
            paused.push(*w);
            steps.push((s, *w, served.clone(), mode));
        }
        Ok((paused, steps))
    }

    /// Preflight of a weights rollout: what each worker serves now (`/model_info`), and that it
    /// serves; the first that does not is the failure.
    async fn what_each_serves<'p>(&self, plan: &'p Plan, sink: &Sink) -> Result<Vec<(&'p Worker, Served)>, crate::events::Failure> {
        let mut before = Vec::new();
        for w in &plan.workers {
            let s = StepRun::start(sink, &w.unit, Step::Preflight);
            match self.weights_preflight(w).await {
                Ok(served) => {
                    s.pass(detail_of(&Weights { model_path: &served.0, weight_version: &served.1, message: None }));
                    before.push((w, served));
                }
                Err(f) => {
                    s.fail(&f);
                    return Err(halt::failure(self, &w.unit, Step::Preflight, f).await);
                }
            }
        }
        Ok(before)
    }

    /// Every worker loads `to` at once, each bounded like a start, and must then report it in
    /// `/model_info`: per worker, the load's time (ms) and its message and version, or why not.
    /// Each load's time is kept in `dir` (what the next rollout warns by, [`crate::engine::after_load::long_load`]).
    async fn load_all(
        &self,
        before: &[(&Worker, Served)],
        to: WeightsTarget<'_>,
        dir: Option<&std::path::Path>,
    ) -> Vec<(u64, Result<(String, String), String>)> {
        let limit = self.settings.rollout.ready_timeout;
        futures_util::future::join_all(before.iter().map(|(w, _)| async move {
            let t = Instant::now();
            let r = self.probes.update_weights(&w.url, to.model_path, to.version, limit).await.map_err(|e| e.to_string());
            let r = match r {
                Ok(m) => self.probes.model_info(&w.url).await.map_err(|e| format!("it loaded ({m}) but its /model_info cannot be read: {e}")).and_then(
                    |(path, version)| {
                        let wrong_path = path != to.model_path;
                        let wrong_version = to.version.is_some_and(|v| v != version);
                        if wrong_path || wrong_version {
                            Err(format!("it answered success but serves {path} (weight_version {version})"))
                        } else {
                            Ok((m, version))
                        }
                    },
                ),
                Err(e) => Err(e),
            };
            let ms = t.elapsed().as_millis() as u64;
            if let (Some(dir), Ok(_)) = (dir, &r) {
                let _ = crate::state::revisions::record_load(dir, &w.unit, ms);
            }
            (ms, r)
        }))
        .await
    }

    /// Fleet weights rollout `id`: write this host's `phase` (`mine`: whether it got there), then
    /// wait (bounded) until every host of the rollout wrote it; `Err`: this host's failure, the
    /// first other host's, or who did not get there in time.
    async fn weights_step(&self, id: &str, phase: crate::engine::work::PhaseName, mine: Result<(), String>) -> Result<(), String> {
        if self.coordinator.is_none() || self.settings.fleet.is_none() {
            return mine;
        }
        let hosts = self.rollout_hosts(id).await.map_err(|e| e.to_string())?.hosts;
        let step = crate::engine::work::Phase { id, kind: crate::engine::work::FleetStep::Weights, name: phase };
        self.write_phase(step, &mine).await.map_err(|e| e.to_string())?;
        mine?;
        let limit = self.settings.rollout.ready_timeout + std::time::Duration::from_secs(60);
        self.await_phase(step, &hosts, limit, None).await.map_err(|e| e.to_string())
    }

    /// Each worker's cache flushed while every worker is paused, where its scheduler lets it
    /// (`None`: refused — requests running in place, rooms held, PD queues).
    async fn flush_paused(&self, before: &[(&Worker, Served)], limit: std::time::Duration) -> Vec<Option<String>> {
        let mut flushed = Vec::new();
        for (w, _) in before {
            flushed.push(matches!(self.probes.flush_cache(&w.url, limit).await, Ok(true)).then(|| "while paused".to_string()));
        }
        flushed
    }

    /// A worker's weights before: it must serve (`/health` 200) and say what it serves.
    async fn weights_preflight(&self, w: &Worker) -> Result<Served, Fail> {
        if let Health::Unavailable(why) | Health::Down(why) = self.probes.health(&w.url).await {
            return Err(Fail::from(Cause::WeightsFailed { unit: w.unit.clone(), why: format!("it does not serve ({why}): nothing was paused") }));
        }
        self.probes
            .model_info(&w.url)
            .await
            .map_err(|e| Fail::from(Cause::WeightsFailed { unit: w.unit.clone(), why: format!("its /model_info cannot be read ({e}): nothing was paused") }))
    }

    /// Whether a prefill the decodes among `workers` may pair with has an API key (their
    /// [`pause_mode`]): this host's, by its configured key, and in a fleet every other host's
    /// the gateway lists (one that answers 401 to a call without a key has one). Asked once.
    async fn a_paired_prefill_is_keyed<'w>(&self, mut workers: impl Iterator<Item = &'w Worker>) -> bool {
        if self.settings.workers.iter().any(|p| p.role == Role::Prefill && p.api_key.is_some()) {
            return true;
        }
        let Some(decode) = workers.find(|w| w.role == Role::Decode) else { return false };
        for (p, _) in gates::slot::remote_peers(self, decode).await {
            if matches!(self.probes.auth(&p.url).await, crate::ports::Auth::Rejected { .. }) {
                return true;
            }
        }
        false
    }

    /// Continue every paused worker; the first that did not continue (all are tried).
    async fn resume_all(&self, paused: &[&Worker], notes: &Notes) -> Result<(), (String, Fail)> {
        let mut first = None;
        for w in paused {
            if let Err(e) = self.probes.resume(&w.url, self.settings.rollout.health_timeout).await {
                notes.push(format!("{} did not continue ({e}): continue it by hand (POST {}/continue_generation)", w.unit, w.url));
                first.get_or_insert((w.unit.clone(), Fail::from(Cause::WeightsFailed { unit: w.unit.clone(), why: format!("it did not continue: {e}") })));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The previous weights on every worker of `loaded` (paused again first when `running`),
    /// each a `rollback` step; then every one of them continues.
    async fn put_back(&self, before: &[(&Worker, Served)], loaded: &[&Worker], running: bool, sink: &Sink, notes: &Notes) {
        let mut paused = Vec::new();
        let keyed = running && self.a_paired_prefill_is_keyed(loaded.iter().copied()).await;
        for (w, (path, version)) in before.iter().filter(|(w, _)| loaded.iter().any(|l| l.unit == w.unit)) {
            let s = StepRun::start(sink, &w.unit, Step::Rollback);
            if running {
                if let Err(e) = self.probes.pause(&w.url, pause_mode(w, keyed), self.settings.rollout.health_timeout).await {
                    notes.push(format!("{} could not be paused to take its previous weights back ({e}): it still serves {}", w.unit, path));
                }
            }
            paused.push(*w);
            match self.probes.update_weights(&w.url, path, Some(version.as_str()), self.settings.rollout.ready_timeout).await {
                Ok(m) => {
                    s.pass(detail_of(&Weights { model_path: path, weight_version: version, message: Some(&m) }));
                    notes.push(format!("{} serves its previous weights again ({path}, weight_version {version})", w.unit));
                }
                Err(e) => {
                    let f = Fail::from(Cause::WeightsFailed { unit: w.unit.clone(), why: format!("its previous weights did not load again: {e}") });
                    s.fail(&f);
                    notes.push(format!(
                        "{} could not load its previous weights ({e}): it serves the new ones; restart it (pdctl restart --rolling --unit {})",
                        w.unit, w.unit
                    ));
                }
            }
        }
        let _ = self.resume_all(&paused, notes).await;
    }

    /// After the load: each prefill/decode pair probed straight, then each worker's health,
    /// router and metrics gates.
    async fn weights_verify(&self, plan: &Plan, sink: &Sink) -> Result<(), (String, Step, Fail)> {
        let prefills: Vec<&Worker> = plan.workers.iter().filter(|w| w.role == Role::Prefill).collect();
        let decodes: Vec<&Worker> = plan.workers.iter().filter(|w| w.role == Role::Decode).collect();
        for p in &prefills {
            let s = StepRun::start(sink, &p.unit, Step::Pair);
            let mut pairs = Vec::new();
            for d in &decodes {
                let (verdict, _, _) = gates::pair::probe_pair(self, p, d).await;
                if verdict != crate::sglang::pairing::Verdict::Paired {
                    let f = Fail::from(Cause::WeightsFailed {
                        unit: p.unit.clone(),
                        why: format!("its pair probe with {} after the load: {}", d.unit, verdict.as_str()),
                    });
                    s.fail(&f);
                    return Err((p.unit.clone(), Step::Pair, f));
                }
                pairs.push(PairedAfterLoad { prefill: &p.unit, decode: &d.unit, result: "paired" });
            }
            s.pass(detail_of(&PairsAfterLoad { pairs }));
        }
        for w in &plan.workers {
            runbook::check_one(self, w, sink).await.map_err(|(step, f)| (w.unit.clone(), step, f))?;
        }
        Ok(())
    }
}

/// The notes of new weights loaded and continued: that the units still name their old path (not
/// a config rollout), and how long requests waited.
/// A weights rollout's summary, `t0` its start.
fn ended(t0: Instant, result: Outcome, units: Vec<String>, failed: Option<crate::events::Failure>) -> Summary {
    Summary {
        id: None,
        result,
        elapsed_ms: t0.elapsed().as_millis() as u64,
        units,
        checked: Vec::new(),
        repairs: Default::default(),
        availability: None,
        failed,
    }
}

/// Each worker's weights step ends: passed with its load and how its cache was flushed, or
/// failed when its cache was not (`stale`).
fn close_steps(
    steps: Vec<(StepRun<'_>, &Worker, Served, PauseMode)>,
    loads: &[Load],
    flushed: Vec<Option<String>>,
    stale: Option<&(String, Fail)>,
    to: WeightsTarget<'_>,
    waited: u64,
) {
    for (((s, w, served, mode), (load_ms, r)), cache) in steps.into_iter().zip(loads).zip(flushed) {
        let (message, version) = r.as_ref().map(|(m, v)| (m.clone(), v.clone())).unwrap_or_default();
        let detail = detail_of(&Loaded {
            from: Weights { model_path: &served.0, weight_version: &served.1, message: None },
            to: Weights { model_path: to.model_path, weight_version: &version, message: None },
            load_ms: *load_ms,
            pause: mode.as_str(),
            paused_ms: waited,
            message: &message,
            cache_flushed: cache,
        });
        match stale {
            Some((unit, f)) if *unit == w.unit => s.fail(&Fail { cause: f.cause.clone(), detail, unit: None, last_lines: Vec::new() }),
            _ => s.pass(detail),
        }
    }
}

/// [`Engine::update_weights`] with its side effect on record: the workers it pauses are
/// written to `dir` ([`paused_path`]) before the first pause and forgotten once the rollout
/// ended (every path of it continues them), so that a pdctld that died in between continues
/// them when it starts. Without `dir` (never from pdctld) nothing is recorded.
pub(in crate::engine) async fn update_recorded<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    plan: &Plan,
    to: WeightsTarget<'_>,
    dir: Option<&std::path::Path>,
    sink: &Sink,
    notes: &Notes,
) -> Summary {
    if let Some(dir) = dir {
        if let Err(e) = crate::state::paused::record(dir, plan.workers.iter().map(|w| (w.unit.as_str(), w.url.as_str()))) {
            let cause = Cause::RecordUnwritable { dir: dir.display().to_string(), error: e.to_string() };
            // Nothing is paused unrecorded: the first worker's preflight fails, nothing touched.
            let unit = plan.workers.first().map(|w| w.unit.as_str()).unwrap_or(FLEET);
            StepRun::start(sink, unit, Step::Preflight).fail(&Fail::from(cause.clone()));
            return Summary::untouched(0, Some(halt::failure(eng, unit, Step::Preflight, Fail::from(cause)).await));
        }
    }
    let summary = eng.update_weights(plan, to, dir, sink, notes).await;
    if let Some(dir) = dir {
        let _ = std::fs::remove_file(paused_path(dir));
    }
    summary
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_load_as_long_as_the_health_timeout_is_said_before_the_pause() {
        use std::time::Duration;
        assert_eq!(crate::engine::after_load::long_load("d.service", Duration::from_secs(5), Duration::from_secs(20)), None);
        let said = crate::engine::after_load::long_load("d.service", Duration::from_secs(34), Duration::from_secs(20)).expect("34 s ≥ 20 s");
        assert!(said.starts_with("d.service: its last load of new weights took 34") && said.contains("(20") && said.contains("3 failed checks"), "{said}");
    }

    #[test]
    fn the_weights_details_have_the_keys_of_the_contract() {
        let w = |p, v| Weights { model_path: p, weight_version: v, message: None };
        let d = Loaded { from: w("/a", "1"), to: w("/b", "2"), load_ms: 3, pause: "retract", paused_ms: 4, message: "ok", cache_flushed: None };
        assert_eq!(
            detail_of(&d),
            json!({"from": {"model_path": "/a", "weight_version": "1"}, "to": {"model_path": "/b", "weight_version": "2"},
                   "load_ms": 3, "pause": "retract", "paused_ms": 4, "message": "ok", "cache_flushed": null})
        );
        assert_eq!(detail_of(&Weights { message: Some("m"), ..w("/a", "1") }), json!({"model_path": "/a", "weight_version": "1", "message": "m"}));
        let pairs = PairsAfterLoad { pairs: vec![PairedAfterLoad { prefill: "p", decode: "d", result: "paired" }] };
        assert_eq!(detail_of(&pairs), json!({"pairs": [{"prefill": "p", "decode": "d", "result": "paired"}]}));
    }
}
