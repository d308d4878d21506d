//! The daemon: one rollout at a time, every event persisted and streamed, abort between units,
//! interrupted rollouts reported (never resumed by themselves), config rollouts with rollback.

use std::collections::VecDeque;
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
use pdctl_core::config::{OnFailure, Settings};
use pdctl_core::events::{Event, Outcome, Status, Step, Summary};
use pdctl_core::plan::Plan;
use pdctl_core::ports::RealEngine;
use pdctl_systemd::Systemd;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::metrics::{cause_class, FailureLabel, Metrics, ResultLabel, StepLabel};
use crate::revisions;
use crate::store::{last_position, now, Record, State as RState, Store};

struct Running {
    id: String,
    abort: Arc<AtomicBool>,
    tx: broadcast::Sender<Value>,
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

/// An API error: HTTP status, the CLI exit code it maps to, one sentence.
fn api_err(status: StatusCode, exit: i32, msg: impl Into<String>) -> Response {
    (status, Json(json!({ "error": msg.into(), "exit_code": exit }))).into_response()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn notify_status(s: &str) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(s)]);
}

/// What a client asks for.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// A rolling restart.
    Restart {
        /// Only these units.
        #[serde(default)]
        units: Vec<String>,
    },
    /// A config rollout of stale workers.
    Apply {
        /// Do nothing (no record) when no worker is stale.
        #[serde(default)]
        if_changed: bool,
        /// Roll every worker, stale or not.
        #[serde(default)]
        all: bool,
    },
    /// Continue an interrupted rollout.
    Resume {
        /// The interrupted rollout.
        id: String,
    },
}

async fn engine(settings: Settings) -> Result<RealEngine, Response> {
    pdctl_core::ports::connect(settings).await.map_err(|e| api_err(StatusCode::SERVICE_UNAVAILABLE, 3, e.to_string()))
}

/// Why each worker is stale (unit → reasons), recording a baseline revision for a worker pdctld
/// has never seen start when its files are older than its running process.
async fn staleness(daemon: &Daemon, e: &RealEngine) -> Result<Vec<(String, Vec<String>)>, Response> {
    let mut out = Vec::new();
    for w in &e.settings.workers {
        let cfg = e.units.config(&w.unit).await.map_err(|er| api_err(StatusCode::BAD_REQUEST, if er.is_access() { 3 } else { 2 }, er.to_string()))?;
        let st = e.units.state(&w.unit).await.map_err(|er| api_err(StatusCode::BAD_REQUEST, if er.is_access() { 3 } else { 2 }, er.to_string()))?;
        let current = revisions::snapshot(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), "current");
        let mut last = revisions::load(daemon.store.dir(), &w.unit);
        if last.is_none() {
            let by_mtime = revisions::stale_reasons(&current, None, st.exec_main_start_us, false);
            if by_mtime.is_empty() && !cfg.need_daemon_reload && st.active_state == "active" {
                let mut base = current.clone();
                base.why = "baseline".into();
                let _ = revisions::save(daemon.store.dir(), &base);
                last = Some(base);
            }
        }
        out.push((w.unit.clone(), revisions::stale_reasons(&current, last.as_ref(), st.exec_main_start_us, cfg.need_daemon_reload)));
    }
    Ok(out)
}

impl Daemon {
    /// A daemon over `store`; rollouts left `running` by a previous process are marked
    /// interrupted (with each unit's state now), and nothing resumes by itself.
    pub async fn new(config: PathBuf, store: Store) -> Daemon {
        let d = Daemon { config, store, metrics: Metrics::default(), running: Mutex::new(None) };
        let stuck: Vec<Record> = d.store.all().into_iter().filter(|r| r.state == RState::Running).collect();
        if !stuck.is_empty() {
            let sd = match pdctl_core::config::load(&d.config) {
                Ok(s) => Systemd::connect(&pdctl_core::ports::bus(&s)).await.ok(),
                Err(_) => None,
            };
            for mut r in stuck {
                let (unit, step) = last_position(&r);
                let mut units = Vec::new();
                for u in &r.plan {
                    let st = match &sd {
                        Some(sd) => sd.state(u).await.map(|s| json!({ "unit": u, "active_state": s.active_state, "sub_state": s.sub_state, "invocation_id": s.invocation_id, "n_restarts": s.n_restarts })).unwrap_or_else(|e| json!({ "unit": u, "error": e.to_string() })),
                        None => json!({ "unit": u, "error": "systemd not reachable at start-up" }),
                    };
                    units.push(st);
                }
                tracing::warn!(pdctl_rollout_id = %r.id, unit = ?unit, step = ?step, "rollout was interrupted (daemon stopped while it ran)");
                r.interrupted = Some(json!({ "unit": unit, "step": step, "detected_at": now(), "units": units }));
                r.state = RState::Interrupted;
                r.finished_at = Some(now());
                d.metrics.rollouts.get_or_create(&ResultLabel { result: "interrupted".into() }).inc();
                if let Err(e) = d.store.save(&r) {
                    tracing::error!("cannot save {}: {e}", r.id);
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

/// Start a rollout; `Ok(id)` or an error response (busy, config, unreachable).
async fn start(daemon: Arc<Daemon>, req: Request) -> Result<Value, Response> {
    if let Some(id) = daemon.running_id() {
        return Err(api_err(StatusCode::CONFLICT, 4, format!("another rollout is running: {id} (pdctl rollout watch {id}; pdctl rollout abort {id})")));
    }
    let settings = pdctl_core::config::load(&daemon.config).map_err(|e| api_err(StatusCode::BAD_REQUEST, 2, format!("config error: {e}")))?;
    let e = engine(settings).await?;
    let (kind, plan, reasons, resumes) = match req {
        Request::Restart { units } => {
            let plan = Plan::new(&e.settings, &units).map_err(|er| api_err(StatusCode::BAD_REQUEST, 2, er.to_string()))?;
            ("restart", plan, Value::Null, None)
        }
        Request::Apply { if_changed, all } => {
            let stale = staleness(&daemon, &e).await?;
            let chosen: Vec<String> = stale.iter().filter(|(_, why)| all || !why.is_empty()).map(|(u, _)| u.clone()).collect();
            if chosen.is_empty() && if_changed {
                return Ok(json!({ "id": null, "message": "no worker is stale; nothing to do", "stale": [] }));
            }
            let plan = Plan::new(&e.settings, &chosen).map_err(|er| api_err(StatusCode::BAD_REQUEST, 2, er.to_string()))?;
            let plan = if chosen.is_empty() { Plan { workers: vec![] } } else { plan };
            // A changed unit file or drop-in needs a daemon-reload before the restart; reloading is
            // idempotent and cheap, so do it whenever a worker is rolled for a change.
            if stale.iter().any(|(u, why)| !why.is_empty() && chosen.contains(u)) {
                e.units.reload().await.map_err(|er| api_err(StatusCode::SERVICE_UNAVAILABLE, 3, er.to_string()))?;
            }
            let reasons: Value = stale.iter().map(|(u, why)| (u.clone(), json!(why))).collect::<serde_json::Map<_, _>>().into();
            ("apply", plan, reasons, None)
        }
        Request::Resume { id } => {
            let old = daemon.store.load(&id).ok_or_else(|| api_err(StatusCode::NOT_FOUND, 2, format!("no rollout {id}")))?;
            if old.state != RState::Interrupted {
                return Err(api_err(
                    StatusCode::CONFLICT,
                    2,
                    format!("rollout {id} is {:?}, not interrupted: only an interrupted rollout can be resumed", old.state),
                ));
            }
            let (unit, _) = last_position(&old);
            let from = unit.as_ref().and_then(|u| old.plan.iter().position(|p| p == u)).unwrap_or(0);
            let rest: Vec<String> = old.plan[from..].to_vec();
            let plan = Plan::new(&e.settings, &rest).map_err(|er| api_err(StatusCode::BAD_REQUEST, 2, er.to_string()))?;
            ("resume", plan, Value::Null, Some(id))
        }
    };
    let store = daemon.store.clone();
    let id = store.new_id();
    let record = Record {
        id: id.clone(),
        kind: kind.into(),
        plan: plan.workers.iter().map(|w| w.unit.clone()).collect(),
        state: RState::Running,
        created_at: now(),
        finished_at: None,
        events: vec![],
        summary: None,
        interrupted: None,
        reasons,
        notes: vec![],
        resumes,
    };
    store
        .save(&record)
        .map_err(|er| api_err(StatusCode::INTERNAL_SERVER_ERROR, 3, format!("cannot write the rollout record in {}: {er}", store.dir().display())))?;
    let (tx, _) = broadcast::channel(4096);
    let abort = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(record));
    {
        let mut r = lock(&daemon.running);
        if let Some(other) = r.as_ref() {
            return Err(api_err(StatusCode::CONFLICT, 4, format!("another rollout is running: {}", other.id)));
        }
        *r = Some(Running { id: id.clone(), abort: abort.clone(), tx: tx.clone(), record: record.clone() });
    }
    daemon.metrics.running.set(1);
    notify_status(&format!("rollout {id} ({kind}): starting"));
    tracing::info!(pdctl_rollout_id = %id, kind, units = ?plan.workers.iter().map(|w| &w.unit).collect::<Vec<_>>(), "rollout started");
    let d2 = daemon.clone();
    let id2 = id.clone();
    tokio::spawn(async move { run(d2, e, plan, id2, kind, record, tx, abort).await });
    Ok(json!({ "id": id }))
}

#[allow(clippy::too_many_arguments)]
async fn run(
    daemon: Arc<Daemon>,
    e: RealEngine,
    plan: Plan,
    id: String,
    kind: &'static str,
    record: Arc<Mutex<Record>>,
    tx: broadcast::Sender<Value>,
    abort: Arc<AtomicBool>,
) {
    let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    // The consumer: persist, broadcast, count, log, record revisions of verified units.
    let consumer = {
        let (daemon, record, tx, id) = (daemon.clone(), record.clone(), tx.clone(), id.clone());
        let e_settings = e.settings.clone();
        let units = e.units.clone();
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                tracing::info!(pdctl_rollout_id = %id, pdctl_unit = %ev.unit, pdctl_step = ev.step.as_str(), status = ?ev.status, elapsed_ms = ev.elapsed_ms, "step");
                match ev.status {
                    Status::Passed => {
                        daemon.metrics.step_duration.get_or_create(&StepLabel { step: ev.step.as_str().into() }).observe(ev.elapsed_ms as f64 / 1000.0)
                    }
                    Status::Failed => {
                        let cause = ev.detail.get("cause").and_then(Value::as_str).unwrap_or("");
                        daemon.metrics.gate_failures.get_or_create(&FailureLabel { step: ev.step.as_str().into(), cause: cause_class(cause).into() }).inc();
                    }
                    _ => {}
                }
                notify_status(&format!("rollout {id}: {} {} {:?}", ev.unit, ev.step.as_str(), ev.status).to_lowercase());
                let mut note = None;
                if ev.step == Step::Soak && ev.status == Status::Passed {
                    daemon.metrics.units_restarted.inc();
                    if let Some(w) = e_settings.workers.iter().find(|w| w.unit == ev.unit) {
                        if let Ok(cfg) = units.config(&w.unit).await {
                            let rev = revisions::snapshot(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), "started");
                            note = Some(match revisions::save(daemon.store.dir(), &rev) {
                                Ok(()) => format!("recorded the revision {} runs with: {}", w.unit, rev.files.keys().cloned().collect::<Vec<_>>().join(", ")),
                                Err(er) => format!("could not record the revision of {}: {er}", w.unit),
                            });
                        }
                    }
                }
                let line = serde_json::to_value(&ev).unwrap_or(Value::Null);
                let mut r = lock(&record);
                r.events.push(ev);
                r.notes.extend(note);
                if let Err(er) = daemon.store.save(&r) {
                    tracing::error!("cannot save rollout {}: {er}", r.id);
                }
                let _ = tx.send(line);
            }
        })
    };

    let mut summary = if kind == "resume" { resume(&e, &plan, &sink, &abort).await } else { e.rolling_restart_abortable(&plan, &sink, &abort).await };
    let mut notes = Vec::new();
    if let (Outcome::Failed, Some(f)) = (summary.result, &summary.failed) {
        if e.settings.rollout.on_failure == OnFailure::Rollback && f.step != Step::Preflight && f.unit != "router" {
            match rollback(&daemon, &e, &f.unit, &id, &sink).await {
                Ok(mut done) => {
                    summary.result = Outcome::RolledBack;
                    notes.append(&mut done);
                }
                Err(why) => notes.push(format!("rollback of {} failed: {why}", f.unit)),
            }
        }
    }
    drop(sink);
    let _ = consumer.await;
    let state = match summary.result {
        Outcome::Succeeded => RState::Succeeded,
        Outcome::Failed => RState::Failed,
        Outcome::RolledBack => RState::RolledBack,
        Outcome::Aborted => RState::Aborted,
    };
    let result = serde_json::to_value(summary.result).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
    daemon.metrics.rollouts.get_or_create(&ResultLabel { result: result.clone() }).inc();
    if state == RState::Succeeded {
        daemon.metrics.last_success.set(now() as i64);
    }
    daemon.metrics.running.set(0);
    {
        let mut r = lock(&record);
        r.state = state;
        r.finished_at = Some(now());
        r.summary = Some(summary.clone());
        r.notes.extend(notes);
        if let Err(er) = daemon.store.save(&r) {
            tracing::error!("cannot save rollout {}: {er}", r.id);
        }
    }
    tracing::info!(pdctl_rollout_id = %id, result = %result, "rollout finished");
    let _ = tx.send(serde_json::to_value(&summary).unwrap_or(Value::Null));
    *lock(&daemon.running) = None;
    notify_status(&format!("idle; last rollout {id}: {result}"));
}

/// Resume: re-verify the interrupted unit (restart it only if it does not pass), then the rest.
async fn resume(e: &RealEngine, plan: &Plan, sink: &pdctl_core::events::Sink, abort: &AtomicBool) -> Summary {
    let mut plan = plan.clone();
    if let Some(first) = plan.workers.first().cloned() {
        if e.verify(&first, sink).await {
            plan.workers.remove(0);
        }
    }
    e.rolling_restart_abortable(&plan, sink, abort).await
}

/// Restore the unit's last good revision, reload, and run it through the same gates.
async fn rollback(daemon: &Daemon, e: &RealEngine, unit: &str, id: &str, sink: &pdctl_core::events::Sink) -> Result<Vec<String>, String> {
    let w = e.settings.workers.iter().find(|w| w.unit == unit).ok_or("not a configured worker")?;
    let last = revisions::load(daemon.store.dir(), unit).ok_or_else(|| format!("no good revision of {unit} was ever recorded"))?;
    let cfg = e.units.config(unit).await.map_err(|er| er.to_string())?;
    let current = revisions::snapshot(unit, &revisions::paths(unit, &cfg, &w.watch_files), "current");
    let mut done = revisions::restore(&last, &current, id).map_err(|er| format!("cannot restore the files: {er}"))?;
    tracing::warn!(pdctl_rollout_id = %id, pdctl_unit = %unit, actions = ?done, "rolling back to the last good revision");
    e.units.reload().await.map_err(|er| er.to_string())?;
    let plan = Plan { workers: vec![w.clone()] };
    let s = e.rolling_restart(&plan, sink).await;
    match s.result {
        Outcome::Succeeded => {
            done.push(format!("{unit} runs its last good revision (recorded {}) and passed every gate", last.recorded_at));
            Ok(done)
        }
        _ => Err(format!("the old revision did not pass either: {}", s.failed.map(|f| f.cause).unwrap_or_default())),
    }
}

async fn post_rollout(State(d): State<Arc<Daemon>>, Json(req): Json<Request>) -> Response {
    match start(d, req).await {
        Ok(v) => (StatusCode::ACCEPTED, Json(v)).into_response(),
        Err(r) => r,
    }
}

async fn list(State(d): State<Arc<Daemon>>) -> Response {
    let items: Vec<Value> = d
        .store
        .all()
        .iter()
        .map(|r| json!({ "id": r.id, "kind": r.kind, "state": r.state, "plan": r.plan, "created_at": r.created_at, "finished_at": r.finished_at, "failed": r.summary.as_ref().and_then(|s| s.failed.clone()), "interrupted": r.interrupted }))
        .collect();
    Json(json!({ "rollouts": items, "running": d.running_id() })).into_response()
}

async fn get_one(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(r) = lock(&d.running).as_ref().filter(|r| r.id == id) {
        return Json(lock(&r.record).clone()).into_response();
    }
    match d.store.load(&id) {
        Some(r) => Json(r).into_response(),
        None => api_err(StatusCode::NOT_FOUND, 2, format!("no rollout {id}")),
    }
}

/// NDJSON: every event from the beginning, then live ones, then the summary.
async fn events(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> Response {
    let (backlog, rx): (VecDeque<Value>, Option<broadcast::Receiver<Value>>) = match lock(&d.running).as_ref().filter(|r| r.id == id) {
        Some(r) => {
            let rec = lock(&r.record);
            let rx = r.tx.subscribe();
            (rec.events.iter().filter_map(|e| serde_json::to_value(e).ok()).collect(), Some(rx))
        }
        None => match d.store.load(&id) {
            Some(rec) => {
                let mut q: VecDeque<Value> = rec.events.iter().filter_map(|e| serde_json::to_value(e).ok()).collect();
                match (&rec.summary, &rec.interrupted) {
                    (Some(s), _) => q.push_back(serde_json::to_value(s).unwrap_or(Value::Null)),
                    (None, Some(i)) => q.push_back(json!({ "result": "interrupted", "interrupted": i })),
                    _ => {}
                }
                (q, None)
            }
            None => return api_err(StatusCode::NOT_FOUND, 2, format!("no rollout {id}")),
        },
    };
    let stream = futures_util::stream::unfold((backlog, rx, false), |(mut q, mut rx, done)| async move {
        if done {
            return None;
        }
        if let Some(v) = q.pop_front() {
            return Some((Ok::<_, Infallible>(Bytes::from(format!("{v}\n"))), (q, rx, false)));
        }
        let r = rx.as_mut()?;
        loop {
            match r.recv().await {
                Ok(v) => {
                    let last = v.get("result").is_some();
                    return Some((Ok(Bytes::from(format!("{v}\n"))), (q, rx, last)));
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
            tracing::warn!(pdctl_rollout_id = %id, "abort requested");
            (StatusCode::ACCEPTED, Json(json!({ "id": id, "message": "aborting after the current unit is verified" }))).into_response()
        }
        _ => api_err(StatusCode::CONFLICT, 2, format!("rollout {id} is not running")),
    }
}

async fn diff(State(d): State<Arc<Daemon>>) -> Response {
    let settings = match pdctl_core::config::load(&d.config) {
        Ok(s) => s,
        Err(e) => return api_err(StatusCode::BAD_REQUEST, 2, format!("config error: {e}")),
    };
    let e = match engine(settings).await {
        Ok(e) => e,
        Err(r) => return r,
    };
    match staleness(&d, &e).await {
        Ok(s) => Json(json!({ "workers": s.iter().map(|(u, why)| json!({ "unit": u, "stale": !why.is_empty(), "reasons": why })).collect::<Vec<_>>() }))
            .into_response(),
        Err(r) => r,
    }
}

async fn status(State(d): State<Arc<Daemon>>) -> Response {
    let last = d.store.all().into_iter().last().map(|r| json!({ "id": r.id, "state": r.state, "kind": r.kind }));
    Json(json!({ "running": d.running_id(), "last": last, "config": d.config, "state_dir": d.store.dir() })).into_response()
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
