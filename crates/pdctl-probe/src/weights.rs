//! Weights without a restart, over SGLang's HTTP API (0.5.23, `entrypoints/http_server.py`):
//! `GET /model_info` (`model_path`, `weight_version`), `POST /pause_generation {"mode"}`,
//! `POST /continue_generation`, `POST /update_weights_from_disk {"model_path", "weight_version"}`
//! → `{"success", "message", "num_paused_requests"}` (400 with `success: false` when the load
//! failed; the old weights stay).

use std::time::Duration;

use serde_json::{json, Value};

use crate::{snippet, Http, HttpError};

/// What a worker serves, from its `/model_info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// `model_path`.
    pub model_path: String,
    /// `weight_version` (`default` unless set).
    pub weight_version: String,
}

/// A worker's `/model_info`.
pub async fn model_info(http: &Http, url: &str) -> Result<ModelInfo, HttpError> {
    let u = format!("{}/model_info", url.trim_end_matches('/'));
    let v = http.get_json(&u).await?;
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(String::from);
    match (s("model_path"), s("weight_version")) {
        (Some(model_path), Some(weight_version)) => Ok(ModelInfo { model_path, weight_version }),
        _ => Err(HttpError::Status { url: u, status: 200, body: format!("no model_path and weight_version in {}", snippet(&v.to_string())) }),
    }
}

async fn post_ok(http: &Http, url: &str, path: &str, body: &Value, limit: Duration) -> Result<String, HttpError> {
    let u = format!("{}{path}", url.trim_end_matches('/'));
    let (status, text) = http.post_json_within(&u, body, limit).await?;
    if status == 200 {
        Ok(text)
    } else {
        Err(HttpError::Status { url: u, status, body: snippet(&text) })
    }
}

/// `POST /pause_generation {"mode": mode}`: new requests wait at their admission; `retract`
/// stops the ones in flight and rebuilds their KV under the weights served at the continue (a
/// decode asks its prefill to recompute it, through the prefill's `/generate`); `in_place`
/// stops them where they are.
pub async fn pause(http: &Http, url: &str, mode: &str, limit: Duration) -> Result<(), HttpError> {
    post_ok(http, url, "/pause_generation", &json!({ "mode": mode }), limit).await.map(|_| ())
}

/// `POST /continue_generation`.
pub async fn resume(http: &Http, url: &str, limit: Duration) -> Result<(), HttpError> {
    post_ok(http, url, "/continue_generation", &json!({}), limit).await.map(|_| ())
}

/// `POST /update_weights_from_disk` with `flush_cache: false`: `Ok(message)` when the server
/// says `success`; a refused load is `HttpError::Status` with the server's message.
///
/// Why not the default flush: 0.5.23 flushes the cache after loading and, when the scheduler is
/// busy then, refuses the flush and fails the call *after* the weights changed, while
/// `/model_info` keeps the old path (`managers/scheduler_components/weight_updater.py`). Busy,
/// measured on the real server: paused `in_place` with a request in flight, or a PD queue
/// holding a room (`scheduler.py` `is_fully_idle`; a `retract` pause's requests do not count, and
/// without a pause the update first waits for every request in flight). The cache is flushed by
/// [`flush_cache`] instead.
pub async fn update_weights(http: &Http, url: &str, model_path: &str, version: Option<&str>, limit: Duration) -> Result<String, HttpError> {
    let mut body = json!({ "model_path": model_path, "flush_cache": false });
    if let Some(v) = version {
        body["weight_version"] = json!(v);
    }
    let u = format!("{}/update_weights_from_disk", url.trim_end_matches('/'));
    let (status, text) = http.post_json_within(&u, &body, limit).await?;
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let message = v.get("message").and_then(Value::as_str).unwrap_or("").to_string();
    match (status, v.get("success").and_then(Value::as_bool)) {
        (200, Some(true)) => Ok(message),
        _ => Err(HttpError::Status { url: u, status, body: if message.is_empty() { snippet(&text) } else { message } }),
    }
}

/// `POST /flush_cache`: `Ok(true)` flushed (200), `Ok(false)` refused because requests are still
/// running or waiting (400, 0.5.23 `scheduler.py` `flush_cache` / `is_fully_idle`).
pub async fn flush_cache(http: &Http, url: &str, limit: Duration) -> Result<bool, HttpError> {
    let u = format!("{}/flush_cache", url.trim_end_matches('/'));
    let (status, text) = http.post_json_within(&u, &json!({}), limit).await?;
    match status {
        200 => Ok(true),
        400 => Ok(false),
        _ => Err(HttpError::Status { url: u, status, body: snippet(&text) }),
    }
}
