//! What a rollout *is* at any moment: a [`RolloutState`] held by a [`Lifecycle`], changed only
//! through methods that check the previous state and stamp the change (as Fedora CoreOS's
//! zincati does with its update agent's state).
//!
//! ```text
//!                    enter(unit, step)                       finish(outcome)
//!   (new) ──► Running{unit, step} ──┬──► Succeeded    every unit passed every gate
//!                  ▲   │            ├──► Failed       a gate failed; halted (Cause)
//!                  └───┘            ├──► RolledBack   a gate failed; the unit's last good
//!                                   │                 revision was restored and verified
//!                                   ├──► Aborted      an operator asked; between units
//!                                   └──► Interrupted  pdctld stopped while it ran (found at
//!                                             │       its next start); nothing resumes by itself
//!                                             └──► Resumed      resume(by): a new rollout continues it (once)
//! ```

use serde::{Deserialize, Serialize};

pub use crate::clock::now;
use crate::events::{Outcome, Step, Summary};

/// Where a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    /// In progress (at [`Lifecycle::position`]).
    Running,
    /// Every unit passed every gate.
    Succeeded,
    /// A gate failed; the rollout halted; nothing after the failed unit was touched.
    Failed,
    /// A gate failed and the unit was restored to its last good revision, which passed.
    RolledBack,
    /// Stopped by an operator between units (every unit left verified).
    Aborted,
    /// pdctld stopped while it ran; reported at its next start, never resumed by itself.
    Interrupted,
    /// An interrupted rollout that a later rollout continues (it can be resumed once).
    Resumed,
}

impl RolloutState {
    /// The snake_case name (JSON, the metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Succeeded => "succeeded",
            RolloutState::Failed => "failed",
            RolloutState::RolledBack => "rolled_back",
            RolloutState::Aborted => "aborted",
            RolloutState::Interrupted => "interrupted",
            RolloutState::Resumed => "resumed",
        }
    }

    /// The state an engine outcome ends in.
    pub fn of(outcome: Outcome) -> RolloutState {
        match outcome {
            Outcome::Succeeded => RolloutState::Succeeded,
            Outcome::Failed => RolloutState::Failed,
            Outcome::RolledBack => RolloutState::RolledBack,
            Outcome::Aborted => RolloutState::Aborted,
        }
    }

    /// No further transition except [`Lifecycle::resume`] from `Interrupted`.
    pub fn is_final(self) -> bool {
        !matches!(self, RolloutState::Running)
    }
}

/// Unit and step of a running (or interrupted) rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Position {
    /// The unit (or the router pseudo-unit in preflight).
    pub unit: String,
    /// The step.
    pub step: Step,
}

/// A transition that the state machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a rollout cannot go from {from} to {to}")]
pub struct TransitionError {
    /// The state it was in.
    pub from: &'static str,
    /// The state asked for.
    pub to: &'static str,
}

/// A rollout's state, where it is, and when that last changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    state: RolloutState,
    #[serde(default)]
    position: Option<Position>,
    changed_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resumed_by: Option<String>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle::new()
    }
}

impl Lifecycle {
    /// A new rollout: running, before its first step.
    pub fn new() -> Lifecycle {
        Lifecycle { state: RolloutState::Running, position: None, changed_at: now(), resumed_by: None }
    }

    /// The state.
    pub fn state(&self) -> RolloutState {
        self.state
    }

    /// The last unit and step entered (kept after an interruption: where it stopped).
    pub fn position(&self) -> Option<&Position> {
        self.position.as_ref()
    }

    /// When the state or position last changed (seconds since the epoch).
    pub fn changed_at(&self) -> u64 {
        self.changed_at
    }

    /// The rollout that resumed this one.
    pub fn resumed_by(&self) -> Option<&str> {
        self.resumed_by.as_deref()
    }

    fn to(&mut self, allowed: bool, next: RolloutState) -> Result<(), TransitionError> {
        if !allowed {
            return Err(TransitionError { from: self.state.as_str(), to: next.as_str() });
        }
        self.state = next;
        self.changed_at = now();
        Ok(())
    }

    /// A step started (only while running).
    pub fn enter(&mut self, unit: &str, step: Step) -> Result<(), TransitionError> {
        self.to(self.state == RolloutState::Running, RolloutState::Running)?;
        self.position = Some(Position { unit: unit.to_string(), step });
        Ok(())
    }

    /// The engine finished with `outcome` (only while running).
    pub fn finish(&mut self, outcome: Outcome) -> Result<(), TransitionError> {
        self.to(self.state == RolloutState::Running, RolloutState::of(outcome))
    }

    /// The engine returned `summary` (only while running): the rollout is finished with its
    /// outcome — unless fleet coordination was lost, where the unit in progress was finished and
    /// verified and the next one never took its slot: then it is interrupted there, to be
    /// resumed once etcd answers (`pdctl rollout resume ID`).
    pub fn conclude(&mut self, summary: &Summary) -> Result<(), TransitionError> {
        if summary.failed.as_ref().is_some_and(|f| f.cause_code == crate::cause::FLEET_LOST) {
            self.interrupt()
        } else {
            self.finish(summary.result)
        }
    }

    /// pdctld found this rollout running at its start (only while running).
    pub fn interrupt(&mut self) -> Result<(), TransitionError> {
        self.to(self.state == RolloutState::Running, RolloutState::Interrupted)
    }

    /// Rollout `by` continues this interrupted one (once).
    pub fn resume(&mut self, by: &str) -> Result<(), TransitionError> {
        self.to(self.state == RolloutState::Interrupted, RolloutState::Resumed)?;
        self.resumed_by = Some(by.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_that_lost_the_fleet_is_interrupted_not_failed() {
        let summary = |code: Option<&str>| -> Summary {
            let failed = code.map(|c| {
                serde_json::from_value(
                    serde_json::json!({"unit": "p.service", "step": "slot", "cause": "x", "cause_code": c, "kind": "access", "last_lines": []}),
                )
                .expect("a failure")
            });
            Summary {
                id: None,
                result: Outcome::Failed,
                elapsed_ms: 0,
                units: vec![],
                checked: vec![],
                repairs: Default::default(),
                failed,
                availability: None,
            }
        };
        let mut l = Lifecycle::new();
        l.conclude(&summary(Some(crate::cause::FLEET_LOST))).unwrap();
        assert_eq!(l.state(), RolloutState::Interrupted);
        let mut l = Lifecycle::new();
        l.conclude(&summary(Some("health_timeout"))).unwrap();
        assert_eq!(l.state(), RolloutState::Failed);
    }

    #[test]
    fn transitions_check_the_previous_state() {
        let mut l = Lifecycle::new();
        l.enter("p.service", Step::Ready).unwrap();
        assert_eq!(l.position().unwrap().step, Step::Ready);
        l.interrupt().unwrap();
        assert_eq!(l.state(), RolloutState::Interrupted);
        assert_eq!(l.position().unwrap().unit, "p.service", "where it stopped is kept");
        assert!(l.enter("d.service", Step::Drain).is_err(), "an interrupted rollout runs no step");
        assert!(l.finish(Outcome::Succeeded).is_err());
        l.resume("r2").unwrap();
        let e = l.resume("r3").unwrap_err();
        assert_eq!((e.from, e.to), ("resumed", "resumed"), "resumed once");
        let mut done = Lifecycle::new();
        done.finish(Outcome::RolledBack).unwrap();
        assert_eq!(done.state().as_str(), "rolled_back");
        assert!(done.interrupt().is_err(), "a finished rollout is never reported interrupted");
    }
}
