//! The daemon's control API: transport (HTTP/1.1 + JSON on a Unix socket), persistence of every
//! event, sd_notify status and metrics around the engine. What a rollout does is decided in
//! pdctl-core (`Engine::execute`: gates, resume, rollback); what its API looks like in
//! `pdctl_core::api`; how it fails in `pdctl_core::cause`.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pdctl_core::api::{
    AbortAccepted, ApiError, ConfigIdentity, DaemonStatus, Diff, DiffWorker, FleetRequest, History, HostResult, Interruption, LastRollout, Record, Request,
    RolloutKind, Started, StartedBy, StreamLine, UnitSnapshot,
};
use pdctl_core::cause::Cause;
use pdctl_core::drains::Drain;
use pdctl_core::engine::RolloutRun;
use pdctl_core::events::{Event, Status, Step};
use pdctl_core::lifecycle::{now, RolloutState};
use pdctl_core::plan::Plan;
use pdctl_core::ports::Units as _;
use pdctl_core::real::{RealEngine, SystemdUnits};
use tokio::sync::broadcast;

use crate::metrics::{FailureLabel, Metrics, ResultLabel, StepLabel};
use crate::store::Store;

struct Running {
    id: String,
    abort: Arc<AtomicBool>,
    tx: broadcast::Sender<StreamLine>,
    record: Arc<Mutex<Record>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// When the engine last emitted an event, and the step it is in.
    progress: Mutex<(std::time::Instant, Step)>,
    /// Its settings' deadlines (for the watchdog's progress check).
    limits: Option<pdctl_core::config::Rollout>,
}

/// Shared daemon state.
pub struct Daemon {
    /// Main config file.
    pub config: PathBuf,
    /// The state directory.
    pub store: Store,
    /// Own metrics.
    pub metrics: Metrics,
    running: Mutex<Option<Running>>,
    /// Drains from before this process are being undone: no rollout starts meanwhile.
    reconciling: AtomicBool,
    /// Why the last record write failed, while some record is unsaved.
    record_error: Mutex<Option<String>>,
    /// Records whose latest state could not be written yet (retried; served from here).
    unsaved: Mutex<BTreeMap<String, Record>>,
}

/// The error response of `cause`: its HTTP status and the documented JSON body.
pub fn api_err(cause: &Cause) -> Response {
    let status = StatusCode::from_u16(cause.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(ApiError::of(cause))).into_response()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn notify_status(s: &str) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(s)]);
}

fn config(daemon: &Daemon) -> Result<pdctl_core::config::Settings, Cause> {
    pdctl_core::config::load(&daemon.config).map_err(|e| Cause::ConfigInvalid { message: e.to_string() })
}

async fn engine(daemon: &Daemon) -> Result<RealEngine, Cause> {
    pdctl_core::real::connect(config(daemon)?).await.map_err(|e| e.cause())
}

/// Each unit's systemd state now (for an interruption).
async fn snapshot(sd: Option<&SystemdUnits>, units: &[String]) -> Vec<UnitSnapshot> {
    let mut out = Vec::new();
    for u in units {
        let none =
            |error: String| UnitSnapshot { unit: u.clone(), active_state: None, sub_state: None, invocation_id: None, n_restarts: None, error: Some(error) };
        out.push(match sd {
            Some(sd) => match sd.state(u).await {
                Ok(s) => UnitSnapshot {
                    unit: u.clone(),
                    active_state: Some(s.active_state),
                    sub_state: Some(s.sub_state),
                    invocation_id: Some(s.invocation_id),
                    n_restarts: Some(s.n_restarts),
                    error: None,
                },
                Err(e) => none(e.to_string()),
            },
            None => none("systemd not reachable".into()),
        });
    }
    out
}

impl Daemon {
    /// A daemon over `store`; rollouts left running by a previous process are marked interrupted
    /// (with each unit's state now), and nothing resumes by itself. Drains left in the ledger are
    /// undone by [`Daemon::reconcile_at_start`]; until then no rollout starts.
    pub async fn new(config: PathBuf, store: Store) -> Daemon {
        let d = Daemon {
            config,
            store,
            metrics: Metrics::default(),
            running: Mutex::new(None),
            reconciling: AtomicBool::new(false),
            record_error: Mutex::new(None),
            unsaved: Mutex::new(BTreeMap::new()),
        };
        let (records, corrupt) = d.store.all();
        for c in &corrupt {
            tracing::error!("rollout record {} does not read ({}); it is listed as corrupt in pdctl rollout history", c.file, c.error);
        }
        d.metrics.corrupt_records.set(corrupt.len() as i64);
        let stuck: Vec<Record> = records.into_iter().filter(|r| r.lifecycle.state() == RolloutState::Running).collect();
        if !stuck.is_empty() {
            let sd = match pdctl_core::config::load(&d.config) {
                Ok(s) => SystemdUnits::connect(&s).await.ok(),
                Err(_) => None,
            };
            for mut r in stuck {
                let units = snapshot(sd.as_ref(), &r.plan).await;
                d.interrupt(&mut r, units);
            }
        }
        let (drains, bad) = d.store.ledger().all();
        for b in &bad {
            tracing::error!("drain ledger file {} does not read ({}); check the router by hand", b.path.display(), b.error);
        }
        d.metrics.drained.set(drains.len() as i64);
        d.reconciling.store(!drains.is_empty(), Ordering::SeqCst);
        notify_status(if drains.is_empty() { "idle" } else { "re-admitting drained workers" });
        d
    }

    /// Mark a record interrupted where it stopped, with the units' state.
    fn interrupt(&self, r: &mut Record, units: Vec<UnitSnapshot>) {
        let pos = r.lifecycle.position().cloned();
        let (unit, step) = (pos.as_ref().map(|p| p.unit.clone()), pos.as_ref().map(|p| p.step));
        if r.lifecycle.interrupt().is_err() {
            return;
        }
        tracing::warn!(pdctl_rollout_id = %r.id, "rollout {} was interrupted at {} ({}): pdctld stopped while it ran; resume it with pdctl rollout resume {}", r.id, unit.as_deref().unwrap_or("its start"), step.map(|s| s.as_str()).unwrap_or("-"), r.id);
        r.interrupted = Some(Interruption { unit, step, detected_at: now(), units });
        r.finished_at = Some(now());
        self.metrics.rollouts.get_or_create(&ResultLabel { result: RolloutState::Interrupted.as_str().into() }).inc();
        self.save(r);
    }

    /// Why the running rollout's engine looks hung (it has sat in one step past that step's
    /// limit), if it does.
    pub fn engine_stuck(&self) -> Option<String> {
        let running = lock(&self.running);
        let r = running.as_ref()?;
        let limits = r.limits.as_ref()?;
        let (since, step) = *lock(&r.progress);
        let limit = pdctl_core::engine::steps::deadline(step, limits);
        (since.elapsed() > limit).then(|| format!("rollout {} has been in step {} for {:?}, past its limit {limit:?}", r.id, step.as_str(), since.elapsed()))
    }

    /// The running rollout's id.
    pub fn running_id(&self) -> Option<String> {
        lock(&self.running).as_ref().map(|r| r.id.clone())
    }

    /// Persist `r` (retried by the store); on failure keep it in memory, report it (status,
    /// metrics, journal) and retry later ([`Daemon::retry_unsaved`]). Returns whether it is on disk.
    pub fn save(&self, r: &Record) -> bool {
        match self.store.save(r) {
            Ok(()) => {
                let mut unsaved = lock(&self.unsaved);
                unsaved.remove(&r.id);
                if unsaved.is_empty() && lock(&self.record_error).take().is_some() {
                    self.metrics.records_failing.set(0);
                    tracing::info!("rollout records are being saved again");
                }
                true
            }
            Err(e) => {
                lock(&self.unsaved).insert(r.id.clone(), r.clone());
                let msg = format!("cannot write {}: {e}", self.store.dir().join("rollouts").display());
                if lock(&self.record_error).replace(msg.clone()).is_none() {
                    tracing::error!(pdctl_rollout_id = %r.id, "{msg}; pdctld keeps the record in memory, retries, and starts no rollout until it is saved");
                }
                self.metrics.record_write_failures.inc();
                self.metrics.records_failing.set(1);
                false
            }
        }
    }

    /// Try again to write the records whose last write failed (called periodically).
    pub fn retry_unsaved(&self) {
        let pending: Vec<Record> = lock(&self.unsaved).values().cloned().collect();
        for r in pending {
            // The running rollout's newer state is saved by its own events.
            if self.running_id().as_deref() == Some(r.id.as_str()) {
                continue;
            }
            self.save(&r);
        }
    }

    /// A record by id: unsaved (newest) first, then the store.
    fn load(&self, id: &str) -> Option<Record> {
        lock(&self.unsaved).get(id).cloned().or_else(|| self.store.load(id))
    }

    /// Undo one drain (events in the record of the rollout that made it, metrics, journal).
    async fn reconcile_one(&self, e: &RealEngine, d: &Drain, budget: std::time::Duration, record: Option<&Mutex<Record>>) {
        let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let result = e.reconcile(d, self.store.ledger(), budget, &sink).await;
        drop(sink);
        let mut events = Vec::new();
        while let Some(ev) = rx.recv().await {
            tracing::info!(pdctl_rollout_id = %d.rollout_id, pdctl_unit = %ev.unit, pdctl_step = ev.step.as_str(), "{}", pdctl_core::engine::sentence(&ev));
            events.push(ev);
        }
        let note = match &result {
            Ok(n) => {
                self.metrics.reconciles.get_or_create(&ResultLabel { result: "restored".into() }).inc();
                n.clone()
            }
            Err(c) => {
                self.metrics.reconciles.get_or_create(&ResultLabel { result: "not_restored".into() }).inc();
                tracing::error!(pdctl_rollout_id = %d.rollout_id, pdctl_unit = %d.unit, "{}", c.sentence());
                c.sentence()
            }
        };
        let apply = |r: &mut Record| {
            r.events.extend(events.iter().cloned());
            r.notes.push(note.clone());
        };
        match record {
            Some(m) => {
                let mut r = lock(m);
                apply(&mut r);
                self.save(&r);
            }
            None => {
                if let Some(mut r) = self.load(&d.rollout_id) {
                    apply(&mut r);
                    self.save(&r);
                }
            }
        }
        self.metrics.drained.set(self.store.ledger().all().0.len() as i64);
    }

    /// Undo the drains left in the ledger by a previous process, before any rollout starts:
    /// each worker is re-admitted once it serves (see `Engine::reconcile`), waiting up to
    /// `ready_timeout` for a worker that is starting.
    pub async fn reconcile_at_start(self: Arc<Self>) {
        // Good revisions are recorded eagerly: what each worker's running process started with,
        // so that a rollback works from the first day.
        if let Ok(e) = engine(&self).await {
            if let Err(c) = e.staleness(&self.store.revisions_dir()).await {
                tracing::warn!("cannot record the workers' revisions at start: {}", c.sentence());
            }
        }
        let (drains, _) = self.store.ledger().all();
        if !drains.is_empty() {
            match engine(&self).await {
                Ok(e) => {
                    let budget = e.settings.rollout.ready_timeout;
                    for d in &drains {
                        notify_status(&format!("re-admitting {} (drained by {})", d.unit, d.rollout_id));
                        self.reconcile_one(&e, d, budget, None).await;
                    }
                }
                Err(c) => tracing::error!(
                    "cannot re-admit the workers pdctl drained before it stopped ({}): {}; they stay out of the router until a rollout re-admits them",
                    drains.iter().map(|d| d.unit.as_str()).collect::<Vec<_>>().join(", "),
                    c.sentence()
                ),
            }
        }
        // Fleet slots left by a previous process: given back once their workers serve.
        if let Ok(e) = engine(&self).await {
            for n in e.reconcile_slots(self.store.ledger(), None).await {
                tracing::warn!("{n}");
            }
        }
        self.reconciling.store(false, Ordering::SeqCst);
        notify_status("idle");
    }

    /// While idle: a drain in the ledger whose worker the gateway lists admitted again (the
    /// gateway came back with it, or an operator re-added it) is no longer pdctl's to undo: it is
    /// cleared and the note written in the rollout's record, so that `status` and
    /// `pdctl_drained_workers` stop saying the worker is out. Checked every 5 s, only while the
    /// ledger holds drains; a rollout cannot start meanwhile (`reconciling`).
    pub async fn reconcile_idle(self: Arc<Self>) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.reconciling.load(Ordering::SeqCst) || self.running_id().is_some() || self.store.ledger().all().0.is_empty() {
                continue;
            }
            let Ok(e) = engine(&self).await else { continue };
            if e.settings.router.is_none() {
                continue;
            }
            let Ok(Ok(listed)) = tokio::time::timeout(std::time::Duration::from_secs(5), pdctl_core::ports::Probes::router_workers(&e.probes, 0)).await else {
                continue;
            };
            // No rollout may start while a drain is cleared: claim, then check again.
            if self.reconciling.swap(true, Ordering::SeqCst) {
                continue;
            }
            if self.running_id().is_none() {
                for d in self.store.ledger().all().0 {
                    if !listed.iter().any(|x| pdctl_core::config::same_url(&x.url, &d.url) && x.admitted()) {
                        continue;
                    }
                    let note = format!(
                        "reconciled: the gateway lists {} ({}) admitted again, outside pdctl; the drain rollout {} had left is cleared",
                        d.unit, d.url, d.rollout_id
                    );
                    match self.store.ledger().clear(&d.unit) {
                        Ok(()) => {
                            tracing::warn!(pdctl_rollout_id = %d.rollout_id, pdctl_unit = %d.unit, "{note}");
                            self.metrics.reconciles.get_or_create(&ResultLabel { result: "restored".into() }).inc();
                            if let Some(mut r) = self.load(&d.rollout_id) {
                                r.notes.push(note);
                                self.save(&r);
                            }
                        }
                        Err(er) => tracing::error!(pdctl_unit = %d.unit, "cannot clear the drain of {} from the ledger: {er}", d.unit),
                    }
                }
                self.metrics.drained.set(self.store.ledger().all().0.len() as i64);
            }
            self.reconciling.store(false, Ordering::SeqCst);
        }
    }

    /// SIGTERM: stop the running rollout's engine, undo its drain (within `budget`), and mark it
    /// interrupted, so that stopping pdctld — an upgrade, `systemctl restart pdctld` — never leaves
    /// a worker out of the router. What is not undone in time stays in the ledger for the next start.
    pub async fn shutdown(&self, budget: std::time::Duration) {
        let running = lock(&self.running).take();
        let Some(r) = running else {
            return;
        };
        if let Some(h) = lock(&r.task).take() {
            h.abort();
        }
        // Let the event consumer write what the engine emitted before it stopped.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        tracing::warn!(pdctl_rollout_id = %r.id, "pdctld is stopping during rollout {}: undoing its drain, then it is interrupted (resume it with pdctl rollout resume {})", r.id, r.id);
        let e = engine(self).await;
        if let Ok(e) = &e {
            let (drains, _) = self.store.ledger().all();
            for d in drains.iter().filter(|d| d.rollout_id == r.id) {
                self.reconcile_one(e, d, budget, Some(&r.record)).await;
            }
        }
        let sd = e.as_ref().ok().map(|e| &e.units);
        let plan = lock(&r.record).plan.clone();
        let units = snapshot(sd, &plan).await;
        let mut rec = lock(&r.record).clone();
        self.interrupt(&mut rec, units);
        if let Some(end) = rec.end_line() {
            let _ = r.tx.send(end);
        }
    }
}

/// Frees the running slot when a start fails before the rollout's task takes it over.
struct Slot<'a> {
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
async fn start(daemon: Arc<Daemon>, req: Request, by: StartedBy) -> Result<Started, Cause> {
    // The client planned with its config: a rollout of another one is refused, never run silently.
    if let Request::Restart { config: Some(given), .. } | Request::Apply { config: Some(given), .. } = &req {
        let ours = ConfigIdentity::of(&daemon.config);
        if ours.as_ref().map(|o| &o.sha256) != Some(&given.sha256) {
            return Err(Cause::ConfigMismatch {
                given: given.describe(),
                daemon: ours.map(|o| o.describe()).unwrap_or_else(|| format!("{} (unreadable)", daemon.config.display())),
            });
        }
    }
    let (id, abort, tx, record) = {
        let mut slot = lock(&daemon.running);
        if let Some(other) = slot.as_ref() {
            return Err(Cause::Busy { id: other.id.clone() });
        }
        if daemon.reconciling.load(Ordering::SeqCst) {
            return Err(Cause::Reconciling { units: daemon.store.ledger().all().0.into_iter().map(|d| d.unit).collect() });
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
        (id, abort, tx, record)
    };
    daemon.metrics.running.set(1);
    let mut guard = Slot { daemon: &daemon, armed: true };
    let e = engine(&daemon).await?;
    let dir = daemon.store.revisions_dir();
    let allow_outage: bool;
    let load_changes: bool;
    let mut reverify = true;
    let (kind, plan, reasons, resumes) = match req {
        Request::Restart { units, allow_outage: allow, load_changes: load, .. } => {
            allow_outage = allow;
            load_changes = load;
            let plan = Plan::new(&e.settings, &units).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
            (RolloutKind::Restart, plan, BTreeMap::new(), None)
        }
        // Nothing stale: no record whether or not `--if-changed` was given (it only says so for
        // the timer's sake).
        Request::Apply { all, allow_outage: allow, .. } => {
            allow_outage = allow;
            load_changes = true;
            let stale = e.staleness(&dir).await?;
            // A change that already failed is not rolled out again until its files change.
            let held: Vec<String> = stale
                .iter()
                .filter_map(|w| w.quarantined.as_ref().map(|q| format!("{} (its change failed in {}: {})", w.unit, q.rollout_id, q.cause)))
                .collect();
            for h in &held {
                tracing::warn!("not rolling out {h}; change its files to try again");
            }
            let chosen: Vec<String> = stale.iter().filter(|w| w.quarantined.is_none() && (all || !w.reasons.is_empty())).map(|w| w.unit.clone()).collect();
            // Nothing to roll: no record (an empty "succeeded" one would say a rollout happened).
            if chosen.is_empty() {
                let message = if held.is_empty() {
                    "no worker is stale; nothing to do".to_string()
                } else {
                    format!("nothing to do: quarantined, not rolled out again: {}", held.join("; "))
                };
                return Ok(Started { id: None, message: Some(message) });
            }
            let plan = Plan::new(&e.settings, &chosen).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
            // A changed unit file or drop-in needs a daemon-reload before the restart; reloading is
            // idempotent and cheap, so do it whenever a worker is rolled for a change.
            if stale.iter().any(|w| !w.reasons.is_empty() && chosen.contains(&w.unit)) {
                e.units.reload().await.map_err(|er| er.cause())?;
            }
            (RolloutKind::Apply, plan, stale.into_iter().map(|w| (w.unit, w.reasons)).collect(), None)
        }
        Request::Resume { id: old_id } => {
            let mut old = daemon.load(&old_id).ok_or_else(|| Cause::NoSuchRollout { id: old_id.clone() })?;
            let wrong = |state: RolloutState| Cause::WrongState {
                id: old_id.clone(),
                state: state.as_str().into(),
                needs: "only an interrupted rollout can be resumed, and only once".into(),
            };
            if old.lifecycle.state() != RolloutState::Interrupted {
                return Err(wrong(old.lifecycle.state()));
            }
            let from = old.lifecycle.position().and_then(|p| old.plan.iter().position(|u| *u == p.unit)).unwrap_or(0);
            // Stopped while waiting for a fleet slot: that unit was never touched, so it is
            // restarted, not re-verified.
            reverify = !old.lifecycle.position().is_some_and(|p| p.step == Step::Slot);
            let plan = Plan::new(&e.settings, &old.plan[from..]).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
            allow_outage = old.allow_outage;
            load_changes = old.load_changes;
            old.lifecycle.resume(&id).map_err(|_| wrong(old.lifecycle.state()))?;
            daemon.store.save(&old).map_err(|er| Cause::RecordUnwritable { dir: daemon.store.dir().display().to_string(), error: er.to_string() })?;
            lock(&daemon.unsaved).remove(&old_id);
            (RolloutKind::Resume, plan, BTreeMap::new(), Some(old_id))
        }
    };
    {
        let mut r = lock(&record);
        *r = Record::new(&id, kind, plan.workers.iter().map(|w| w.unit.clone()).collect(), reasons, resumes);
        r.allow_outage = allow_outage;
        r.load_changes = load_changes;
        r.started_by = Some(by);
        daemon.store.save(&r).map_err(|er| Cause::RecordUnwritable { dir: daemon.store.dir().display().to_string(), error: er.to_string() })?;
    }
    guard.armed = false;
    notify_status(&format!("rollout {id} ({}): starting", kind.as_str()));
    tracing::info!(pdctl_rollout_id = %id, "rollout {id} ({}) started: {}", kind.as_str(), plan.workers.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", "));
    let d2 = daemon.clone();
    let id2 = id.clone();
    let limits = e.settings.rollout.clone();
    let task = tokio::spawn(async move { run(d2, e, plan, id2, kind, record, tx, abort, reverify).await });
    if let Some(r) = lock(&daemon.running).as_mut().filter(|r| r.id == id) {
        *lock(&r.task) = Some(task.abort_handle());
        r.limits = Some(limits);
    }
    Ok(Started { id: Some(id), message: None })
}

/// Persist, broadcast, count and log one event.
fn on_event(daemon: &Daemon, id: &str, record: &Mutex<Record>, tx: &broadcast::Sender<StreamLine>, ev: Event) {
    if let Some(r) = lock(&daemon.running).as_ref().filter(|r| r.id == id) {
        *lock(&r.progress) = (std::time::Instant::now(), ev.step);
    }
    tracing::info!(pdctl_rollout_id = %id, pdctl_unit = %ev.unit, pdctl_step = ev.step.as_str(), "{}", pdctl_core::engine::sentence(&ev));
    match ev.status {
        Status::Passed => daemon.metrics.step_duration.get_or_create(&StepLabel { step: ev.step.as_str().into() }).observe(ev.elapsed_ms as f64 / 1000.0),
        Status::Failed => {
            // The engine puts its Cause's code here (Cause::code: a fixed set).
            let cause = ev.detail.get("cause_code").and_then(|v| v.as_str()).unwrap_or("unknown").to_string();
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
    let mut r = lock(record);
    if ev.status == Status::Started {
        if let Err(e) = r.lifecycle.enter(&ev.unit, ev.step) {
            tracing::error!(pdctl_rollout_id = %id, "{e}");
        }
    }
    r.events.push(ev.clone());
    daemon.save(&r);
    let _ = tx.send(StreamLine::Event(ev));
}

#[allow(clippy::too_many_arguments)]
async fn run(
    daemon: Arc<Daemon>,
    e: RealEngine,
    plan: Plan,
    id: String,
    kind: RolloutKind,
    record: Arc<Mutex<Record>>,
    tx: broadcast::Sender<StreamLine>,
    abort: Arc<AtomicBool>,
    reverify: bool,
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
    let (allow_outage, load_changes) = {
        let r = lock(&record);
        (r.allow_outage, r.load_changes)
    };
    let run = RolloutRun {
        plan: &plan,
        resume: kind == RolloutKind::Resume && reverify,
        abort: &abort,
        revisions: Some(&dir),
        ledger: Some(daemon.store.ledger()),
        id: &id,
        allow_outage,
        load_changes,
    };
    let mut finished = e.execute(run, &sink).await;
    drop(sink);
    let _ = consumer.await;
    finished.summary.id = Some(id.clone());
    let summary = finished.summary;
    let state = RolloutState::of(summary.result);
    // Refused before anything was touched (preflight): not a failed rollout in the metrics.
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
    {
        let mut r = lock(&record);
        // Fleet coordination lost: the unit in progress was finished and verified, the next
        // one never took its slot; the rollout is interrupted there, to be resumed once etcd
        // answers (`pdctl rollout resume ID`).
        let lost = summary.failed.as_ref().is_some_and(|f| f.cause_code == pdctl_core::cause::Cause::FleetLost { message: String::new() }.code());
        let moved = if lost { r.lifecycle.interrupt() } else { r.lifecycle.finish(summary.result) };
        if let Err(er) = moved {
            tracing::error!(pdctl_rollout_id = %id, "{er}");
        }
        r.finished_at = Some(now());
        r.summary = Some(summary.clone());
        r.notes.extend(finished.notes);
        r.availability_by_unit = finished.availability_by_unit;
        daemon.save(&r);
    }
    daemon.metrics.drained.set(daemon.store.ledger().all().0.len() as i64);
    tracing::info!(pdctl_rollout_id = %id, "rollout {id} finished: {}", state.as_str());
    let _ = tx.send(StreamLine::Summary(summary));
    {
        let mut slot = lock(&daemon.running);
        if slot.as_ref().is_some_and(|r| r.id == id) {
            *slot = None;
        }
    }
    daemon.metrics.running.set(0);
    notify_status(&format!("idle; last rollout {id}: {}", state.as_str()));
}

/// Decode a JSON body strictly (unknown fields rejected); the cause names what is wrong.
fn decode<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Cause> {
    serde_json::from_slice(body)
        .map_err(|e| Cause::BadRequest { message: format!("the request body is not valid: {e}; see docs/cli.md for the requests pdctld accepts") })
}

/// The control socket's peer, as the kernel reports it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Peer {
    /// Its uid.
    pub uid: Option<u32>,
}

async fn post_rollout(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<Peer>>, body: Bytes) -> Response {
    let req: Request = match decode(&body) {
        Ok(r) => r,
        Err(c) => return api_err(&c),
    };
    let reason = match &req {
        Request::Restart { reason, .. } | Request::Apply { reason, .. } => reason.clone(),
        Request::Resume { .. } => None,
    };
    let by = StartedBy { uid: peer.and_then(|p| p.0.uid), reason, ..Default::default() };
    match start(d, req, by).await {
        Ok(v) => (StatusCode::ACCEPTED, Json(v)).into_response(),
        Err(c) => api_err(&c),
    }
}

/// `POST /v1/fleet/rollouts`: write a fleet rollout to etcd for every host's pdctld (this one
/// included) to run its part.
async fn post_fleet_rollout(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<Peer>>, body: Bytes) -> Response {
    use pdctl_core::ports::{CasChange, Coordinator as _, Write};
    let req: FleetRequest = match decode(&body) {
        Ok(r) => r,
        Err(c) => return api_err(&c),
    };
    let s = match config(&d) {
        Ok(s) => s,
        Err(c) => return api_err(&c),
    };
    let Some(f) = s.fleet else {
        return api_err(&Cause::BadRequest { message: format!("{} has no [fleet]: this host is not part of a fleet (docs/fleet.md)", d.config.display()) });
    };
    let c = pdctl_core::real::EtcdCoordinator::new(&f);
    let hosts = if req.hosts.is_empty() {
        match pdctl_core::fleet::hosts(&c, &f.name).await {
            Ok(h) => h.into_iter().map(|h| h.host).collect(),
            Err(e) => return api_err(&Cause::FleetUnreachable { message: e.0 }),
        }
    } else {
        req.hosts.clone()
    };
    if hosts.is_empty() {
        return api_err(&Cause::BadRequest { message: "no host of the fleet is alive (pdctl fleet status)".into() });
    }
    let uid = peer.and_then(|p| p.0.uid).map(|u| u.to_string()).unwrap_or_else(|| "?".into());
    let canary = f.canary.clone().filter(|c| hosts.contains(c));
    let r = pdctl_core::fleet::FleetRollout {
        id: format!("f{}", pdctl_core::fleet::now_secs()),
        hosts,
        allow_outage: req.allow_outage,
        by: format!("uid {uid} on {}", f.host),
        reason: req.reason,
        canary,
        created_at: pdctl_core::fleet::now_secs(),
        units: Vec::new(),
        repair_of: None,
        load_changes: req.load_changes,
    };
    let key = pdctl_core::fleet::rollout_key(&f.name, &r.id);
    let value = serde_json::to_vec(&r).unwrap_or_default();
    match c.cas(vec![CasChange { key, expect: 0, write: Write::Put(value) }]).await {
        Ok(true) => {
            tracing::info!("fleet rollout {} requested by {} on {}", r.id, r.by, r.hosts.join(", "));
            (StatusCode::ACCEPTED, Json(Started { id: Some(r.id), message: None })).into_response()
        }
        Ok(false) => api_err(&Cause::Busy { id: r.id }),
        Err(e) => api_err(&Cause::FleetUnreachable { message: e.0 }),
    }
}

/// `GET /v1/reach`: which configured addresses on other hosts this process may not connect to
/// (for `pdctl check`, which runs outside pdctld's unit and its IP sandbox).
async fn reach(State(d): State<Arc<Daemon>>) -> Response {
    use pdctl_core::ports::{Probes as _, Reach};
    let s = match config(&d) {
        Ok(s) => s,
        Err(c) => return api_err(&c),
    };
    let probes = pdctl_core::real::probes(&s);
    let mut out = pdctl_core::api::ReachReport::default();
    for (what, url) in s.urls() {
        let host = pdctl_core::pairing::bootstrap_host(&url);
        if host == "localhost" || host == "::1" || host.starts_with("127.") {
            continue;
        }
        out.checked.push(url.clone());
        if let Reach::Blocked(_) = probes.reach(&url).await {
            out.blocked.push(pdctl_core::api::BlockedAddress { what, url });
        }
    }
    Json(out).into_response()
}

/// Every record, the unsaved ones in their newest state, and the corrupt files.
fn records(d: &Daemon) -> (Vec<Record>, Vec<pdctl_core::api::CorruptRecord>) {
    let (mut all, corrupt) = d.store.all();
    let unsaved = lock(&d.unsaved).clone();
    for r in all.iter_mut() {
        if let Some(u) = unsaved.get(&r.id) {
            *r = u.clone();
        }
    }
    for (id, u) in unsaved {
        if !all.iter().any(|r| r.id == id) {
            all.push(u);
        }
    }
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    d.metrics.corrupt_records.set(corrupt.len() as i64);
    (all, corrupt)
}

async fn list(State(d): State<Arc<Daemon>>) -> Response {
    let (all, corrupt) = records(&d);
    Json(History { rollouts: all.iter().map(Record::history_item).collect(), running: d.running_id(), corrupt }).into_response()
}

async fn get_one(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(r) = lock(&d.running).as_ref().filter(|r| r.id == id) {
        return Json(lock(&r.record).clone()).into_response();
    }
    match d.load(&id) {
        Some(r) => Json(r).into_response(),
        None => api_err(&Cause::NoSuchRollout { id }),
    }
}

/// NDJSON: every event from the beginning, then live ones, then the summary.
async fn events(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> Response {
    let (backlog, rx): (VecDeque<StreamLine>, Option<broadcast::Receiver<StreamLine>>) = match lock(&d.running).as_ref().filter(|r| r.id == id) {
        Some(r) => {
            let rec = lock(&r.record);
            let rx = r.tx.subscribe();
            (rec.events.iter().cloned().map(StreamLine::Event).collect(), Some(rx))
        }
        None => match d.load(&id) {
            Some(rec) => {
                let mut q: VecDeque<StreamLine> = rec.events.iter().cloned().map(StreamLine::Event).collect();
                q.extend(rec.end_line());
                (q, None)
            }
            None => return api_err(&Cause::NoSuchRollout { id }),
        },
    };
    let line = |v: &StreamLine| Bytes::from(format!("{}\n", serde_json::to_string(v).unwrap_or_default()));
    let stream = futures_util::stream::unfold((backlog, rx, false), move |(mut q, mut rx, done)| async move {
        if done {
            return None;
        }
        if let Some(v) = q.pop_front() {
            return Some((Ok::<_, Infallible>(line(&v)), (q, rx, false)));
        }
        let r = rx.as_mut()?;
        loop {
            match r.recv().await {
                Ok(v) => {
                    let last = !matches!(v, StreamLine::Event(_));
                    return Some((Ok(line(&v)), (q, rx, last)));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    ([("content-type", "application/x-ndjson")], Body::from_stream(stream)).into_response()
}

async fn abort(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> Response {
    match lock(&d.running).as_ref() {
        Some(r) if r.id == id => {
            r.abort.store(true, Ordering::SeqCst);
            tracing::warn!(pdctl_rollout_id = %id, "abort of rollout {id} requested: it stops after the unit in progress is verified");
            (StatusCode::ACCEPTED, Json(AbortAccepted { id, message: "aborting after the current unit is verified".into() })).into_response()
        }
        _ => {
            let state = d.load(&id).map(|r| r.lifecycle.state().as_str().to_string());
            match state {
                Some(state) => api_err(&Cause::WrongState { id, state, needs: "only a running rollout can be aborted".into() }),
                None => api_err(&Cause::NoSuchRollout { id }),
            }
        }
    }
}

async fn diff(State(d): State<Arc<Daemon>>) -> Response {
    let e = match engine(&d).await {
        Ok(e) => e,
        Err(c) => return api_err(&c),
    };
    let dir = d.store.revisions_dir();
    match e.staleness(&dir).await {
        Ok(s) => Json(Diff {
            workers: s
                .into_iter()
                .map(|w| DiffWorker {
                    timing: pdctl_core::revisions::last_start(&dir, &w.unit),
                    unit: w.unit,
                    stale: !w.reasons.is_empty(),
                    reasons: w.reasons,
                    quarantined: w.quarantined,
                })
                .collect(),
        })
        .into_response(),
        Err(c) => api_err(&c),
    }
}

/// Liveness of the API itself (the watchdog's probe): no I/O beyond the answer.
/// `GET /v1/config`: which config pdctld runs with (path and digest), for a CLI to compare with
/// its own before it asks for anything.
async fn config_identity(State(d): State<Arc<Daemon>>) -> Response {
    match ConfigIdentity::of(&d.config) {
        Some(c) => Json(c).into_response(),
        None => api_err(&Cause::ConfigInvalid { message: format!("pdctld cannot read its config {}", d.config.display()) }),
    }
}

async fn ping() -> Response {
    Json(serde_json::json!({ "ok": true })).into_response()
}

async fn status(State(d): State<Arc<Daemon>>) -> Response {
    let (all, corrupt) = records(&d);
    // Quarantined changes whose files are still the failed ones (bounded: systemd may be slow).
    let quarantined = match tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let e = engine(&d).await.ok()?;
        e.staleness(&d.store.revisions_dir()).await.ok()
    })
    .await
    {
        Ok(Some(s)) => s.into_iter().filter_map(|w| w.quarantined).collect(),
        _ => Vec::new(),
    };
    let last = all.last().map(|r| LastRollout { id: r.id.clone(), state: r.lifecycle.state(), kind: r.kind });
    Json(DaemonStatus {
        running: d.running_id(),
        last,
        config: d.config.display().to_string(),
        state_dir: d.store.dir().display().to_string(),
        reconciling: d.reconciling.load(Ordering::SeqCst),
        drained: d.store.ledger().all().0,
        record_error: lock(&d.record_error).clone(),
        pairs: pdctl_core::api::PairStatus::from_records(&all),
        corrupt,
        quarantined,
    })
    .into_response()
}

/// The control API.
pub fn api(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/rollouts", post(post_rollout).get(list))
        .route("/v1/fleet/rollouts", post(post_fleet_rollout))
        .route("/v1/reach", get(reach))
        .route("/v1/rollouts/{id}", get(get_one))
        .route("/v1/rollouts/{id}/events", get(events))
        .route("/v1/rollouts/{id}/abort", post(abort))
        .route("/v1/diff", get(diff))
        .route("/v1/config", get(config_identity))
        .route("/v1/status", get(status))
        .route("/v1/ping", get(ping))
        .fallback(|| async { api_err(&Cause::BadRequest { message: "no such endpoint; see docs/cli.md for pdctld's control API".into() }) })
        .method_not_allowed_fallback(|| async {
            api_err(&Cause::BadRequest { message: "that method is not allowed on this endpoint; see docs/cli.md for pdctld's control API".into() })
        })
        .with_state(d)
}

/// The metrics endpoint.
pub fn metrics_api(d: Arc<Daemon>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(d): State<Arc<Daemon>>| async move { ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], d.metrics.render()) }),
        )
        .with_state(d)
}

impl Daemon {
    /// With `[fleet]`: keep this host's liveness key in etcd (bound to a lease: it disappears
    /// within 10 s of pdctld's death), refreshed every 5 s with the running rollout and each
    /// worker's state and KV usage; and give back slots left on record once their workers serve.
    pub async fn fleet_liveness(self: Arc<Self>) {
        let value: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new(Vec::new()));
        let mut alive: Option<(String, tokio::task::JoinHandle<()>)> = None;
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            let fleet = config(&self).ok().and_then(|s| s.fleet);
            let Some(f) = fleet else {
                if let Some((_, h)) = alive.take() {
                    h.abort();
                }
                continue;
            };
            let key = pdctl_core::fleet::host_key(&f.name, &f.host);
            if alive.as_ref().is_some_and(|(k, _)| *k != key) {
                if let Some((_, h)) = alive.take() {
                    h.abort();
                }
            }
            let Ok(e) = engine(&self).await else { continue };
            let mut workers = Vec::new();
            for w in &e.settings.workers {
                let state = pdctl_core::ports::Units::state(&e.units, &w.unit)
                    .await
                    .map(|s| format!("{}/{}", s.active_state, s.sub_state))
                    .unwrap_or_else(|err| format!("unknown ({err})"));
                let kv_usage = tokio::time::timeout(std::time::Duration::from_secs(3), pdctl_core::ports::Probes::kv(&e.probes, &w.url))
                    .await
                    .ok()
                    .and_then(|r| r.ok())
                    .map(|k| k.token_usage);
                workers.push(pdctl_core::fleet::HostWorker { unit: w.unit.clone(), url: w.url.clone(), role: w.role.as_str().into(), state, kv_usage });
            }
            let st = pdctl_core::fleet::HostState {
                host: f.host.clone(),
                version: env!("CARGO_PKG_VERSION").into(),
                rollout: self.running_id(),
                workers,
                updated_at: pdctl_core::fleet::now_secs(),
            };
            *lock(&value) = serde_json::to_vec(&st).unwrap_or_default();
            if alive.is_none() {
                match pdctl_core::real::etcd_connect(&f.etcd, f.user.as_ref(), f.tls.as_ref()).await {
                    Ok(etcd) => {
                        let v = value.clone();
                        alive = Some((key.clone(), etcd.keep_alive(key.clone(), 10, move || lock(&v).clone())));
                    }
                    Err(err) => tracing::warn!("this host's fleet liveness key cannot be written: {err}"),
                }
            }
            if self.running_id().is_none() && !self.reconciling.load(Ordering::SeqCst) {
                for n in e.reconcile_slots(self.store.ledger(), None).await {
                    tracing::warn!("{n}");
                }
            }
        }
    }
}

impl Daemon {
    /// With `[fleet]`: take part in fleet rollouts. Every new request under `rollouts/` that names
    /// this host is run here as a local rolling restart (after the canary host succeeded, when
    /// one is set; not at all once another host failed), its events and summary written back to
    /// etcd for `pdctl fleet watch`. Another host failing stops the local part between units.
    /// A request this host finds unanswered when it starts is marked interrupted, never resumed
    /// by itself.
    pub async fn fleet_rollouts(self: Arc<Self>) {
        use pdctl_core::ports::Coordinator as _;
        let mut seen: std::collections::BTreeSet<String> = Default::default();
        // Requests older than this process were cut short by its predecessor's stop.
        let born = pdctl_core::fleet::now_secs();
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            let Some(f) = config(&self).ok().and_then(|s| s.fleet) else { continue };
            if self.reconciling.load(Ordering::SeqCst) {
                continue;
            }
            let c = pdctl_core::real::EtcdCoordinator::new(&f);
            let p = pdctl_core::fleet::requests_prefix(&f.name);
            let Ok(entries) = c.get_prefix(&p).await else { continue };
            for e in entries {
                let rest = e.key.trim_start_matches(&p);
                if seen.contains(rest) {
                    continue;
                }
                seen.insert(rest.to_string());
                let Ok(r) = serde_json::from_slice::<pdctl_core::fleet::FleetRollout>(&e.value) else { continue };
                if !r.hosts.contains(&f.host) {
                    continue;
                }
                let mine = pdctl_core::fleet::host_summary_key(&f.name, &r.id, &f.host);
                if c.get(&mine).await.ok().flatten().is_some() {
                    continue;
                }
                if r.created_at < born {
                    // Unanswered, from before this pdctld started: its local part was cut short
                    // by the previous pdctld's stop.
                    let s = pdctl_core::fleet::HostSummary {
                        host: f.host.clone(),
                        result: HostResult::Interrupted,
                        local_id: None,
                        summary: None,
                        why: Some("pdctld stopped during its part; resume the local rollout (pdctl rollout history) once checked".into()),
                    };
                    let _ = fleet_put(&c, &mine, &s).await;
                    continue;
                }
                tokio::spawn(self.clone().fleet_part(f.clone(), r));
            }
        }
    }

    async fn fleet_part(self: Arc<Self>, f: pdctl_core::config::FleetSettings, r: pdctl_core::fleet::FleetRollout) {
        let c = pdctl_core::real::EtcdCoordinator::new(&f);
        let summary_key = pdctl_core::fleet::host_summary_key(&f.name, &r.id, &f.host);
        let not_started = |why: String| pdctl_core::fleet::HostSummary {
            host: f.host.clone(),
            result: HostResult::NotStarted,
            local_id: None,
            summary: None,
            why: Some(why),
        };
        // The canary goes first; the others start only once it succeeded.
        if let Some(canary) = r.canary.as_ref().filter(|c| **c != f.host) {
            loop {
                match fleet_summaries(&c, &f.name, &r.id).await.get(canary) {
                    Some(s) if s.result == HostResult::Succeeded => break,
                    Some(s) => {
                        let _ = fleet_put(&c, &summary_key, &not_started(format!("the canary {canary} did not succeed ({:?})", s.result))).await;
                        return;
                    }
                    None => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
                }
            }
        }
        if let Some((h, _)) = fleet_summaries(&c, &f.name, &r.id).await.into_iter().find(|(_, s)| s.result == HostResult::Failed) {
            let _ = fleet_put(&c, &summary_key, &not_started(format!("{h} failed first: the fleet rollout halts everywhere"))).await;
            return;
        }
        let by = StartedBy { uid: None, reason: r.reason.clone(), fleet_rollout: Some(r.id.clone()), fleet_by: Some(r.by.clone()) };
        let started = start(
            self.clone(),
            Request::Restart { units: r.units.clone(), allow_outage: r.allow_outage, reason: r.reason.clone(), load_changes: r.load_changes, config: None },
            by,
        )
        .await;
        let id = match started {
            Ok(Started { id: Some(id), .. }) => id,
            Ok(_) => return,
            Err(cause) => {
                let _ = fleet_put(&c, &summary_key, &not_started(cause.sentence())).await;
                return;
            }
        };
        // Forward the local record's events as they come; stop the local part when another host
        // fails.
        let mut sent = 0usize;
        loop {
            let rec = lock(&self.running).as_ref().filter(|x| x.id == id).map(|x| lock(&x.record).clone()).or_else(|| self.load(&id));
            let Some(rec) = rec else { break };
            for ev in rec.events.iter().skip(sent) {
                let line = pdctl_core::fleet::HostEvent { host: f.host.clone(), event: ev.clone() };
                if fleet_put(&c, &pdctl_core::fleet::host_event_key(&f.name, &r.id, &f.host, sent), &line).await.is_err() {
                    break;
                }
                sent += 1;
            }
            if rec.lifecycle.state() != pdctl_core::lifecycle::RolloutState::Running && sent >= rec.events.len() {
                let result = match (rec.lifecycle.state(), rec.summary.as_ref().map(|s| s.result)) {
                    (_, Some(pdctl_core::events::Outcome::Succeeded)) => HostResult::Succeeded,
                    (_, Some(pdctl_core::events::Outcome::Aborted)) => HostResult::Aborted,
                    (pdctl_core::lifecycle::RolloutState::Interrupted, _) => HostResult::Interrupted,
                    _ => HostResult::Failed,
                };
                let s = pdctl_core::fleet::HostSummary { host: f.host.clone(), result, local_id: Some(id.clone()), summary: rec.summary.clone(), why: None };
                // Written until etcd takes it: fleet watchers wait for it.
                while fleet_put(&c, &summary_key, &s).await.is_err() {
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
                return;
            }
            if fleet_summaries(&c, &f.name, &r.id).await.values().any(|s| s.result == HostResult::Failed) {
                if let Some(x) = lock(&self.running).as_ref().filter(|x| x.id == id) {
                    x.abort.store(true, Ordering::SeqCst);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }
}

async fn fleet_put<T: serde::Serialize>(c: &pdctl_core::real::EtcdCoordinator, key: &str, v: &T) -> Result<(), pdctl_core::ports::FleetFailure> {
    use pdctl_core::ports::{CasChange, Coordinator as _, Write};
    let expect = c.get(key).await?.map(|e| e.mod_revision).unwrap_or(0);
    c.cas(vec![CasChange { key: key.to_string(), expect, write: Write::Put(serde_json::to_vec(v).unwrap_or_default()) }]).await.map(|_| ())
}

async fn fleet_summaries(c: &pdctl_core::real::EtcdCoordinator, name: &str, id: &str) -> BTreeMap<String, pdctl_core::fleet::HostSummary> {
    use pdctl_core::ports::Coordinator as _;
    let p = pdctl_core::fleet::rollout_hosts_prefix(name, id);
    c.get_prefix(&p)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.key.ends_with("/summary"))
        .filter_map(|e| serde_json::from_slice::<pdctl_core::fleet::HostSummary>(&e.value).ok())
        .map(|s| (s.host.clone(), s))
        .collect()
}
