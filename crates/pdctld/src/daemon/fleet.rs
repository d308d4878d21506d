//! Fleet participation: this host's liveness key, and its part of fleet rollouts.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use pdctl_contract::api::{HostResult, Request, Started, StartedBy};

use super::rollouts::start;
use super::{config, engine, lock, Daemon};

/// The liveness value is rewritten when it changes, and at least this often (its `updated_at`).
/// Fleet parts of this host waiting or running at once (one runs; the others wait for a canary
/// or the running slot): a bound, so that requests from a bad peer cannot pile up waits.
const MAX_PARTS_WAITING: usize = 8;
/// How far in the future a request's `created_at` may be (clocks of hosts differ a little).
const FUTURE_SLACK_SECS: u64 = 300;
static PARTS_WAITING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

const LIVENESS_REWRITE_SECS: u64 = 60;
/// The fleet-wide storm check runs when this host's own restarts change (and once more this
/// long after), else at least every `pdctl_core::fleet::STORM_FALLBACK`.
const STORM_RECHECK: std::time::Duration = std::time::Duration::from_secs(15);

/// How often a host deletes old finished fleet rollouts from etcd (`[fleet] keep_rollouts`).
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// How soon retention tries again after a pass that failed (etcd unreachable or slow).
const PRUNE_RETRY: std::time::Duration = std::time::Duration::from_secs(30);
/// How often retention looks again at a config without `[fleet]`: pdctld reads its config at
/// each use, so `[fleet]` added to a running pdctld is taken up within this.
const PRUNE_UNCONFIGURED: std::time::Duration = std::time::Duration::from_secs(2);
/// The longest a host waits for the fleet rollout's canary host to report.
const CANARY_WAIT: std::time::Duration = std::time::Duration::from_secs(12 * 3600);
/// How long the canary's liveness key may be gone before the wait for it ends.
const CANARY_GONE: std::time::Duration = std::time::Duration::from_secs(60);

impl Daemon {
    /// With `[fleet]`: keep this host's liveness key in etcd (bound to a lease: it disappears
    /// within `LIVENESS_TTL_SECS` (30 s) of pdctld's death), looked at every 5 s and rewritten when
    /// the running rollout, a worker's state or the host's own restarts change (each worker's
    /// KV usage and `updated_at` at least every [`LIVENESS_REWRITE_SECS`]: an idle host writes
    /// nothing else); check the fleet for a restart storm; and give back slots left on record
    /// once their workers serve.
    pub async fn fleet_liveness(self: Arc<Self>) {
        let value: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new(Vec::new()));
        let mut alive: Option<(String, tokio::task::JoinHandle<()>)> = None;
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        // What was last written, without the figures that move by themselves, and when.
        let mut written: Option<(pdctl_core::fleet::HostState, u64)> = None;
        // When the fleet-wide storm check runs next, and this host's restarts it last saw.
        let mut storm_at = std::time::Instant::now();
        let mut own_restarts = 0usize;
        loop {
            tick.tick().await;
            let fleet = config(&self).ok().and_then(|s| s.fleet);
            let Some(f) = fleet else {
                if let Some((_, h)) = alive.take() {
                    h.abort();
                }
                continue;
            };
            let key = pdctl_core::fleet::host_key(&f.name, &f.host);
            if alive.as_ref().is_some_and(|(k, _)| *k != key) {
                if let Some((_, h)) = alive.take() {
                    h.abort();
                }
            }
            let Ok(e) = engine(&self).await else { continue };
            let now = pdctl_core::fleet::now_secs();
            let st = self.host_state(&e, &f.host, &f.storm, now).await;
            let steady = |s: &pdctl_core::fleet::HostState| {
                let mut s = s.clone();
                s.updated_at = 0;
                s.workers.iter_mut().for_each(|w| w.kv_usage = None);
                s
            };
            let due = match &written {
                Some((last, at)) => *last != steady(&st) || now.saturating_sub(*at) >= LIVENESS_REWRITE_SECS,
                None => true,
            };
            if due {
                *lock(&value) = serde_json::to_vec(&st).unwrap_or_default();
                written = Some((steady(&st), now));
            }
            if alive.is_none() {
                match pdctl_real::etcd_connect(&f.etcd, f.user.as_ref(), f.tls.as_ref()).await {
                    Ok(etcd) => {
                        let v = value.clone();
                        alive = Some((key.clone(), etcd.keep_alive(key.clone(), pdctl_core::fleet::LIVENESS_TTL_SECS, move || lock(&v).clone())));
                    }
                    Err(err) => tracing::warn!("this host's fleet liveness key cannot be written: {err}"),
                }
            }
            // Every host's self-restarts, from their keys: a storm pauses the fleet. A storm is
            // made of restarts, each seen first by its own host: checked when this host's change
            // (and once more a little later, for a restart on another host written meanwhile),
            // else at the fallback's pace.
            if st.self_restarts.len() != own_restarts {
                own_restarts = st.self_restarts.len();
                storm_at = std::time::Instant::now();
            }
            if std::time::Instant::now() >= storm_at {
                self.fleet_storm(&self.coordinator(&f)).await;
                let recheck = st.self_restarts.iter().any(|r| now.saturating_sub(r.at) < STORM_RECHECK.as_secs());
                storm_at = std::time::Instant::now() + if recheck { STORM_RECHECK } else { pdctl_core::fleet::STORM_FALLBACK };
            }
            if self.running_id().is_none() && !self.reconciling.load(Ordering::SeqCst) {
                for n in e.reconcile_slots(self.store.ledger(), None).await {
                    tracing::warn!("{n}");
                }
            }
        }
    }

    /// This host as its liveness key says it at `now`: each worker's state and KV use, the
    /// running rollout, its own restarts, its maintenance.
    async fn host_state(&self, e: &pdctl_real::RealEngine, host: &str, storm: &pdctl_core::service::storm::Storm, now: u64) -> pdctl_core::fleet::HostState {
        let mut workers = Vec::new();
        for w in &e.settings.workers {
            let state = pdctl_core::ports::Units::state(&e.units, &w.unit)
                .await
                .map(|s| format!("{}/{}", s.active_state, s.sub_state))
                .unwrap_or_else(|err| format!("unknown ({err})"));
            let kv_usage = tokio::time::timeout(std::time::Duration::from_secs(3), pdctl_core::ports::Probes::kv(&e.probes, &w.url))
                .await
                .ok()
                .and_then(|r| r.ok())
                .map(|k| k.token_usage);
            workers.push(pdctl_core::fleet::HostWorker { unit: w.unit.clone(), url: w.url.clone(), role: w.role.as_str().into(), state, kv_usage });
        }
        pdctl_core::fleet::HostState {
            host: host.to_string(),
            version: env!("CARGO_PKG_VERSION").into(),
            rollout: self.running_id(),
            workers,
            self_restarts: self.self_restarts(storm),
            maintenance: self.store.ledger().maintenance().ok().flatten().map(|m| pdctl_core::fleet::InMaintenance {
                id: m.id,
                phase: m.phase,
                since: m.since,
            }),
            updated_at: now,
        }
    }
}

impl Daemon {
    /// With `[fleet]`: retention of fleet rollouts in etcd, at start and then every
    /// [`PRUNE_EVERY`] ([`PRUNE_RETRY`] after a failed pass; a config without `[fleet]` is looked
    /// at again every [`PRUNE_UNCONFIGURED`]): the oldest finished ones beyond
    /// `[fleet] keep_rollouts` are deleted. A task
    /// of its own: a first pass over a long history (thousands of rollouts) never delays this
    /// host's part of a new fleet rollout.
    pub async fn fleet_retention(self: Arc<Self>) {
        loop {
            let next = match config(&self).ok().and_then(|s| s.fleet) {
                None => PRUNE_UNCONFIGURED,
                Some(f) => {
                    let c = self.coordinator(&f);
                    match pdctl_core::fleet::prune_rollouts(c.as_ref(), &f.name, f.keep_rollouts as usize).await {
                        Ok(gone) => {
                            if !gone.is_empty() {
                                tracing::info!(
                                    "fleet retention: deleted {} finished fleet rollout(s) beyond the newest {} from etcd",
                                    gone.len(),
                                    f.keep_rollouts
                                );
                            }
                            PRUNE_EVERY
                        }
                        Err(e) => {
                            tracing::warn!("fleet retention: old fleet rollouts not deleted this time ({e}); trying again in {} s", PRUNE_RETRY.as_secs());
                            PRUNE_RETRY
                        }
                    }
                }
            };
            tokio::time::sleep(next).await;
        }
    }

    /// With `[fleet]`: take part in fleet rollouts. Every new request under `rollouts/` that names
    /// this host is run here as a local rolling restart (after the canary host succeeded, when
    /// one is set; not at all once another host failed), its events and summary written back to
    /// etcd for `pdctl fleet watch`. Another host failing stops the local part between units.
    /// A request this host finds unanswered when it starts is marked interrupted, never resumed
    /// by itself.
    pub async fn fleet_rollouts(self: Arc<Self>) {
        use pdctl_core::ports::Coordinator as _;
        let mut seen: std::collections::BTreeSet<String> = Default::default();
        // Requests older than this process were cut short by its predecessor's stop.
        let born = pdctl_core::fleet::now_secs();
        let second = std::time::Duration::from_secs(1);
        loop {
            let Some(f) = config(&self).ok().and_then(|s| s.fleet) else {
                tokio::time::sleep(second).await;
                continue;
            };
            if self.reconciling.load(Ordering::SeqCst) {
                tokio::time::sleep(second).await;
                continue;
            }
            let c = self.coordinator(&f);
            let p = pdctl_core::fleet::requests_prefix(&f.name);
            // Read, then wait on a watch from the revision before the read (a request written
            // between the two is not missed); listed again at least every REQUESTS_FALLBACK.
            let Ok(before) = c.revision().await else {
                tokio::time::sleep(second).await;
                continue;
            };
            let Ok(entries) = c.get_prefix(&p).await else {
                tokio::time::sleep(second).await;
                continue;
            };
            // Forget requests that are gone (retention deleted them): `seen` stays as long as
            // the listing.
            let listed: std::collections::BTreeSet<&str> = entries.iter().map(|e| e.key.trim_start_matches(&p)).collect();
            seen.retain(|k| listed.contains(k.as_str()));
            for e in entries {
                let rest = e.key.trim_start_matches(&p);
                if seen.contains(rest) {
                    continue;
                }
                seen.insert(rest.to_string());
                let Ok(r) = serde_json::from_slice::<pdctl_core::fleet::FleetRollout>(&e.value) else { continue };
                if !r.hosts.contains(&f.host) {
                    continue;
                }
                let mine = pdctl_core::fleet::host_summary_key(&f.name, &r.id, &f.host);
                if c.get(&mine).await.ok().flatten().is_some() {
                    continue;
                }
                // Input from other hosts is checked, never trusted: a request written in the
                // future, or naming a canary that is not one of its hosts, is named and skipped
                // (each would wait hours); at most MAX_PARTS_WAITING parts wait at once.
                if let Some(why) = skipped(&r) {
                    tracing::warn!("fleet rollout {}: {why}", r.id);
                    let s = pdctl_core::fleet::HostSummary::ended_without_rollout(&f.host, HostResult::NotStarted, why);
                    let _ = fleet_put(&c, &mine, &s).await;
                    continue;
                }
                if r.created_at < born {
                    // Unanswered, from before this pdctld started: its local part was cut short
                    // by the previous pdctld's stop.
                    let why = "pdctld stopped during its part; resume the local rollout (pdctl rollout history) once checked".to_string();
                    let s = pdctl_core::fleet::HostSummary::ended_without_rollout(&f.host, HostResult::Interrupted, why);
                    let _ = fleet_put(&c, &mine, &s).await;
                    continue;
                }
                PARTS_WAITING.fetch_add(1, Ordering::SeqCst);
                let me = self.clone();
                let f = f.clone();
                tokio::spawn(async move {
                    me.fleet_part(f, r).await;
                    PARTS_WAITING.fetch_sub(1, Ordering::SeqCst);
                });
            }
            pdctl_core::fleet::wait_for_requests(c.as_ref(), &p, before, pdctl_core::fleet::REQUESTS_FALLBACK).await;
        }
    }

    /// The fleet's etcd for the idle loops: one connection, kept while `[fleet]`'s endpoints,
    /// user and TLS stay the same.
    pub(super) fn coordinator(&self, f: &pdctl_core::config::FleetSettings) -> Arc<pdctl_real::EtcdCoordinator> {
        let key = format!("{:?}|{:?}|{:?}", f.etcd, f.user, f.tls);
        let mut g = lock(&self.etcd);
        match g.as_ref() {
            Some((k, c)) if *k == key => c.clone(),
            _ => {
                let c = Arc::new(pdctl_real::EtcdCoordinator::new(f));
                *g = Some((key, c.clone()));
                c
            }
        }
    }

    pub(super) async fn fleet_part(self: Arc<Self>, f: pdctl_core::config::FleetSettings, r: pdctl_core::fleet::FleetRollout) {
        // The daemon's one etcd connection: a part per request on its own connection let 250
        // forged requests exhaust the descriptors.
        let shared = self.coordinator(&f);
        let c: &pdctl_real::EtcdCoordinator = shared.as_ref();
        let summary_key = pdctl_core::fleet::host_summary_key(&f.name, &r.id, &f.host);
        let not_started = |why: String| pdctl_core::fleet::HostSummary::ended_without_rollout(&f.host, HostResult::NotStarted, why);
        // The canary goes first; the others start only once it succeeded. (New weights go into
        // every host at once, in step: no canary.)
        if let Some(canary) = r.canary.as_ref().filter(|c| **c != f.host && r.weights.is_none()) {
            if let Err(why) = canary_succeeded(c, &f, &r.id, canary).await {
                let _ = fleet_put(c, &summary_key, &not_started(why)).await;
                return;
            }
        }
        if let Some((h, _)) = fleet_summaries(c, &f.name, &r.id).await.into_iter().find(|(_, s)| s.result == HostResult::Failed) {
            let _ = fleet_put(c, &summary_key, &not_started(format!("{h} failed first: the fleet rollout halts everywhere"))).await;
            return;
        }
        let by =
            StartedBy { uid: None, reason: r.reason.clone(), fleet_rollout: Some(r.id.clone()), fleet_by: Some(r.by.clone()), fleetlock: None, pdctld: false };
        let request = match &r.weights {
            Some(w) => Request::Weights {
                model_path: w.model_path.clone(),
                version: w.version.clone(),
                reason: r.reason.clone(),
                fleet_rollout: Some(r.id.clone()),
                config: None,
            },
            None => {
                Request::Restart { units: r.units.clone(), allow_outage: r.allow_outage, reason: r.reason.clone(), load_changes: r.load_changes, config: None }
            }
        };
        let started = start(self.clone(), request, by).await;
        let id = match started {
            Ok(Started { id: Some(id), .. }) => id,
            Ok(_) => return,
            Err(cause) => {
                let _ = fleet_put(c, &summary_key, &not_started(cause.sentence())).await;
                return;
            }
        };
        let mut sent = 0usize;
        let s = self.follow(c, &f, &r.id, &id, &mut sent, true).await;
        let succeeded = s.result == HostResult::Succeeded;
        // Written until etcd takes it: fleet watchers wait for it.
        while fleet_put(c, &summary_key, &s).await.is_err() {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        if let (true, Some(secs)) = (succeeded, r.bake_secs) {
            self.bake_then_revert(c, &f, &r, &id, std::time::Duration::from_secs(secs), sent).await;
        }
    }

    /// Forward local rollout `id`'s events to fleet rollout `fleet_id`'s keys as they come — this
    /// host's line numbers go on from `sent` (a revert's lines follow its part's), and `sent` is
    /// left at the next — until it ends; with `halt_with_fleet`, stop it between units when
    /// another host failed. Returns how it ended, for this host's summary.
    pub(super) async fn follow(
        &self,
        c: &pdctl_real::EtcdCoordinator,
        f: &pdctl_core::config::FleetSettings,
        fleet_id: &str,
        id: &str,
        sent: &mut usize,
        halt_with_fleet: bool,
    ) -> pdctl_core::fleet::HostSummary {
        let ended = |why: &str| pdctl_core::fleet::HostSummary {
            host: f.host.clone(),
            result: HostResult::Interrupted,
            local_id: Some(id.to_string()),
            summary: None,
            why: Some(why.to_string()),
            finished_at: Some(pdctl_core::fleet::now_secs()),
        };
        // Events of the local record forwarded so far.
        let mut forwarded = 0usize;
        loop {
            let rec = lock(&self.running).as_ref().filter(|x| x.id == id).map(|x| lock(&x.record).clone()).or_else(|| self.load(id));
            let Some(rec) = rec else { return ended("its local record cannot be read") };
            for ev in rec.events.iter().skip(forwarded) {
                let line = pdctl_core::fleet::HostEvent { host: f.host.clone(), event: ev.clone() };
                if fleet_put(c, &pdctl_core::fleet::host_event_key(&f.name, fleet_id, &f.host, *sent), &line).await.is_err() {
                    break;
                }
                *sent += 1;
                forwarded += 1;
            }
            if rec.lifecycle.state() != pdctl_contract::lifecycle::RolloutState::Running && forwarded >= rec.events.len() {
                let result = match (rec.lifecycle.state(), rec.summary.as_ref().map(|s| s.result)) {
                    (_, Some(pdctl_contract::events::Outcome::Succeeded)) => HostResult::Succeeded,
                    (_, Some(pdctl_contract::events::Outcome::Aborted)) => HostResult::Aborted,
                    (pdctl_contract::lifecycle::RolloutState::Interrupted, _) => HostResult::Interrupted,
                    _ => HostResult::Failed,
                };
                return pdctl_core::fleet::HostSummary {
                    host: f.host.clone(),
                    result,
                    local_id: Some(id.to_string()),
                    summary: rec.summary.clone(),
                    why: None,
                    finished_at: Some(pdctl_core::fleet::now_secs()),
                };
            }
            if halt_with_fleet && fleet_summaries(c, &f.name, fleet_id).await.values().any(|s| s.result == HostResult::Failed) {
                if let Some(x) = lock(&self.running).as_ref().filter(|x| x.id == id) {
                    x.abort.store(true, Ordering::SeqCst);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }
}

pub(super) async fn fleet_put<T: serde::Serialize>(c: &pdctl_real::EtcdCoordinator, key: &str, v: &T) -> Result<(), pdctl_core::ports::FleetFailure> {
    use pdctl_core::ports::{CasChange, Coordinator as _, Write};
    let expect = c.get(key).await?.map(|e| e.mod_revision).unwrap_or(0);
    c.cas(vec![CasChange { key: key.to_string(), expect, write: Write::Put(serde_json::to_vec(v).unwrap_or_default()) }]).await.map(|_| ())
}

pub(super) async fn fleet_summaries(c: &pdctl_real::EtcdCoordinator, name: &str, id: &str) -> BTreeMap<String, pdctl_core::fleet::HostSummary> {
    use pdctl_core::ports::Coordinator as _;
    // Each host's summary key alone (the request names the hosts), not the whole prefix: it
    // holds every event of every host, and this is asked every few hundred milliseconds.
    let request = c.get(&pdctl_core::fleet::rollout_key(name, id)).await.ok().flatten();
    let Some(r) = request.and_then(|e| serde_json::from_slice::<pdctl_core::fleet::FleetRollout>(&e.value).ok()) else {
        return per_host(c, name, id, "/summary", |s: &pdctl_core::fleet::HostSummary| s.host.clone()).await;
    };
    let mut out = BTreeMap::new();
    for h in r.hosts {
        let value = c.get(&pdctl_core::fleet::host_summary_key(name, id, &h)).await.ok().flatten();
        if let Some(s) = value.and_then(|e| serde_json::from_slice::<pdctl_core::fleet::HostSummary>(&e.value).ok()) {
            out.insert(h, s);
        }
    }
    out
}

/// Every host's value under `rollouts/<id>/hosts/<host>/<suffix>` of fleet rollout `id`, by host
/// (`host_of` names it; a value that does not read is left out).
pub(super) async fn per_host<T: serde::de::DeserializeOwned>(
    c: &pdctl_real::EtcdCoordinator,
    name: &str,
    id: &str,
    suffix: &str,
    host_of: impl Fn(&T) -> String,
) -> BTreeMap<String, T> {
    use pdctl_core::ports::Coordinator as _;
    let p = pdctl_core::fleet::rollout_hosts_prefix(name, id);
    c.get_prefix(&p)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.key.ends_with(suffix))
        .filter_map(|e| serde_json::from_slice::<T>(&e.value).ok())
        .map(|v| (host_of(&v), v))
        .collect()
}

/// Why a fleet request is skipped here, named (input from other hosts is checked, never
/// trusted): written in the future, naming a canary that is not one of its hosts (each would
/// wait hours), or one more than [`MAX_PARTS_WAITING`] parts waiting at once.
fn skipped(r: &pdctl_core::fleet::FleetRollout) -> Option<String> {
    if r.created_at > pdctl_core::fleet::now_secs() + FUTURE_SLACK_SECS {
        Some(format!("skipped: its created_at ({}) is in the future by more than {FUTURE_SLACK_SECS} s (a clock or a writer is wrong)", r.created_at))
    } else if r.canary.as_ref().is_some_and(|k| !r.hosts.contains(k)) {
        Some(format!("skipped: its canary {:?} is not one of its hosts", r.canary.as_deref().unwrap_or_default()))
    } else if PARTS_WAITING.load(Ordering::SeqCst) >= MAX_PARTS_WAITING {
        Some(format!("skipped: {MAX_PARTS_WAITING} fleet rollouts already wait on this host; start it again once they ended"))
    } else {
        None
    }
}

/// Wait until the canary host of fleet rollout `id` succeeded. Bounded: the canary's host must
/// stay alive (its liveness key; gone for [`CANARY_GONE`] ends the wait), and the whole wait
/// ends after [`CANARY_WAIT`] whatever happens. `Err`: why this host's part does not start.
async fn canary_succeeded(c: &pdctl_real::EtcdCoordinator, f: &pdctl_core::config::FleetSettings, id: &str, canary: &str) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    let mut gone_since: Option<std::time::Instant> = None;
    loop {
        match fleet_summaries(c, &f.name, id).await.get(canary) {
            Some(s) if s.result == HostResult::Succeeded => return Ok(()),
            Some(s) => return Err(format!("the canary {canary} did not succeed ({:?})", s.result)),
            None => {
                let alive = pdctl_core::fleet::hosts(c, &f.name).await.map(|h| h.iter().any(|x| x.host == canary)).unwrap_or(true);
                gone_since = if alive { None } else { gone_since.or(Some(std::time::Instant::now())) };
                if gone_since.is_some_and(|g| g.elapsed() >= CANARY_GONE) {
                    return Err(format!(
                        "the canary {canary} is no longer alive in the fleet (its liveness key gone for {} s) and never reported",
                        CANARY_GONE.as_secs()
                    ));
                }
                if t0.elapsed() >= CANARY_WAIT {
                    return Err(format!("the canary {canary} did not report within {} h", CANARY_WAIT.as_secs() / 3600));
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await
            }
        }
    }
}
