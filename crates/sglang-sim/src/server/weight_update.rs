//! Weights without a restart, as SGLang 0.5.23 serves them (`entrypoints/http_server.py`
//! `/update_weights_from_disk`, `/pause_generation`, `/continue_generation`;
//! `managers/tokenizer_manager.py`): a request waits at its admission while the server is paused
//! (`is_pause_cond`), then holds the read side of `model_update_lock` for its whole life; a
//! weight update while not paused takes the write side — it waits for every request in flight
//! (a PD prefill's until its KV was fetched) and new ones wait behind it. `/ready` answers 503
//! while paused. Pause modes: `abort` aborts what is in flight (and waits until none is left),
//! `in_place` stops it where it is, `retract` stops it and recomputes its KV at the continue
//! (with the weights served then). On success the model path, the served model name (0.5.23's
//! `_update_model_path_info` sets it to the path) and, when given, the weight version change.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{App, Tracked};
use crate::log;

/// The pause and the model lock of one server.
#[derive(Clone)]
pub(crate) struct Control {
    /// `Some(mode)` while paused (the engine's: a paused prefill sends no KV either).
    paused: Arc<tokio::sync::watch::Sender<Option<String>>>,
    /// `model_update_lock`.
    model: Arc<tokio::sync::RwLock<()>>,
}

impl Control {
    /// The control of the server whose scheduler is `engine`.
    pub(crate) fn new(engine: &crate::engine::Engine) -> Control {
        Control { paused: engine.pause().clone(), model: Arc::new(tokio::sync::RwLock::new(())) }
    }

    /// Paused now (`/ready` is 503).
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.borrow().is_some()
    }

    /// A request's admission: wait while paused, then hold the model lock's read side (in
    /// `t`, until the request ends).
    pub(crate) async fn admit(&self, t: &mut Tracked) {
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(Option::is_none).await;
        t.model = Some(self.model.clone().read_owned().await);
    }

    /// A request in flight stops here while paused in place or retracted; the mode of the pause
    /// it waited out, if any.
    pub(crate) async fn hold_while_paused(&self) -> Option<String> {
        let mode = self.paused.borrow().clone()?;
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(Option::is_none).await;
        Some(mode)
    }
}

/// The JSON object of a request (empty: `{}`); `Err`: why not (FastAPI answers 422).
pub(crate) fn body_of(body: &Bytes) -> Result<Value, String> {
    let v: Value = if body.is_empty() { json!({}) } else { serde_json::from_slice(body).map_err(|e| e.to_string())? };
    if v.is_object() {
        Ok(v)
    } else {
        Err("the body must be a JSON object".into())
    }
}

pub(crate) fn unprocessable(why: String) -> Response {
    (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(json!({"detail": [{"type": "json_invalid", "loc": ["body"], "msg": why}]}))).into_response()
}

/// `POST /pause_generation {"mode": "abort"|"in_place"|"retract"}` (default `abort`).
pub(crate) async fn pause_generation(State(app): State<App>, body: Bytes) -> Response {
    let v = match body_of(&body) {
        Ok(v) => v,
        Err(why) => return unprocessable(why),
    };
    let mode = v.get("mode").and_then(Value::as_str).unwrap_or("abort").to_string();
    if !matches!(mode.as_str(), "abort" | "in_place" | "retract") {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"detail": [{"type": "literal_error", "loc": ["body", "mode"], "msg": "Input should be 'abort', 'retract' or 'in_place'"}]})),
        )
            .into_response();
    }
    app.control.paused.send_replace(Some(mode.clone()));
    if mode == "abort" {
        // As the tokenizer manager does: abort everything until no request holds the model lock.
        loop {
            app.requests.abort(None);
            if app.control.model.try_write().is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    log::line(&format!("Generation paused (mode={mode})."));
    axum::Json(json!({"message": "Generation paused successfully.", "status": "ok"})).into_response()
}

/// `POST /continue_generation`.
pub(crate) async fn continue_generation(State(app): State<App>, body: Bytes) -> Response {
    if let Err(why) = body_of(&body) {
        return unprocessable(why);
    }
    // The retraction is counted before anything waiting on the pause wakes: a hand-off or a
    // decode step woken by the continue must already see its KV as recomputed (counted after,
    // a woken one could read the old count and pass old-weights KV on: a fleet test behind one
    // gateway saw one such request counted mixed).
    if app.control.paused.borrow().as_deref() == Some("retract") {
        app.engine.count_retraction();
    }
    app.control.paused.send_replace(None);
    log::line("Generation continued.");
    axum::Json(json!({"message": "Generation continued successfully.", "status": "ok"})).into_response()
}

/// `POST /update_weights_from_disk {"model_path", "weight_version"?, "abort_all_requests"?, ...}`.
pub(crate) async fn update_weights_from_disk(State(app): State<App>, body: Bytes) -> Response {
    let v = match body_of(&body) {
        Ok(v) => v,
        Err(why) => return unprocessable(why),
    };
    let Some(path) = v.get("model_path").and_then(Value::as_str).map(String::from) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"detail": [{"type": "missing", "loc": ["body", "model_path"], "msg": "Field required"}]})),
        )
            .into_response();
    };
    let version = v.get("weight_version").and_then(Value::as_str).map(String::from);
    let format = v.get("load_format").and_then(Value::as_str).unwrap_or("auto").to_string();
    log::line(&format!("Start update_weights. Load format={format}"));
    if v.get("abort_all_requests").and_then(Value::as_bool).unwrap_or(false) {
        app.requests.abort(None);
    }
    let flush = v.get("flush_cache").and_then(Value::as_bool).unwrap_or(true);
    // Not paused: wait for every request in flight, and hold new ones meanwhile (measured on the
    // real server: the update's load starts once the request in flight has answered).
    let _exclusive = if app.control.is_paused() { None } else { Some(app.control.model.clone().write_owned().await) };
    let sim = &app.engine.config().sim;
    tokio::time::sleep(sim.weights_load).await;
    // The flush after the load (default on) is refused when the scheduler is busy then: while
    // paused in place, on a decode with retracted requests, with rooms in a PD queue or a
    // deferred KV release (`Engine::busy`). A request held at its admission by a pause has not
    // reached the scheduler: not busy.
    let busy = app.engine.busy();
    if sim.weights_fail {
        let message = format!("Failed to get weights iterator: {path} (simulated: --sim-weights-fail). Rollback to the old model weights.");
        log::line(&message);
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"success": false, "message": message, "num_paused_requests": 0}))).into_response();
    }
    if flush && busy {
        // 0.5.23 `weight_updater.py`: the weights changed, the update call fails, and
        // `/model_info` moves only on success.
        app.engine.load_weights_unreported(&path, version.as_deref());
        let message =
            "Weights were updated, but the cache was not flushed because requests are still running or queued. Retract or finish them, then call /flush_cache.";
        log::line(message);
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"success": false, "message": message, "num_paused_requests": 0}))).into_response();
    }
    app.engine.load_weights(&path, version.as_deref());
    let mut message = "Succeeded to update model weights.".to_string();
    if let Some(ver) = &version {
        message += &format!(" Weight version updated to {ver}.");
    }
    log::line(&format!("Update weights end. model_path={path} weight_version={}", app.engine.weights().version));
    axum::Json(json!({"success": true, "message": message, "num_paused_requests": 0})).into_response()
}
