//! The simulator's own settings and fault knobs (`--sim-*` flags, `SGLANG_SIM_*` variables): what
//! no SGLang server has, kept apart from SGLang's flags (`args.rs` parses both).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::version::Version;

/// Simulator-only settings and fault knobs (`--sim-*` flags or `SGLANG_SIM_*` variables).
#[derive(Debug, Clone)]
pub struct SimKnobs {
    /// `--sim-version`: which SGLang release to imitate (metric names, labels, /health).
    pub version: Version,
    /// `--sim-load-secs`: time from start to the HTTP port opening (weights, KV pool, graphs).
    pub load: Duration,
    /// `--sim-warmup-secs`: time from the port opening to the ready line.
    pub warmup: Duration,
    /// `--sim-max-total-tokens`: KV pool size in tokens.
    pub max_total_tokens: u64,
    /// `--sim-tokens-per-sec`: decode speed per request, so that in-flight requests exist.
    pub tokens_per_sec: f64,
    /// `--sim-idle-publish-secs`: the idle metrics publish period (SGLang: 30 s).
    pub idle_publish: Duration,
    /// `--sim-health-generate-ms`: how long `/health` takes once up (SGLang waits ≥ 1 s).
    pub health_generate: Duration,
    /// `--sim-exit-code N`: fault: print an error and exit with N during start-up.
    pub exit_code: Option<i32>,
    /// `--sim-crash-after-ready SECS`: fault: the scheduler dies SECS after the ready line.
    pub crash_after_ready: Option<Duration>,
    /// `--sim-never-ready`: fault: the port opens but warmup never finishes.
    pub never_ready: bool,
    /// `--sim-warn-traceback`: log a non-fatal warning with a traceback before the ready line, as
    /// SGLang 0.5.23 does when its post-warmup `freeze_gc` fails (`entrypoints/http_server.py`,
    /// `logger.warning(..., exc_info=True)`); the start goes on to be ready.
    pub warn_traceback: bool,
    /// `--sim-no-load-endpoint`: fault: neither `/v1/loads` nor `/get_load` is served (a server
    /// pdctl cannot read its in-flight requests from).
    pub no_load_endpoint: bool,
    /// `--sim-health-fail-after-ready SECS`: fault: `/health` answers 503 from SECS after ready on.
    pub health_fail_after_ready: Option<Duration>,
    /// `--sim-no-metrics-publish`: fault: usage/KV gauges are never published.
    pub no_metrics_publish: bool,
    /// `--sim-metrics-hang`: fault: `/metrics` accepts the request and never answers.
    pub metrics_hang: bool,
    /// `--sim-flush-ready-on-stop`: fault: on SIGTERM the ready line is written again, as a
    /// block-buffered stderr flushes it at exit.
    pub flush_ready_on_stop: bool,
    /// `--sim-cache-never-idle`: fault: `/flush_cache` is always refused as SGLang refuses it on a
    /// scheduler that is never fully idle (a prefill whose bootstrap queue never empties under
    /// sustained load, paused or not).
    pub cache_never_idle: bool,
    /// `--sim-prefill-secs`: how long a prefill batch takes (0: no more than one token's time), so
    /// that time to first token lands in SGLang's buckets (its first bound is 0.1 s).
    pub prefill: Duration,
    /// `--sim-slowdown F`: fault: from the ready line on, prefill and every token take F times as
    /// long (a change that starts fine and serves slowly).
    pub slowdown: f64,
    /// `--sim-fail-fraction P`: fault: from the ready line on, a fraction P (0..1) of generation
    /// requests fails with a 500 (SGLang's answer to a request the scheduler aborted).
    pub fail_fraction: f64,
    /// `--sim-weights-load-secs`: how long `/update_weights_from_disk` takes to load (default 2).
    pub weights_load: Duration,
    /// `--sim-weights-fail`: fault: `/update_weights_from_disk` fails after its load time (the
    /// old weights stay), as a path without a loadable checkpoint does.
    pub weights_fail: bool,
    /// `--sim-role-switch-fail`: fault: a `/pd_role_switch` fails while rebuilding the new role,
    /// after tearing the old one down: the instance is left unhealthy, "restart required".
    pub role_switch_fail: bool,
    /// `--sim-free-memory-gb`: the device memory free for a flip to decode's CUDA graphs
    /// (default 12.4, the `available_gpu_mem` the startup log reports).
    pub free_memory_gb: f64,
    /// `--sim-graph-memory-gb`: what a decode's captured CUDA graphs take (default 2.5), reported
    /// as `sglang:graph_memory_usage_gb{phase="decode"}` where they are captured.
    pub graph_memory_gb: f64,
    /// `--sim-role-switch-secs`: how long a `/pd_role_switch`'s teardown and rebuild take
    /// (default 0.5).
    pub role_switch: Duration,
    /// `--sim-faults-after SECS`: the service faults (`--sim-slowdown`, `--sim-fail-fraction`)
    /// set in SECS after the ready line instead of at it: a change that serves well at first and
    /// badly later (a leak, a cache that fills), which only a bake sees.
    pub faults_after: Duration,
    /// `--sim-pair-cache`: what a decode does with a prefill's cached bootstrap info after a
    /// transfer to it failed.
    pub pair_cache: PairCache,
}

/// A decode's bootstrap-info cache, before and after upstream PR 36029 ("refresh stale prefill
/// bootstrap metadata", merged 2026-08-23).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairCache {
    /// After the fix: a failed transfer drops the entry; the next request refetches `/route`.
    Refresh,
    /// Before the fix: the entry stays; after its prefill restarts, every request fails until
    /// the decode restarts.
    Stale,
}

impl Default for SimKnobs {
    fn default() -> Self {
        SimKnobs {
            version: Version::LATEST,
            load: Duration::from_millis(2000),
            warmup: Duration::from_millis(1000),
            max_total_tokens: 524_288,
            tokens_per_sec: 200.0,
            idle_publish: Duration::from_secs(30),
            health_generate: Duration::from_millis(1000),
            exit_code: None,
            crash_after_ready: None,
            never_ready: false,
            warn_traceback: false,
            no_load_endpoint: false,
            health_fail_after_ready: None,
            no_metrics_publish: false,
            metrics_hang: false,
            flush_ready_on_stop: false,
            cache_never_idle: false,
            prefill: Duration::ZERO,
            slowdown: 1.0,
            fail_fraction: 0.0,
            faults_after: Duration::ZERO,
            weights_load: Duration::from_secs(2),
            weights_fail: false,
            role_switch_fail: false,
            free_memory_gb: 12.4,
            graph_memory_gb: 2.5,
            role_switch: Duration::from_millis(500),
            pair_cache: PairCache::Refresh,
        }
    }
}
/// The simulator's knobs from its `--sim-*` flags (`given`) or `SGLANG_SIM_*` variables (`env`);
/// `Err`: the sentence of the first one that does not parse.
pub(crate) fn parse(given: &BTreeMap<String, String>, env: &dyn Fn(&str) -> Option<String>) -> Result<SimKnobs, String> {
    let get = |name: &str| -> Option<String> {
        given.get(&format!("--sim-{name}")).cloned().or_else(|| env(&format!("SGLANG_SIM_{}", name.replace('-', "_").to_uppercase())))
    };
    let flag = |name: &str| -> bool { get(name).is_some_and(|v| !matches!(v.as_str(), "" | "0" | "false" | "no")) };
    let num = |name: &str| -> Result<Option<f64>, String> {
        match get(name) {
            None => Ok(None),
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(Some)
                .ok_or_else(|| format!("argument --sim-{name}: invalid non-negative number: '{v}'")),
        }
    };
    let secs = |name: &str| -> Result<Option<Duration>, String> { Ok(num(name)?.map(Duration::from_secs_f64)) };
    let mut k = SimKnobs::default();
    if let Some(v) = get("version") {
        k.version = Version::parse(&v).ok_or_else(|| format!("argument --sim-version: invalid version: '{v}' (expected like 0.5.23)"))?;
    }
    if let Some(d) = secs("load-secs")? {
        k.load = d;
    }
    if let Some(d) = secs("warmup-secs")? {
        k.warmup = d;
    }
    if let Some(n) = num("max-total-tokens")? {
        k.max_total_tokens = (n as u64).max(1);
    }
    if let Some(n) = num("tokens-per-sec")? {
        k.tokens_per_sec = n.max(0.001);
    }
    if let Some(d) = secs("idle-publish-secs")? {
        k.idle_publish = d;
    }
    if let Some(n) = num("health-generate-ms")? {
        k.health_generate = Duration::from_secs_f64(n / 1000.0);
    }
    if let Some(v) = get("exit-code") {
        k.exit_code = Some(v.parse::<i32>().map_err(|_| format!("argument --sim-exit-code: invalid int value: '{v}'"))?);
    }
    k.crash_after_ready = secs("crash-after-ready")?;
    k.never_ready = flag("never-ready");
    k.warn_traceback = flag("warn-traceback");
    k.no_load_endpoint = flag("no-load-endpoint");
    k.health_fail_after_ready = secs("health-fail-after-ready")?;
    k.no_metrics_publish = flag("no-metrics-publish");
    k.metrics_hang = flag("metrics-hang");
    k.flush_ready_on_stop = flag("flush-ready-on-stop");
    k.cache_never_idle = flag("cache-never-idle");
    if let Some(d) = secs("prefill-secs")? {
        k.prefill = d;
    }
    if let Some(f) = num("slowdown")? {
        k.slowdown = f.max(0.001);
    }
    if let Some(p) = num("fail-fraction")? {
        if p > 1.0 {
            return Err(format!("argument --sim-fail-fraction: a fraction is between 0 and 1, not {p}"));
        }
        k.fail_fraction = p;
    }
    if let Some(d) = secs("faults-after")? {
        k.faults_after = d;
    }
    if let Some(d) = secs("weights-load-secs")? {
        k.weights_load = d;
    }
    k.weights_fail = flag("weights-fail");
    k.role_switch_fail = flag("role-switch-fail");
    if let Some(d) = secs("role-switch-secs")? {
        k.role_switch = d;
    }
    if let Some(g) = num("free-memory-gb")? {
        k.free_memory_gb = g.max(0.0);
    }
    if let Some(g) = num("graph-memory-gb")? {
        k.graph_memory_gb = g.max(0.0);
    }
    if let Some(v) = get("pair-cache") {
        k.pair_cache = match v.as_str() {
            "refresh" => PairCache::Refresh,
            "stale" => PairCache::Stale,
            _ => return Err(format!("argument --sim-pair-cache: invalid choice: '{v}' (choose from 'refresh', 'stale')")),
        };
    }
    Ok(k)
}
