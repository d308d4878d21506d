//! What follows a failure: a pure function of the failure and the settings, apart from the code
//! that runs the rollout (as kube-rs keeps `error_policy` apart from `reconcile`). The dispatch
//! ([`crate::engine::machine::Engine::execute`]) asks it once a rollout's work ended failed, and the roll
//! layer asks it before re-admitting a failed unit (a unit a rollback restores next stays out).

use crate::config::{OnFailure, Rollout, WeightsFallback};
use crate::events::Step;
use crate::names::{FLEET, ROUTER};

/// The failure, as the policy sees it: the step and whose it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) struct Failed<'a> {
    /// The step that failed.
    pub(in crate::engine) step: Step,
    /// The unit it failed on (or [`ROUTER`], [`FLEET`]).
    pub(in crate::engine) unit: &'a str,
}

impl Failed<'_> {
    /// A worker's own failure (not the gateway's or the fleet's).
    fn of_a_worker(&self) -> bool {
        self.unit != ROUTER && self.unit != FLEET
    }

    /// Refused before anything restarted: a slot never granted, a preflight that said no. A
    /// refusal touches nothing.
    fn refused(&self) -> bool {
        matches!(self.step, Step::Slot | Step::Preflight)
    }
}

/// After a rollout that may have changed files failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) struct AfterRestart {
    /// The failed unit's current files are kept on record as a change that failed.
    pub(in crate::engine) quarantine: bool,
    /// Whether its last good revision is put back.
    pub(in crate::engine) rollback: Rollback,
}

/// Whether a failed unit's last good revision is restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum Rollback {
    /// `on_failure = "halt"`, or not a worker's failure.
    No,
    /// `on_failure = "rollback"`, but the unit was refused before anything restarted: no file
    /// moves (said in the notes).
    Refused,
    /// Restored and verified through the same gates.
    Yes,
}

/// The policy after a failed restart, revert or host resume (`revisions`: the rollout keeps
/// revisions, so there is something to quarantine and roll back to).
pub(in crate::engine) fn after_restart(f: Failed<'_>, ro: &Rollout, revisions: bool) -> AfterRestart {
    if !revisions {
        return AfterRestart { quarantine: false, rollback: Rollback::No };
    }
    let rollback = match (ro.on_failure, f.of_a_worker(), f.refused()) {
        (OnFailure::Rollback, true, true) => Rollback::Refused,
        (OnFailure::Rollback, true, false) => Rollback::Yes,
        _ => Rollback::No,
    };
    AfterRestart { quarantine: f.step != Step::Preflight && f.of_a_worker(), rollback }
}

/// After a config rollout that loaded new weights in place failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum AfterInPlace {
    /// Rolled out by restarting instead (`weights_fallback = "restart"`); then
    /// [`after_restart`] judges that restart.
    RestartInstead,
    /// The failed unit's change kept on record as failed (the weights step put back what each
    /// worker served).
    Quarantine,
    /// Refused before anything loaded, or the fleet's failure: nothing to keep.
    Nothing,
}

/// The policy after a failed in-place load of a config rollout.
pub(in crate::engine) fn after_in_place(f: Failed<'_>, ro: &Rollout) -> AfterInPlace {
    match (f.step, ro.weights_fallback) {
        (Step::Preflight, _) => AfterInPlace::Nothing,
        (_, WeightsFallback::Restart) => AfterInPlace::RestartInstead,
        _ if f.unit != FLEET => AfterInPlace::Quarantine,
        _ => AfterInPlace::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ro(on_failure: OnFailure, weights_fallback: WeightsFallback) -> Rollout {
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n".to_string();
        let mut s = crate::config::load_texts(&[(std::path::PathBuf::from("t.toml"), text)]).expect("config");
        s.rollout.on_failure = on_failure;
        s.rollout.weights_fallback = weights_fallback;
        s.rollout
    }

    const W: &str = "sglang-decode.service";

    #[test]
    fn a_refusal_touches_nothing_and_only_a_workers_failure_is_rolled_back() {
        let rb = ro(OnFailure::Rollback, WeightsFallback::Revert);
        let at = |step, unit| after_restart(Failed { step, unit }, &rb, true);
        assert_eq!(at(Step::Ready, W), AfterRestart { quarantine: true, rollback: Rollback::Yes });
        assert_eq!(at(Step::Soak, W), AfterRestart { quarantine: true, rollback: Rollback::Yes });
        assert_eq!(at(Step::Slot, W), AfterRestart { quarantine: true, rollback: Rollback::Refused }, "a slot never granted");
        assert_eq!(at(Step::Preflight, W), AfterRestart { quarantine: false, rollback: Rollback::Refused });
        assert_eq!(at(Step::Router, ROUTER), AfterRestart { quarantine: false, rollback: Rollback::No }, "the gateway's");
        assert_eq!(at(Step::Switch, FLEET), AfterRestart { quarantine: false, rollback: Rollback::No }, "the fleet's");
        let halt = ro(OnFailure::Halt, WeightsFallback::Revert);
        assert_eq!(after_restart(Failed { step: Step::Ready, unit: W }, &halt, true), AfterRestart { quarantine: true, rollback: Rollback::No });
        assert_eq!(
            after_restart(Failed { step: Step::Ready, unit: W }, &rb, false),
            AfterRestart { quarantine: false, rollback: Rollback::No },
            "no revisions kept"
        );
    }

    #[test]
    fn a_failed_load_in_place_restarts_instead_only_when_asked() {
        let restart = ro(OnFailure::Halt, WeightsFallback::Restart);
        let revert = ro(OnFailure::Halt, WeightsFallback::Revert);
        assert_eq!(after_in_place(Failed { step: Step::Weights, unit: W }, &restart), AfterInPlace::RestartInstead);
        assert_eq!(after_in_place(Failed { step: Step::Weights, unit: FLEET }, &restart), AfterInPlace::RestartInstead);
        assert_eq!(after_in_place(Failed { step: Step::Preflight, unit: W }, &restart), AfterInPlace::Nothing, "refused: nothing loaded");
        assert_eq!(after_in_place(Failed { step: Step::Weights, unit: W }, &revert), AfterInPlace::Quarantine);
        assert_eq!(after_in_place(Failed { step: Step::Weights, unit: FLEET }, &revert), AfterInPlace::Nothing);
    }
}
