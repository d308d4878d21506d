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

/// The labels that tell SGLang's stats ranks apart (0.5.23 `observability/metrics_collector.py`,
/// `SchedulerMetricsCollector.init_new`): every scheduler writes its constants
/// (`max_total_num_tokens`) under its own `tp_rank`/`pp_rank`/`moe_ep_rank` (and `dp_rank` with
/// data parallelism); only a stats-logging rank (`attn_tp_rank == 0`: one per attention-DP group
/// and pipeline stage) writes the usage gauges. Other labels (`model_name`, `engine_type`, `pid`,
/// an operator's extra labels) do not name a rank.
pub const RANK_LABELS: [&str; 4] = ["dp_rank", "pp_rank", "tp_rank", "moe_ep_rank"];

/// One rank's label values, in [`RANK_LABELS`] order (absent labels are left out).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankId(Vec<(&'static str, String)>);

impl RankId {
    fn of(s: &crate::prom::Sample) -> RankId {
        // A worker's label values reach sentences and records: no control characters.
        let clean = |v: &str| v.chars().map(|c| if c.is_control() { '?' } else { c }).collect::<String>();
        RankId(RANK_LABELS.iter().filter_map(|k| s.label(k).map(|v| (*k, clean(v)))).collect())
    }

    /// The group of ranks that log one set of stats together: the same `dp_rank` and `pp_rank`
    /// (an attention-DP group's TP ranks share one KV pool, logged by its first rank).
    fn group(&self) -> RankId {
        RankId(self.0.iter().filter(|(k, _)| *k == "dp_rank" || *k == "pp_rank").cloned().collect())
    }
}

impl std::fmt::Display for RankId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("the server (no rank labels)");
        }
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

/// The SGLang part of a sample name (`sglang:x` or `sglang_x` → `x`).
pub fn sglang_suffix(name: &str) -> Option<&str> {
    name.strip_prefix("sglang:").or_else(|| name.strip_prefix("sglang_"))
}

/// The phases of a decode's captured device graphs in 0.5.23's `sglang:graph_memory_usage_gb`
/// (`model_executor/graph_memory_usage.py`): what a flip to decode captures.
pub const DECODE_GRAPH_PHASES: &[&str] = &["decode", "target_verify", "draft_decode", "draft_extend"];

/// A decode's captured graphs' footprint (GB): per scheduler, the phases of
/// [`DECODE_GRAPH_PHASES`] summed; the largest scheduler's (each has a device of its own).
/// `None`: not exported (a server before 0.5.23), or nothing captured (0 GB).
pub fn decode_graph_gb(e: &Exposition) -> Option<f64> {
    let mut per: std::collections::BTreeMap<Vec<(String, String)>, f64> = std::collections::BTreeMap::new();
    for s in e.samples.iter().filter(|s| sglang_suffix(&s.name) == Some("graph_memory_usage_gb") && s.value.is_finite()) {
        if !s.label("phase").is_some_and(|p| DECODE_GRAPH_PHASES.contains(&p)) {
            continue;
        }
        let rank: Vec<(String, String)> = s.labels.iter().filter(|(k, _)| k != "phase").cloned().collect();
        *per.entry(rank).or_default() += s.value;
    }
    per.into_values().reduce(f64::max).filter(|gb| *gb > 0.0)
}

/// A sample that stands for its rank: a per-priority breakdown (`priority="3"`) is part of the
/// rank's total (`priority=""`), never a rank of its own.
fn rank_total(s: &crate::prom::Sample) -> bool {
    s.label("priority").is_none_or(str::is_empty) && !s.value.is_nan()
}

/// A logical gauge's value per rank under the first of its names that exists, and that name.
fn per_rank(e: &Exposition, g: Gauge) -> Option<(std::collections::BTreeMap<RankId, f64>, &'static str)> {
    for n in g.names() {
        let mut m = std::collections::BTreeMap::new();
        for s in e.samples.iter().filter(|s| sglang_suffix(&s.name) == Some(n) && rank_total(s)) {
            // Two series of one rank (a `pid` label of a restarted process): the larger.
            let v = m.entry(RankId::of(s)).or_insert(s.value);
            *v = v.max(s.value);
        }
        if !m.is_empty() {
            return Some((m, n));
        }
    }
    None
}

/// One stats rank's KV gauges: the identity used + available + evictable = max holds here, per
/// rank (0.5.23 `pool_stats_observer.py`, `_get_token_info`), never across ranks.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RankKv {
    /// The rank's labels (`dp_rank=1,pp_rank=0,tp_rank=2,moe_ep_rank=2`).
    pub rank: String,
    /// Its KV pool size, when exported.
    pub max_total_tokens: Option<f64>,
    /// Its `token_usage`.
    pub token_usage: f64,
    /// Its tokens in use.
    pub used_tokens: f64,
    /// Its free slots, when exported.
    pub available_tokens: Option<f64>,
    /// Its evictable slots, when exported.
    pub evictable_tokens: Option<f64>,
    /// Its running requests, when exported.
    pub running_reqs: Option<f64>,
    /// Its queued requests, when exported.
    pub queue_reqs: Option<f64>,
}

/// What the KV gauges say: the server in total (token counts and requests summed over its stats
/// ranks, `token_usage` the fullest rank's) and each rank.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KvReport {
    /// KV pool size (every rank's pool), when exported.
    pub max_total_tokens: Option<f64>,
    /// `token_usage` of the fullest rank.
    pub token_usage: f64,
    /// Tokens in use (every rank).
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
    /// Each stats rank's gauges.
    pub ranks: Vec<RankKv>,
    /// Rank groups whose schedulers wrote their constants but no usage gauges yet (a DP rank
    /// that has run no batch publishes at its 30 s idle publish). Never in a report that
    /// passed, so not serialized when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpublished: Vec<String>,
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
    /// Some stats ranks published, others (named) not yet.
    #[error("{published} of {expected} stats ranks published their usage gauges; not yet: {missing} (a rank that has run no batch publishes at its idle publish, 30 s after its start)")]
    RanksUnpublished {
        /// Ranks that did.
        published: usize,
        /// Ranks expected (one per attention-DP group and pipeline stage).
        expected: usize,
        /// The groups that did not, as `dp_rank=1,pp_rank=0`.
        missing: String,
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

/// Check the KV gauges of one exposition: every stats rank published and each one sane.
pub fn check(e: &Exposition) -> Result<KvReport, KvProblem> {
    let r = read(e)?;
    if !r.unpublished.is_empty() {
        return Err(KvProblem::RanksUnpublished { published: r.ranks.len(), expected: r.ranks.len() + r.unpublished.len(), missing: r.unpublished.join("; ") });
    }
    Ok(r)
}

/// Read the KV gauges of one exposition, each published rank checked on its own; ranks not
/// published yet are listed in [`KvReport::unpublished`], not refused.
pub fn read(e: &Exposition) -> Result<KvReport, KvProblem> {
    let sglang: Vec<&str> = e.samples.iter().filter_map(|s| sglang_suffix(&s.name)).collect();
    let usage = per_rank(e, Gauge::TokenUsage);
    let used = per_rank(e, Gauge::UsedTokens);
    let (Some((usage, un)), Some((used, kn))) = (usage.clone(), used.clone()) else {
        return Err(not_there(&sglang, usage.is_none()));
    };
    let max = per_rank(e, Gauge::MaxTotalTokens).map(|v| v.0).unwrap_or_default();
    let avail = per_rank(e, Gauge::AvailableTokens).map(|v| v.0).unwrap_or_default();
    let evict = per_rank(e, Gauge::EvictableTokens).map(|v| v.0).unwrap_or_default();
    let running = per_rank(e, Gauge::RunningReqs).map(|v| v.0).unwrap_or_default();
    let queued = per_rank(e, Gauge::QueueReqs).map(|v| v.0).unwrap_or_default();
    // A rank whose constants carry other labels than its stats (an old version, an extra label):
    // one pool size across every rank is that rank's too.
    let only_max = {
        let mut vals: Vec<f64> = max.values().copied().collect();
        vals.dedup();
        (vals.len() == 1).then(|| vals[0])
    };
    let mut ranks = Vec::new();
    for (id, &u) in &used {
        let Some(&token_usage) = usage.get(id) else {
            return Err(KvProblem::Insane(format!("{id} exports sglang:{kn} but no sglang:{un}")));
        };
        let r = RankKv {
            rank: id.to_string(),
            max_total_tokens: max.get(id).copied().or(only_max),
            token_usage,
            used_tokens: u,
            available_tokens: avail.get(id).copied(),
            evictable_tokens: evict.get(id).copied(),
            running_reqs: running.get(id).copied(),
            queue_reqs: queued.get(id).copied(),
        };
        sane(&r, un, kn, used.len() > 1)?;
        ranks.push(r);
    }
    // Every group that wrote constants has one stats rank; the groups without one have not
    // published yet.
    let published: std::collections::BTreeSet<RankId> = used.keys().map(RankId::group).collect();
    let unpublished: Vec<String> =
        max.keys().map(RankId::group).collect::<std::collections::BTreeSet<_>>().difference(&published).map(|g| g.to_string()).collect();
    let sum = |f: fn(&RankKv) -> Option<f64>| -> Option<f64> { ranks.iter().map(f).sum() };
    let mut names = vec![format!("sglang:{un}"), format!("sglang:{kn}")];
    let max_total_tokens = sum(|r| r.max_total_tokens);
    if max_total_tokens.is_some() {
        names.push("sglang:max_total_num_tokens".into());
    }
    Ok(KvReport {
        max_total_tokens,
        token_usage: ranks.iter().map(|r| r.token_usage).fold(0.0, f64::max),
        used_tokens: ranks.iter().map(|r| r.used_tokens).sum::<f64>() + 0.0,
        available_tokens: sum(|r| r.available_tokens),
        evictable_tokens: sum(|r| r.evictable_tokens),
        running_reqs: sum(|r| r.running_reqs),
        queue_reqs: sum(|r| r.queue_reqs),
        names,
        ranks,
        unpublished,
    })
}

/// Why the KV gauges are not there: not published yet (no stats gauge at all), or published
/// under other names (the closest ones named); `usage_missing`: `token_usage` is the one missing.
fn not_there(sglang: &[&str], usage_missing: bool) -> KvProblem {
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
        return KvProblem::NotPublished { found: sglang.len() };
    }
    let missing = if usage_missing { "token_usage" } else { "kv_used_tokens/num_used_tokens" };
    let mut closest: Vec<&str> = sglang.iter().copied().filter(|n| n.contains("token") || n.contains("usage") || n.contains("kv")).collect();
    closest.sort_unstable();
    closest.dedup();
    closest.truncate(6);
    KvProblem::OtherNames {
        missing: missing.into(),
        closest: if closest.is_empty() { "none".into() } else { closest.iter().map(|n| format!("sglang:{n}")).collect::<Vec<_>>().join(", ") },
    }
}

/// One rank's gauges in range, and its identity. `several`: name the rank in the sentence.
fn sane(r: &RankKv, un: &str, kn: &str, several: bool) -> Result<(), KvProblem> {
    let at = if several { format!(" ({})", r.rank) } else { String::new() };
    let (token_usage, used_tokens) = (r.token_usage, r.used_tokens);
    if !(0.0..=1.0).contains(&token_usage) {
        return Err(KvProblem::Insane(format!("sglang:{un} = {token_usage} is outside 0..1{at}")));
    }
    if used_tokens < 0.0 || !used_tokens.is_finite() {
        return Err(KvProblem::Insane(format!("sglang:{kn} = {used_tokens}{at}")));
    }
    if let Some(m) = r.max_total_tokens {
        if m <= 0.0 || !m.is_finite() {
            return Err(KvProblem::Insane(format!("sglang:max_total_num_tokens = {m} (must be > 0){at}")));
        }
        if used_tokens > m {
            return Err(KvProblem::Insane(format!("used tokens {used_tokens} exceed max_total_num_tokens {m}{at}")));
        }
        if let (Some(a), Some(v)) = (r.available_tokens, r.evictable_tokens) {
            let sum = used_tokens + a + v;
            if (sum - m).abs() > (m * 0.001).max(1.0) {
                return Err(KvProblem::Insane(format!("kv used {used_tokens} + available {a} + evictable {v} = {sum}, not max_total_num_tokens {m}{at}")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod graph_tests {
    #[test]
    fn a_decodes_graph_footprint_is_its_decode_phases_on_its_largest_scheduler() {
        let text = "sglang:graph_memory_usage_gb{phase=\"prefill\",tp_rank=\"0\"} 9.0\n\
                    sglang:graph_memory_usage_gb{phase=\"decode\",tp_rank=\"0\"} 2.5\n\
                    sglang:graph_memory_usage_gb{phase=\"draft_decode\",tp_rank=\"0\"} 0.5\n\
                    sglang:graph_memory_usage_gb{phase=\"decode\",tp_rank=\"1\"} 2.75\n";
        let e = crate::prom::parse(text).unwrap();
        assert_eq!(super::decode_graph_gb(&e), Some(3.0));
        let none = crate::prom::parse("sglang:graph_memory_usage_gb{phase=\"decode\",tp_rank=\"0\"} 0.0\n").unwrap();
        assert_eq!(super::decode_graph_gb(&none), None);
        assert_eq!(super::decode_graph_gb(&crate::prom::parse("x 1\n").unwrap()), None);
    }
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

    /// Attention DP 2 as 0.5.23 exports it: every TP rank's constants, one stats series per DP
    /// group (its attn_tp_rank 0), each group's pool its own.
    fn dp2(rank1: Option<(u32, u32, u32)>) -> String {
        let l = |tp: u32, dp: u32| format!("{{dp_rank=\"{dp}\",engine_type=\"decode\",model_name=\"m\",moe_ep_rank=\"{tp}\",pp_rank=\"0\",tp_rank=\"{tp}\"}}");
        let mut t = String::new();
        for tp in 0..4 {
            t += &format!("sglang:max_total_num_tokens{} 1000.0\n", l(tp, tp / 2));
        }
        let mut stats = |tp: u32, (used, avail, evict): (u32, u32, u32)| {
            let lab = l(tp, tp / 2);
            t += &format!(
                "sglang:token_usage{lab} {:.2}\nsglang:kv_used_tokens{lab} {used}.0\nsglang:kv_available_tokens{lab} {avail}.0\nsglang:kv_evictable_tokens{lab} {evict}.0\nsglang:num_running_reqs{lab} 1.0\n",
                f64::from(used) / 1000.0
            );
        };
        stats(0, (100, 850, 50));
        if let Some(r) = rank1 {
            stats(2, r);
        }
        t
    }

    #[test]
    fn each_dp_rank_is_checked_on_its_own_and_the_server_is_their_sum() {
        // Uneven load: the maxima taken across ranks (100+850+100 vs 700) break the identity;
        // each rank alone keeps it.
        let r = check(&parse(&dp2(Some((700, 200, 100)))).unwrap()).unwrap();
        assert_eq!(r.ranks.len(), 2, "{r:?}");
        assert_eq!(r.ranks[1].rank, "dp_rank=1,pp_rank=0,tp_rank=2,moe_ep_rank=2");
        assert_eq!((r.ranks[1].used_tokens, r.ranks[1].max_total_tokens), (700.0, Some(1000.0)));
        assert_eq!(r.used_tokens, 800.0, "every rank's tokens in use");
        assert_eq!(r.max_total_tokens, Some(2000.0), "each DP group has a pool of its own");
        assert_eq!((r.available_tokens, r.evictable_tokens, r.running_reqs), (Some(1050.0), Some(150.0), Some(2.0)));
        assert_eq!(r.token_usage, 0.7, "the fullest rank's");
        assert!(r.unpublished.is_empty());
        // A rank whose own identity fails is named.
        let e = check(&parse(&dp2(Some((700, 500, 100)))).unwrap()).unwrap_err();
        assert!(matches!(&e, KvProblem::Insane(m) if m.contains("(dp_rank=1,pp_rank=0,tp_rank=2,moe_ep_rank=2)")), "{e}");
    }

    #[test]
    fn a_dp_rank_that_has_not_published_is_named_and_waited_for() {
        let text = dp2(None);
        let e = check(&parse(&text).unwrap()).unwrap_err();
        assert_eq!(e, KvProblem::RanksUnpublished { published: 1, expected: 2, missing: "dp_rank=1,pp_rank=0".into() });
        assert!(e.to_string().starts_with("1 of 2 stats ranks published"), "{e}");
        // Read without the demand: the published rank, and the other named.
        let r = read(&parse(&text).unwrap()).unwrap();
        assert_eq!((r.used_tokens, r.unpublished.clone()), (100.0, vec!["dp_rank=1,pp_rank=0".to_string()]));
    }

    #[test]
    fn plain_tp_is_one_pool_logged_by_rank_0() {
        let mut t = String::new();
        for tp in 0..2 {
            t += &format!("sglang:max_total_num_tokens{{pp_rank=\"0\",tp_rank=\"{tp}\"}} 1000.0\n");
        }
        t += "sglang:token_usage{pp_rank=\"0\",tp_rank=\"0\"} 0.1\nsglang:kv_used_tokens{pp_rank=\"0\",tp_rank=\"0\"} 100\nsglang:kv_available_tokens{pp_rank=\"0\",tp_rank=\"0\"} 900\nsglang:kv_evictable_tokens{pp_rank=\"0\",tp_rank=\"0\"} 0\n";
        // A per-priority breakdown is part of the rank's total, not a rank.
        t += "sglang:num_queue_reqs{pp_rank=\"0\",priority=\"\",tp_rank=\"0\"} 3\nsglang:num_queue_reqs{pp_rank=\"0\",priority=\"5\",tp_rank=\"0\"} 2\n";
        let r = check(&parse(&t).unwrap()).unwrap();
        assert_eq!((r.max_total_tokens, r.ranks.len(), r.queue_reqs), (Some(1000.0), 1, Some(3.0)), "{r:?}");
    }
}
