//! SGLang's KV-cache gauges under every version's names, with sanity checks and a diagnosis when
//! they are missing. Names by release (upstream `sgl-project/sglang`,
//! `srt/observability/metrics_collector.py`): `num_used_tokens` and `token_usage` since 0.4.6,
//! `max_total_num_tokens` from 0.5.6, `kv_used_tokens` / `kv_available_tokens` /
//! `kv_evictable_tokens` from 0.5.11; `sglang:` prefix, or `sglang_` when scraped as OpenMetrics.

use crate::prom::Exposition;

/// A logical gauge and the names SGLang versions gave it (without the `sglang:`/`sglang_` prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// KV pool size (`max_total_num_tokens`, ≥0.5.6).
    MaxTotalTokens,
    /// Rounded usage ratio (`token_usage`, every version).
    TokenUsage,
    /// Tokens in use (`kv_used_tokens` ≥0.5.11, else `num_used_tokens`).
    UsedTokens,
    /// Free slots (`kv_available_tokens`, ≥0.5.11).
    AvailableTokens,
    /// Cached, unreferenced slots (`kv_evictable_tokens`, ≥0.5.11).
    EvictableTokens,
    /// Running requests.
    RunningReqs,
    /// Queued requests.
    QueueReqs,
}

impl Gauge {
    /// Names by preference.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Gauge::MaxTotalTokens => &["max_total_num_tokens"],
            Gauge::TokenUsage => &["token_usage", "full_token_usage"],
            Gauge::UsedTokens => &["kv_used_tokens", "num_used_tokens"],
            Gauge::AvailableTokens => &["kv_available_tokens"],
            Gauge::EvictableTokens => &["kv_evictable_tokens"],
            Gauge::RunningReqs => &["num_running_reqs"],
            Gauge::QueueReqs => &["num_queue_reqs"],
        }
    }
}

/// The SGLang part of a sample name (`sglang:x` or `sglang_x` → `x`).
pub fn sglang_suffix(name: &str) -> Option<&str> {
    name.strip_prefix("sglang:").or_else(|| name.strip_prefix("sglang_"))
}

/// Value of a logical gauge: the first name that exists, max over its series (several TP ranks
/// and label sets per name are normal), and which name it came from.
pub fn value(e: &Exposition, g: Gauge) -> Option<(f64, &'static str)> {
    for n in g.names() {
        let v = e
            .samples
            .iter()
            .filter(|s| sglang_suffix(&s.name) == Some(n) && !s.value.is_nan())
            .map(|s| s.value)
            .fold(None, |acc: Option<f64>, v| Some(acc.map_or(v, |a| a.max(v))));
        if let Some(v) = v {
            return Some((v, n));
        }
    }
    None
}

/// What the KV gauges say.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KvReport {
    /// KV pool size, when exported.
    pub max_total_tokens: Option<f64>,
    /// `token_usage`.
    pub token_usage: f64,
    /// Tokens in use.
    pub used_tokens: f64,
    /// Free slots, when exported.
    pub available_tokens: Option<f64>,
    /// Evictable slots, when exported.
    pub evictable_tokens: Option<f64>,
    /// Running requests, when exported.
    pub running_reqs: Option<f64>,
    /// Queued requests, when exported.
    pub queue_reqs: Option<f64>,
    /// The names the values were read from.
    pub names: Vec<String>,
}

/// Why the KV gauges do not pass.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvProblem {
    /// Reachable, but no SGLang usage gauges yet (they appear on the first batch or after 30 s idle).
    #[error("/metrics answers but SGLang has not published its usage gauges yet ({found} other sglang series present): they appear on the first prefill batch, every 40 decode steps, or after 30 s idle")]
    NotPublished {
        /// How many `sglang` series exist (constants).
        found: usize,
    },
    /// SGLang gauges exist, but not the required ones under any known name.
    #[error("/metrics has SGLang gauges but not {missing} under any known name; closest: {closest}")]
    OtherNames {
        /// The logical gauge missing.
        missing: String,
        /// Nearby names found.
        closest: String,
    },
    /// Values out of range.
    #[error("KV gauges are not sane: {0}")]
    Insane(String),
}

/// Check the KV gauges of one exposition.
pub fn check(e: &Exposition) -> Result<KvReport, KvProblem> {
    let sglang: Vec<&str> = e.samples.iter().filter_map(|s| sglang_suffix(&s.name)).collect();
    let usage = value(e, Gauge::TokenUsage);
    let used = value(e, Gauge::UsedTokens);
    let (Some((token_usage, un)), Some((used_tokens, kn))) = (usage, used) else {
        // The scheduler's stats gauges all appear together, at its first log_stats(); constants
        // and tokenizer counters can exist before that.
        const STATS: [&str; 9] = [
            "token_usage",
            "num_used_tokens",
            "full_token_usage",
            "kv_used_tokens",
            "kv_available_tokens",
            "num_running_reqs",
            "num_queue_reqs",
            "gen_throughput",
            "cache_hit_rate",
        ];
        if !sglang.iter().any(|n| STATS.contains(n)) {
            return Err(KvProblem::NotPublished { found: sglang.len() });
        }
        let missing = if usage.is_none() { "token_usage" } else { "kv_used_tokens/num_used_tokens" };
        let mut closest: Vec<&str> = sglang.iter().copied().filter(|n| n.contains("token") || n.contains("usage") || n.contains("kv")).collect();
        closest.sort_unstable();
        closest.dedup();
        closest.truncate(6);
        return Err(KvProblem::OtherNames {
            missing: missing.into(),
            closest: if closest.is_empty() { "none".into() } else { closest.iter().map(|n| format!("sglang:{n}")).collect::<Vec<_>>().join(", ") },
        });
    };
    let max = value(e, Gauge::MaxTotalTokens).map(|v| v.0);
    let avail = value(e, Gauge::AvailableTokens).map(|v| v.0);
    let evict = value(e, Gauge::EvictableTokens).map(|v| v.0);
    if !(0.0..=1.0).contains(&token_usage) {
        return Err(KvProblem::Insane(format!("sglang:{un} = {token_usage} is outside 0..1")));
    }
    if used_tokens < 0.0 || !used_tokens.is_finite() {
        return Err(KvProblem::Insane(format!("sglang:{kn} = {used_tokens}")));
    }
    if let Some(m) = max {
        if m <= 0.0 || !m.is_finite() {
            return Err(KvProblem::Insane(format!("sglang:max_total_num_tokens = {m} (must be > 0)")));
        }
        if used_tokens > m {
            return Err(KvProblem::Insane(format!("used tokens {used_tokens} exceed max_total_num_tokens {m}")));
        }
        if let (Some(a), Some(v)) = (avail, evict) {
            let sum = used_tokens + a + v;
            if (sum - m).abs() > (m * 0.001).max(1.0) {
                return Err(KvProblem::Insane(format!("kv used {used_tokens} + available {a} + evictable {v} = {sum}, not max_total_num_tokens {m}")));
            }
        }
    }
    let mut names = vec![format!("sglang:{un}"), format!("sglang:{kn}")];
    if max.is_some() {
        names.push("sglang:max_total_num_tokens".into());
    }
    Ok(KvReport {
        max_total_tokens: max,
        token_usage,
        used_tokens,
        available_tokens: avail,
        evictable_tokens: evict,
        running_reqs: value(e, Gauge::RunningReqs).map(|v| v.0),
        queue_reqs: value(e, Gauge::QueueReqs).map(|v| v.0),
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::parse;

    #[test]
    fn new_names_with_both_prefixes_and_several_series() {
        for p in ["sglang:", "sglang_"] {
            let t = format!("{p}max_total_num_tokens{{tp_rank=\"0\"}} 1000.0\n{p}max_total_num_tokens{{tp_rank=\"1\"}} 1000.0\n{p}token_usage{{a=\"b\"}} 0.1\n{p}kv_used_tokens{{a=\"b\"}} 100.0\n{p}kv_available_tokens{{a=\"b\"}} 850.0\n{p}kv_evictable_tokens{{a=\"b\"}} 50.0\n");
            let r = check(&parse(&t).unwrap()).unwrap();
            assert_eq!(r.used_tokens, 100.0);
            assert_eq!(r.max_total_tokens, Some(1000.0));
        }
    }

    #[test]
    fn old_names_pass() {
        let r = check(
            &parse("sglang:token_usage{engine_type=\"unified\",model_name=\"m\"} 0.0\nsglang:num_used_tokens{engine_type=\"unified\",model_name=\"m\"} 3.0\n")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(r.used_tokens, 3.0);
        assert_eq!(r.max_total_tokens, None);
    }

    #[test]
    fn diagnoses() {
        assert!(matches!(check(&parse("sglang:max_total_num_tokens{a=\"b\"} 10.0\n").unwrap()), Err(KvProblem::NotPublished { found: 1 })));
        assert!(matches!(check(&parse("").unwrap()), Err(KvProblem::NotPublished { found: 0 })));
        let e = check(&parse("sglang:token_usage_v2{a=\"b\"} 0.1\nsglang:num_running_reqs{a=\"b\"} 0.0\n").unwrap()).unwrap_err();
        assert!(e.to_string().contains("closest: sglang:token_usage_v2"), "{e}");
        let e = check(&parse("sglang:token_usage{} 1.5\nsglang:num_used_tokens{} 1.0\n").unwrap()).unwrap_err();
        assert!(matches!(e, KvProblem::Insane(_)));
        let e = check(&parse("sglang:max_total_num_tokens{} 1000\nsglang:token_usage{} 0.1\nsglang:kv_used_tokens{} 100\nsglang:kv_available_tokens{} 100\nsglang:kv_evictable_tokens{} 100\n").unwrap()).unwrap_err();
        assert!(e.to_string().contains("not max_total_num_tokens"), "{e}");
    }
}
