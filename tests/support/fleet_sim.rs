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
}

/// The real coordinator, with every `lose_every`-th successful transaction's answer dropped.
struct Lossy {
    inner: pdctl_core::real::EtcdCoordinator,
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
    fn cas(&self, changes: Vec<CasChange>) -> BoxFut<'_, Result<bool, FleetFailure>> {
        Box::pin(async move {
            let applied = self.inner.cas(changes).await?;
            if applied && self.every > 0 && self.n.fetch_add(1, Ordering::SeqCst) % self.every == self.every - 1 {
                self.lost.fetch_add(1, Ordering::SeqCst);
                return Err(FleetFailure("the answer was lost (simulated)".into()));
            }
            Ok(applied)
        })
    }
}

/// Run one simulated fleet rollout against the etcd at `etcd` (restarted through `restart`
/// when the spec says so).
pub async fn run(spec: &SimSpec, etcd_url: &str, restart_etcd: impl FnOnce() + Send + 'static) -> SimReport {
    let name = format!("sim{}", fleet::now_secs() % 100_000);
    let settings = pdctl_core::config::FleetSettings {
        etcd: vec![etcd_url.to_string()],
        name: name.clone(),
        host: "bench".into(),
        slot_timeout: Duration::from_secs(3600),
        max_unavailable: [("prefill".to_string(), spec.max_unavailable), ("decode".to_string(), spec.max_unavailable)].into(),
        user: None,
        canary: None,
        bake: None,
        storm: Default::default(),
        tls: None,
    };
    let c = Arc::new(Lossy { inner: pdctl_core::real::EtcdCoordinator::new(&settings), every: spec.lose_every, n: AtomicU64::new(0), lost: AtomicU64::new(0) });
    let limits = Limits { max_unavailable: settings.max_unavailable.clone() };
    let failed = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    if let Some(after) = spec.etcd_restart_after {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tokio::task::spawn_blocking(restart_etcd).await;
        });
    }
    let mut tasks = Vec::new();
    for h in 0..spec.hosts {
        let (c, limits, name, failed, restart) = (c.clone(), limits.clone(), name.clone(), failed.clone(), spec.restart);
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
                loop {
                    match fleet::try_acquire(c.as_ref(), &name, &limits, &[(role.to_string(), want.clone())], &BTreeMap::new()).await {
                        Ok(Acquired::Granted(held)) => {
                            // A retry after a lost answer finds its own hold: give back that one.
                            let hold = held.into_iter().next().map(|(_, h)| h).unwrap_or(want.clone());
                            waits.push(asked.elapsed());
                            tokio::time::sleep(restart).await;
                            loop {
                                match fleet::release(c.as_ref(), &name, role, &hold.holder, &hold.token).await {
                                    Ok(_) => break,
                                    Err(_) => {
                                        // Lost or etcd down: release again (a second release of a
                                        // hold already given back frees nothing).
                                        failed.fetch_add(1, Ordering::SeqCst);
                                        tokio::time::sleep(Duration::from_millis(50)).await;
                                    }
                                }
                            }
                            break;
                        }
                        Ok(Acquired::Wait(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
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
    let mut max_down = BTreeMap::new();
    let etcd = pdctl_fleet::Etcd::connect(&[etcd_url.to_string()], None, None, Duration::from_secs(5)).await;
    if let Ok(mut e) = etcd {
        let now = e.revision().await.unwrap_or(0);
        for role in ["prefill", "decode"] {
            let key = fleet::slot_key(&name, role);
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
    SimReport { total, waits, max_down, lost: c.lost.load(Ordering::SeqCst), failed_calls: failed.load(Ordering::SeqCst) }
}

/// The `p`-th percentile of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
