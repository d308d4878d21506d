//! The runbook: a worker's steps in one ordered list ([`RUNBOOK`]), and every sequence that runs
//! on a worker — a restart, a repair, a coherent switch's new group, a resumed rollout's
//! re-verification, `check` — a filter of it ([`Sequence`]). The order is written here once; what
//! each step does is one arm of [`Engine::run_step`], calling its gate (`gates/`, a file each).

use std::time::{Duration, Instant};

use pdctl_parse::service::ServiceScrape;
use serde_json::Value;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::{Ctx, Outage, Repaired};
use crate::engine::gates::{drain, health, metrics, pair, ready, restart, router, service_level, slot, soak, stop, stranded_kv, Deferred, Restarted};
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::step_run::{lock, Fail, StepRun};
use crate::engine::steps::{rule, HELD_FOR_SWITCH, NOT_REGISTERED, RAN_THROUGH};
use crate::events::{Failure, Sink, Step};
use crate::fleet::SlotRecord;
use crate::ports::{Logs, Probes, UnitState, Units};
use crate::state::revisions;

/// A worker's steps, in the order the runbook gives them ([`Step::RUNBOOK`], where it is
/// written once, beside the steps): a slot, out of the gateway, restarted (or stopped and
/// started around a reboot), ready, `/health`, its pairs, back in the gateway, its KV metrics,
/// stranded KV released, the soak. Preflight runs before the first worker; reconcile, rollback,
/// weights and switch are steps of a rollout, not of a worker's sequence.
pub const RUNBOOK: [Step; 12] = Step::RUNBOOK;

/// Which part of the runbook runs on a worker, and how its steps judge what they find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    /// Restarted through every step; a stale pairing its pair gate finds is repaired (its decode
    /// restarted as a [`Sequence::Repair`]); its service judged against its figures from before
    /// its drain, taken once per rollout.
    Restart,
    /// A decode restarted to repair a stale pairing: every step; nothing is repaired from a
    /// repair, and its service has no baseline of its own.
    Repair,
    /// A coherent switch's new group: every step but the slot (the switch holds the fleet's
    /// slots); held out of the gateway until the switch; a stale pair fails it.
    SwitchNew,
    /// A resumed rollout's first units, re-verified without a restart: health, pair, router
    /// (re-registered if the gateway lost it), metrics, stranded KV. A stale pair fails it (the
    /// unit is then restarted the usual way).
    Verify,
    /// `check`: health, router, metrics — changing nothing (no registration, no warm-up request).
    Check,
    /// Host maintenance, before the reboot: out of the gateway and stopped (the host's slots are
    /// taken for all its workers at once before, and held until its resume passed).
    HostDown,
    /// Host maintenance, after the reboot: started if the boot did not, then every gate a
    /// restart passes; a stale pair fails it.
    HostUp,
}

impl Sequence {
    /// Whether the sequence runs `step`.
    pub fn runs(self, step: Step) -> bool {
        match self {
            Sequence::Restart | Sequence::Repair => RUNBOOK.contains(&step) && !matches!(step, Step::Stop | Step::Start),
            Sequence::SwitchNew => RUNBOOK.contains(&step) && !matches!(step, Step::Slot | Step::Stop | Step::Start),
            Sequence::HostDown => matches!(step, Step::Drain | Step::Stop),
            Sequence::HostUp => RUNBOOK.contains(&step) && !matches!(step, Step::Slot | Step::Drain | Step::Restart | Step::Stop),
            Sequence::Verify => matches!(step, Step::Health | Step::Pair | Step::Router | Step::Metrics | Step::StrandedKv),
            Sequence::Check => matches!(step, Step::Health | Step::Router | Step::Metrics),
        }
    }

    /// Its steps, in runbook order.
    pub fn steps(self) -> impl Iterator<Item = Step> {
        RUNBOOK.into_iter().filter(move |s| self.runs(*s))
    }

    /// Its steps from `first` to `last` (both included), in runbook order.
    pub fn between(self, first: Step, last: Step) -> impl Iterator<Item = Step> {
        let at = |s: Step| RUNBOOK.iter().position(|x| *x == s);
        let (a, b) = (at(first).unwrap_or(RUNBOOK.len()), at(last).unwrap_or(0));
        RUNBOOK.into_iter().enumerate().filter(move |(i, s)| *i >= a && *i <= b && self.runs(*s)).map(|(_, s)| s)
    }

    /// Whether the worker gets a new run — restarted, or started after host maintenance — that
    /// the later gates hold it to (else it is only verified).
    pub fn restarts(self) -> bool {
        self.runs(Step::Restart) || self.runs(Step::Start)
    }
}

/// One worker going through a sequence: what its steps hand on to the later ones.
pub(in crate::engine) struct WorkerRun<'a, W> {
    /// The worker.
    pub(in crate::engine) w: &'a Worker,
    /// Which part of the runbook it runs.
    pub(in crate::engine) seq: Sequence,
    /// Where its events go.
    pub(in crate::engine) sink: &'a Sink,
    /// The rollout's context.
    pub(in crate::engine) ctx: Ctx<'a>,
    /// Its fleet slots (slot → given back once every step passed).
    slots: Vec<SlotRecord>,
    /// Its service figures before its drain (drain → soak).
    before: Option<ServiceScrape>,
    /// When its drain began (drain → router: its window out of the gateway).
    drain_began: Option<Instant>,
    /// The taking out left to its stop (drain → restart).
    deferred: Option<Deferred>,
    /// What the restart hands on (restart → ready, health, pair, soak).
    restarted: Option<Restarted<W>>,
    /// Decodes restarted to repair a stale pairing its pair gate found (pair → the caller).
    repaired: Repaired,
    /// Host maintenance: the worker as the host's drain found it (its run, the journal's
    /// cursor before its stop) — the start step's starting point.
    pub(in crate::engine) maintained: Option<crate::state::drain_ledger::MaintainedUnit>,
    /// Host maintenance: every worker of the other PD role is still down with the host (it
    /// comes back after this one), so no request can pass the gateway yet; the pair gate
    /// proved the pair directly.
    pub(in crate::engine) peers_out: bool,
}

impl<'a, W> WorkerRun<'a, W> {
    /// `w` about to run `seq` in `ctx`.
    pub(in crate::engine) fn new(w: &'a Worker, seq: Sequence, sink: &'a Sink, ctx: Ctx<'a>) -> Self {
        WorkerRun {
            w,
            seq,
            sink,
            ctx,
            slots: Vec::new(),
            before: None,
            drain_began: None,
            deferred: None,
            restarted: None,
            repaired: Vec::new(),
            maintained: None,
            peers_out: false,
        }
    }
}

/// A step that needs the restart's hand-over in a sequence without the restart step: never, as
/// long as [`Sequence::runs`] keeps the runbook's order (its test checks that).
fn out_of_order(step: Step, unit: &str) -> (Step, Fail) {
    let what = format!("the {} step of {unit} without its restart step (a sequence out of runbook order)", step.as_str());
    (step, Fail::from(Cause::EventSourceClosed { what }))
}

/// Run one step and report it: started, then passed with its detail or failed with its cause.
async fn reported<T>(sink: &Sink, unit: &str, step: Step, fut: impl std::future::Future<Output = Result<(Value, T), Fail>>) -> Result<T, (Step, Fail)> {
    let s = StepRun::start(sink, unit, step);
    match fut.await {
        Ok((detail, v)) => {
            s.pass(detail);
            Ok(v)
        }
        Err(f) => {
            s.fail(&f);
            Err((step, f))
        }
    }
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// Only the restart and ready steps of one worker, exactly as a rollout runs them (events go
    /// to `sink`; the ready event's detail has `detect_ms`): for the benchmark, and for anyone who
    /// wants to time them. Returns the unit's state after the restart.
    pub async fn restart_until_ready(&self, w: &Worker, sink: &Sink) -> Result<UnitState, Failure> {
        let mut r = WorkerRun::new(w, Sequence::Restart, sink, Ctx::none(Outage::Accepted, true));
        match run_steps(self, &mut r, Sequence::Restart.between(Step::Restart, Step::Ready)).await {
            Ok(()) => match r.restarted {
                Some(x) => Ok(x.after),
                None => Err(halt::failure(self, &w.unit, Step::Restart, Fail::from(Cause::EventSourceClosed { what: "the restart step".into() })).await),
            },
            Err((step, f)) => Err(halt::failure(self, &w.unit, step, f).await),
        }
    }
}

/// Run `r`'s whole sequence, then give its slots back (verified). Returns the decodes
/// restarted to repair a stale pairing its pair gate found.
pub(in crate::engine) async fn run_sequence<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    r: &mut WorkerRun<'_, U::W>,
) -> Result<Repaired, (Step, Fail)> {
    run_steps(eng, r, r.seq.steps()).await?;
    // Verified: the slot goes back.
    slot::release_slots(eng, &r.w.unit, &r.slots, r.ctx).await;
    Ok(std::mem::take(&mut r.repaired))
}

/// Run `steps` of `r`'s sequence in order; the first failure ends it.
pub(in crate::engine) async fn run_steps<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    r: &mut WorkerRun<'_, U::W>,
    steps: impl Iterator<Item = Step>,
) -> Result<(), (Step, Fail)> {
    for step in steps {
        run_step(eng, step, r).await?;
    }
    Ok(())
}

/// Restart one worker through every step ([`Sequence::Restart`]). Returns the decodes
/// restarted to repair a stale pairing found by its pair gate.
pub(in crate::engine) async fn restart_one<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    sink: &Sink,
    ctx: Ctx<'_>,
) -> Result<Repaired, (Step, Fail)> {
    run_sequence(eng, &mut WorkerRun::new(w, Sequence::Restart, sink, ctx)).await
}

/// Re-verify a unit without restarting it ([`Sequence::Verify`]).
pub(in crate::engine) async fn verify<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, sink: &Sink) -> bool {
    run_sequence(eng, &mut WorkerRun::new(w, Sequence::Verify, sink, Ctx::none(Outage::Accepted, true))).await.is_ok()
}

/// `check` of one worker ([`Sequence::Check`]).
pub(in crate::engine) async fn check_one<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, sink: &Sink) -> Result<(), (Step, Fail)> {
    run_sequence(eng, &mut WorkerRun::new(w, Sequence::Check, sink, Ctx::none(Outage::Check, false))).await.map(|_| ())
}

/// One step of the runbook on `r`'s worker, as its sequence runs it.
pub(in crate::engine) async fn run_step<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    step: Step,
    r: &mut WorkerRun<'_, U::W>,
) -> Result<(), (Step, Fail)> {
    let (w, sink, ctx, seq) = (r.w, r.sink, r.ctx, r.seq);
    let unit = w.unit.as_str();
    match step {
        // A pair restarted together took both slots at once before.
        Step::Slot if ctx.scope.together_with.is_none() => r.slots = slot::slot_step(eng, &[w], sink, ctx).await?,
        Step::Slot => {}
        Step::Drain => drain_step(eng, r).await?,
        Step::Restart => {
            let deferred = r.deferred.take();
            r.restarted = Some(reported(sink, unit, step, restart::restart(eng, w, deferred.as_ref())).await?);
        }
        Step::Stop => {
            let deferred = r.deferred.take();
            reported(sink, unit, step, async { stop::stop(eng, w, deferred.as_ref()).await.map(|d| (d, ())) }).await?;
            // Stopped for the reboot: not a drain to undo any more. The maintenance record
            // holds it; its resume re-registers it through the router gate.
            if let Some(l) = ctx.writes.ledger {
                l.clear(unit).map_err(|e| (step, Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() })))?;
            }
        }
        Step::Start => {
            let was = r.maintained.clone();
            r.restarted = Some(reported(sink, unit, step, stop::start(eng, w, was.as_ref())).await?);
        }
        Step::Ready if r.restarted.as_ref().is_some_and(|x| x.ran_through) => {
            StepRun::start(sink, unit, step).skip(RAN_THROUGH);
        }
        Step::Ready => {
            let x = r.restarted.as_mut().ok_or_else(|| out_of_order(step, unit))?;
            let after = x.after.clone();
            let cursor = x.cursor.clone();
            let ready_us = reported(sink, unit, step, async {
                ready::ready(eng, w, cursor, &mut x.watch, &after).await.map(|d| (serde_json::to_value(&d).unwrap_or_default(), d.journal_realtime_us))
            })
            .await?;
            // How long this start took: the interruption to expect next time, if it is alone in its role.
            if let (Some(dir), true) = (ctx.writes.revisions, after.exec_main_start_us > 0) {
                let took = Duration::from_micros(ready_us.saturating_sub(after.exec_main_start_us));
                if let Err(e) = revisions::record_start(dir, unit, took.as_millis() as u64) {
                    tracing::warn!(pdctl_unit = %unit, "cannot record how long {unit}'s start took: {e}");
                }
            }
        }
        Step::Health => {
            let after = if seq.restarts() { Some(r.restarted.as_mut().ok_or_else(|| out_of_order(step, unit))?.after.clone()) } else { None };
            // `check` says what it finds; the others wait, bounded, for the pair gate after it.
            let pair_follows = seq != Sequence::Check;
            reported(sink, unit, step, async { health::health(eng, w, after.as_ref(), pair_follows).await.map(|d| (d, ())) }).await?;
        }
        Step::Pair => pair_of(eng, r).await?,
        Step::Router => router_step(eng, r).await?,
        // `check` sends no warm-up request of its own.
        Step::Metrics => metrics::metrics_step(eng, w, sink, seq != Sequence::Check, ctx).await?,
        Step::StrandedKv if w.role == Role::Decode => stranded_kv::stranded_step(eng, w, sink).await?,
        Step::StrandedKv => {}
        Step::Soak => {
            let before = r.before.take();
            let x = r.restarted.as_mut().ok_or_else(|| out_of_order(step, unit))?;
            let after = x.after.clone();
            let note = reported(sink, unit, step, async {
                soak::soak(eng, w, &mut x.watch, &after, before).await.map(|d| {
                    let note = crate::details::Said::of(&d).note;
                    (d, note)
                })
            })
            .await?;
            // "Not judged" is said in the summary, not hidden in a passed step.
            if let (Some(note), Some(notes)) = (note, ctx.writes.notes) {
                lock(notes).push(note);
            }
        }
        Step::Preflight | Step::Reconcile | Step::Rollback | Step::Weights | Step::Switch => {}
    }
    Ok(())
}

/// The drain step (with its baseline for the service gate taken just before), and the point
/// a pair restarted together passes before either stops.
pub(in crate::engine) async fn drain_step<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &mut WorkerRun<'_, U::W>) -> Result<(), (Step, Fail)> {
    let (w, ctx) = (r.w, r.ctx);
    if r.seq == Sequence::Restart {
        r.before = before_drain(eng, w, ctx).await;
    }
    r.drain_began = Some(Instant::now());
    let mut drained = Ok(());
    if eng.settings.rollout.drain {
        let s = StepRun::start(r.sink, &w.unit, Step::Drain);
        match drain::drain(eng, w, ctx).await {
            Ok(Some((d, later))) => {
                s.pass(d);
                r.deferred = later;
            }
            Ok(None) => s.skip(NOT_REGISTERED),
            Err(f) => {
                s.fail(&f);
                drained = Err((Step::Drain, f));
            }
        }
    }
    // Restarted together: neither stops while the other still drains (`Together`).
    if let Some(t) = ctx.scope.together_with {
        t.drained.wait().await;
    }
    drained
}

/// The service gate's baseline when it is alone in its role: its figures before the drain —
/// before this rollout first touched it. A worker restarted again in the same rollout (a
/// rollback onto its last good revision) is judged against those, not against the run that
/// just failed.
pub(in crate::engine) async fn before_drain<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, ctx: Ctx<'_>) -> Option<ServiceScrape> {
    let measured = service_level::slo_before(eng, w).await;
    let Some(keep) = ctx.writes.before else { return measured };
    let mut kept = lock(keep);
    match kept.get(&w.unit) {
        Some(first) => Some(first.clone()),
        None => {
            if let Some(b) = &measured {
                kept.insert(w.unit.clone(), b.clone());
            }
            measured
        }
    }
}

/// The pair step, and what its sequence does with a stale pairing it finds: a restart
/// repairs it (this host's decode restarted here, another host's through the fleet), a
/// switch's new group or a re-verification fails on it, a repair finds none.
pub(in crate::engine) async fn pair_of<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &mut WorkerRun<'_, U::W>) -> Result<(), (Step, Fail)> {
    let (w, sink, ctx) = (r.w, r.sink, r.ctx);
    let after = match &r.restarted {
        Some(x) => x.after.clone(),
        // Re-verified: its pairs are probed against the run it has now.
        None => eng.units.state(&w.unit).await.map_err(|e| (Step::Pair, Fail::from(e)))?,
    };
    let stale = pair::pair_step(eng, w, sink, ctx, &after).await?;
    match r.seq {
        // A prefill back after a reboot runs a new process on its old address, as after a
        // restart: decodes that kept its old bootstrap info are repaired the same way.
        Sequence::Restart | Sequence::HostUp => {
            for st in stale {
                match &st.owner {
                    // On the heap: a repair runs a sequence of its own.
                    None => Box::pin(eng.repair(&st.decode, w, sink, ctx)).await?,
                    // A decode of another host: its own pdctld restarts it, through the fleet.
                    Some((host, unit)) => Box::pin(eng.fleet_repair(&st.decode, host, unit, w, sink, ctx)).await?,
                }
                r.repaired.push((st.decode, w.unit.clone()));
            }
        }
        Sequence::SwitchNew | Sequence::Verify => {
            if let Some(s) = stale.first() {
                return Err((Step::Pair, Fail::from(Cause::StalePair { decode: s.decode.unit.clone(), prefill: w.unit.clone() })));
            }
        }
        Sequence::Repair | Sequence::Check | Sequence::HostDown => {}
    }
    Ok(())
}

/// The router step: held out for a coherent switch; a restarted worker re-admitted (its drain
/// crossed off and its window out of the gateway recorded); a re-verified one registered
/// again if the gateway lost it; `check` only looks.
pub(in crate::engine) async fn router_step<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &mut WorkerRun<'_, U::W>) -> Result<(), (Step, Fail)> {
    let (w, sink, ctx) = (r.w, r.sink, r.ctx);
    let unit = w.unit.as_str();
    if !r.seq.restarts() {
        if !eng.settings.verify.router {
            return Ok(());
        }
        let may_register = r.seq == Sequence::Verify;
        return reported(sink, unit, Step::Router, async { router::router(eng, w, may_register, false).await.map(|d| (d, ())) }).await;
    }
    if ctx.scope.hold.is_some() {
        // A coherent switch's new group stays out until the whole group is verified: it runs
        // the new model while the old group serves (see `switch.rs`).
        StepRun::start(sink, unit, Step::Router).skip(HELD_FOR_SWITCH);
        return Ok(());
    }
    if !eng.settings.verify.router {
        StepRun::start(sink, unit, Step::Router).skip(rule(Step::Router, &eng.settings).off_because.unwrap_or_default());
        return Ok(());
    }
    // Out of the router since its drain — or since the restart took it out (deferred). A
    // run resumed after its drain does not know when that was: it records no window (one
    // from here would be its router gate alone, and the next estimate would say "about 2s").
    let out_since = r.restarted.as_ref().and_then(|x| x.taken_out).or(r.drain_began);
    reported(sink, unit, Step::Router, async {
        // Every worker of the other PD role out of the router by this rollout's own drains
        // (a decode repaired while its prefill waits drained): no request can pass the
        // router now; the pair gate proved the pair directly.
        let peers = pair::peers(eng, w);
        let peers_drained = r.peers_out
            || !peers.is_empty() && ctx.writes.ledger.is_some_and(|l| peers.iter().all(|p| l.get(&p.unit).is_some_and(|d| d.rollout_id == ctx.writes.id)));
        let d = router::router_recorded(eng, w, true, peers_drained, ctx.writes.ledger.map(|l| (l, ctx.writes.id))).await?;
        // Admitted again: the drain is undone.
        if let Some(l) = ctx.writes.ledger {
            l.clear(unit).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))?;
        }
        // Drain, stop, start, gates, re-admission: the outage to expect next time if it
        // is alone in its role.
        if let (Some(dir), Some(out_since)) = (ctx.writes.revisions, out_since) {
            if let Err(e) = revisions::record_window(dir, unit, out_since.elapsed().as_millis() as u64) {
                tracing::warn!(pdctl_unit = %unit, "cannot record how long {unit} was out of the router: {e}");
            }
        }
        Ok((d, ()))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sequence_keeps_the_runbook_order_and_steps_after_restart_need_it() {
        for seq in [Sequence::Restart, Sequence::Repair, Sequence::SwitchNew, Sequence::Verify, Sequence::Check, Sequence::HostDown, Sequence::HostUp] {
            let steps: Vec<Step> = seq.steps().collect();
            let at = |s: &Step| RUNBOOK.iter().position(|x| x == s);
            assert!(steps.windows(2).all(|p| at(&p[0]) < at(&p[1])), "{seq:?}: {steps:?}");
            // Ready and soak hold the worker to the run its restart started.
            if steps.contains(&Step::Ready) || steps.contains(&Step::Soak) {
                assert!(seq.restarts(), "{seq:?}");
            }
        }
        assert_eq!(Sequence::Check.steps().collect::<Vec<_>>(), [Step::Health, Step::Router, Step::Metrics]);
        assert_eq!(Sequence::SwitchNew.between(Step::Slot, Step::Health).collect::<Vec<_>>(), [Step::Drain, Step::Restart, Step::Ready, Step::Health]);
        assert_eq!(Sequence::Restart.between(Step::Router, Step::Soak).count(), 4);
        assert!(!Sequence::Verify.restarts() && Sequence::Repair.restarts());
    }
}
