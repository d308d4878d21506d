//! The runbook: a worker's steps in one ordered list ([`RUNBOOK`]), and every sequence that runs
//! on a worker — a restart, a repair, a coherent switch's new group, a resumed rollout's
//! re-verification, `check` — a filter of it ([`Sequence`]). The order is written here once. Each
//! sequence is a chain of step functions, each calling its gate (`gates/`, a file each) and
//! taking what the step before handed on ([`Drained`] → [`Restarted`] → [`Up`]): a step cannot
//! run before the one whose output it needs. This file turns a worker's steps into events;
//! `plan_steps.rs` those that run once for a plan or a group (preflight, prefetch, the slots).

use std::time::{Duration, Instant};

use pdctl_parse::service::ServiceScrape;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::{Ctx, Outage, Repaired};
use crate::engine::gates::{
    drain, health, metrics, pair, ready, restart, router, service_level, slot, soak, stop, stranded_kv, switch_role, Deferred, Restarted,
};
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::plan_steps::take_slots;
use crate::engine::step_run::{crash_since, judged, report, Fail, StepRun, Verdict};
use crate::engine::steps::{rule, HELD_FOR_SWITCH, RAN_THROUGH};
use crate::events::{Failure, Sink, Step};
use crate::ports::{Logs, Probes, UnitState, Units};
use crate::state::revisions;

/// A worker's steps, in the order the runbook gives them ([`Step::RUNBOOK`], where it is
/// written once, beside the steps): a slot, out of the gateway, restarted (or stopped and
/// started around a reboot), ready, `/health`, its pairs, back in the gateway, its KV metrics,
/// stranded KV released, the soak. Preflight runs before the first worker; reconcile, rollback,
/// weights and switch are steps of a rollout, not of a worker's sequence.
pub const RUNBOOK: [Step; 13] = Step::RUNBOOK;

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
    /// `pdctl role set`: drained in its old role, its unit's role changed (and the server switched
    /// at run time, or restarted), then every gate a restart passes in its new role.
    Role,
}

impl Sequence {
    /// Whether the sequence runs `step`.
    pub fn runs(self, step: Step) -> bool {
        match self {
            Sequence::Restart | Sequence::Repair => RUNBOOK.contains(&step) && !matches!(step, Step::Role | Step::Stop | Step::Start),
            Sequence::Role => RUNBOOK.contains(&step) && !matches!(step, Step::Stop | Step::Start),
            Sequence::SwitchNew => RUNBOOK.contains(&step) && !matches!(step, Step::Slot | Step::Role | Step::Stop | Step::Start),
            Sequence::HostDown => matches!(step, Step::Drain | Step::Stop),
            Sequence::HostUp => RUNBOOK.contains(&step) && !matches!(step, Step::Slot | Step::Drain | Step::Role | Step::Restart | Step::Stop),
            Sequence::Verify => matches!(step, Step::Health | Step::Pair | Step::Router | Step::Metrics | Step::StrandedKv),
            Sequence::Check => matches!(step, Step::Health | Step::Router | Step::Metrics),
        }
    }

    /// Its steps, in runbook order.
    pub fn steps(self) -> impl Iterator<Item = Step> {
        RUNBOOK.into_iter().filter(move |s| self.runs(*s))
    }

    /// Whether the worker gets a new run — restarted, or started after host maintenance — that
    /// the later gates hold it to (else it is only verified).
    pub fn restarts(self) -> bool {
        self.runs(Step::Restart) || self.runs(Step::Start)
    }
}

/// One worker going through a sequence. What its steps hand on to the later ones is not kept
/// here: each step takes what the step before produced and returns what the next needs
/// ([`Drained`], [`Restarted`], [`Up`]), so the order is a type.
pub(in crate::engine) struct WorkerRun<'a> {
    /// The worker.
    pub(in crate::engine) w: &'a Worker,
    /// Which part of the runbook it runs.
    pub(in crate::engine) seq: Sequence,
    /// Where its events go.
    pub(in crate::engine) sink: &'a Sink,
    /// The rollout's context.
    pub(in crate::engine) ctx: Ctx<'a>,
    /// Host maintenance: the worker as the host's drain found it (its run, the journal's
    /// cursor before its stop) — the start step's starting point.
    pub(in crate::engine) maintained: Option<crate::state::drain_ledger::MaintainedUnit>,
    /// Host maintenance: every worker of the other PD role is still down with the host (it
    /// comes back after this one), so no request can pass the gateway yet; the pair gate
    /// proved the pair directly.
    pub(in crate::engine) peers_out: bool,
    /// A change of role (`w` in its new role): the worker as it runs now, and the way it changes.
    pub(in crate::engine) role: Option<switch_role::RoleChange<'a>>,
}

impl<'a> WorkerRun<'a> {
    /// `w` about to run `seq` in `ctx`.
    pub(in crate::engine) fn new(w: &'a Worker, seq: Sequence, sink: &'a Sink, ctx: Ctx<'a>) -> Self {
        WorkerRun { w, seq, sink, ctx, maintained: None, peers_out: false, role: None }
    }
}

/// When the worker left the gateway and its service figures from before (drain → the router
/// step's window, the soak's baseline).
#[derive(Default)]
pub(in crate::engine) struct Out {
    /// Its service figures before its drain (a restart's: the soak's baseline).
    before: Option<ServiceScrape>,
    /// When its drain began (`None`: not known — a host's resume).
    since: Option<Instant>,
}

/// What the drain step hands on: [`Out`], and the taking out left to the stop.
pub(in crate::engine) struct Drained {
    out: Out,
    deferred: Option<Deferred>,
}

/// A worker whose new run passed its ready and health steps: what its pair, router, metrics,
/// stranded-KV and soak steps hold it to.
pub(in crate::engine) struct Up<W> {
    run: Restarted<W>,
    out: Out,
}

/// A worker's step that fails before its gate runs (a repair refused, clients failing after
/// its soak): started and failed at once.
pub(in crate::engine) fn failed_before(sink: &Sink, unit: &str, step: Step, f: Fail) -> (Step, Fail) {
    StepRun::start(sink, unit, step).fail(&f);
    (step, f)
}

impl<U: Units, L: Logs, P: Probes> Engine<U, L, P> {
    /// Only the restart and ready steps of one worker, exactly as a rollout runs them (events go
    /// to `sink`; the ready event's detail has `detect_ms`): for the benchmark, and for anyone who
    /// wants to time them. Returns the unit's state after the restart.
    pub async fn restart_until_ready(&self, w: &Worker, sink: &Sink) -> Result<UnitState, Failure> {
        let r = WorkerRun::new(w, Sequence::Restart, sink, Ctx::none(Outage::Accepted, true));
        let steps = async {
            let run = restart(self, &r, None).await?;
            ready(self, &r, run).await
        };
        match steps.await {
            Ok(run) => Ok(run.after),
            Err((step, f)) => Err(halt::failure(self, &w.unit, step, f).await),
        }
    }
}

/// Run `r`'s whole sequence, then give its slots back (verified). Returns the decodes
/// restarted to repair a stale pairing its pair gate found.
pub(in crate::engine) async fn run_sequence<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<Repaired, (Step, Fail)> {
    // A pair restarted together took both slots at once before.
    let own_slot = r.seq.runs(Step::Slot) && r.ctx.scope.together_with.is_none();
    // A change of role takes its old role's slot: that role loses the worker while it changes.
    let leaves = r.role.as_ref().map_or(r.w, |c| c.was);
    let slots = if own_slot { take_slots(eng, &[leaves], r.sink, r.ctx).await? } else { Vec::new() };
    let repaired = match r.seq {
        Sequence::Restart | Sequence::Repair | Sequence::SwitchNew => {
            let up = until_healthy(eng, r).await?;
            back_in_service(eng, r, up).await?
        }
        Sequence::HostUp => {
            let run = start(eng, r).await?;
            let up = proven(eng, r, run, Out::default()).await?;
            back_in_service(eng, r, up).await?
        }
        Sequence::HostDown => {
            let d = drain(eng, r).await?;
            stop(eng, r, d).await?;
            Vec::new()
        }
        Sequence::Verify | Sequence::Check => verified(eng, r).await?,
        Sequence::Role => {
            let up = role_changed(eng, r).await?;
            back_in_service(eng, r, up).await?
        }
    };
    // Verified: the slot goes back.
    slot::release_slots(eng, &r.w.unit, &slots, r.ctx).await;
    Ok(repaired)
}

/// Restart one worker through every step ([`Sequence::Restart`]). Returns the decodes
/// restarted to repair a stale pairing found by its pair gate.
pub(in crate::engine) async fn restart_one<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    sink: &Sink,
    ctx: Ctx<'_>,
) -> Result<Repaired, (Step, Fail)> {
    run_sequence(eng, &WorkerRun::new(w, Sequence::Restart, sink, ctx)).await
}

/// Re-verify a unit without restarting it ([`Sequence::Verify`]).
pub(in crate::engine) async fn verify<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, sink: &Sink) -> bool {
    run_sequence(eng, &WorkerRun::new(w, Sequence::Verify, sink, Ctx::none(Outage::Accepted, true))).await.is_ok()
}

/// `check` of one worker ([`Sequence::Check`]).
pub(in crate::engine) async fn check_one<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, sink: &Sink) -> Result<(), (Step, Fail)> {
    run_sequence(eng, &WorkerRun::new(w, Sequence::Check, sink, Ctx::none(Outage::Check, false))).await.map(|_| ())
}

/// The first half of a restart: out of the gateway, restarted, ready, healthy. A coherent
/// switch runs it on its whole new group before the second half ([`back_in_service`]).
pub(in crate::engine) async fn until_healthy<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<Up<U::W>, (Step, Fail)> {
    let Drained { out, deferred } = drain(eng, r).await?;
    let run = restart(eng, r, deferred).await?;
    proven(eng, r, run, out).await
}

/// A change of role's first half: drained in its old role, its unit's role changed, then
/// switched at run time (no restart: the restart and ready steps say so) or restarted, ready and
/// healthy in its new role.
async fn role_changed<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<Up<U::W>, (Step, Fail)> {
    let Some(c) = r.role else {
        return Err(failed_before(r.sink, &r.w.unit, Step::Role, Fail::from(Cause::BadRequest { message: "a change of role names no old role".into() })));
    };
    let as_it_runs = WorkerRun { w: c.was, role: None, ..WorkerRun::new(c.was, r.seq, r.sink, r.ctx) };
    let Drained { out, deferred } = drain(eng, &as_it_runs).await?;
    let switched = report(r.sink, &r.w.unit, Step::Role, switch_role::change(eng, r.w, c, deferred.is_some())).await?;
    match switched {
        Some(run) => {
            for step in [Step::Restart, Step::Ready] {
                StepRun::start(r.sink, &r.w.unit, step).skip(SWITCHED_AT_RUN_TIME);
            }
            health(eng, r, Some(&run.after)).await?;
            Ok(Up { run, out })
        }
        None => {
            let run = restart(eng, r, deferred).await?;
            proven(eng, r, run, out).await
        }
    }
}

/// The restart and ready steps of a worker switched at run time.
pub const SWITCHED_AT_RUN_TIME: &str = "switched at run time (POST /pd_role_switch): no restart, its run goes on";

/// A new run's ready and health steps.
async fn proven<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>, run: Restarted<U::W>, out: Out) -> Result<Up<U::W>, (Step, Fail)> {
    let run = ready(eng, r, run).await?;
    health(eng, r, Some(&run.after)).await?;
    Ok(Up { run, out })
}

/// The second half: its pairs, back in the gateway, its KV metrics, stranded KV released, the
/// soak. Returns the decodes restarted to repair a stale pairing its pair gate found.
pub(in crate::engine) async fn back_in_service<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    r: &WorkerRun<'_>,
    up: Up<U::W>,
) -> Result<Repaired, (Step, Fail)> {
    let Up { mut run, out } = up;
    let repaired = pair(eng, r, Some(&run.after)).await?;
    // Out of the router since its drain — or since the restart took it out (deferred). A
    // run resumed after its drain does not know when that was: it records no window (one
    // from here would be its router gate alone, and the next estimate would say "about 2s").
    router_back(eng, r, run.taken_out.or(out.since), &run.after).await?;
    metrics(eng, r).await?;
    stranded(eng, r).await?;
    soak(eng, r, &mut run, out.before).await?;
    Ok(repaired)
}

/// A worker not restarted (re-verified, or `check`): health, its pairs, the router, its
/// metrics, stranded KV — as its sequence runs them.
async fn verified<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<Repaired, (Step, Fail)> {
    health(eng, r, None).await?;
    let repaired = pair(eng, r, None).await?;
    router_as_is(eng, r).await?;
    metrics(eng, r).await?;
    stranded(eng, r).await?;
    Ok(repaired)
}

/// The drain step (with its baseline for the service gate taken just before), and the point
/// a pair restarted together passes before either stops.
pub(in crate::engine) async fn drain<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<Drained, (Step, Fail)> {
    let (w, ctx) = (r.w, r.ctx);
    // A change of role has no baseline of its own: its figures in the old role are another
    // role's (the soak judges it among its new peers).
    let before = if r.seq == Sequence::Restart { service_level::before_drain(eng, w, ctx).await } else { None };
    let since = Some(Instant::now());
    let drained = match eng.settings.rollout.drain {
        true => report(r.sink, &w.unit, Step::Drain, drain::drain(eng, w, ctx)).await,
        false => Ok(None),
    };
    // Restarted together: neither stops while the other still drains (`Together`); a half
    // its drain took out of the gateway has left it, and the other half with it.
    if let Some(t) = ctx.scope.together_with {
        if eng.settings.rollout.drain && matches!(drained, Ok(None)) {
            t.left(&w.unit);
        }
        t.drained.wait().await;
    }
    Ok(Drained { out: Out { before, since }, deferred: drained? })
}

/// The restart step: a new run, the drain's deferred taking out done during its stop.
async fn restart<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>, deferred: Option<Deferred>) -> Result<Restarted<U::W>, (Step, Fail)> {
    report(r.sink, &r.w.unit, Step::Restart, restart::restart(eng, r.w, deferred.as_ref(), r.ctx.scope.together_with)).await
}

/// Host maintenance: the stop step, after its drain. Stopped for the reboot, it is no drain to
/// undo any more: the maintenance record holds it, and its resume re-registers it.
pub(in crate::engine) async fn stop<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>, d: Drained) -> Result<(), (Step, Fail)> {
    let unit = r.w.unit.as_str();
    judged(r.sink, unit, Step::Stop, stop::stop(eng, r.w, d.deferred.as_ref())).await?;
    if let Some(l) = r.ctx.writes.ledger {
        l.clear(unit).map_err(|e| (Step::Stop, Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() })))?;
    }
    Ok(())
}

/// Host maintenance: the start step after the reboot (started if the boot did not).
async fn start<U: Units, L: Logs, P>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<Restarted<U::W>, (Step, Fail)> {
    report(r.sink, &r.w.unit, Step::Start, stop::start(eng, r.w, r.maintained.as_ref())).await
}

/// The ready step: the new run's ready line, and how long this start took recorded (the
/// interruption to expect next time, if it is alone in its role).
async fn ready<U: Units, L: Logs, P>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>, mut run: Restarted<U::W>) -> Result<Restarted<U::W>, (Step, Fail)> {
    let (w, ctx, unit) = (r.w, r.ctx, r.w.unit.as_str());
    if run.ran_through {
        StepRun::start(r.sink, unit, Step::Ready).skip(RAN_THROUGH);
        return Ok(run);
    }
    let (after, cursor) = (run.after.clone(), run.cursor.clone());
    let gate = async {
        let d = ready::ready(eng, w, cursor, &mut run.watch, &after).await?;
        let at = d.journal_realtime_us;
        Ok((Verdict::passed(d), at))
    };
    let ready_us = report(r.sink, unit, Step::Ready, gate).await?;
    if let (Some(dir), true) = (ctx.writes.revisions, after.exec_main_start_us > 0) {
        let took = Duration::from_micros(ready_us.saturating_sub(after.exec_main_start_us));
        if let Err(e) = revisions::record_start(dir, unit, took.as_millis() as u64) {
            tracing::warn!(pdctl_unit = %unit, "cannot record how long {unit}'s start took: {e}");
        }
    }
    Ok(run)
}

/// The health step: of the new run (`after`), or of the run it has.
async fn health<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>, after: Option<&UnitState>) -> Result<(), (Step, Fail)> {
    // `check` says what it finds; the others wait, bounded, for the pair gate after it.
    let pair_follows = r.seq != Sequence::Check;
    judged(r.sink, &r.w.unit, Step::Health, health::health(eng, r.w, after, pair_follows)).await
}

/// The pair step, and what its sequence does with a stale pairing it finds: a restart
/// repairs it (this host's decode restarted here, another host's through the fleet), a
/// switch's new group or a re-verification fails on it, a repair finds none.
async fn pair<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>, after: Option<&UnitState>) -> Result<Repaired, (Step, Fail)> {
    let (w, sink, ctx) = (r.w, r.sink, r.ctx);
    if !r.seq.runs(Step::Pair) || w.role == Role::Regular {
        return Ok(Vec::new());
    }
    let after = match after {
        Some(a) => a.clone(),
        // Re-verified: its pairs are probed against the run it has now.
        None => eng.units.state(&w.unit).await.map_err(|e| (Step::Pair, Fail::from(e)))?,
    };
    let stale = report(sink, &w.unit, Step::Pair, pair::pair(eng, w, ctx, &after)).await?;
    let mut repaired = Vec::new();
    match r.seq {
        // A prefill back after a reboot runs a new process on its old address, as after a
        // restart: decodes that kept its old bootstrap info are repaired the same way.
        Sequence::Restart | Sequence::HostUp | Sequence::Role => {
            for st in stale {
                match &st.owner {
                    // On the heap: a repair runs a sequence of its own.
                    None => Box::pin(eng.repair(&st.decode, w, sink, ctx)).await?,
                    // A decode of another host: its own pdctld restarts it, through the fleet.
                    Some((host, unit)) => Box::pin(eng.fleet_repair(&st.decode, host, unit, w, sink, ctx)).await?,
                }
                repaired.push((st.decode, w.unit.clone()));
            }
        }
        Sequence::SwitchNew | Sequence::Verify => {
            if let Some(s) = stale.first() {
                return Err((Step::Pair, Fail::from(Cause::StalePair { decode: s.decode.unit.clone(), prefill: w.unit.clone() })));
            }
        }
        Sequence::Repair | Sequence::Check | Sequence::HostDown => {}
    }
    Ok(repaired)
}

/// The router step of a worker not restarted: a re-verified one registered again if the
/// gateway lost it; `check` only looks.
async fn router_as_is<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<(), (Step, Fail)> {
    if !eng.settings.verify.router {
        return Ok(());
    }
    let may_register = r.seq == Sequence::Verify;
    judged(r.sink, &r.w.unit, Step::Router, async { router::router(eng, r.w, may_register, false).await.map(Verdict::passed) }).await
}

/// The router step of a new run: held out for a coherent switch; else re-admitted, its drain
/// crossed off and its window out of the gateway (from `out_since`) recorded. A gateway that
/// never admitted a worker whose run ended since `after` failed on that crash, said as one.
async fn router_back<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    r: &WorkerRun<'_>,
    out_since: Option<Instant>,
    after: &UnitState,
) -> Result<(), (Step, Fail)> {
    let (w, sink, ctx) = (r.w, r.sink, r.ctx);
    let unit = w.unit.as_str();
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
    judged(sink, unit, Step::Router, async {
        // Every worker of the other PD role out of the router by this rollout's own drains
        // (a decode repaired while its prefill waits drained): no request can pass the
        // router now; the pair gate proved the pair directly.
        let peers = pair::peers(eng, w);
        let peers_drained = r.peers_out
            || !peers.is_empty() && ctx.writes.ledger.is_some_and(|l| peers.iter().all(|p| l.get(&p.unit).is_some_and(|d| d.rollout_id == ctx.writes.id)));
        let d = match router::router_recorded(eng, w, true, peers_drained, ctx.writes.ledger.map(|l| (l, ctx.writes.id))).await {
            Ok(d) => d,
            Err(f) => return Err(crash_since(&eng.units, unit, after, crate::cause::Phase::Router).await?.unwrap_or(f)),
        };
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
        Ok(Verdict::passed(d))
    })
    .await
}

/// The metrics step (`check` sends no warm-up request of its own).
async fn metrics<U, L, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<(), (Step, Fail)> {
    judged(r.sink, &r.w.unit, Step::Metrics, metrics::metrics(eng, r.w, r.seq != Sequence::Check, r.ctx)).await
}

/// The stranded-KV step, on a decode with prefills.
async fn stranded<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, r: &WorkerRun<'_>) -> Result<(), (Step, Fail)> {
    if !r.seq.runs(Step::StrandedKv) || r.w.role != Role::Decode || pair::peers(eng, r.w).is_empty() {
        return Ok(());
    }
    judged(r.sink, &r.w.unit, Step::StrandedKv, stranded_kv::stranded(eng, r.w)).await
}

/// The soak of the new run, judged against `before`; a service it could not judge is said in
/// the summary's notes, not hidden in a passed step.
async fn soak<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    r: &WorkerRun<'_>,
    run: &mut Restarted<U::W>,
    before: Option<ServiceScrape>,
) -> Result<(), (Step, Fail)> {
    let after = run.after.clone();
    let gate = async {
        let v = soak::soak(eng, r.w, &mut run.watch, &after, before).await?;
        let note = match &v {
            Verdict::Passed(_, said) => said.note.clone(),
            Verdict::Skipped(_) => None,
        };
        Ok((v, note))
    };
    let note = report(r.sink, &r.w.unit, Step::Soak, gate).await?;
    if let (Some(note), Some(notes)) = (note, r.ctx.writes.notes) {
        notes.push_last(note);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sequence_keeps_the_runbook_order_and_steps_after_restart_need_it() {
        for seq in
            [Sequence::Restart, Sequence::Repair, Sequence::SwitchNew, Sequence::Verify, Sequence::Check, Sequence::HostDown, Sequence::HostUp, Sequence::Role]
        {
            let steps: Vec<Step> = seq.steps().collect();
            let at = |s: &Step| RUNBOOK.iter().position(|x| x == s);
            assert!(steps.windows(2).all(|p| at(&p[0]) < at(&p[1])), "{seq:?}: {steps:?}");
            // Ready and soak hold the worker to the run its restart started.
            if steps.contains(&Step::Ready) || steps.contains(&Step::Soak) {
                assert!(seq.restarts(), "{seq:?}");
            }
        }
        assert_eq!(Sequence::Check.steps().collect::<Vec<_>>(), [Step::Health, Step::Router, Step::Metrics]);
        assert_eq!(Sequence::SwitchNew.steps().take(4).collect::<Vec<_>>(), [Step::Drain, Step::Restart, Step::Ready, Step::Health]);
        assert_eq!(Sequence::HostDown.steps().collect::<Vec<_>>(), [Step::Drain, Step::Stop]);
        assert_eq!(Sequence::Role.steps().take(4).collect::<Vec<_>>(), [Step::Slot, Step::Drain, Step::Role, Step::Restart]);
        assert!(!Sequence::Restart.runs(Step::Role));
        assert!(!Sequence::Verify.restarts() && Sequence::Repair.restarts());
    }
}
