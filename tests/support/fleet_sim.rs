//! A fleet simulated on the production slot code: `hosts` tasks, each a host with one prefill and
//! one decode worker, restarting both through `pdctl_core::fleet::try_acquire`/`release` against a
//! real etcd — systemd and the servers faked (a restart is a sleep). Faults injected: lost
//! responses (a transaction that applied, whose answer is dropped: the host retries and must find
//! its own hold, never a second one) and an etcd restart mid-run. The most workers of a role
//! ever down at once is read back from etcd's revision history, not from the simulation's own
//! bookkeeping. Used by `scripts/bench-fleet` (10, 100, 500 hosts) and by a test at ~30 hosts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pdctl_core::fleet::{self, Acquired, Hold, Limits};
use pdctl_core::ports::{BoxFut, CasChange, Coordinator, FleetFailure, KvEntry};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimSpec {
    /// Hosts (each one prefill + one decode).
    pub hosts: usize,
    /// Fleet-wide limit per role.
    pub max_unavailable: u32,
    /// How long a simulated restart takes.
    pub restart: Duration,
    /// One transaction answer in this many is lost (0: none).
    pub lose_every: u64,
    /// Restart etcd once, this far into the run.
    pub etcd_restart_after: Option<Duration>,
    /// How a host that must wait for a slot waits: `None`, as pdctl does (a watch on the slot
    /// keys, [`fleet::wait_for_room`]); `Some(d)`, by sleeping `d` between tries (pdctl before
    /// the watch: 1 s).
    pub poll: Option<Duration>,
}

/// What the run measured.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// Wall time of the whole fleet rollout.
    pub total: Duration,
    /// Slot waits (from asking to holding), sorted.
    pub waits: Vec<Duration>,
    /// Per role: the most holders at any revision of its semaphore in etcd.
    pub max_down: BTreeMap<String, usize>,
    /// Answers dropped on purpose.
    pub lost: u64,
    /// Calls that failed (etcd down), retried.
    pub failed_calls: u64,
    /// Slot waits that ended at their fallback instead of by a change (with the watch: a grant
    /// the watch missed would show here).
    pub fallbacks: u64,
}

/// The real coordinator, with every `lose_every`-th successful transaction's answer dropped.
struct Lossy {
    inner: pdctl_real::EtcdCoordinator,
    every: u64,
    n: AtomicU64,
    lost: AtomicU64,
}

impl Coordinator for Lossy {
    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<Option<KvEntry>, FleetFailure>> {
        self.inner.get(key)
    }
    fn get_prefix<'a>(&'a self, prefix: &'a str) -> BoxFut<'a, Result<Vec<KvEntry>, FleetFailure>> {
        self.inner.get_prefix(prefix)
    }
    fn revision(&self) -> BoxFut<'_, Result<i64, FleetFailure>> {
        self.inner.revision()
    }
    fn watch(&self, keys: Vec<(String, bool)>, after: i64) -> BoxFut<'_, Result<Box<dyn pdctl_core::ports::ChangeWatch>, FleetFailure>> {
        self.inner.watch(keys, after)
    }
    fn cas(&self, changes: Vec<CasChange>) -> BoxFut<'_, Result<bool, FleetFailure>> {
        Box::pin(async move {
            let applied = self.inner.cas(changes).await?;
            if applied && self.every > 0 && self.n.fetch_add(1, Ordering::SeqCst) % self.every == self.every - 1 {
                self.lost.fetch_add(1, Ordering::SeqCst);
                return Err(FleetFailure::Unreachable("the answer was lost (simulated)".into()));
            }
            Ok(applied)
        })
    }
}

/// The fleet settings every simulated host shares: fleet `name` at `etcd_url`, no budget.
fn bench_settings(etcd_url: &str, name: &str) -> pdctl_core::config::FleetSettings {
    pdctl_core::config::FleetSettings {
        etcd: vec![etcd_url.to_string()],
        name: name.to_string(),
        host: "bench".into(),
        slot_timeout: Duration::from_secs(3600),
        max_unavailable: Default::default(),
        user: None,
        canary: None,
        keep_rollouts: 200,
        bake: None,
        storm: Default::default(),
        tls: None,
    }
}

/// [`bench_settings`] with the simulation's budget per role.
fn sim_settings(spec: &SimSpec, etcd_url: &str, name: &str) -> pdctl_core::config::FleetSettings {
    let max_unavailable = [("prefill".to_string(), spec.max_unavailable), ("decode".to_string(), spec.max_unavailable)].into();
    pdctl_core::config::FleetSettings { max_unavailable, ..bench_settings(etcd_url, name) }
}

/// Run one simulated fleet rollout against the etcd at `etcd` (restarted through `restart`
/// when the spec says so).
pub async fn run(spec: &SimSpec, etcd_url: &str, restart_etcd: impl FnOnce() + Send + 'static) -> SimReport {
    let name = format!("sim{}", fleet::now_secs() % 100_000);
    let settings = sim_settings(spec, etcd_url, &name);
    let c = Arc::new(Lossy { inner: pdctl_real::EtcdCoordinator::new(&settings), every: spec.lose_every, n: AtomicU64::new(0), lost: AtomicU64::new(0) });
    let limits = Limits { max_unavailable: settings.max_unavailable.clone() };
    let failed = Arc::new(AtomicU64::new(0));
    let fallbacks = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    if let Some(after) = spec.etcd_restart_after {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tokio::task::spawn_blocking(restart_etcd).await;
        });
    }
    let mut tasks = Vec::new();
    for h in 0..spec.hosts {
        let (c, limits, name, failed, restart, poll, fallbacks) =
            (c.clone(), limits.clone(), name.clone(), failed.clone(), spec.restart, spec.poll, fallbacks.clone());
        tasks.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            for role in ["prefill", "decode"] {
                let want = Hold {
                    holder: fleet::holder(&format!("host-{h:04}"), &format!("sglang-{role}.service")),
                    url: format!("http://10.0.{}.{}:3000{}", h / 250, h % 250, if role == "prefill" { 3 } else { 2 }),
                    token: fleet::token(),
                    since: fleet::now_secs(),
                    rollout: "sim".into(),
                };
                let asked = Instant::now();
                let wants = [(role.to_string(), want.clone())];
                loop {
                    // pdctl reads the revision the wait watches from; the old polling did not.
                    let before = if poll.is_none() { c.revision().await.unwrap_or(0) } else { 0 };
                    match fleet::try_acquire(c.as_ref(), &name, &limits, &wants, &BTreeMap::new()).await {
                        Ok(Acquired::Granted(held)) => {
                            // A retry after a lost answer finds its own hold: give back that one.
                            let hold = held.into_iter().next().map(|(_, h)| h).unwrap_or(want.clone());
                            waits.push(asked.elapsed());
                            tokio::time::sleep(restart).await;
                            released(c.as_ref(), &name, role, &hold, &failed).await;
                            break;
                        }
                        Ok(Acquired::Wait(_)) => match poll {
                            Some(d) => tokio::time::sleep(d).await,
                            None => {
                                let woken = fleet::wait_for_room(c.as_ref(), &name, &limits, &wants, before, fleet::SLOT_FALLBACK).await;
                                if woken == fleet::Woken::Fallback {
                                    fallbacks.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                        },
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
            waits
        }));
    }
    let mut waits = Vec::new();
    for t in tasks {
        waits.extend(t.await.unwrap_or_default());
    }
    let total = t0.elapsed();
    waits.sort();
    let max_down = max_holders(etcd_url, &name).await;
    SimReport {
        total,
        waits,
        max_down,
        lost: c.lost.load(Ordering::SeqCst),
        failed_calls: failed.load(Ordering::SeqCst),
        fallbacks: fallbacks.load(Ordering::SeqCst),
    }
}

/// Give `hold` back, again until etcd takes it: an answer lost or etcd down counts in `failed`
/// (a second release of a hold already given back frees nothing).
async fn released(c: &Lossy, name: &str, role: &str, hold: &Hold, failed: &AtomicU64) {
    while fleet::release(c, name, role, &hold.holder, &hold.token).await.is_err() {
        failed.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The most holders each role's semaphore ever had, over the revisions etcd kept.
async fn max_holders(etcd_url: &str, name: &str) -> BTreeMap<String, usize> {
    let mut max_down = BTreeMap::new();
    let etcd = pdctl_fleet::Etcd::connect(&[etcd_url.to_string()], None, None, Duration::from_secs(5)).await;
    if let Ok(mut e) = etcd {
        let now = e.revision().await.unwrap_or(0);
        for role in ["prefill", "decode"] {
            let key = fleet::slot_key(name, role);
            let mut max = 0;
            let mut rev = now;
            // Walk the key's versions backwards through etcd's history (each version's
            // mod_revision - 1 is the revision before it).
            while rev > 0 {
                match e.get_at(&key, Some(rev)).await {
                    Ok(Some(v)) => {
                        if let Ok(s) = serde_json::from_slice::<fleet::Semaphore>(&v.value) {
                            max = max.max(s.holders.len());
                        }
                        rev = v.mod_revision - 1;
                    }
                    _ => break,
                }
            }
            max_down.insert(role.to_string(), max);
        }
    }
    max_down
}

/// etcd's counters of gRPC messages, summed over its methods: `(received, sent)` — every unary
/// call is one received; a stream's every message counts (a watch's creation, a lease
/// keep-alive; a watch's events are messages sent).
pub async fn etcd_messages(etcd_url: &str) -> (f64, f64) {
    let text = match reqwest::Client::new().get(format!("{etcd_url}/metrics")).timeout(Duration::from_secs(10)).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let sum = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum::<f64>()
    };
    (sum("grpc_server_msg_received_total"), sum("grpc_server_msg_sent_total"))
}

/// What an idle fleet asks of etcd, per second.
#[derive(Debug, Clone, Copy)]
pub struct IdleReport {
    /// Messages etcd received per second (calls, watch creations, keep-alives).
    pub received_per_s: f64,
    /// Messages etcd sent per second (answers, watch events).
    pub sent_per_s: f64,
}

/// `hosts` idle hosts against the etcd at `etcd_url` for `window`, each with its own connection,
/// doing what a host's pdctld does with etcd while no rollout runs: its liveness lease, its wait
/// for fleet-rollout requests and the fleet-wide restart-storm check. `baseline`: as pdctld did
/// before the watches (the requests listed every second, the storm check every 5 s, the liveness
/// value rewritten at every keep-alive of a 10 s lease); else as it does now (the pdctl-core
/// calls and constants pdctld uses: a watch on the requests with its fallback, the storm check at
/// its fallback, a 30 s lease whose value is written only when it changes). Every host's
/// periodic work starts at a random phase, so that a window shorter than a period sees its mean
/// rate. The baseline keeps one connection per host (pdctld then made a new one every tick: what
/// it sent was more, not less).
pub async fn idle(hosts: usize, etcd_url: &str, baseline: bool, window: Duration) -> IdleReport {
    let name = format!("idle{}", fleet::now_secs() % 100_000);
    let settings = bench_settings(etcd_url, &name);
    let phase = |period: Duration| Duration::from_millis(pdctl_core::sglang::pairing::room() % (period.as_millis() as u64).max(1));
    let mut conns = Vec::new();
    for _ in 0..hosts {
        let c = Arc::new(pdctl_real::EtcdCoordinator::new(&settings));
        let _ = c.revision().await; // connected before the window
        conns.push(c);
    }
    let mut tasks = Vec::new();
    for (h, c) in conns.into_iter().enumerate() {
        let (name, period_req, period_storm, ttl) = if baseline {
            (name.clone(), Duration::from_secs(1), Duration::from_secs(5), 10)
        } else {
            (name.clone(), fleet::REQUESTS_FALLBACK, fleet::STORM_FALLBACK, fleet::LIVENESS_TTL_SECS)
        };
        // Liveness: the production keep-alive; the baseline's value changed every time
        // (its `updated_at`), now it changes once a minute.
        let etcd = pdctl_fleet::Etcd::connect(&[etcd_url.to_string()], None, None, Duration::from_secs(5)).await;
        let keep = etcd.ok().map(|e| {
            let t0 = Instant::now().checked_sub(phase(Duration::from_secs(60))).unwrap_or_else(Instant::now);
            let n = AtomicU64::new(0);
            e.keep_alive(fleet::host_key(&name, &format!("host-{h:04}")), ttl, move || {
                let v = if baseline { n.fetch_add(1, Ordering::SeqCst) } else { t0.elapsed().as_secs() / 60 };
                format!("{{\"host\":\"host-{h:04}\",\"v\":{v}}}").into_bytes()
            })
        });
        let p = fleet::requests_prefix(&name);
        let (c2, name2) = (c.clone(), name.clone());
        let requests = tokio::spawn(async move {
            tokio::time::sleep(phase(period_req)).await;
            loop {
                if baseline {
                    let _ = c2.get_prefix(&p).await;
                    tokio::time::sleep(period_req).await;
                } else {
                    // As pdctld's loop: the revision, the list, the watch from that revision.
                    let before = c2.revision().await.unwrap_or(0);
                    let _ = c2.get_prefix(&p).await;
                    fleet::wait_for_requests(c2.as_ref(), &p, before, period_req).await;
                }
            }
        });
        let storm = tokio::spawn(async move {
            tokio::time::sleep(phase(period_storm)).await;
            loop {
                let _ = fleet::paused(c.as_ref(), &name2).await;
                let _ = fleet::storm_since(c.as_ref(), &name2).await;
                let _ = fleet::hosts(c.as_ref(), &name2).await;
                tokio::time::sleep(period_storm).await;
            }
        });
        tasks.push((requests, storm, keep));
    }
    // Every host's lease granted and first value written before the window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (r0, s0) = etcd_messages(etcd_url).await;
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let (r1, s1) = etcd_messages(etcd_url).await;
    let secs = t0.elapsed().as_secs_f64();
    for (a, b, k) in tasks {
        a.abort();
        b.abort();
        if let Some(k) = k {
            k.abort();
        }
    }
    IdleReport { received_per_s: (r1 - r0) / secs, sent_per_s: (s1 - s0) / secs }
}

/// The `p`-th percentile of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
