//! A server's life: load, the port opening, warmup, the ready line; SIGTERM's drain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::args::{Mode, SimConfig};
use crate::engine::Engine;
use crate::log;
use crate::pd::Pd;

use super::routes::routes;
use super::{fill, App, Requests, DRAINING_LINE, READY_LINE, SIGTERM_LINE, WATCHDOG_PERIOD};

/// Run the simulator until SIGTERM/SIGINT or a simulated crash. Returns the exit code.
pub async fn run(cfg: SimConfig) -> i32 {
    let cfg = Arc::new(cfg);
    let pid = std::process::id();
    log::line(&format!("server_args=ServerArgs({})", server_args_repr(&cfg)));
    // The scheduler's state exists from here on; the weights "load" below.
    let engine = Engine::new(cfg.clone());
    let pd = Pd::new(engine.clone());
    // 0.5.23 `managers/disagg_service.py`: with role switching every PD instance runs its
    // bootstrap server (one flipped to prefill already has it; it is not rebuilt on a flip).
    let every_instance = cfg.enable_pd_role_switch && cfg.mode != Mode::Null;
    if every_instance {
        log::line(&format!(
            "Role switch starts a bootstrap server on this instance at {}:{}. If another PD instance runs on the same host, give each one a distinct --disaggregation-bootstrap-port or the bind will conflict.",
            cfg.host, cfg.bootstrap_port
        ));
    }
    if cfg.mode == Mode::Prefill || every_instance {
        if let Err(e) = pd.start_bootstrap().await {
            log::line(&format!("Scheduler hit an exception: OSError: {e}"));
            return 1;
        }
    }
    if let Err(code) = load_model(&cfg, &pd).await {
        return code;
    }

    let listener = match tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port)).await {
        Ok(l) => l,
        Err(e) => {
            log::line(&format!("Port is already in use. port={} error={e}", cfg.port));
            return 1;
        }
    };
    let app = App::new(&engine, &pd);
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

    spawn_idle_publisher(engine.clone());

    let ready_line = Arc::new(std::sync::Mutex::new(None::<String>));
    let warm = warmup_then_ready(engine.clone(), cfg.clone(), ready_line.clone(), app.ready_at.clone());

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
        shut_down(&cfg, pid, &ready_line);
    }
    server.abort();
    code
}

impl App {
    /// A server's shared state as it starts: nothing ready, paused, failing or in flight.
    fn new(engine: &Engine, pd: &Pd) -> App {
        App {
            engine: engine.clone(),
            pd: pd.clone(),
            ready_at: Arc::new(std::sync::OnceLock::new()),
            fail_until: Arc::new(std::sync::Mutex::new(None)),
            faults_now: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            requests: Requests::default(),
            shutting_down: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            health_failed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            control: super::weight_update::Control::new(engine),
            role_switch: super::role_switch::RoleSwitch::default(),
        }
    }
}

/// uvicorn's lines at a clean exit (and, with a block-buffered stderr, the ready line again).
fn shut_down(cfg: &SimConfig, pid: u32, ready_line: &std::sync::Mutex<Option<String>>) {
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

/// SIGTERM as SGLang 0.5.23 handles it (`SignalHandler.sigterm_handler` and
/// `TokenizerManager.sigterm_watchdog`): log, answer `/health` and `/ready` 503 from now on, and at
/// each 5 s watchdog tick log how many requests remain, exiting once none does — with no timeout
/// of its own (systemd's `TimeoutStopSec` and SIGKILL bound it). A server whose health check
/// failed exits at once.
pub(crate) async fn graceful_exit(app: &App, watchdog_start: tokio::time::Instant) {
    // SGLang logs the line and sets `gracefully_exit` in one signal handler on the event loop's
    // thread, so no request is answered between the two: whoever reads the line sees 503. Here the
    // HTTP handlers run on other tasks, so the flag goes first.
    app.shutting_down.store(true, std::sync::atomic::Ordering::SeqCst);
    log::line(&fill(
        SIGTERM_LINE,
        &[
            "15".into(),
            "<frame at 0x7f3a2c1d5e40, file '/usr/lib/python3/dist-packages/sglang/srt/managers/tokenizer_manager.py', line 3510, code sigterm_watchdog>"
                .into(),
        ],
    ));
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

pub(crate) fn server_args_repr(cfg: &SimConfig) -> String {
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

/// Load the weights, allocate the KV cache and capture the graphs (each with SGLang's log
/// line), then start the PD side (a prefill's transfer listener, a decode's heartbeat). `Err`:
/// the exit code of a failed start.
async fn load_model(cfg: &SimConfig, pd: &Pd) -> Result<(), i32> {
    log::line(&format!("Load weight begin. avail mem={:.2} GB", 78.5));
    let load = cfg.sim.load;
    tokio::time::sleep(load.mul_f64(0.6)).await;
    if let Some(code) = cfg.sim.exit_code {
        log::line("Scheduler hit an exception: Traceback (most recent call last):");
        log::raw(&format!("RuntimeError: simulated start-up failure (--sim-exit-code {code})"));
        log::line("Received sigquit from a child process. It usually means the child failed.");
        log::line("Initialization failed. Please see the error messages above.");
        return Err(code);
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
                return Err(1);
            }
        }
        Mode::Decode => pd.start_heartbeat(),
        Mode::Null => {}
    }
    Ok(())
}

/// SGLang's idle metrics publish (`_maybe_log_idle_metrics`), checked once a second.
fn spawn_idle_publisher(e: Engine) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            e.idle_tick();
        }
    });
}

/// Warmup (unless skipped), the optional traceback warning, then the ready line; a simulated
/// crash after ready ends it with `Some(1)`, otherwise it never returns.
async fn warmup_then_ready(
    engine: Engine,
    cfg: Arc<SimConfig>,
    ready_line: Arc<std::sync::Mutex<Option<String>>>,
    ready_at: Arc<std::sync::OnceLock<Instant>>,
) -> Option<i32> {
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
