//! What clients saw during a rollout: small requests sent through the router at a fixed rate
//! while it runs, and the figures they give — probes, failures, the longest error window, latency.
//!
//! The probe never causes what it measures: while a role has no worker the gateway admits (a
//! drained or restarting only worker), it sends nothing — such a request would only fail and
//! count against the gateway's circuit breakers — and counts that time as an error window from
//! the gateway's own view. It resumes once the role is admitted again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One tick of the probe.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When.
    pub at: Instant,
    /// A request was sent (false: a role had no admitted worker; nothing was sent).
    pub sent: bool,
    /// It answered 200 (false for an unsent tick).
    pub ok: bool,
    /// Its latency, when it answered 200.
    pub latency: Option<Duration>,
    /// The unit the rollout was working on then.
    pub unit: Option<String>,
}

/// The figures of a rollout (or of one unit's window).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Availability {
    /// Requests sent.
    pub probes: u64,
    /// Of those, how many did not answer 200.
    pub failed: u64,
    /// The longest time clients would have seen errors: consecutive failed probes, or time
    /// without an admitted worker of a role, until the next good probe.
    pub longest_error_ms: u64,
    /// Median latency of the good probes (`None`: no probe answered, not measured).
    pub p50_ms: Option<f64>,
    /// 99th percentile latency of the good probes (`None`: not measured).
    pub p99_ms: Option<f64>,
    /// A window without an admitted worker of a role (or with failing probes) was still open when
    /// the rollout ended: the outage outlasted it (a halted rollout's worker still out).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open_at_end: bool,
    /// How many error windows there were (failing probes, or time without an admitted worker
    /// of a role, each until the next good probe).
    #[serde(default)]
    pub error_windows: u64,
    /// All error windows together.
    #[serde(default)]
    pub error_ms_total: u64,
    /// Time the probe sent nothing (a role had no admitted worker): not measured by the probe —
    /// every client request through the gateway failed then.
    #[serde(default)]
    pub unprobed_ms: u64,
    /// The gateway's own count of its answers to clients over the rollout (smg 1.x
    /// `smg_http_responses_total`; `None`: not exported — not measured, never 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayAnswers>,
}

/// The gateway's own answers to every client (pdctl's probe included) during a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayAnswers {
    /// Requests it answered.
    pub answered: u64,
    /// Of those, answered with a 5xx (no worker to take it, a worker's failure, …).
    pub failed: u64,
}

impl Availability {
    /// One line for people: what clients saw, "not measured" where nothing was.
    pub fn sentence(&self) -> String {
        let lat = |v: Option<f64>| v.map(|x| format!("{x} ms")).unwrap_or_else(|| "not measured".into());
        let window = if self.open_at_end { format!("{} ms and still open at the end", self.longest_error_ms) } else { format!("{} ms", self.longest_error_ms) };
        let windows = match self.error_windows {
            0 => "no error window".to_string(),
            1 => format!("1 error window of {window}"),
            n => format!("{n} error windows, {} ms in all, the longest {window}", self.error_ms_total),
        };
        let unprobed = if self.unprobed_ms > 0 {
            format!(
                "; {} ms not probed (a role had no admitted worker: the probe sent nothing, and every client request through the gateway failed then)",
                self.unprobed_ms
            )
        } else {
            String::new()
        };
        let gateway = match self.gateway {
            Some(g) => format!("; the gateway itself answered {} of {} requests with a 5xx", g.failed, g.answered),
            None => "; the gateway's own count: not exported".into(),
        };
        if self.probes == 0 {
            format!("no probe request could be sent (a role had no admitted worker the whole time); {windows}{unprobed}; latency not measured{gateway}")
        } else {
            format!(
                "{} failed of {} probe requests through the router; {windows}{unprobed}; p50 {}, p99 {}{gateway}",
                self.failed,
                self.probes,
                lat(self.p50_ms),
                lat(self.p99_ms)
            )
        }
    }
}

fn pct(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    Some((s[i.min(s.len() - 1)] * 10.0).round() / 10.0)
}

/// The figures of `samples` (in time order), a window ending at `end`.
pub fn summarize(samples: &[Sample], end: Instant) -> Availability {
    let sent = samples.iter().filter(|s| s.sent).count() as u64;
    let failed = samples.iter().filter(|s| s.sent && !s.ok).count() as u64;
    let lat: Vec<f64> = samples.iter().filter_map(|s| s.latency).map(|l| l.as_secs_f64() * 1000.0).collect();
    let mut longest = Duration::ZERO;
    let (mut windows, mut total) = (0u64, Duration::ZERO);
    let mut bad_since: Option<Instant> = None;
    for s in samples {
        match (s.ok, bad_since) {
            (false, None) => bad_since = Some(s.at),
            (true, Some(t)) => {
                longest = longest.max(s.at.duration_since(t));
                windows += 1;
                total += s.at.duration_since(t);
                bad_since = None;
            }
            _ => {}
        }
    }
    if let Some(t) = bad_since {
        longest = longest.max(end.saturating_duration_since(t));
        windows += 1;
        total += end.saturating_duration_since(t);
    }
    // Each unsent tick stands for the time until the next tick (or the end).
    let unprobed: Duration =
        samples.iter().enumerate().filter(|(_, s)| !s.sent).map(|(i, s)| samples.get(i + 1).map_or(end, |n| n.at).saturating_duration_since(s.at)).sum();
    Availability {
        probes: sent,
        failed,
        longest_error_ms: longest.as_millis() as u64,
        p50_ms: pct(&lat, 50.0),
        p99_ms: pct(&lat, 99.0),
        open_at_end: bad_since.is_some(),
        error_windows: windows,
        error_ms_total: total.as_millis() as u64,
        unprobed_ms: unprobed.as_millis() as u64,
        gateway: None,
    }
}

/// The figures of each unit's window (the samples taken while the rollout worked on it).
pub fn by_unit(samples: &[Sample], end: Instant) -> BTreeMap<String, Availability> {
    let mut units: Vec<&String> = samples.iter().filter_map(|s| s.unit.as_ref()).collect();
    units.sort();
    units.dedup();
    units
        .into_iter()
        .map(|u| {
            let mine: Vec<Sample> = samples.iter().filter(|s| s.unit.as_ref() == Some(u)).cloned().collect();
            let last = mine.last().map(|s| s.at).unwrap_or(end);
            // A window still open at the unit's last sample ends at the next sample after it.
            let next = samples.iter().find(|s| s.at > last).map(|s| s.at).unwrap_or(end);
            (u.clone(), summarize(&mine, next))
        })
        .collect()
}

/// Parse a probe rate: `"2/s"`, `"30/m"`, `"off"` (→ `None`).
pub fn parse_rate(s: &str) -> Result<Option<f64>, String> {
    if s == "off" {
        return Ok(None);
    }
    let (n, per) = s.split_once('/').ok_or_else(|| format!("{s:?} is not a rate like \"2/s\", \"30/m\" or \"off\""))?;
    let n: f64 = n.trim().parse().map_err(|_| format!("{s:?} is not a rate like \"2/s\", \"30/m\" or \"off\""))?;
    let per_s = match per.trim() {
        "s" => n,
        "m" => n / 60.0,
        _ => return Err(format!("{s:?}: the unit is /s or /m")),
    };
    if !(0.1..=50.0).contains(&per_s) {
        return Err(format!("{s:?} is outside 6/m to 50/s"));
    }
    Ok(Some(per_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_figures() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let s = |ms, sent, ok, unit: &str| Sample { at: at(ms), sent, ok, latency: ok.then_some(Duration::from_millis(4)), unit: Some(unit.into()) };
        let samples = vec![
            s(0, true, true, "p"),
            s(500, false, false, "p"),
            s(1000, false, false, "p"),
            s(1500, true, true, "d"),
            s(2000, true, false, "d"),
            s(2500, true, true, "d"),
        ];
        let a = summarize(&samples, at(3000));
        assert_eq!((a.probes, a.failed, a.longest_error_ms), (4, 1, 1000), "{a:?}");
        // Every window and their total; the unsent ticks' time is not probed.
        assert_eq!((a.error_windows, a.error_ms_total, a.unprobed_ms), (2, 1500, 1000), "{a:?}");
        assert!(a.sentence().contains("2 error windows, 1500 ms in all") && a.sentence().contains("1000 ms not probed"), "{}", a.sentence());
        assert!(a.sentence().contains("the gateway's own count: not exported"), "not measured, never 0: {}", a.sentence());
        assert_eq!(a.p50_ms, Some(4.0));
        assert!(!a.open_at_end);
        // Nothing answered: latency not measured, never zero; a window still open says so.
        let none = summarize(&samples[1..3], at(1200));
        assert_eq!((none.probes, none.p50_ms, none.p99_ms, none.open_at_end), (0, None, None, true), "{none:?}");
        assert_eq!(none.longest_error_ms, 700);
        assert!(none.sentence().contains("not measured") && none.sentence().contains("still open"), "{}", none.sentence());
        let u = by_unit(&samples, at(3000));
        assert_eq!(u["p"].longest_error_ms, 1000, "the window that opened in p's time closes at d's first good probe");
        assert_eq!(u["d"].failed, 1);
        assert_eq!(parse_rate("2/s"), Ok(Some(2.0)));
        assert_eq!(parse_rate("off"), Ok(None));
        assert!(parse_rate("0/s").is_err() && parse_rate("2").is_err() && parse_rate("2/h").is_err());
    }
}
