//! The route table (one list, the conformance catalogue's too) and the `--api-key` guard.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, post, MethodFilter, MethodRouter};
use axum::Router;
use serde_json::json;

use crate::args::SimConfig;
use crate::log;

use super::admin::{abort_request, flush_cache, get_load, health, metrics, model_info, models, ready, server_info, v1_loads};
use super::generate::{chat, completions, fail_generate, faults_now, generate, stall_transfers};
use super::App;

/// The routes a server with this configuration serves (the `/sim/…` knobs apart) with their
/// methods, as SGLang's `entrypoints/http_server.py` and `entrypoints/v1_loads.py` declare them.
/// The one table both the router and the conformance catalogue ([`crate::catalogue`]) are built from.
pub fn served_routes(cfg: &SimConfig) -> Vec<(&'static str, &'static [&'static str])> {
    let v = cfg.sim.version;
    let loads = !cfg.sim.no_load_endpoint;
    let mut r: Vec<(&'static str, &'static [&'static str])> = vec![
        ("/health", &["GET"]),
        ("/health_generate", &["GET"]),
        ("/server_info", &["GET"]),
        ("/get_server_info", &["GET"]),
        ("/model_info", &["GET"]),
        ("/get_model_info", &["GET"]),
        ("/v1/models", &["GET"]),
        ("/flush_cache", &["GET", "POST"]),
        ("/generate", &["POST", "PUT"]),
        ("/v1/completions", &["POST"]),
        ("/v1/chat/completions", &["POST"]),
        ("/abort_request", &["POST"]),
        ("/update_weights_from_disk", &["POST"]),
        ("/pause_generation", &["POST"]),
        ("/continue_generation", &["POST"]),
        ("/pd_role_switch", &["POST"]),
    ];
    if cfg.enable_metrics {
        r.push(("/metrics", &["GET"]));
    }
    if v.has_get_load() && loads {
        r.push(("/get_load", &["GET"]));
    }
    if v.has_ready() {
        r.push(("/ready", &["GET"]));
    }
    if v.has_v1_loads() && loads {
        r.push(("/v1/loads", &["GET"]));
    }
    r
}

/// The handler of one path of [`served_routes`], for the given methods.
pub(crate) fn handler(path: &str, methods: &[&str]) -> Option<MethodRouter<App>> {
    let mut filter: Option<MethodFilter> = None;
    for m in methods {
        let f = MethodFilter::try_from(axum::http::Method::from_bytes(m.as_bytes()).ok()?).ok()?;
        filter = Some(filter.map_or(f, |g| g.or(f)));
    }
    let f = filter?;
    Some(match path {
        "/health" | "/health_generate" => on(f, health),
        "/server_info" | "/get_server_info" => on(f, server_info),
        "/model_info" | "/get_model_info" => on(f, model_info),
        "/v1/models" => on(f, models),
        "/flush_cache" => on(f, flush_cache),
        "/generate" => on(f, generate),
        "/v1/completions" => on(f, completions),
        "/v1/chat/completions" => on(f, chat),
        "/abort_request" => on(f, abort_request),
        "/update_weights_from_disk" => on(f, super::weight_update::update_weights_from_disk),
        "/pause_generation" => on(f, super::weight_update::pause_generation),
        "/continue_generation" => on(f, super::weight_update::continue_generation),
        "/pd_role_switch" => on(f, super::role_switch::pd_role_switch),
        "/metrics" => on(f, metrics),
        "/get_load" => on(f, get_load),
        "/ready" => on(f, ready),
        "/v1/loads" => on(f, v1_loads),
        _ => return None,
    })
}

pub(crate) fn routes(app: App) -> Router {
    let mut r = Router::new()
        .route("/sim/fail_generate", post(fail_generate))
        .route("/sim/faults_now", post(faults_now))
        .route("/sim/stall_transfers", post(stall_transfers));
    for (path, methods) in served_routes(app.engine.config()) {
        match handler(path, methods) {
            Some(h) => r = r.route(path, h),
            None => log::line(&format!("simulator bug: no handler for {path}")),
        }
    }
    r.fallback(|| async { (StatusCode::NOT_FOUND, axum::Json(json!({"detail": "Not Found"}))) })
        .layer(axum::middleware::from_fn_with_state(app.clone(), api_key))
        .with_state(app)
}

/// Paths any client may call without the API key (`decide_request_auth`, `srt/utils/auth.py`:
/// Kubernetes probes and Prometheus scrapes carry no secret); matched as prefixes.
pub const API_KEY_EXEMPT: &[&str] = &["/health", "/ready", "/metrics"];

/// The routes of the simulator's that 0.5.23 marks `ADMIN_OPTIONAL`
/// (`entrypoints/http_server.py` `@auth_level(AuthLevel.ADMIN_OPTIONAL)`).
pub const ADMIN_ROUTES: &[&str] =
    &["/pause_generation", "/continue_generation", "/update_weights_from_disk", "/flush_cache", "/abort_request", "/pd_role_switch"];

/// `--api-key` and `--admin-api-key` as 0.5.23's `decide_request_auth` (`srt/utils/auth.py`):
/// the exempt paths are open; an admin route takes the admin key when there is one (the API key
/// is refused there), else the API key; every other path needs the API key when there is one.
/// A refusal is 401 `{"error": "Unauthorized"}`. The `/sim/…` knobs are the test's own.
pub(crate) async fn api_key(State(app): State<App>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let cfg = app.engine.config();
    let path = req.uri().path();
    if req.method() == axum::http::Method::OPTIONS || path.starts_with("/sim/") || API_KEY_EXEMPT.iter().any(|p| path.starts_with(p)) {
        return next.run(req).await;
    }
    let expected = match cfg.admin_api_key.as_deref() {
        Some(admin) if ADMIN_ROUTES.contains(&path) => Some(admin),
        _ => cfg.api_key.as_deref(),
    };
    let Some(key) = expected else {
        return next.run(req).await;
    };
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.split_once(' '));
    match given {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && token == key => next.run(req).await,
        _ => (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "Unauthorized"}))).into_response(),
    }
}
