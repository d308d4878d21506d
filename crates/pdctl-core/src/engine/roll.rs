//! The roll layer: a plan's workers through their restart (or check) sequences — preflight,
//! then the coherent switch's groups, a 1P1D pair together, or each worker in plan order —
//! halting at the first failure. Every kind of work that restarts workers (a restart, a config
//! rollout restarted instead, a revert, a rollback) calls down into [`plan`]; the coherent
//! switch and host maintenance into [`each`]. Nothing here calls back up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::{Ctx, Notes, Scope, Tally, Underway};
use crate::engine::gates;
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::plan_steps;
use crate::engine::runbook;
use crate::engine::step_run::{lock, Fail};
use crate::engine::work::{Groups, SwitchPlan};
use crate::events::{Failure, Outcome, Sink, Step, Summary};
use crate::plan::Plan;
use crate::ports::{Logs, Probes, Units};

pub(in crate::engine) async fn plan<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    plan: &Plan,
    sink: &Sink,
    abort: &AtomicBool,
    ctx: Ctx<'_>,
    notes: &Notes,
) -> Summary {
    let mut t = Tally { t0: Instant::now(), done: Vec::new(), repairs: std::collections::BTreeMap::new() };
    let switch_plan;
    let ctx = match (ctx.outage.restarts(), ctx.scope.switch) {
        (true, None) => {
            switch_plan = SwitchPlan { groups: eng.switch_groups(plan, ctx.fleet_rollout, false).await, needed: AtomicBool::new(false) };
            Ctx { scope: Scope { switch: Some(&switch_plan), ..ctx.scope }, ..ctx }
        }
        _ => ctx,
    };
    if let Err((unit, f)) = plan_steps::preflight(eng, plan, sink, false, ctx).await {
        return t.summary(Outcome::Failed, Some(halt::failure(eng, &unit, Step::Preflight, f).await));
    }
    // A new checkpoint read into memory before anyone stops: each start then reads it from there.
    if ctx.outage.restarts() {
        plan_steps::prefetch(eng, &gates::prefetch::targets(eng, &plan.workers).await, sink, abort, notes).await;
    }
    // A change of the model the workers compute with, on a host with two groups of both
    // roles (or, with [fleet], across the hosts behind the gateway): the old group serves
    // while the new one is restarted and verified, then the gateway switches (see
    // `switch.rs` and `fleet/switch.rs`). Before `single_pair = "together"`: with [fleet] a
    // 1P1D host's pair restarted together would pair with other hosts' old workers.
    if let (true, Some(sw)) = (ctx.outage.restarts(), ctx.scope.switch) {
        // A fleet rollout's part that needs no switch here (no change of the model on this
        // host) says so at once: hosts that do switch would otherwise wait for it in vain.
        if let (false, Ok(Groups { fleet: Some(f), .. })) = (sw.needed.load(Ordering::SeqCst), &sw.groups) {
            eng.no_fleet_switch(f, notes).await;
        }
        if let (true, Ok(g)) = (sw.needed.load(Ordering::SeqCst), &sw.groups) {
            let run = &mut Underway { sink, abort, ctx, notes, t: &mut t };
            // The switch leaves its old group to roll (through every gate, decodes first), then
            // whatever the plan has beside the groups.
            let rolled = async {
                let old = eng.run_switch(plan, g, run).await?;
                // Boxed: the restart sequences' futures are large, and this one sits deep (a
                // debug build's worker thread overflowed its stack without it).
                Box::pin(each(eng, &old, plan.workers.len(), run)).await?;
                let rest: Vec<&Worker> = plan.workers.iter().filter(|w| !run.t.done.contains(&w.unit)).collect();
                each(eng, &rest, plan.workers.len(), run).await
            };
            return match rolled.await {
                Ok(()) => run.t.summary(Outcome::Succeeded, None),
                Err(s) => s,
            };
        }
    }
    // `single_pair = "together"` on a 1P1D plan: both at once, each through every gate (one
    // interruption instead of two).
    if let (true, crate::config::SinglePair::Together, [p, d]) = (ctx.outage.restarts(), eng.settings.rollout.single_pair, plan.workers.as_slice()) {
        if p.role == Role::Prefill && d.role == Role::Decode {
            return match together(eng, p, d, sink, ctx, notes, &mut t.done).await {
                Ok(()) => t.summary(Outcome::Succeeded, None),
                Err(failure) => t.summary(Outcome::Failed, Some(failure)),
            };
        }
    }
    let all: Vec<&Worker> = plan.workers.iter().collect();
    match each(eng, &all, plan.workers.len(), &mut Underway { sink, abort, ctx, notes, t: &mut t }).await {
        Ok(()) => t.summary(Outcome::Succeeded, None),
        Err(s) => s,
    }
}

/// Each of `workers` in turn through its restart (or check) sequence, halting at the first
/// failure (`Err`: the summary to return); `total`: the plan's size (no client gate after
/// its last unit).
pub(in crate::engine) async fn each<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    workers: &[&Worker],
    total: usize,
    run: &mut Underway<'_>,
) -> Result<(), Summary> {
    let (sink, abort, ctx) = (run.sink, run.abort, run.ctx);
    let Underway { notes, t, .. } = run;
    for w in workers.iter().copied() {
        if abort.load(Ordering::SeqCst) {
            return Err(t.summary(Outcome::Aborted, None));
        }
        if t.done.contains(&w.unit) {
            notes.push(format!(
                "{} was not restarted again: it was restarted and verified earlier in this rollout, as a repair of {}",
                w.unit,
                t.repairs.get(&w.unit).map(String::as_str).unwrap_or("a prefill")
            ));
            continue;
        }
        if let Some(c) = ctx.clients {
            *lock(&c.current) = Some(w.unit.clone());
        }
        // A check restarts nothing: each worker through its check sequence.
        let r = match ctx.outage.restarts() {
            true => runbook::restart_one(eng, w, sink, ctx).await,
            false => runbook::check_one(eng, w, sink).await.map(|()| Vec::new()),
        };
        let repaired = match r {
            Ok(rep) => rep,
            Err((step, f)) => {
                let unit = f.unit.clone().unwrap_or_else(|| w.unit.clone());
                let failure = halt::failure(eng, &unit, step, f).await;
                halt::reconcile_drains(eng, &unit, step, ctx, sink, notes).await;
                return Err(t.summary(Outcome::Failed, Some(failure)));
            }
        };
        for (d, of) in repaired {
            // Another host's decode records its revision there.
            if let (Some(dir), true) = (ctx.writes.revisions, eng.settings.workers.iter().any(|x| x.unit == d.unit)) {
                notes.push(eng.record_revision(&d, dir, ctx.writes.id).await);
            }
            notes.push(format!("{} was restarted to repair its stale pairing with {of}", d.unit));
            t.done.push(d.unit.clone());
            t.repairs.insert(d.unit.clone(), of);
        }
        if let (true, Some(dir)) = (ctx.outage.restarts(), ctx.writes.revisions) {
            notes.push(eng.record_revision(w, dir, ctx.writes.id).await);
        }
        t.done.push(w.unit.clone());
        // What clients saw is a gate too: no next unit after too many failed requests.
        if let (Some(c), Some(max)) = (ctx.clients, eng.settings.rollout.max_failed_probes) {
            let failed = c.failed.load(Ordering::SeqCst);
            if failed > max && t.done.len() < total {
                let (step, f) = runbook::failed_before(sink, &w.unit, Step::Soak, Fail::from(Cause::ClientsFailing { unit: w.unit.clone(), failed, max }));
                t.done.pop();
                return Err(t.summary(Outcome::Failed, Some(halt::failure(eng, &w.unit, step, f).await)));
            }
        }
    }
    Ok(())
}

/// A 1P1D pair restarted at once (`single_pair = "together"`), each through every gate; with
/// [fleet], both slots in one transaction or none. The units verified are added to `done`.
/// Each half is the only worker of its role, so each serves through its stop's drain and leaves
/// the gateway at its server's first drain check (or its deadline) where its requests lose
/// nothing by it; neither stops before the other's drain step ended (`Together`), and from the
/// SIGTERM on SGLang's own drain keeps each half up while it holds a request: a prefill counts a
/// request until its KV is sent, a decode from the moment the gateway hands it over.
async fn together<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    p: &Worker,
    d: &Worker,
    sink: &Sink,
    ctx: Ctx<'_>,
    notes: &Notes,
    done: &mut Vec<String>,
) -> Result<(), Failure> {
    if let Some(c) = ctx.clients {
        *lock(&c.current) = Some(format!("{} + {}", p.unit, d.unit));
    }
    let slots = match plan_steps::take_slots(eng, &[p, d], sink, ctx).await {
        Ok(s) => s,
        Err((step, f)) => return Err(halt::failure(eng, &p.unit, step, f).await),
    };
    let (drained, out) = (tokio::sync::Barrier::new(2), tokio::sync::watch::Sender::new(None));
    let (tp, td) = (
        crate::engine::context::Together { unit: &d.unit, drained: &drained, out: &out },
        crate::engine::context::Together { unit: &p.unit, drained: &drained, out: &out },
    );
    let (cp, cd) = (Ctx { scope: Scope { together_with: Some(tp), ..ctx.scope }, ..ctx }, Ctx { scope: Scope { together_with: Some(td), ..ctx.scope }, ..ctx });
    let (rp, rd) = tokio::join!(runbook::restart_one(eng, p, sink, cp), runbook::restart_one(eng, d, sink, cd));
    if rp.is_ok() && rd.is_ok() {
        gates::slot::release_slots(eng, &p.unit, &slots, ctx).await;
        // The outage to expect next time is the pair's: first take-out to last re-admission.
        if let Some(dir) = ctx.writes.revisions {
            if let Err(e) = crate::state::revisions::record_pair_window(dir, &p.unit, &d.unit) {
                tracing::warn!("cannot record the interruption of {} and {} restarted together: {e}", p.unit, d.unit);
            }
        }
    }
    for (w, r) in [(p, rp), (d, rd)] {
        match r {
            Ok(_) => {
                if let Some(dir) = ctx.writes.revisions {
                    notes.push(eng.record_revision(w, dir, ctx.writes.id).await);
                }
                done.push(w.unit.clone());
            }
            Err((step, f)) => {
                let failure = halt::failure(eng, &w.unit, step, f).await;
                if let Some(l) = ctx.writes.ledger.filter(|l| l.get(&w.unit).is_some_and(|d| d.rollout_id == ctx.writes.id)) {
                    if let Some(dr) = l.get(&w.unit) {
                        notes.push(eng.reconcile(&dr, l, eng.settings.rollout.ready_timeout, sink).await.unwrap_or_else(|c| c.sentence()));
                    }
                }
                return Err(failure);
            }
        }
    }
    Ok(())
}
