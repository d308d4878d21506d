//! The fleet's store: every read and compare-and-swap transaction on the keys of [`super::keys`],
//! through the [`crate::ports::Coordinator`] port.

use std::collections::BTreeMap;

use serde::Serialize;

use super::keys::*;
use crate::ports::{CasChange, Coordinator, FleetFailure, KvEntry, Write};

fn decode<T: serde::de::DeserializeOwned>(e: &KvEntry) -> Result<T, FleetFailure> {
    serde_json::from_slice(&e.value).map_err(|err| FleetFailure::Unreadable { key: e.key.clone(), error: err.to_string() })
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// What the fleet's limits are: etcd's when set (a host whose config disagrees gets
/// `Ok(Err(the disagreement))`), else `local`, written there by this first host.
pub async fn ensure_limits(c: &dyn Coordinator, name: &str, local: &Limits) -> Result<Result<Limits, LimitsDisagree>, FleetFailure> {
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
    Err(FleetFailure::Contended { key: key.to_string(), doing: "while pdctl tried to read it".into() })
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
                    changes.push(CasChange { key: free_key(name, role), expect: -1, write: Write::Put(sem.holders.len().to_string().into_bytes()) });
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

/// How long a host's fleet-rollout loop waits on its watch of the requests before it lists them
/// again (the bounded fallback: a new request wakes it at once).
pub const REQUESTS_FALLBACK: std::time::Duration = std::time::Duration::from_secs(60);
/// A host's liveness lease: its key disappears this long after its pdctld dies (the lease is
/// kept alive every third of it).
pub const LIVENESS_TTL_SECS: i64 = 30;
/// The longest a host goes without the fleet-wide restart-storm check (it runs at once when
/// the host's own restarts change).
pub const STORM_FALLBACK: std::time::Duration = std::time::Duration::from_secs(120);

/// After listing the fleet's rollout requests (`prefix`) at revision `after` or later: wait
/// until one is written or deleted (a watch from `after`: none written since is missed), at most
/// `fallback`. Whether something changed (`false`: the fallback, or no watch could be made —
/// then after a second).
pub async fn wait_for_requests(c: &dyn Coordinator, prefix: &str, after: i64, fallback: std::time::Duration) -> bool {
    match c.watch(vec![(prefix.to_string(), true)], after).await {
        Ok(mut w) => matches!(w.next(fallback).await, Ok(Some(_))),
        Err(_) => {
            tokio::time::sleep(fallback.min(std::time::Duration::from_secs(1))).await;
            false
        }
    }
}

/// The longest a slot wait goes without reading the slots again ([`wait_for_room`]: it is woken
/// by their changes; this bounds what no key says, such as a worker the gateway counted
/// unhealthy serving again).
pub const SLOT_FALLBACK: std::time::Duration = std::time::Duration::from_secs(10);

/// How a wait for a slot ended ([`wait_for_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// A change made room for every slot wanted (or ended the pause): try again now.
    Room,
    /// Nothing said so within the fallback: try again anyway (a worker the gateway counted
    /// unhealthy may serve again, which no slot key says).
    Fallback,
    /// The watch could not be made or ended: try again (reading afresh).
    WatchEnded,
}

/// Wait for room after an [`Acquired::Wait`]: a watch on the fleet's count of held slots per role
/// ([`free_key`], a few bytes: not the semaphores themselves) and its pause key from revision
/// `after` (read before the attempt that had to wait: no release made since is missed), woken
/// when a wanted role's count falls below its limit (or the pause ends) — the count is in the
/// change, so nothing is read meanwhile; workers the gateway counts unhealthy are left to the
/// attempt (a wake may find the budget still spent: it waits again). A random delay of up to a second (the old poll's interval) divided by the
/// free slots then lets the first waiter's grant reach the others first: among many waiters the first tries within
/// milliseconds, and the others see its grant and keep waiting instead of all trying at once
/// (a shorter delay was measured slower than polling at 1,000 waiting hosts, every release
/// answered by a crowd of compare-and-swaps: docs/fleet.md, "Measured: what the fleet asks of
/// etcd"). At most `fallback`. The watch lives only
/// for this wait: one left unread during the attempt that follows fills its connection's HTTP/2
/// flow-control window with the fleet's changes, and the attempt's own answers wait behind it
/// (a simulation kept it stalled for good).
pub async fn wait_for_room(c: &dyn Coordinator, name: &str, limits: &Limits, wants: &[(String, Hold)], after: i64, fallback: std::time::Duration) -> Woken {
    use std::time::{Duration, Instant};
    let keys = vec![(format!("{}held/", prefix(name)), true), (pause_key(name), false)];
    let Ok(mut w) = c.watch(keys, after).await else { return Woken::WatchEnded };
    let t0 = Instant::now();
    // Per wanted role, how many held its slots at its last change.
    let mut latest: BTreeMap<String, usize> = BTreeMap::new();
    let mut paused: Option<bool> = None;
    let room = |latest: &BTreeMap<String, usize>, paused: Option<bool>| {
        paused != Some(true) && wants.iter().all(|(role, _)| latest.get(role).is_none_or(|n| *n < limits.of(role) as usize))
    };
    // Until when a room seen is held back (the random delay), once one is seen.
    let mut trying_at: Option<Instant> = None;
    loop {
        let until = trying_at.unwrap_or(t0 + fallback).min(t0 + fallback);
        let left = until.saturating_duration_since(Instant::now());
        let changes = match w.next(left).await {
            Err(_) => return Woken::WatchEnded,
            Ok(None) if trying_at.is_some() => return Woken::Room,
            Ok(None) => return Woken::Fallback,
            Ok(Some(ch)) => ch,
        };
        let mut relevant = false;
        for ch in changes {
            if ch.key == pause_key(name) {
                paused = Some(ch.value.is_some());
                relevant = true;
            } else if let Some((role, _)) = wants.iter().find(|(r, _)| free_key(name, r) == ch.key) {
                let n = ch.value.as_deref().and_then(|v| std::str::from_utf8(v).ok()).and_then(|t| t.trim().parse().ok()).unwrap_or(0);
                latest.insert(role.clone(), n);
                relevant = true;
            }
        }
        if !relevant {
            continue;
        }
        if room(&latest, paused) {
            if trying_at.is_none() {
                // Spread over a second, as the polling was: waiters woken by one release try at
                // most as often as they polled (a window shrunk by the slots free drew every
                // waiter at once after a burst of releases, measured slower: docs/fleet.md).
                trying_at = Some(Instant::now() + Duration::from_millis(crate::sglang::pairing::room() % 1000));
            }
        } else {
            // Taken again meanwhile (another waiter was first): keep waiting.
            trying_at = None;
        }
    }
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
        let held = CasChange { key: free_key(name, role), expect: -1, write: Write::Put(sem.holders.len().to_string().into_bytes()) };
        if c.cas(vec![CasChange { key: key.clone(), expect: e.mod_revision, write: Write::Put(encode(&sem)) }, held]).await? {
            return Ok(true);
        }
    }
    Err(FleetFailure::Contended { key: key.to_string(), doing: format!("while pdctl tried to release {holder}'s slot") })
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
            let held = CasChange { key: free_key(name, &role), expect: -1, write: Write::Put(sem.holders.len().to_string().into_bytes()) };
            if c.cas(vec![CasChange { key: key.clone(), expect: e.mod_revision, write: Write::Put(encode(&sem)) }, held]).await? {
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
    Ok(decode_each(&c.get_prefix(&p).await?))
}

/// Most deletes in one etcd transaction (etcd refuses more than `--max-txn-ops`, 128 by default).
const DELETES_PER_TXN: usize = 100;

/// Retention of fleet rollouts in etcd: the oldest *finished* ones (every host named in the
/// request wrote its summary) beyond the newest `keep` are deleted — request, events, phases and
/// summaries — so that the `requests/` prefix every pdctld lists stays far below etcd's 4 MB
/// range-read limit. One not finished is kept whatever its age. Any host may do it: deleting
/// what another host already deleted changes nothing. Returns the ids deleted.
pub async fn prune_rollouts(c: &dyn Coordinator, name: &str, keep: usize) -> Result<Vec<String>, FleetFailure> {
    let mut reqs: Vec<FleetRollout> = decode_each(&c.get_prefix(&requests_prefix(name)).await?);
    reqs.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let excess = reqs.len().saturating_sub(keep);
    if excess == 0 {
        return Ok(Vec::new());
    }
    // Every rollout's keys in one (paged) read, grouped by rollout: a long history costs a few
    // reads, not three round trips per rollout.
    let under = format!("{}rollouts/", prefix(name));
    let mut by_id: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for e in c.get_prefix(&under).await? {
        if let Some(id) = e.key.strip_prefix(&under).and_then(|rest| rest.split('/').next()) {
            by_id.entry(id.to_string()).or_default().push(e.key.clone());
        }
    }
    let mut gone = Vec::new();
    let mut batch: Vec<String> = Vec::new();
    for r in reqs.into_iter().take(excess) {
        let keys = by_id.remove(&r.id).unwrap_or_default();
        if !r.hosts.iter().all(|h| keys.contains(&host_summary_key(name, &r.id, h))) {
            continue;
        }
        // The request last: a rollout half deleted is still listed, and deleted again next time.
        // A rollout's keys go in one transaction where they fit (several rollouts share one).
        let mut mine = keys;
        mine.push(rollout_key(name, &r.id));
        if batch.len() + mine.len() > DELETES_PER_TXN {
            delete_keys(c, &std::mem::take(&mut batch)).await?;
        }
        if mine.len() > DELETES_PER_TXN {
            for chunk in mine.chunks(DELETES_PER_TXN) {
                delete_keys(c, chunk).await?;
            }
        } else {
            batch.extend(mine);
        }
        gone.push(r.id);
    }
    delete_keys(c, &batch).await?;
    Ok(gone)
}

/// Delete `keys` in one transaction (nothing to do for none).
async fn delete_keys(c: &dyn Coordinator, keys: &[String]) -> Result<(), FleetFailure> {
    if keys.is_empty() {
        return Ok(());
    }
    let changes = keys.iter().map(|k| CasChange { key: k.clone(), expect: -1, write: Write::Delete }).collect();
    c.cas(changes).await?;
    Ok(())
}

/// Every value of a prefix that decodes; one that does not (a corrupt host, a value pdctl cannot
/// read) is named in the log and skipped — never the whole fleet for it. Nothing is acted on for
/// the skipped key.
fn decode_each<T: serde::de::DeserializeOwned>(entries: &[KvEntry]) -> Vec<T> {
    entries
        .iter()
        .filter_map(|e| match decode(e) {
            Ok(v) => Some(v),
            Err(why) => {
                tracing::warn!("{why}: skipped");
                None
            }
        })
        .collect()
}

/// The pause, if set.
pub async fn paused(c: &dyn Coordinator, name: &str) -> Result<Option<Pause>, FleetFailure> {
    c.get(&pause_key(name)).await?.as_ref().map(decode).transpose()
}

/// When the last pause was lifted (0: never).
pub async fn storm_since(c: &dyn Coordinator, name: &str) -> Result<u64, FleetFailure> {
    Ok(c.get(&storm_since_key(name)).await?.as_ref().map(decode::<u64>).transpose()?.unwrap_or(0))
}

/// Set (`Some`) or clear the fleet-wide pause; clearing it also writes when (`storm_since`), in
/// the same transaction: the self-restarts it was set for make no storm again.
pub async fn set_pause(c: &dyn Coordinator, name: &str, p: Option<&Pause>) -> Result<(), FleetFailure> {
    let key = pause_key(name);
    let since = storm_since_key(name);
    for _ in 0..16 {
        let rev = c.get(&key).await?.map(|e| e.mod_revision).unwrap_or(0);
        if rev == 0 && p.is_none() {
            return Ok(());
        }
        let mut changes = Vec::new();
        match p {
            Some(p) => changes.push(CasChange { key: key.clone(), expect: rev, write: Write::Put(encode(p)) }),
            None => {
                changes.push(CasChange { key: key.clone(), expect: rev, write: Write::Delete });
                let since_rev = c.get(&since).await?.map(|e| e.mod_revision).unwrap_or(0);
                changes.push(CasChange { key: since.clone(), expect: since_rev, write: Write::Put(encode(&now_secs())) });
            }
        }
        if c.cas(changes).await? {
            return Ok(());
        }
    }
    Err(FleetFailure::Contended { key: key.to_string(), doing: String::new() })
}
