//! The tokenizer manager's service figures, as SGLang 0.5.23 records them
//! (`observability/metrics_collector.py`, `TokenizerMetricsCollector`; when each is observed:
//! `managers/tokenizer_manager.py`, `collect_metrics`):
//! - `sglang:time_to_first_token_seconds{is_streaming}` — at a request's first output, except on
//!   a PD prefill ("PD prefill workers never observe TTFT") and for an aborted request;
//! - `sglang:inter_token_latency_seconds` — each later output, the interval divided over the new
//!   tokens (so never on a PD prefill either);
//! - `sglang:e2e_request_latency_seconds{is_streaming}` and `sglang:num_requests_total
//!   {is_streaming}` — when a request finishes (a request ended by an abort from the scheduler is
//!   not collected: its answer is an error and no figure moves);
//! - `sglang:num_aborted_requests_total` — each `/abort_request` the tokenizer manager sends.
//!
//! The buckets are the collector's defaults (checked against the wheel by the conformance test).

use std::collections::BTreeMap;

/// `bucket_time_to_first_token`'s default.
pub const TTFT_BUCKETS: &[f64] = &[0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0];
/// `bucket_e2e_request_latency`'s default.
pub const E2E_BUCKETS: &[f64] =
    &[0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0];
/// `bucket_inter_token_latency`'s default.
pub const ITL_BUCKETS: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
    8.000,
];

/// One histogram series: per-bucket counts (not cumulative; the last is `+Inf`), sum and count.
#[derive(Debug, Clone)]
pub struct Series {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
}

impl Series {
    fn new(bounds: &'static [f64]) -> Series {
        Series { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0 }
    }

    /// `n` observations of `value` each (prometheus_client's `observe`, or the collector's fast
    /// path for several tokens at one interval: the sum grows by `sum`).
    fn observe(&mut self, value: f64, n: u64, sum: f64) {
        let i = self.bounds.iter().position(|b| value <= *b).unwrap_or(self.bounds.len());
        self.counts[i] += n;
        self.sum += sum;
    }

    /// `(le, cumulative count)` for every bucket, `+Inf` last; then the count and the sum.
    pub fn cumulative(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let mut acc = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            out.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        (out, acc, self.sum)
    }
}

/// What the tokenizer manager has observed so far; a label set appears once it was observed.
#[derive(Debug, Clone, Default)]
pub struct Service {
    /// By `is_streaming`.
    pub ttft: BTreeMap<bool, Series>,
    /// No `is_streaming` label.
    pub itl: Option<Series>,
    /// By `is_streaming`.
    pub e2e: BTreeMap<bool, Series>,
    /// `num_requests_total` by `is_streaming`.
    pub requests: BTreeMap<bool, u64>,
}

impl Service {
    /// The first output of a request, `secs` after it arrived.
    pub fn first_token(&mut self, stream: bool, secs: f64) {
        self.ttft.entry(stream).or_insert_with(|| Series::new(TTFT_BUCKETS)).observe(secs, 1, secs);
    }

    /// A later output: `tokens` new tokens `secs` after the previous output.
    pub fn later_tokens(&mut self, secs: f64, tokens: u64) {
        if tokens == 0 {
            return;
        }
        self.itl.get_or_insert_with(|| Series::new(ITL_BUCKETS)).observe(secs / tokens as f64, tokens, secs);
    }

    /// A request finished `secs` after it arrived.
    pub fn finished(&mut self, stream: bool, secs: f64) {
        self.e2e.entry(stream).or_insert_with(|| Series::new(E2E_BUCKETS)).observe(secs, 1, secs);
        *self.requests.entry(stream).or_default() += 1;
    }
}

/// The `is_streaming` label's value.
pub fn streaming(stream: bool) -> &'static str {
    if stream {
        "true"
    } else {
        "false"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let mut s = Service::default();
        s.first_token(false, 0.1);
        s.first_token(false, 0.15);
        s.first_token(false, 500.0);
        let (b, n, sum) = s.ttft[&false].cumulative();
        assert_eq!((b[0], b[1], n), ((0.1, 1), (0.2, 2), 3), "le is inclusive");
        assert_eq!(b.last(), Some(&(f64::INFINITY, 3)));
        assert!((sum - 500.25).abs() < 1e-9);
        // Several tokens at one interval: each token one observation of the mean, the sum the interval.
        s.later_tokens(0.03, 3);
        let (b, n, sum) = s.itl.as_ref().map(Series::cumulative).unwrap_or_default();
        assert_eq!((b[4], n), ((0.010, 3), 3));
        assert!((sum - 0.03).abs() < 1e-12);
        s.later_tokens(1.0, 0);
        assert_eq!(s.itl.as_ref().map(|x| x.cumulative().1), Some(3), "no new token, no observation");
        s.finished(true, 2.5);
        assert_eq!((s.requests.get(&true), s.requests.get(&false)), (Some(&1), None));
    }
}
