//! The fleet: many hosts behind one gateway, each host's pdctld coordinating through etcd v3.
//!
//! This module is the logic, with no I/O: the keys, what a slot semaphore holds, and whether a
//! holder may take a slot. The etcd driver (`pdctl-fleet`) stores these values and applies every
//! change with a compare-and-swap transaction on the keys' revisions, so that two hosts deciding
//! at the same moment cannot both win (the pattern of Fedora CoreOS's FleetLock server, airlock:
//! one JSON value per semaphore, updated by CAS, no lease on a slot — a host that dies keeps its
//! slot, because its worker really is down, until its pdctld comes back or an operator releases
//! it).
//!
//! Keys, under `/pdctl/<fleet name>/`:
//!
//! | key | value |
//! |---|---|
//! | `limits` | [`Limits`]: `max_unavailable` per role, written by the first pdctld; a host whose config disagrees refuses |
//! | `slots/<role>` | [`Semaphore`]: the holders of that role's slots |
//! | `hosts/<host>` | [`HostState`], bound to the host's lease (gone when its pdctld is) |
//! | `paused` | [`Pause`] while no new slot is granted fleet-wide |
//! | `requests/<id>` | [`FleetRollout`]: a fleet rollout every named host's pdctld runs its part of |
//! | `rollouts/<id>/hosts/<host>/events/<seq>` | [`HostEvent`]: that host's events, in order |
//! | `rollouts/<id>/hosts/<host>/summary` | [`HostSummary`]: how that host's part ended |

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The key prefix of fleet `name`.
pub fn prefix(name: &str) -> String {
    format!("/pdctl/{name}/")
}

/// The semaphore key of `role`.
pub fn slot_key(name: &str, role: &str) -> String {
    format!("{}slots/{role}", prefix(name))
}

/// The liveness key of `host`.
pub fn host_key(name: &str, host: &str) -> String {
    format!("{}hosts/{host}", prefix(name))
}

/// The limits key.
pub fn limits_key(name: &str) -> String {
    format!("{}limits", prefix(name))
}

/// The pause key.
pub fn pause_key(name: &str) -> String {
    format!("{}paused", prefix(name))
}

/// The fleet-wide limits (in etcd; every host's config must agree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Workers of each role that may be down at once, fleet-wide.
    pub max_unavailable: BTreeMap<String, u32>,
}

impl Limits {
    /// Where `local` disagrees with these (etcd's): `(role, etcd's value, local value)`.
    pub fn disagreement(&self, local: &Limits) -> Option<(String, String, String)> {
        let roles: std::collections::BTreeSet<&String> = self.max_unavailable.keys().chain(local.max_unavailable.keys()).collect();
        roles.into_iter().find_map(|r| {
            let (a, b) = (self.max_unavailable.get(r), local.max_unavailable.get(r));
            let show = |v: Option<&u32>| v.map(|n| n.to_string()).unwrap_or_else(|| "unset".into());
            (a != b).then(|| (r.clone(), show(a), show(b)))
        })
    }

    /// The limit of `role` (a role without one: 1).
    pub fn of(&self, role: &str) -> u32 {
        self.max_unavailable.get(role).copied().unwrap_or(1)
    }
}

/// One held slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hold {
    /// `host/unit`: who holds it.
    pub holder: String,
    /// Its worker's URL (as the gateway lists it).
    pub url: String,
    /// Drawn per acquisition: a late release of an older hold cannot free a newer one.
    pub token: String,
    /// When it was taken (seconds since the epoch).
    pub since: u64,
    /// The rollout that took it.
    pub rollout: String,
}

/// `holder` of a unit on a host.
pub fn holder(host: &str, unit: &str) -> String {
    format!("{host}/{unit}")
}

/// The holders of one role's slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Semaphore {
    /// Current holds.
    pub holders: Vec<Hold>,
}

/// Whether a slot can be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Take it (add the hold).
    Grant,
    /// The holder holds one already (a retry after a lost answer): it is that hold.
    AlreadyHeld(Hold),
    /// No slot is free: who holds them, and the unhealthy workers counted against the budget.
    Wait {
        /// The holds.
        holders: Vec<Hold>,
        /// URLs the gateway reports unhealthy that hold no slot.
        unhealthy: Vec<String>,
    },
}

impl Semaphore {
    /// Whether `want` may take a slot of a role limited to `max`, with the role's workers the
    /// gateway reports unhealthy (`unhealthy`, URLs): those that hold no slot are down anyway and
    /// count against the budget.
    pub fn decide(&self, want: &Hold, max: u32, unhealthy: &[String]) -> Decision {
        if let Some(h) = self.holders.iter().find(|h| h.holder == want.holder) {
            return Decision::AlreadyHeld(h.clone());
        }
        let down: Vec<String> = unhealthy
            .iter()
            .filter(|u| !self.holders.iter().any(|h| crate::url::same_url(&h.url, u)) && !crate::url::same_url(u, &want.url))
            .cloned()
            .collect();
        if self.holders.len() + down.len() < max as usize {
            Decision::Grant
        } else {
            Decision::Wait { holders: self.holders.clone(), unhealthy: down }
        }
    }

    /// Remove `holder`'s hold if it is the one with `token`; whether it was there.
    pub fn release(&mut self, holder: &str, token: &str) -> bool {
        let before = self.holders.len();
        self.holders.retain(|h| !(h.holder == holder && h.token == token));
        self.holders.len() != before
    }

    /// Remove every hold of `holder` — `host/unit`, or `host` for all of that host's (an
    /// operator's release); the removed holds.
    pub fn release_all(&mut self, holder: &str) -> Vec<Hold> {
        let host_prefix = format!("{holder}/");
        let (gone, kept): (Vec<Hold>, Vec<Hold>) =
            std::mem::take(&mut self.holders).into_iter().partition(|h| h.holder == holder || h.holder.starts_with(&host_prefix));
        self.holders = kept;
        gone
    }
}

/// What "waiting for a prefill slot: held by … since …" says.
pub fn waiting_sentence(role: &str, holders: &[Hold], unhealthy: &[String]) -> String {
    let mut parts: Vec<String> = holders.iter().map(|h| format!("held by {} since {}", h.holder, clock(h.since))).collect();
    parts.extend(unhealthy.iter().map(|u| format!("{u} is unhealthy in the gateway")));
    format!("waiting for a {role} slot: {}", parts.join("; "))
}

/// `14:02:11` (UTC) of a time in seconds since the epoch.
pub fn clock(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    s.get(11..19).map(String::from).unwrap_or(s)
}

/// A host's liveness value (bound to its lease).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostState {
    /// The host.
    pub host: String,
    /// pdctld's version.
    pub version: String,
    /// The rollout it runs, if any.
    pub rollout: Option<String>,
    /// Its workers.
    pub workers: Vec<HostWorker>,
    /// When this value was written (seconds since the epoch).
    pub updated_at: u64,
}

/// One worker in a host's liveness value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostWorker {
    /// The unit.
    pub unit: String,
    /// Its URL (as the gateway lists it).
    #[serde(default)]
    pub url: String,
    /// Its role.
    pub role: String,
    /// `active/running`, …
    pub state: String,
    /// KV usage (0..1), when its gauges are published.
    pub kv_usage: Option<f64>,
}

/// A fleet-wide pause: no new slot is granted while it is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    /// Who (`uid N on HOST`).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (seconds since the epoch).
    pub at: u64,
}

use crate::ports::{CasChange, Coordinator, FleetFailure, KvEntry, Write};

fn decode<T: serde::de::DeserializeOwned>(e: &KvEntry) -> Result<T, FleetFailure> {
    serde_json::from_slice(&e.value)
        .map_err(|err| FleetFailure(format!("{} holds a value pdctl cannot read ({err}); inspect it with `etcdctl get {}`", e.key, e.key)))
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// What the fleet's limits are: etcd's when set (a host whose config disagrees gets
/// `Err(Ok((role, etcd's, local)))`), else `local`, written there by this first host.
pub async fn ensure_limits(c: &dyn Coordinator, name: &str, local: &Limits) -> Result<Result<Limits, (String, String, String)>, FleetFailure> {
    let key = limits_key(name);
    for _ in 0..8 {
        match c.get(&key).await? {
            Some(e) => {
                let l: Limits = decode(&e)?;
                return Ok(match l.disagreement(local) {
                    Some(d) => Err(d),
                    None => Ok(l),
                });
            }
            None => {
                if c.cas(vec![CasChange { key: key.clone(), expect: 0, write: Write::Put(encode(local)) }]).await? {
                    return Ok(Ok(local.clone()));
                }
            }
        }
    }
    Err(FleetFailure(format!("{key} kept changing while pdctl tried to read it")))
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// Every slot asked for is held now (new holds, or the holder's existing ones).
    Granted(Vec<(String, Hold)>),
    /// Not now: the sentence says who holds what.
    Wait(String),
}

/// Take one slot per `(role, hold)` in one transaction, or none: each role's semaphore and the
/// pause key are read, [`Semaphore::decide`] is applied, and all changes are written with a
/// compare-and-swap on every key read (a concurrent grant or pause makes it retry). `unhealthy`:
/// per role, the URLs the gateway reports unhealthy.
pub async fn try_acquire(
    c: &dyn Coordinator,
    name: &str,
    limits: &Limits,
    wants: &[(String, Hold)],
    unhealthy: &BTreeMap<String, Vec<String>>,
) -> Result<Acquired, FleetFailure> {
    for _ in 0..16 {
        let pause = c.get(&pause_key(name)).await?;
        if let Some(p) = &pause {
            let p: Pause = decode(p)?;
            return Ok(Acquired::Wait(format!("the fleet is paused by {} since {}: {} (pdctl fleet unpause)", p.by, clock(p.at), p.reason)));
        }
        // The pause key is compared (still absent), not written: a pause cannot race a grant.
        let mut changes = vec![CasChange { key: pause_key(name), expect: 0, write: Write::Keep }];
        let mut granted = Vec::new();
        let mut waits = Vec::new();
        for (role, want) in wants {
            let key = slot_key(name, role);
            let (mut sem, rev) = match c.get(&key).await? {
                Some(e) => (decode::<Semaphore>(&e)?, e.mod_revision),
                None => (Semaphore::default(), 0),
            };
            match sem.decide(want, limits.of(role), unhealthy.get(role).map(Vec::as_slice).unwrap_or(&[])) {
                Decision::AlreadyHeld(h) => granted.push((role.clone(), h)),
                Decision::Grant => {
                    sem.holders.push(want.clone());
                    changes.push(CasChange { key, expect: rev, write: Write::Put(encode(&sem)) });
                    granted.push((role.clone(), want.clone()));
                }
                Decision::Wait { holders, unhealthy } => waits.push(waiting_sentence(role, &holders, &unhealthy)),
            }
        }
        if !waits.is_empty() {
            return Ok(Acquired::Wait(waits.join("; ")));
        }
        if changes.len() == 1 || c.cas(changes).await? {
            return Ok(Acquired::Granted(granted));
        }
    }
    Ok(Acquired::Wait("the fleet's slots kept changing under concurrent hosts; trying again".into()))
}

/// Give back `holder`'s slot of `role` if it is still the hold with `token`; whether it was.
pub async fn release(c: &dyn Coordinator, name: &str, role: &str, holder: &str, token: &str) -> Result<bool, FleetFailure> {
    let key = slot_key(name, role);
    for _ in 0..16 {
        let Some(e) = c.get(&key).await? else {
            return Ok(false);
        };
        let mut sem: Semaphore = decode(&e)?;
        if !sem.release(holder, token) {
            return Ok(false);
        }
        if c.cas(vec![CasChange { key: key.clone(), expect: e.mod_revision, write: Write::Put(encode(&sem)) }]).await? {
            return Ok(true);
        }
    }
    Err(FleetFailure(format!("{key} kept changing while pdctl tried to release {holder}'s slot")))
}

/// An operator's release: every hold of `holder`, in every role; what was released.
pub async fn release_holder(c: &dyn Coordinator, name: &str, holder: &str) -> Result<Vec<(String, Hold)>, FleetFailure> {
    let mut out = Vec::new();
    for (role, _) in slots(c, name).await? {
        let key = slot_key(name, &role);
        for _ in 0..16 {
            let Some(e) = c.get(&key).await? else { break };
            let mut sem: Semaphore = decode(&e)?;
            let gone = sem.release_all(holder);
            if gone.is_empty() {
                break;
            }
            if c.cas(vec![CasChange { key: key.clone(), expect: e.mod_revision, write: Write::Put(encode(&sem)) }]).await? {
                out.extend(gone.into_iter().map(|h| (role.clone(), h)));
                break;
            }
        }
    }
    Ok(out)
}

/// Every role's semaphore.
pub async fn slots(c: &dyn Coordinator, name: &str) -> Result<BTreeMap<String, Semaphore>, FleetFailure> {
    let p = format!("{}slots/", prefix(name));
    let mut out = BTreeMap::new();
    for e in c.get_prefix(&p).await? {
        out.insert(e.key.trim_start_matches(&p).to_string(), decode(&e)?);
    }
    Ok(out)
}

/// Every live host (their keys vanish with their leases).
pub async fn hosts(c: &dyn Coordinator, name: &str) -> Result<Vec<HostState>, FleetFailure> {
    let p = format!("{}hosts/", prefix(name));
    c.get_prefix(&p).await?.iter().map(decode).collect()
}

/// The pause, if set.
pub async fn paused(c: &dyn Coordinator, name: &str) -> Result<Option<Pause>, FleetFailure> {
    c.get(&pause_key(name)).await?.as_ref().map(decode).transpose()
}

/// Set (`Some`) or clear the fleet-wide pause.
pub async fn set_pause(c: &dyn Coordinator, name: &str, p: Option<&Pause>) -> Result<(), FleetFailure> {
    let key = pause_key(name);
    for _ in 0..16 {
        let rev = c.get(&key).await?.map(|e| e.mod_revision).unwrap_or(0);
        if rev == 0 && p.is_none() {
            return Ok(());
        }
        let write = match p {
            Some(p) => Write::Put(encode(p)),
            None => Write::Delete,
        };
        if c.cas(vec![CasChange { key: key.clone(), expect: rev, write }]).await? {
            return Ok(());
        }
    }
    Err(FleetFailure(format!("{key} kept changing")))
}

/// A slot this host holds or is about to take, written down before the transaction (so that a
/// crash between the grant and the release finds it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotRecord {
    /// The role's semaphore.
    pub role: String,
    /// The hold.
    pub hold: Hold,
}

/// A token for a new hold.
pub fn token() -> String {
    format!("{:016x}", crate::pairing::room())
}

/// Now, in seconds since the epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A fleet rollout as stored in etcd (`rollouts/<id>`), watched by every pdctld.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetRollout {
    /// Its id (`f<seconds>`).
    pub id: String,
    /// The hosts taking part.
    pub hosts: Vec<String>,
    /// Taking the only worker of a role (fleet-wide) down is accepted.
    pub allow_outage: bool,
    /// Who started it (`uid N on HOST`).
    pub by: String,
    /// Why.
    pub reason: Option<String>,
    /// This host goes first; the others start only once it succeeded.
    pub canary: Option<String>,
    /// When (seconds since the epoch).
    pub created_at: u64,
    /// Only these units (empty: every worker of each host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    /// A repair: the restarted prefill (`host/unit`) whose stale pairing this fixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_of: Option<String>,
    /// Each host's restart may load unit changes its workers do not run yet (`--load-changes`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub load_changes: bool,
}

/// One host's event of a fleet rollout (`rollouts/<id>/hosts/<host>/events/<seq>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEvent {
    /// The host.
    pub host: String,
    /// The event of its local rollout.
    pub event: crate::events::Event,
}

/// How one host's part ended (`rollouts/<id>/hosts/<host>/summary`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSummary {
    /// The host.
    pub host: String,
    /// Its result.
    pub result: HostResult,
    /// Its local rollout's id, if one started.
    pub local_id: Option<String>,
    /// Its local rollout's summary, if it ended with one.
    pub summary: Option<crate::events::Summary>,
    /// Why it did not start, or ended without a summary.
    pub why: Option<String>,
}

/// Where fleet rollout requests are (every pdctld reads this prefix, so it holds only requests).
pub fn requests_prefix(name: &str) -> String {
    format!("{}requests/", prefix(name))
}

/// The key of fleet rollout `id`'s request.
pub fn rollout_key(name: &str, id: &str) -> String {
    format!("{}{id}", requests_prefix(name))
}

/// Where the hosts' lines of fleet rollout `id` are.
pub fn rollout_hosts_prefix(name: &str, id: &str) -> String {
    format!("{}rollouts/{id}/hosts/", prefix(name))
}

/// The key of `host`'s event number `seq` of fleet rollout `id`.
pub fn host_event_key(name: &str, id: &str, host: &str, seq: usize) -> String {
    format!("{}{host}/events/{seq:08}", rollout_hosts_prefix(name, id))
}

/// The key of `host`'s summary of fleet rollout `id`.
pub fn host_summary_key(name: &str, id: &str, host: &str) -> String {
    format!("{}{host}/summary", rollout_hosts_prefix(name, id))
}

/// How one host's part of a fleet rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostResult {
    /// Its local rollout succeeded.
    Succeeded,
    /// Its local rollout failed (halted, rolled back).
    Failed,
    /// Its local rollout was aborted (another host failed).
    Aborted,
    /// Its local rollout was interrupted (pdctld stopped, or etcd was lost).
    Interrupted,
    /// It did not start: the canary or another host failed first, or it could not start.
    NotStarted,
}

/// The last line of `pdctl fleet watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSummary {
    /// The fleet rollout.
    pub id: String,
    /// `succeeded` when every host succeeded, else `failed`.
    pub result: crate::events::Outcome,
    /// Each host's result.
    pub hosts: BTreeMap<String, HostResult>,
}

/// The fleet summary from the hosts' summaries (a host without one: not started).
pub fn fleet_summary(r: &FleetRollout, summaries: &BTreeMap<String, HostSummary>) -> FleetSummary {
    let hosts: BTreeMap<String, HostResult> =
        r.hosts.iter().map(|h| (h.clone(), summaries.get(h).map(|s| s.result).unwrap_or(HostResult::NotStarted))).collect();
    let ok = hosts.values().all(|v| *v == HostResult::Succeeded);
    FleetSummary { id: r.id.clone(), result: if ok { crate::events::Outcome::Succeeded } else { crate::events::Outcome::Failed }, hosts }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(h: &str, url: &str, token: &str) -> Hold {
        Hold { holder: h.into(), url: url.into(), token: token.into(), since: 0, rollout: "r1".into() }
    }

    #[test]
    fn decide_grants_within_the_budget_counting_unhealthy_workers_and_finds_its_own_hold() {
        let mut s = Semaphore::default();
        let a = hold("a/p.service", "http://a:1", "t1");
        assert_eq!(s.decide(&a, 1, &[]), Decision::Grant);
        s.holders.push(a.clone());
        let b = hold("b/p.service", "http://b:1", "t2");
        assert!(matches!(s.decide(&b, 1, &[]), Decision::Wait { .. }));
        // A retry of a's acquisition finds its hold (never a second one).
        assert_eq!(s.decide(&hold("a/p.service", "http://a:1", "t9"), 1, &[]), Decision::AlreadyHeld(a.clone()));
        // An unhealthy worker holding no slot counts; one holding a slot is not counted twice;
        // the asking worker itself being unhealthy does not block it.
        assert!(matches!(s.decide(&b, 2, &["http://c:1".into()]), Decision::Wait { .. }));
        assert_eq!(s.decide(&b, 2, &["http://a:1".into()]), Decision::Grant);
        assert_eq!(s.decide(&b, 2, &["http://b:1".into()]), Decision::Grant);
    }

    #[test]
    fn a_late_release_with_an_old_token_frees_nothing() {
        let mut s = Semaphore { holders: vec![hold("a/p.service", "u", "new")] };
        assert!(!s.release("a/p.service", "old"));
        assert_eq!(s.holders.len(), 1);
        assert!(s.release("a/p.service", "new"));
        assert!(s.holders.is_empty());
    }

    #[test]
    fn limits_disagreement_names_the_role_and_both_values() {
        let etcd = Limits { max_unavailable: [("prefill".to_string(), 1), ("decode".to_string(), 1)].into() };
        let local = Limits { max_unavailable: [("prefill".to_string(), 2), ("decode".to_string(), 1)].into() };
        assert_eq!(etcd.disagreement(&local), Some(("prefill".into(), "1".into(), "2".into())));
        assert_eq!(etcd.disagreement(&etcd.clone()), None);
    }

    #[test]
    fn the_waiting_sentence_names_holder_and_time() {
        let h = Hold { since: 1_764_511_331, ..hold("gpu-node-b/sglang-prefill.service", "u", "t") };
        assert_eq!(waiting_sentence("prefill", &[h], &[]), "waiting for a prefill slot: held by gpu-node-b/sglang-prefill.service since 14:02:11");
    }

    /// An in-memory store with etcd's compare-and-swap semantics (unit tests only; the real
    /// etcd is in tests/fleet.rs).
    /// The store's revision, and each key's value with its mod revision.
    type Store = (i64, BTreeMap<String, (Vec<u8>, i64)>);

    #[derive(Default)]
    struct Mem {
        kv: std::sync::Mutex<Store>,
    }

    impl Coordinator for Mem {
        fn get<'a>(&'a self, key: &'a str) -> crate::ports::BoxFut<'a, Result<Option<KvEntry>, FleetFailure>> {
            let g = self.kv.lock().unwrap();
            let r = g.1.get(key).map(|(v, r)| KvEntry { key: key.into(), value: v.clone(), mod_revision: *r });
            Box::pin(async move {
                tokio::task::yield_now().await;
                Ok(r)
            })
        }
        fn get_prefix<'a>(&'a self, prefix: &'a str) -> crate::ports::BoxFut<'a, Result<Vec<KvEntry>, FleetFailure>> {
            let g = self.kv.lock().unwrap();
            let r =
                g.1.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, (v, r))| KvEntry { key: k.clone(), value: v.clone(), mod_revision: *r }).collect();
            Box::pin(async move { Ok(r) })
        }
        fn cas(&self, changes: Vec<CasChange>) -> crate::ports::BoxFut<'_, Result<bool, FleetFailure>> {
            let mut g = self.kv.lock().unwrap();
            let ok = changes.iter().all(|c| g.1.get(&c.key).map(|(_, r)| *r).unwrap_or(0) == c.expect);
            if ok {
                g.0 += 1;
                let rev = g.0;
                for c in changes {
                    match c.write {
                        Write::Keep => {}
                        Write::Put(v) => {
                            g.1.insert(c.key, (v, rev));
                        }
                        Write::Delete => {
                            g.1.remove(&c.key);
                        }
                    }
                }
            }
            Box::pin(async move {
                tokio::task::yield_now().await;
                Ok(ok)
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_hosts_never_over_admit_and_pairs_take_both_slots_or_none() {
        let mem = std::sync::Arc::new(Mem::default());
        let limits = Limits { max_unavailable: [("prefill".to_string(), 1), ("decode".to_string(), 1)].into() };
        let max_seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for h in 0..20 {
            let (mem, limits, max_seen) = (mem.clone(), limits.clone(), max_seen.clone());
            tasks.push(tokio::spawn(async move {
                let want = Hold { holder: holder(&format!("h{h}"), "p.service"), url: format!("http://h{h}:1"), token: token(), since: 0, rollout: "r".into() };
                loop {
                    match try_acquire(mem.as_ref(), "f", &limits, &[("prefill".into(), want.clone())], &BTreeMap::new()).await.unwrap() {
                        Acquired::Granted(_) => break,
                        Acquired::Wait(_) => tokio::task::yield_now().await,
                    }
                }
                let held = slots(mem.as_ref(), "f").await.unwrap().get("prefill").map(|s| s.holders.len()).unwrap_or(0);
                max_seen.fetch_max(held, std::sync::atomic::Ordering::SeqCst);
                assert!(release(mem.as_ref(), "f", "prefill", &want.holder, &want.token).await.unwrap());
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(max_seen.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A pair (two roles) while the decode slot is taken: neither is granted.
        let d = Hold { holder: "x/d.service".into(), url: "http://x:2".into(), token: "t".into(), since: 0, rollout: "r".into() };
        try_acquire(mem.as_ref(), "f", &limits, &[("decode".into(), d)], &BTreeMap::new()).await.unwrap();
        let p = Hold { holder: "y/p.service".into(), url: "http://y:1".into(), token: "t".into(), since: 0, rollout: "r".into() };
        let d2 = Hold { holder: "y/d.service".into(), url: "http://y:2".into(), token: "t".into(), since: 0, rollout: "r".into() };
        let r = try_acquire(mem.as_ref(), "f", &limits, &[("prefill".into(), p), ("decode".into(), d2)], &BTreeMap::new()).await.unwrap();
        assert!(matches!(r, Acquired::Wait(_)));
        assert!(slots(mem.as_ref(), "f").await.unwrap().get("prefill").is_none_or(|s| s.holders.is_empty()), "no prefill slot taken alone");
        // A pause blocks every grant.
        set_pause(mem.as_ref(), "f", Some(&Pause { by: "uid 0 on a".into(), reason: "incident".into(), at: 0 })).await.unwrap();
        let q = Hold { holder: "z/p.service".into(), url: "http://z:1".into(), token: "t".into(), since: 0, rollout: "r".into() };
        match try_acquire(mem.as_ref(), "f", &limits, &[("prefill".into(), q)], &BTreeMap::new()).await.unwrap() {
            Acquired::Wait(w) => assert!(w.contains("paused by uid 0 on a") && w.contains("incident"), "{w}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn the_first_host_writes_the_limits_and_a_disagreeing_host_is_told_both_values() {
        let mem = Mem::default();
        let a = Limits { max_unavailable: [("prefill".to_string(), 1)].into() };
        assert_eq!(ensure_limits(&mem, "f", &a).await.unwrap(), Ok(a.clone()));
        let b = Limits { max_unavailable: [("prefill".to_string(), 3)].into() };
        assert_eq!(ensure_limits(&mem, "f", &b).await.unwrap(), Err(("prefill".into(), "1".into(), "3".into())));
    }
}
