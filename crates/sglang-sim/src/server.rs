//! The HTTP face of the simulator and its lifecycle: load → port opens → warmup → ready line.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, post, MethodFilter, MethodRouter};
use axum::Router;
use serde_json::{json, Value};

use crate::args::{Mode, SimConfig};
use crate::engine::{token_interval, Engine, Status};
use crate::log;
use crate::pd::{self, Bootstrap, Pd};

/// SGLang's ready line.
pub const READY_LINE: &str = "The server is fired up and ready to roll!";

#[derive(Clone)]
struct App {
    engine: Engine,
    /// PD pairing (bootstrap server, KV hand-off, the decode's cache).
    pd: Pd,
    ready_at: Arc<std::sync::OnceLock<Instant>>,
    /// Fault injected at run time (`POST /sim/fail_generate?secs=N`): generation requests
    /// answer 500 until then.
    fail_until: Arc<std::sync::Mutex<Option<Instant>>>,
    /// The requests in flight (the tokenizer manager's `rid_to_state`).
    requests: Requests,
    /// SIGTERM received (`gracefully_exit`): `/health` and `/ready` answer 503.
    shutting_down: Arc<std::sync::atomic::AtomicBool>,
}

impl App {
    /// The `--sim-health-fail-after-ready` fault has set in: the server is UnHealthy.
    fn unhealthy(&self) -> bool {
        matches!((self.engine.config().sim.health_fail_after_ready, self.ready_at.get()), (Some(after), Some(at)) if at.elapsed() >= after)
    }
}

/// The requests in flight, as SGLang's tokenizer manager keeps them (`rid_to_state`): what a
/// SIGTERM waits for, what `/abort_request` aborts.
#[derive(Clone, Default)]
struct Requests {
    inner: Arc<std::sync::Mutex<Table>>,
}

/// The last key given, and each request's rid and abort signal by key.
type Table = (u64, std::collections::BTreeMap<u64, (String, tokio::sync::watch::Sender<bool>)>);

/// One request in flight; it leaves the table when dropped.
struct Tracked {
    requests: Requests,
    key: u64,
    aborted: tokio::sync::watch::Receiver<bool>,
}

impl Requests {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn track(&self, rid: &str) -> Tracked {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut g = self.lock();
        g.0 += 1;
        let key = g.0;
        g.1.insert(key, (rid.to_string(), tx));
        Tracked { requests: self.clone(), key, aborted: rx }
    }

    /// The rids in flight.
    fn rids(&self) -> Vec<String> {
        self.lock().1.values().map(|(rid, _)| rid.clone()).collect()
    }

    /// Abort every request (`rid: None`) or those with this rid; returns how many.
    fn abort(&self, rid: Option<&str>) -> usize {
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
    async fn aborted(&mut self) {
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
const ABORTED: &str = "Abort request by the client (POST /abort_request).";

/// SGLang's shutdown lines (`managers/tokenizer_manager.py`, 0.5.23), `{}` where it prints a
/// value; checked against the wheel by the conformance test.
pub const SIGTERM_LINE: &str = "SIGTERM received. signum={} frame={}. Draining requests and shutting down...";
/// Logged by the SIGTERM watchdog every 5 s until no request is left.
pub const DRAINING_LINE: &str = "Gracefully exiting... Remaining number of requests {}. Remaining requests remaining_rids={}.";
/// How often the tokenizer manager's `sigterm_watchdog` looks (`asyncio.sleep(5)`).
pub const WATCHDOG_PERIOD: Duration = Duration::from_secs(5);

fn fill(template: &str, values: &[String]) -> String {
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

/// Run the simulator until SIGTERM/SIGINT or a simulated crash. Returns the exit code.
pub async fn run(cfg: SimConfig) -> i32 {
    let cfg = Arc::new(cfg);
    let pid = std::process::id();
    log::line(&format!("server_args=ServerArgs({})", server_args_repr(&cfg)));
    // The scheduler's state exists from here on; the weights "load" below.
    let engine = Engine::new(cfg.clone());
    let pd = Pd::new(engine.clone());
    if cfg.mode == Mode::Prefill {
        if let Err(e) = pd.start_bootstrap().await {
            log::line(&format!("Scheduler hit an exception: OSError: {e}"));
            return 1;
        }
    }
    log::line(&format!("Load weight begin. avail mem={:.2} GB", 78.5));
    let load = cfg.sim.load;
    tokio::time::sleep(load.mul_f64(0.6)).await;
    if let Some(code) = cfg.sim.exit_code {
        log::line("Scheduler hit an exception: Traceback (most recent call last):");
        log::raw(&format!("RuntimeError: simulated start-up failure (--sim-exit-code {code})"));
        log::line("Received sigquit from a child process. It usually means the child failed.");
        log::line("Initialization failed. Please see the error messages above.");
        return code;
    }
    log::line(&format!("Load weight end. elapsed={:.2} s, type=DeepseekV4ForCausalLM, avail mem=41.20 GB, mem usage=37.30 GB.", load.as_secs_f64() * 0.6));
    let max = cfg.sim.max_total_tokens;
    if cfg.sim.version.has_kv_tokens() {
        log::line(&format!("KV Cache is allocated. dtype: torch.bfloat16, #tokens: {max}, K size: 12.50 GB, V size: 12.50 GB"));
    } else {
        log::line(&format!("KV Cache is allocated. #tokens: {max}, K size: 12.50 GB, V size: 12.50 GB"));
    }
    log::line("Memory pool end. avail mem=15.70 GB");
    log::line("Capture cuda graph begin. This can take up to several minutes. avail mem=15.70 GB");
    tokio::time::sleep(load.mul_f64(0.4)).await;
    log::line(&format!(
        "max_total_num_tokens={max}, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len={}, available_gpu_mem=12.40 GB",
        cfg.context_length
    ));

    match cfg.mode {
        Mode::Prefill => {
            if let Err(e) = pd.serve_transfer().await {
                log::line(&format!("Scheduler hit an exception: OSError: {e}"));
                return 1;
            }
        }
        Mode::Decode => pd.start_heartbeat(),
        Mode::Null => {}
    }

    let listener = match tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port)).await {
        Ok(l) => l,
        Err(e) => {
            log::line(&format!("Port is already in use. port={} error={e}", cfg.port));
            return 1;
        }
    };
    let app = App {
        engine: engine.clone(),
        pd: pd.clone(),
        ready_at: Arc::new(std::sync::OnceLock::new()),
        fail_until: Arc::new(std::sync::Mutex::new(None)),
        requests: Requests::default(),
        shutting_down: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    };
    // The tokenizer manager's `sigterm_watchdog` wakes every 5 s from its start on.
    let watchdog_start = tokio::time::Instant::now();
    log::uvicorn(&format!("Started server process [{pid}]"));
    log::uvicorn("Waiting for application startup.");
    log::uvicorn("Application startup complete.");
    log::uvicorn(&format!("Uvicorn running on http://{}:{} (Press CTRL+C to quit)", cfg.host, cfg.port));
    let router = routes(app.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    // Idle publisher (`_maybe_log_idle_metrics`).
    {
        let e = engine.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                e.idle_tick();
            }
        });
    }

    let ready_line = Arc::new(std::sync::Mutex::new(None::<String>));
    let warm = {
        let engine = engine.clone();
        let cfg = cfg.clone();
        let ready_line = ready_line.clone();
        let ready_at = app.ready_at.clone();
        async move {
            if !cfg.skip_warmup {
                tokio::time::sleep(cfg.sim.warmup).await;
                if cfg.sim.never_ready {
                    std::future::pending::<()>().await;
                }
                if cfg.mode == Mode::Null {
                    let mut t = engine.admit(7);
                    for _ in 0..8 {
                        engine.decode_step(&mut t);
                    }
                    engine.finish(t);
                } else {
                    log::line("Start of pd disaggregation warmup ...");
                    if cfg.mode == Mode::Prefill {
                        let t = engine.admit(4);
                        engine.finish(t);
                    }
                    log::line("Disaggregation warmup requests completed for all 1 DP ranks");
                    log::line("End of disaggregation warmup");
                }
            } else if cfg.sim.never_ready {
                std::future::pending::<()>().await;
            }
            if cfg.sim.warn_traceback {
                log::line("post-warmup freeze_gc failed");
                log::raw("Traceback (most recent call last):");
                log::raw("  File \"/usr/lib/python3/dist-packages/sglang/srt/entrypoints/http_server.py\", line 2566, in _wait_and_warmup");
                log::raw("RuntimeError: freeze_gc is not supported here");
            }
            engine.set_up();
            let line = log::format_line(READY_LINE);
            log::raw(&line);
            if let Ok(mut g) = ready_line.lock() {
                *g = Some(line);
            }
            let _ = ready_at.set(Instant::now());
            if let Some(after) = cfg.sim.crash_after_ready {
                tokio::time::sleep(after).await;
                log::line("Scheduler hit an exception: Traceback (most recent call last):");
                log::raw("RuntimeError: CUDA error: an illegal memory access was encountered (simulated)");
                log::line("Received sigquit from a child process. It usually means the child failed.");
                return Some(1);
            }
            std::future::pending::<()>().await;
            None
        }
    };

    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            log::line(&format!("cannot install SIGTERM handler: {e}"));
            return 1;
        }
    };
    let code = tokio::select! {
        c = warm => c.unwrap_or(0),
        _ = term.recv() => {
            graceful_exit(&app, watchdog_start).await;
            0
        }
        _ = tokio::signal::ctrl_c() => 0,
    };
    if code == 0 {
        log::uvicorn("Shutting down");
        log::uvicorn("Waiting for application shutdown.");
        log::uvicorn("Application shutdown complete.");
        log::uvicorn(&format!("Finished server process [{pid}]"));
        if cfg.sim.flush_ready_on_stop {
            // A block-buffered stderr flushes what it held at exit: the ready line again.
            if let Some(line) = ready_line.lock().ok().and_then(|g| g.clone()) {
                log::raw(&line);
            }
        }
    }
    server.abort();
    code
}

/// SIGTERM as SGLang 0.5.23 handles it (`SignalHandler.sigterm_handler` and
/// `TokenizerManager.sigterm_watchdog`): log, answer `/health` and `/ready` 503 from now on, and at
/// each 5 s watchdog tick log how many requests remain, exiting once none does — with no timeout
/// of its own (systemd's `TimeoutStopSec` and SIGKILL bound it). A server whose health check
/// failed exits at once.
async fn graceful_exit(app: &App, watchdog_start: tokio::time::Instant) {
    log::line(&fill(
        SIGTERM_LINE,
        &[
            "15".into(),
            "<frame at 0x7f3a2c1d5e40, file '/usr/lib/python3/dist-packages/sglang/srt/managers/tokenizer_manager.py', line 3510, code sigterm_watchdog>"
                .into(),
        ],
    ));
    app.shutting_down.store(true, std::sync::atomic::Ordering::SeqCst);
    if app.unhealthy() {
        log::line("Signal SIGTERM received while health check failed. Force exiting.");
        return;
    }
    // The watchdog's next tick after the signal.
    let since = watchdog_start.elapsed().as_nanos() / WATCHDOG_PERIOD.as_nanos();
    let next = watchdog_start + WATCHDOG_PERIOD * (since as u32 + 1);
    tokio::time::sleep_until(next).await;
    loop {
        let rids = app.requests.rids();
        let list = format!("[{}]", rids.iter().map(|r| format!("'{r}'")).collect::<Vec<_>>().join(", "));
        log::line(&fill(DRAINING_LINE, &[rids.len().to_string(), list]));
        if rids.is_empty() {
            return;
        }
        tokio::time::sleep(WATCHDOG_PERIOD).await;
    }
}

fn server_args_repr(cfg: &SimConfig) -> String {
    format!(
        "model_path='{}', served_model_name='{}', host='{}', port={}, tp_size={}, disaggregation_mode='{}', disaggregation_bootstrap_port={}, enable_metrics={}, skip_server_warmup={}, context_length={}, page_size={}",
        cfg.model_path,
        cfg.served_model_name,
        cfg.host,
        cfg.port,
        cfg.tp_size,
        cfg.mode.as_str(),
        cfg.bootstrap_port,
        if cfg.enable_metrics { "True" } else { "False" },
        if cfg.skip_warmup { "True" } else { "False" },
        cfg.context_length,
        cfg.page_size,
    )
}

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
fn handler(path: &str, methods: &[&str]) -> Option<MethodRouter<App>> {
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
        "/metrics" => on(f, metrics),
        "/get_load" => on(f, get_load),
        "/ready" => on(f, ready),
        "/v1/loads" => on(f, v1_loads),
        _ => return None,
    })
}

fn routes(app: App) -> Router {
    let mut r = Router::new().route("/sim/fail_generate", post(fail_generate)).route("/sim/stall_transfers", post(stall_transfers));
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

/// `--api-key`: every other path needs `Authorization: Bearer KEY`, else 401
/// `{"error": "Unauthorized"}` (`srt/utils/auth.py`). The `/sim/…` knobs are the test's own.
async fn api_key(State(app): State<App>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let Some(key) = app.engine.config().api_key.as_deref() else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if req.method() == axum::http::Method::OPTIONS || path.starts_with("/sim/") || API_KEY_EXEMPT.iter().any(|p| path.starts_with(p)) {
        return next.run(req).await;
    }
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.split_once(' '));
    match given {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && token == key => next.run(req).await,
        _ => (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "Unauthorized"}))).into_response(),
    }
}

/// `GET /ready` (0.5.23, `entrypoints/http_server.py`): 200 once up, 503 while starting (this
/// simulator has no pause or shutdown state yet); no generate.
async fn ready(State(app): State<App>) -> Response {
    if app.engine.status() == Status::Starting || app.shutting_down.load(std::sync::atomic::Ordering::SeqCst) || app.unhealthy() {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

/// `POST /abort_request {"rid": ...}` or `{"abort_all": true}` (`entrypoints/http_server.py`,
/// `AbortReq` in `managers/io_struct.py`): the requests end with an abort; a prefill also
/// releases the rooms it holds for its decode.
async fn abort_request(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&e),
    };
    let all = v.get("abort_all").and_then(Value::as_bool).unwrap_or(false);
    let rid = v.get("rid").and_then(Value::as_str);
    if !all && rid.is_none() {
        return StatusCode::OK.into_response();
    }
    let n = app.requests.abort(if all { None } else { rid });
    if all {
        app.pd.release_all(ABORTED);
    }
    log::line(&format!("Abort request: abort_all={} rid={} aborted={n}", if all { "True" } else { "False" }, rid.unwrap_or("None")));
    StatusCode::OK.into_response()
}

async fn health(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    if app.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
        log::line("Health check request received during shutdown. Returning 503.");
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if cfg.sim.version.health_always_ok() {
        return StatusCode::OK.into_response();
    }
    if app.engine.status() == Status::Starting {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if app.unhealthy() {
        tokio::time::sleep(cfg.sim.health_generate).await;
        return (StatusCode::SERVICE_UNAVAILABLE, "Health check failed. (simulated)").into_response();
    }
    let generation = std::env::var("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION").map(|v| !matches!(v.to_lowercase().as_str(), "false" | "0")).unwrap_or(true);
    if generation {
        app.engine.health_probe();
        tokio::time::sleep(cfg.sim.health_generate).await;
    }
    StatusCode::OK.into_response()
}

async fn server_info(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    let mut v = json!({
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "served_model_name": cfg.served_model_name,
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
        "enable_dp_attention": cfg.dp_attention,
        "disaggregation_transfer_backend": cfg.transfer_backend,
        "load_balance_method": "round_robin",
        "launch_command": std::env::args().collect::<Vec<_>>().join(" "),
        "status": "ready",
        "max_total_num_tokens": cfg.sim.max_total_tokens,
        "max_req_input_len": cfg.context_length.saturating_sub(8),
        "internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {"token_usage": app.engine.token_usage()}}],
        "version": cfg.sim.version.to_string(),
        "frontend": "python",
    });
    if let Some(obj) = v.as_object_mut() {
        for (k, val) in &cfg.given {
            let key = k.trim_start_matches("--").replace('-', "_");
            obj.entry(key).or_insert_with(|| json!(val));
        }
    }
    axum::Json(v).into_response()
}

async fn model_info(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    axum::Json(json!({
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "served_model_name": cfg.served_model_name,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "disaggregation_mode": cfg.mode.as_str(),
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "deepseek_v4",
        "architectures": ["DeepseekV4ForCausalLM"],
    }))
    .into_response()
}

async fn models(State(app): State<App>) -> Response {
    let cfg = app.engine.config();
    axum::Json(json!({"object": "list", "data": [{
        "id": cfg.served_model_name, "object": "model", "created": unix_now(), "owned_by": "sglang",
        "root": cfg.served_model_name, "parent": null, "max_model_len": cfg.context_length}]}))
    .into_response()
}

async fn get_load(State(app): State<App>) -> Response {
    // Profiles before 0.5.13 (the last to serve it): held PD rooms are counted with the running
    // requests, as the simulator always did there (not checked against those sources).
    let (running, waiting, used) = app.engine.load();
    axum::Json(json!([{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": 0, "num_tokens": used}])).into_response()
}

/// `GET /v1/loads[?include=core,disagg,queues,…][&dp_rank=N]` as 0.5.23 answers it
/// (`entrypoints/v1_loads.py`, `managers/load_snapshot.py`): one entry per DP rank in `loads`, the
/// core fields always, the `disaggregation` and `queues` sections unless `include` leaves them out
/// (no `include`, or `all`: every section); an unknown section is a 400 naming the valid ones.
async fn v1_loads(State(app): State<App>, axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>) -> Response {
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
    let mut load = json!({
        "timestamp": unix_now() as f64, "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
        "num_used_tokens": used, "max_total_num_tokens": max,
        "token_usage": if max > 0 { used as f64 / max as f64 } else { 0.0 },
    });
    if cfg.mode != Mode::Null && wants("disagg") {
        load["disaggregation"] = json!({
            "mode": cfg.mode.as_str(), "prefill_bootstrap_queue_reqs": bootstrap, "prefill_inflight_queue_reqs": 0,
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
    axum::Json(json!({
        "timestamp": unix_now(), "version": cfg.sim.version.to_string(), "accelerator": "cuda", "num_accelerators": 4,
        "loads": loads,
    }))
    .into_response()
}

async fn flush_cache(State(app): State<App>) -> Response {
    if app.engine.flush_cache() {
        (
            StatusCode::OK,
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n",
        )
            .into_response()
    } else {
        (StatusCode::BAD_REQUEST, "Cache not flushed. Please check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n").into_response()
    }
}

async fn metrics(State(app): State<App>, headers: HeaderMap) -> Response {
    if app.engine.config().sim.metrics_hang {
        std::future::pending::<()>().await;
    }
    let om = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("application/openmetrics-text"));
    let ctype = if om { "application/openmetrics-text; version=1.0.0; charset=utf-8" } else { "text/plain; version=0.0.4; charset=utf-8" };
    ([(header::CONTENT_TYPE, ctype)], app.engine.render_metrics(om)).into_response()
}

fn bad_request(msg: &str) -> Response {
    (StatusCode::BAD_REQUEST, axum::Json(json!({"error": {"message": msg}}))).into_response()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn approx_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4).max(1)
}

/// What one request asks for, whatever API it came through.
struct Job {
    prompt_tokens: u64,
    max_new: u64,
    stream: bool,
}

fn log_request(kind: &str, body: &Value) {
    let s = |k: &str| body.get(k).map(|v| v.to_string()).unwrap_or_else(|| "None".into());
    log::line(&format!(
        "Receive: obj={kind}(rid={}, bootstrap_host={}, bootstrap_port={}, bootstrap_room={})",
        s("rid"),
        s("bootstrap_host"),
        s("bootstrap_port"),
        s("bootstrap_room")
    ));
}

const WORDS: &[&str] = &[" Paris", " is", " the", " capital", " of", " France", ".", " It"];

/// The PD side of a request before it runs: a decode needs the bootstrap fields (400 without)
/// and gets the room's KV from its prefill first (500 with SGLang's abort message when that
/// fails); a prefill returns the room to hold once its batch is done. Requests with the fake
/// bootstrap host (SGLang's own warmup) skip the transfer.
async fn pd_before(app: &App, v: &Value, rid: &str, tracked: &mut Tracked) -> Result<Option<Bootstrap>, Response> {
    let mode = app.engine.config().mode;
    let b = Bootstrap::of(v);
    match (mode, b) {
        // `managers/scheduler.py` (0.5.23): both roles refuse a request without a room.
        (Mode::Decode | Mode::Prefill, None) => {
            let m = format!("Invalid request: Disaggregated request received without bootstrap room id. req.rid='{rid}'");
            log::line(&m);
            Err(bad_request(&m))
        }
        (Mode::Decode, Some(b)) if !b.fake() => tokio::select! {
            r = app.pd.receive(rid, &b) => r.map(|()| None).map_err(|m| pd::abort(&m)),
            () = tracked.aborted() => {
                app.engine.count_abort();
                Err(pd::abort(ABORTED))
            }
        },
        (Mode::Prefill, Some(b)) if !b.fake() => Ok(Some(b)),
        _ => Ok(None),
    }
}

/// Run a request through the engine; `on_token` sees each generated piece. A PD prefill holds
/// the room's KV for its decode (`hold`) instead of finishing; `Err` is the abort message.
async fn execute(
    app: &App,
    job: &Job,
    hold: Option<(&str, &Bootstrap)>,
    tracked: &mut Tracked,
    mut on_token: impl FnMut(usize, &str) -> bool,
) -> Result<u64, String> {
    let engine = &app.engine;
    let mut ticket = engine.admit(job.prompt_tokens);
    // A PD prefill server only runs the prefill (and the first token).
    let n = if engine.config().mode == Mode::Prefill { 1 } else { job.max_new };
    let mut produced = 0;
    let mut tick = tokio::time::interval(token_interval(engine.config()));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    for i in 0..n as usize {
        tokio::select! {
            _ = tick.tick() => {}
            () = tracked.aborted() => {
                engine.finish(ticket);
                engine.count_abort();
                return Err(ABORTED.into());
            }
        }
        engine.decode_step(&mut ticket);
        produced += 1;
        if !on_token(i, WORDS[i % WORDS.len()]) {
            break;
        }
    }
    match hold {
        Some((rid, b)) => app.pd.hold(rid, b, ticket).await?,
        None => engine.finish(ticket),
    }
    Ok(produced)
}

fn parse_body(body: &Bytes) -> Result<Value, String> {
    let v = serde_json::from_slice::<Value>(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    if v.is_object() {
        Ok(v)
    } else {
        Err("the body must be a JSON object".into())
    }
}

fn sse(rx: tokio::sync::mpsc::UnboundedReceiver<String>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|chunk| (Ok::<_, Infallible>(Bytes::from(chunk)), rx)) });
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], Body::from_stream(stream)).into_response()
}

/// `POST /sim/fail_generate?secs=N` (a simulator knob, not SGLang's): generation fails with 500
/// for the next N seconds, as a server whose scheduler is wedged would answer.
async fn fail_generate(State(app): State<App>, axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>) -> Response {
    let secs: f64 = q.get("secs").and_then(|s| s.parse().ok()).unwrap_or(0.0);
    *app.fail_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + Duration::from_secs_f64(secs.max(0.0)));
    log::line(&format!("simulated fault: generation fails for {secs} s"));
    StatusCode::OK.into_response()
}

/// `POST /sim/stall_transfers?secs=N` (a simulator knob): on a decode, requests arriving in the
/// next N seconds wait N seconds before they fetch their KV.
async fn stall_transfers(State(app): State<App>, axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>) -> Response {
    let secs: f64 = q.get("secs").and_then(|s| s.parse().ok()).unwrap_or(0.0);
    app.pd.stall_transfers(secs);
    StatusCode::OK.into_response()
}

fn failing(app: &App) -> Option<Response> {
    let until = *app.fail_until.lock().unwrap_or_else(|p| p.into_inner());
    until
        .filter(|u| Instant::now() < *u)
        .map(|_| (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": {"message": "simulated failure (sim fail_generate)"}}))).into_response())
}

async fn generate(State(app): State<App>, body: Bytes) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&e),
    };
    if let Some(r) = failing(&app) {
        if let (Mode::Prefill, Some(b)) = (app.engine.config().mode, Bootstrap::of(&v)) {
            app.pd.abort_room(b.room);
        }
        return r;
    }
    log_request("GenerateReqInput", &v);
    let prompt_tokens = match (v.get("text").and_then(Value::as_str), v.get("input_ids").and_then(Value::as_array)) {
        (Some(t), _) => approx_tokens(t),
        (None, Some(ids)) => (ids.len() as u64).max(1),
        _ => return bad_request("Either text or input_ids should be provided."),
    };
    let max_new = v.pointer("/sampling_params/max_new_tokens").and_then(Value::as_u64).unwrap_or(128);
    let job = Job { prompt_tokens, max_new, stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false) };
    let rid = v.get("rid").and_then(Value::as_str).map(String::from).unwrap_or_else(|| format!("{:032x}", crate::ids::rand_u128()));
    let mut tracked = app.requests.track(&rid);
    let hold = match pd_before(&app, &v, &rid, &mut tracked).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    let started = Instant::now();
    let meta_rid = rid.clone();
    let meta = move |n: u64, prompt: u64| {
        json!({"id": meta_rid, "finish_reason": {"type": "length", "length": n}, "prompt_tokens": prompt,
               "completion_tokens": n, "cached_tokens": 0, "weight_version": "default",
               "e2e_latency": started.elapsed().as_secs_f64()})
    };
    if job.stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let app = app.clone();
        tokio::spawn(async move {
            let mut text = String::new();
            let mut ids = Vec::new();
            let r = execute(&app, &job, hold.as_ref().map(|b| (rid.as_str(), b)), &mut tracked, |i, w| {
                text.push_str(w);
                ids.push(1000 + i as u64);
                let chunk = json!({"text": text, "output_ids": ids, "meta_info": meta(ids.len() as u64, job.prompt_tokens)});
                tx.send(format!("data: {chunk}\n\n")).is_ok()
            })
            .await;
            if let Err(m) = r {
                let _ = tx.send(format!("data: {}\n\n", json!({"error": {"message": m}})));
            }
            let _ = tx.send("data: [DONE]\n\n".into());
        });
        return sse(rx);
    }
    let mut text = String::new();
    let mut ids = Vec::new();
    let r = execute(&app, &job, hold.as_ref().map(|b| (rid.as_str(), b)), &mut tracked, |i, w| {
        text.push_str(w);
        ids.push(1000 + i as u64);
        true
    })
    .await;
    match r {
        Ok(n) => axum::Json(json!({"text": text, "output_ids": ids, "meta_info": meta(n, job.prompt_tokens)})).into_response(),
        Err(m) => pd::abort(&m),
    }
}

async fn completions(State(app): State<App>, body: Bytes) -> Response {
    openai(app, body, false).await
}

async fn chat(State(app): State<App>, body: Bytes) -> Response {
    openai(app, body, true).await
}

async fn openai(app: App, body: Bytes, chat: bool) -> Response {
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&e),
    };
    log_request(if chat { "ChatCompletionRequest" } else { "CompletionRequest" }, &v);
    let prompt_tokens = if chat {
        match v.get("messages").and_then(Value::as_array) {
            Some(msgs) => msgs.iter().map(|m| approx_tokens(m.get("content").and_then(Value::as_str).unwrap_or(""))).sum(),
            None => return bad_request("messages: Field required"),
        }
    } else {
        match v.get("prompt").and_then(Value::as_str) {
            Some(p) => approx_tokens(p),
            None => return bad_request("prompt: Field required"),
        }
    };
    let max_new = v.get("max_completion_tokens").or_else(|| v.get("max_tokens")).and_then(Value::as_u64).unwrap_or(16);
    let job = Job { prompt_tokens, max_new, stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false) };
    let model = app.engine.config().served_model_name.clone();
    let id = format!("{:032x}", crate::ids::rand_u128());
    let mut tracked = app.requests.track(&id);
    let hold = match pd_before(&app, &v, &id, &mut tracked).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    let created = unix_now();
    let (object, chunk_object) = if chat { ("chat.completion", "chat.completion.chunk") } else { ("text_completion", "text_completion") };
    if job.stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let app = app.clone();
        tokio::spawn(async move {
            let r = execute(&app, &job, hold.as_ref().map(|b| (id.as_str(), b)), &mut tracked, |_, w| {
                let choice = if chat {
                    json!({"index": 0, "delta": {"role": "assistant", "content": w}, "finish_reason": null})
                } else {
                    json!({"index": 0, "text": w, "finish_reason": null})
                };
                let c = json!({"id": id, "object": chunk_object, "created": created, "model": model, "choices": [choice]});
                tx.send(format!("data: {c}\n\n")).is_ok()
            })
            .await;
            if let Err(m) = r {
                let _ = tx.send(format!("data: {}\n\n", json!({"error": {"message": m}})));
            }
            let _ = tx.send("data: [DONE]\n\n".into());
        });
        return sse(rx);
    }
    let mut text = String::new();
    let r = execute(&app, &job, hold.as_ref().map(|b| (id.as_str(), b)), &mut tracked, |_, w| {
        text.push_str(w);
        true
    })
    .await;
    let n = match r {
        Ok(n) => n,
        Err(m) => return pd::abort(&m),
    };
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
    } else {
        json!({"index": 0, "text": text, "finish_reason": "length"})
    };
    axum::Json(json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice],
        "usage": {"prompt_tokens": job.prompt_tokens, "completion_tokens": n, "total_tokens": job.prompt_tokens + n}}))
    .into_response()
}
