//! Events and the summary: the `--json` contract (one JSON object per line; the last one is the
//! summary with `result`). Part of the contract (re-exported by `api`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cause::Cause;
pub use crate::cause::FailureKind;

/// The gates of one restart, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    /// The unit exists, config is current, metrics enabled, GPUs disjoint, router reachable.
    Preflight,
    /// Fleet only: a slot of the role's fleet-wide semaphore in etcd (held from drain until the
    /// worker is verified).
    Slot,
    /// Taken out of the router; in-flight requests finished (bounded).
    Drain,
    /// RestartUnit and our job's result.
    Restart,
    /// The ready line of this run in the journal.
    Ready,
    /// `/health` answers 200.
    Health,
    /// PD requests sent straight to each pair the restarted worker serves in: a prefill with
    /// each decode, a decode with each prefill; a stale pairing is found (and repaired) here,
    /// before the router's smoke request could fail on it.
    Pair,
    /// The router admits the worker: healthy, breaker not open, a request gets through.
    Router,
    /// KV-cache gauges exposed and sane.
    Metrics,
    /// After a decode restart: the prefills release the KV they held for its rooms.
    #[serde(rename = "stranded_kv")]
    StrandedKv,
    /// The unit stays up (same run) for `min_healthy`.
    Soak,
    /// A drain pdctl made is undone: the worker is re-admitted to the router once it serves
    /// (after a failed gate, or when pdctld starts or stops with drains in its ledger).
    Reconcile,
    /// `on_failure = "rollback"`: the failed unit's last good revision is restored (files, a
    /// reload); its own gates follow as the unit's usual steps. In a weights rollout: the
    /// previous weights loaded again.
    Rollback,
    /// `pdctl rollout weights`: the worker paused, its new weights loaded and verified
    /// (`weight_version`, `model_path`), and continued — without a restart.
    Weights,
    /// A coherent fleet switch: this host's phase written to etcd and the wait for the other
    /// hosts' (`verified`, `out`, `in`, `back`; unit `fleet`).
    Switch,
    /// Host maintenance (`pdctl host drain`): StopUnit and our job's result — SGLang's own
    /// SIGTERM drain; the unit stays down until the host's resume.
    Stop,
    /// Host maintenance (`pdctl host resume`): StartUnit for a worker the reboot did not start.
    Start,
    /// Before the first worker stops (or pauses for an in-place load): the files of a new
    /// `--model-path` read into the page cache, so the start (or the load) reads them from
    /// memory. Never fails a rollout: skipped where the checkpoint does not fit in memory.
    Prefetch,
    /// `pdctl role set`: the unit's role drop-in written (a revision like any change), then the
    /// drained server switched at run time (`POST /pd_role_switch`), or left to the restart
    /// that follows.
    Role,
}

impl Step {
    /// A worker's steps, in the order the runbook gives them: a slot of its role's fleet budget,
    /// out of the gateway, restarted (or, for host maintenance, stopped for the reboot and
    /// started after it), its ready line of this run, `/health`, its PD pairs probed directly
    /// (still out of the gateway: a stale pair is found and repaired before clients reach it),
    /// back in the gateway, its KV metrics, the KV its prefills held for its old process
    /// released (a decode), and the soak; a change of role (`pdctl role set`) between the drain
    /// and the restart. Written here once: every sequence the engine runs on a
    /// worker is a filter of it (`pdctl_core::engine::runbook`).
    pub const RUNBOOK: [Step; 13] = [
        Step::Slot,
        Step::Drain,
        Step::Role,
        Step::Restart,
        Step::Stop,
        Step::Start,
        Step::Ready,
        Step::Health,
        Step::Pair,
        Step::Router,
        Step::Metrics,
        Step::StrandedKv,
        Step::Soak,
    ];

    /// The steps of a rollout that are not a worker's: preflight (before the first worker),
    /// then those around the runbook — a drain undone, a rollback, a load of new weights, a
    /// fleet switch's phase, new weights read before anyone stops.
    pub const OF_THE_ROLLOUT: [Step; 6] = [Step::Preflight, Step::Reconcile, Step::Rollback, Step::Weights, Step::Switch, Step::Prefetch];

    /// Every step: preflight, the runbook in its order, then the rollout's own others.
    pub const ALL: [Step; 19] = {
        let mut all = [Step::Preflight; 19];
        let mut i = 0;
        while i < Step::RUNBOOK.len() {
            all[1 + i] = Step::RUNBOOK[i];
            i += 1;
        }
        let mut j = 1;
        while j < Step::OF_THE_ROLLOUT.len() {
            all[Step::RUNBOOK.len() + j] = Step::OF_THE_ROLLOUT[j];
            j += 1;
        }
        all
    };

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Preflight => "preflight",
            Step::Slot => "slot",
            Step::Drain => "drain",
            Step::Restart => "restart",
            Step::Ready => "ready",
            Step::Health => "health",
            Step::Pair => "pair",
            Step::Router => "router",
            Step::Metrics => "metrics",
            Step::StrandedKv => "stranded_kv",
            Step::Soak => "soak",
            Step::Reconcile => "reconcile",
            Step::Rollback => "rollback",
            Step::Weights => "weights",
            Step::Switch => "switch",
            Step::Stop => "stop",
            Step::Start => "start",
            Step::Prefetch => "prefetch",
            Step::Role => "role",
        }
    }
}

/// A step's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The step began.
    Started,
    /// It passed.
    Passed,
    /// It failed (the rollout halts).
    Failed,
    /// It was not needed or not configured.
    Skipped,
}

/// One step transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The unit (or [`crate::names::ROUTER`] for router-wide checks).
    pub unit: String,
    /// The step.
    pub step: Step,
    /// Its status.
    pub status: Status,
    /// Time since the step started.
    pub elapsed_ms: u64,
    /// Wall-clock time of the transition (RFC 3339, UTC, milliseconds).
    pub at: String,
    /// Step-specific facts (what was measured, why it failed).
    pub detail: Value,
    /// The restarted prefill whose stale pairing this decode's restart repairs (absent for the
    /// rollout's own units).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_of: Option<String>,
}

/// How a rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every unit passed every gate.
    Succeeded,
    /// A gate failed; the rollout halted.
    Failed,
    /// A gate failed and the unit was rolled back.
    RolledBack,
    /// Stopped by an operator.
    Aborted,
}

/// The failed gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    /// The unit.
    pub unit: String,
    /// The step.
    pub step: Step,
    /// One sentence.
    pub cause: String,
    /// The cause's stable code ([`Cause::code`]).
    pub cause_code: String,
    /// Kind (exit code).
    pub kind: FailureKind,
    /// The unit's last log lines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_lines: Vec<String>,
    /// What to do next ([`Cause::next_step`]): commands between backticks.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub next: String,
}

impl Failure {
    /// The failure of `unit` at `step` with `cause`.
    pub fn new(unit: &str, step: Step, cause: &Cause, last_lines: Vec<String>) -> Failure {
        Failure {
            unit: unit.to_string(),
            step,
            // Kept in records, the API and etcd, printed on terminals: no secrets, no escapes (a
            // cause quotes workers' answers: a 5xx body, a weight version).
            cause: crate::redact::line(&cause.sentence()),
            cause_code: cause.code().to_string(),
            kind: cause.kind(),
            last_lines: last_lines.iter().map(|l| crate::redact::line(l)).collect(),
            next: cause.next_step(unit),
        }
    }
}

/// The last line of a rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// pdctld's rollout id (absent for the CLI's own dry run and check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The result.
    pub result: Outcome,
    /// Total time.
    pub elapsed_ms: u64,
    /// Units restarted and verified, in order (empty for `check`, which restarts nothing).
    pub units: Vec<String>,
    /// `check`: the units that passed every gate checked, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checked: Vec<String>,
    /// Units restarted to repair a stale pairing (each in `units` too) → the prefill whose
    /// restart needed it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub repairs: std::collections::BTreeMap<String, String>,
    /// The failed gate, unless it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Failure>,
    /// What clients saw, from the availability probe through the router (absent when off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability: Option<crate::availability::Availability>,
}

impl Summary {
    /// The summary of what restarts nothing (a dry run, a refusal before anything was touched):
    /// succeeded unless `failed`.
    pub fn untouched(elapsed_ms: u64, failed: Option<Failure>) -> Summary {
        Summary {
            id: None,
            result: if failed.is_some() { Outcome::Failed } else { Outcome::Succeeded },
            elapsed_ms,
            units: Vec::new(),
            checked: Vec::new(),
            repairs: Default::default(),
            failed,
            availability: None,
        }
    }
}

/// Where events go.
pub type Sink = tokio::sync::mpsc::UnboundedSender<Event>;

// The exit code of a rollout is decided here, where its outcome is; the table stays a leaf.
impl crate::exit::Exit {
    /// The exit code of a finished rollout.
    pub fn of(summary: &Summary) -> crate::exit::Exit {
        match (&summary.result, &summary.failed) {
            (Outcome::Succeeded, _) => crate::exit::Exit::Ok,
            (Outcome::Aborted, _) => crate::exit::Exit::Aborted,
            (Outcome::Failed | Outcome::RolledBack, Some(f)) => f.kind.exit(),
            (Outcome::Failed | Outcome::RolledBack, None) => crate::exit::Exit::GateFailed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_once_preflight_then_the_runbook_in_its_order_then_the_rollouts_own() {
        let names: std::collections::BTreeSet<&str> = Step::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names.len(), Step::ALL.len(), "no step twice");
        // Every variant is in ALL: a step added to the enum and not to a list fails here.
        for s in Step::ALL {
            let listed = match s {
                Step::Preflight | Step::Reconcile | Step::Rollback | Step::Weights | Step::Switch | Step::Prefetch => Step::OF_THE_ROLLOUT.contains(&s),
                Step::Slot
                | Step::Drain
                | Step::Role
                | Step::Restart
                | Step::Stop
                | Step::Start
                | Step::Ready
                | Step::Health
                | Step::Pair
                | Step::Router
                | Step::Metrics
                | Step::StrandedKv
                | Step::Soak => Step::RUNBOOK.contains(&s),
            };
            assert!(listed, "{s:?}");
        }
        assert_eq!(Step::ALL[0], Step::Preflight);
        assert_eq!(&Step::ALL[1..=Step::RUNBOOK.len()], &Step::RUNBOOK[..], "the runbook's order");
        assert_eq!(&Step::ALL[Step::RUNBOOK.len() + 1..], &Step::OF_THE_ROLLOUT[1..]);
    }
}
