//! What the gateway showed of the stack's workers during a run, sampled every 50 ms.

use std::time::Duration;

/// The largest number of workers of each role that the router did not serve at once, as the test
/// itself saw it (independently of pdctl): `GET /workers` on the first gateway every 50 ms; a
/// worker of the stack counts as down when the router does not list it, or lists it unhealthy or
/// in an smg 1.x state other than `ready` (`pending`, `draining`, …).
///
/// A watch that could not observe says so rather than report "nothing was down": a failed read is
/// retried within its period (each read has `http_get`'s 5 s timeouts, which a loaded 2-core
/// machine needs), `start` returns only after a first good sample, `finish` takes one more after
/// the run, and [`Observed::assert_observed`] fails when two good samples were further apart than
/// the shortest outage pdctl causes ([`MAX_GAP`]), naming the counts.
pub struct RouterWatch {
    shared: std::sync::Arc<WatchShared>,
    handle: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct WatchShared {
    stop: std::sync::atomic::AtomicBool,
    silent: std::sync::atomic::AtomicBool,
    /// How many silences were announced (a read that overlaps one belongs to it).
    silences: std::sync::atomic::AtomicUsize,
    seen: std::sync::Mutex<Observed>,
}

/// How often the watch reads the router.
const WATCH_PERIOD: Duration = Duration::from_millis(50);
/// Reads of one sample before it counts as unanswered (each bounded by `http_get`'s timeouts).
const WATCH_TRIES: usize = 3;
/// The longest gap between two good samples that still observes every outage pdctl causes: the
/// shortest is a drain, a simulated server's start and a re-admission, well over 3 s.
pub const MAX_GAP: Duration = Duration::from_secs(3);

/// What a [`RouterWatch`] saw.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Role → the most workers of that role down in one sample.
    pub max_down: std::collections::BTreeMap<String, usize>,
    /// Samples with both roles down at once (a full outage of the pair).
    pub both_down: usize,
    /// Samples taken (the router answered).
    pub samples: usize,
    /// Samples the router did not answer in any of its tries, outside a silence the test announced.
    pub unreachable: usize,
    /// Samples the router did not answer while the test said it would not ([`RouterWatch::silence`]).
    pub unreachable_while_silent: usize,
    /// The longest time between two good samples (a silence the test announced excepted).
    pub longest_gap: Duration,
}

impl Observed {
    /// The most workers of `role` down at once.
    pub fn down(&self, role: &str) -> usize {
        self.max_down.get(role).copied().unwrap_or(0)
    }

    /// The watch saw the router often enough that no outage could slip between two samples;
    /// otherwise the test fails as "could not observe the router", with the counts.
    #[track_caller]
    pub fn assert_observed(&self) {
        assert!(
            self.samples >= 2 && self.longest_gap <= MAX_GAP,
            "could not observe the router: {} good samples, {} unanswered, longest gap between good samples {} ms (at most {} ms observes every outage): {self:?}",
            self.samples,
            self.unreachable,
            self.longest_gap.as_millis(),
            MAX_GAP.as_millis()
        );
    }

    /// Assert the most prefills and decodes down at once, as the router showed them (after
    /// [`Observed::assert_observed`]).
    #[track_caller]
    pub fn assert_down(&self, prefill: usize, decode: usize) {
        self.assert_observed();
        assert_eq!((self.down("prefill"), self.down("decode")), (prefill, decode), "most (prefill, decode) workers down at once, from the router: {self:?}");
    }
}

/// One read of the router's worker list: `None` when it did not answer 200 with a list.
fn read_workers(url: &str) -> Option<Vec<serde_json::Value>> {
    pdctl_sandbox::stack::http_get(url)
        .ok()
        .filter(|(status, _)| *status == 200)
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
        .and_then(|v| v["workers"].as_array().cloned())
}

impl RouterWatch {
    /// Start watching the stack's first gateway; returns after the first good sample (bounded:
    /// a router that never answers fails the test here, as "could not observe").
    pub fn start(stack: &pdctl_sandbox::stack::Stack) -> RouterWatch {
        use std::sync::atomic::Ordering::SeqCst;
        let url = stack.router.as_ref().map(|r| format!("{}/workers", r.url)).expect("the stack has a router");
        let workers: Vec<(String, &'static str)> = stack.workers().iter().map(|w| (w.url.clone(), w.role)).collect();
        let shared = std::sync::Arc::new(WatchShared::default());
        let sh = shared.clone();
        let handle = std::thread::spawn(move || {
            let mut last_good: Option<std::time::Instant> = None;
            let mut silent_since_good = false;
            loop {
                let stopping = sh.stop.load(SeqCst);
                let silences = sh.silences.load(SeqCst);
                let silent_at_start = sh.silent.load(SeqCst);
                let listed = (0..WATCH_TRIES).find_map(|_| read_workers(&url));
                // Silent if a silence was on at the read's start or end, or began during it (a
                // read begun just before the test stopped the router is the silence's).
                let silent = silent_at_start || sh.silent.load(SeqCst) || sh.silences.load(SeqCst) != silences;
                silent_since_good |= silent;
                let mut seen = sh.seen.lock().unwrap_or_else(|p| p.into_inner());
                match listed {
                    None if silent => seen.unreachable_while_silent += 1,
                    None => seen.unreachable += 1,
                    Some(list) => {
                        let now = std::time::Instant::now();
                        if let (Some(t), false) = (last_good, silent_since_good) {
                            seen.longest_gap = seen.longest_gap.max(now - t);
                        }
                        last_good = Some(now);
                        silent_since_good = silent;
                        seen.samples += 1;
                        let serving = |url: &str| {
                            list.iter().any(|w| {
                                w["url"].as_str().is_some_and(|u| u.trim_end_matches('/') == url)
                                    && w["is_healthy"] == true
                                    && (w["status"].is_null() || w["status"] == "ready")
                            })
                        };
                        let mut now: std::collections::BTreeMap<String, usize> = Default::default();
                        for (u, role) in &workers {
                            *now.entry(role.to_string()).or_default() += usize::from(!serving(u));
                        }
                        if now.values().filter(|n| **n > 0).count() > 1 {
                            seen.both_down += 1;
                        }
                        for (role, n) in now {
                            let m = seen.max_down.entry(role).or_default();
                            *m = (*m).max(n);
                        }
                    }
                }
                drop(seen);
                if stopping {
                    break;
                }
                std::thread::sleep(WATCH_PERIOD);
            }
        });
        let watch = RouterWatch { shared, handle: Some(handle) };
        watch.wait_until("its first good sample", Duration::from_secs(60), |o| o.samples > 0);
        watch
    }

    /// What was seen so far.
    pub fn now(&self) -> Observed {
        self.shared.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wait (bounded) until what was seen satisfies `cond`; fails the test as "could not observe"
    /// past the deadline.
    #[track_caller]
    pub fn wait_until(&self, what: &str, deadline: Duration, cond: impl Fn(&Observed) -> bool) {
        let t0 = std::time::Instant::now();
        loop {
            let seen = self.now();
            if cond(&seen) {
                return;
            }
            assert!(t0.elapsed() < deadline, "could not observe the router: no {what} within {deadline:?}: {seen:?}");
            std::thread::sleep(WATCH_PERIOD);
        }
    }

    /// The test makes the router unable to answer (`true`) or lets it answer again (`false`):
    /// unanswered reads meanwhile are counted apart, and the silence is not a gap.
    pub fn silence(&self, silent: bool) {
        if silent {
            self.shared.silences.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.shared.silent.store(silent, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stop after one more sample taken from now on, and return what was seen.
    pub fn finish(mut self) -> Observed {
        self.shared.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.now()
    }
}

impl Drop for RouterWatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
