//! The fleet bake and its revert (`[fleet] bake`): pure, no I/O.
//!
//! After the last host of a fleet rollout finished, each host that changed workers watches their
//! service figures for the bake time (against their own figures from before their drains, with
//! `[verify.slo]`'s tolerances) and writes how its bake went (`rollouts/<id>/hosts/<host>/bake`).
//! The first host to see a breach writes the revert (`rollouts/<id>/revert`, once: a
//! compare-and-swap on an absent key): every host that changed workers then restores their files
//! from before the rollout and restarts them through every gate and slot — one host after the
//! other, the last to have finished first ([`revert_order`]) — writing how its revert ended
//! (`rollouts/<id>/hosts/<host>/revert`). A revert that fails halts the ones after it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::keys::{prefix, rollout_hosts_prefix, HostResult, HostSummary};

/// Everything of fleet rollout `id` (hosts' lines, bakes, reverts, the revert request).
pub fn rollout_prefix(name: &str, id: &str) -> String {
    format!("{}rollouts/{id}/", prefix(name))
}

/// The key of `host`'s bake of fleet rollout `id`.
pub fn host_bake_key(name: &str, id: &str, host: &str) -> String {
    format!("{}{host}/bake", rollout_hosts_prefix(name, id))
}

/// The key of how `host`'s revert of fleet rollout `id` ended.
pub fn host_revert_key(name: &str, id: &str, host: &str) -> String {
    format!("{}{host}/revert", rollout_hosts_prefix(name, id))
}

/// The key of fleet rollout `id`'s revert request (written once, by the host that saw the breach).
pub fn revert_key(name: &str, id: &str) -> String {
    format!("{}revert", rollout_prefix(name, id))
}

/// Where a host's bake is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BakeState {
    /// Watching its changed workers until `ends_at`.
    Baking,
    /// Every changed worker's figures stayed within their limits for the whole bake.
    Passed,
    /// A figure was over its limit: this host asked for the revert.
    Breach,
    /// Too little traffic (or no baseline) to judge: said as such, never a pass.
    NotJudged,
    /// Stopped before its end: another host's breach asked for the revert.
    Cancelled,
}

impl BakeState {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            BakeState::Baking => "baking",
            BakeState::Passed => "passed",
            BakeState::Breach => "breach",
            BakeState::NotJudged => "not_judged",
            BakeState::Cancelled => "cancelled",
        }
    }
}

/// One host's bake (`rollouts/<id>/hosts/<host>/bake`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostBake {
    /// The host.
    pub host: String,
    /// Where it is.
    pub state: BakeState,
    /// The workers watched: those its part restarted.
    pub units: Vec<String>,
    /// When the bake began (seconds since the epoch).
    pub started_at: u64,
    /// When it ends (or ended).
    pub ends_at: u64,
    /// Each worker's verdict, one sentence each ("sglang-decode.service: passed: …").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub figures: Vec<String>,
    /// Why it is not a pass: the breach's figure, what could not be judged, or what cancelled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// A fleet rollout's revert request (`rollouts/<id>/revert`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetRevert {
    /// The host whose bake saw the breach.
    pub by: String,
    /// The breach: `host/unit` and the figure with both values and sample sizes.
    pub why: String,
    /// When (seconds since the epoch).
    pub at: u64,
    /// The hosts to revert, in order (the last to have finished first).
    pub order: Vec<String>,
}

/// The hosts a revert puts back, in order: every host whose part succeeded having restarted
/// workers, the last to have finished first (ties by name, for one order on every host).
pub fn revert_order(summaries: &BTreeMap<String, HostSummary>) -> Vec<String> {
    let mut changed: Vec<(&String, u64)> = summaries
        .iter()
        .filter(|(_, s)| s.result == HostResult::Succeeded && s.summary.as_ref().is_some_and(|x| !x.units.is_empty()))
        .map(|(h, s)| (h, s.finished_at.unwrap_or(0)))
        .collect();
    changed.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    changed.into_iter().map(|(h, _)| h.clone()).collect()
}

/// Whether a host may start its revert ([`revert_turn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevertTurn {
    /// Every host before it in the order has reverted successfully: now.
    Now,
    /// One of them has not ended yet.
    Wait,
    /// `failed`, before it, did not revert successfully: the revert halts here (this host keeps
    /// the rollout's change).
    Never {
        /// The first host before it whose revert did not succeed.
        failed: String,
    },
}

/// Whether `host` may start its revert now, the hosts before it in `order` having reverted as
/// `reverted` says.
pub fn revert_turn(order: &[String], host: &str, reverted: &BTreeMap<String, HostSummary>) -> RevertTurn {
    for h in order.iter().take_while(|h| h.as_str() != host) {
        match reverted.get(h) {
            None => return RevertTurn::Wait,
            Some(s) if s.result == HostResult::Succeeded => {}
            Some(_) => return RevertTurn::Never { failed: h.clone() },
        }
    }
    RevertTurn::Now
}

/// The bake's part of the fleet summary: one sentence (`None`: the rollout had no bake, or it
/// did not run because a host did not succeed).
pub fn bake_sentence(bakes: &BTreeMap<String, HostBake>, revert: Option<&FleetRevert>) -> Option<String> {
    if let Some(r) = revert {
        return Some(format!("breach on {}: {}", r.by, r.why));
    }
    if bakes.is_empty() {
        return None;
    }
    let not_judged: Vec<String> =
        bakes.values().filter(|b| b.state == BakeState::NotJudged).map(|b| format!("{}: {}", b.host, b.why.as_deref().unwrap_or("not judged"))).collect();
    let units: usize = bakes.values().map(|b| b.units.len()).sum();
    let secs = bakes.values().map(|b| b.ends_at.saturating_sub(b.started_at)).max().unwrap_or(0);
    Some(if not_judged.is_empty() {
        format!("passed: {units} changed worker(s) on {} host(s) watched for {secs}s", bakes.len())
    } else {
        format!("not judged on {} host(s) ({}): not a pass", not_judged.len(), not_judged.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Outcome, Summary};

    fn host(h: &str, result: HostResult, units: &[&str], finished_at: u64) -> (String, HostSummary) {
        let summary = Summary {
            id: Some(format!("r-{h}")),
            result: if result == HostResult::Succeeded { Outcome::Succeeded } else { Outcome::Failed },
            elapsed_ms: 1,
            units: units.iter().map(|u| u.to_string()).collect(),
            checked: Vec::new(),
            repairs: Default::default(),
            availability: None,
            failed: None,
        };
        (h.into(), HostSummary { host: h.into(), result, local_id: Some(format!("r-{h}")), summary: Some(summary), why: None, finished_at: Some(finished_at) })
    }

    #[test]
    fn the_last_host_to_finish_is_reverted_first_and_hosts_that_changed_nothing_are_not() {
        let s: BTreeMap<String, HostSummary> = [
            host("a", HostResult::Succeeded, &["p", "d"], 100),
            host("b", HostResult::Succeeded, &["p", "d"], 300),
            host("c", HostResult::Succeeded, &["p"], 200),
            host("d", HostResult::Succeeded, &[], 400),
            host("e", HostResult::Failed, &["p"], 500),
        ]
        .into();
        assert_eq!(revert_order(&s), vec!["b", "c", "a"]);
    }

    #[test]
    fn a_host_reverts_only_after_every_host_before_it_reverted_and_never_after_a_failed_one() {
        let order: Vec<String> = ["c", "b", "a"].iter().map(|h| h.to_string()).collect();
        let mut done = BTreeMap::new();
        assert_eq!(revert_turn(&order, "c", &done), RevertTurn::Now, "the first goes at once");
        assert_eq!(revert_turn(&order, "a", &done), RevertTurn::Wait);
        done.extend([host("c", HostResult::Succeeded, &["p"], 1)]);
        assert_eq!(revert_turn(&order, "b", &done), RevertTurn::Now);
        assert_eq!(revert_turn(&order, "a", &done), RevertTurn::Wait, "b has not ended");
        done.extend([host("b", HostResult::Failed, &["p"], 2)]);
        assert_eq!(revert_turn(&order, "a", &done), RevertTurn::Never { failed: "b".into() }, "no revert after a failed one");
    }

    #[test]
    fn the_bake_sentence_says_a_breach_a_pass_and_not_judged_as_such() {
        let bake = |h: &str, state: BakeState, why: Option<&str>| {
            (
                h.to_string(),
                HostBake {
                    host: h.into(),
                    state,
                    units: vec!["p".into(), "d".into()],
                    started_at: 10,
                    ends_at: 70,
                    figures: Vec::new(),
                    why: why.map(String::from),
                },
            )
        };
        let passed: BTreeMap<_, _> = [bake("a", BakeState::Passed, None), bake("b", BakeState::Passed, None)].into();
        assert_eq!(bake_sentence(&passed, None).as_deref(), Some("passed: 4 changed worker(s) on 2 host(s) watched for 60s"));
        let thin: BTreeMap<_, _> = [bake("a", BakeState::Passed, None), bake("b", BakeState::NotJudged, Some("p: 3 requests"))].into();
        assert_eq!(bake_sentence(&thin, None).as_deref(), Some("not judged on 1 host(s) (b: p: 3 requests): not a pass"));
        let r = FleetRevert { by: "b".into(), why: "b/d: error rate 30.0 % vs 0.0 %".into(), at: 1, order: vec!["b".into(), "a".into()] };
        assert_eq!(bake_sentence(&passed, Some(&r)).as_deref(), Some("breach on b: b/d: error rate 30.0 % vs 0.0 %"));
        assert_eq!(bake_sentence(&BTreeMap::new(), None), None);
    }
}
