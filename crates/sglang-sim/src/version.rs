//! Version profiles: which metric names, labels and behaviours each SGLang release has
//! (upstream `sgl-project/sglang`, `python/sglang/srt/observability/metrics_collector.py` and
//! `managers/scheduler_metrics_mixin.py` at each release; the table is in docs/sglang-sim.md).

/// An SGLang release, compared component-wise (`0.5.10 > 0.5.6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// The newest release the facts were checked against.
    pub const LATEST: Version = Version(0, 5, 23);

    /// Parse `0.5.23` (a `.postN` suffix is ignored).
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.trim().trim_start_matches('v');
        let s = s.split(".post").next().unwrap_or(s);
        let mut it = s.split('.').map(|p| p.parse::<u32>().ok());
        let v = Version(it.next()??, it.next()??, it.next().unwrap_or(Some(0))?);
        it.next().is_none().then_some(v)
    }

    const fn at_least(self, v: Version) -> bool {
        self.0 > v.0 || (self.0 == v.0 && (self.1 > v.1 || (self.1 == v.1 && self.2 >= v.2)))
    }

    /// `/health` answers 200 even while starting (0.4.6) instead of 503 until Up (≥0.5.2).
    pub fn health_always_ok(self) -> bool {
        !self.at_least(Version(0, 5, 2))
    }
    /// `engine_type` reflects the PD role (≥0.5.10); before, always `unified`.
    pub fn engine_type_by_role(self) -> bool {
        self.at_least(Version(0, 5, 10))
    }
    /// `tp_rank` and `pp_rank` labels exist (≥0.5.2).
    pub fn has_rank_labels(self) -> bool {
        self.at_least(Version(0, 5, 2))
    }
    /// `moe_ep_rank` label exists (≥0.5.10).
    pub fn has_moe_ep_rank(self) -> bool {
        self.at_least(Version(0, 5, 10))
    }
    /// `sglang:max_total_num_tokens` exists (≥0.5.6).
    pub fn has_max_total_num_tokens(self) -> bool {
        self.at_least(Version(0, 5, 6))
    }
    /// Constants are written once at scheduler init (≥0.5.11) rather than by `log_stats`.
    pub fn constants_at_init(self) -> bool {
        self.at_least(Version(0, 5, 11))
    }
    /// `sglang:full_token_usage` exists (≥0.5.10).
    pub fn has_full_token_usage(self) -> bool {
        self.at_least(Version(0, 5, 10))
    }
    /// `sglang:kv_{used,available,evictable}_tokens` and the page/context constants (≥0.5.11).
    pub fn has_kv_tokens(self) -> bool {
        self.at_least(Version(0, 5, 11))
    }
    /// `retracted`/`paused` gauges (with a `pid` label) exist (≥0.5.2).
    pub fn has_retracted(self) -> bool {
        self.at_least(Version(0, 5, 2))
    }
    /// `sglang:pending_prealloc_token_usage` exists (≥0.5.6).
    pub fn has_pending_prealloc(self) -> bool {
        self.at_least(Version(0, 5, 6))
    }
    /// Name of the prefill bootstrap queue gauge (renamed in 0.5.12).
    pub fn prefill_bootstrap_queue_name(self) -> &'static str {
        if self.at_least(Version(0, 5, 12)) {
            "sglang:num_prefill_bootstrap_queue_reqs"
        } else {
            "sglang:num_prefill_prealloc_queue_reqs"
        }
    }
    /// Name of the prefill inflight queue gauge (0.4.6 misspelt it).
    pub fn prefill_inflight_queue_name(self) -> &'static str {
        if self.at_least(Version(0, 5, 2)) {
            "sglang:num_prefill_inflight_queue_reqs"
        } else {
            "sglang:num_prefill_infight_queue_reqs"
        }
    }
    /// `GET /get_load` (a JSON array of DP ranks) is served: up to 0.5.12; 0.5.23 has none.
    pub fn has_get_load(self) -> bool {
        !self.at_least(Version(0, 5, 13))
    }
    /// `GET /v1/loads` (`{timestamp, version, …, loads: [...]}`, `entrypoints/v1_loads.py` in
    /// 0.5.23) is served. Checked in 0.5.23; the first release with it is assumed to be 0.5.10.
    pub fn has_v1_loads(self) -> bool {
        self.at_least(Version(0, 5, 10))
    }
    /// `GET /ready` is served (of the versions checked, only 0.5.23 has it).
    pub fn has_ready(self) -> bool {
        self.at_least(Version(0, 5, 23))
    }
    /// `sglang:num_decode_deferred_kv_release_reqs` (deferred decode KV release after a failed
    /// transfer, `observability/metrics_collector.py`) exists: checked in 0.5.23 only.
    pub fn has_deferred_kv_release(self) -> bool {
        self.at_least(Version(0, 5, 23))
    }
    /// The model-info path the warmup polls (`/get_model_info` before 0.5.10).
    pub fn has_new_info_paths(self) -> bool {
        self.at_least(Version(0, 5, 6))
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_order() {
        assert_eq!(Version::parse("0.4.6.post5"), Some(Version(0, 4, 6)));
        assert!(Version::parse("0.5.10").unwrap() > Version::parse("0.5.6").unwrap());
        assert_eq!(Version::parse("x"), None);
        assert_eq!(Version::parse("1.2.3.4"), None);
    }

    #[test]
    fn profiles_follow_the_facts() {
        let v046 = Version(0, 4, 6);
        let v056 = Version(0, 5, 6);
        let v0510 = Version(0, 5, 10);
        let v0523 = Version::LATEST;
        assert!(v046.health_always_ok() && !v056.health_always_ok());
        assert!(!v056.engine_type_by_role() && v0510.engine_type_by_role());
        assert!(!v0510.has_kv_tokens() && v0523.has_kv_tokens());
        assert!(!v046.has_max_total_num_tokens() && v056.has_max_total_num_tokens());
        assert_eq!(v046.prefill_inflight_queue_name(), "sglang:num_prefill_infight_queue_reqs");
        assert_eq!(v0510.prefill_bootstrap_queue_name(), "sglang:num_prefill_prealloc_queue_reqs");
        assert_eq!(v0523.prefill_bootstrap_queue_name(), "sglang:num_prefill_bootstrap_queue_reqs");
    }
}
