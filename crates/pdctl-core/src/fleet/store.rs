//! The fleet's store: every read and compare-and-swap transaction on the keys of [`super::keys`],
//! through the [`crate::ports::Coordinator`] port.

use std::collections::BTreeMap;

use serde::Serialize;

use super::keys::*;
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
    Err(FleetFailure(format!("{key} kept changing")))
}
