//! Quantiles from Prometheus histogram buckets, computed as Prometheus's `histogram_quantile`
//! does (`promql/quantile.go`, `bucketQuantile`): the buckets' cumulative counts summed over the
//! series of one family, the difference of two scrapes (what happened between them, as `rate`
//! or `increase` would give), then linear interpolation inside the bucket that holds the rank.
//! The highest bucket must be `+Inf`; a rank in it answers the highest finite bound; a first
//! bucket with a bound ≤ 0 answers that bound.

use crate::prom::Sample;

/// One histogram's cumulative buckets (upper bound → count of observations ≤ it), with its
/// observation count and sum; several series (ranks, labels) summed per bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `(le, cumulative count)`, sorted by `le`; the last is `+Inf` when the exposition had it.
    pub buckets: Vec<(f64, f64)>,
    /// `_count`.
    pub count: f64,
    /// `_sum`.
    pub sum: f64,
}

impl Histogram {
    /// The histogram `family` (e.g. `sglang:time_to_first_token_seconds`, or its `sglang_`
    /// OpenMetrics spelling) from `samples`, summed over every series whose labels `keep`
    /// accepts. `None` when the family has no bucket.
    pub fn from_samples(samples: &[Sample], family: &str, keep: impl Fn(&Sample) -> bool) -> Option<Histogram> {
        let alt = family.replace(':', "_");
        let is = |s: &Sample, suffix: &str| (s.name.strip_suffix(suffix) == Some(family) || s.name.strip_suffix(suffix) == Some(alt.as_str())) && keep(s);
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        let (mut count, mut sum) = (0.0, 0.0);
        for s in samples {
            if is(s, "_bucket") {
                let Some(le) = s.label("le").and_then(crate::prom::parse_value) else { continue };
                match buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c += s.value,
                    None => buckets.push((le, s.value)),
                }
            } else if is(s, "_count") {
                count += s.value;
            } else if is(s, "_sum") {
                sum += s.value;
            }
        }
        if buckets.is_empty() {
            return None;
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Histogram { buckets, count, sum })
    }

    /// What was observed since `earlier` (an older scrape of the same histogram): each bucket's,
    /// the count's and the sum's difference. A counter that went down (the server restarted)
    /// gives `None`: the two scrapes do not describe one window.
    pub fn since(&self, earlier: &Histogram) -> Option<Histogram> {
        if self.count < earlier.count {
            return None;
        }
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (le, c) in &self.buckets {
            let before = earlier.buckets.iter().find(|(b, _)| b == le).map_or(0.0, |(_, c)| *c);
            if *c < before {
                return None;
            }
            buckets.push((*le, c - before));
        }
        Some(Histogram { buckets, count: self.count - earlier.count, sum: self.sum - earlier.sum })
    }

    /// Two histograms of the same family taken together (the buckets of both, summed by bound).
    pub fn plus(&self, other: &Histogram) -> Histogram {
        let mut buckets = self.buckets.clone();
        for (le, c) in &other.buckets {
            match buckets.iter_mut().find(|(b, _)| b == le) {
                Some((_, x)) => *x += c,
                None => buckets.push((*le, *c)),
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Histogram { buckets, count: self.count + other.count, sum: self.sum + other.sum }
    }

    /// Observations in the window (the `+Inf` bucket's count, else `_count`).
    pub fn observations(&self) -> f64 {
        match self.buckets.last() {
            Some((le, c)) if le.is_infinite() => *c,
            _ => self.count,
        }
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) as `histogram_quantile` computes it; `None` where Prometheus
    /// answers NaN (no `+Inf` bucket, fewer than two buckets, no observation). `q` outside 0..1
    /// gives ∓∞ as Prometheus does.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if q.is_nan() {
            return None;
        }
        if q < 0.0 {
            return Some(f64::NEG_INFINITY);
        }
        if q > 1.0 {
            return Some(f64::INFINITY);
        }
        if !self.buckets.last().is_some_and(|(le, _)| *le == f64::INFINITY) || self.buckets.len() < 2 {
            return None;
        }
        // Cumulative counts that went down (scrapes not taken at one instant) are lifted to the
        // running maximum, as Prometheus's `ensureMonotonic` does.
        let mut b = self.buckets.clone();
        let mut max = 0.0_f64;
        for (_, c) in b.iter_mut() {
            max = max.max(*c);
            *c = max;
        }
        let observations = b[b.len() - 1].1;
        if observations == 0.0 {
            return None;
        }
        let mut rank = q * observations;
        let i = b.partition_point(|(_, c)| *c < rank);
        if i == b.len() - 1 {
            return Some(b[b.len() - 2].0);
        }
        if i == 0 && b[0].0 <= 0.0 {
            return Some(b[0].0);
        }
        let (mut start, end, mut count) = (0.0, b[i].0, b[i].1);
        if i > 0 {
            start = b[i - 1].0;
            count -= b[i - 1].1;
            rank -= b[i - 1].1;
        }
        Some(start + (end - start) * (rank / count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: &[(f64, f64)]) -> Histogram {
        Histogram { buckets: b.to_vec(), count: b.last().map_or(0.0, |x| x.1), sum: 0.0 }
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket_as_prometheus_does() {
        // The positive bucket set of Prometheus's `testhistogram` (`promql/testdata/histograms.test`,
        // series 0+5x10, 0+7x10, 0+11x10 read at 50 m): le 0.1: 50, 0.2: 70, +Inf: 110.
        let x = h(&[(0.1, 50.0), (0.2, 70.0), (f64::INFINITY, 110.0)]);
        assert_eq!(x.quantile(0.0), Some(0.0));
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(x.quantile(0.25), 0.055), "{:?}", x.quantile(0.25));
        assert!(close(x.quantile(0.5), 0.125), "{:?}", x.quantile(0.5));
        // A rank in the +Inf bucket answers the highest finite bound.
        assert_eq!(x.quantile(0.75), Some(0.2));
        assert_eq!(x.quantile(1.0), Some(0.2));
        assert_eq!((x.quantile(-0.1), x.quantile(1.1)), (Some(f64::NEG_INFINITY), Some(f64::INFINITY)));
        // A first bucket bounded at or below 0 answers its bound.
        assert_eq!(h(&[(-0.2, 10.0), (0.0, 10.0), (f64::INFINITY, 20.0)]).quantile(0.25), Some(-0.2));
        // NaN cases: no +Inf bucket, one bucket, nothing observed.
        assert_eq!(h(&[(0.1, 5.0), (0.2, 9.0)]).quantile(0.5), None);
        assert_eq!(h(&[(f64::INFINITY, 9.0)]).quantile(0.5), None);
        assert_eq!(h(&[(0.1, 0.0), (f64::INFINITY, 0.0)]).quantile(0.5), None);
        // Non-monotonic cumulative counts are lifted to the running maximum.
        assert!(close(h(&[(0.1, 50.0), (0.2, 40.0), (f64::INFINITY, 100.0)]).quantile(0.5), 0.1));
    }

    #[test]
    fn a_window_is_the_difference_of_two_scrapes_summed_over_series() {
        let text = |n: f64| {
            format!(
                "sglang:ttft_seconds_bucket{{tp_rank=\"0\",le=\"0.5\"}} {a}\nsglang:ttft_seconds_bucket{{tp_rank=\"0\",le=\"+Inf\"}} {b}\n\
                 sglang:ttft_seconds_bucket{{tp_rank=\"1\",le=\"0.5\"}} {a}\nsglang:ttft_seconds_bucket{{tp_rank=\"1\",le=\"+Inf\"}} {b}\n\
                 sglang:ttft_seconds_count{{tp_rank=\"0\"}} {b}\nsglang:ttft_seconds_count{{tp_rank=\"1\"}} {b}\nsglang:ttft_seconds_sum{{tp_rank=\"0\"}} 1.0\n",
                a = 4.0 * n,
                b = 5.0 * n
            )
        };
        let scrape = |n| Histogram::from_samples(&crate::prom::parse(&text(n)).expect("parses").samples, "sglang:ttft_seconds", |_| true).expect("a histogram");
        let (before, after) = (scrape(1.0), scrape(3.0));
        assert_eq!(after.buckets, vec![(0.5, 24.0), (f64::INFINITY, 30.0)], "both ranks summed");
        let w = after.since(&before).expect("one window");
        assert_eq!((w.buckets.clone(), w.count, w.observations()), (vec![(0.5, 16.0), (f64::INFINITY, 20.0)], 20.0, 20.0));
        assert!(w.quantile(0.5).is_some_and(|q| (q - 0.3125).abs() < 1e-9), "{:?}", w.quantile(0.5));
        assert_eq!(before.since(&after), None, "a counter that went down (a restart) is not a window");
        let only_rank_0 =
            Histogram::from_samples(&crate::prom::parse(&text(1.0)).expect("parses").samples, "sglang:ttft_seconds", |s| s.label("tp_rank") == Some("0"));
        assert_eq!(only_rank_0.map(|x| x.buckets), Some(vec![(0.5, 4.0), (f64::INFINITY, 5.0)]));
        assert_eq!(Histogram::from_samples(&[], "sglang:ttft_seconds", |_| true), None);
    }
}
