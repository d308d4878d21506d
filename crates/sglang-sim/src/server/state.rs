//! The shared state of one simulated server (the engine, PD pairing, the requests in flight, the
//! drain) and the helpers every endpoint uses; SGLang's lines and timings it reproduces.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::pd::Pd;

use super::weight_update;

/// SGLang's ready line.
pub const READY_LINE: &str = "The server is fired up and ready to roll!";

#[derive(Clone)]
pub(crate) struct App {
    pub(crate) engine: Engine,
    /// PD pairing (bootstrap server, KV hand-off, the decode's cache).
    pub(crate) pd: Pd,
    pub(crate) ready_at: Arc<std::sync::OnceLock<Instant>>,
    /// Fault injected at run time (`POST /sim/fail_generate?secs=N`): generation requests
    /// answer 500 until then.
    pub(crate) fail_until: Arc<std::sync::Mutex<Option<Instant>>>,
    /// `POST /sim/faults_now`: the service faults act from now on, whatever `--sim-faults-after`
    /// says (a test sets the moment a late fault begins by an event, not by a clock).
    pub(crate) faults_now: Arc<std::sync::atomic::AtomicBool>,
    /// The requests in flight (the tokenizer manager's `rid_to_state`).
    pub(crate) requests: Requests,
    /// SIGTERM received (`gracefully_exit`): `/health` and `/ready` answer 503.
    pub(crate) shutting_down: Arc<std::sync::atomic::AtomicBool>,
    /// The pause and the model lock (weights without a restart).
    pub(crate) control: weight_update::Control,
    /// A `/health` timed out (0.5.23 `http_server.py` `health_generate`: no answer from the
    /// scheduler within `SGLANG_HEALTH_CHECK_TIMEOUT`, as behind a long pause): the server is
    /// UnHealthy — `/ready` 503, a SIGTERM force-exits — until a later `/health` succeeds.
    pub(crate) health_failed: Arc<std::sync::atomic::AtomicBool>,
    /// `/pd_role_switch`'s state.
    pub(crate) role_switch: super::role_switch::RoleSwitch,
}

impl App {
    /// The service faults (`--sim-slowdown`, `--sim-fail-fraction`) act: from the ready line
    /// plus `--sim-faults-after` on (a change that started fine), or from `/sim/faults_now` on.
    pub(crate) fn service_faults_on(&self) -> bool {
        self.faults_now.load(std::sync::atomic::Ordering::SeqCst) || self.ready_at.get().is_some_and(|at| at.elapsed() >= self.engine.config().sim.faults_after)
    }

    /// The `--sim-health-fail-after-ready` fault has set in: the server is UnHealthy.
    pub(crate) fn unhealthy(&self) -> bool {
        self.health_failed.load(std::sync::atomic::Ordering::SeqCst)
            || matches!((self.engine.config().sim.health_fail_after_ready, self.ready_at.get()), (Some(after), Some(at)) if at.elapsed() >= after)
    }
}

/// The requests in flight, as SGLang's tokenizer manager keeps them (`rid_to_state`): what a
/// SIGTERM waits for, what `/abort_request` aborts.
#[derive(Clone, Default)]
pub(crate) struct Requests {
    pub(crate) inner: Arc<std::sync::Mutex<Table>>,
}

/// The last key given, and each request's rid and abort signal by key.
pub(crate) type Table = (u64, std::collections::BTreeMap<u64, (String, tokio::sync::watch::Sender<bool>)>);

/// One request in flight; it leaves the table when dropped.
pub(crate) struct Tracked {
    pub(crate) requests: Requests,
    pub(crate) key: u64,
    pub(crate) aborted: tokio::sync::watch::Receiver<bool>,
    /// The model lock's read side, from its admission on.
    pub(crate) model: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
    /// Decode: the weight version of the KV it received and the retractions then.
    pub(crate) kv: Option<(String, u64)>,
    /// Decode: the bootstrap of its KV (a `retract` pause rebootstraps it there).
    pub(crate) bootstrap: Option<crate::pd::Bootstrap>,
}

impl Requests {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn track(&self, rid: &str) -> Tracked {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut g = self.lock();
        g.0 += 1;
        let key = g.0;
        g.1.insert(key, (rid.to_string(), tx));
        Tracked { requests: self.clone(), key, aborted: rx, model: None, kv: None, bootstrap: None }
    }

    /// The rids in flight.
    pub(crate) fn rids(&self) -> Vec<String> {
        self.lock().1.values().map(|(rid, _)| rid.clone()).collect()
    }

    /// Abort every request (`rid: None`) or those with this rid; returns how many.
    pub(crate) fn abort(&self, rid: Option<&str>) -> usize {
        let g = self.lock();
        let mut n = 0;
        for (r, tx) in g.1.values() {
            if rid.is_none_or(|want| want == r) {
                let _ = tx.send(true);
                n += 1;
            }
        }
        n
    }
}

impl Tracked {
    /// Resolves when this request is aborted (never otherwise).
    pub(crate) async fn aborted(&mut self) {
        if self.aborted.wait_for(|a| *a).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.requests.lock().1.remove(&self.key);
    }
}

/// The message of a request aborted by `/abort_request`.
pub(crate) const ABORTED: &str = "Abort request by the client (POST /abort_request).";

/// SGLang's shutdown lines (`managers/tokenizer_manager.py`, 0.5.23), `{}` where it prints a
/// value; checked against the wheel by the conformance test.
pub const SIGTERM_LINE: &str = "SIGTERM received. signum={} frame={}. Draining requests and shutting down...";
/// Logged by the SIGTERM watchdog every 5 s until no request is left.
pub const DRAINING_LINE: &str = "Gracefully exiting... Remaining number of requests {}. Remaining requests remaining_rids={}.";
/// How often the tokenizer manager's `sigterm_watchdog` looks (`asyncio.sleep(5)`).
pub const WATCHDOG_PERIOD: Duration = Duration::from_secs(5);
/// A draining server (SIGTERM received, watchdog not done) takes new requests: 0.5.23's
/// `generate_request` never looks at `gracefully_exit`, and neither does the simulator's
/// `/generate` (only `/health` and `/ready` answer 503 while it drains). Checked against the
/// wheel by the conformance test; the sandbox tests the only worker of a role serving through its
/// drain with it.
pub const SERVES_WHILE_DRAINING: bool = true;

pub(crate) fn fill(template: &str, values: &[String]) -> String {
    let mut out = String::new();
    let mut parts = template.split("{}");
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    for (i, part) in parts.enumerate() {
        out.push_str(values.get(i).map(String::as_str).unwrap_or(""));
        out.push_str(part);
    }
    out
}

pub(crate) fn bad_request(msg: &str) -> Response {
    (StatusCode::BAD_REQUEST, axum::Json(json!({"error": {"message": msg}}))).into_response()
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn approx_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4).max(1)
}

pub(crate) fn parse_body(body: &Bytes) -> Result<Value, String> {
    let v = serde_json::from_slice::<Value>(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    if v.is_object() {
        Ok(v)
    } else {
        Err("the body must be a JSON object".into())
    }
}
