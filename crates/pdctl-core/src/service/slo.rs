//! The service gate's judgement (`[verify.slo]`): a restarted worker's service figures over a
//! window against a baseline — its role's other workers over the same window, or, when it is the
//! only worker of its role, its own figures from before its drain.
//!
//! Latencies are compared by their p50, computed from the histograms' buckets as Prometheus's
//! `histogram_quantile` does; errors by the share of the gateway's attempts to the worker that
//! failed (smg's per-worker outcomes; SGLang's own abort counter where the gateway has none),
//! above the baseline's own share. A figure is judged only when both sides served at least
//! `min_requests` requests in their windows; a figure neither side observed (a PD prefill has no
//! time to first token) is not a figure of that role.

use pdctl_parse::quantile::Histogram;
/// A worker's service figures at one scrape (re-exported for the daemon's bake baselines).
pub use pdctl_parse::service::ServiceScrape;
use serde::Serialize;

/// What the service gate does when the gateway sent the restarted worker (or its baseline) too
/// little traffic to judge (`[verify.slo] unjudged`): a canary that saw no traffic is no pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unjudged {
    /// pdctl judges with its own sample: `min_requests` PD request pairs sent straight to the
    /// restarted worker (with a serving worker of the other role) and the same to a peer of its
    /// role, compared by end-to-end p50 and error rate with the same tolerances. Where no such
    /// sample can be sent (a regular worker, no peer of its role, no serving other role) it fails.
    Probe,
    /// Fail the soak (`slo_not_judged`).
    Fail,
    /// Pass, saying it was not judged (the behaviour before this setting).
    Pass,
}

/// `[verify.slo]`: the service gate at the end of the soak. A restarted worker's figures over the
/// soak window are compared with its role's other workers over the same window — or, where it is
/// the only worker of its role, with its own figures from before its drain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// Largest allowed ratio of time-to-first-token p50 (restarted ÷ baseline).
    pub ttft_ratio: f64,
    /// Largest allowed ratio of inter-token-latency p50.
    pub itl_ratio: f64,
    /// Largest allowed ratio of end-to-end latency p50.
    pub e2e_ratio: f64,
    /// Largest allowed fraction of the restarted worker's requests that failed.
    pub error_rate: f64,
    /// Requests the restarted worker (and its baseline) must have served for a figure to be
    /// judged; fewer: "not judged", never a pass.
    pub min_requests: u64,
    /// How long the soak may wait beyond `min_healthy` for `min_requests`.
    pub max_wait: std::time::Duration,
    /// What too little traffic leads to ([`Unjudged`]; default `probe`).
    pub unjudged: Unjudged,
}

/// One side's figures over its window.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Window {
    /// The worker's (or the peers' summed) histograms and counters over the window.
    pub service: ServiceScrape,
    /// The gateway's attempts to the worker(s) over the window, `(successes, failures)`; `None`:
    /// the gateway does not export them.
    pub gateway: Option<(f64, f64)>,
}

impl Window {
    /// Requests served in the window: finished requests, or the gateway's attempts where more.
    pub fn requests(&self) -> u64 {
        let sglang = self.service.requests + self.service.aborted;
        let gateway = self.gateway.map_or(0.0, |(ok, failed)| ok + failed);
        sglang.max(gateway).max(0.0) as u64
    }

    /// The share of requests that failed, and where it was read; `None`: not measured. Only the
    /// gateway's outcomes say it: SGLang's `num_aborted_requests_total` is no error count (0.5.23
    /// `tokenizer_manager.py` `abort_request`: it counts a client that went away, an operator's
    /// abort, and one per `abort_all` however many requests that ended).
    pub fn error_rate(&self) -> Option<(f64, &'static str)> {
        match self.gateway {
            Some((ok, failed)) if ok + failed > 0.0 => Some((failed / (ok + failed), "the gateway's failed attempts")),
            _ => None,
        }
    }
}

/// What the restarted worker is compared with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Baseline {
    /// The same role's other workers over the same window.
    Peers {
        /// Their units.
        units: Vec<String>,
    },
    /// Its own figures from before its drain (since its previous start).
    OwnBeforeDrain,
}

impl std::fmt::Display for Baseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Baseline::Peers { units } if units.len() == 1 => write!(f, "its peer {}", units[0]),
            Baseline::Peers { units } => write!(f, "its {} peers ({})", units.len(), units.join(", ")),
            Baseline::OwnBeforeDrain => f.write_str("its own figures from before its drain"),
        }
    }
}

/// One figure, both sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    /// `ttft_p50`, `itl_p50`, `e2e_p50` or `error_rate`.
    pub name: &'static str,
    /// The restarted worker's value (seconds, or a fraction).
    pub value: f64,
    /// The baseline's value.
    pub baseline: f64,
    /// The limit the value was held to (`ratio × baseline`, or `baseline + error_rate`).
    pub limit: f64,
    /// Whether the value is over its limit.
    pub breach: bool,
}

impl Figure {
    /// "TTFT p50 0.93 s vs 0.31 s (×3.0, limit ×1.5)" — the figure as an operator reads it.
    pub fn sentence(&self) -> String {
        match self.name {
            "error_rate" => format!("error rate {:.1} % vs {:.1} % (limit {:.1} %)", self.value * 100.0, self.baseline * 100.0, self.limit * 100.0),
            n => {
                let label = match n {
                    "ttft_p50" => "time to first token p50",
                    "itl_p50" => "inter-token latency p50",
                    _ => "end-to-end latency p50",
                };
                let ratio = if self.baseline > 0.0 { format!("×{:.1}", self.value / self.baseline) } else { "baseline 0".into() };
                let limit = if self.baseline > 0.0 { self.limit / self.baseline } else { 0.0 };
                format!("{label} {} vs {} ({ratio}, limit ×{limit:.1})", secs(self.value), secs(self.baseline))
            }
        }
    }
}

fn secs(v: f64) -> String {
    if v < 0.1 {
        format!("{:.1} ms", v * 1000.0)
    } else {
        format!("{v:.2} s")
    }
}

/// The judgement.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Every judged figure within its limit.
    Pass,
    /// Too little traffic (or no baseline): nothing was judged; said as such, never a pass.
    NotJudged {
        /// Why, e.g. "3 requests, fewer than min_requests = 20".
        why: String,
    },
    /// A figure over its limit (the first, in the order TTFT, ITL, e2e, errors).
    Breach {
        /// The figure.
        figure: Figure,
    },
}

/// The gate's full report: the verdict, every figure, the sample sizes, the baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The judgement.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// What the worker was compared with.
    pub baseline: Baseline,
    /// Requests the restarted worker served in its window.
    pub requests: u64,
    /// Requests the baseline served in its window.
    pub baseline_requests: u64,
    /// Every figure both sides observed.
    pub figures: Vec<Figure>,
    /// Where the error rate was read (absent: not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors_from: Option<&'static str>,
    /// What the figures are: `gateway_traffic` (the clients' requests over the soak), or
    /// `pdctl_sample` (the gateway sent too little: pdctl's own requests, `[verify.slo] unjudged
    /// = "probe"`); with `not_judged_passed` when too little traffic passed by setting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judged_by: Option<&'static str>,
}

/// Judge pdctl's own sample (`[verify.slo] unjudged = "probe"`): the end-to-end time of each
/// request sent to the restarted worker (`mine`; `None`: it failed) against the same sample sent
/// to a peer (`base`), by the same tolerances — e2e p50 within `e2e_ratio`, failures within
/// `error_rate` of the peer's.
pub fn judge_sample(slo: &Slo, mine: &[Option<f64>], base: &[Option<f64>], against: Baseline) -> Report {
    let p50 = |xs: &[Option<f64>]| {
        let mut v: Vec<f64> = xs.iter().flatten().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
    };
    let fails = |xs: &[Option<f64>]| if xs.is_empty() { 0.0 } else { xs.iter().filter(|x| x.is_none()).count() as f64 / xs.len() as f64 };
    let mut figures = Vec::new();
    if let (Some(value), Some(b)) = (p50(mine), p50(base)) {
        let limit = slo.e2e_ratio * b;
        figures.push(Figure { name: "e2e_p50", value, baseline: b, limit, breach: value > limit && value > 0.0 });
    }
    let (value, b) = (fails(mine), fails(base));
    figures.push(Figure { name: "error_rate", value, baseline: b, limit: b + slo.error_rate, breach: value > b + slo.error_rate });
    let verdict = match figures.iter().find(|f| f.breach) {
        Some(f) => Verdict::Breach { figure: f.clone() },
        None if p50(mine).is_none() || p50(base).is_none() => Verdict::NotJudged { why: "no request of pdctl's sample was answered on one side".into() },
        None => Verdict::Pass,
    };
    Report {
        verdict,
        baseline: against,
        requests: mine.len() as u64,
        baseline_requests: base.len() as u64,
        figures,
        errors_from: Some("pdctl_sample"),
        judged_by: Some("pdctl_sample"),
    }
}

/// A latency figure: its name, where its histogram is, and its allowed ratio.
type Latency = (&'static str, fn(&ServiceScrape) -> &Option<Histogram>, f64);

/// Judge `restarted` against `baseline` by `slo`.
pub fn judge(slo: &Slo, restarted: &Window, baseline: &Window, against: Baseline) -> Report {
    let (n, nb) = (restarted.requests(), baseline.requests());
    let mut figures = Vec::new();
    let latencies: [Latency; 3] = [("ttft_p50", |s| &s.ttft, slo.ttft_ratio), ("itl_p50", |s| &s.itl, slo.itl_ratio), ("e2e_p50", |s| &s.e2e, slo.e2e_ratio)];
    for (name, of, ratio) in latencies {
        let p50 = |w: &Window| of(&w.service).as_ref().and_then(|h| h.quantile(0.5)).filter(|v| v.is_finite());
        if let (Some(value), Some(base)) = (p50(restarted), p50(baseline)) {
            let limit = ratio * base;
            figures.push(Figure { name, value, baseline: base, limit, breach: value > limit && value > 0.0 });
        }
    }
    let mut errors_from = None;
    if let Some((value, from)) = restarted.error_rate() {
        let base = baseline.error_rate().map_or(0.0, |(b, _)| b);
        let limit = base + slo.error_rate;
        errors_from = Some(from);
        figures.push(Figure { name: "error_rate", value, baseline: base, limit, breach: value > limit });
    }
    let verdict = if n < slo.min_requests || nb < slo.min_requests {
        let who = if n < slo.min_requests { format!("{n} requests on the restarted worker") } else { format!("{nb} requests on {against}") };
        Verdict::NotJudged { why: format!("{who}, fewer than min_requests = {}", slo.min_requests) }
    } else if figures.is_empty() {
        Verdict::NotJudged { why: "no figure was observed on both sides".into() }
    } else {
        match figures.iter().find(|f| f.breach) {
            Some(f) => Verdict::Breach { figure: f.clone() },
            None => Verdict::Pass,
        }
    };
    Report { verdict, baseline: against, requests: n, baseline_requests: nb, figures, errors_from, judged_by: Some("gateway_traffic") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slo() -> Slo {
        Slo {
            ttft_ratio: 1.5,
            itl_ratio: 1.5,
            e2e_ratio: 1.5,
            error_rate: 0.01,
            min_requests: 20,
            max_wait: std::time::Duration::from_secs(120),
            unjudged: Unjudged::Probe,
        }
    }

    /// A window of `n` requests whose end-to-end latencies all lie in (lo, hi].
    fn window(n: f64, lo: f64, hi: f64, gateway: Option<(f64, f64)>) -> Window {
        let h = Histogram { buckets: vec![(lo, 0.0), (hi, n), (f64::INFINITY, n)], count: n, sum: 0.0 };
        Window { service: ServiceScrape { e2e: Some(h), requests: n, ..ServiceScrape::default() }, gateway }
    }

    #[test]
    fn a_slow_worker_breaches_naming_the_figure_both_values_and_sample_sizes() {
        let r = judge(&slo(), &window(40.0, 0.8, 1.0, None), &window(80.0, 0.2, 0.4, None), Baseline::Peers { units: vec!["p2.service".into()] });
        let Verdict::Breach { figure } = &r.verdict else { panic!("{r:?}") };
        assert_eq!((figure.name, r.requests, r.baseline_requests), ("e2e_p50", 40, 80));
        assert!((figure.value - 0.9).abs() < 1e-9 && (figure.baseline - 0.3).abs() < 1e-9, "{figure:?}");
        assert_eq!(figure.sentence(), "end-to-end latency p50 0.90 s vs 0.30 s (×3.0, limit ×1.5)");
        let names: Vec<&str> = r.figures.iter().map(|f| f.name).collect();
        assert_eq!(names, ["e2e_p50"], "no TTFT or ITL observed on either side: not figures of this role; no error rate without the gateway's outcomes");
        assert_eq!(r.errors_from, None, "SGLang's aborted counter is not an error count (client disconnects, one per abort_all): not measured");
    }

    #[test]
    fn too_little_traffic_is_not_judged_never_a_pass() {
        let r = judge(&slo(), &window(3.0, 0.8, 1.0, None), &window(80.0, 0.2, 0.4, None), Baseline::OwnBeforeDrain);
        assert_eq!(r.verdict, Verdict::NotJudged { why: "3 requests on the restarted worker, fewer than min_requests = 20".into() });
        let r = judge(&slo(), &window(30.0, 0.2, 0.4, None), &window(5.0, 0.2, 0.4, None), Baseline::OwnBeforeDrain);
        assert!(matches!(&r.verdict, Verdict::NotJudged { why } if why.starts_with("5 requests on its own figures")), "{r:?}");
    }

    #[test]
    fn errors_count_above_the_baselines_own_share() {
        // 10 % of attempts failed on the restarted worker, 1 % on its peers: over 1 % + 1 %.
        let r = judge(&slo(), &window(50.0, 0.2, 0.4, Some((45.0, 5.0))), &window(100.0, 0.2, 0.4, Some((99.0, 1.0))), Baseline::OwnBeforeDrain);
        let Verdict::Breach { figure } = &r.verdict else { panic!("{r:?}") };
        assert_eq!((figure.name, figure.sentence().as_str()), ("error_rate", "error rate 10.0 % vs 1.0 % (limit 2.0 %)"));
        assert_eq!(r.errors_from, Some("the gateway's failed attempts"));
        // The same share on both sides (a failing peer of the other role): not this worker's doing.
        let r = judge(&slo(), &window(50.0, 0.2, 0.4, Some((45.0, 5.0))), &window(100.0, 0.2, 0.4, Some((90.0, 10.0))), Baseline::OwnBeforeDrain);
        assert_eq!(r.verdict, Verdict::Pass);
        // Same latency, no error: a pass with both figures in the report.
        let r = judge(&slo(), &window(50.0, 0.2, 0.4, Some((50.0, 0.0))), &window(100.0, 0.2, 0.4, Some((100.0, 0.0))), Baseline::OwnBeforeDrain);
        assert_eq!((r.verdict, r.figures.len()), (Verdict::Pass, 2));
    }

    #[test]
    fn the_baseline_is_named_as_an_operator_reads_it() {
        assert_eq!(Baseline::Peers { units: vec!["a".into()] }.to_string(), "its peer a");
        assert_eq!(Baseline::Peers { units: vec!["a".into(), "b".into()] }.to_string(), "its 2 peers (a, b)");
        assert_eq!(Baseline::OwnBeforeDrain.to_string(), "its own figures from before its drain");
    }
}
