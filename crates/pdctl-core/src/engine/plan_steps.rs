//! The steps that run once for a plan or a group of workers rather than along one worker's
//! sequence ([`crate::engine::runbook`]): preflight (every worker, then the fleet's store and the
//! gateway) before anything is touched, the new checkpoints read into the page cache before the
//! first worker stops, and the fleet slots a worker, a pair restarted together or a host's workers
//! take at once. Like the runbook, this turns their gates' verdicts into events.

use std::sync::atomic::AtomicBool;

use crate::config::Worker;
use crate::details::{PrefetchRead, SlotWait};
use crate::engine::context::{Ctx, Notes};
use crate::engine::gates::{prefetch, preflight, slot};
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, judged, Fail, StepRun, Verdict};
use crate::engine::steps::{rule, GateMode};
use crate::events::{Sink, Status, Step};
use crate::fleet::SlotRecord;
use crate::names::{FLEET, ROUTER};
use crate::plan::Plan;
use crate::ports::{Probes, Units};

/// Preflight, before anything is touched: every worker of the plan in order, then the fleet's
/// store (with `[fleet]`) and the gateway (when verified). Returns the unit (or `fleet`,
/// `router`) that failed.
pub(in crate::engine) async fn preflight<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    plan: &Plan,
    sink: &Sink,
    dry: bool,
    ctx: Ctx<'_>,
) -> Result<(), (String, Fail)> {
    let mut seen = preflight::Seen::first(eng).await;
    for w in &plan.workers {
        let gate = async { preflight::preflight_worker(eng, w, plan, dry, ctx, &mut seen).await.map(Verdict::passed) };
        judged(sink, &w.unit, Step::Preflight, gate).await.map_err(|(_, f)| (w.unit.clone(), f))?;
    }
    if slot::applies(eng) {
        let gate = async { preflight::preflight_fleet(eng, dry).await.map(Verdict::passed) };
        judged(sink, FLEET, Step::Preflight, gate).await.map_err(|(_, f)| (FLEET.to_string(), f))?;
    }
    if eng.settings.verify.router {
        let gate = async { preflight::preflight_router(eng).await.map(Verdict::passed) };
        judged(sink, ROUTER, Step::Preflight, gate).await.map_err(|(_, f)| (ROUTER.to_string(), f))?;
    }
    Ok(())
}

/// New checkpoints read into the page cache before the first worker stops or pauses: a step of
/// the rollout for each, written under the first worker that reads it (progress as `started`
/// events); what was not read, and why, is said in the summary.
pub(in crate::engine) async fn prefetch<U, L, P>(eng: &Engine<U, L, P>, targets: &[prefetch::Target], sink: &Sink, abort: &AtomicBool, notes: &Notes) {
    if rule(Step::Prefetch, &eng.settings).mode == GateMode::Off {
        return;
    }
    for t in targets {
        let Some(unit) = t.units.first() else { continue };
        let s = StepRun::start(sink, unit, Step::Prefetch);
        let v = prefetch::prefetch(t, abort, &|p: PrefetchRead| s.emit(Status::Started, detail_of(&p))).await;
        match &v {
            Verdict::Skipped(why) => notes.push(why.clone()),
            Verdict::Passed(_, said) => notes.extend(said.note.clone()),
        }
        s.end(v);
    }
}

/// The slot step for `ws` at once (one worker, a pair restarted together, a host's workers):
/// their slots of the fleet's budget (nothing without `[fleet]`).
pub(in crate::engine) async fn take_slots<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    ws: &[&Worker],
    sink: &Sink,
    ctx: Ctx<'_>,
) -> Result<Vec<SlotRecord>, (Step, Fail)> {
    let Some(first) = ws.first().filter(|_| slot::applies(eng)) else { return Ok(Vec::new()) };
    let s = StepRun::start(sink, &first.unit, Step::Slot);
    // Each new reason to wait, as the step's progress.
    let waiting = |why: &str| s.emit(Status::Started, detail_of(&SlotWait { waiting: why.to_string() }));
    let r = slot::slot(eng, ws, ctx, &waiting).await;
    match r {
        Ok((verdict, recs)) => {
            s.end(verdict);
            Ok(recs)
        }
        Err(f) => {
            s.fail(&f);
            Err((Step::Slot, f))
        }
    }
}
