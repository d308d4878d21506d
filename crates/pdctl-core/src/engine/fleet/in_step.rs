//! Fleet rollouts that move hosts in step (new weights, a coherent fleet switch): each host
//! writes its phase to etcd (`rollouts/<id>/hosts/<host>/<kind>/<phase>`, a
//! [`crate::fleet::HostPhase`]), then waits until the hosts it depends on wrote theirs. The wait
//! is an etcd watch from the revision before its read (nothing written between the two is
//! missed), read again at least every [`REREAD`]; it is bounded, and ends early when the
//! rollout is aborted (another host failed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::engine::machine::Engine;
use crate::engine::work::{Phase, PhaseName};
use crate::fleet::{phase_key, rollout_hosts_prefix, rollout_key, FleetRollout, HostPhase};
use crate::ports::{CasChange, Logs, Probes, Units, Write};

/// The longest a wait goes without reading the phases again (the watch's bounded fallback).
const REREAD: Duration = Duration::from_secs(5);

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// The hosts of fleet rollout `id`, as its request names them.
    pub(in crate::engine) async fn rollout_hosts(&self, id: &str) -> Result<FleetRollout, String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else { return Err("this host has no [fleet]".into()) };
        match c.get(&rollout_key(&f.name, id)).await {
            Ok(Some(e)) => serde_json::from_slice::<FleetRollout>(&e.value).map_err(|e| format!("fleet rollout {id} does not read: {e}")),
            Ok(None) => Err(format!("no fleet rollout {id} in etcd")),
            Err(e) => Err(format!("etcd: {e}")),
        }
    }

    /// Write this host's `phase` (`mine`: whether it got there). `Err`: etcd did not take it
    /// (10 tries, half a second apart).
    pub(in crate::engine) async fn write_phase(&self, phase: Phase<'_>, mine: &Result<(), String>) -> Result<(), String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else { return Ok(()) };
        let key = phase_key(&f.name, phase.id, &f.host, phase.kind.as_str(), phase.name.as_str());
        let value = serde_json::to_vec(&HostPhase { host: f.host.clone(), ok: mine.is_ok(), why: mine.clone().err() }).unwrap_or_default();
        for _ in 0..10 {
            let expect = c.get(&key).await.ok().flatten().map(|e| e.mod_revision).unwrap_or(0);
            if matches!(c.cas(vec![CasChange { key: key.clone(), expect, write: Write::Put(value.clone()) }]).await, Ok(true)) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(format!("this host's '{}' could not be written to etcd", phase.name.as_str()))
    }

    /// Every host of `hosts` wrote `phase` (at most `limit`; `abort` ends the wait early).
    /// `Ok`: each got there; `Err`: the first host that wrote a failure and why, who did not get
    /// there in time, or that the rollout was aborted.
    pub(in crate::engine) async fn await_phase(&self, phase: Phase<'_>, hosts: &[String], limit: Duration, abort: Option<&AtomicBool>) -> Result<(), String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else { return Ok(()) };
        let deadline = Instant::now() + limit;
        let prefix = rollout_hosts_prefix(&f.name, phase.id);
        let suffix = format!("/{}/{}", phase.kind.as_str(), phase.name.as_str());
        // A host that takes no part in this kind of step says so once (`none`, with why).
        let none = format!("/{}/{}", phase.kind.as_str(), PhaseName::None.as_str());
        let mut aborted = false;
        loop {
            let before = c.revision().await.unwrap_or(0);
            let seen: Vec<HostPhase> = c
                .get_prefix(&prefix)
                .await
                .unwrap_or_default()
                .iter()
                .filter(|e| e.key.ends_with(&suffix) || e.key.ends_with(&none))
                .filter_map(|e| serde_json::from_slice(&e.value).ok())
                .filter(|p: &HostPhase| hosts.contains(&p.host))
                .collect();
            if let Some(bad) = seen.iter().find(|p| !p.ok) {
                return Err(format!("{}: {}", bad.host, bad.why.clone().unwrap_or_default()));
            }
            let missing: Vec<&str> = hosts.iter().filter(|h| !seen.iter().any(|p| &p.host == *h)).map(String::as_str).collect();
            if missing.is_empty() {
                return Ok(());
            }
            if aborted {
                return Err(format!("the rollout was aborted while waiting for {} to get to '{}'", missing.join(", "), phase.name.as_str()));
            }
            // Woken by the phase keys' own changes; read again at least every REREAD.
            let reread = Instant::now() + REREAD;
            let mut watch = c.watch(vec![(prefix.clone(), true)], before).await.ok();
            loop {
                // Aborted (another host failed): read once more, so that a host's failure
                // written meanwhile is the one named.
                if abort.is_some_and(|a| a.load(Ordering::SeqCst)) {
                    aborted = true;
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!("{} did not get to '{}' within {}", missing.join(", "), phase.name.as_str(), crate::cause::dur(&limit)));
                }
                if Instant::now() >= reread {
                    break;
                }
                // A short step: the abort flag has no change to wake on.
                let step = Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now()));
                match watch.as_mut() {
                    Some(w) => match w.next(step).await {
                        Ok(Some(changes)) if changes.iter().any(|ch| ch.key.ends_with(&suffix) || ch.key.ends_with(&none)) => break,
                        Ok(_) => {}
                        Err(_) => {
                            tokio::time::sleep(step).await;
                            break;
                        }
                    },
                    None => {
                        tokio::time::sleep(step).await;
                        break;
                    }
                }
            }
        }
    }
}
