//! The run loop: a rollout, a check or a dry run over the plan's workers — preflight, then each
//! worker's restart sequence in plan order, halting at the first failure (and rolling back with
//! `on_failure = "rollback"`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::cause::Cause;
use crate::engine::context::{Clients, Ctx, Notes, Outage, Scope, Tally, Underway, Writes};
use crate::engine::gates;
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::plan_steps;
use crate::engine::policy::{self, AfterInPlace, Failed, Rollback};
use crate::engine::roll;
use crate::engine::runbook;
use crate::engine::step_run::{lock, Fail};
use crate::engine::work::{Finished, KnownChanges, RolloutRun, SwitchPlan, Work};
use crate::engine::{host, recovery, weights};
use crate::events::{Outcome, Sink, Step, Summary};
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
        roll::plan(self, plan, sink, &AtomicBool::new(false), Ctx::none(Outage::Accepted, true), &Notes::default()).await
    }

    /// Every gate except restart and soak, on every worker, changing nothing.
    pub async fn check(&self, plan: &Plan, sink: &Sink) -> Summary {
        let mut s = roll::plan(self, plan, sink, &AtomicBool::new(false), Ctx::none(Outage::Check, false), &Notes::default()).await;
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
        let notes = Notes::default();
        let mut plan = r.plan.clone();
        let (resume, role) = match r.work {
            Work::Restart { resume, role } => (resume, role),
            _ => (0, false),
        };
        let lead: Vec<_> = plan.workers.iter().take(resume).cloned().collect();
        for w in lead {
            if runbook::verify(self, &w, sink).await {
                plan.workers.retain(|x| x.unit != w.unit);
                notes.push(format!("{} passed its gates again without a restart", w.unit));
                if let Some(dir) = r.revisions {
                    notes.push(self.record_revision_of(&w, dir, r.id, role).await);
                }
            }
        }
        let clients = Clients::default();
        let before = std::sync::Mutex::new(std::collections::BTreeMap::new());
        let probing = self.settings.verify.availability_probe.filter(|_| self.settings.verify.router);
        // The gateway's own count of its answers, beside the probe's (where it exports one).
        let gateway_before = if probing.is_some() { self.probes.gateway_responses().await } else { None };
        let ctx = Ctx {
            writes: Writes { id: r.id, revisions: r.revisions, ledger: r.ledger, notes: Some(&notes), before: Some(&before) },
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
                Work::Weights { target } => weights::update_recorded(self, &plan, target, r.revisions, sink, &notes).await,
                Work::Revert { restore } => recovery::revert(self, &plan, restore, sink, r.abort, ctx, &notes).await,
                Work::Restart { .. } => roll::plan(self, &plan, sink, r.abort, ctx, &notes).await,
                Work::HostDrain { .. } | Work::HostResume => self.host_work(&plan, &r, ctx, sink, &notes).await,
            };
            if r.work.is_host() {
                clients.done.store(true, Ordering::SeqCst);
                return (summary, false);
            }
            let restarted = self.after_in_place(&plan, &r, ctx, &mut summary, sink, &notes).await;
            // A weights rollout changed no file: nothing to quarantine or roll back by revision.
            if r.work.weights().is_none() || restarted {
                self.after_failure(&r, ctx, &mut summary, sink, &notes).await;
            }
            clients.done.store(true, Ordering::SeqCst);
            (summary, restarted)
        };
        let ((mut summary, restarted), _) = tokio::join!(run, async {
            if let Some(rate) = probing {
                gates::soak::watch_clients(self, rate, &clients).await;
            }
        });
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
        Finished { summary, notes: notes.into_vec(), availability_by_unit: crate::service::availability::by_unit(&samples, end), service_before, in_place }
    }

    /// Host maintenance ([`Work::HostDrain`], [`Work::HostResume`]): its ledger is required
    /// (the maintenance record outlives the process and the reboot).
    async fn host_work(&self, plan: &Plan, r: &RolloutRun<'_>, ctx: Ctx<'_>, sink: &Sink, notes: &Notes) -> Summary {
        let mut t = Tally { t0: Instant::now(), done: Vec::new(), repairs: std::collections::BTreeMap::new() };
        let Some(ledger) = r.ledger else {
            let f = Fail::from(Cause::RecordUnwritable {
                dir: "the maintenance record".into(),
                error: "host maintenance runs only in pdctld, which keeps its ledger".into(),
            });
            let unit = plan.workers.first().map(|w| w.unit.clone()).unwrap_or_default();
            return t.summary(Outcome::Failed, Some(halt::failure(self, &unit, Step::Preflight, f).await));
        };
        let run = &mut Underway { sink, abort: r.abort, ctx, notes, t: &mut t };
        match r.work {
            Work::HostDrain { asked } => host::drain(self, plan, asked, ledger, run).await,
            _ => host::resume(self, plan, ledger, run).await,
        }
    }

    /// A config rollout loaded in place: on record as what runs, or (failed) restarted instead
    /// with `weights_fallback = "restart"` (then `true`: the summary is the restart's), or its
    /// change quarantined.
    async fn after_in_place(&self, plan: &Plan, r: &RolloutRun<'_>, ctx: Ctx<'_>, summary: &mut Summary, sink: &Sink, notes: &Notes) -> bool {
        let (Some(to), Some(dir)) = (r.work.weights().filter(|t| t.config), r.revisions) else {
            return false;
        };
        let f = match (summary.result, &summary.failed) {
            (Outcome::Succeeded, _) => {
                self.record_in_place(plan, dir, notes).await;
                return false;
            }
            (Outcome::Failed, Some(f)) => f.clone(),
            _ => return false,
        };
        match policy::after_in_place(Failed { step: f.step, unit: &f.unit }, &self.settings.rollout) {
            AfterInPlace::RestartInstead => {
                notes.push(format!(
                    "{} did not take {} in place ({}; what each worker serves now: the weights step's notes); rolled out by restarting instead (weights_fallback = \"restart\")",
                    f.unit,
                    crate::state::in_place::show_parts(to.model_path, to.version),
                    f.cause_code
                ));
                *summary = roll::plan(self, plan, sink, r.abort, ctx, notes).await;
                return true;
            }
            AfterInPlace::Quarantine => notes.extend(self.quarantine_if_changed(&f.unit, &f.cause, dir, r.id).await),
            AfterInPlace::Nothing => {}
        }
        false
    }

    /// A failed rollout that changed files: the failed unit's change quarantined and, with
    /// `on_failure = "rollback"`, its last good revision restored and verified (`rolled_back`) —
    /// unless it was refused before anything restarted (a refusal touches nothing).
    async fn after_failure(&self, r: &RolloutRun<'_>, ctx: Ctx<'_>, summary: &mut Summary, sink: &Sink, notes: &Notes) {
        let (Outcome::Failed, Some(f), Some(dir)) = (summary.result, &summary.failed, r.revisions) else {
            return;
        };
        let then = policy::after_restart(Failed { step: f.step, unit: &f.unit }, &self.settings.rollout, true);
        if then.quarantine {
            notes.extend(self.quarantine_if_changed(&f.unit, &f.cause, dir, r.id).await);
        }
        match then.rollback {
            Rollback::No => {}
            // A refusal touches nothing: a slot never granted, or a preflight that refused before
            // the unit was restarted, leaves every file where it is (the change was never tried;
            // the operator or the next `rollout apply` decides).
            Rollback::Refused => notes.push(format!(
                "{} was refused before anything restarted ({}): on_failure = \"rollback\" moved no file and reloaded nothing",
                f.unit, f.cause_code
            )),
            Rollback::Yes => {
                let unit = f.unit.clone();
                match recovery::rollback(self, &unit, ctx, dir, sink, notes).await {
                    Ok(true) => {
                        summary.result = Outcome::RolledBack;
                        notes.amend(|said| readmitted_by_rollback(&unit, said));
                    }
                    Ok(false) => {}
                    Err(why) => notes.push(format!("rollback of {unit} failed: {why}")),
                }
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
        let failed = match plan_steps::preflight(self, plan, sink, true, ctx).await {
            Ok(()) => None,
            Err((unit, f)) => Some(halt::failure(self, &unit, Step::Preflight, f).await),
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
