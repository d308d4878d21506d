//! PD pairs: what a pair probe saw, what it means, and whether two servers' settings let them
//! pair at all.
//!
//! A PD request is a pair: the router sends the same request to a prefill and a decode with the
//! prefill's `bootstrap_host`/`bootstrap_port` and a random `bootstrap_room`; the decode asks the
//! prefill's bootstrap server where that prefill *process* serves its KV (per-rank ports),
//! caches the answer per bootstrap address, and fetches the room's KV. SGLang before upstream PR
//! 36029 (merged 2026-08-23) keeps that cache after the prefill restarts on the same address —
//! always the case on a systemd host — and every request from the decode then fails until the
//! decode restarts; after the fix one request fails and the next refetches. Prefill and decode
//! must agree on `page_size` and `kv_cache_dtype` and use the same transfer backend, or every
//! transfer fails. Their attention-DP widths may differ: 0.5.23's prefill registers its width with
//! its bootstrap server (`disaggregation/common/conn.py`, `_handle_route_put`) and the decode
//! picks the prefill's rank from it (`disaggregation/decode.py`, `_resolve_prefill_dp_rank`:
//! `bootstrap_room % prefill dp_size`), as DeepSeek's deployments pair a DP-32 prefill with a
//! DP-72 decode; a width the server itself refuses ([`width_problem`]) is refused before a restart.
//!
//! The pair gate ([`crate::engine`]) sends such a pair itself, straight to the two servers, and
//! [`diagnose`] reads the answers by their signature.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

pub use crate::pair_probe::{Half, PairProbe, PdQueues};

/// What a pair probe means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The decode answered 200: they pair.
    Paired,
    /// The decode's transfer from a prefill process newer than itself failed (or never came):
    /// it still uses the old process's bootstrap info.
    Stale,
    /// Their settings disagree: no transfer can work.
    Incompatible(Vec<Mismatch>),
    /// The prefill half failed on its own.
    PrefillBroken(String),
    /// The decode failed for a reason other than the transfer.
    DecodeBroken(String),
    /// The transfer failed, and no restart explains it.
    TransferFailed(String),
}

impl Verdict {
    /// Stable name for events and status.
    pub fn as_str(&self) -> &'static str {
        self.outcome().as_str()
    }

    /// What the probe found, as events and status name it.
    pub fn outcome(&self) -> crate::details::PairOutcome {
        use crate::details::PairOutcome;
        match self {
            Verdict::Paired => PairOutcome::Paired,
            Verdict::Stale => PairOutcome::Stale,
            Verdict::Incompatible(_) => PairOutcome::Incompatible,
            Verdict::PrefillBroken(_) => PairOutcome::PrefillBroken,
            Verdict::DecodeBroken(_) => PairOutcome::DecodeBroken,
            Verdict::TransferFailed(_) => PairOutcome::TransferFailed,
        }
    }
}

/// Read a pair probe. `mismatches`: the two servers' settings compared ([`compare`]), fetched
/// only after a failure; `decode_older`: the decode's process started before the prefill's
/// current one (it paired with an older prefill process), when known.
pub fn diagnose(p: &PairProbe, mismatches: &[Mismatch], decode_older: Option<bool>) -> Verdict {
    if p.decode.ok() {
        return Verdict::Paired;
    }
    if !mismatches.is_empty() {
        return Verdict::Incompatible(mismatches.to_vec());
    }
    let prefill_own_failure = match &p.prefill {
        Half::Unreachable { error } => Some(error.clone()),
        Half::Answered { status, body } if *status != 200 && !crate::sglang::is_transfer_failure(body) => Some(p.prefill.describe()),
        _ => None,
    };
    if let Some(why) = prefill_own_failure {
        return Verdict::PrefillBroken(why);
    }
    let transfer = match &p.decode {
        Half::NoAnswer => true,
        Half::Answered { status, body } => *status >= 500 && crate::sglang::is_transfer_failure(body),
        Half::Unreachable { .. } => false,
    };
    if !transfer {
        return Verdict::DecodeBroken(p.decode.describe());
    }
    match decode_older {
        Some(false) => Verdict::TransferFailed(p.decode.describe()),
        _ => Verdict::Stale,
    }
}

/// A setting two servers must agree on, and their values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// SGLang's name (`page_size`, `kv_cache_dtype`, `disaggregation_transfer_backend`).
    pub key: String,
    /// The value on one side.
    pub ours: String,
    /// The value on the other.
    pub theirs: String,
}

/// The settings a prefill and a decode must agree on, as strings (SGLang's defaults when unset).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairSettings {
    /// `--page-size` (default 1).
    pub page_size: String,
    /// `--kv-cache-dtype` (default `auto`).
    pub kv_cache_dtype: String,
    /// `--disaggregation-transfer-backend` (default `mooncake`).
    pub transfer_backend: String,
    /// The attention-DP width as 0.5.23 resolves it (`--attn-dp-size N`, or the deprecated
    /// `--dp-size N --enable-dp-attention`); `None` without attention DP. Shown, not compared:
    /// the decode reads the prefill's width from its bootstrap server.
    pub attn_dp_size: Option<String>,
}

/// The parallel layout an ExecStart asks for, resolved as 0.5.23's `handle_deprecated_dp_attention`
/// resolves it: `(tp_size, attn_dp_size, dp_size)`.
pub fn parallel_of_argv(argv: &[String]) -> (u64, u64, u64) {
    let get = |names: &[&str]| last_value(argv, names).and_then(|v| v.trim().parse::<u64>().ok());
    let tp = get(&["--tp-size", "--tp", "--tensor-parallel-size"]).unwrap_or(1);
    let mut dp = get(&["--dp-size", "--dp", "--data-parallel-size"]).unwrap_or(1);
    let mut attn = get(&["--attn-dp-size", "--attention-data-parallel-size"]).unwrap_or(1);
    if argv.iter().any(|a| a == "--enable-dp-attention") && attn == 1 {
        (attn, dp) = (dp, 1);
    }
    (tp, attn, dp)
}

/// A parallel layout SGLang 0.5.23 refuses to start with (`arg_groups/parallel_hook.py`: "tp_size
/// must be divisible by attn_dp_size * attn_cp_size"; `--dp-size` beside `--attn-dp-size`), said
/// with the flags.
pub fn width_problem(argv: &[String]) -> Option<String> {
    let (tp, attn, dp) = parallel_of_argv(argv);
    if attn == 0 || tp % attn != 0 {
        return Some(format!("--attn-dp-size {attn} does not divide --tp-size {tp} (SGLang: \"tp_size must be divisible by attn_dp_size * attn_cp_size\")"));
    }
    (attn > 1 && dp > 1)
        .then(|| format!("--dp-size {dp} beside --attn-dp-size {attn}: SGLang 0.5.23 refuses replicas of an attention-DP server; give one of them"))
}

/// The value of the last of `names` in `argv` (`--flag V` or `--flag=V`), as argparse keeps it.
/// The words after `--flag` up to the next flag are its value, joined by a space (SGLang takes
/// no positional arguments; `launch_command` splits a value with a space into words).
pub fn last_value(argv: &[String], names: &[&str]) -> Option<String> {
    let mut found = None;
    let mut it = argv.iter().peekable();
    while let Some(a) = it.next() {
        if names.iter().any(|n| a == n) {
            let mut words = Vec::new();
            while let Some(w) = it.next_if(|w| !w.starts_with("--")) {
                words.push(w.as_str());
            }
            if !words.is_empty() {
                found = Some(words.join(" "));
            }
            continue;
        }
        if let Some(v) = names.iter().find_map(|n| a.strip_prefix(n).and_then(|r| r.strip_prefix('='))) {
            found = Some(v.to_string());
        }
    }
    found
}

/// The settings an ExecStart's argv asks for (`--flag value` and `--flag=value`; a flag given
/// twice — a `--config` file's and the command line's — is the last, as argparse takes it).
pub fn settings_of_argv(argv: &[String]) -> PairSettings {
    let get = |names: &[&str]| last_value(argv, names);
    let (_, attn_dp, _) = parallel_of_argv(argv);
    let backends: Vec<String> = ["--attention-backend", "--decode-attention-backend", "--prefill-attention-backend"].iter().filter_map(|f| get(&[f])).collect();
    PairSettings {
        page_size: resolve_page_size(get(&["--page-size"]).as_deref(), &backends),
        kv_cache_dtype: resolve_kv_dtype(get(&["--kv-cache-dtype"]).as_deref(), get(&["--dtype"]).as_deref()),
        transfer_backend: get(&["--disaggregation-transfer-backend"]).unwrap_or_else(|| "mooncake".into()),
        attn_dp_size: (attn_dp > 1).then(|| attn_dp.to_string()),
    }
}

/// The page size a server runs with (SGLang 0.5.23, `arg_groups/overrides.py`): `--page-size`
/// (unset: 1), then each backend's constraint in the wheel's order, each on the value the one
/// before left (`_mla_backend_page_constraints`): `flashmla` → 64; `trtllm_mla`, `cutedsl_mla`
/// unless 32 or 64 → 64; `trtllm_mha` unless 16, 32, 64 or 128 → 64; `hpc_ops` unless 64 → 64;
/// then `_fa4_page_constraint`: `fa4` → 128 (the wheel does so for a non-MLA model on a
/// Blackwell GPU, where FA4 runs; pdctl cannot see the GPU from a command line and assumes it).
pub fn resolve_page_size(given: Option<&str>, backends: &[String]) -> String {
    let page = given.map(str::trim).filter(|g| !g.is_empty() && *g != "None" && *g != "null").unwrap_or("1");
    let has = |b: &str| backends.iter().any(|x| x == b);
    let Ok(mut n) = page.parse::<u64>() else { return page.to_string() };
    if has("flashmla") {
        n = 64;
    }
    if (has("trtllm_mla") || has("cutedsl_mla")) && !matches!(n, 32 | 64) {
        n = 64;
    }
    if has("trtllm_mha") && !matches!(n, 16 | 32 | 64 | 128) {
        n = 64;
    }
    if has("hpc_ops") && n != 64 {
        n = 64;
    }
    if has("fa4") {
        n = 128;
    }
    n.to_string()
}

/// The KV cache dtype a server compares with its PD peer's, resolved as SGLang 0.5.23 does
/// (`mem_cache/kv_cache_dtype.py`; the decode raises `KV cache dtype mismatch` on the resolved
/// strings): `bf16` and `bfloat16` are the same; `auto` is the model's dtype — known when
/// `--dtype` names it, else left as `auto (the model's dtype)`, which only another `auto` equals.
pub fn resolve_kv_dtype(kv: Option<&str>, dtype: Option<&str>) -> String {
    let model = match dtype.map(str::trim) {
        Some("bfloat16" | "bf16") => Some("bfloat16"),
        Some("float16" | "half" | "fp16") => Some("float16"),
        Some("float32" | "float") => Some("float32"),
        _ => None,
    };
    match kv.map(str::trim).unwrap_or("auto") {
        "auto" | "" | "None" | "null" => model.unwrap_or("auto (the model's dtype)").to_string(),
        "bf16" | "bfloat16" => "bfloat16".into(),
        "fp8_e4m3" | "mxfp8" => "float8_e4m3fn".into(),
        "fp8_e5m2" => "float8_e5m2".into(),
        other => other.to_string(),
    }
}

/// The settings a running server reports in `/server_info` (SGLang lists every server arg there).
pub fn settings_of_info(info: &Value) -> PairSettings {
    let s = |k: &str, default: &str| match info.get(k) {
        Some(Value::String(v)) => v.clone(),
        Some(Value::Null) | None => default.to_string(),
        Some(v) => v.to_string(),
    };
    // 0.5.23 reports the resolved `attn_dp_size`; a server before it, `dp_size` with
    // `enable_dp_attention`.
    let number = |k: &str| info.get(k).and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())));
    let dp_attention = info.get("enable_dp_attention").and_then(Value::as_bool).unwrap_or(false);
    let attn_dp = number("attn_dp_size").unwrap_or(if dp_attention { number("dp_size").unwrap_or(1) } else { 1 });
    let backends: Vec<String> = ["attention_backend", "decode_attention_backend", "prefill_attention_backend"]
        .iter()
        .filter_map(|k| info.get(*k).and_then(Value::as_str).map(String::from))
        .collect();
    let given = |k: &str| match info.get(k) {
        Some(Value::String(v)) => Some(v.clone()),
        Some(Value::Null) | None => None,
        Some(v) => Some(v.to_string()),
    };
    PairSettings {
        page_size: resolve_page_size(given("page_size").as_deref(), &backends),
        kv_cache_dtype: resolve_kv_dtype(given("kv_cache_dtype").as_deref(), given("dtype").as_deref()),
        transfer_backend: s("disaggregation_transfer_backend", "mooncake"),
        attn_dp_size: (attn_dp > 1).then(|| attn_dp.to_string()),
    }
}

/// Where `ours` and `theirs` disagree on something pairing needs.
pub fn compare(ours: &PairSettings, theirs: &PairSettings) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mut check = |key: &str, a: &str, b: &str| {
        if a != b {
            out.push(Mismatch { key: key.into(), ours: a.into(), theirs: b.into() });
        }
    };
    check("page_size", &ours.page_size, &theirs.page_size);
    check("kv_cache_dtype", &ours.kv_cache_dtype, &theirs.kv_cache_dtype);
    check("disaggregation_transfer_backend", &ours.transfer_backend, &theirs.transfer_backend);
    out
}

/// `page_size 16 (prefill) vs 1 (decode)`, for sentences.
pub fn describe(mismatches: &[Mismatch], ours: &str, theirs: &str) -> String {
    mismatches.iter().map(|m| format!("{} {} ({ours}) vs {} ({theirs})", m.key, m.ours, m.theirs)).collect::<Vec<_>>().join(", ")
}

/// The bootstrap host of a prefill: the host of its URL, as the router derives it.
pub fn bootstrap_host(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or(rest);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6).to_string();
    }
    authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(authority).to_string()
}

/// A random `bootstrap_room` (a u63, as the router draws it).
pub fn room() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish() >> 1
}

/// Preflight of a decode: when `pair_timeout` cannot cover the decode's own timing. A decode
/// drops a stale cached prefill by itself only at its waiting timeout (or a failed send, or its
/// heartbeat); a probe given up earlier cannot tell that from a decode that never heals.
pub fn timing_risk(unit: &str, timing: &crate::sglang::DecodeTiming, pair_timeout: Duration) -> Option<String> {
    (pair_timeout < timing.waiting_timeout).then(|| {
        let heals = second_probe_waits(pair_timeout, timing);
        format!(
            "{unit}: [verify] pair_timeout ({}s) is shorter than its {}={}s: a pair probe stuck on a stale cached prefill is given up before this decode drops the entry by itself; {}; set {}=20 on the decode (or pair_timeout = \"{}s\") to judge within one probe",
            pair_timeout.as_secs(),
            crate::sglang::WAITING_TIMEOUT_ENV,
            timing.waiting_timeout.as_secs(),
            if heals {
                "pdctl probes once more for up to the waiting timeout before calling the pair stale".to_string()
            } else {
                format!(
                    "pdctl does not wait that out (more than twice pair_timeout): the pair is called stale after the first probe and the decode repaired, sooner than its {} s",
                    timing.waiting_timeout.as_secs()
                )
            },
            crate::sglang::WAITING_TIMEOUT_ENV,
            timing.waiting_timeout.as_secs() + 10,
        )
    })
}

/// Whether a decode stuck on a stale cached prefill is waited out: its waiting timeout (when it
/// heals by itself) comes within twice `pair_timeout`. Measured on the real 0.5.23 server: a
/// prefill whose bootstrap server was back before the decode's second missed heartbeat (a quick
/// stop and start) leaves the decode on the old process's ports; its first request then hangs
/// until the waiting timeout — 300 s by default, longer than restarting the decode.
fn second_probe_waits(pair_timeout: Duration, timing: &crate::sglang::DecodeTiming) -> bool {
    timing.waiting_timeout <= pair_timeout * 2
}

/// How long the second pair probe may take, or `None`: no second probe, the first one's
/// verdict stands. When the first probe's decode half got no answer within `pair_timeout`, the
/// decode may heal by itself at its waiting timeout: the second probe waits it out (plus 10 s)
/// when that is within twice `pair_timeout`, else there is none (the pair is stale now, and its
/// repair is sooner). A failure that answered is probed once more within `pair_timeout`.
pub fn second_probe_limit(first: &PairProbe, pair_timeout: Duration, timing: &crate::sglang::DecodeTiming) -> Option<Duration> {
    if first.decode == Half::NoAnswer && timing.waiting_timeout >= pair_timeout {
        second_probe_waits(pair_timeout, timing).then(|| timing.waiting_timeout + Duration::from_secs(10))
    } else {
        Some(pair_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(prefill: Half, decode: Half) -> PairProbe {
        PairProbe { room: 1, prefill, decode, took: Duration::from_millis(5), abandoned: None }
    }
    fn answered(status: u16, body: &str) -> Half {
        Half::Answered { status, body: body.into() }
    }
    const STALE: &str = "Decode transfer failed for request rank=0 decode_req.req.rid='x' decode_req.req.bootstrap_room=1 with exception KVTransferError(bootstrap_room=1): Request 1 timed out after 3.0s in KVPoll.WaitingForInput";

    #[test]
    fn signatures() {
        assert_eq!(diagnose(&probe(answered(200, "{}"), answered(200, "{}")), &[], None), Verdict::Paired);
        // The decode waited for KV from a prefill process newer than itself.
        assert_eq!(diagnose(&probe(Half::NoAnswer, answered(500, STALE)), &[], Some(true)), Verdict::Stale);
        assert_eq!(diagnose(&probe(Half::NoAnswer, Half::NoAnswer), &[], Some(true)), Verdict::Stale);
        // The same failure with a prefill older than the decode is not a stale cache.
        assert!(matches!(diagnose(&probe(Half::NoAnswer, answered(500, STALE)), &[], Some(false)), Verdict::TransferFailed(_)));
        // The prefill failing on its own.
        assert!(matches!(diagnose(&probe(answered(500, "scheduler died"), answered(500, STALE)), &[], Some(true)), Verdict::PrefillBroken(_)));
        assert!(matches!(diagnose(&probe(Half::Unreachable { error: "refused".into() }, Half::NoAnswer), &[], Some(true)), Verdict::PrefillBroken(_)));
        // The decode failing on its own.
        assert!(matches!(diagnose(&probe(Half::NoAnswer, Half::Unreachable { error: "refused".into() }), &[], Some(true)), Verdict::DecodeBroken(_)));
        assert!(matches!(diagnose(&probe(Half::NoAnswer, answered(400, "bad request")), &[], Some(true)), Verdict::DecodeBroken(_)));
        // Settings that cannot pair win over every signature.
        let m = vec![Mismatch { key: "page_size".into(), ours: "16".into(), theirs: "1".into() }];
        assert!(matches!(diagnose(&probe(Half::NoAnswer, answered(500, STALE)), &m, Some(true)), Verdict::Incompatible(_)));
    }

    #[test]
    fn settings_from_flags_and_server_info() {
        let argv: Vec<String> = "sglang --page-size=16 --kv-cache-dtype fp8_e5m2 --disaggregation-mode prefill".split(' ').map(String::from).collect();
        let ours = settings_of_argv(&argv);
        assert_eq!(ours.page_size, "16");
        assert_eq!(ours.kv_cache_dtype, "float8_e5m2", "resolved as the decode compares it");
        assert_eq!(ours.attn_dp_size, None);
        let theirs = settings_of_info(&serde_json::json!({"page_size": 1, "kv_cache_dtype": "auto", "dp_size": 4, "enable_dp_attention": false}));
        let m = compare(&ours, &theirs);
        assert_eq!(m.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["page_size", "kv_cache_dtype"]);
        assert_eq!(describe(&m[..1], "prefill", "decode"), "page_size 16 (prefill) vs 1 (decode)");
        // Attention-DP widths are resolved (the deprecated spelling too) and may differ: the
        // decode reads the prefill's from its bootstrap server.
        let dp: Vec<String> = "x --enable-dp-attention --dp 8 --tp 8".split(' ').map(String::from).collect();
        assert_eq!(settings_of_argv(&dp).attn_dp_size.as_deref(), Some("8"));
        let new: Vec<String> = "x --attn-dp-size 8 --tp 8".split(' ').map(String::from).collect();
        assert_eq!(settings_of_argv(&new), settings_of_argv(&dp));
        assert!(compare(&settings_of_argv(&dp), &settings_of_argv(&[])).is_empty(), "a DP-8 prefill pairs with a decode without attention DP");
        let info = settings_of_info(&serde_json::json!({"attn_dp_size": 4, "dp_size": 1, "enable_dp_attention": true}));
        assert_eq!(info.attn_dp_size.as_deref(), Some("4"));
        // Unset flags are SGLang's defaults: equal to a server that reports them.
        assert!(compare(&settings_of_argv(&[]), &settings_of_info(&serde_json::json!({"page_size": 1}))).is_empty());
    }

    #[test]
    fn the_pair_verdict_follows_the_decodes_timing() {
        use crate::sglang::DecodeTiming;
        let defaults = DecodeTiming::of(&[]);
        assert_eq!((defaults.waiting_timeout, defaults.heartbeat_interval, defaults.heartbeat_failures), (Duration::from_secs(300), Duration::from_secs(5), 2));
        let quick = DecodeTiming::of(&["SGLANG_DISAGGREGATION_WAITING_TIMEOUT=3".into(), "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=0.5".into()]);
        assert_eq!(
            (quick.waiting_timeout, quick.heartbeat_interval),
            (Duration::from_secs(3), Duration::from_secs(2)),
            "the interval is at least 2 s, as SGLang clamps it"
        );
        let risk = timing_risk("d.service", &defaults, Duration::from_secs(30)).expect("30 s cannot cover 300 s");
        assert!(risk.contains("SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300s") && risk.contains("pair_timeout = \"310s\""), "{risk}");
        assert!(risk.contains("does not wait that out"), "{risk}");
        assert_eq!(timing_risk("d.service", &quick, Duration::from_secs(30)), None);
        let silent = PairProbe { room: 1, prefill: Half::NoAnswer, decode: Half::NoAnswer, took: Duration::from_secs(30), abandoned: None };
        assert_eq!(second_probe_limit(&silent, Duration::from_secs(30), &defaults), None, "300 s is not waited out: stale now, repaired sooner");
        assert_eq!(second_probe_limit(&silent, Duration::from_secs(30), &quick), Some(Duration::from_secs(30)));
        let forty = DecodeTiming::of(&["SGLANG_DISAGGREGATION_WAITING_TIMEOUT=40".into()]);
        assert_eq!(second_probe_limit(&silent, Duration::from_secs(30), &forty), Some(Duration::from_secs(50)), "40 s is waited out");
        assert!(timing_risk("d.service", &forty, Duration::from_secs(30)).is_some_and(|r| r.contains("probes once more")));
        let failed = PairProbe { decode: Half::Answered { status: 500, body: "x".into() }, ..silent };
        assert_eq!(second_probe_limit(&failed, Duration::from_secs(30), &defaults), Some(Duration::from_secs(30)), "a failure that answered is not waited out");
    }

    #[test]
    fn settings_compare_resolved_values() {
        let argv = |a: &str| -> Vec<String> { a.split_whitespace().map(String::from).collect() };
        let bf16 = settings_of_argv(&argv("sglang --kv-cache-dtype bf16"));
        let bfloat16 = settings_of_argv(&argv("sglang --kv-cache-dtype=bfloat16"));
        assert!(compare(&bf16, &bfloat16).is_empty(), "bf16 = bfloat16");
        let auto_bf16_model = settings_of_argv(&argv("sglang --dtype bfloat16"));
        assert!(compare(&auto_bf16_model, &bf16).is_empty(), "auto is the model's dtype: {auto_bf16_model:?}");
        let auto_unknown = settings_of_argv(&argv("sglang"));
        assert_eq!(auto_unknown.kv_cache_dtype, "auto (the model's dtype)");
        assert!(compare(&auto_unknown, &settings_of_argv(&argv("sglang --kv-cache-dtype auto"))).is_empty());
        assert_eq!(compare(&auto_unknown, &bf16).len(), 1, "auto of an unknown model vs bfloat16 cannot be told equal");
        let fp8 = settings_of_argv(&argv("sglang --kv-cache-dtype fp8_e4m3"));
        assert_eq!(compare(&fp8, &bf16)[0].ours, "float8_e4m3fn");
        // Page size: unset is 1; the backends that need 64 change it.
        assert_eq!(settings_of_argv(&argv("sglang")).page_size, "1");
        assert_eq!(settings_of_argv(&argv("sglang --attention-backend flashmla")).page_size, "64");
        assert_eq!(settings_of_argv(&argv("sglang --attention-backend trtllm_mla --page-size 32")).page_size, "32");
        assert_eq!(settings_of_argv(&argv("sglang --attention-backend trtllm_mha --page-size 8")).page_size, "64");
        assert_eq!(settings_of_argv(&argv("sglang --attention-backend fa4")).page_size, "128");
        assert_eq!(settings_of_argv(&argv("sglang --prefill-attention-backend fa4 --page-size 16")).page_size, "128");
        let info = serde_json::json!({"page_size": null, "kv_cache_dtype": "bfloat16", "dtype": "auto", "attention_backend": "flashmla"});
        let running = settings_of_info(&info);
        assert_eq!((running.page_size.as_str(), running.kv_cache_dtype.as_str()), ("64", "bfloat16"));
    }

    #[test]
    fn a_width_sglang_refuses_is_named_with_its_flags() {
        let argv = |a: &str| -> Vec<String> { a.split_whitespace().map(String::from).collect() };
        assert_eq!(parallel_of_argv(&argv("s --tp 4 --dp-size 2 --enable-dp-attention")), (4, 2, 1), "the deprecated spelling");
        assert_eq!(width_problem(&argv("s --tp-size 4 --attn-dp-size 2")), None);
        assert_eq!(width_problem(&argv("s")), None);
        let p = width_problem(&argv("s --tp-size 4 --attn-dp-size 3")).expect("3 does not divide 4");
        assert!(p.starts_with("--attn-dp-size 3 does not divide --tp-size 4"), "{p}");
        let p = width_problem(&argv("s --tp-size 4 --attn-dp-size 2 --dp-size 2")).expect("replicas of an attention-DP server");
        assert!(p.contains("--dp-size 2 beside --attn-dp-size 2"), "{p}");
    }
}
