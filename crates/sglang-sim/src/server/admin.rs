//! The state endpoints: health, ready, server and model info, loads, flush, metrics, abort.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::engine::Status;
use crate::log;

use super::{bad_request, parse_body, unix_now, App, ABORTED};

/// `GET /ready` (0.5.23, `entrypoints/http_server.py`): 200 once up, 503 while starting, paused,
/// shutting down or unhealthy (`is_ready`); no generate.
pub(crate) async fn ready(State(app): State<App>) -> Response {
    if app.engine.status() == Status::Starting || app.shutting_down.load(std::sync::atomic::Ordering::SeqCst) || app.unhealthy() || app.control.is_paused() {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

/// `POST /abort_request {"rid": ...}` or `{"abort_all": true}` (`entrypoints/http_server.py`,
/// `AbortReq` in `managers/io_struct.py`): the requests end with an abort; a prefill also
/// releases the rooms it holds for its decode (all of them, or the rid's: the scheduler's abort
/// reaches its bootstrap and inflight queues, whose request's HTTP exchange may be gone).
pub(crate) async fn abort_request(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&e),
    };
    let all = v.get("abort_all").and_then(Value::as_bool).unwrap_or(false);
    let rid = v.get("rid").and_then(Value::as_str);
    if !all && rid.is_none() {
        return StatusCode::OK.into_response();
    }
    let mut n = app.requests.abort(if all { None } else { rid });
    match rid.filter(|_| !all) {
        Some(rid) => n = n.max(app.pd.release_rid(rid, ABORTED)),
        None => app.pd.release_all(ABORTED),
    }
    log::line(&format!("Abort request: abort_all={} rid={} aborted={n}", if all { "True" } else { "False" }, rid.unwrap_or("None")));
    StatusCode::OK.into_response()
}

pub(crate) async fn health(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    if app.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        log::line("Health check request received during shutdown. Returning 503.");
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if cfg.sim.version.health_always_ok() {
        return StatusCode::OK.into_response();
    }
    if app.role_switch.broken() {
        return (StatusCode::SERVICE_UNAVAILABLE, "instance unhealthy after a failed PD role switch (simulated)").into_response();
    }
    if app.engine.status() == Status::Starting {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let fault = matches!((cfg.sim.health_fail_after_ready, app.ready_at.get()), (Some(after), Some(at)) if at.elapsed() >= after);
    if fault {
        tokio::time::sleep(cfg.sim.health_generate).await;
        return (StatusCode::SERVICE_UNAVAILABLE, "Health check failed. (simulated)").into_response();
    }
    let generation = std::env::var("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION").map(|v| !matches!(v.to_lowercase().as_str(), "false" | "0")).unwrap_or(true);
    // Paused: the health request waits at its admission like any other, up to
    // SGLANG_HEALTH_CHECK_TIMEOUT (20 s), then fails.
    if generation && app.control.is_paused() {
        let limit = std::env::var("SGLANG_HEALTH_CHECK_TIMEOUT").ok().and_then(|v| v.parse().ok()).unwrap_or(20u64);
        if tokio::time::timeout(std::time::Duration::from_secs(limit), app.control.hold_while_paused()).await.is_err() {
            log::line(&format!("Health check failed. Server couldn't get a response from detokenizer for last {limit} seconds."));
            app.health_failed.store(true, std::sync::atomic::Ordering::SeqCst);
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    }
    if generation {
        app.engine.health_probe();
        tokio::time::sleep(cfg.sim.health_generate).await;
        // An answer from the scheduler: Up again.
        app.health_failed.store(false, std::sync::atomic::Ordering::SeqCst);
    }
    StatusCode::OK.into_response()
}

/// The tokenizer's path: `--tokenizer-path`, else the model path it follows (0.5.23
/// `server_args.py`).
fn tokenizer_path(cfg: &crate::args::SimConfig) -> String {
    cfg.given.get("--tokenizer-path").cloned().unwrap_or_else(|| cfg.model_path.clone())
}

/// `/server_info`: the startup configuration (0.5.23 builds it from `server_args`: a weight
/// update since is reported by `/model_info` only).
pub(crate) async fn server_info(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    let mut v = json!({
        "model_path": cfg.model_path,
        "tokenizer_path": tokenizer_path(cfg),
        "served_model_name": cfg.served_model_name,
        "weight_version": cfg.weight_version,
        "host": cfg.host,
        "port": cfg.port,
        "tp_size": cfg.tp_size,
        "disaggregation_mode": cfg.mode.as_str(),
        "disaggregation_bootstrap_port": cfg.bootstrap_port,
        "enable_metrics": cfg.enable_metrics,
        "skip_server_warmup": cfg.skip_warmup,
        "context_length": cfg.context_length,
        "page_size": cfg.page_size,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "dp_size": cfg.dp_size,
        "attn_dp_size": cfg.attn_dp_size,
        "enable_dp_attention": cfg.dp_attention,
        "disaggregation_transfer_backend": cfg.transfer_backend,
        "disable_radix_cache": cfg.disable_radix_cache,
        "disaggregation_decode_enable_radix_cache": cfg.decode_radix_cache,
        "load_balance_method": "round_robin",
        // What was asked: the command line without the program (0.5.23 `server_args.py` joins
        // `sys.argv[1:]` with spaces); the other values are resolved.
        "launch_command": cfg.launch.join(" "),
        "status": "ready",
        "max_total_num_tokens": cfg.sim.max_total_tokens,
        "max_req_input_len": cfg.context_length.saturating_sub(8),
        "internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {"token_usage": app.engine.token_usage()}}],
        "version": cfg.sim.version.to_string(),
        "frontend": "python",
        // The model-defining arguments with 0.5.23's defaults (`server_args.py`), reported as
        // given when they are.
        "quantization": null,
        "dtype": "auto",
        "load_format": "auto",
        "revision": null,
    });
    if let Some(obj) = v.as_object_mut() {
        for (k, val) in &cfg.given {
            let key = k.trim_start_matches("--").replace('-', "_");
            match obj.get_mut(&key) {
                Some(v) if v.is_null() || key == "dtype" || key == "load_format" => *v = json!(val),
                Some(_) => {}
                None => {
                    obj.insert(key, json!(val));
                }
            }
        }
    }
    axum::Json(v).into_response()
}

pub(crate) async fn model_info(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    let w = app.engine.weights();
    axum::Json(json!({
        "model_path": w.model_path,
        "tokenizer_path": tokenizer_path(cfg),
        "served_model_name": w.served_model_name,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": w.version,
        // The role in effect (0.5.23 reads it through `config_value`, which a role switch
        // overrides); `/server_info` keeps the startup role.
        "disaggregation_mode": app.engine.mode().as_str(),
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "deepseek_v4",
        "architectures": ["DeepseekV4ForCausalLM"],
        "load_format": load_format_of(cfg),
        "reasoning_parser": null,
        "tool_call_parser": null,
        // A generation model's embedding section, as 0.5.23 reports it (`model_info`).
        "embedding": {"family": "none", "task": "none", "execution": "none", "attention": "none", "pooling": "model_defined",
            "normalize": false, "postprocessor": "none", "tokenizer_special_tokens": "model_default", "supports_dimensions": false,
            "supports_token_embeddings": false, "supports_multimodal": false, "requires_embedding_flag": false,
            "auto_enable_embedding": false, "bcg_eligibility": "disabled", "safe_disable_kv_cache": false,
            "safe_disable_radix_cache": false, "safe_disable_chunked_prefill": false, "enabled": false, "matryoshka_dimensions": [],
            "cache": {"kv_cache_disabled": false, "radix_cache_disabled": false, "chunked_prefill_disabled": false}},
    }))
    .into_response()
}

/// The load format `/model_info` reports: `--load-format` (default `auto`).
fn load_format_of(cfg: &crate::args::SimConfig) -> String {
    cfg.given.get("--load-format").cloned().unwrap_or_else(|| "auto".into())
}

pub(crate) async fn models(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    axum::Json(json!({"object": "list", "data": [{
        "id": cfg.served_model_name, "object": "model", "created": unix_now(), "owned_by": "sglang",
        "root": cfg.served_model_name, "parent": null, "max_model_len": cfg.context_length}]}))
    .into_response()
}

pub(crate) async fn get_load(State(app): State<App>) -> Response {
    // Profiles before 0.5.13 (the last to serve it): held PD rooms are counted with the running
    // requests, as the simulator always did there (not checked against those sources).
    let (running, waiting, used) = app.engine.load();
    axum::Json(json!([{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": 0, "num_tokens": used}])).into_response()
}

/// `GET /v1/loads[?include=core,disagg,queues,…][&dp_rank=N]` as 0.5.23 answers it
/// (`entrypoints/v1_loads.py`, `managers/load_snapshot.py`): one entry per DP rank in `loads`, the
/// core fields always, the `disaggregation` and `queues` sections unless `include` leaves them out
/// (no `include`, or `all`: every section); an unknown section is a 400 naming the valid ones.
pub(crate) async fn v1_loads(State(app): State<App>, axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>) -> Response {
    const VALID: [&str; 7] = ["all", "core", "disagg", "lora", "memory", "queues", "spec"];
    let include: Option<Vec<String>> = q.get("include").filter(|s| !s.is_empty()).map(|s| s.split(',').map(|p| p.trim().to_string()).collect());
    if let Some(bad) = include.as_ref().map(|l| l.iter().filter(|p| !VALID.contains(&p.as_str())).cloned().collect::<Vec<_>>()).filter(|b| !b.is_empty()) {
        let detail =
            format!("Invalid include sections: {{{}}}. Valid options: {:?}", bad.iter().map(|b| format!("'{b}'")).collect::<Vec<_>>().join(", "), VALID);
        return (StatusCode::BAD_REQUEST, axum::Json(json!({ "detail": detail }))).into_response();
    }
    let wants = |section: &str| include.as_ref().is_none_or(|l| l.iter().any(|p| p == section || p == "all"));
    let (running, waiting, used) = app.engine.load();
    let (bootstrap, prealloc) = app.engine.pd_queue_sizes();
    let cfg = app.engine.config();
    let max = cfg.sim.max_total_tokens;
    let usage = if max > 0 { used as f64 / max as f64 } else { 0.0 };
    // The core fields as 0.5.23 names them (`managers/load_snapshot.py`); the simulator has no
    // figures for the scheduler's busy time and decode moments: zeros of the same types.
    let mut load = json!({
        "timestamp": unix_now() as f64, "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": used, "num_active_tokens": used,
        "num_prealloc_ready_tokens": 0, "max_total_num_tokens": max, "max_running_requests": 2048,
        "token_usage": usage, "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": usage,
        "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0, "decode_moments": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    });
    if wants("disagg") {
        load["disaggregation"] = json!({
            "mode": app.engine.mode().as_str(), "prefill_bootstrap_queue_reqs": bootstrap, "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": prealloc, "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0,
        });
    }
    if wants("queues") {
        load["queues"] = json!({"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0});
    }
    let loads = match q.get("dp_rank").and_then(|r| r.parse::<u64>().ok()) {
        Some(r) if r != 0 => vec![],
        _ => vec![load],
    };
    // The top-level timestamp is an ISO 8601 string with the UTC offset (`datetime.isoformat()`).
    let iso = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    let iso = iso.strip_suffix('Z').map(|t| format!("{t}+00:00")).unwrap_or(iso);
    axum::Json(json!({
        "timestamp": iso, "version": cfg.sim.version.to_string(), "accelerator": "cuda", "num_accelerators": 4,
        "loads": loads,
    }))
    .into_response()
}

pub(crate) async fn flush_cache(State(app): State<App>) -> Response {
    if !app.engine.config().sim.cache_never_idle && app.engine.flush_cache() {
        (
            StatusCode::OK,
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n",
        )
            .into_response()
    } else {
        (StatusCode::BAD_REQUEST, "Cache not flushed. Please check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n").into_response()
    }
}

pub(crate) async fn metrics(State(app): State<App>, headers: HeaderMap) -> Response {
    if app.engine.config().sim.metrics_hang {
        std::future::pending::<()>().await;
    }
    let om = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/openmetrics-text"));
    let ctype = if om { "application/openmetrics-text; version=1.0.0; charset=utf-8" } else { "text/plain; version=0.0.4; charset=utf-8" };
    ([(header::CONTENT_TYPE, ctype)], app.engine.render_metrics(om)).into_response()
}
