//! `POST /pd_role_switch` as SGLang 0.5.23 serves it (`entrypoints/http_server.py`,
//! `managers/tokenizer_control_mixin.py` `pd_role_switch`, `disaggregation/role_switch.py`): a
//! running PD server flips between prefill and decode without a restart, when started with
//! `--enable-pd-role-switch`. The preconditions are checked in the wheel's order and answered with
//! its messages; the answer is `{success, message, old_role, new_role, safe_to_restore}`, 200 on
//! success and 400 otherwise. A rebuild that fails after the teardown leaves the instance
//! unhealthy ("restart required"); the simulator then fails `/health` and generation too (the real
//! scheduler's old-role loop runs on torn-down queues), which no test of the real server can
//! provoke.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{fill, App};
use crate::args::Mode;
use crate::log;

// The answers' messages, `{}` where 0.5.23 puts a value (`role_switch.py`, the tokenizer's
// `pd_role_switch` for the first); checked against the wheel by the conformance test.

/// The server was started without `--enable-pd-role-switch`.
pub const NOT_ENABLED: &str = "--enable-pd-role-switch is not set on this server";
/// A rebuild failed before: only a restart helps.
pub const UNHEALTHY: &str = "instance is unhealthy after a failed role switch; restart required";
/// Another switch runs.
pub const IN_PROGRESS: &str = "another role switch is already in progress";
/// The new role is neither `prefill` nor `decode`.
pub const INVALID_ROLE: &str = "invalid new_role={}";
/// A plain (not disaggregated) server.
pub const NOT_PD: &str = "instance is not running in PD disaggregation mode";
/// The transfer backend cannot switch.
pub const BACKEND: &str = "transfer backend {} does not support runtime role switch";
/// The server already runs the new role (a success).
pub const ALREADY: &str = "already in target role";
/// Requests are still in flight, queued or held for a decode.
pub const NOT_IDLE: &str = "instance is not idle; drain all requests before switching";
/// A flip to decode that will capture CUDA graphs was not told their footprint.
pub const GRAPH_MEMORY_REQUIRED: &str = "decode_cuda_graph_memory_gb is required before capturing decode graphs";
/// The footprint given is negative.
pub const GRAPH_MEMORY_NEGATIVE: &str = "decode_cuda_graph_memory_gb must be non-negative";
/// Less memory is free than the graphs' footprint.
pub const GRAPH_HEADROOM: &str = "insufficient decode CUDA graph headroom: required={} GB, available={} GB";
/// The rebuild failed after the teardown: the instance is unhealthy.
pub const REBUILD_FAILED: &str = "role switch failed; instance unhealthy, restart required: {}";

/// The messages by the key the conformance catalogue files them under.
pub const MESSAGES: &[(&str, &str)] = &[
    ("role_switch_not_enabled", NOT_ENABLED),
    ("role_switch_unhealthy", UNHEALTHY),
    ("role_switch_in_progress", IN_PROGRESS),
    ("role_switch_invalid_role", INVALID_ROLE),
    ("role_switch_not_pd", NOT_PD),
    ("role_switch_backend", BACKEND),
    ("role_switch_already", ALREADY),
    ("role_switch_not_idle", NOT_IDLE),
    ("role_switch_graph_memory_required", GRAPH_MEMORY_REQUIRED),
    ("role_switch_graph_memory_negative", GRAPH_MEMORY_NEGATIVE),
    ("role_switch_graph_headroom", GRAPH_HEADROOM),
    ("role_switch_rebuild_failed", REBUILD_FAILED),
];

/// The switch's state on one server.
#[derive(Clone, Default)]
pub(crate) struct RoleSwitch {
    /// `_pd_role_switch_in_progress`.
    in_progress: Arc<AtomicBool>,
    /// `_pd_role_switch_unhealthy`: a rebuild failed; every later switch is refused.
    unhealthy: Arc<AtomicBool>,
}

impl RoleSwitch {
    /// A rebuild failed: `/health` and generation fail until the server restarts.
    pub(crate) fn broken(&self) -> bool {
        self.unhealthy.load(Ordering::SeqCst)
    }
}

/// The request body (`PdRoleSwitchReqInput`, `managers/io_struct.py`).
struct Ask {
    new_role: String,
    decode_cuda_graph_memory_gb: Option<f64>,
    prepare_only: bool,
}

impl Ask {
    /// The fields of a JSON object, typed as msgspec decodes them; `Err`: why not (400).
    fn of(v: &Value) -> Result<Ask, String> {
        let new_role = match v.get("new_role") {
            None => String::new(),
            Some(Value::String(r)) if matches!(r.as_str(), "prefill" | "decode" | "") => r.clone(),
            Some(other) => return Err(format!("Expected `'prefill' | 'decode' | ''`, got `{other}` - at `$.new_role`")),
        };
        let decode_cuda_graph_memory_gb = match v.get("decode_cuda_graph_memory_gb") {
            None | Some(Value::Null) => None,
            Some(x) => Some(x.as_f64().ok_or_else(|| format!("Expected `float | null`, got `{x}` - at `$.decode_cuda_graph_memory_gb`"))?),
        };
        let prepare_only = match v.get("prepare_only") {
            None => false,
            Some(x) => x.as_bool().ok_or_else(|| format!("Expected `bool`, got `{x}` - at `$.prepare_only`"))?,
        };
        Ok(Ask { new_role, decode_cuda_graph_memory_gb, prepare_only })
    }
}

/// The answer (`PdRoleSwitchReqOutput`).
struct Answer {
    success: bool,
    message: String,
    old_role: String,
    new_role: String,
    safe_to_restore: bool,
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let status = if self.success { StatusCode::OK } else { StatusCode::BAD_REQUEST };
        let body = json!({
            "success": self.success, "message": self.message, "old_role": self.old_role,
            "new_role": self.new_role, "safe_to_restore": self.safe_to_restore,
        });
        (status, axum::Json(body)).into_response()
    }
}

/// `POST /pd_role_switch`.
pub(crate) async fn pd_role_switch(State(app): State<App>, body: Bytes) -> Response {
    let ask = match super::weight_update::body_of(&body).and_then(|v| Ask::of(&v)) {
        Ok(a) => a,
        Err(why) => return invalid_body(why),
    };
    switch(&app, &ask).await.into_response()
}

/// The backends whose KV manager declares `supports_role_switch` (mooncake, mori).
/// A body that does not decode: 0.5.23's `RequestValidationError` handler answers 400 with its
/// `ErrorResponse` (`entrypoints/http_server.py`, "Override FastAPI's default 422 validation error
/// with 400"), as the differential test measured on the real server.
fn invalid_body(why: String) -> Response {
    let body = json!({"object": "error", "message": why, "type": "Bad Request", "param": null, "code": 400});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

fn backend_supports(backend: &str) -> bool {
    matches!(backend, "mooncake" | "mori")
}

/// Why the switch is refused before anything is torn down, as `_reject_reason` orders it; with
/// whether routing may be restored.
fn rejection(app: &App, new_role: &str) -> Option<(String, bool)> {
    let cfg = app.engine.config();
    let s = &app.role_switch;
    if s.unhealthy.load(Ordering::SeqCst) {
        return Some((UNHEALTHY.into(), false));
    }
    if s.in_progress.load(Ordering::SeqCst) {
        return Some((IN_PROGRESS.into(), false));
    }
    if !matches!(new_role, "prefill" | "decode") {
        return Some((fill(INVALID_ROLE, &[format!("'{new_role}'")]), true));
    }
    if app.engine.mode() == Mode::Null {
        return Some((NOT_PD.into(), true));
    }
    if !backend_supports(&cfg.transfer_backend) {
        return Some((fill(BACKEND, &[format!("'{}'", cfg.transfer_backend)]), true));
    }
    None
}

/// `scheduler.is_fully_idle()`: nothing in flight, queued or held for a decode.
fn idle(app: &App) -> bool {
    app.requests.rids().is_empty() && !app.engine.busy()
}

/// The decode CUDA graph check of a flip to decode; `Err`: why not.
fn headroom(app: &App, ask: &Ask) -> Result<(), String> {
    if ask.new_role != "decode" || app.engine.decode_graphs() {
        return Ok(());
    }
    let Some(required) = ask.decode_cuda_graph_memory_gb else {
        return Err(GRAPH_MEMORY_REQUIRED.into());
    };
    if required < 0.0 {
        return Err(GRAPH_MEMORY_NEGATIVE.into());
    }
    let available = app.engine.config().sim.free_memory_gb;
    if available < required {
        return Err(fill(GRAPH_HEADROOM, &[format!("{required:.3}"), format!("{available:.3}")]));
    }
    Ok(())
}

async fn switch(app: &App, ask: &Ask) -> Answer {
    let cfg = app.engine.config();
    let old_role = app.engine.mode().as_str().to_string();
    let answer = |success: bool, message: String, safe_to_restore: bool| Answer {
        success,
        message,
        old_role: old_role.clone(),
        new_role: ask.new_role.clone(),
        safe_to_restore,
    };
    let fail = |message: String, safe: bool| {
        log::line(&format!("PD role switch rejected ({old_role} -> {}): {message}", ask.new_role));
        answer(false, message, safe)
    };
    if !cfg.enable_pd_role_switch {
        return answer(false, NOT_ENABLED.into(), true);
    }
    if let Some((why, safe)) = rejection(app, &ask.new_role) {
        return fail(why, safe);
    }
    if ask.new_role == old_role {
        return answer(true, ALREADY.into(), false);
    }
    if !idle(app) {
        return fail(NOT_IDLE.into(), true);
    }
    if let Err(why) = headroom(app, ask) {
        return fail(why, true);
    }
    if ask.prepare_only {
        return answer(true, "ready".into(), true);
    }
    let new_mode = if ask.new_role == "prefill" { Mode::Prefill } else { Mode::Decode };
    let s = &app.role_switch;
    s.in_progress.store(true, Ordering::SeqCst);
    app.pd.teardown();
    tokio::time::sleep(cfg.sim.role_switch).await;
    let rebuilt = if cfg.sim.role_switch_fail { Err("simulated rebuild failure (--sim-role-switch-fail)".to_string()) } else { app.pd.rebuild(new_mode).await };
    let out = match rebuilt {
        Err(e) => {
            s.unhealthy.store(true, Ordering::SeqCst);
            log::line(&format!("PD role switch ({old_role} -> {}) failed during teardown/rebuild; instance unhealthy: {e}", ask.new_role));
            fail(fill(REBUILD_FAILED, &[e]), false)
        }
        Ok(()) => {
            app.engine.set_mode(new_mode);
            if new_mode == Mode::Decode && !cfg.disable_cuda_graph {
                app.engine.set_decode_graphs();
            }
            log::line(&format!("PD role switch succeeded: {old_role} -> {}", ask.new_role));
            log::line(&format!("Re-dispatching event loop after PD role switch -> {}", ask.new_role));
            answer(true, "ok".into(), false)
        }
    };
    s.in_progress.store(false, Ordering::SeqCst);
    out
}
