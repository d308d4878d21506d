//! Host maintenance in pdctld: `GET /v1/host`, the FleetLock endpoint an update agent asks before
//! it reboots (`[maintenance] fleetlock_listen`), and the resume at pdctld's start after a reboot.
//! The drain and the resume themselves are rollouts (`host_drain`, `host_resume`: pdctl-core's
//! `engine/host.rs`), with a record, events and the one running slot like any other.
//!
//! FleetLock (coreos.github.io/zincati/development/fleetlock/protocol): `POST /v1/pre-reboot` and
//! `POST /v1/steady-state`, header `fleet-lock-protocol: true`, body
//! `{"client_params": {"id": ID, "group": GROUP}}`; 200 when the lock is taken (given back);
//! otherwise an error body `{"kind": …, "value": …}` and the client asks again later.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use pdctl_contract::api::{HostStatus, Request, RolloutKind, Started, StartedBy};
use pdctl_contract::records::{Maintenance, MaintenancePhase};
use serde::Deserialize;

use super::rollouts::start;
use super::{config, lock, Daemon};

/// A FleetLock request's body. Another client's extra fields are tolerated (the protocol is
/// not ours to tighten); the two it requires are checked.
#[derive(Debug, Deserialize)]
struct LockRequest {
    client_params: ClientParams,
}

/// Who asks: a non-empty id and group (the protocol's group: `^[a-zA-Z0-9.-]+$`).
#[derive(Debug, Deserialize)]
struct ClientParams {
    id: String,
    group: String,
}

/// A FleetLock answer other than 200: the protocol's error body.
struct LockError {
    status: StatusCode,
    kind: &'static str,
    value: String,
}

impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({ "kind": self.kind, "value": self.value }))).into_response()
    }
}

fn not_yet(kind: &'static str, value: String) -> LockError {
    LockError { status: StatusCode::CONFLICT, kind, value }
}

/// The FleetLock endpoint.
pub fn fleetlock_api(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/pre-reboot", post(pre_reboot))
        .route("/v1/steady-state", post(steady_state))
        .fallback(|| async {
            LockError { status: StatusCode::NOT_FOUND, kind: "not_found", value: "FleetLock has POST /v1/pre-reboot and POST /v1/steady-state".into() }
        })
        .with_state(d)
}

/// Who may ask for this host's reboot lock: root and the accounts of `[maintenance]
/// fleetlock_users`, told by the kernel's socket table (the protocol carries no credential).
/// Anyone else is refused before anything else is read or said — not the id or group this host
/// answers to either.
fn authorized(m: &pdctl_core::config::MaintenanceSettings, uid: Option<u32>) -> Result<u32, LockError> {
    let forbidden = |value: String| LockError { status: StatusCode::FORBIDDEN, kind: "forbidden", value };
    let Some(uid) = uid else {
        return Err(forbidden("pdctld cannot tell which account sent this request (the kernel's socket table does not list its end): nothing was done".into()));
    };
    if uid == 0 || m.fleetlock_users.iter().any(|u| crate::peer::uid_of(u) == Ok(uid)) {
        return Ok(uid);
    }
    Err(forbidden(format!(
        "uid {uid} may not ask for this host's reboot lock: only root and the accounts in [maintenance] fleetlock_users may; nothing was done"
    )))
}

/// The request checked as the protocol asks — from an account that may ask — and the lock's
/// owner: this host's id in this host's group only (a lock belongs to its host). Returns the
/// id, the config and the caller's uid.
fn checked(d: &Daemon, peer: Option<u32>, headers: &HeaderMap, body: &Bytes) -> Result<(String, pdctl_core::config::Settings, u32), LockError> {
    let bad = |value: String| LockError { status: StatusCode::BAD_REQUEST, kind: "bad_request", value };
    let s = config(d).map_err(|c| LockError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "config_invalid", value: c.sentence() })?;
    let Some(m) = &s.maintenance else {
        return Err(LockError { status: StatusCode::NOT_FOUND, kind: "not_configured", value: "pdctld's config has no [maintenance]".into() });
    };
    let uid = authorized(m, peer)?;
    if headers.get("fleet-lock-protocol").and_then(|v| v.to_str().ok()) != Some("true") {
        return Err(bad("a FleetLock request carries the header `fleet-lock-protocol: true`".into()));
    }
    let req: LockRequest =
        serde_json::from_slice(body).map_err(|e| bad(format!("the body is not {{\"client_params\": {{\"id\": …, \"group\": …}}}} ({e})")))?;
    let id = req.client_params.id;
    if id != m.fleetlock_id {
        return Err(LockError {
            status: StatusCode::FORBIDDEN,
            kind: "foreign_id",
            value: format!("this endpoint holds the lock of {:?} only (a lock belongs to its host; [maintenance] fleetlock_id)", m.fleetlock_id),
        });
    }
    if req.client_params.group != m.group {
        return Err(LockError {
            status: StatusCode::FORBIDDEN,
            kind: "wrong_group",
            value: format!("this host is in group {:?} (its [fleet] name, or \"default\" without one), not {:?}", m.group, req.client_params.group),
        });
    }
    Ok((id, s, uid))
}

/// `POST /v1/pre-reboot`: 200 once the host is drained and stopped (recursive: asked again by
/// its owner while down, 200 again). The first ask starts the host drain; until it is done each
/// ask says why not yet.
async fn pre_reboot(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<super::http::Peer>>, headers: HeaderMap, body: Bytes) -> Response {
    let (id, s, uid) = match checked(&d, peer.and_then(|p| p.0.uid), &headers, &body) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    match d.store.ledger().maintenance() {
        Err(u) => {
            return LockError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "record_unreadable", value: format!("{}: {}", u.path.display(), u.error) }
                .into_response()
        }
        Ok(Some(m)) => {
            return match phase_answer(&d, &m, true) {
                Ok(()) => StatusCode::OK.into_response(),
                // Draining: how many requests its workers still run.
                Err(e) if e.kind == "draining" => not_yet("draining", format!("{}; {}", e.value, in_flight(&s).await)).into_response(),
                Err(e) => e.into_response(),
            };
        }
        Ok(None) => {}
    }
    if let Some(why) = waits(&d, &s).await {
        return not_yet("waiting", why).into_response();
    }
    // A drain that failed a moment ago is said, not started again at every ask.
    if let Some((rid, code, cause)) = failed_drain_lately(&d) {
        return LockError { status: StatusCode::CONFLICT, kind: "drain_failed", value: format!("host drain {rid} failed ({code}): {cause}") }.into_response();
    }
    let by = StartedBy { uid: Some(uid), reason: Some(format!("FleetLock pre-reboot by {id}")), fleetlock: Some(id), ..Default::default() };
    match start(d.clone(), Request::HostDrain { allow_outage: false, reason: by.reason.clone(), config: None }, by).await {
        Ok(Started { id: Some(rid), .. }) => {
            not_yet("draining", format!("host drain {rid} started: every worker out of the gateway and stopped first (pdctl rollout watch {rid})"))
        }
        Ok(Started { message, .. }) => not_yet("not_started", message.unwrap_or_default()),
        Err(c) => not_yet(c.code(), c.sentence()),
    }
    .into_response()
}

/// `POST /v1/steady-state`: 200 once the host's workers passed their gates after the reboot and
/// its slots are given back (no lock held: 200). The first ask after the reboot starts the
/// resume, when pdctld's own start has not.
async fn steady_state(State(d): State<Arc<Daemon>>, peer: Option<axum::Extension<super::http::Peer>>, headers: HeaderMap, body: Bytes) -> Response {
    let (id, _, uid) = match checked(&d, peer.and_then(|p| p.0.uid), &headers, &body) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let m = match d.store.ledger().maintenance() {
        Err(u) => {
            return LockError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "record_unreadable", value: format!("{}: {}", u.path.display(), u.error) }
                .into_response()
        }
        Ok(None) => return StatusCode::OK.into_response(),
        Ok(Some(m)) => m,
    };
    if let Err(e) = phase_answer(&d, &m, false) {
        return e.into_response();
    }
    // Down (or a resume cut short): resume now.
    let by = StartedBy { uid: Some(uid), reason: Some(format!("FleetLock steady-state by {id}")), fleetlock: Some(id), ..Default::default() };
    match start(d.clone(), Request::HostResume { reason: by.reason.clone(), config: None }, by).await {
        Ok(Started { id: Some(rid), .. }) => {
            not_yet("resuming", format!("host resume {rid} started: every worker through its gates, then the slots given back (pdctl rollout watch {rid})"))
        }
        Ok(Started { .. }) => return StatusCode::OK.into_response(),
        Err(c) => not_yet(c.code(), c.sentence()),
    }
    .into_response()
}

/// Whether the running rollout sits in its slot step (a host drain waiting for the fleet's budget).
fn waits_for_slot(d: &Daemon) -> bool {
    lock(&d.running).as_ref().is_some_and(|r| lock(&r.progress).1 == pdctl_contract::events::Step::Slot)
}

/// How long a failed host drain's cause answers a pre-reboot before another drain is tried.
const FAILED_DRAIN_HOLDS: u64 = 60;

/// The newest rollout, when it is a host drain that failed within [`FAILED_DRAIN_HOLDS`]: its id,
/// cause code and cause.
fn failed_drain_lately(d: &Daemon) -> Option<(String, String, String)> {
    let (all, _) = d.store.all();
    let r = all.iter().max_by_key(|r| r.created_at)?;
    let f = r.summary.as_ref()?.failed.as_ref()?;
    let recent = r.finished_at.is_some_and(|t| pdctl_core::fleet::now_secs().saturating_sub(t) < FAILED_DRAIN_HOLDS);
    (r.kind == RolloutKind::HostDrain && recent).then(|| (r.id.clone(), f.cause_code.clone(), f.cause.clone()))
}

/// What a maintenance on record answers: `Ok` when `pre` (pre-reboot) finds the host down; for a
/// steady-state, `Ok` means "start the resume" (down, or a resume no longer running).
fn phase_answer(d: &Daemon, m: &Maintenance, pre: bool) -> Result<(), LockError> {
    let running = lock(&d.running).as_ref().map(|r| (r.id.clone(), lock(&r.record).kind));
    let busy = running.as_ref().map(|(id, _)| id.clone());
    match (m.phase, pre) {
        (MaintenancePhase::Down, true) => Ok(()),
        (MaintenancePhase::Down, false) => Ok(()),
        (MaintenancePhase::Draining, _) if waits_for_slot(d) => {
            Err(not_yet("waiting_for_slot", format!("host drain {} waits for the fleet's slots (pdctl fleet status names their holders)", m.id)))
        }
        (MaintenancePhase::Draining, _) => Err(not_yet("draining", format!("host drain {} is still draining and stopping this host's workers", m.id))),
        (MaintenancePhase::Resuming, _) if running.as_ref().is_some_and(|(_, k)| *k == RolloutKind::HostResume) => {
            Err(not_yet("resuming", format!("host resume {} is bringing the workers back through their gates", busy.unwrap_or_default())))
        }
        (MaintenancePhase::Resuming, true) => Err(not_yet("resuming", "this host's last maintenance is still being resumed".into())),
        (MaintenancePhase::Resuming, false) => Ok(()),
        (MaintenancePhase::Failed, _) => Err(not_yet(
            "failed",
            format!(
                "this host's maintenance failed ({}); it keeps its slots: fix it, then `pdctl host resume`",
                m.failed.clone().unwrap_or_else(|| "see pdctl host status".into())
            ),
        )),
    }
}

/// What this host's workers still run, read from each one's load (bounded: 2 s a worker):
/// `N requests in flight on this host's workers`, naming those that could not be read.
async fn in_flight(s: &pdctl_core::config::Settings) -> String {
    let Ok(e) = pdctl_real::connect(s.clone()).await else { return "its workers' load could not be read".into() };
    let (mut n, mut unread) = (0u64, Vec::new());
    for w in &s.workers {
        match tokio::time::timeout(std::time::Duration::from_secs(2), pdctl_core::ports::Probes::in_flight(&e.probes, &w.url)).await {
            Ok(Ok(k)) => n += k,
            // A worker already stopped runs nothing.
            Ok(Err(_)) if !worker_runs(&e, &w.unit).await => {}
            _ => unread.push(w.unit.as_str()),
        }
    }
    match unread.as_slice() {
        [] => format!("{n} request(s) in flight on this host's workers"),
        u => format!("{n} request(s) in flight on this host's workers ({} not read)", u.join(", ")),
    }
}

/// Whether `unit` runs (active or starting).
async fn worker_runs(e: &pdctl_real::RealEngine, unit: &str) -> bool {
    use pdctl_core::ports::{ActiveState, Units as _};
    e.units.state(unit).await.is_ok_and(|st| matches!(st.active_state, ActiveState::Active | ActiveState::Activating))
}

/// Why a new maintenance would wait now: a rollout running here, outside every window, the fleet
/// paused, or the hold query returning a series. `None`: it may begin.
pub(super) async fn waits(d: &Daemon, s: &pdctl_core::config::Settings) -> Option<String> {
    if let Some(id) = d.running_id() {
        return Some(format!("rollout {id} is running on this host (pdctl rollout watch {id})"));
    }
    let m = s.maintenance.as_ref()?;
    if !pdctl_core::service::reboot_window::allowed(&m.windows, pdctl_core::fleet::now_secs()) {
        let list: Vec<&str> = m.windows.iter().map(|w| w.text()).collect();
        return Some(format!("outside every maintenance window ({})", list.join(", ")));
    }
    if let Some(f) = &s.fleet {
        let c = d.coordinator(f);
        match pdctl_core::fleet::paused(c.as_ref(), &f.name).await {
            Ok(Some(p)) => return Some(format!("the fleet is paused ({}): no maintenance begins", p.reason)),
            Ok(None) => {}
            Err(e) => return Some(format!("etcd does not answer ({e}): no maintenance begins without the fleet's budget")),
        }
    }
    if let Some(url) = &m.hold_while_alerting {
        return alerting(url).await;
    }
    None
}

/// `Some(why)` while the hold query returns a series (or cannot be asked: a hold that cannot be
/// checked holds).
async fn alerting(url: &str) -> Option<String> {
    let shown = pdctl_contract::url::redacted(url);
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), http_get(url)).await;
    let body = match got {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Some(format!("the hold query {shown} could not be asked ({e}): held")),
        Err(_) => return Some(format!("the hold query {shown} did not answer within 10 s: held")),
    };
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    match v["data"]["result"].as_array() {
        Some(series) if series.is_empty() => None,
        Some(series) => Some(format!("the hold query {shown} returns {} series (an alert is firing)", series.len())),
        None => Some(format!("the hold query {shown} did not answer as Prometheus's query API does: held")),
    }
}

/// A plain HTTP GET (the hold query), at most 1 MB.
async fn http_get(url: &str) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").ok_or("only http:// hold queries are supported")?;
    let (authority, path) = rest.split_once('/').map(|(a, p)| (a, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let mut s = tokio::net::TcpStream::connect(authority).await.map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\n\r\n").as_bytes()).await.map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.take(1 << 20).read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no HTTP answer")?;
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(head.lines().next().unwrap_or_default().to_string());
    }
    Ok(buf[split + 4..].to_vec())
}

impl Daemon {
    /// `GET /v1/host`'s answer.
    pub async fn host_status(&self) -> HostStatus {
        let s = config(self).ok();
        let m = s.as_ref().and_then(|s| s.maintenance.clone());
        let waits = match &s {
            Some(s) => waits(self, s).await,
            None => Some("pdctld cannot read its config".into()),
        };
        HostStatus {
            maintenance: self.store.ledger().maintenance().unwrap_or_default(),
            waits,
            fleetlock: m.as_ref().and_then(|m| m.fleetlock_listen.map(|a| a.to_string())),
            fleetlock_id: m.as_ref().map(|m| m.fleetlock_id.clone()),
            fleetlock_group: m.map(|m| m.group),
        }
    }

    /// At start, after the drains are reconciled: a maintenance on record is resumed when the
    /// host rebooted (another boot id) or a worker runs again (the reboot, or an operator,
    /// started it), or when the drain or a resume was cut short by pdctld's own end. A host
    /// still down in the same boot stays down (pdctld restarted before the reboot).
    pub async fn maintenance_at_start(self: Arc<Self>) {
        let Ok(Some(m)) = self.store.ledger().maintenance() else { return };
        let procfs = config(&self).map(|s| s.procfs).unwrap_or_else(|_| "/proc".into());
        let rebooted = m.boot_id.is_some() && m.boot_id != pdctl_core::engine::host::boot_id(&procfs);
        let mut running_again = false;
        if let Ok(e) = super::engine(&self).await {
            use pdctl_core::ports::Units as _;
            for u in &m.units {
                let runs = |s: &pdctl_core::ports::UnitState| {
                    matches!(s.active_state, pdctl_core::ports::ActiveState::Active | pdctl_core::ports::ActiveState::Activating)
                };
                if u.stopped && e.units.state(&u.unit).await.is_ok_and(|s| runs(&s)) {
                    running_again = true;
                }
            }
        }
        let resume = match m.phase {
            MaintenancePhase::Down => rebooted || running_again,
            MaintenancePhase::Draining | MaintenancePhase::Resuming => true,
            MaintenancePhase::Failed => false,
        };
        if !resume {
            tracing::info!("this host is in maintenance ({}, host drain {}): waiting for its reboot, or `pdctl host resume`", m.phase.as_str(), m.id);
            return;
        }
        let why = match m.phase {
            MaintenancePhase::Down if rebooted => "the host rebooted",
            MaintenancePhase::Down => "its workers run again",
            _ => "pdctld stopped during it",
        };
        let by = StartedBy { reason: Some(format!("pdctld's start: host maintenance {} resumed ({why})", m.id)), pdctld: true, ..Default::default() };
        match start(self.clone(), Request::HostResume { reason: by.reason.clone(), config: None }, by).await {
            Ok(Started { id: Some(id), .. }) => {
                tracing::info!("host maintenance {}: resume {id} started ({why})", m.id);
                // The drain's own record said where it was cut short ("out of the router and
                // not serving"): what pdctld's start did instead is said beside it.
                if let Some(mut rec) = self.load(&m.id) {
                    rec.notes.push(format!(
                        "pdctld's start resumed this host ({why}) as {id}: its workers are brought back in service; this drain is over, not resumable — run pdctl host drain to take the host down again"
                    ));
                    if let Err(er) = self.store.save(&rec) {
                        tracing::warn!("host maintenance {}: its record could not be updated: {er}", m.id);
                    }
                }
            }
            Ok(_) => {}
            Err(c) => tracing::warn!("host maintenance {}: the resume could not start ({}); `pdctl host resume`", m.id, c.sentence()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers one request with `body` (as Prometheus's query API does) and closes.
    async fn answers_once(body: &'static str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            if let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{body}").as_bytes()).await;
            }
        });
        format!("http://{addr}/api/v1/query?query=ALERTS")
    }

    #[tokio::test]
    async fn the_hold_query_holds_while_it_returns_a_series_or_cannot_be_asked() {
        let firing = answers_once(r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"alertname":"GpuXid"},"value":[1,"1"]}]}}"#).await;
        assert!(alerting(&firing).await.is_some_and(|w| w.contains("returns 1 series")), "a firing alert holds");
        let quiet = answers_once(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#).await;
        assert_eq!(alerting(&quiet).await, None, "no series: no hold");
        let odd = answers_once(r#"{"status":"error"}"#).await;
        assert!(alerting(&odd).await.is_some_and(|w| w.contains("held")), "an answer that is not the query API's holds");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        assert!(
            alerting(&format!("http://127.0.0.1:{port}/api/v1/query?query=x")).await.is_some_and(|w| w.contains("held")),
            "a query that cannot be asked holds"
        );
    }
}
