//! What a stack sustains, measured in the run that uses it: offered load through the gateway
//! at rising rates until the queue grows, and a stream of long answers kept in flight (so that
//! every drain of a rollout finds some). Measured, never assumed: a machine running a second
//! suite sustains less, and the rollout is then run at a share of what it sustains there.

use super::{Answer, Load};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One rate offered for a while, and what came back.
#[derive(Debug, Clone)]
pub struct Step {
    /// Requests per second offered.
    pub rate: f64,
    /// Sent.
    pub sent: u64,
    /// Failed (not 2xx, or no answer within 30 s).
    pub failed: u64,
    /// Median answer time of the first third of the requests sent (s).
    pub p50_first: f64,
    /// Median answer time of the last third (s): above the first third's, a queue that grows.
    pub p50_last: f64,
    /// The 99th percentile answer time of all (s).
    pub p99: f64,
    /// Stopped early: the servers' waiting queue stayed above a second's worth.
    pub cut_short: bool,
}

/// The slowest answer a held rate may give (s): a short answer queued longer is not served.
pub const HELD_P99: f64 = 4.0;

impl Step {
    /// Held: nothing failed, the queue did not grow (the last third answered within 1.5× the
    /// first third's median, + 0.25 s), and 99 % answered within [`HELD_P99`].
    pub fn holds(&self) -> bool {
        !self.cut_short && self.failed == 0 && self.sent > 0 && self.p50_last <= 1.5 * self.p50_first + 0.25 && self.p99 <= HELD_P99
    }

    /// One line for the test's output and docs/benchmarks.md.
    pub fn line(&self) -> String {
        format!(
            "{:.1} req/s: {} sent, {} failed, median {:.2} s first third → {:.2} s last third, p99 {:.2} s{}: {}",
            self.rate,
            self.sent,
            self.failed,
            self.p50_first,
            self.p50_last,
            self.p99,
            if self.cut_short { ", cut short (the servers' queue grew)" } else { "" },
            if self.holds() { "held" } else { "not held" }
        )
    }
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// `rate` requests per second of `max_new_tokens` tokens through `router` for `secs`, prompts
/// beginning with `prefix`; waits for every answer. Cut short (and not held) once `queued` —
/// the requests the servers hold waiting — stays above `rate` (a second's worth) for a second:
/// an overload left running piles up a backlog the servers serve long after the clients gave
/// up, and the gateway's health checks, queued behind it, take every worker out.
pub fn offer(router: &str, rate: f64, secs: f64, max_new_tokens: u32, prefix: &str, queued: &dyn Fn() -> u64) -> Step {
    let load = Load::start_with(router, rate, max_new_tokens, None, Some(prefix.to_string()));
    let t0 = std::time::Instant::now();
    let mut over = 0;
    while t0.elapsed().as_secs_f64() < secs && over < 4 {
        // Paced looks at the servers' queues while the offered load runs its duration.
        std::thread::sleep(Duration::from_millis(250));
        over = if queued() as f64 > rate.max(8.0) { over + 1 } else { 0 };
    }
    let (sent, failed, answers) = load.stop_with_answers();
    let mut s = step_of(rate, sent, failed, answers);
    s.cut_short = over >= 4;
    s
}

fn step_of(rate: f64, sent: u64, failed: u64, mut answers: Vec<Answer>) -> Step {
    answers.sort_by(|a, b| a.sent_at.total_cmp(&b.sent_at));
    let third = answers.len() / 3;
    let took = |a: &[Answer]| a.iter().map(|x| x.took).collect::<Vec<_>>();
    Step {
        rate,
        sent,
        failed,
        p50_first: quantile(took(&answers[..third]), 0.5),
        p50_last: quantile(took(&answers[answers.len() - third..]), 0.5),
        p99: quantile(took(&answers), 0.99),
        cut_short: false,
    }
}

/// The most this stack holds ([`Step::holds`]), `secs` per rate: from `from` req/s doubled
/// until a rate is not held (or `ceiling` is reached), then once halfway back. `None` when not
/// even `from` is held. Every step tried, in order, beside it. After a rate not held,
/// `settled` waits until the stack serves as before (its backlog served, every worker admitted
/// again) before the next rate.
pub fn sustained(router: &str, from: f64, ceiling: f64, secs: f64, prefix: &str, queued: &dyn Fn() -> u64, settled: &dyn Fn()) -> (Option<f64>, Vec<Step>) {
    let mut steps = Vec::new();
    let mut held: Option<f64> = None;
    let mut rate = from;
    let failed_at = loop {
        let s = offer(router, rate, secs, 16, prefix, queued);
        let ok = s.holds();
        steps.push(s);
        if !ok {
            settled();
            break Some(rate);
        }
        held = Some(rate);
        if rate * 2.0 > ceiling {
            break None;
        }
        rate *= 2.0;
    };
    if let (Some(h), Some(f)) = (held, failed_at) {
        let s = offer(router, (h + f) / 2.0, secs, 16, prefix, queued);
        if s.holds() {
            held = Some(s.rate);
        } else {
            settled();
        }
        steps.push(s);
    }
    (held, steps)
}

/// `n` clients through the gateway, each asking for a `tokens`-token answer again as soon as
/// its last one came back, until [`LongStream::stop`]: long answers are in flight throughout.
pub struct LongStream {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<(u16, u64)>>>,
}

impl LongStream {
    /// Start the `n` clients.
    pub fn start(router: &str, n: usize, tokens: u32) -> LongStream {
        let stop = Arc::new(AtomicBool::new(false));
        let url = format!("{router}/generate");
        let threads = (0..n)
            .map(|i| {
                let (url, stop) = (url.clone(), stop.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                    let mut done = Vec::new();
                    let mut k = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        k += 1;
                        let body = serde_json::json!({
                            "text": format!("{i}.{k} a long answer, please"),
                            "sampling_params": {"max_new_tokens": tokens, "min_new_tokens": tokens, "temperature": 0}
                        });
                        let answer = rt.block_on(async {
                            match super::http().post(&url).json(&body).timeout(Duration::from_secs(600)).send().await {
                                Ok(r) => {
                                    let status = r.status().as_u16();
                                    let v: serde_json::Value = r.json().await.unwrap_or(serde_json::Value::Null);
                                    (status, v["meta_info"]["completion_tokens"].as_u64().unwrap_or(0))
                                }
                                Err(_) => (0, 0),
                            }
                        });
                        if answer.0 != 200 {
                            // A failed ask is not asked again at once: no loop of failures.
                            std::thread::sleep(Duration::from_millis(500));
                        }
                        done.push(answer);
                    }
                    done
                })
            })
            .collect();
        LongStream { stop, threads }
    }

    /// Ask no more; wait for the answers in flight. Every answer: `(status, tokens)`.
    pub fn stop(self) -> Vec<(u16, u64)> {
        self.stop.store(true, Ordering::SeqCst);
        self.threads.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(took: &[f64]) -> Vec<Answer> {
        took.iter().enumerate().map(|(i, t)| Answer { sent_at: i as f64, took: *t, ok: true }).collect()
    }

    #[test]
    fn a_queue_that_grows_is_not_held_and_a_flat_one_is() {
        let flat = step_of(4.0, 9, 0, answers(&[0.3, 0.3, 0.4, 0.3, 0.3, 0.4, 0.3, 0.4, 0.3]));
        assert!(flat.holds(), "{}", flat.line());
        let growing = step_of(8.0, 9, 0, answers(&[0.3, 0.5, 0.8, 1.2, 1.6, 2.0, 2.5, 3.0, 3.5]));
        assert!(!growing.holds(), "{}", growing.line());
        let failing = step_of(8.0, 9, 1, answers(&[0.3; 9]));
        assert!(!failing.holds());
    }
}
