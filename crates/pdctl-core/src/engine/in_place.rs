//! A config rollout whose only change is the weights (`[rollout] in_place = "auto"`): the new
//! `--model-path`/`--weight-version` of every PD worker's files are loaded into the running
//! servers as `pdctl rollout weights` loads them ([`crate::engine::work::WeightsTarget`]) — all paused,
//! all loaded, all verified, all continued: requests wait, none fails, no PD request pairs two
//! versions — instead of a rolling restart, which would pair a new prefill with an old decode for
//! as long as both run. Then each worker's files are recorded as the revision it runs (its next
//! restart starts from them). A worker that does not take the weights puts every worker back
//! (`weights_failed`); with `weights_fallback = "restart"` the change is then rolled out by
//! restarting, through every gate and the coherence check.

use std::path::Path;

use crate::config::{InPlace, Role};
use crate::engine::context::Notes;
use crate::engine::machine::Engine;
use crate::plan::Plan;
use crate::ports::{Logs, Probes, Units};
use crate::state::in_place::{one_target, target, NotInPlace, Target};
use crate::state::revisions;

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// The weights a config rollout of `units` loads without a restart; `Err`: why it restarts
    /// them instead (one sentence, for the rollout's notes).
    pub async fn in_place_target(&self, dir: &Path, units: &[String]) -> Result<Target, NotInPlace> {
        if self.settings.rollout.in_place == InPlace::Never {
            return Err(NotInPlace::Never);
        }
        if self.settings.fleet.is_some() {
            return Err(NotInPlace::Fleet);
        }
        let mut per_worker = Vec::new();
        for unit in units {
            let Some(w) = self.settings.workers.iter().find(|w| &w.unit == unit) else { continue };
            let t = match (self.units.config(unit).await, revisions::load(dir, unit)) {
                (Ok(cfg), Some(last)) => {
                    let current = revisions::snapshot(unit, &revisions::paths(unit, &cfg, &w.watch_files), "current");
                    // The tokenizer files are read off the async threads.
                    tokio::task::spawn_blocking(move || target(&last, &current, crate::sglang::tokenizer::same))
                        .await
                        .unwrap_or_else(|e| Err(NotInPlace::NotCompared(e.to_string())))
                }
                (Err(e), _) => Err(NotInPlace::UnitUnreadable(e.to_string())),
                (_, None) => Err(NotInPlace::NoRecord),
            };
            per_worker.push((unit.clone(), t));
        }
        // What the change is comes first: a change that is not new weights says so, never that
        // some worker does not take the new weights.
        let t = one_target(&per_worker)?;
        // Loading some PD workers alone would pair them with the others across versions.
        if let Some(w) = self.settings.workers.iter().find(|w| w.role != Role::Regular && !units.contains(&w.unit)) {
            return Err(NotInPlace::PartOfPd(w.unit.clone()));
        }
        Ok(t)
    }

    /// After an in-place load: every worker's current files are recorded as the revision it runs
    /// (`why: "weights"`), so it is no longer stale.
    pub(in crate::engine) async fn record_in_place(&self, plan: &Plan, dir: &Path, notes: &Notes) {
        for w in &plan.workers {
            let saved = match self.units.config(&w.unit).await {
                Ok(cfg) => {
                    revisions::save(dir, &revisions::snapshot(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), "weights")).map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = saved {
                notes.push(format!(
                    "{} serves the new weights but its files could not be recorded as what it runs ({e}): `pdctl rollout apply` will see it stale",
                    w.unit
                ));
            }
        }
        notes.push("loaded in place: each worker's new files are on record as what it runs; its next restart starts from them".into());
    }
}
