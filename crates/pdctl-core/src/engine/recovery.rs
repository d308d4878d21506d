//! Recovery: good revisions recorded and restored (rollback), changes quarantined, drains and slots
//! reconciled after a crash, and whether each worker runs its current files (staleness).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use serde::Serialize;

use crate::cause::Cause;
use crate::config::Worker;
use crate::engine::context::{Ctx, Notes};
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::roll;
use crate::engine::step_run::{detail_of, Fail, StepRun};
use crate::engine::steps::NOTHING_TO_RESTORE;
use crate::engine::work::Staleness;
use crate::events::{Outcome, Sink, Status, Step, Summary};
use crate::plan::Plan;
use crate::ports::{Logs, Probes, Units, UnitsError};
use crate::state::revisions;

/// The rollback's (and a revert's) detail: the revision put back and the files restored.
#[derive(Serialize)]
struct Restored<'a> {
    /// When that revision was recorded (seconds since the epoch).
    revision_recorded_at: u64,
    /// The files put back (or moved aside), one sentence each.
    restored: &'a [String],
    /// A revert: the unit is restarted onto them.
    #[serde(skip_serializing_if = "Option::is_none")]
    restart: Option<bool>,
    /// It is a revert (not a rollback after a failed gate).
    #[serde(skip_serializing_if = "Option::is_none")]
    revert: Option<bool>,
}

/// A rollback that stopped half-way: why, what is back, and the file that is not.
#[derive(Serialize)]
struct RestoreStopped<'a> {
    /// Why, as a sentence.
    cause: &'a str,
    /// The files already back.
    restored: &'a [String],
    /// The file it could not restore (`None`: every file is back; the reload failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    not_restored: Option<&'a str>,
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// Record the files `w` was just verified with as its good revision — only those its running
    /// process can have started with ([`revisions::baseline`]); returns the note. When rollout
    /// `id` changed them, the revision they replace is kept as that rollout's "before"
    /// ([`revisions::save_before`]): what a revert of it restores.
    pub(in crate::engine) async fn record_revision(&self, w: &Worker, dir: &Path, id: &str) -> String {
        self.record_revision_of(w, dir, id, false).await
    }

    /// [`Self::record_revision`]; `all_run`: every file is what the process runs, those changed
    /// since its start included (a role switched at run time runs what its new drop-in says).
    pub(in crate::engine) async fn record_revision_of(&self, w: &Worker, dir: &Path, id: &str, all_run: bool) -> String {
        let (cfg, st) = match (self.units.config(&w.unit).await, self.units.state(&w.unit).await) {
            (Ok(c), Ok(s)) => (c, s),
            (Err(e), _) | (_, Err(e)) => return format!("could not record the revision of {}: {e}", w.unit),
        };
        let since = if all_run { 0 } else { st.exec_main_start_us };
        let mut rev = revisions::baseline(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), since);
        rev.why = "started".into();
        if let Some(old) = revisions::load(dir, &w.unit).filter(|old| revisions::fingerprint(old) != revisions::fingerprint(&rev)) {
            if let Err(er) = revisions::save_before(dir, id, &old) {
                tracing::warn!(pdctl_unit = %w.unit, "cannot keep the revision {} ran before rollout {id}: {er}; a revert of it will not find it", w.unit);
            }
        }
        match revisions::save(dir, &rev) {
            Ok(()) => format!("recorded the revision {} runs with: {}", w.unit, rev.files.keys().cloned().collect::<Vec<_>>().join(", ")),
            Err(er) => format!("could not record the revision of {}: {er}", w.unit),
        }
    }

    /// A unit failed its gates with files that differ from its last good revision: that change
    /// failed, so `rollout apply` does not roll the same files out again until they change.
    pub(in crate::engine) async fn quarantine_if_changed(&self, unit: &str, cause: &str, dir: &Path, id: &str) -> Option<String> {
        let w = self.settings.workers.iter().find(|w| w.unit == unit)?;
        let cfg = self.units.config(unit).await.ok()?;
        let current = revisions::snapshot(unit, &revisions::paths(unit, &cfg, &w.watch_files), "current");
        let last = revisions::load(dir, unit)?;
        if revisions::stale_reasons(&current, Some(&last), 0, false).is_empty() {
            return None;
        }
        let q = revisions::Quarantine {
            unit: unit.into(),
            fingerprint: revisions::fingerprint(&current),
            rollout_id: id.into(),
            cause: cause.into(),
            at: crate::lifecycle::now(),
        };
        Some(match revisions::quarantine(dir, &q) {
            Ok(()) => format!("quarantined the change of {unit} that failed (its files' fingerprint {}): `pdctl rollout apply` will not roll it out again until the files change", &q.fingerprint[..12]),
            Err(e) => format!("could not quarantine the failed change of {unit}: {e}"),
        })
    }

    /// Each configured worker, in config order: why it is stale (no reasons: it runs its current
    /// files) and whether its current files are a change that already failed. A worker without a
    /// recorded revision gets one first: what its running process started with
    /// ([`revisions::baseline`]), so that a rollback works from the first day.
    pub async fn staleness(&self, dir: &Path) -> Result<Vec<Staleness>, Cause> {
        let mut out = Vec::new();
        for w in &self.settings.workers {
            let cfg = self.units.config(&w.unit).await.map_err(UnitsError::cause)?;
            let st = self.units.state(&w.unit).await.map_err(UnitsError::cause)?;
            let files = revisions::paths(&w.unit, &cfg, &w.watch_files);
            let current = revisions::snapshot(&w.unit, &files, "current");
            let last = match revisions::load(dir, &w.unit) {
                Some(r) => Some(r),
                None => match self.settled(&w.unit, st.clone()).await {
                    // Only a run that stayed up for `min_healthy` is taken for a good one: a
                    // crash-looping run of a bad change (active for a moment between crashes)
                    // would otherwise become the "good" revision a rollback restores.
                    Some(st) => {
                        let base = revisions::baseline(&w.unit, &files, st.exec_main_start_us);
                        match revisions::save_if_absent(dir, &base) {
                            Ok(false) => revisions::load(dir, &w.unit),
                            _ => Some(base),
                        }
                    }
                    None => None,
                },
            };
            let reasons = revisions::stale_reasons(&current, last.as_ref(), st.exec_main_start_us, cfg.need_daemon_reload);
            let quarantined = if reasons.is_empty() { None } else { revisions::quarantined(dir, &current) };
            out.push(Staleness { unit: w.unit.clone(), reasons, quarantined });
        }
        Ok(out)
    }
}

/// Restore `unit`'s last good revision, reload, and run it through the same gates. Only
/// after a restart (a refusal is never rolled back: it changed nothing). `Ok(false)`: there
/// was nothing to take back — the unit has the files of its last good revision — and nothing
/// is restarted for it (the same files again would be a retry, not a rollback).
pub(in crate::engine) async fn rollback<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    unit: &str,
    ctx: Ctx<'_>,
    dir: &Path,
    sink: &Sink,
    notes: &Notes,
) -> Result<bool, String> {
    let w = eng.settings.workers.iter().find(|w| w.unit == unit).ok_or("not a configured worker")?;
    let last = revisions::load(dir, unit).ok_or_else(|| format!("no good revision of {unit} was ever recorded"))?;
    let cfg = eng.units.config(unit).await.map_err(|er| er.to_string())?;
    let current = revisions::snapshot(unit, &revisions::paths(unit, &cfg, &w.watch_files), "current");
    let step = StepRun::start(sink, unit, Step::Rollback);
    let done = match revisions::restore(&last, &current, ctx.writes.id) {
        Ok(d) => d,
        Err(er) => {
            // Stopped half-way: which files are back, and which one is not.
            let why = er.to_string();
            step.emit(Status::Failed, detail_of(&RestoreStopped { cause: &why, restored: &er.done, not_restored: Some(&er.path) }));
            return Err(why);
        }
    };
    if done.is_empty() {
        step.skip(NOTHING_TO_RESTORE);
        notes.push(format!("{unit} already has the files of its last good revision: nothing to roll back, so it was not restarted again"));
        return Ok(false);
    }
    tracing::warn!(pdctl_unit = %unit, "{unit}: rolling back to its last good revision: {}", done.join("; "));
    if let Err(er) = eng.units.reload().await {
        step.emit(Status::Failed, detail_of(&RestoreStopped { cause: &er.to_string(), restored: &done, not_restored: None }));
        return Err(er.to_string());
    }
    step.pass(detail_of(&Restored { revision_recorded_at: last.recorded_at, restored: &done, restart: None, revert: None }));
    notes.extend(done);
    let plan = Plan { workers: vec![w.clone()] };
    // The restored files are what it ran last: loading them is the point.
    let s = roll::plan(eng, &plan, sink, &AtomicBool::new(false), Ctx { load_changes: true, ..ctx }, notes).await;
    match s.result {
        Outcome::Succeeded => {
            notes.push(format!("{unit} runs its last good revision (recorded {}) and passed every gate", last.recorded_at));
            Ok(true)
        }
        _ => Err(format!("the old revision did not pass either: {}", s.failed.map(|f| f.cause).unwrap_or_default())),
    }
}

/// A revert (`Request::Revert`; a fleet bake's breach): each worker of the plan, in plan order,
/// gets back the files it ran before the reverted rollout (`befores`; step `rollback`: files
/// restored, the manager reloaded) and is restarted through every gate (and fleet slot) with
/// them. One worker's files are put back only when it is its turn, so no other worker restarts
/// on a change it was not meant to load; the first that fails halts the revert.
pub(in crate::engine) async fn revert<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    plan: &Plan,
    befores: &std::collections::BTreeMap<String, revisions::Revision>,
    sink: &Sink,
    abort: &AtomicBool,
    ctx: Ctx<'_>,
    notes: &Notes,
) -> Summary {
    let t0 = Instant::now();
    let mut done: Vec<String> = Vec::new();
    let end = |result: Outcome, done: &[String], failed: Option<crate::events::Failure>| Summary {
        id: None,
        result,
        elapsed_ms: t0.elapsed().as_millis() as u64,
        units: done.to_vec(),
        checked: Vec::new(),
        repairs: Default::default(),
        availability: None,
        failed,
    };
    // A refusal touches nothing: the preflight each worker's restart will run (the outage it
    // would cause among them) is asked before any file is put back; only its verdict is said.
    let (quiet, _unheard) = tokio::sync::mpsc::unbounded_channel();
    let asked = Ctx { load_changes: true, ..ctx };
    if let Err((unit, f)) = crate::engine::plan_steps::preflight(eng, plan, &quiet, true, asked).await {
        StepRun::start(sink, &unit, Step::Preflight).fail(&f);
        return end(Outcome::Failed, &done, Some(halt::failure(eng, &unit, Step::Preflight, f).await));
    }
    for w in &plan.workers {
        if abort.load(std::sync::atomic::Ordering::SeqCst) {
            return end(Outcome::Aborted, &done, None);
        }
        let Some(before) = befores.get(&w.unit) else { continue };
        let step = StepRun::start(sink, &w.unit, Step::Rollback);
        let restored = async {
            let cfg = eng.units.config(&w.unit).await.map_err(|er| er.to_string())?;
            let current = revisions::snapshot(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), "current");
            let d = revisions::restore(before, &current, ctx.writes.id).map_err(|er| er.to_string())?;
            eng.units.reload().await.map_err(|er| format!("the manager did not reload them: {er}"))?;
            Ok::<_, String>(d)
        };
        let restored = match restored.await {
            Ok(d) => d,
            Err(error) => {
                let f = Fail::from(Cause::RestoreFailed { unit: w.unit.clone(), error });
                step.fail(&f);
                return end(Outcome::Failed, &done, Some(halt::failure(eng, &w.unit, Step::Rollback, f).await));
            }
        };
        tracing::warn!(pdctl_unit = %w.unit, "{}: reverting to the revision it ran before (recorded {}): {}", w.unit, before.recorded_at, restored.join("; "));
        step.pass(detail_of(&Restored { revision_recorded_at: before.recorded_at, restored: &restored, restart: Some(true), revert: Some(true) }));
        notes.extend(restored);
        // The restored files are what it ran before: loading them is the point.
        let one = Plan { workers: vec![w.clone()] };
        let s = roll::plan(eng, &one, sink, abort, Ctx { load_changes: true, ..ctx }, notes).await;
        done.extend(s.units.iter().cloned());
        if s.result != Outcome::Succeeded {
            return end(s.result, &done, s.failed);
        }
        notes.push(format!("{} runs the revision it ran before (recorded {}) and passed every gate", w.unit, before.recorded_at));
    }
    end(Outcome::Succeeded, &done, None)
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rollback_and_revert_details_have_the_keys_of_the_contract() {
        let files = vec!["f".to_string()];
        assert_eq!(
            detail_of(&Restored { revision_recorded_at: 1, restored: &files, restart: None, revert: None }),
            json!({"revision_recorded_at": 1, "restored": ["f"]})
        );
        assert_eq!(
            detail_of(&Restored { revision_recorded_at: 1, restored: &files, restart: Some(true), revert: Some(true) }),
            json!({"revision_recorded_at": 1, "restored": ["f"], "restart": true, "revert": true})
        );
        assert_eq!(
            detail_of(&RestoreStopped { cause: "c", restored: &files, not_restored: Some("g") }),
            json!({"cause": "c", "restored": ["f"], "not_restored": "g"})
        );
        assert_eq!(detail_of(&RestoreStopped { cause: "c", restored: &[], not_restored: None }), json!({"cause": "c", "restored": []}));
    }
}
