//! Driving a rollout: the one running slot taken, the engine run in a task, every event
//! persisted and streamed, the record concluded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pdctl_contract::api::{Record, Request, RolloutKind, Started, StartedBy, StreamLine};
use pdctl_contract::cause::Cause;
use pdctl_contract::events::{Event, Status, Step};
use pdctl_contract::lifecycle::{now, RolloutState};
use pdctl_core::engine::{RolloutRun, Work};
use pdctl_core::plan::Plan;
use pdctl_core::sglang::role_switch::Flip;
use pdctl_real::RealEngine;
use tokio::sync::broadcast;

use crate::metrics::{FailureLabel, ResultLabel, StepLabel};

use super::planning::{self, Planning, Restore, Weights};
use super::{engine, lock, notify_status, Daemon, Running};

/// Frees the running slot when a start fails before the rollout's task takes it over.
pub(super) struct Slot<'a> {
    daemon: &'a Daemon,
    armed: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.armed {
            *lock(&self.daemon.running) = None;
            self.daemon.metrics.running.set(0);
        }
    }
}

/// Start a rollout: take the one running slot (busy check and lock are one step), then load the
/// config, plan, and hand over to a task. `Ok` with the id, or the cause.
pub(super) async fn start(daemon: Arc<Daemon>, req: Request, by: StartedBy) -> Result<Started, Cause> {
    same_config(&daemon, &req)?;
    let reverts = match &req {
        Request::Revert { id, .. } => Some(id.clone()),
        _ => None,
    };
    let (id, abort, tx, record) = take_slot(&daemon)?;
    daemon.metrics.running.set(1);
    let mut guard = Slot { daemon: &daemon, armed: true };
    let e = engine(&daemon).await?;
    daemon.storm_refusal(&e.settings)?;
    let p = match planning::plan(&daemon, &e, req, &id).await? {
        Planning::Run(p) => *p,
        Planning::Nothing(message) => return Ok(Started { id: None, message: Some(message) }),
    };
    {
        let mut r = lock(&record);
        *r = Record::new(&id, p.kind, p.plan.workers.iter().map(|w| w.unit.clone()).collect(), p.reasons, p.resumes);
        r.allow_outage = p.allow_outage;
        r.load_changes = p.load_changes;
        r.reverts = reverts;
        // A resume's record carries the windows its interrupted rollout kept workers out.
        if let Some(old) = r.resumes.clone().and_then(|o| daemon.load(&o)) {
            for (u, w) in &old.windows {
                r.notes.push(format!("in the interrupted rollout {}: {u} was {}", old.id, w.sentence()));
            }
        }
        // A config rollout loading in place says so from its start (a resume refuses it).
        r.in_place = p.kind == RolloutKind::Apply && p.weights.is_some();
        r.started_by = Some(by);
        r.notes.extend(p.notes.iter().cloned());
        daemon.store.save(&r).map_err(|er| Cause::RecordUnwritable { dir: daemon.store.dir().display().to_string(), error: er.to_string() })?;
    }
    guard.armed = false;
    daemon.rollouts_begun.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let (kind, plan, reverify, restore, weights, flips) = (p.kind, p.plan, p.reverify, p.restore, p.weights, p.flips);
    notify_status(&format!("rollout {id} ({}): starting", kind.as_str()));
    tracing::info!(pdctl_rollout_id = %id, "rollout {id} ({}) started: {}", kind.as_str(), plan.workers.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", "));
    let d2 = daemon.clone();
    let id2 = id.clone();
    let limits = (e.settings.rollout.clone(), e.settings.verify);
    let task = tokio::spawn(async move { run(d2, e, plan, id2, kind, record, tx, abort, (reverify, restore, weights, flips)).await });
    if let Some(r) = lock(&daemon.running).as_mut().filter(|r| r.id == id) {
        *lock(&r.task) = Some(task.abort_handle());
        r.limits = Some(limits);
    }
    Ok(Started { id: Some(id), message: None })
}

/// The client planned with its config: a rollout of another one is refused, never run silently.
fn same_config(daemon: &Daemon, req: &Request) -> Result<(), Cause> {
    if let Request::Restart { config: Some(given), .. }
    | Request::Apply { config: Some(given), .. }
    | Request::Resume { config: Some(given), .. }
    | Request::Weights { config: Some(given), .. }
    | Request::Revert { config: Some(given), .. }
    | Request::HostDrain { config: Some(given), .. }
    | Request::HostResume { config: Some(given), .. }
    | Request::Role { config: Some(given), .. } = req
    {
        let ours = pdctl_core::config::identity(&daemon.config);
        if ours.as_ref().map(|o| &o.sha256) != Some(&given.sha256) {
            return Err(Cause::ConfigMismatch {
                given: given.describe(),
                daemon: ours.map(|o| o.describe()).unwrap_or_else(|| format!("{} (unreadable)", daemon.config.display())),
            });
        }
    }
    Ok(())
}

/// The running slot, taken: the new rollout's id, abort flag, event channel and record.
type Taken = (String, Arc<AtomicBool>, broadcast::Sender<StreamLine>, Arc<Mutex<Record>>);

/// Take the one running slot (refused while another rollout runs, drains are reconciled, or
/// records cannot be written).
fn take_slot(daemon: &Daemon) -> Result<Taken, Cause> {
    let mut slot = lock(&daemon.running);
    if let Some(other) = slot.as_ref() {
        return Err(Cause::Busy { id: other.id.clone() });
    }
    if daemon.reconciling.load(Ordering::SeqCst) {
        let mut units: Vec<String> = daemon.store.ledger().all().0.into_iter().map(|d| d.unit).collect();
        units.extend(lock(&daemon.paused_at_start).iter().map(|w| w.unit.clone()));
        return Err(Cause::Reconciling { units });
    }
    if let Some(error) = lock(&daemon.record_error).clone() {
        return Err(Cause::RecordsFailing { error });
    }
    let id = daemon.store.new_id();
    let (tx, _) = broadcast::channel(4096);
    let abort = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::new(&id, RolloutKind::Restart, vec![], BTreeMap::new(), None)));
    *slot = Some(Running {
        id: id.clone(),
        abort: abort.clone(),
        tx: tx.clone(),
        record: record.clone(),
        task: Mutex::new(None),
        progress: Mutex::new((std::time::Instant::now(), Step::Preflight)),
        limits: None,
    });
    Ok((id, abort, tx, record))
}

/// Persist, broadcast, count and log one event.
pub(super) fn on_event(daemon: &Daemon, id: &str, record: &Mutex<Record>, tx: &broadcast::Sender<StreamLine>, ev: Event) {
    if let Some(r) = lock(&daemon.running).as_ref().filter(|r| r.id == id) {
        *lock(&r.progress) = (std::time::Instant::now(), ev.step);
    }
    {
        let mut r = lock(record);
        if ev.status == Status::Started {
            if let Err(e) = r.lifecycle.enter(&ev.unit, ev.step) {
                tracing::error!(pdctl_rollout_id = %id, "{e}");
            }
        }
        r.events.push(ev.clone());
        // The operator first: the event goes to every stream, then the record is written (an
        // fsync'd rewrite of the whole record, milliseconds on a disk). Both under the record's
        // lock, as a new stream reads its backlog under it. The write blocks this thread, so the
        // runtime is told (`block_in_place`): the stream task the send just woke sits in this
        // worker's queue and would otherwise wait for the write (most of the ready line's way to
        // the CLI before: docs/benchmarks.md, "The ready line at the operator").
        let _ = tx.send(StreamLine::Event(ev.clone()));
        tokio::task::block_in_place(|| daemon.save(&r));
    }
    tracing::info!(pdctl_rollout_id = %id, pdctl_unit = %ev.unit, pdctl_step = ev.step.as_str(), "{}", pdctl_core::engine::sentence(&ev));
    match ev.status {
        Status::Passed => daemon.metrics.step_duration.get_or_create(&StepLabel { step: ev.step.as_str().into() }).observe(ev.elapsed_ms as f64 / 1000.0),
        Status::Failed => {
            // The engine puts its Cause's code here (Cause::code: a fixed set).
            let cause = pdctl_contract::details::Said::of(&ev.detail).cause_code.unwrap_or_else(|| "unknown".into());
            daemon.metrics.gate_failures.get_or_create(&FailureLabel { step: ev.step.as_str().into(), cause }).inc();
        }
        Status::Started | Status::Skipped => {}
    }
    if ev.step == Step::Soak && ev.status == Status::Passed {
        daemon.metrics.units_restarted.inc();
    }
    notify_status(&format!(
        "rollout {id}: {} {} {}",
        ev.unit,
        ev.step.as_str(),
        match ev.status {
            Status::Started => "started",
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
        }
    ));
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    daemon: Arc<Daemon>,
    e: RealEngine,
    plan: Plan,
    id: String,
    kind: RolloutKind,
    record: Arc<Mutex<Record>>,
    tx: broadcast::Sender<StreamLine>,
    abort: Arc<AtomicBool>,
    (reverify, restore, weights, flips): (usize, Restore, Option<Weights>, Option<Vec<Flip>>),
) {
    let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let consumer = {
        let (daemon, record, tx, id) = (daemon.clone(), record.clone(), tx.clone(), id.clone());
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                on_event(&daemon, &id, &record, &tx, ev);
            }
        })
    };
    let dir = daemon.store.revisions_dir();
    let (allow_outage, load_changes, fleet_rollout, by, resumes) = {
        let r = lock(&record);
        (
            r.allow_outage,
            r.load_changes,
            r.started_by.as_ref().and_then(|b| b.fleet_rollout.clone()),
            r.started_by.clone().unwrap_or_default(),
            r.resumes.clone(),
        )
    };
    let resumed_role = resumes.and_then(|old| daemon.load(&old)).is_some_and(|old| old.kind == RolloutKind::Role);
    let who = by.who();
    let asked = pdctl_core::engine::Asked { by: &who, reason: by.reason.as_deref() };
    let work = work_of(kind, asked, restore.as_ref(), weights.as_ref(), reverify, resumed_role);
    let run = RolloutRun {
        plan: &plan,
        work,
        abort: &abort,
        revisions: Some(&dir),
        ledger: Some(daemon.store.ledger()),
        id: &id,
        allow_outage,
        load_changes,
        // A fleet rollout's own part (not a revert or a resume of it): its phases are its own.
        fleet_rollout: fleet_rollout.as_deref().filter(|_| kind == RolloutKind::Restart),
    };
    let mut e = e;
    let mut finished = match &flips {
        Some(flips) => e.change_roles(run, flips, &sink).await,
        None => e.execute(run, &sink).await,
    };
    daemon.keep_baseline(&id, std::mem::take(&mut finished.service_before));
    drop(sink);
    let _ = consumer.await;
    finished.summary.id = Some(id.clone());
    // A cause's next step names "the rollout" as `ID` (it is written without one): this one.
    if let Some(f) = finished.summary.failed.as_mut() {
        f.next = f.next.replace("pdctl rollout show ID", &format!("pdctl rollout show {id}"));
    }
    let summary = finished.summary;
    let state = RolloutState::of(summary.result);
    counted(&daemon, &summary, state);
    {
        let mut r = lock(&record);
        if let Err(er) = r.lifecycle.conclude(&summary) {
            tracing::error!(pdctl_rollout_id = %id, "{er}");
        }
        r.finished_at = Some(now());
        r.summary = Some(summary.clone());
        r.notes.extend(finished.notes);
        r.availability_by_unit = finished.availability_by_unit;
        r.windows = pdctl_contract::window::windows(&r.events);
        r.in_place = finished.in_place;
        daemon.save(&r);
    }
    daemon.metrics.drained.set(daemon.store.ledger().all().0.len() as i64);
    tracing::info!(pdctl_rollout_id = %id, "rollout {id} finished: {}", state.as_str());
    let _ = tx.send(StreamLine::Summary(Box::new(summary)));
    {
        let mut slot = lock(&daemon.running);
        if slot.as_ref().is_some_and(|r| r.id == id) {
            *slot = None;
        }
    }
    daemon.metrics.running.set(0);
    daemon.prune_records();
    notify_status(&format!("idle; last rollout {id}: {}", state.as_str()));
}

/// The work a rollout of `kind` asks of the engine (`reverify`: a resume's units verified again
/// without a restart; `resumed_role`: of an interrupted change of role).
fn work_of<'a>(
    kind: RolloutKind,
    asked: pdctl_core::engine::Asked<'a>,
    restore: Option<&'a BTreeMap<String, pdctl_core::state::revisions::Revision>>,
    weights: Option<&'a Weights>,
    reverify: usize,
    resumed_role: bool,
) -> Work<'a> {
    match (restore, weights) {
        _ if kind == RolloutKind::HostDrain => Work::HostDrain { asked },
        _ if kind == RolloutKind::HostResume => Work::HostResume,
        (_, Some((model_path, version, fleet))) => Work::Weights {
            target: pdctl_core::engine::WeightsTarget {
                model_path,
                version: version.as_deref(),
                fleet_rollout: fleet.as_deref(),
                config: kind == RolloutKind::Apply,
            },
        },
        (Some(restore), None) => Work::Revert { restore },
        (None, None) => Work::Restart { resume: if kind == RolloutKind::Resume { reverify } else { 0 }, role: resumed_role },
    }
}

/// A finished rollout in the metrics: its result (refused before anything was touched — at
/// preflight — is not a failed rollout), the last success, what clients saw.
fn counted(daemon: &Daemon, summary: &pdctl_contract::events::Summary, state: RolloutState) {
    let refused = state == RolloutState::Failed && summary.units.is_empty() && summary.failed.as_ref().is_some_and(|f| f.step == Step::Preflight);
    daemon.metrics.rollouts.get_or_create(&ResultLabel { result: if refused { "refused".into() } else { state.as_str().into() } }).inc();
    if state == RolloutState::Succeeded {
        daemon.metrics.last_success.set(now() as i64);
    }
    if let Some(a) = &summary.availability {
        daemon.metrics.probes.inc_by(a.probes);
        daemon.metrics.probes_failed.inc_by(a.failed);
        daemon.metrics.longest_error.set(a.longest_error_ms as f64 / 1000.0);
    }
}
