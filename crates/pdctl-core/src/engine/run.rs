//! The run loop: a rollout, a check or a dry run over the plan's workers — preflight, then each
//! worker's restart sequence in plan order, halting at the first failure (and rolling back with
//! `on_failure = "rollback"`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cause::Cause;
use crate::config::{OnFailure, Role, Worker};
use crate::engine::gates;
use crate::engine::step_run::{lock, Fail, StepRun};
use crate::engine::switch::{Groups, SwitchPlan};
use crate::engine::{Clients, Ctx, Engine, Finished, KnownChanges, Mode, Outage, RolloutRun, Scope, Tally, Underway, Work, Writes, LAST_LINES};
use crate::events::{Failure, Outcome, Sink, Step, Summary};
use crate::names::{FLEET, ROUTER};
use crate::plan::Plan;
use crate::ports::{Logs, Probes, Units};

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// Restart the plan's workers one at a time through every gate.
    pub async fn rolling_restart(&self, plan: &Plan, sink: &Sink) -> Summary {
        let mut notes = Vec::new();
        self.run(plan, sink, Mode::Rollout, &AtomicBool::new(false), Ctx::none(Outage::Accepted, true), &mut notes).await
    }

    /// Every gate except restart and soak, on every worker, changing nothing.
    pub async fn check(&self, plan: &Plan, sink: &Sink) -> Summary {
        let mut s = self.run(plan, sink, Mode::Check, &AtomicBool::new(false), Ctx::none(Outage::Check, false), &mut Vec::new()).await;
        // Nothing was restarted: the units passed their checks.
        s.checked = std::mem::take(&mut s.units);
        s
    }

    /// A rollout as pdctld runs it: a rolling restart (or the rest of an interrupted one), stopped
    /// between units when `abort` is set, recording each verified unit's files as its good revision,
    /// and with `on_failure = "rollback"` restoring the failed unit's last good revision and
    /// verifying it through the same gates (then the result is `rolled_back`).
    pub async fn execute(&self, r: RolloutRun<'_>, sink: &Sink) -> Finished {
        let t0 = Instant::now();
        let mut notes = Vec::new();
        let mut plan = r.plan.clone();
        let resume = match r.work {
            Work::Restart { resume } => resume,
            _ => 0,
        };
        let lead: Vec<_> = plan.workers.iter().take(resume).cloned().collect();
        for w in lead {
            if self.verify(&w, sink).await {
                plan.workers.retain(|x| x.unit != w.unit);
                notes.push(format!("{} passed its gates again without a restart", w.unit));
            }
        }
        let clients = Clients::default();
        let deep_notes = std::sync::Mutex::new(Vec::new());
        let before = std::sync::Mutex::new(std::collections::BTreeMap::new());
        let probing = self.settings.verify.availability_probe.filter(|_| self.settings.verify.router);
        // The gateway's own count of its answers, beside the probe's (where it exports one).
        let gateway_before = if probing.is_some() { self.probes.gateway_responses().await } else { None };
        let ctx = Ctx {
            writes: Writes { id: r.id, revisions: r.revisions, ledger: r.ledger, notes: Some(&deep_notes), before: Some(&before) },
            outage: Outage::of(r.allow_outage || self.settings.rollout.allow_outage),
            scope: Scope::default(),
            clients: probing.map(|_| &clients),
            load_changes: r.load_changes,
            known: None,
            abort_in_flight: false,
            fleet_rollout: r.fleet_rollout,
        };
        if let Some(dir) = r.revisions {
            // Every unit about to restart has a revision to roll back to (recorded before the restart).
            let _ = self.staleness(dir).await;
        }
        // The probe watches the whole rollout, a rollback included: what clients saw while a
        // failed worker was out and put back is part of the figures.
        let run = async {
            let mut summary = match r.work {
                Work::Weights { target } => self.update_weights_recorded(&plan, target, r.revisions, sink, &mut notes).await,
                Work::Revert { restore } => self.revert(&plan, restore, sink, r.abort, ctx, &mut notes).await,
                Work::Restart { .. } => self.run(&plan, sink, Mode::Rollout, r.abort, ctx, &mut notes).await,
                Work::HostDrain { .. } | Work::HostResume => self.host_work(&plan, &r, ctx, sink, &mut notes).await,
            };
            if r.work.is_host() {
                clients.done.store(true, Ordering::SeqCst);
                return (summary, false);
            }
            let restarted = self.after_in_place(&plan, &r, ctx, &mut summary, sink, &mut notes).await;
            // A weights rollout changed no file: nothing to quarantine or roll back by revision.
            if r.work.weights().is_none() || restarted {
                self.after_failure(&r, ctx, &mut summary, sink, &mut notes).await;
            }
            clients.done.store(true, Ordering::SeqCst);
            (summary, restarted)
        };
        let ((mut summary, restarted), _) = tokio::join!(run, async {
            if let Some(rate) = probing {
                gates::soak::watch_clients(self, rate, &clients).await;
            }
        });
        notes.extend(std::mem::take(&mut *lock(&deep_notes)));
        // The whole rollout's time: a resume's re-verification and a rollback included.
        summary.elapsed_ms = t0.elapsed().as_millis() as u64;
        let samples = std::mem::take(&mut *lock(&clients.samples));
        let end = Instant::now();
        if probing.is_some() {
            let mut a = crate::service::availability::summarize(&samples, end);
            a.gateway = self.gateway_answers_since(gateway_before).await;
            summary.availability = Some(a);
        }
        let service_before = std::mem::take(&mut *lock(&before));
        let in_place = r.work.weights().is_some_and(|t| t.config) && !restarted;
        Finished { summary, notes, availability_by_unit: crate::service::availability::by_unit(&samples, end), service_before, in_place }
    }

    /// Host maintenance ([`Work::HostDrain`], [`Work::HostResume`]): its ledger is required
    /// (the maintenance record outlives the process and the reboot).
    async fn host_work(&self, plan: &Plan, r: &RolloutRun<'_>, ctx: Ctx<'_>, sink: &Sink, notes: &mut Vec<String>) -> Summary {
        let mut t = Tally { t0: Instant::now(), done: Vec::new(), repairs: std::collections::BTreeMap::new() };
        let Some(ledger) = r.ledger else {
            let f = Fail::from(Cause::RecordUnwritable {
                dir: "the maintenance record".into(),
                error: "host maintenance runs only in pdctld, which keeps its ledger".into(),
            });
            let unit = plan.workers.first().map(|w| w.unit.clone()).unwrap_or_default();
            return t.summary(Outcome::Failed, Some(self.failure(&unit, Step::Preflight, f).await));
        };
        let run = &mut Underway { sink, abort: r.abort, ctx, notes, t: &mut t };
        match r.work {
            Work::HostDrain { asked } => self.host_drain(plan, asked, ledger, run).await,
            _ => self.host_resume(plan, ledger, run).await,
        }
    }

    /// A config rollout loaded in place: on record as what runs, or (failed) restarted instead
    /// with `weights_fallback = "restart"` (then `true`: the summary is the restart's), or its
    /// change quarantined.
    async fn after_in_place(&self, plan: &Plan, r: &RolloutRun<'_>, ctx: Ctx<'_>, summary: &mut Summary, sink: &Sink, notes: &mut Vec<String>) -> bool {
        let (Some(to), Some(dir)) = (r.work.weights().filter(|t| t.config), r.revisions) else {
            return false;
        };
        match (summary.result, &summary.failed) {
            (Outcome::Succeeded, _) => self.record_in_place(plan, dir, notes).await,
            (Outcome::Failed, Some(f)) if f.step != Step::Preflight && self.settings.rollout.weights_fallback == crate::config::WeightsFallback::Restart => {
                notes.push(format!(
                    "{} did not take {} in place ({}; what each worker serves now: the weights step's notes); rolled out by restarting instead (weights_fallback = \"restart\")",
                    f.unit,
                    crate::state::in_place::show_parts(to.model_path, to.version),
                    f.cause_code
                ));
                *summary = self.run(plan, sink, Mode::Rollout, r.abort, ctx, notes).await;
                return true;
            }
            (Outcome::Failed, Some(f)) if f.step != Step::Preflight && f.unit != FLEET => {
                notes.extend(self.quarantine_if_changed(&f.unit, &f.cause, dir, r.id).await);
            }
            _ => {}
        }
        false
    }

    /// A failed rollout that changed files: the failed unit's change quarantined and, with
    /// `on_failure = "rollback"`, its last good revision restored and verified (`rolled_back`) —
    /// unless it was refused before anything restarted (a refusal touches nothing).
    async fn after_failure(&self, r: &RolloutRun<'_>, ctx: Ctx<'_>, summary: &mut Summary, sink: &Sink, notes: &mut Vec<String>) {
        let (Outcome::Failed, Some(f), Some(dir)) = (summary.result, &summary.failed, r.revisions) else {
            return;
        };
        if f.step != Step::Preflight && f.unit != ROUTER && f.unit != FLEET {
            notes.extend(self.quarantine_if_changed(&f.unit, &f.cause, dir, r.id).await);
        }
        // A refusal touches nothing: a slot never granted, or a preflight that refused before the
        // unit was restarted, leaves every file where it is (the change was never tried; the
        // operator or the next `rollout apply` decides).
        let refused = matches!(f.step, Step::Slot | Step::Preflight);
        let rolls_back = self.settings.rollout.on_failure == OnFailure::Rollback && f.unit != ROUTER && f.unit != FLEET;
        if rolls_back && refused {
            notes.push(format!(
                "{} was refused before anything restarted ({}): on_failure = \"rollback\" moved no file and reloaded nothing",
                f.unit, f.cause_code
            ));
        } else if rolls_back {
            let unit = f.unit.clone();
            match self.rollback(&unit, ctx, dir, sink, notes).await {
                Ok(true) => {
                    summary.result = Outcome::RolledBack;
                    readmitted_by_rollback(&unit, notes);
                }
                Ok(false) => {}
                Err(why) => notes.push(format!("rollback of {unit} failed: {why}")),
            }
        }
    }

    /// The gateway's answers (all, failed) since `before`, where it exports them both times and
    /// its counters did not restart.
    async fn gateway_answers_since(&self, before: Option<(f64, f64)>) -> Option<crate::service::availability::GatewayAnswers> {
        match (before, self.probes.gateway_responses().await) {
            (Some((all0, failed0)), Some((all, failed))) if all >= all0 && failed >= failed0 => {
                Some(crate::service::availability::GatewayAnswers { answered: (all - all0) as u64, failed: (failed - failed0) as u64 })
            }
            _ => None,
        }
    }

    pub(in crate::engine) async fn run(&self, plan: &Plan, sink: &Sink, mode: Mode, abort: &AtomicBool, ctx: Ctx<'_>, notes: &mut Vec<String>) -> Summary {
        let mut t = Tally { t0: Instant::now(), done: Vec::new(), repairs: std::collections::BTreeMap::new() };
        let switch_plan;
        let ctx = match (mode, ctx.scope.switch) {
            (Mode::Rollout, None) => {
                switch_plan = SwitchPlan { groups: self.switch_groups(plan, ctx.fleet_rollout, false).await, needed: AtomicBool::new(false) };
                Ctx { scope: Scope { switch: Some(&switch_plan), ..ctx.scope }, ..ctx }
            }
            _ => ctx,
        };
        if let Err((unit, f)) = gates::preflight::preflight(self, plan, sink, false, ctx).await {
            return t.summary(Outcome::Failed, Some(self.failure(&unit, Step::Preflight, f).await));
        }
        // A change of the model the workers compute with, on a host with two groups of both
        // roles (or, with [fleet], across the hosts behind the gateway): the old group serves
        // while the new one is restarted and verified, then the gateway switches (see
        // `switch.rs` and `fleet/switch.rs`). Before `single_pair = "together"`: with [fleet] a
        // 1P1D host's pair restarted together would pair with other hosts' old workers.
        if let (Mode::Rollout, Some(sw)) = (mode, ctx.scope.switch) {
            // A fleet rollout's part that needs no switch here (no change of the model on this
            // host) says so at once: hosts that do switch would otherwise wait for it in vain.
            if let (false, Ok(Groups { fleet: Some(f), .. })) = (sw.needed.load(Ordering::SeqCst), &sw.groups) {
                self.no_fleet_switch(f, notes).await;
            }
            if let (true, Ok(g)) = (sw.needed.load(Ordering::SeqCst), &sw.groups) {
                let run = &mut Underway { sink, abort, ctx, notes, t: &mut t };
                return match self.run_switch(plan, g, run).await {
                    Ok(()) => {
                        let rest: Vec<&Worker> = plan.workers.iter().filter(|w| !run.t.done.contains(&w.unit)).collect();
                        match self.roll_each(&rest, plan.workers.len(), mode, run).await {
                            Ok(()) => run.t.summary(Outcome::Succeeded, None),
                            Err(s) => s,
                        }
                    }
                    Err(s) => s,
                };
            }
        }
        // `single_pair = "together"` on a 1P1D plan: both at once, each through every gate (one
        // interruption instead of two).
        if let (Mode::Rollout, crate::config::SinglePair::Together, [p, d]) = (mode, self.settings.rollout.single_pair, plan.workers.as_slice()) {
            if p.role == Role::Prefill && d.role == Role::Decode {
                return match self.run_together(p, d, sink, ctx, notes, &mut t.done).await {
                    Ok(()) => t.summary(Outcome::Succeeded, None),
                    Err(failure) => t.summary(Outcome::Failed, Some(failure)),
                };
            }
        }
        let all: Vec<&Worker> = plan.workers.iter().collect();
        match self.roll_each(&all, plan.workers.len(), mode, &mut Underway { sink, abort, ctx, notes, t: &mut t }).await {
            Ok(()) => t.summary(Outcome::Succeeded, None),
            Err(s) => s,
        }
    }

    /// Each of `workers` in turn through its restart (or check) sequence, halting at the first
    /// failure (`Err`: the summary to return); `total`: the plan's size (no client gate after
    /// its last unit).
    pub(in crate::engine) async fn roll_each(&self, workers: &[&Worker], total: usize, mode: Mode, run: &mut Underway<'_>) -> Result<(), Summary> {
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
            let r = match mode {
                Mode::Rollout => self.restart_one(w, sink, ctx).await,
                Mode::Check => self.check_one(w, sink).await.map(|()| Vec::new()),
            };
            let repaired = match r {
                Ok(rep) => rep,
                Err((step, f)) => {
                    let unit = f.unit.clone().unwrap_or_else(|| w.unit.clone());
                    let failure = self.failure(&unit, step, f).await;
                    self.reconcile_this_runs_drains(&unit, step, ctx, sink, notes).await;
                    return Err(t.summary(Outcome::Failed, Some(failure)));
                }
            };
            for (d, of) in repaired {
                // Another host's decode records its revision there.
                if let (Some(dir), true) = (ctx.writes.revisions, self.settings.workers.iter().any(|x| x.unit == d.unit)) {
                    notes.push(self.record_revision(&d, dir, ctx.writes.id).await);
                }
                notes.push(format!("{} was restarted to repair its stale pairing with {of}", d.unit));
                t.done.push(d.unit.clone());
                t.repairs.insert(d.unit.clone(), of);
            }
            if let (Mode::Rollout, Some(dir)) = (mode, ctx.writes.revisions) {
                notes.push(self.record_revision(w, dir, ctx.writes.id).await);
            }
            t.done.push(w.unit.clone());
            // What clients saw is a gate too: no next unit after too many failed requests.
            if let (Some(c), Some(max)) = (ctx.clients, self.settings.rollout.max_failed_probes) {
                let failed = c.failed.load(Ordering::SeqCst);
                if failed > max && t.done.len() < total {
                    let f = Fail::from(Cause::ClientsFailing { unit: w.unit.clone(), failed, max });
                    StepRun::start(sink, &w.unit, Step::Soak).fail(&f);
                    t.done.pop();
                    return Err(t.summary(Outcome::Failed, Some(self.failure(&w.unit, Step::Soak, f).await)));
                }
            }
        }
        Ok(())
    }

    /// A 1P1D pair restarted at once (`single_pair = "together"`), each through every gate; with
    /// [fleet], both slots in one transaction or none. The units verified are added to `done`.
    async fn run_together(&self, p: &Worker, d: &Worker, sink: &Sink, ctx: Ctx<'_>, notes: &mut Vec<String>, done: &mut Vec<String>) -> Result<(), Failure> {
        if let Some(c) = ctx.clients {
            *lock(&c.current) = Some(format!("{} + {}", p.unit, d.unit));
        }
        let slots = match gates::slot::slot_step(self, &[p, d], sink, ctx).await {
            Ok(s) => s,
            Err((step, f)) => return Err(self.failure(&p.unit, step, f).await),
        };
        let drained = tokio::sync::Barrier::new(2);
        let (tp, td) = (crate::engine::Together { unit: &d.unit, drained: &drained }, crate::engine::Together { unit: &p.unit, drained: &drained });
        let (cp, cd) =
            (Ctx { scope: Scope { together_with: Some(tp), ..ctx.scope }, ..ctx }, Ctx { scope: Scope { together_with: Some(td), ..ctx.scope }, ..ctx });
        let (rp, rd) = tokio::join!(self.restart_one(p, sink, cp), self.restart_one(d, sink, cd));
        if rp.is_ok() && rd.is_ok() {
            gates::slot::release_slots(self, &p.unit, &slots, ctx).await;
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
                        notes.push(self.record_revision(w, dir, ctx.writes.id).await);
                    }
                    done.push(w.unit.clone());
                }
                Err((step, f)) => {
                    let failure = self.failure(&w.unit, step, f).await;
                    if let Some(l) = ctx.writes.ledger.filter(|l| l.get(&w.unit).is_some_and(|d| d.rollout_id == ctx.writes.id)) {
                        if let Some(dr) = l.get(&w.unit) {
                            notes.push(self.reconcile(&dr, l, self.settings.rollout.ready_timeout, sink).await.unwrap_or_else(|c| c.sentence()));
                        }
                    }
                    return Err(failure);
                }
            }
        }
        Ok(())
    }

    /// After a failed step: a drain this run made is never left behind — each worker it drained
    /// (the one rolled, a decode being repaired) is re-admitted if it serves.
    pub(in crate::engine) async fn reconcile_this_runs_drains(&self, unit: &str, step: Step, ctx: Ctx<'_>, sink: &Sink, notes: &mut Vec<String>) {
        let Some(l) = ctx.writes.ledger else { return };
        // As `after_failure` decides: a failed unit that was restarted is rolled back next.
        let rollback_follows = self.settings.rollout.on_failure == OnFailure::Rollback
            && ctx.writes.revisions.is_some()
            && !matches!(step, Step::Slot | Step::Preflight)
            && unit != ROUTER
            && unit != FLEET;
        for d in l.all().0.into_iter().filter(|d| d.rollout_id == ctx.writes.id) {
            let budget = if step == Step::Restart && d.unit == unit { self.settings.rollout.ready_timeout } else { Duration::ZERO };
            notes.push(match self.reconcile_as(&d, l, budget, sink, rollback_follows && d.unit == unit).await {
                Ok(n) => n,
                Err(c) => c.sentence(),
            });
        }
    }

    pub(in crate::engine) async fn failure(&self, unit: &str, step: Step, f: Fail) -> Failure {
        let last_lines = if unit == ROUTER || unit == FLEET {
            Vec::new()
        } else if !f.last_lines.is_empty() {
            f.last_lines
        } else {
            self.settled_last_lines(unit).await
        };
        Failure::new(unit, step, &f.cause, last_lines)
    }

    /// The unit's last lines once its journal has settled. A process's own output reaches
    /// journald through its stream, the manager's "Failed with result" through the manager: read
    /// at once, a failed start's last words (an `ExecStartPre=` that printed why) can still be
    /// on their way. Read again every 200 ms until two reads agree (at most 2 s).
    async fn settled_last_lines(&self, unit: &str) -> Vec<String> {
        let mut lines = self.logs.last_lines(unit, LAST_LINES).await.unwrap_or_default();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let again = self.logs.last_lines(unit, LAST_LINES).await.unwrap_or_default();
            if again == lines {
                break;
            }
            lines = again;
        }
        lines
    }

    /// `--dry-run`: the plan's preflight verdict, touching nothing (no daemon-reload either).
    /// `load_changes`: as the real run's ([`RolloutRun::load_changes`]); `known`: pdctld's view of
    /// pending changes and quarantines, where it could be asked.
    pub async fn dry_run(&self, plan: &Plan, sink: &Sink, allow_outage: bool, load_changes: bool, known: Option<&KnownChanges>) -> Summary {
        let t0 = Instant::now();
        let switch_plan = SwitchPlan { groups: self.switch_groups(plan, None, true).await, needed: AtomicBool::new(false) };
        let ctx = Ctx {
            known,
            scope: Scope { switch: Some(&switch_plan), ..Scope::default() },
            ..Ctx::none(Outage::of(allow_outage || self.settings.rollout.allow_outage), load_changes)
        };
        let failed = match gates::preflight::preflight(self, plan, sink, true, ctx).await {
            Ok(()) => None,
            Err((unit, f)) => Some(self.failure(&unit, Step::Preflight, f).await),
        };
        Summary::untouched(t0.elapsed().as_millis() as u64, failed)
    }
}

/// After a rollback re-admitted `unit`: the note its failure left ("… pdctl keeps its drain on
/// record", `Cause::DrainNotRestored`) is no longer so, and says what happened instead.
fn readmitted_by_rollback(unit: &str, notes: &mut [String]) {
    let kept = Cause::DrainNotRestored { unit: unit.to_string(), why: String::new() }.sentence();
    let head = format!("{} (", kept.split(" (").next().unwrap_or(&kept));
    for n in notes.iter_mut().filter(|n| n.starts_with(&head)) {
        *n = format!(
            "{unit} was out of the router and not serving after its failed gate; the rollback put its last good revision back, verified it and re-admitted it (its drain is cleared)"
        );
    }
}
