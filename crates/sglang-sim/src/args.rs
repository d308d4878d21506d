//! Command-line parsing that behaves like SGLang's argparse front end.
//!
//! SGLang rejects unknown flags at start with `unrecognized arguments` and exit code 2; a bad
//! config rollout looks exactly like that in real life, so the simulator does the same. Flags that
//! matter to the simulation are parsed; a list of common SGLang flags is accepted and ignored.
//! Simulator-only knobs use the `--sim-` prefix, each also settable as `SGLANG_SIM_<NAME>` in the
//! environment (flag wins).

use std::collections::BTreeMap;
use std::time::Duration;

/// The program name argparse prints, as in `python -m sglang.launch_server`.
pub const PROG: &str = "launch_server.py";

/// The PD role of the simulated server (`--disaggregation-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `null`: a regular (non-disaggregated) server.
    Null,
    /// `prefill`: runs the prefill half and a bootstrap server.
    Prefill,
    /// `decode`: runs the decode half.
    Decode,
}

impl Mode {
    /// The name SGLang uses for the mode in `/server_info`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Null => "null",
            Mode::Prefill => "prefill",
            Mode::Decode => "decode",
        }
    }
}

/// Everything the simulator was asked to do.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// `--host` (default 127.0.0.1, as SGLang).
    pub host: String,
    /// `--port` (default 30000).
    pub port: u16,
    /// `--model-path` (required, as SGLang).
    pub model_path: String,
    /// `--served-model-name` (defaults to the model path).
    pub served_model_name: String,
    /// `--tp-size`.
    pub tp_size: u32,
    /// `--disaggregation-mode`.
    pub mode: Mode,
    /// `--disaggregation-bootstrap-port` (default 8998).
    pub bootstrap_port: u16,
    /// `--enable-metrics`.
    pub enable_metrics: bool,
    /// `--skip-server-warmup`.
    pub skip_warmup: bool,
    /// `--context-length` (accepted; used for `/v1/models` and the constants).
    pub context_length: u64,
    /// `--page-size`.
    pub page_size: u64,
    /// `--kv-cache-dtype` (default `auto`).
    pub kv_cache_dtype: String,
    /// `--disaggregation-transfer-backend` (default `mooncake`).
    pub transfer_backend: String,
    /// `--enable-pd-role-switch`: `/pd_role_switch` may flip the role at run time; every PD
    /// instance runs a bootstrap server; the metrics' `engine_type` is `dynamic`.
    pub enable_pd_role_switch: bool,
    /// `--disable-cuda-graph`: no decode graphs are captured (a flip to decode still asks for
    /// their footprint, measured on the real server).
    pub disable_cuda_graph: bool,
    /// Resolved as 0.5.23's `handle_pd_disaggregation` does (`arg_groups/pd_disaggregation_hook.py`):
    /// `--disable-radix-cache` given, or a decode started without
    /// `--disaggregation-decode-enable-radix-cache`. `/server_info` reports it; a run-time flip
    /// keeps it (the flag is resolved once, at start).
    pub disable_radix_cache: bool,
    /// `--disaggregation-decode-enable-radix-cache`: a decode keeps a radix cache and accounts for it.
    pub decode_radix_cache: bool,
    /// `--dp-size` / `--dp` (default 1).
    pub dp_size: u64,
    /// `--enable-dp-attention` (deprecated in 0.5.23: with `--dp-size N` it resolves to
    /// `attn_dp_size = N`, `dp_size = 1`; `/server_info` reports it set whenever attention DP runs).
    pub dp_attention: bool,
    /// `--attn-dp-size` / `--attention-data-parallel-size` (default 1), resolved as 0.5.23's
    /// `handle_deprecated_dp_attention` does: one scheduler, one KV pool and one stats series per
    /// attention-DP group.
    pub attn_dp_size: u32,
    /// `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT` (seconds, default 300, upstream
    /// `srt/environ.py`): how long a prefill holds a room's KV for its decode.
    pub bootstrap_timeout: Duration,
    /// `SGLANG_DISAGGREGATION_WAITING_TIMEOUT` (seconds, default 300): how long a decode waits
    /// for a room's KV before it fails the request.
    pub waiting_timeout: Duration,
    /// `SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL` (seconds, default 5, at least 2): how often a
    /// decode checks each cached prefill's bootstrap `/health`.
    pub heartbeat_interval: Duration,
    /// `SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE` (default 2, at least 1): failed heartbeats
    /// after which the decode drops that prefill's cached bootstrap info.
    pub heartbeat_failures: u32,
    /// `SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT` (seconds, default 1): how long a decode's send to
    /// a prefill's rank port may block before it counts as a failed send.
    pub send_timeout: Duration,
    /// Decode: how long a request whose transfer failed keeps its KV allocation
    /// (`SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`, on by default, for
    /// `SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT`, 30 s); `None`: off.
    pub deferred_release: Option<Duration>,
    /// `--dtype` (default `auto`: the model's, bfloat16 for the simulated model).
    pub dtype: String,
    /// `--page-size` as given (`None`: SGLang's default, resolved to 1 for the simulated backend).
    pub page_size_flag: Option<u64>,
    /// `--api-key`: every endpoint but `/health*`, `/ready*` and `/metrics*` needs
    /// `Authorization: Bearer KEY` (`srt/utils/auth.py`).
    pub api_key: Option<String>,
    /// `--admin-api-key`: the key of the admin routes ([`crate::server::ADMIN_ROUTES`]).
    pub admin_api_key: Option<String>,
    /// `--weight-version` (default `default`, as SGLang's `serving.py`): the version a server
    /// reports in `/model_info` until `/update_weights_from_disk` sets another.
    pub weight_version: String,
    /// Every flag as given, for the `server_args=` line and `/server_info`.
    pub given: BTreeMap<String, String>,
    /// The words parsed: the command line with its `--config` file merged in front, as
    /// `/server_info`'s `launch_command` records them.
    pub launch: Vec<String>,
    /// Simulator-only settings.
    pub sim: SimKnobs,
}

impl SimConfig {
    /// How many schedulers log stats: one per attention-DP group, one per data-parallel replica
    /// (`--dp-size N` alone: N servers' schedulers behind one DP controller).
    pub fn stats_ranks(&self) -> usize {
        (self.attn_dp_size.max(1) as usize) * (self.dp_size.max(1) as usize)
    }

    /// The TP width inside one attention-DP group.
    pub fn attn_tp_size(&self) -> u32 {
        (self.tp_size / self.attn_dp_size.max(1)).max(1)
    }

    /// The `tp_rank` of stats rank `r`: its attention-DP group's first rank (a data-parallel
    /// replica's ranks count from 0 within it: measured on the real 0.5.23 with `--dp-size 2`).
    pub fn stats_tp_rank(&self, r: usize) -> u32 {
        if self.dp_size > 1 {
            return 0;
        }
        u32::try_from(r).unwrap_or(0) * self.attn_tp_size()
    }

    /// Every scheduler, as `(tp_rank, dp_rank)`: each writes the constants.
    pub fn schedulers(&self) -> Vec<(u32, Option<u32>)> {
        let replicas = u32::try_from(self.dp_size.max(1)).unwrap_or(1);
        let mut out = Vec::new();
        for d in 0..replicas {
            for t in 0..self.tp_size {
                let dp = if self.dp_size > 1 {
                    Some(d)
                } else if self.attn_dp_size > 1 {
                    Some(t / self.attn_tp_size())
                } else {
                    None
                };
                out.push((t, dp));
            }
        }
        out
    }

    /// The `dp_rank` of stats rank `r` (`None`: no data parallelism, no label).
    pub fn stats_dp_rank(&self, r: usize) -> Option<u32> {
        self.dp_ranked().then(|| u32::try_from(r).unwrap_or(0))
    }

    /// Schedulers carry a `dp_rank` label (0.5.23: when `parallel.dp_rank` is set, i.e. with data
    /// parallelism of either kind).
    pub fn dp_ranked(&self) -> bool {
        self.attn_dp_size > 1 || self.dp_size > 1
    }

    /// The model's compute dtype: `--dtype`, or for `auto` the simulated model's own (bfloat16).
    pub fn model_dtype(&self) -> &'static str {
        match self.dtype.as_str() {
            "half" | "float16" => "float16",
            "float" | "float32" => "float32",
            _ => "bfloat16",
        }
    }

    /// The KV cache dtype as the scheduler resolves it (`kv_cache_dtype_str`, what a decode compares
    /// with its prefill's on first contact; `srt/mem_cache/kv_cache_dtype.py`): `auto` is the
    /// model's dtype, `bf16` and `bfloat16` are the same.
    pub fn resolved_kv_cache_dtype(&self) -> String {
        match self.kv_cache_dtype.as_str() {
            "auto" => self.model_dtype().to_string(),
            "bf16" | "bfloat16" => "bfloat16".into(),
            "fp8_e4m3" | "mxfp8" => "float8_e4m3fn".into(),
            "fp8_e5m2" => "float8_e5m2".into(),
            other => other.to_string(),
        }
    }
}

pub use crate::knobs::{PairCache, SimKnobs};

/// A parse failure, rendered the way argparse renders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError(pub String);

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "usage: {PROG} [-h] --model-path MODEL_PATH [options]\n{PROG}: error: {}", self.0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Value,
    Flag,
}

/// Flags the simulation uses (value-taking unless marked).
const USED: &[(&str, Kind)] = &[
    ("--host", Kind::Value),
    ("--port", Kind::Value),
    ("--model-path", Kind::Value),
    ("--model", Kind::Value),
    ("--served-model-name", Kind::Value),
    ("--tp-size", Kind::Value),
    ("--tp", Kind::Value),
    ("--disaggregation-mode", Kind::Value),
    ("--disaggregation-bootstrap-port", Kind::Value),
    ("--enable-metrics", Kind::Flag),
    ("--skip-server-warmup", Kind::Flag),
    ("--context-length", Kind::Value),
    ("--page-size", Kind::Value),
    ("--kv-cache-dtype", Kind::Value),
    ("--disaggregation-transfer-backend", Kind::Value),
    ("--dp-size", Kind::Value),
    ("--dp", Kind::Value),
    ("--enable-dp-attention", Kind::Flag),
    ("--attn-dp-size", Kind::Value),
    ("--attention-data-parallel-size", Kind::Value),
    ("--weight-version", Kind::Value),
    ("--enable-pd-role-switch", Kind::Flag),
    ("--disable-cuda-graph", Kind::Flag),
    ("--disable-radix-cache", Kind::Flag),
    ("--disaggregation-decode-enable-radix-cache", Kind::Flag),
];

/// Common SGLang flags that are accepted and have no effect on the simulation.
const IGNORED: &[(&str, Kind)] = &[
    ("--mem-fraction-static", Kind::Value),
    ("--trust-remote-code", Kind::Flag),
    ("--attention-backend", Kind::Value),
    ("--tokenizer-path", Kind::Value),
    ("--ep-size", Kind::Value),
    ("--chunked-prefill-size", Kind::Value),
    ("--max-running-requests", Kind::Value),
    ("--max-prefill-tokens", Kind::Value),
    ("--disaggregation-ib-device", Kind::Value),
    ("--log-level", Kind::Value),
    ("--log-level-http", Kind::Value),
    ("--decode-log-interval", Kind::Value),
    ("--enable-metrics-for-all-schedulers", Kind::Flag),
    ("--cuda-graph-max-bs", Kind::Value),
    ("--schedule-policy", Kind::Value),
    ("--watchdog-timeout", Kind::Value),
    ("--dtype", Kind::Value),
    ("--quantization", Kind::Value),
    ("--random-seed", Kind::Value),
    ("--api-key", Kind::Value),
    ("--admin-api-key", Kind::Value),
    ("--uvicorn-access-log-exclude-prefixes", Kind::Value),
    // The real server's flags on a CPU (tests/differential.rs starts both with the same ones).
    ("--load-format", Kind::Value),
    ("--device", Kind::Value),
    ("--disable-overlap-schedule", Kind::Flag),
    ("--max-total-tokens", Kind::Value),
    ("--sleep-on-idle", Kind::Flag),
    ("--disaggregation-decode-retraction-backup", Kind::Value),
    ("--revision", Kind::Value),
];

/// Simulator knobs: flag name (without `--sim-`), kind.
const SIM: &[(&str, Kind)] = &[
    ("version", Kind::Value),
    ("load-secs", Kind::Value),
    ("warmup-secs", Kind::Value),
    ("max-total-tokens", Kind::Value),
    ("tokens-per-sec", Kind::Value),
    ("idle-publish-secs", Kind::Value),
    ("health-generate-ms", Kind::Value),
    ("exit-code", Kind::Value),
    ("crash-after-ready", Kind::Value),
    ("never-ready", Kind::Flag),
    ("warn-traceback", Kind::Flag),
    ("no-load-endpoint", Kind::Flag),
    ("health-fail-after-ready", Kind::Value),
    ("no-metrics-publish", Kind::Flag),
    ("metrics-hang", Kind::Flag),
    ("flush-ready-on-stop", Kind::Flag),
    ("cache-never-idle", Kind::Flag),
    ("pair-cache", Kind::Value),
    ("prefill-secs", Kind::Value),
    ("slowdown", Kind::Value),
    ("fail-fraction", Kind::Value),
    ("faults-after", Kind::Value),
    ("weights-load-secs", Kind::Value),
    ("weights-fail", Kind::Flag),
    ("role-switch-fail", Kind::Flag),
    ("free-memory-gb", Kind::Value),
    ("graph-memory-gb", Kind::Value),
    ("role-switch-secs", Kind::Value),
];

fn kind_of(flag: &str) -> Option<Kind> {
    if let Some(k) = flag.strip_prefix("--sim-") {
        return SIM.iter().find(|(n, _)| *n == k).map(|(_, kind)| *kind);
    }
    USED.iter().chain(IGNORED).find(|(n, _)| *n == flag).map(|(_, kind)| *kind)
}

/// The names of every simulator knob, as `--sim-NAME` (for docs and tests).
pub fn sim_knob_names() -> impl Iterator<Item = &'static str> {
    SIM.iter().map(|(n, _)| *n)
}

/// Parse `args` (without the program name). `env` looks up `SGLANG_SIM_*` variables.
pub fn parse(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<SimConfig, ArgError> {
    let merged = crate::config_file::merge_config(args).map_err(ArgError)?;
    let args = merged.as_slice();
    let mut given: BTreeMap<String, String> = BTreeMap::new();
    let mut unknown: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let raw = &args[i];
        i += 1;
        let (flag, inline) = match raw.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (raw.clone(), None),
        };
        match kind_of(&flag) {
            None => unknown.push(raw.clone()),
            Some(Kind::Flag) => {
                if inline.is_some() {
                    return Err(ArgError(format!("argument {flag}: ignored explicit argument '{}'", inline.unwrap_or_default())));
                }
                given.insert(flag, "true".into());
            }
            Some(Kind::Value) => {
                let v = match inline {
                    Some(v) => v,
                    None => match args.get(i) {
                        Some(v) if !v.starts_with("--") => {
                            i += 1;
                            v.clone()
                        }
                        _ => return Err(ArgError(format!("argument {flag}: expected one argument"))),
                    },
                };
                given.insert(flag, v);
            }
        }
    }
    if !unknown.is_empty() {
        return Err(ArgError(format!("unrecognized arguments: {}", unknown.join(" "))));
    }
    let model_path = given
        .get("--model-path")
        .or_else(|| given.get("--model"))
        .cloned()
        .ok_or_else(|| ArgError("the following arguments are required: --model-path/--model".into()))?;
    let int = |flag: &str, default: u64| -> Result<u64, ArgError> {
        match given.get(flag) {
            None => Ok(default),
            Some(v) => v.parse::<u64>().map_err(|_| ArgError(format!("argument {flag}: invalid int value: '{v}'"))),
        }
    };
    let port = int("--port", 30000)?;
    let bootstrap_port = int("--disaggregation-bootstrap-port", 8998)?;
    for (flag, v) in [("--port", port), ("--disaggregation-bootstrap-port", bootstrap_port)] {
        if v > u64::from(u16::MAX) {
            return Err(ArgError(format!("argument {flag}: invalid port: '{v}'")));
        }
    }
    let tp_size = int(if given.contains_key("--tp") { "--tp" } else { "--tp-size" }, 1)?.max(1);
    let mode = match given.get("--disaggregation-mode").map(String::as_str) {
        None | Some("null") => Mode::Null,
        Some("prefill") => Mode::Prefill,
        Some("decode") => Mode::Decode,
        Some(other) => return Err(ArgError(format!("argument --disaggregation-mode: invalid choice: '{other}' (choose from 'null', 'prefill', 'decode')"))),
    };
    let sim = crate::knobs::parse(&given, env).map_err(ArgError)?;
    let mut dp_size = int(if given.contains_key("--dp") { "--dp" } else { "--dp-size" }, 1)?.max(1);
    let mut attn_dp = int(if given.contains_key("--attention-data-parallel-size") { "--attention-data-parallel-size" } else { "--attn-dp-size" }, 1)?.max(1);
    let dp_attention = given.contains_key("--enable-dp-attention");
    if dp_attention && attn_dp == 1 {
        (attn_dp, dp_size) = (dp_size, 1);
    }
    if tp_size % attn_dp != 0 {
        return Err(ArgError(format!("tp_size ({tp_size}) must be divisible by attn_dp_size ({attn_dp})")));
    }
    let deepseek_v4 = architecture(&model_path).as_deref() == Some("DeepseekV4ForCausalLM");
    Ok(SimConfig {
        host: given.get("--host").cloned().unwrap_or_else(|| "127.0.0.1".into()),
        port: port as u16,
        served_model_name: given.get("--served-model-name").cloned().unwrap_or_else(|| model_path.clone()),
        model_path,
        tp_size: u32::try_from(tp_size).unwrap_or(u32::MAX),
        mode,
        bootstrap_port: bootstrap_port as u16,
        enable_metrics: given.contains_key("--enable-metrics"),
        skip_warmup: given.contains_key("--skip-server-warmup"),
        context_length: int("--context-length", 163_840)?,
        page_size: if deepseek_v4 { DEEPSEEK_V4_PAGE_SIZE } else { int("--page-size", 1)?.max(1) },
        kv_cache_dtype: given.get("--kv-cache-dtype").cloned().unwrap_or_else(|| "auto".into()),
        transfer_backend: resolve_transfer_backend(given.get("--disaggregation-transfer-backend").map(String::as_str)),
        enable_pd_role_switch: given.contains_key("--enable-pd-role-switch"),
        disable_cuda_graph: given.contains_key("--disable-cuda-graph"),
        disable_radix_cache: given.contains_key("--disable-radix-cache")
            || (mode == Mode::Decode && !given.contains_key("--disaggregation-decode-enable-radix-cache")),
        decode_radix_cache: given.contains_key("--disaggregation-decode-enable-radix-cache"),
        dp_size,
        dp_attention: attn_dp > 1,
        attn_dp_size: u32::try_from(attn_dp).unwrap_or(u32::MAX),
        bootstrap_timeout: env_secs(env, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT")?,
        waiting_timeout: env_secs(env, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT")?,
        // `max(interval, 2)` and `max(failures, 1)`, as `disaggregation/common/conn.py` clamps them.
        heartbeat_interval: env_secs(env, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL")?.max(Duration::from_secs(2)),
        heartbeat_failures: (env_secs(env, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE")?.as_secs_f64() as u32).max(1),
        send_timeout: env_secs(env, "SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT")?,
        deferred_release: match env(DEFERRED_RELEASE_ENV).map(|v| v.trim().to_ascii_lowercase()) {
            Some(v) if matches!(v.as_str(), "0" | "false" | "no" | "off") => None,
            _ => Some(env_secs(env, "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT")?),
        },
        dtype: given.get("--dtype").cloned().unwrap_or_else(|| "auto".into()),
        page_size_flag: match given.get("--page-size") {
            None => None,
            Some(_) => Some(int("--page-size", 1)?),
        },
        api_key: given.get("--api-key").cloned(),
        admin_api_key: given.get("--admin-api-key").cloned(),
        weight_version: given.get("--weight-version").cloned().unwrap_or_else(|| "default".into()),
        given,
        launch: args.to_vec(),
        sim,
    })
}

/// The page size SGLang 0.5.23 forces for a `DeepseekV4ForCausalLM` model on a GPU, whatever
/// `--page-size` says (`arg_groups/model_overrides/deepseek_v4.py`): `/server_info` reports it,
/// while `launch_command` keeps what was asked.
pub const DEEPSEEK_V4_PAGE_SIZE: u64 = 256;

/// The model's architecture: `architectures[0]` of `config.json` in the model directory (`None`:
/// no such file, as in most simulated stacks).
fn architecture(model_path: &str) -> Option<String> {
    let text = std::fs::read_to_string(std::path::Path::new(model_path).join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("architectures")?.get(0)?.as_str().map(String::from)
}

/// The transfer backend as SGLang 0.5.23 resolves it (`arg_groups/pd_disaggregation_hook.py`):
/// `mooncake_tcp` is mooncake with `MC_FORCE_TCP=1`, reported as `mooncake`; unset is `mooncake`.
pub fn resolve_transfer_backend(given: Option<&str>) -> String {
    match given {
        None | Some("mooncake_tcp") => "mooncake".into(),
        Some(other) => other.to_string(),
    }
}

/// SGLang's disaggregation settings the simulator follows, with their defaults (upstream
/// `srt/environ.py`, 0.5.23; checked against the wheel by the conformance test).
pub const DISAGG_ENV: &[(&str, f64)] = &[
    ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0),
    ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0),
    ("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2.0),
    ("SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT", 1.0),
    ("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0),
];

/// Whether a decode keeps a failed request's KV allocation until the prefill acknowledges or the
/// timeout passes (0.5.23 `environ.py`: on by default; `disaggregation/decode.py`).
pub const DEFERRED_RELEASE_ENV: &str = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE";

/// The default of one of [`DISAGG_ENV`].
pub fn disagg_default(name: &str) -> f64 {
    DISAGG_ENV.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).unwrap_or(0.0)
}

/// One of SGLang's disaggregation settings from the environment (seconds or a count; its
/// [`DISAGG_ENV`] default when unset).
fn env_secs(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Duration, ArgError> {
    match env(name) {
        None => Ok(Duration::from_secs_f64(disagg_default(name))),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| ArgError(format!("environment {name}: invalid number of seconds: '{v}'"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<SimConfig, ArgError> {
        let v: Vec<String> = s.split_whitespace().map(String::from).collect();
        parse(&v, &|_| None)
    }

    #[test]
    fn parses_pd_prefill_flags() {
        let c = p("--model-path m --port 31000 --disaggregation-mode prefill --disaggregation-bootstrap-port 9000 --enable-metrics --tp 4 --mem-fraction-static 0.8 --trust-remote-code").unwrap();
        assert_eq!(c.port, 31000);
        assert_eq!(c.mode, Mode::Prefill);
        assert_eq!(c.bootstrap_port, 9000);
        assert!(c.enable_metrics);
        assert_eq!(c.tp_size, 4);
        assert_eq!(c.served_model_name, "m");
    }

    #[test]
    fn unknown_flag_is_rejected_like_argparse() {
        let e = p("--model-path m --collect-tokens-histogram").unwrap_err();
        assert_eq!(e.0, "unrecognized arguments: --collect-tokens-histogram");
        assert!(e.to_string().contains("launch_server.py: error: unrecognized arguments"));
    }

    #[test]
    fn missing_model_path_and_bad_values() {
        assert!(p("--port 1").unwrap_err().0.contains("required: --model-path"));
        assert!(p("--model-path m --port x").unwrap_err().0.contains("invalid int value: 'x'"));
        assert!(p("--model-path m --port").unwrap_err().0.contains("expected one argument"));
        assert!(p("--model-path m --disaggregation-mode both").unwrap_err().0.contains("invalid choice"));
    }

    #[test]
    fn sim_knobs_from_flag_and_env() {
        let v: Vec<String> = "--model-path m --sim-version 0.4.6 --sim-never-ready".split_whitespace().map(String::from).collect();
        let env = |k: &str| (k == "SGLANG_SIM_LOAD_SECS").then(|| "0.5".to_string());
        let c = parse(&v, &env).unwrap();
        assert_eq!(c.sim.version, crate::version::Version::parse("0.4.6").unwrap());
        assert!(c.sim.never_ready);
        assert_eq!(c.sim.load, Duration::from_millis(500));
        // The service faults, as a drop-in sets them (an environment variable) or as flags.
        let env = |k: &str| (k == "SGLANG_SIM_SLOWDOWN").then(|| "3".to_string());
        let v: Vec<String> = "--model-path m --sim-fail-fraction 0.1 --sim-prefill-secs 0.25".split_whitespace().map(String::from).collect();
        let c = parse(&v, &env).unwrap();
        assert_eq!((c.sim.slowdown, c.sim.fail_fraction, c.sim.prefill), (3.0, 0.1, Duration::from_millis(250)));
        assert_eq!(c.sim.faults_after, Duration::ZERO, "from the ready line on unless delayed");
        let env = |k: &str| (k == "SGLANG_SIM_FAULTS_AFTER").then(|| "40".to_string());
        assert_eq!(parse(&v, &env).unwrap().sim.faults_after, Duration::from_secs(40));
        assert!(p("--model-path m --sim-fail-fraction 1.5").unwrap_err().0.contains("between 0 and 1"));
    }
}
