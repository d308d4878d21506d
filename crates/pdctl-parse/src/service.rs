//! A worker's service figures from its `/metrics`: SGLang's tokenizer-manager histograms and
//! request counters (0.5.23 `observability/metrics_collector.py`, `TokenizerMetricsCollector`),
//! summed over every series (streaming or not, every label set), and the window between two
//! scrapes.
//!
//! What each figure means on each role (0.5.23 `managers/tokenizer_manager.py`, `collect_metrics`):
//! a PD prefill never observes time to first token nor inter-token latency — its end-to-end
//! latency is its part of the request (prefill and KV hand-off); a decode's time to first token
//! counts from its request's arrival, so it includes the wait for the prefill's KV.
//! `num_requests_total` counts finished requests; a request the scheduler aborted (an error
//! answer) is not counted anywhere — errors are read from the gateway where it exposes them.

use crate::prom::{Exposition, Sample};
use crate::quantile::Histogram;

/// `sglang:time_to_first_token_seconds`.
pub const TTFT: &str = "sglang:time_to_first_token_seconds";
/// `sglang:inter_token_latency_seconds`.
pub const ITL: &str = "sglang:inter_token_latency_seconds";
/// `sglang:e2e_request_latency_seconds`.
pub const E2E: &str = "sglang:e2e_request_latency_seconds";
/// `sglang:num_requests_total` (finished requests).
pub const REQUESTS: &str = "sglang:num_requests_total";
/// `sglang:num_aborted_requests_total`: aborts sent to the scheduler — a client that went away,
/// an operator's `/abort_request`, one per `abort_all` (0.5.23 `abort_request`); not an error
/// count.
pub const ABORTED: &str = "sglang:num_aborted_requests_total";

/// One scrape's service figures (cumulative since the server started).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServiceScrape {
    /// Time to first token (absent: never observed, e.g. on a PD prefill).
    pub ttft: Option<Histogram>,
    /// Inter-token latency.
    pub itl: Option<Histogram>,
    /// End-to-end latency.
    pub e2e: Option<Histogram>,
    /// Finished requests.
    pub requests: f64,
    /// Aborted requests.
    pub aborted: f64,
}

impl ServiceScrape {
    /// The figures of an exposition (either spelling: `sglang:` or OpenMetrics' `sglang_`).
    pub fn from_exposition(e: &Exposition) -> ServiceScrape {
        let h = |family: &str| Histogram::from_samples(&e.samples, family, |_| true);
        ServiceScrape { ttft: h(TTFT), itl: h(ITL), e2e: h(E2E), requests: counter(&e.samples, REQUESTS), aborted: counter(&e.samples, ABORTED) }
    }

    /// What happened between `earlier` and this scrape; `None` when a counter went down (the
    /// server restarted in between: the two scrapes are not one window).
    pub fn since(&self, earlier: &ServiceScrape) -> Option<ServiceScrape> {
        let h = |now: &Option<Histogram>, then: &Option<Histogram>| -> Option<Option<Histogram>> {
            match (now, then) {
                (Some(n), Some(t)) => n.since(t).map(Some),
                (Some(n), None) => Some(Some(n.clone())),
                (None, Some(_)) => None,
                (None, None) => Some(None),
            }
        };
        if self.requests < earlier.requests || self.aborted < earlier.aborted {
            return None;
        }
        Some(ServiceScrape {
            ttft: h(&self.ttft, &earlier.ttft)?,
            itl: h(&self.itl, &earlier.itl)?,
            e2e: h(&self.e2e, &earlier.e2e)?,
            requests: self.requests - earlier.requests,
            aborted: self.aborted - earlier.aborted,
        })
    }

    /// Two windows taken together (several peers over the same time).
    pub fn plus(&self, other: &ServiceScrape) -> ServiceScrape {
        let h = |a: &Option<Histogram>, b: &Option<Histogram>| match (a, b) {
            (Some(a), Some(b)) => Some(a.plus(b)),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        ServiceScrape {
            ttft: h(&self.ttft, &other.ttft),
            itl: h(&self.itl, &other.itl),
            e2e: h(&self.e2e, &other.e2e),
            requests: self.requests + other.requests,
            aborted: self.aborted + other.aborted,
        }
    }
}

/// A counter's value summed over its series (either spelling).
fn counter(samples: &[Sample], name: &str) -> f64 {
    let alt = name.replace(':', "_");
    crate::prom::total(samples.iter().filter(|s| s.name == name || s.name == alt).map(|s| s.value).filter(|v| v.is_finite()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(requests: f64, le01: f64, total: f64) -> ServiceScrape {
        let text = format!(
            "# TYPE sglang:e2e_request_latency_seconds histogram\n\
             sglang:e2e_request_latency_seconds_bucket{{is_streaming=\"false\",le=\"0.1\"}} {le01}\n\
             sglang:e2e_request_latency_seconds_bucket{{is_streaming=\"false\",le=\"+Inf\"}} {total}\n\
             sglang:e2e_request_latency_seconds_count{{is_streaming=\"false\"}} {total}\n\
             sglang:e2e_request_latency_seconds_sum{{is_streaming=\"false\"}} 1.0\n\
             sglang:num_requests_total{{is_streaming=\"false\"}} {requests}\n\
             sglang:num_requests_total{{is_streaming=\"true\"}} 1.0\n"
        );
        ServiceScrape::from_exposition(&crate::prom::parse(&text).expect("parses"))
    }

    #[test]
    fn a_window_is_two_scrapes_apart_and_peers_add_up() {
        let (a, b) = (scrape(10.0, 4.0, 10.0), scrape(30.0, 14.0, 30.0));
        assert_eq!((a.requests, a.ttft.is_none(), a.aborted), (11.0, true, 0.0), "both streaming series summed; no TTFT observed");
        // No abort counter exported: a positive zero, so a sentence built on it says "0.0 %", not "-0.0 %".
        assert!(a.aborted.is_sign_positive(), "{}", a.aborted);
        let w = b.since(&a).expect("one window");
        assert_eq!(w.requests, 20.0);
        assert_eq!(w.e2e.as_ref().map(|h| h.buckets.clone()), Some(vec![(0.1, 10.0), (f64::INFINITY, 20.0)]));
        assert_eq!(a.since(&b), None, "a counter that went down: the server restarted");
        let both = w.plus(&w);
        assert_eq!((both.requests, both.e2e.map(|h| h.observations())), (40.0, Some(40.0)));
    }
}
