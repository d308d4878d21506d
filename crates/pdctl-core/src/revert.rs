//! What a revert of a rollout puts back: the workers it restarted with changed files (those whose
//! revision from before it was kept), the last first, each with that revision — a pure decision
//! over its record and the revisions pdctld read. pdctld loads them and plans; this decides.

use std::collections::BTreeMap;

use pdctl_contract::api::Record;
use pdctl_contract::cause::Cause;
use pdctl_contract::lifecycle::RolloutState;

use crate::state::revisions::{fingerprint, Revision};

/// A worker's revisions as kept: the one from before the rollout changed its files, and the one
/// it runs now.
#[derive(Debug, Clone, Default)]
pub struct Kept {
    /// From before the rollout (absent: it changed none of this worker's files).
    pub before: Option<Revision>,
    /// The one its running process was started and verified with.
    pub running: Option<Revision>,
}

/// The revert's plan, or why there is nothing to do.
#[derive(Debug, Clone)]
pub enum RevertOrder {
    /// Restart these workers (the last the rollout did first), each back to its revision.
    Run {
        /// In order.
        units: Vec<String>,
        /// Each unit's revision to put back.
        restore: BTreeMap<String, Revision>,
        /// Why each is restarted (for the record).
        reasons: BTreeMap<String, Vec<String>>,
    },
    /// Nothing to put back, and why.
    Nothing(String),
}

/// The revert of `old`, given each of its units' kept revisions; `reverted_by` names the
/// rollout that already reverted it, when asked (only to say so).
pub fn order(old: &Record, kept: &BTreeMap<String, Kept>, reverted_by: impl FnOnce() -> Option<String>) -> Result<RevertOrder, Cause> {
    let id = &old.id;
    if old.lifecycle.state() == RolloutState::Running {
        return Err(Cause::WrongState {
            id: id.clone(),
            state: old.lifecycle.state().as_str().into(),
            needs: "a running rollout cannot be reverted: abort it first (pdctl rollout abort)".into(),
        });
    }
    let done = old.summary.as_ref().map(|s| s.units.clone()).unwrap_or_default();
    let (mut restore, mut reasons, mut units) = (BTreeMap::new(), BTreeMap::new(), Vec::new());
    // A worker whose running process was started (and verified) with the files the rollout
    // replaced has nothing to revert: a second revert is a no-op, not another restart.
    let mut already = Vec::new();
    for u in done.iter().rev() {
        let Some(Kept { before: Some(rev), running }) = kept.get(u) else { continue };
        if running.as_ref().is_some_and(|r| fingerprint(r) == fingerprint(rev)) {
            already.push(u.clone());
            continue;
        }
        reasons.insert(u.clone(), vec![format!("revert of rollout {id}: back to the files it ran before (recorded {})", rev.recorded_at)]);
        restore.insert(u.clone(), rev.clone());
        units.push(u.clone());
    }
    if units.is_empty() && !already.is_empty() {
        let by = reverted_by().map(|r| format!(" (rollout {r} reverted it)")).unwrap_or_default();
        return Ok(RevertOrder::Nothing(format!("nothing to revert: {} already running the files rollout {id} replaced{by}", already.join(", "))));
    }
    if units.is_empty() {
        return Ok(RevertOrder::Nothing(format!(
            "nothing to revert: rollout {id} changed no worker's files (its restarts loaded what the workers already had)"
        )));
    }
    Ok(RevertOrder::Run { units, restore, reasons })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdctl_contract::api::RolloutKind;
    use pdctl_contract::events::Summary;

    fn rev(unit: &str, text: &str) -> Revision {
        let file = crate::state::revisions::FileRev { sha256: text.into(), contents: Some(text.into()), owner: None };
        Revision { unit: unit.into(), recorded_at: 7, why: "started".into(), files: BTreeMap::from([(format!("/etc/{unit}"), file)]) }
    }

    fn done(units: &[&str]) -> Record {
        let mut r = Record::new("r1", RolloutKind::Apply, units.iter().map(|s| s.to_string()).collect(), BTreeMap::new(), None);
        let s: Summary = serde_json::from_value(serde_json::json!({ "id": "r1", "result": "succeeded", "elapsed_ms": 1, "units": units })).unwrap();
        r.summary = Some(s);
        r.lifecycle.enter(units[0], pdctl_contract::events::Step::Restart).unwrap();
        r.lifecycle.finish(pdctl_contract::events::Outcome::Succeeded).unwrap();
        r
    }

    #[test]
    fn puts_back_the_changed_workers_the_last_first_and_not_those_already_running_their_old_files() {
        let old = done(&["p", "d", "x"]);
        let kept = BTreeMap::from([
            ("p".to_string(), Kept { before: Some(rev("p", "old")), running: Some(rev("p", "new")) }),
            ("d".to_string(), Kept { before: Some(rev("d", "old")), running: Some(rev("d", "new")) }),
            // x: no revision from before (its files did not change).
            ("x".to_string(), Kept { before: None, running: Some(rev("x", "same")) }),
        ]);
        let RevertOrder::Run { units, restore, reasons } = order(&old, &kept, || None).unwrap() else { panic!("a revert to run") };
        assert_eq!(units, ["d", "p"]);
        assert_eq!(restore["d"].files["/etc/d"].contents.as_deref(), Some("old"));
        assert!(reasons["p"][0].contains("revert of rollout r1"), "{reasons:?}");
        // Both running their old files again: nothing, naming who reverted it.
        let again = BTreeMap::from([
            ("p".to_string(), Kept { before: Some(rev("p", "old")), running: Some(rev("p", "old")) }),
            ("d".to_string(), Kept { before: Some(rev("d", "old")), running: Some(rev("d", "old")) }),
        ]);
        let RevertOrder::Nothing(why) = order(&old, &again, || Some("r2".into())).unwrap() else { panic!("nothing") };
        assert_eq!(why, "nothing to revert: d, p already running the files rollout r1 replaced (rollout r2 reverted it)");
        let RevertOrder::Nothing(why) = order(&old, &BTreeMap::new(), || None).unwrap() else { panic!("nothing") };
        assert!(why.contains("changed no worker's files"), "{why}");
    }

    #[test]
    fn a_running_rollout_is_not_reverted() {
        let mut r = Record::new("r1", RolloutKind::Apply, vec!["p".into()], BTreeMap::new(), None);
        r.lifecycle.enter("p", pdctl_contract::events::Step::Restart).unwrap();
        assert!(matches!(order(&r, &BTreeMap::new(), || None), Err(Cause::WrongState { needs, .. }) if needs.contains("abort it first")));
    }
}
