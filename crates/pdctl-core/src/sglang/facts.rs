//! What pdctl knows of SGLang's start-up log, compiled in (upstream `sgl-project/sglang`,
//! `python/sglang/srt/`, read at 0.5.23). Config can add patterns; nothing can remove these.

/// The ready line, logged at INFO by `_wait_and_warmup()` (`entrypoints/http_server.py`) once
/// the warm-up request has passed. Matched as a substring: with `--tokenizer-worker-num > 1` it
/// is printed through uvicorn's handler as `[…] INFO:     The server is fired up…`.
pub const READY_LINE: &str = "The server is fired up and ready to roll!";

/// What a running server was asked: `/server_info`'s `launch_command`, split into words. SGLang
/// 0.5.23 reports its *resolved* settings in `/server_info` (`utils/common.py`
/// `build_server_info` → `server_args.resolved_dict()`: `mooncake_tcp` is reported as `mooncake`,
/// a DeepSeek-V4 model's `page_size` as 256 whatever was asked) and, beside them,
/// `launch_command`: the command line without the program, joined with spaces
/// (`server_args.py`). A new ExecStart is compared with this; resolved values only with another
/// running server's. `None`: not reported (versions before it report only their settings).
pub fn launch_argv(info: &serde_json::Value) -> Option<Vec<String>> {
    info.get("launch_command")?.as_str().map(|s| s.split_whitespace().map(String::from).collect())
}

/// Flags whose value is a secret: never recorded from a `launch_command` (0.5.23 redacts only
/// the watermark's).
pub const SECRET_FLAGS: &[&str] = &["--api-key", "--admin-api-key"];

/// `argv` with the values of [`SECRET_FLAGS`] replaced by `<redacted>`, for records and logs.
pub fn redact(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut hide_next = false;
    for a in argv {
        if hide_next {
            out.push("<redacted>".to_string());
            hide_next = false;
            continue;
        }
        match SECRET_FLAGS.iter().find(|f| a == *f || a.starts_with(&format!("{f}="))) {
            Some(f) if a == f => {
                out.push(a.clone());
                hide_next = true;
            }
            Some(f) => out.push(format!("{f}=<redacted>")),
            None => out.push(a.clone()),
        }
    }
    out
}

/// Lines that mean this run failed, each with where SGLang prints it.
pub const FATAL_PATTERNS: &[&str] = &[
    // `Initialization failed. warmup error: …` (entrypoints/http_server.py) and
    // `Initialization failed. Please see the error messages above.` (entrypoints/engine.py).
    "Initialization failed",
    // `Not enough memory. Please try to increase --mem-fraction-static.`
    // (model_executor/pool_configurator.py).
    "Not enough memory",
    // `Received sigquit from a child process. It usually means the child failed.` (entrypoints/engine.py).
    "Received sigquit",
    // argparse rejecting a flag: `launch_server.py: error: unrecognized arguments: …` (exit 2).
    "unrecognized arguments",
    // `Scheduler hit an exception: …` (managers/scheduler.py); it then SIGQUITs its parent.
    "Scheduler hit an exception",
];

/// Lines that mean this run failed only if it then exits (or a fatal line follows): a Python
/// traceback. SGLang 0.5.23 also logs non-fatal warnings with one before its ready line
/// (`logger.warning(..., exc_info=True)`, e.g. "post-warmup freeze_gc failed",
/// `entrypoints/http_server.py`), and that start goes on to print the ready line.
pub const SUSPECT_PATTERNS: &[&str] = &["Traceback (most recent call last)"];

/// Lines SGLang prints before its ready line on every start, in order (0.5.23; the same strings
/// since 0.4.6 where noted in docs/runbook.md): `server_args=` (`entrypoints/engine.py`), weight
/// loading (`model_executor/model_runner.py`), the KV pool (`mem_cache/memory_pool.py`), CUDA
/// graphs, the scheduler's limits (`managers/scheduler.py`), uvicorn's start-up, the PD warm-up
/// (`entrypoints/http_server.py`). A ready pattern must not match any of them, or the ready gate
/// would pass milliseconds after the start.
pub const EARLY_LINES: &[&str] = &[
    "[2026-05-01 12:00:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V4-Flash', host='127.0.0.1', port=30000, enable_metrics=True)",
    "[2026-05-01 12:00:01] Load weight begin. avail mem=78.50 GB",
    "[2026-05-01 12:00:40] Load weight end. elapsed=39.10 s, type=DeepseekV4ForCausalLM, avail mem=41.20 GB, mem usage=37.30 GB.",
    "[2026-05-01 12:00:41] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 393216, K size: 12.50 GB, V size: 12.50 GB",
    "[2026-05-01 12:00:41] Memory pool end. avail mem=15.70 GB",
    "[2026-05-01 12:00:41] Capture cuda graph begin. This can take up to several minutes. avail mem=15.70 GB",
    "[2026-05-01 12:00:55] max_total_num_tokens=393216, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=128, context_len=163840, available_gpu_mem=15.20 GB",
    "[2026-05-01 12:00:56] INFO:     Started server process [4242]",
    "[2026-05-01 12:00:56] INFO:     Waiting for application startup.",
    "[2026-05-01 12:00:56] INFO:     Application startup complete.",
    "[2026-05-01 12:00:56] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
    "[2026-05-01 12:00:57] INFO:     127.0.0.1:5555 - \"GET /model_info HTTP/1.1\" 200 OK",
    "[2026-05-01 12:00:57] Start of pd disaggregation warmup ...",
    "[2026-05-01 12:00:58] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0",
    "[2026-05-01 12:00:58] Disaggregation warmup requests completed for all 1 DP ranks",
    "[2026-05-01 12:00:58] End of disaggregation warmup",
];

/// Why `pattern` cannot be the ready pattern (`None`: it can).
pub fn unusable_ready_pattern(pattern: &str) -> Option<String> {
    if pattern.trim().is_empty() {
        return Some("it is empty: every line would match".into());
    }
    EARLY_LINES
        .iter()
        .find(|l| l.contains(pattern))
        .map(|l| format!("it matches a line SGLang prints on every start before it is ready ({l:?}), so the ready gate would pass at once"))
}

/// The fatal patterns in force: SGLang's, then the configured extra ones.
pub fn fatal_patterns(extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = FATAL_PATTERNS.iter().map(|s| s.to_string()).collect();
    for e in extra {
        if !out.contains(e) {
            out.push(e.clone());
        }
    }
    out
}

/// How a failed KV transfer of a PD request reads, on either side: the decode aborts with
/// `Decode transfer failed for request rank=… decode_req.req.rid=… decode_req.req.bootstrap_room=…
/// with exception KVTransferError(…)` (`disaggregation/decode.py`), the prefill with `Prefill
/// transfer failed for request …` (`disaggregation/prefill.py`); a decode that waited in vain
/// says `… timed out after …s in KVPoll.WaitingForInput`, a prefill `… in KVPoll.Bootstrapping`.
pub const TRANSFER_FAILURE_MARKERS: &[&str] = &["KVTransferError", "transfer failed for request", "KVPoll.WaitingForInput", "KVPoll.Bootstrapping"];

/// Whether an error body is a failed KV transfer (not the server failing on its own).
pub fn is_transfer_failure(body: &str) -> bool {
    TRANSFER_FAILURE_MARKERS.iter().any(|m| body.contains(m))
}

/// SGLang's `FAKE_BOOTSTRAP_HOST`: a request with it skips the KV transfer (the server's own
/// warm-up).
pub const FAKE_BOOTSTRAP_HOST: &str = "2.2.2.2";

/// The environment variable that bounds how long a prefill holds a room's KV for its decode
/// (`SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`, `srt/environ.py`; seconds).
pub const BOOTSTRAP_TIMEOUT_ENV: &str = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT";

/// Its default when unset (300 s in `srt/environ.py`).
pub const BOOTSTRAP_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(300);

/// The prefill's queue gauges that hold requests for a decode, across versions: the bootstrap
/// queue (`num_prefill_prealloc_queue_reqs` before 0.5.12) and the in-flight transfer queue
/// (`num_prefill_infight_queue_reqs`, misspelt, in 0.4.6).
pub const PREFILL_HELD_GAUGES: &[&str] = &[
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_prealloc_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_prefill_infight_queue_reqs",
];

/// How long the PD queue gauges may lag the scheduler on an idle server: they are refreshed at
/// batch reports and at the idle publish, which runs at once only when the published running
/// count is stale and otherwise every 30 s (0.5.23
/// `managers/scheduler_components/metrics_reporter.py`, `_maybe_log_idle_metrics`). A room
/// released on an idle prefill can show in `/metrics` this long after; `/v1/loads` has no lag.
pub const GAUGE_IDLE_PUBLISH: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a `/health` waits for the scheduler's answer before it fails and marks the server
/// UnHealthy (`SGLANG_HEALTH_CHECK_TIMEOUT`, seconds; 0.5.23 `entrypoints/http_server.py`
/// `health_generate`): `/ready` then answers 503 and a SIGTERM force-exits without draining,
/// until a later `/health` succeeds. A pause longer than this fails every `/health` sent during it
/// (the gateway's: smg 1.13 checks every 60 s with a 5 s timeout and drops a worker after 3
/// failures).
pub const HEALTH_CHECK_TIMEOUT_ENV: &str = "SGLANG_HEALTH_CHECK_TIMEOUT";
/// Its default when unset (20 s).
pub const HEALTH_CHECK_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(20);

/// The `/health` timeout of a unit with this environment.
pub fn health_check_timeout(env: &[String]) -> std::time::Duration {
    env_number(env, HEALTH_CHECK_TIMEOUT_ENV)
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(std::time::Duration::from_secs_f64)
        .unwrap_or(HEALTH_CHECK_TIMEOUT_DEFAULT)
}

/// How long a decode waits for a room's KV before it fails the request and drops the prefill's
/// cached bootstrap info (`SGLANG_DISAGGREGATION_WAITING_TIMEOUT`, `srt/environ.py`; seconds).
pub const WAITING_TIMEOUT_ENV: &str = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT";
/// Its default when unset (300 s).
pub const WAITING_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(300);
/// How often a decode checks each cached prefill's bootstrap `/health`
/// (`SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`; at least 2 s, `disaggregation/common/conn.py`).
pub const HEARTBEAT_INTERVAL_ENV: &str = "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL";
/// Its default when unset (5 s).
pub const HEARTBEAT_INTERVAL_DEFAULT: std::time::Duration = std::time::Duration::from_secs(5);
/// Failed heartbeats in a row after which the decode drops that prefill's cached info
/// (`SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`; at least 1).
pub const HEARTBEAT_FAILURES_ENV: &str = "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE";
/// Its default when unset (2).
pub const HEARTBEAT_FAILURES_DEFAULT: u32 = 2;

/// Paths a server started with `--api-key` serves without the key (prefixes; `decide_request_auth`
/// in `srt/utils/auth.py`): pdctl sends the key on every other call.
pub const API_KEY_EXEMPT: &[&str] = &["/health", "/ready", "/metrics"];

/// The routes pdctl calls that SGLang marks `ADMIN_OPTIONAL` (0.5.23
/// `entrypoints/http_server.py` `@auth_level(AuthLevel.ADMIN_OPTIONAL)`; `utils/auth.py`
/// `decide_request_auth`): on a server started with `--admin-api-key` they take that key and
/// refuse the `--api-key` one (401); without it, the API key as any other route.
pub const ADMIN_ROUTES: &[&str] =
    &["/pause_generation", "/continue_generation", "/update_weights_from_disk", "/flush_cache", "/abort_request", "/pd_role_switch"];

/// Why `path` cannot be the `--model-path` of a weights rollout, if it cannot: SGLang's
/// `/update_weights_from_disk` takes any string and reports the load as done (an empty path
/// "loaded" fine on the simulator and left `/model_info` empty), and a relative path is resolved
/// against each server's own working directory (or read as a model hub id). pdctl takes an
/// absolute path, without control characters.
pub fn model_path_problem(path: &str) -> Option<String> {
    if path.trim().is_empty() {
        Some("the model path is empty: give --model-path the absolute path of the checkpoint directory the servers load".into())
    } else if path.chars().any(char::is_control) {
        Some(format!("the model path {path:?} contains a control character: give the absolute path of the checkpoint directory"))
    } else if path.split('/').any(|c| c == ".." || c == ".") {
        Some(format!(
            "the model path {path:?} has a `.` or `..` component: the record, `[rollout] model_paths` and the servers would each read it differently; give the resolved absolute path of the checkpoint directory"
        ))
    } else if !path.starts_with('/') {
        Some(format!(
            "the model path {path:?} is relative: each server would resolve it against its own working directory (or read it as a model hub id); give the absolute path of the checkpoint directory"
        ))
    } else {
        None
    }
}

/// What is wrong with the checkpoint directory `path` as this process sees it: missing, or not a
/// directory (`None`: it is one, or this process cannot look — a permission error is the
/// servers' to judge). `hidden_home`: this process runs with systemd's `ProtectHome=yes`, so a
/// path under `/home`, `/root` or `/run/user` cannot be checked here and is not judged. The dry
/// run of `pdctl rollout weights` asks (the real run loads nothing it cannot: a server that
/// fails the load puts every worker back on its previous weights).
pub fn model_dir_problem(path: &str, hidden_home: bool) -> Option<String> {
    if hidden_home && ["/home/", "/root/", "/run/user/"].iter().any(|h| path.starts_with(h)) {
        return None;
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(format!("the model path {path} is not a directory: give the checkpoint directory the servers load")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("the model path {path} does not exist on this host: copy the checkpoint there first (the servers would fail to load it)"))
        }
        Err(_) => None,
    }
}

/// Whether a call to `path` needs the worker's API key.
pub fn needs_api_key(path: &str) -> bool {
    !API_KEY_EXEMPT.iter().any(|p| path.starts_with(p))
}

/// A decode's timing for a cached prefill, from its unit's `KEY=value` environment: how long a
/// request waits for KV before failing (and dropping the cached info), and how long a prefill
/// must be unreachable before the heartbeat drops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeTiming {
    /// `SGLANG_DISAGGREGATION_WAITING_TIMEOUT`.
    pub waiting_timeout: std::time::Duration,
    /// `SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL`, at least 2 s.
    pub heartbeat_interval: std::time::Duration,
    /// `SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`, at least 1.
    pub heartbeat_failures: u32,
}

impl DecodeTiming {
    /// The timing of a decode unit with this environment (defaults where unset or unreadable).
    pub fn of(env: &[String]) -> DecodeTiming {
        let secs = |name: &str| env_number(env, name).filter(|s| s.is_finite() && *s >= 0.0);
        DecodeTiming {
            waiting_timeout: secs(WAITING_TIMEOUT_ENV).map(std::time::Duration::from_secs_f64).unwrap_or(WAITING_TIMEOUT_DEFAULT),
            heartbeat_interval: secs(HEARTBEAT_INTERVAL_ENV)
                .map(std::time::Duration::from_secs_f64)
                .unwrap_or(HEARTBEAT_INTERVAL_DEFAULT)
                .max(std::time::Duration::from_secs(2)),
            heartbeat_failures: secs(HEARTBEAT_FAILURES_ENV).map(|n| n as u32).unwrap_or(HEARTBEAT_FAILURES_DEFAULT).max(1),
        }
    }

    /// How long a prefill must be unreachable before this decode's heartbeat is sure to drop it.
    pub fn heartbeat_window(&self) -> std::time::Duration {
        self.heartbeat_interval * (self.heartbeat_failures + 1)
    }
}

fn env_number(env: &[String], name: &str) -> Option<f64> {
    env.iter().find_map(|kv| kv.strip_prefix(name).and_then(|r| r.strip_prefix('='))).and_then(|v| v.trim().parse::<f64>().ok())
}

/// `--disaggregation-bootstrap-port`'s default (8998, `srt/server_args.py`).
pub const BOOTSTRAP_PORT_DEFAULT: u16 = 8998;

/// A prefill unit's bootstrap timeout from its `KEY=value` environment (the default when unset
/// or unreadable).
pub fn bootstrap_timeout(env: &[String]) -> std::time::Duration {
    env_number(env, BOOTSTRAP_TIMEOUT_ENV).filter(|s| s.is_finite() && *s >= 0.0).map(std::time::Duration::from_secs_f64).unwrap_or(BOOTSTRAP_TIMEOUT_DEFAULT)
}

#[cfg(test)]
mod model_path_tests {
    use super::model_path_problem;

    #[test]
    fn an_empty_relative_or_control_character_path_is_refused_and_an_absolute_one_taken() {
        for bad in ["", "  ", "models/ft", "deepseek-ai/DeepSeek-V4", "/models/ft\n"] {
            assert!(model_path_problem(bad).is_some(), "{bad:?}");
        }
        assert!(model_path_problem("").is_some_and(|w| w.contains("empty")));
        assert!(model_path_problem("models/ft").is_some_and(|w| w.contains("relative")));
        assert_eq!(model_path_problem("/models/dsv4-ft-1127"), None);
        // `/models/../etc` would pass a `/models` bound as text and load /etc.
        for dotted in ["/models/../etc", "/models/./ft", "/models/ft/.."] {
            assert!(model_path_problem(dotted).is_some_and(|w| w.contains("`..`")), "{dotted}");
        }
    }

    #[test]
    fn a_missing_checkpoint_directory_is_named_and_a_hidden_home_not_judged() {
        use super::model_dir_problem;
        assert_eq!(model_dir_problem("/", false), None);
        assert!(model_dir_problem("/nonexistent/pdctl-model", false).is_some_and(|w| w.contains("does not exist")));
        assert!(model_dir_problem("/proc/self/status", false).is_some_and(|w| w.contains("not a directory")));
        assert_eq!(model_dir_problem("/home/nobody/no-such-model", true), None);
    }
}
