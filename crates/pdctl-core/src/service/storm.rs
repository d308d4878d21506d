//! Restarts pdctl did not make, and the restart-storm breaker. A worker restarted by systemd
//! (`Restart=`: its `NRestarts` grew) or by anyone outside a rollout (a new InvocationID while no
//! rollout runs) is a self-restart. More than `restarts` of them within `within` — on this host,
//! or fleet-wide from every host's liveness key — is a storm: a rollout now would add restarts
//! to serving that is already falling over. A single host refuses a new rollout while it lasts
//! (`restart_storm`, exit 4); a fleet is paused until an operator unpauses it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[fleet.storm]`: the breaker's rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Storm {
    /// More self-restarts than this within `within` is a storm.
    pub restarts: u32,
    /// The window.
    pub within: Duration,
}

impl Default for Storm {
    fn default() -> Self {
        Storm { restarts: 5, within: Duration::from_secs(600) }
    }
}

/// One restart pdctl did not make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelfRestart {
    /// The unit.
    pub unit: String,
    /// When it was seen (seconds since the epoch).
    pub at: u64,
    /// `systemd` (its `Restart=`, NRestarts grew) or `outside a rollout` (a new run nobody
    /// announced).
    pub by: String,
}

/// What pdctld last saw of a unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Its InvocationID.
    pub invocation_id: String,
    /// Its NRestarts.
    pub n_restarts: u32,
}

/// The self-restarts between two looks at a unit (`rollout_running`: a rollout ran at some time
/// between the two looks, so pdctl may be the one that restarted it: a new run alone is not
/// counted). `NRestarts` counts every automatic restart
/// since the last manual start, so a jump of 3 is 3 restarts even between two looks; it goes back
/// to 0 on a manual start (pdctl's own), which is never counted.
pub fn between(before: &Seen, now: &Seen, rollout_running: bool) -> Vec<&'static str> {
    if now.n_restarts > before.n_restarts {
        return vec!["systemd"; (now.n_restarts - before.n_restarts) as usize];
    }
    if now.invocation_id != before.invocation_id && !now.invocation_id.is_empty() && !rollout_running && now.n_restarts <= before.n_restarts {
        return vec!["outside a rollout"];
    }
    Vec::new()
}

/// A storm: how many self-restarts fell within the window and by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Self-restarts within the window.
    pub count: u32,
    /// `(who, how many)`, most first (`who`: `unit` or `host/unit`).
    pub by: Vec<(String, u32)>,
}

impl Report {
    /// "gpu-node-b/sglang-decode.service ×4, gpu-node-a/sglang-prefill.service ×1".
    pub fn who(&self) -> String {
        self.by.iter().map(|(w, n)| format!("{w} ×{n}")).collect::<Vec<_>>().join(", ")
    }
}

/// Whether `events` (`(who, restart)`) make a storm under `rule` at `now` (seconds).
pub fn storm<'a>(events: impl IntoIterator<Item = (String, &'a SelfRestart)>, rule: &Storm, now: u64) -> Option<Report> {
    let since = now.saturating_sub(rule.within.as_secs());
    let mut by: BTreeMap<String, u32> = BTreeMap::new();
    for (who, e) in events {
        if e.at >= since {
            *by.entry(who).or_default() += 1;
        }
    }
    let count: u32 = by.values().sum();
    if count <= rule.restarts {
        return None;
    }
    let mut by: Vec<(String, u32)> = by.into_iter().collect();
    by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Some(Report { count, by })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(inv: &str, n: u32) -> Seen {
        Seen { invocation_id: inv.into(), n_restarts: n }
    }

    #[test]
    fn self_restarts_are_what_systemd_or_someone_else_did() {
        assert_eq!(between(&seen("a", 0), &seen("b", 3), true), vec!["systemd"; 3], "NRestarts counts each automatic restart");
        assert_eq!(between(&seen("a", 0), &seen("b", 0), false), vec!["outside a rollout"]);
        assert!(between(&seen("a", 0), &seen("b", 0), true).is_empty(), "a new run during a rollout may be pdctl's own");
        assert_eq!(between(&seen("a", 4), &seen("b", 0), false), vec!["outside a rollout"], "a manual restart by someone else resets NRestarts");
        assert!(between(&seen("a", 2), &seen("a", 2), false).is_empty());
    }

    #[test]
    fn more_than_the_limit_within_the_window_is_a_storm_naming_who() {
        let rule = Storm { restarts: 3, within: Duration::from_secs(60) };
        let e = |unit: &str, at: u64| SelfRestart { unit: unit.into(), at, by: "systemd".into() };
        let events = [e("d", 100), e("d", 110), e("d", 120), e("p", 130), e("p", 10)];
        let r = storm(events.iter().map(|x| (format!("b/{}", x.unit), x)), &rule, 150).expect("4 within 60 s, more than 3");
        assert_eq!((r.count, r.who()), (4, "b/d ×3, b/p ×1".to_string()));
        assert_eq!(storm(events.iter().map(|x| (x.unit.clone(), x)), &rule, 175), None, "the first one left the window");
    }
}
