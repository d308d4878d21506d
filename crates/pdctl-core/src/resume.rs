//! Whether an interrupted rollout can be resumed, from which unit, and which of its units are
//! re-verified rather than restarted again: a pure decision over its record and what systemd says
//! of its units now. pdctld loads the record, asks systemd, and persists the answer; this decides.

use std::collections::BTreeMap;

use pdctl_contract::api::{Record, RolloutKind};
use pdctl_contract::cause::Cause;
use pdctl_contract::events::{Status, Step};
use pdctl_contract::lifecycle::RolloutState;

/// A unit's run now, as systemd says (absent: it could not be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunNow {
    /// Its `InvocationID`.
    pub invocation_id: String,
    /// When its main process started (µs since the epoch).
    pub exec_main_start_us: u64,
}

/// The resume's order: the first `reverify` units are verified as they run, the rest restarted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeOrder {
    /// Every unit still to do, in order.
    pub order: Vec<String>,
    /// How many at the front are re-verified, not restarted.
    pub reverify: usize,
    /// Units of the plan not resumed: an interrupted change of role resumes only the worker it
    /// stopped at (its unit already says its new role, so its verification or restart brings
    /// it there); a restart of the later ones would keep their old role, so they are left for
    /// `pdctl role set` to be asked again.
    pub left: Vec<String>,
}

/// Why a rollout of `kind` is not resumed as a rolling restart (its workers were continued when
/// pdctld started; its files, weights or maintenance are taken up otherwise), if it is not.
fn not_resumed(kind: RolloutKind, in_place: bool) -> Option<&'static str> {
    match kind {
        RolloutKind::Weights => Some("an interrupted weights rollout is not resumed (pdctld continued its workers when it started): `pdctl status` shows each worker's weights; run pdctl rollout weights again"),
        RolloutKind::Revert => Some("an interrupted revert is not resumed: run pdctl rollout revert with the reverted rollout's id again (workers already put back are left as they are)"),
        RolloutKind::Apply if in_place => Some("an interrupted config rollout that was loading new weights in place is not resumed as a restart (pdctld continued its workers when it started): `pdctl status` shows each worker's weights; run pdctl rollout apply again"),
        // A host's maintenance is resumed only as itself: pdctld's start already brought an
        // interrupted drain's workers back (or finished its resume), so a rolling resume would
        // restart nothing and say it succeeded while the host serves.
        RolloutKind::HostDrain => Some("an interrupted host drain is not resumed as a rollout: pdctld brought the host's workers back in service when it started (`pdctl host status` says where the host is); to take the host down for its reboot, run pdctl host drain again"),
        RolloutKind::HostResume => Some("an interrupted host resume is not resumed as a rollout: pdctld resumes the host by itself at its start (`pdctl host status`); run pdctl host resume to do it now"),
        _ => None,
    }
}

/// The resume of `old` (only an interrupted rollout, once), given each unit's run now.
pub fn order(old: &Record, now: &BTreeMap<String, RunNow>) -> Result<ResumeOrder, Cause> {
    let state = old.lifecycle.state();
    let wrong = |needs: &str| Cause::WrongState { id: old.id.clone(), state: state.as_str().into(), needs: needs.into() };
    if state != RolloutState::Interrupted {
        return Err(wrong("only an interrupted rollout can be resumed, and only once"));
    }
    if let Some(needs) = not_resumed(old.kind, old.in_place) {
        return Err(wrong(needs));
    }
    let at = old.lifecycle.position();
    let from = at.and_then(|p| old.plan.iter().position(|u| *u == p.unit)).unwrap_or(0);
    // Stopped while waiting for a fleet slot: that unit was never touched, so it is restarted,
    // not re-verified.
    let touched = !at.is_some_and(|p| p.step == Step::Slot);
    // A unit after it that this rollout already restarted (`single_pair = "together"` restarts
    // both at once) and whose run is still that one is re-verified too, not restarted again:
    // its InvocationID now is the one its restart recorded — or, where pdctld died before that
    // event reached the record (the stream hears of it first), its run began after this
    // rollout did (a run no older than the rollout loaded what the rollout would load).
    let mut lead: Vec<String> = old.plan.get(from).cloned().into_iter().collect();
    let mut rest = Vec::new();
    for u in old.plan.iter().skip(from + 1) {
        let restarted_as = old
            .events
            .iter()
            .rev()
            .find(|ev| ev.unit == *u && ev.step == Step::Restart && ev.status == Status::Passed)
            .and_then(|ev| crate::details::RestartSeen::of(&ev.detail).invocation_id);
        let run = now.get(u);
        let began_since = run.is_some_and(|r| r.exec_main_start_us > old.created_at.saturating_mul(1_000_000));
        let same_run = restarted_as.is_some() && restarted_as.as_deref() == run.map(|r| r.invocation_id.as_str());
        if touched && (same_run || (restarted_as.is_none() && began_since)) {
            lead.push(u.clone());
        } else {
            rest.push(u.clone());
        }
    }
    let reverify = if touched { lead.len() } else { 0 };
    let left = if old.kind == RolloutKind::Role { std::mem::take(&mut rest) } else { Vec::new() };
    Ok(ResumeOrder { order: lead.into_iter().chain(rest).collect(), reverify, left })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdctl_contract::events::Event;

    fn record(kind: RolloutKind, plan: &[&str], at: (&str, Step)) -> Record {
        let mut r = Record::new("r1", kind, plan.iter().map(|s| s.to_string()).collect(), BTreeMap::new(), None);
        r.created_at = 1_000;
        r.lifecycle.enter(at.0, at.1).unwrap();
        r.lifecycle.interrupt().unwrap();
        r
    }

    fn restarted(r: &mut Record, unit: &str, invocation: &str) {
        let detail = serde_json::json!({ "invocation_id": invocation });
        r.events.push(Event { unit: unit.into(), step: Step::Restart, status: Status::Passed, elapsed_ms: 0, at: String::new(), detail, repair_of: None });
    }

    fn run(inv: &str, start_s: u64) -> RunNow {
        RunNow { invocation_id: inv.into(), exec_main_start_us: start_s * 1_000_000 }
    }

    #[test]
    fn an_interrupted_change_of_role_resumes_only_the_worker_it_stopped_at() {
        let r = record(RolloutKind::Role, &["d2", "d3"], ("d2", Step::Role));
        let o = order(&r, &BTreeMap::new()).unwrap();
        assert_eq!((o.order, o.reverify, o.left), (vec!["d2".to_string()], 1, vec!["d3".to_string()]));
    }

    #[test]
    fn resumes_at_the_unit_it_stopped_at_and_reverifies_those_it_restarted_whose_run_is_still_that_one() {
        let mut r = record(RolloutKind::Restart, &["p", "d", "x"], ("p", Step::Ready));
        // `together`: d was restarted with p (its run is still that one); x was not.
        restarted(&mut r, "d", "inv-d");
        let now = BTreeMap::from([("d".to_string(), run("inv-d", 900)), ("x".to_string(), run("inv-x", 900))]);
        assert_eq!(order(&r, &now).unwrap(), ResumeOrder { order: vec!["p".into(), "d".into(), "x".into()], reverify: 2, left: vec![] });
        // d restarted since by someone else: restarted again.
        let now = BTreeMap::from([("d".to_string(), run("other", 900))]);
        assert_eq!(order(&r, &now).unwrap().reverify, 1);
        // The event never reached the record, but d's run began after the rollout did.
        let r2 = record(RolloutKind::Restart, &["p", "d"], ("p", Step::Ready));
        assert_eq!(order(&r2, &BTreeMap::from([("d".to_string(), run("any", 2_000))])).unwrap().reverify, 2);
        assert_eq!(order(&r2, &BTreeMap::new()).unwrap().reverify, 1, "not readable: restarted");
    }

    #[test]
    fn stopped_waiting_for_a_slot_restarts_that_unit_and_reverifies_none() {
        let mut r = record(RolloutKind::Restart, &["p", "d"], ("p", Step::Slot));
        restarted(&mut r, "d", "inv-d");
        let now = BTreeMap::from([("d".to_string(), run("inv-d", 2_000))]);
        assert_eq!(order(&r, &now).unwrap(), ResumeOrder { order: vec!["p".into(), "d".into()], reverify: 0, left: vec![] });
    }

    #[test]
    fn only_an_interrupted_rollout_of_a_resumable_kind_is_resumed_once() {
        for (kind, in_place, word) in [
            (RolloutKind::Weights, false, "weights"),
            (RolloutKind::Revert, false, "revert"),
            (RolloutKind::Apply, true, "in place"),
            (RolloutKind::HostDrain, false, "host drain"),
            (RolloutKind::HostResume, false, "host resume"),
        ] {
            let mut r = record(kind, &["p"], ("p", Step::Ready));
            r.in_place = in_place;
            let e = order(&r, &BTreeMap::new()).expect_err("not resumed");
            assert!(matches!(&e, Cause::WrongState { needs, .. } if needs.contains(word)), "{kind:?}: {e:?}");
        }
        let mut r = record(RolloutKind::Apply, &["p"], ("p", Step::Ready));
        assert!(order(&r, &BTreeMap::new()).is_ok());
        r.lifecycle.resume("r2").unwrap();
        assert!(matches!(order(&r, &BTreeMap::new()), Err(Cause::WrongState { needs, .. }) if needs.contains("only once")));
    }
}
