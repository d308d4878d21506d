//! The control API: strict JSON in, records and NDJSON event streams out.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pdctl_contract::api::{AbortAccepted, DaemonStatus, Diff, DiffWorker, FleetRequest, History, LastRollout, Record, Request, Started, StartedBy, StreamLine};
use pdctl_contract::cause::Cause;
use tokio::sync::broadcast;

use super::{api_err, config, engine, lock, Daemon};

use super::rollouts::start;

/// Decode a JSON body strictly (unknown fields rejected); the cause names what is wrong.
pub(super) fn decode<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Cause> {
    serde_json::from_slice(body)
        .map_err(|e| Cause::BadRequest { message: format!("the request body is not valid: {e}; see docs/cli.md for the requests pdctld accepts") })
}

/// The control socket's peer, as the kernel reports it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Peer {
    /// Its uid.
    pub uid: Option<u32>,
}

pub(super) async fn post_rollout(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<Peer>>, body: Bytes) -> Response {
    if let Err(c) = d.may_act(peer.as_ref().and_then(|p| p.uid)) {
        return api_err(&c);
    }
    let req: Request = match decode(&body) {
        Ok(r) => r,
        Err(c) => return api_err(&c),
    };
    let reason = match &req {
        Request::Restart { reason, .. }
        | Request::Apply { reason, .. }
        | Request::Revert { reason, .. }
        | Request::Weights { reason, .. }
        | Request::HostDrain { reason, .. }
        | Request::HostResume { reason, .. }
        | Request::Role { reason, .. } => reason.clone(),
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
pub(super) async fn post_fleet_rollout(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<Peer>>, body: Bytes) -> Response {
    use pdctl_core::ports::{CasChange, Coordinator as _, Write};
    if let Err(c) = d.may_act(peer.as_ref().and_then(|p| p.uid)) {
        return api_err(&c);
    }
    let req: FleetRequest = match decode(&body) {
        Ok(r) => r,
        Err(c) => return api_err(&c),
    };
    if let Some(why) = req.weights.as_ref().and_then(|w| pdctl_core::sglang::model_path_problem(&w.model_path)) {
        return api_err(&Cause::BadRequest { message: format!("{why}; nothing was touched") });
    }
    let s = match config(&d) {
        Ok(s) => s,
        Err(c) => return api_err(&c),
    };
    if let Some(why) = req.weights.as_ref().and_then(|w| s.rollout.model_path_allowed(&w.model_path).err()) {
        return api_err(&Cause::BadRequest { message: format!("{why}; nothing was touched") });
    }
    let Some(f) = s.fleet else {
        return api_err(&Cause::BadRequest { message: format!("{} has no [fleet]: this host is not part of a fleet (docs/fleet.md)", d.config.display()) });
    };
    let c = pdctl_real::EtcdCoordinator::new(&f);
    let hosts = if req.hosts.is_empty() {
        match pdctl_core::fleet::hosts(&c, &f.name).await {
            Ok(h) => h.into_iter().map(|h| h.host).collect(),
            Err(e) => return api_err(&Cause::FleetUnreachable { message: e.to_string() }),
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
        // New weights are all hosts at once: no bake of a restart's changes.
        bake_secs: f.bake.map(|b| b.as_secs()).filter(|_| req.weights.is_none()),
        weights: req.weights.clone(),
    };
    let key = pdctl_core::fleet::rollout_key(&f.name, &r.id);
    let value = serde_json::to_vec(&r).unwrap_or_default();
    match c.cas(vec![CasChange { key, expect: 0, write: Write::Put(value) }]).await {
        Ok(true) => {
            tracing::info!("fleet rollout {} requested by {} on {}", r.id, r.by, r.hosts.join(", "));
            (StatusCode::ACCEPTED, Json(Started { id: Some(r.id), message: None })).into_response()
        }
        Ok(false) => api_err(&Cause::Busy { id: r.id }),
        Err(e) => api_err(&Cause::FleetUnreachable { message: e.to_string() }),
    }
}

/// `GET /v1/reach`: which configured addresses on other hosts this process may not connect to
/// (for `pdctl check`, which runs outside pdctld's unit and its IP sandbox).
pub(super) async fn reach(State(d): State<Arc<Daemon>>) -> Response {
    use pdctl_core::ports::{Probes as _, Reach};
    let s = match config(&d) {
        Ok(s) => s,
        Err(c) => return api_err(&c),
    };
    let probes = pdctl_real::probes(&s);
    let mut out = pdctl_contract::api::ReachReport::default();
    for (what, url) in s.urls() {
        let host = pdctl_core::sglang::pairing::bootstrap_host(&url);
        if host == "localhost" || host == "::1" || host.starts_with("127.") {
            continue;
        }
        out.checked.push(url.clone());
        if let Reach::Blocked(_) = probes.reach(&url).await {
            out.blocked.push(pdctl_contract::api::BlockedAddress { what, url });
        }
    }
    Json(out).into_response()
}

/// Every record, the unsaved ones in their newest state, and the corrupt files.
pub(super) fn records(d: &Daemon) -> (Vec<Arc<Record>>, Vec<pdctl_contract::api::CorruptRecord>) {
    let (mut all, corrupt) = d.store.all();
    let unsaved = lock(&d.unsaved).clone();
    for r in all.iter_mut() {
        if let Some(u) = unsaved.get(&r.id) {
            *r = Arc::new(u.clone());
        }
    }
    for (id, u) in unsaved {
        if !all.iter().any(|r| r.id == id) {
            all.push(Arc::new(u));
        }
    }
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    d.metrics.corrupt_records.set(corrupt.len() as i64);
    (all, corrupt)
}

pub(super) async fn list(State(d): State<Arc<Daemon>>) -> Response {
    let (all, corrupt) = records(&d);
    Json(History { rollouts: all.iter().map(|r| r.history_item()).collect(), running: d.running_id(), corrupt }).into_response()
}

pub(super) async fn get_one(State(d): State<Arc<Daemon>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(r) = lock(&d.running).as_ref().filter(|r| r.id == id) {
        return Json(lock(&r.record).clone()).into_response();
    }
    match d.load(&id) {
        Some(r) => Json(r).into_response(),
        None => api_err(&Cause::NoSuchRollout { id }),
    }
}

/// NDJSON: every event from the beginning, then live ones, then the summary.
pub(super) async fn events(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<Peer>>, UrlPath(id): UrlPath<String>) -> Response {
    // Readers are capped per account: 256 streams of one socket-group member held every
    // connection, the watchdog's ping among them, and systemd killed pdctld mid-rollout.
    let slot = match super::shared::StreamSlot::take(&d, peer.and_then(|p| p.0.uid)) {
        Ok(s) => s,
        Err(c) => return api_err(&c),
    };
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
    // The slot travels with the stream's state: given back when the stream ends or is dropped.
    let stream = futures_util::stream::unfold((backlog, rx, false, slot), move |(mut q, mut rx, done, slot)| async move {
        if done {
            return None;
        }
        if let Some(v) = q.pop_front() {
            return Some((Ok::<_, Infallible>(line(&v)), (q, rx, false, slot)));
        }
        let r = rx.as_mut()?;
        loop {
            match r.recv().await {
                Ok(v) => {
                    let last = !matches!(v, StreamLine::Event(_));
                    return Some((Ok(line(&v)), (q, rx, last, slot)));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    ([("content-type", "application/x-ndjson")], Body::from_stream(stream)).into_response()
}

pub(super) async fn abort(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<Peer>>, UrlPath(id): UrlPath<String>) -> Response {
    let uid = peer.as_ref().and_then(|p| p.uid);
    if let Err(c) = d.may_act(uid) {
        return api_err(&c);
    }
    match lock(&d.running).as_ref() {
        Some(r) if r.id == id => {
            r.abort.store(true, Ordering::SeqCst);
            // Who asked is on record, as who started it is.
            let who = uid.map_or_else(|| "an unknown uid".to_string(), |u| format!("uid {u}"));
            lock(&r.record).notes.push(format!("abort requested by {who}"));
            tracing::warn!(pdctl_rollout_id = %id, "abort of rollout {id} requested by {who}: it stops after the unit in progress is verified");
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

pub(super) async fn diff(State(d): State<Arc<Daemon>>) -> Response {
    let e = match engine(&d).await {
        Ok(e) => e,
        Err(c) => return api_err(&c),
    };
    let dir = d.store.revisions_dir();
    match e.staleness(&dir).await {
        Ok(s) => {
            let chosen = pdctl_core::engine::Staleness::to_roll(&s, false);
            let apply = match (chosen.is_empty(), e.in_place_target(&dir, &chosen).await) {
                (true, _) => None,
                (false, Ok(t)) => Some(format!(
                    "rollout apply loads {} in place into all {} workers at once, without a restart: every one is paused for the load (no worker computes meanwhile: requests wait, none fails, none pairs two versions)",
                    pdctl_core::state::in_place::show(&t),
                    chosen.len()
                )),
                (false, Err(why)) => Some(format!("rollout apply restarts {} one at a time through every gate (not loadable in place: {why})", chosen.join(", "))),
            };
            Json(Diff {
                apply,
                workers: s
                    .into_iter()
                    .map(|w| DiffWorker {
                        timing: pdctl_core::state::revisions::last_start(&dir, &w.unit),
                        unit: w.unit,
                        stale: !w.reasons.is_empty(),
                        reasons: w.reasons,
                        quarantined: w.quarantined,
                    })
                    .collect(),
            })
            .into_response()
        }
        Err(c) => api_err(&c),
    }
}

/// Liveness of the API itself (the watchdog's probe): no I/O beyond the answer.
/// `GET /v1/config`: which config pdctld runs with (path and digest), for a CLI to compare with
/// its own before it asks for anything.
pub(super) async fn config_identity(State(d): State<Arc<Daemon>>) -> Response {
    match pdctl_core::config::identity(&d.config) {
        Some(c) => Json(c).into_response(),
        None => api_err(&Cause::ConfigInvalid { message: format!("pdctld cannot read its config {}", d.config.display()) }),
    }
}

/// `GET /v1/host`: this host's maintenance, and whether one may begin now.
pub(super) async fn host(State(d): State<Arc<Daemon>>) -> Response {
    Json(d.host_status().await).into_response()
}

pub(super) async fn ping() -> Response {
    Json(serde_json::json!({ "ok": true })).into_response()
}

pub(super) async fn status(State(d): State<Arc<Daemon>>) -> Response {
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
        pairs: pdctl_contract::api::PairStatus::from_records(all.iter().map(|r| r.as_ref())),
        corrupt,
        quarantined,
        unresolved: lock(&d.unresolved).values().cloned().collect(),
        role_balance: lock(&d.role_balance).clone(),
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
        .route("/v1/host", get(host))
        .route("/v1/ping", get(ping))
        .fallback(|| async { api_err(&Cause::BadRequest { message: "no such endpoint; see docs/cli.md for pdctld's control API".into() }) })
        .method_not_allowed_fallback(|| async {
            api_err(&Cause::BadRequest { message: "that method is not allowed on this endpoint; see docs/cli.md for pdctld's control API".into() })
        })
        .layer(axum::middleware::from_fn(body_in_time))
        .with_state(d)
}

/// How long a request's body may take to arrive once its head has (a client sending its head and
/// then a byte at a time would otherwise hold a connection, and with enough of them every slot).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request body (a rollout request is a few hundred bytes).
const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// Read the whole body within [`BODY_TIMEOUT`] and [`BODY_LIMIT`] before any handler sees it.
async fn body_in_time(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))).await,
        Ok(Err(e)) => api_err(&Cause::BadRequest { message: format!("the request body could not be read ({e}); pdctld takes at most 2 MB") }),
        Err(_) => api_err(&Cause::BadRequest { message: format!("the request body did not arrive within {} s; send it whole", BODY_TIMEOUT.as_secs()) }),
    }
}

/// The metrics endpoint.
pub fn metrics_api(d: Arc<Daemon>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(d): State<Arc<Daemon>>| async move {
                // The maintenance gauges are read from the ledger at each scrape.
                let m = d.store.ledger().maintenance();
                d.metrics.maintenance.set(i64::from(!matches!(m, Ok(None))));
                d.metrics.maintenance_failed.set(i64::from(matches!(&m, Ok(Some(x)) if x.phase == pdctl_contract::records::MaintenancePhase::Failed)));
                ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], d.metrics.render())
            }),
        )
        .with_state(d)
}
