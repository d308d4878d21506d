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
    AbortAccepted, ApiError, DaemonStatus, Diff, DiffWorker, History, Interruption, LastRollout, Record, Request, RolloutKind, Started, StreamLine,
    UnitSnapshot,
};
use pdctl_core::cause::Cause;
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

impl Daemon {
    /// A daemon over `store`; rollouts left running by a previous process are marked interrupted
    /// (with each unit's state now), and nothing resumes by itself.
    pub async fn new(config: PathBuf, store: Store) -> Daemon {
        let d = Daemon { config, store, metrics: Metrics::default(), running: Mutex::new(None) };
        let stuck: Vec<Record> = d.store.all().into_iter().filter(|r| r.lifecycle.state() == RolloutState::Running).collect();
        if !stuck.is_empty() {
            let sd = match pdctl_core::config::load(&d.config) {
                Ok(s) => SystemdUnits::connect(&s).await.ok(),
                Err(_) => None,
            };
            for mut r in stuck {
                let pos = r.lifecycle.position().cloned();
                let mut units = Vec::new();
                for u in &r.plan {
                    let snap = match &sd {
                        Some(sd) => match sd.state(u).await {
                            Ok(s) => UnitSnapshot {
                                unit: u.clone(),
                                active_state: Some(s.active_state),
                                sub_state: Some(s.sub_state),
                                invocation_id: Some(s.invocation_id),
                                n_restarts: Some(s.n_restarts),
                                error: None,
                            },
                            Err(e) => UnitSnapshot {
                                unit: u.clone(),
                                active_state: None,
                                sub_state: None,
                                invocation_id: None,
                                n_restarts: None,
                                error: Some(e.to_string()),
                            },
                        },
                        None => UnitSnapshot {
                            unit: u.clone(),
                            active_state: None,
                            sub_state: None,
                            invocation_id: None,
                            n_restarts: None,
                            error: Some("systemd not reachable at start-up".into()),
                        },
                    };
                    units.push(snap);
                }
                let (unit, step) = (pos.as_ref().map(|p| p.unit.clone()), pos.as_ref().map(|p| p.step));
                tracing::warn!(pdctl_rollout_id = %r.id, "rollout {} was interrupted at {} ({}): pdctld stopped while it ran; resume it with pdctl rollout resume {}", r.id, unit.as_deref().unwrap_or("its start"), step.map(|s| s.as_str()).unwrap_or("-"), r.id);
                if r.lifecycle.interrupt().is_err() {
                    continue;
                }
                r.interrupted = Some(Interruption { unit, step, detected_at: now(), units });
                r.finished_at = Some(now());
                d.metrics.rollouts.get_or_create(&ResultLabel { result: RolloutState::Interrupted.as_str().into() }).inc();
                if let Err(e) = d.store.save(&r) {
                    tracing::error!("cannot save rollout {}: {e}", r.id);
                }
            }
        }
        notify_status("idle");
        d
    }

    /// The running rollout's id.
    pub fn running_id(&self) -> Option<String> {
        lock(&self.running).as_ref().map(|r| r.id.clone())
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
async fn start(daemon: Arc<Daemon>, req: Request) -> Result<Started, Cause> {
    let (id, abort, tx, record) = {
        let mut slot = lock(&daemon.running);
        if let Some(other) = slot.as_ref() {
            return Err(Cause::Busy { id: other.id.clone() });
        }
        let id = daemon.store.new_id();
        let (tx, _) = broadcast::channel(4096);
        let abort = Arc::new(AtomicBool::new(false));
        let record = Arc::new(Mutex::new(Record::new(&id, RolloutKind::Restart, vec![], BTreeMap::new(), None)));
        *slot = Some(Running { id: id.clone(), abort: abort.clone(), tx: tx.clone(), record: record.clone() });
        (id, abort, tx, record)
    };
    daemon.metrics.running.set(1);
    let mut guard = Slot { daemon: &daemon, armed: true };
    let e = engine(&daemon).await?;
    let dir = daemon.store.dir().join("revisions");
    let (kind, plan, reasons, resumes) = match req {
        Request::Restart { units } => {
            let plan = Plan::new(&e.settings, &units).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
            (RolloutKind::Restart, plan, BTreeMap::new(), None)
        }
        Request::Apply { if_changed, all } => {
            let stale = e.staleness(&dir).await?;
            let chosen: Vec<String> = stale.iter().filter(|(_, why)| all || !why.is_empty()).map(|(u, _)| u.clone()).collect();
            if chosen.is_empty() && if_changed {
                return Ok(Started { id: None, message: Some("no worker is stale; nothing to do".into()) });
            }
            let plan = if chosen.is_empty() {
                Plan { workers: vec![] }
            } else {
                Plan::new(&e.settings, &chosen).map_err(|er| Cause::BadRequest { message: er.to_string() })?
            };
            // A changed unit file or drop-in needs a daemon-reload before the restart; reloading is
            // idempotent and cheap, so do it whenever a worker is rolled for a change.
            if stale.iter().any(|(u, why)| !why.is_empty() && chosen.contains(u)) {
                e.units.reload().await.map_err(|er| er.cause())?;
            }
            (RolloutKind::Apply, plan, stale.into_iter().collect(), None)
        }
        Request::Resume { id: old_id } => {
            let mut old = daemon.store.load(&old_id).ok_or_else(|| Cause::NoSuchRollout { id: old_id.clone() })?;
            let wrong = |state: RolloutState| Cause::WrongState {
                id: old_id.clone(),
                state: state.as_str().into(),
                needs: "only an interrupted rollout can be resumed, and only once".into(),
            };
            if old.lifecycle.state() != RolloutState::Interrupted {
                return Err(wrong(old.lifecycle.state()));
            }
            let from = old.lifecycle.position().and_then(|p| old.plan.iter().position(|u| *u == p.unit)).unwrap_or(0);
            let plan = Plan::new(&e.settings, &old.plan[from..]).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
            old.lifecycle.resume(&id).map_err(|_| wrong(old.lifecycle.state()))?;
            daemon.store.save(&old).map_err(|er| Cause::RecordUnwritable { dir: daemon.store.dir().display().to_string(), error: er.to_string() })?;
            (RolloutKind::Resume, plan, BTreeMap::new(), Some(old_id))
        }
    };
    {
        let mut r = lock(&record);
        *r = Record::new(&id, kind, plan.workers.iter().map(|w| w.unit.clone()).collect(), reasons, resumes);
        daemon.store.save(&r).map_err(|er| Cause::RecordUnwritable { dir: daemon.store.dir().display().to_string(), error: er.to_string() })?;
    }
    guard.armed = false;
    notify_status(&format!("rollout {id} ({}): starting", kind.as_str()));
    tracing::info!(pdctl_rollout_id = %id, "rollout {id} ({}) started: {}", kind.as_str(), plan.workers.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", "));
    let d2 = daemon.clone();
    let id2 = id.clone();
    tokio::spawn(async move { run(d2, e, plan, id2, kind, record, tx, abort).await });
    Ok(Started { id: Some(id), message: None })
}

/// Persist, broadcast, count and log one event.
fn on_event(daemon: &Daemon, id: &str, record: &Mutex<Record>, tx: &broadcast::Sender<StreamLine>, ev: Event) {
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
    if let Err(er) = daemon.store.save(&r) {
        tracing::error!(pdctl_rollout_id = %id, "cannot save rollout {id}: {er}");
    }
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
    let dir = daemon.store.dir().join("revisions");
    let run = RolloutRun { plan: &plan, resume: kind == RolloutKind::Resume, abort: &abort, revisions: Some(&dir), id: &id };
    let mut finished = e.execute(run, &sink).await;
    drop(sink);
    let _ = consumer.await;
    finished.summary.id = Some(id.clone());
    let summary = finished.summary;
    let state = RolloutState::of(summary.result);
    daemon.metrics.rollouts.get_or_create(&ResultLabel { result: state.as_str().into() }).inc();
    if state == RolloutState::Succeeded {
        daemon.metrics.last_success.set(now() as i64);
    }
    {
        let mut r = lock(&record);
        if let Err(er) = r.lifecycle.finish(summary.result) {
            tracing::error!(pdctl_rollout_id = %id, "{er}");
        }
        r.finished_at = Some(now());
        r.summary = Some(summary.clone());
        r.notes.extend(finished.notes);
        if let Err(er) = daemon.store.save(&r) {
            tracing::error!(pdctl_rollout_id = %id, "cannot save rollout {id}: {er}");
        }
    }
    tracing::info!(pdctl_rollout_id = %id, "rollout {id} finished: {}", state.as_str());
    let _ = tx.send(StreamLine::Summary(summary));
    *lock(&daemon.running) = None;
    daemon.metrics.running.set(0);
    notify_status(&format!("idle; last rollout {id}: {}", state.as_str()));
}

/// Decode a JSON body strictly (unknown fields rejected); the cause names what is wrong.
fn decode<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Cause> {
    serde_json::from_slice(body)
        .map_err(|e| Cause::BadRequest { message: format!("the request body is not valid: {e}; see docs/cli.md for the requests pdctld accepts") })
}

async fn post_rollout(State(d): State<Arc<Daemon>>, body: Bytes) -> Response {
    let req: Request = match decode(&body) {
        Ok(r) => r,
        Err(c) => return api_err(&c),
    };
    match start(d, req).await {
        Ok(v) => (StatusCode::ACCEPTED, Json(v)).into_response(),
        Err(c) => api_err(&c),
    }
}

async fn list(State(d): State<Arc<Daemon>>) -> Response {
    Json(History { rollouts: d.store.all().iter().map(Record::history_item).collect(), running: d.running_id() }).into_response()
}

async fn get_one(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(r) = lock(&d.running).as_ref().filter(|r| r.id == id) {
        return Json(lock(&r.record).clone()).into_response();
    }
    match d.store.load(&id) {
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
        None => match d.store.load(&id) {
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
            let state = d.store.load(&id).map(|r| r.lifecycle.state().as_str().to_string());
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
    match e.staleness(&d.store.dir().join("revisions")).await {
        Ok(s) => {
            Json(Diff { workers: s.into_iter().map(|(unit, reasons)| DiffWorker { unit, stale: !reasons.is_empty(), reasons }).collect() }).into_response()
        }
        Err(c) => api_err(&c),
    }
}

async fn status(State(d): State<Arc<Daemon>>) -> Response {
    let last = d.store.all().into_iter().last().map(|r| LastRollout { id: r.id.clone(), state: r.lifecycle.state(), kind: r.kind });
    Json(DaemonStatus { running: d.running_id(), last, config: d.config.display().to_string(), state_dir: d.store.dir().display().to_string() }).into_response()
}

/// The control API.
pub fn api(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/rollouts", post(post_rollout).get(list))
        .route("/v1/rollouts/{id}", get(get_one))
        .route("/v1/rollouts/{id}/events", get(events))
        .route("/v1/rollouts/{id}/abort", post(abort))
        .route("/v1/diff", get(diff))
        .route("/v1/status", get(status))
        .fallback(|| async { api_err(&Cause::BadRequest { message: "no such endpoint; see docs/cli.md for pdctld's control API".into() }) })
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
