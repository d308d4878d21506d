//! PD pairing as SGLang does it (upstream `srt/disaggregation/`): the router sends the same
//! request to a prefill and a decode with `bootstrap_host`, `bootstrap_port` and a random
//! `bootstrap_room`. The decode asks the prefill's bootstrap server (`GET /route`) where to fetch
//! the room's KV — ephemeral per-rank ports of that prefill *process* — caches the answer per
//! bootstrap address, and fetches; the prefill holds the room's KV (in its KV gauges and its
//! bootstrap queue) until the decode fetches it or `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`
//! passes.
//!
//! After the prefill restarts on the same address its rank ports change but the cache key does
//! not. A decode from before upstream PR 36029 keeps the stale entry and fails every request from
//! that prefill (each after `SGLANG_DISAGGREGATION_WAITING_TIMEOUT`) until it is restarted; after
//! the fix the failed request drops the entry and the next one refetches `/route`
//! (`--sim-pair-cache`). Prefill and decode must agree on `page_size` and `kv_cache_dtype`:
//! otherwise the prefill rejects the transfer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::args::{PairCache, SimConfig};
use crate::engine::{Engine, Ticket};
use crate::log;

mod decode;

/// SGLang's `FAKE_BOOTSTRAP_HOST`: requests with it (the server's own warmup) skip the transfer.
pub const FAKE_BOOTSTRAP_HOST: &str = "2.2.2.2";

/// The bootstrap fields of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// `bootstrap_host`.
    pub host: String,
    /// `bootstrap_port`.
    pub port: u16,
    /// `bootstrap_room`.
    pub room: u64,
}

impl Bootstrap {
    /// The fields of a request body, if all three are there.
    pub fn of(body: &Value) -> Option<Bootstrap> {
        let host = body.get("bootstrap_host")?.as_str()?.to_string();
        let port = u16::try_from(body.get("bootstrap_port")?.as_u64()?).ok()?;
        let room = body.get("bootstrap_room")?.as_u64()?;
        Some(Bootstrap { host, port, room })
    }

    /// The server's own warmup: no transfer.
    pub fn fake(&self) -> bool {
        self.host == FAKE_BOOTSTRAP_HOST
    }
}

/// Where a prefill process serves its rooms' KV, as its bootstrap server's `/route` says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    identity: String,
    rank_ip: String,
    rank_port: u16,
    page_size: Option<u64>,
    kv_cache_dtype: Option<String>,
    /// The prefill's HTTP port (`PrefillServerInfo.prefill_http_port`): where a decode sends a
    /// retracted request's rebootstrap.
    http_port: Option<u16>,
}

/// How a held room ended.
#[derive(Debug, Clone)]
enum Handoff {
    Fetched,
    Rejected(String),
}

struct Held {
    /// The request it was computed for (an `/abort_request` by this rid releases it).
    rid: String,
    ticket: Option<Ticket>,
    done: Option<tokio::sync::oneshot::Sender<Handoff>>,
    /// The weight version its KV was computed with, and the engine's retraction count then (a
    /// room retracted while held is recomputed with the weights of its continue).
    computed: (String, u64),
}

struct Inner {
    /// This prefill's identity (its generation, as its per-rank ports are: new at every start
    /// and at every flip to prefill).
    identity: Mutex<String>,
    /// Decode: the heartbeat runs (started once: by a decode's start or its first flip to decode).
    heartbeat: std::sync::atomic::AtomicBool,
    /// Prefill: the port of its KV transfer listener.
    rank_port: Mutex<Option<u16>>,
    /// Prefill: rooms whose KV is held for a decode.
    rooms: Mutex<HashMap<u64, Held>>,
    /// Prefill: a room was added.
    added: tokio::sync::Notify,
    /// Decode: bootstrap info per `host:port`.
    cache: Mutex<HashMap<String, Route>>,
    /// Prefill: rooms whose request failed here before its KV existed (the decode is told at
    /// once, as SGLang's sender reports a failed request to its receiver).
    aborted: Mutex<std::collections::HashSet<u64>>,
    /// Decode: requests arriving before this wait in the prealloc queue until then
    /// (`POST /sim/stall_transfers`).
    stall_until: Mutex<Option<Instant>>,
    http: reqwest::Client,
}

/// The PD side of one simulated server; cheap to clone.
#[derive(Clone)]
pub struct Pd {
    engine: Engine,
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A failed PD request: HTTP 500 with SGLang's abort message.
pub fn abort(message: &str) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": {"message": message, "code": 500}}))).into_response()
}

impl Pd {
    /// The PD state of a server whose scheduler is `engine`.
    pub fn new(engine: Engine) -> Pd {
        let identity = format!("{:016x}", crate::ids::rand_u128() as u64);
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(2)).build().unwrap_or_else(|_| reqwest::Client::new());
        Pd {
            engine,
            inner: Arc::new(Inner {
                identity: Mutex::new(identity),
                heartbeat: std::sync::atomic::AtomicBool::new(false),
                rank_port: Mutex::new(None),
                rooms: Mutex::new(HashMap::new()),
                added: tokio::sync::Notify::new(),
                cache: Mutex::new(HashMap::new()),
                stall_until: Mutex::new(None),
                aborted: Mutex::new(std::collections::HashSet::new()),
                http,
            }),
        }
    }

    fn cfg(&self) -> &SimConfig {
        self.engine.config()
    }

    /// Prefill: start the bootstrap server (`/health` "OK", `/route`), as SGLang does in the
    /// tokenizer manager's init — before the weights load: until the scheduler registers
    /// ([`Pd::serve_transfer`]) `/route` answers 503 (`disaggregation/common/conn.py`).
    pub async fn start_bootstrap(&self) -> Result<(), String> {
        let cfg = self.cfg();
        let boot = tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.bootstrap_port))
            .await
            .map_err(|e| format!("bootstrap server cannot bind {}:{}: {e}", cfg.host, cfg.bootstrap_port))?;
        let r = Router::new().route("/health", get(|| async { "OK" })).route("/route", get(route).put(|| async { "OK" })).with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(boot, r).await;
        });
        log::line(&format!("Disaggregation bootstrap server started at {}:{}", cfg.host, cfg.bootstrap_port));
        Ok(())
    }

    /// Prefill: the scheduler registers with the bootstrap server: the KV transfer listener on an
    /// ephemeral port (new at every start, as the per-rank ports are).
    pub async fn serve_transfer(&self) -> Result<(), String> {
        let cfg = self.cfg();
        let transfer = tokio::net::TcpListener::bind((cfg.host.as_str(), 0)).await.map_err(|e| format!("cannot bind the KV transfer port: {e}"))?;
        let port = transfer.local_addr().map_err(|e| e.to_string())?.port();
        let t = Router::new().route("/kv/{room}", post(fetch)).with_state(self.clone());
        tokio::spawn(async move {
            let _ = axum::serve(transfer, t).await;
        });
        *lock(&self.inner.rank_port) = Some(port);
        log::line(&format!("Prefill scheduler registered with the bootstrap server (KV transfer rank port {port})"));
        Ok(())
    }

    /// `/pd_role_switch` on an idle instance (0.5.23 `disaggregation/role_switch.py`
    /// `teardown_disaggregation`): the old role's transfer structures released — a prefill's
    /// registration (its `/route` answers 503 until a rebuild as prefill registers again), a
    /// decode's cached bootstrap info (`CommonKVReceiver.close_all_sockets`). The bootstrap
    /// server itself stays.
    pub fn teardown(&self) {
        *lock(&self.inner.rank_port) = None;
        lock(&self.inner.cache).clear();
        lock(&self.inner.aborted).clear();
    }

    /// `/pd_role_switch`'s rebuild as `mode`: a prefill registers a new generation (new rank
    /// ports, as a new KV manager has: a decode's cached info for this address goes stale); a
    /// decode's heartbeat runs.
    pub async fn rebuild(&self, mode: crate::args::Mode) -> Result<(), String> {
        match mode {
            crate::args::Mode::Prefill => {
                *lock(&self.inner.identity) = format!("{:016x}", crate::ids::rand_u128() as u64);
                self.serve_transfer().await
            }
            crate::args::Mode::Decode => {
                self.start_heartbeat();
                Ok(())
            }
            crate::args::Mode::Null => Ok(()),
        }
    }

    /// Prefill: release every held room (`/abort_request {"abort_all": true}`): each one's
    /// request ends with `why`.
    pub fn release_all(&self, why: &str) {
        let held: Vec<Held> = lock(&self.inner.rooms).drain().map(|(_, h)| h).collect();
        for mut h in held {
            if let Some(t) = h.ticket.take() {
                self.engine.release_room(t);
            }
            if let Some(tx) = h.done.take() {
                let _ = tx.send(Handoff::Rejected(why.to_string()));
            }
        }
    }

    /// Prefill: the rooms held for request `rid` released, their requests failed with `why`, as
    /// 0.5.23's `Scheduler.abort_request` does for a rid in its bootstrap or inflight queue
    /// (`disagg_kv_sender.abort()`, `managers/scheduler.py`). Returns how many.
    pub fn release_rid(&self, rid: &str, why: &str) -> usize {
        let held: Vec<Held> = {
            let mut rooms = lock(&self.inner.rooms);
            let keys: Vec<u64> = rooms.iter().filter(|(_, h)| h.rid == rid).map(|(k, _)| *k).collect();
            keys.iter().filter_map(|k| rooms.remove(k)).collect()
        };
        let n = held.len();
        for mut h in held {
            if let Some(t) = h.ticket.take() {
                self.engine.release_room(t);
            }
            if let Some(tx) = h.done.take() {
                let _ = tx.send(Handoff::Rejected(why.to_string()));
            }
        }
        n
    }

    /// Prefill: the prefill batch of a PD request is done; hold its KV for the decode until it
    /// fetches the room or the bootstrap timeout passes. Returns the abort message on failure.
    pub async fn hold(&self, rid: &str, b: &Bootstrap, ticket: Ticket) -> Result<(), String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let computed = (self.engine.weights().identity(), self.engine.retractions());
        self.engine.hold_room(&ticket);
        lock(&self.inner.rooms).insert(b.room, Held { rid: rid.to_string(), ticket: Some(ticket), done: Some(tx), computed });
        self.inner.added.notify_waiters();
        // The scheduler owns the room, not the HTTP request: a client that goes away does not
        // release it; the hand-off or the bootstrap timeout does.
        let (res_tx, res_rx) = tokio::sync::oneshot::channel();
        let (me, rid, b) = (self.clone(), rid.to_string(), b.clone());
        tokio::spawn(async move {
            let _ = res_tx.send(me.await_handoff(rx, &rid, &b).await);
        });
        res_rx.await.unwrap_or_else(|_| Err("the scheduler dropped the request".into()))
    }

    async fn await_handoff(&self, rx: tokio::sync::oneshot::Receiver<Handoff>, rid: &str, b: &Bootstrap) -> Result<(), String> {
        let timeout = self.cfg().bootstrap_timeout;
        let r = tokio::time::timeout(timeout, rx).await;
        let outcome = match r {
            Ok(Ok(Handoff::Fetched)) => Ok(()),
            Ok(Ok(Handoff::Rejected(why))) => Err(format!(
                "Prefill transfer failed for request rank=0 req.rid='{rid}' req.bootstrap_room={} with exception KVTransferError(bootstrap_room={}): {why}",
                b.room, b.room
            )),
            _ => Err(format!(
                "Prefill transfer failed for request rank=0 req.rid='{rid}' req.bootstrap_room={} with exception KVTransferError(bootstrap_room={}): Request {} timed out after {:.1}s in KVPoll.Bootstrapping",
                b.room,
                b.room,
                b.room,
                timeout.as_secs_f64()
            )),
        };
        // On a timeout the room is still there: release it now.
        if let Some(mut h) = lock(&self.inner.rooms).remove(&b.room) {
            if let Some(t) = h.ticket.take() {
                self.engine.release_room(t);
            }
        }
        if let Err(e) = &outcome {
            log::line(e);
        }
        outcome
    }

    /// Prefill: the request of `room` failed here; its decode's fetch fails at once.
    pub fn abort_room(&self, room: u64) {
        lock(&self.inner.aborted).insert(room);
        self.inner.added.notify_waiters();
    }
}

/// `GET /route` on the prefill's bootstrap server: this process's rank info.
async fn route(State(pd): State<Pd>) -> Response {
    let cfg = pd.cfg();
    let Some(port) = *lock(&pd.inner.rank_port) else {
        return (StatusCode::SERVICE_UNAVAILABLE, "Prefill server not registered yet").into_response();
    };
    axum::Json(json!({
        "rank_ip": cfg.host,
        "rank_port": port,
        "identity": lock(&pd.inner.identity).clone(),
        "tp_size": cfg.tp_size,
        "dp_size": if cfg.dp_size == 1 { u64::from(cfg.attn_dp_size) } else { cfg.dp_size },
        "page_size": cfg.page_size,
        "kv_cache_dtype": cfg.resolved_kv_cache_dtype(),
        "prefill_http_port": cfg.port,
    }))
    .into_response()
}

/// `POST /kv/{room}` on the prefill's transfer port: the decode fetches a room (waiting for it to
/// be prefilled, up to the bootstrap timeout).
async fn fetch(State(pd): State<Pd>, Path(room): Path<u64>, axum::Json(body): axum::Json<Value>) -> Response {
    let identity = lock(&pd.inner.identity).clone();
    if pd.engine.mode() != crate::args::Mode::Prefill || body.get("identity").and_then(Value::as_str) != Some(identity.as_str()) {
        // Metadata of another process of this prefill: nothing here knows that registration.
        return (StatusCode::GONE, "unknown prefill generation").into_response();
    }
    let cfg = pd.cfg();
    let deadline = Instant::now() + cfg.bootstrap_timeout;
    loop {
        let added = pd.inner.added.notified();
        let present = lock(&pd.inner.rooms).contains_key(&room);
        if present {
            break;
        }
        if lock(&pd.inner.aborted).remove(&room) {
            return (StatusCode::CONFLICT, "the prefill aborted the request").into_response();
        }
        if tokio::time::timeout_at(deadline.into(), added).await.is_err() {
            return (StatusCode::NOT_FOUND, "room not prefilled in time").into_response();
        }
    }
    // A paused prefill's scheduler sends nothing: the hand-off waits for the continue (after a
    // `retract` pause the room is recomputed then, with the weights served from then on).
    pd.engine.wait_unpaused().await;
    // The prefill does not compare settings: the decode does, on first contact (`receive`).
    let (held, computed) = {
        let mut rooms = lock(&pd.inner.rooms);
        let h = rooms.get_mut(&room);
        let computed = h.as_ref().map(|h| h.computed.clone());
        (h.and_then(|h| h.done.take()), computed)
    };
    if let Some(tx) = held {
        let _ = tx.send(Handoff::Fetched);
    }
    // Retracted while held: recomputed at the continue, with the weights served since.
    let version = match computed {
        Some((v, at)) if at == pd.engine.retractions() => v,
        _ => pd.engine.weights().identity(),
    };
    // Simulator-only: which model computed the KV (no SGLang hand-off says so).
    axum::Json(json!({"room": room, "model": version})).into_response()
}
