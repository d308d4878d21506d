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

/// Why hosts did not get to a phase together; each says it as the sentence the rollout reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(in crate::engine) enum InStepError {
    /// The host has no `[fleet]`.
    #[error("this host has no [fleet]")]
    NoFleet,
    /// The fleet rollout is not in etcd.
    #[error("no fleet rollout {id} in etcd")]
    NoRollout {
        /// Its id.
        id: String,
    },
    /// Its request in etcd does not read.
    #[error("fleet rollout {id} does not read: {error}")]
    Unreadable {
        /// Its id.
        id: String,
        /// The decoder's words.
        error: String,
    },
    /// etcd did not answer.
    #[error("etcd: {0}")]
    Etcd(String),
    /// This host's phase could not be written (10 tries).
    #[error("this host's '{phase}' could not be written to etcd")]
    NotWritten {
        /// The phase.
        phase: &'static str,
    },
    /// A host wrote that it did not get there.
    #[error("{host}: {why}")]
    HostFailed {
        /// The host.
        host: String,
        /// Why, as it wrote it.
        why: String,
    },
    /// The rollout was aborted (another host failed) while these still had not got there.
    #[error("the rollout was aborted while waiting for {missing} to get to '{phase}'")]
    Aborted {
        /// The hosts, comma-separated.
        missing: String,
        /// The phase.
        phase: &'static str,
    },
    /// These did not get there in time.
    #[error("{missing} did not get to '{phase}' within {within}")]
    Late {
        /// The hosts, comma-separated.
        missing: String,
        /// The phase.
        phase: &'static str,
        /// The limit, as sentences say durations.
        within: String,
    },
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// The hosts of fleet rollout `id`, as its request names them.
    pub(in crate::engine) async fn rollout_hosts(&self, id: &str) -> Result<FleetRollout, InStepError> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else { return Err(InStepError::NoFleet) };
        match c.get(&rollout_key(&f.name, id)).await {
            Ok(Some(e)) => serde_json::from_slice::<FleetRollout>(&e.value).map_err(|e| InStepError::Unreadable { id: id.to_string(), error: e.to_string() }),
            Ok(None) => Err(InStepError::NoRollout { id: id.to_string() }),
            Err(e) => Err(InStepError::Etcd(e.to_string())),
        }
    }

    /// Write this host's `phase` (`mine`: whether it got there). `Err`: etcd did not take it
    /// (10 tries, half a second apart).
    pub(in crate::engine) async fn write_phase(&self, phase: Phase<'_>, mine: &Result<(), String>) -> Result<(), InStepError> {
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
        Err(InStepError::NotWritten { phase: phase.name.as_str() })
    }

    /// Every host of `hosts` wrote `phase` (at most `limit`; `abort` ends the wait early).
    /// `Ok`: each got there; `Err`: the first host that wrote a failure and why, who did not get
    /// there in time, or that the rollout was aborted.
    pub(in crate::engine) async fn await_phase(
        &self,
        phase: Phase<'_>,
        hosts: &[String],
        limit: Duration,
        abort: Option<&AtomicBool>,
    ) -> Result<(), InStepError> {
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
                return Err(InStepError::HostFailed { host: bad.host.clone(), why: bad.why.clone().unwrap_or_default() });
            }
            let missing: Vec<&str> = hosts.iter().filter(|h| !seen.iter().any(|p| &p.host == *h)).map(String::as_str).collect();
            if missing.is_empty() {
                return Ok(());
            }
            if aborted {
                return Err(InStepError::Aborted { missing: missing.join(", "), phase: phase.name.as_str() });
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
                    return Err(InStepError::Late { missing: missing.join(", "), phase: phase.name.as_str(), within: crate::cause::dur(&limit) });
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

#[cfg(test)]
mod tests {
    use super::InStepError;

    #[test]
    fn each_reason_is_the_sentence_the_rollout_reports() {
        let late = InStepError::Late { missing: "b, c".into(), phase: "in", within: "2m".into() };
        assert_eq!(late.to_string(), "b, c did not get to 'in' within 2m");
        assert_eq!(InStepError::HostFailed { host: "b".into(), why: "d.service: 500".into() }.to_string(), "b: d.service: 500");
        assert_eq!(
            InStepError::Aborted { missing: "c".into(), phase: "verified" }.to_string(),
            "the rollout was aborted while waiting for c to get to 'verified'"
        );
        assert_eq!(InStepError::NotWritten { phase: "out" }.to_string(), "this host's 'out' could not be written to etcd");
        assert_eq!(InStepError::NoRollout { id: "f1".into() }.to_string(), "no fleet rollout f1 in etcd");
    }
}
