//! What etcd holds of one fleet rollout as a whole, as `pdctl fleet watch` reads it: whether it
//! has ended, and its summary (the watch's last line). Pure, no I/O.

pub use pdctl_contract::records::FleetSummary;
use std::collections::BTreeMap;

use super::bake::{bake_sentence, revert_order, BakeState, FleetRevert, HostBake};
use super::keys::{FleetRollout, HostResult, HostSummary};

/// What etcd holds of one fleet rollout, as `pdctl fleet watch` reads it.
#[derive(Debug, Clone, Default)]
pub struct FleetView {
    /// Each host's part (a host without one: not started).
    pub summaries: BTreeMap<String, HostSummary>,
    /// Each changed host's bake.
    pub bakes: BTreeMap<String, HostBake>,
    /// The revert request, after a breach.
    pub revert: Option<FleetRevert>,
    /// Each reverting host's revert.
    pub reverted: BTreeMap<String, HostSummary>,
}

impl FleetView {
    /// Whether the fleet rollout has ended: every host's part, then (with a bake, after every
    /// host succeeded) every changed host's bake, then (after a breach) every revert in its order
    /// — a revert after a failed one never starts, so it is not waited for.
    pub fn ended(&self, r: &FleetRollout) -> bool {
        if !r.hosts.iter().all(|h| self.summaries.contains_key(h)) {
            return false;
        }
        let all_ok = self.summaries.values().all(|s| s.result == HostResult::Succeeded);
        if r.bake_secs.is_none() || !all_ok {
            return true;
        }
        match &self.revert {
            Some(rv) => {
                for h in &rv.order {
                    match self.reverted.get(h) {
                        None => return false,
                        Some(s) if s.result != HostResult::Succeeded => return true,
                        Some(_) => {}
                    }
                }
                true
            }
            None => revert_order(&self.summaries).iter().all(|h| self.bakes.get(h).is_some_and(|b| b.state != BakeState::Baking)),
        }
    }
}

impl FleetView {
    /// After every host's part ended: the hosts whose bake or revert the rollout still waits on
    /// (a watcher checks that their pdctld is alive: one that died will never write its end).
    pub fn waiting_on(&self, r: &FleetRollout) -> Vec<String> {
        if !r.hosts.iter().all(|h| self.summaries.contains_key(h)) || self.ended(r) {
            return Vec::new();
        }
        match &self.revert {
            Some(rv) => rv.order.iter().filter(|h| !self.reverted.contains_key(*h)).take(1).cloned().collect(),
            None => revert_order(&self.summaries).into_iter().filter(|h| self.bakes.get(h).is_none_or(|b| b.state == BakeState::Baking)).collect(),
        }
    }
}

/// The fleet summary from what etcd holds of the rollout (a host without a summary: not started).
pub fn fleet_summary(r: &FleetRollout, v: &FleetView) -> FleetSummary {
    use crate::events::Outcome;
    let hosts: BTreeMap<String, HostResult> =
        r.hosts.iter().map(|h| (h.clone(), v.summaries.get(h).map(|s| s.result).unwrap_or(HostResult::NotStarted))).collect();
    let ok = hosts.values().all(|v| *v == HostResult::Succeeded);
    let reverted: BTreeMap<String, HostResult> =
        v.revert.iter().flat_map(|rv| rv.order.iter()).map(|h| (h.clone(), v.reverted.get(h).map(|s| s.result).unwrap_or(HostResult::NotStarted))).collect();
    let result = match (&v.revert, ok) {
        (_, false) => Outcome::Failed,
        (Some(_), true) if reverted.values().all(|x| *x == HostResult::Succeeded) => Outcome::RolledBack,
        (Some(_), true) => Outcome::Failed,
        (None, true) => Outcome::Succeeded,
    };
    FleetSummary { id: r.id.clone(), result, hosts, bake: bake_sentence(&v.bakes, v.revert.as_ref()), reverted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Outcome, Summary};

    fn part(h: &str, result: HostResult, finished_at: u64) -> HostSummary {
        let summary = Summary {
            id: Some(format!("r-{h}")),
            result: Outcome::Succeeded,
            elapsed_ms: 1,
            units: vec!["d.service".into()],
            checked: Vec::new(),
            repairs: Default::default(),
            availability: None,
            failed: None,
        };
        HostSummary { host: h.into(), result, local_id: Some(format!("r-{h}")), summary: Some(summary), why: None, finished_at: Some(finished_at) }
    }

    fn rollout(bake: Option<u64>) -> FleetRollout {
        FleetRollout {
            id: "f1".into(),
            hosts: vec!["a".into(), "b".into()],
            allow_outage: false,
            by: "uid 0 on a".into(),
            reason: None,
            canary: None,
            created_at: 0,
            units: Vec::new(),
            repair_of: None,
            load_changes: true,
            bake_secs: bake,
            weights: None,
        }
    }

    fn bake(h: &str, state: BakeState) -> HostBake {
        HostBake { host: h.into(), state, units: vec!["d.service".into()], started_at: 0, ends_at: 60, figures: Vec::new(), why: None }
    }

    #[test]
    fn a_baking_rollout_ends_after_every_bake_and_after_a_breach_after_every_revert() {
        let r = rollout(Some(60));
        let mut v = FleetView::default();
        v.summaries.insert("a".into(), part("a", HostResult::Succeeded, 10));
        assert!(!v.ended(&r) && v.waiting_on(&r).is_empty(), "a part is still running: no bake yet");
        v.summaries.insert("b".into(), part("b", HostResult::Succeeded, 20));
        assert!(!v.ended(&r));
        assert_eq!(v.waiting_on(&r), vec!["b", "a"], "both bakes are waited on");
        v.bakes.insert("a".into(), bake("a", BakeState::Passed));
        v.bakes.insert("b".into(), bake("b", BakeState::Baking));
        assert_eq!(v.waiting_on(&r), vec!["b"]);
        v.bakes.insert("b".into(), bake("b", BakeState::Passed));
        assert!(v.ended(&r));
        assert_eq!(fleet_summary(&r, &v).result, Outcome::Succeeded);
        // A breach: the reverts, in order, then rolled back.
        v.revert = Some(FleetRevert { by: "b".into(), why: "b/d.service: error rate".into(), at: 30, order: vec!["b".into(), "a".into()] });
        assert!(!v.ended(&r));
        assert_eq!(v.waiting_on(&r), vec!["b"], "only the host whose turn it is");
        v.reverted.insert("b".into(), part("b", HostResult::Succeeded, 40));
        v.reverted.insert("a".into(), part("a", HostResult::Succeeded, 50));
        assert!(v.ended(&r));
        let s = fleet_summary(&r, &v);
        assert_eq!((s.result, s.bake.as_deref()), (Outcome::RolledBack, Some("breach on b: b/d.service: error rate")));
        // A failed revert ends it: the hosts after it are not reverted, and it is a failure.
        v.reverted.insert("b".into(), part("b", HostResult::Failed, 40));
        v.reverted.remove("a");
        assert!(v.ended(&r));
        let s = fleet_summary(&r, &v);
        assert_eq!((s.result, s.reverted.get("a")), (Outcome::Failed, Some(&HostResult::NotStarted)));
    }

    #[test]
    fn without_a_bake_or_after_a_failed_part_the_parts_are_the_end() {
        let mut v = FleetView::default();
        v.summaries.insert("a".into(), part("a", HostResult::Succeeded, 10));
        v.summaries.insert("b".into(), part("b", HostResult::Succeeded, 20));
        assert!(v.ended(&rollout(None)));
        v.summaries.insert("b".into(), part("b", HostResult::Failed, 20));
        assert!(v.ended(&rollout(Some(60))), "no bake after a failed part");
        assert_eq!(fleet_summary(&rollout(Some(60)), &v).result, Outcome::Failed);
    }
}
