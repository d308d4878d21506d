//! What a config rollout (`rollout apply`) rolls out: the stale workers (every one with `all`),
//! never a change that already failed until its files change; whether systemd must reload first —
//! a pure decision over what pdctld found stale. pdctld asks, reloads and plans; this decides.

use std::collections::BTreeMap;

use crate::engine::Staleness;

/// The workers to roll, or why there is nothing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOrder {
    /// Roll these.
    Run {
        /// The workers, in config order.
        units: Vec<String>,
        /// A changed unit file or drop-in among them: reload systemd before the restarts
        /// (idempotent and cheap, so whenever a worker is rolled for a change).
        reload: bool,
        /// What changed, per worker (all stale workers, for the record).
        reasons: BTreeMap<String, Vec<String>>,
        /// Quarantined changes held back, each said (also logged).
        held: Vec<String>,
    },
    /// Nothing to roll.
    Nothing {
        /// Why.
        why: String,
        /// Quarantined changes held back, each said (also logged).
        held: Vec<String>,
    },
}

/// The apply of `stale` (every configured worker, stale or not); `all` rolls the fresh ones too.
pub fn order(stale: Vec<Staleness>, all: bool) -> ApplyOrder {
    // A change that already failed is not rolled out again until its files change.
    let held: Vec<String> =
        stale.iter().filter_map(|w| w.quarantined.as_ref().map(|q| format!("{} (its change failed in {}: {})", w.unit, q.rollout_id, q.cause))).collect();
    let units = Staleness::to_roll(&stale, all);
    if units.is_empty() {
        let why = if held.is_empty() {
            "no worker is stale; nothing to do".to_string()
        } else {
            format!("nothing to do: quarantined, not rolled out again: {}", held.join("; "))
        };
        return ApplyOrder::Nothing { why, held };
    }
    let reload = stale.iter().any(|w| !w.reasons.is_empty() && units.contains(&w.unit));
    let reasons = stale.into_iter().map(|w| (w.unit, w.reasons)).collect();
    ApplyOrder::Run { units, reload, reasons, held }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::revisions::Quarantine;

    fn w(unit: &str, reasons: &[&str], quarantined: bool) -> Staleness {
        let quarantined =
            quarantined.then(|| Quarantine { unit: unit.into(), fingerprint: "f".into(), rollout_id: "r9".into(), cause: "ready_timeout".into(), at: 1 });
        Staleness { unit: unit.into(), reasons: reasons.iter().map(|s| s.to_string()).collect(), quarantined }
    }

    #[test]
    fn rolls_the_stale_workers_reloading_first_and_holds_a_quarantined_change() {
        let ApplyOrder::Run { units, reload, reasons, held } = order(vec![w("p", &["drop-in new"], false), w("d", &[], false), w("x", &["env"], true)], false)
        else {
            panic!("something to roll")
        };
        assert_eq!((units, reload), (vec!["p".to_string()], true));
        assert_eq!(reasons.len(), 3, "every worker's reasons are kept for the record");
        assert_eq!(held, ["x (its change failed in r9: ready_timeout)"]);
        // `--all` with nothing changed: every worker, no reload.
        let ApplyOrder::Run { units, reload, .. } = order(vec![w("p", &[], false), w("d", &[], false)], true) else { panic!("all") };
        assert_eq!((units.len(), reload), (2, false));
    }

    #[test]
    fn nothing_stale_says_so_and_names_what_is_held() {
        assert_eq!(order(vec![w("p", &[], false)], false), ApplyOrder::Nothing { why: "no worker is stale; nothing to do".into(), held: vec![] });
        let ApplyOrder::Nothing { why, held } = order(vec![w("p", &["x"], true)], false) else { panic!("nothing") };
        assert_eq!(held.len(), 1);
        assert!(why.starts_with("nothing to do: quarantined, not rolled out again: p (its change failed in r9"), "{why}");
    }
}
