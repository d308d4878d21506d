//! Recovery: good revisions recorded and restored (rollback), changes quarantined, drains and slots
//! reconciled after a crash, and whether each worker runs its current files (staleness).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cause::Cause;
use crate::config::Worker;
use crate::engine::context::Ctx;
use crate::engine::gates;
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::roll;
use crate::engine::step_run::{detail_of, within, Fail, StepRun, POLL};
use crate::engine::steps::NOTHING_TO_RESTORE;
use crate::engine::work::Staleness;
use crate::events::{Outcome, Sink, Status, Step, Summary};
use crate::plan::Plan;
use crate::ports::{ActiveState, Health, Logs, Probes, SubState, UnitState, Units, UnitsError};
use crate::state::drain_ledger::{Drain, Hold, Ledger};
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

/// The reconcile's detail: the drain undone and the gateway's admission.
#[derive(Serialize)]
struct Reconciled<'a> {
    /// The worker still runs the run that was drained.
    same_run: bool,
    /// The rollout that drained it.
    drained_by: &'a str,
    /// When (seconds since the epoch).
    drained_at: u64,
    /// The router gate's detail.
    router: serde_json::Value,
    /// How long the reconcile took.
    waited_ms: u64,
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
        let (cfg, st) = match (self.units.config(&w.unit).await, self.units.state(&w.unit).await) {
            (Ok(c), Ok(s)) => (c, s),
            (Err(e), _) | (_, Err(e)) => return format!("could not record the revision of {}: {e}", w.unit),
        };
        let mut rev = revisions::baseline(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), st.exec_main_start_us);
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

    /// Undo a drain pdctl made (step `reconcile`): the worker is re-admitted to the router only
    /// when it serves. Still on the run that was drained and healthy: re-registered at once (that
    /// process passed the gates). On a new run: only after `/health` and the router gate pass,
    /// waiting up to `budget` for it to come up while systemd is still starting it (a 0.3.2 router
    /// loses for good a worker registered while it is still starting). Anything else stays in
    /// the ledger and is reported. Returns a note for the record.
    pub async fn reconcile(&self, d: &Drain, ledger: &Ledger, budget: Duration, sink: &Sink) -> Result<String, Cause> {
        self.reconcile_as(d, ledger, budget, sink, false).await
    }

    /// [`Engine::reconcile`]; `rollback_follows`: the failed unit's rollback comes next, so a
    /// worker that is not serving is said to wait for it (step `skipped`), not to have failed —
    /// its drain stays on record either way until a gate re-admits it.
    pub(in crate::engine) async fn reconcile_as(
        &self,
        d: &Drain,
        ledger: &Ledger,
        budget: Duration,
        sink: &Sink,
        rollback_follows: bool,
    ) -> Result<String, Cause> {
        let s = StepRun::start(sink, &d.unit, Step::Reconcile);
        if let Some(why) = held_out(d, &ledger.all().0) {
            s.skip(&why);
            return Ok(format!("{} stays out of the router: {why}", d.unit));
        }
        let t0 = Instant::now();
        let w = self.settings.workers.iter().find(|w| w.unit == d.unit).cloned().unwrap_or_else(|| Worker {
            unit: d.unit.clone(),
            role: d.role,
            url: d.url.clone(),
            bootstrap_port: d.bootstrap_port,
            gpus: None,
            watch_files: Vec::new(),
            api_key: None,
            admin_api_key: None,
        });
        let r = async {
            let st = self.units.state(&d.unit).await?;
            let same_run = !d.invocation_id.is_empty() && st.invocation_id == d.invocation_id;
            let mut last;
            let mut stopped_since: Option<Instant> = None;
            loop {
                last = match within(t0, budget.max(Duration::from_secs(30)), self.probes.health(&w.url)).await {
                    Some(Health::Up) => break,
                    Some(Health::Unavailable(x)) | Some(Health::Down(x)) => x,
                    None => "no answer".into(),
                };
                let st = self.units.state(&d.unit).await?;
                // A restart passes through deactivating and, briefly, inactive: only a failed unit,
                // or one that stays inactive, is not coming up.
                stopped_since = match st.active_state {
                    ActiveState::Inactive => stopped_since.or(Some(Instant::now())),
                    _ => None,
                };
                // A crash loop (`auto-restart`) is not coming up either: waiting for it would hold
                // the rollout lock for the whole budget.
                let gone = st.active_state == ActiveState::Failed
                    || st.sub_state == SubState::AutoRestart
                    || stopped_since.is_some_and(|t| t.elapsed() > Duration::from_secs(10));
                if gone || t0.elapsed() >= budget {
                    return Err(Fail::from(Cause::DrainNotRestored {
                        unit: d.unit.clone(),
                        why: format!("{}/{}, /health: {last}", st.active_state, st.sub_state),
                    }));
                }
                tokio::time::sleep(POLL).await;
            }
            let admitted = gates::router::router(self, &w, true, false).await?;
            ledger.clear(&d.unit).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))?;
            Ok(detail_of(&Reconciled {
                same_run,
                drained_by: &d.rollout_id,
                drained_at: d.drained_at,
                router: admitted,
                waited_ms: t0.elapsed().as_millis() as u64,
            }))
        }
        .await;
        match r {
            Ok(detail) => {
                s.pass(detail);
                let slot = self.reconcile_slots(ledger, Some(&d.unit)).await.join("; ");
                Ok(format!(
                    "{} was drained by {} and is back in the router{}",
                    d.unit,
                    d.rollout_id,
                    if slot.is_empty() { String::new() } else { format!("; {slot}") }
                ))
            }
            Err(f) if rollback_follows && matches!(f.cause, Cause::DrainNotRestored { .. }) => {
                s.skip(&format!(
                    "{}; on_failure = \"rollback\": the rollback that follows puts its last good revision back and re-admits it through every gate",
                    f.cause.sentence()
                ));
                Err(f.cause)
            }
            Err(f) => {
                s.fail(&f);
                Err(f.cause)
            }
        }
    }

    /// Fleet slots this host still has on record (only `unit`'s when given): each whose worker
    /// has no open drain and serves (`/health` 200) is given back; one etcd no longer lists is
    /// crossed off. A worker still down keeps its slot (it really is down). Returns one sentence
    /// per slot given back.
    pub async fn reconcile_slots(&self, ledger: &Ledger, unit: Option<&str>) -> Vec<String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        // A host in maintenance keeps its slots until its resume passed every gate (its workers
        // serving again after the reboot is not enough); an unreadable record keeps them all.
        let maintenance = match ledger.maintenance() {
            Ok(m) => m.map(|m| crate::engine::host::maintenance_hold(&m.id)),
            Err(_) => return out,
        };
        for (name, recs) in ledger.slots() {
            if unit.is_some_and(|u| u.replace('/', "_") != name) || ledger.get(&name).is_some() {
                continue;
            }
            if recs.iter().any(|r| maintenance.as_deref() == Some(r.hold.rollout.as_str())) {
                continue;
            }
            let mut serving = true;
            for r in &recs {
                serving &= self.probes.health(&r.hold.url).await == Health::Up;
            }
            if !serving {
                continue;
            }
            let mut done = true;
            for r in &recs {
                match crate::fleet::release(c.as_ref(), &f.name, &r.role, &r.hold.holder, &r.hold.token).await {
                    Ok(true) => out.push(format!("gave back {}'s {} slot (held since {})", r.hold.holder, r.role, crate::fleet::clock(r.hold.since))),
                    Ok(false) => {}
                    Err(_) => done = false,
                }
            }
            if done {
                let _ = ledger.clear_slot(&name);
            }
        }
        out
    }

    /// `st` if the unit's run is settled: active and running, up for `min_healthy` (waiting
    /// out the rest, at most `min_healthy`) on the same run without an auto-restart; else `None`.
    pub(in crate::engine) async fn settled(&self, unit: &str, st: UnitState) -> Option<UnitState> {
        if st.active_state != ActiveState::Active || st.sub_state != SubState::Running {
            return None;
        }
        let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let up = Duration::from_micros(now_us.saturating_sub(st.exec_main_start_us));
        let need = self.settings.rollout.min_healthy;
        if up < need {
            tokio::time::sleep(need - up).await;
            let again = self.units.state(unit).await.ok()?;
            if again.invocation_id != st.invocation_id
                || again.n_restarts != st.n_restarts
                || again.main_pid != st.main_pid
                || again.active_state != ActiveState::Active
            {
                return None;
            }
            return Some(again);
        }
        Some(st)
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

/// Why a drain a coherent switch made must stay out ([`Hold`]; `None`: it may be undone). Only
/// the verified new group comes back by itself, and only once the switch had begun (the old
/// group is out): anything else back in could pair two models behind the gateway.
pub(in crate::engine) fn held_out(d: &Drain, ledger: &[Drain]) -> Option<String> {
    let switched = ledger.iter().any(|o| o.rollout_id == d.rollout_id && o.hold == Some(Hold::Old));
    let next = "`pdctl rollout apply` restarts what still runs the old model";
    match d.hold? {
        Hold::Verified if switched => None,
        Hold::New | Hold::Verified => {
            Some(format!("it runs the new model while the old group serves (the coherent switch of {} stopped before the switch); {next}", d.rollout_id))
        }
        Hold::Old => {
            Some(format!("it still runs the old model and the new group serves (the coherent switch of {} stopped after the switch); {next}", d.rollout_id))
        }
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
    notes: &mut Vec<String>,
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
    notes: &mut Vec<String>,
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
    if let Err((unit, f)) = crate::engine::gates::preflight::preflight(eng, plan, &quiet, true, asked).await {
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
mod held_tests {
    use super::*;

    fn drain(unit: &str, hold: Option<Hold>) -> Drain {
        Drain {
            unit: unit.into(),
            url: format!("http://{unit}"),
            role: crate::config::Role::Prefill,
            bootstrap_port: None,
            invocation_id: "i".into(),
            router_id: "r".into(),
            rollout_id: "r1".into(),
            drained_at: 0,
            hold,
        }
    }

    #[test]
    fn only_a_verified_new_group_comes_back_and_only_after_the_old_one_went_out() {
        let plain = drain("a", None);
        assert_eq!(held_out(&plain, std::slice::from_ref(&plain)), None, "a plain drain is undone");
        let new = drain("p0", Some(Hold::Verified));
        let old = drain("p1", Some(Hold::Old));
        // Before the switch: the old group serves, the new one stays out.
        assert!(held_out(&new, std::slice::from_ref(&new)).is_some_and(|w| w.contains("before the switch")));
        assert!(held_out(&drain("p0", Some(Hold::New)), std::slice::from_ref(&old)).is_some(), "an unverified new worker never comes back by itself");
        // During the switch: the verified new group comes back, the old group stays out.
        assert_eq!(held_out(&new, &[new.clone(), old.clone()]), None);
        assert!(held_out(&old, &[new.clone(), old.clone()]).is_some_and(|w| w.contains("old model")));
        // Another rollout's old group does not count.
        let other = Drain { rollout_id: "r2".into(), ..old };
        assert!(held_out(&new, &[new.clone(), other]).is_some());
    }
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_rollback_revert_and_reconcile_details_have_the_keys_of_the_contract() {
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
        assert_eq!(
            detail_of(&Reconciled { same_run: true, drained_by: "r1", drained_at: 2, router: json!({"router_id": "i"}), waited_ms: 3 }),
            json!({"same_run": true, "drained_by": "r1", "drained_at": 2, "router": {"router_id": "i"}, "waited_ms": 3})
        );
    }
}

/// The reconcile of a drain over fakes: a crash-looping worker is reported, not waited for.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

    #[tokio::test]
    async fn a_drain_of_a_crash_looping_worker_is_reported_not_waited_for() {
        use pdctl_core::state::drain_ledger::{Drain, Ledger};
        let w = world();
        w.lock().unwrap().unhealthy.push("http://p".into());
        if let Some(st) = w.lock().unwrap().states.get_mut("p.service") {
            st.active_state = "activating".into();
            st.sub_state = "auto-restart".into();
        }
        let dir = std::env::temp_dir().join(format!("pdctl-fake-ledger-{}", std::process::id()));
        let ledger = Ledger::open(&dir).unwrap();
        let d = Drain {
            unit: "p.service".into(),
            url: "http://p".into(),
            role: pdctl_core::config::Role::Prefill,
            bootstrap_port: None,
            invocation_id: "old".into(),
            router_id: "w1".into(),
            rollout_id: "r1".into(),
            drained_at: 0,
            hold: None,
        };
        ledger.record(&d).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: settings(), coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        // A budget of 5 minutes: a crash loop is not coming up, so it must not be waited out (the
        // rollout lock is held meanwhile). The bound only keeps a regression from hanging the suite.
        let r = tokio::time::timeout(Duration::from_secs(60), engine.reconcile(&d, &ledger, Duration::from_secs(300), &tx)).await.expect("not waited out");
        let cause = r.unwrap_err();
        assert_eq!(cause.code(), "drain_not_restored");
        assert!(cause.sentence().contains("auto-restart"), "{}", cause.sentence());
        assert!(ledger.get("p.service").is_some(), "the drain stays on record");
        let _ = std::fs::remove_dir_all(dir);
    }
}
