//! Events and the summary: the `--json` contract (one JSON object per line; the last one is the
//! summary with `result`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The gates of one restart, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    /// The unit exists, config is current, metrics enabled, GPUs disjoint, router reachable.
    Preflight,
    /// Taken out of the router; in-flight requests finished (bounded).
    Drain,
    /// RestartUnit and our job's result.
    Restart,
    /// The ready line of this run in the journal.
    Ready,
    /// `/health` answers 200.
    Health,
    /// The router admits the worker: healthy, breaker not open, a request gets through.
    Router,
    /// KV-cache gauges exposed and sane.
    Metrics,
    /// The unit stays up (same run) for `min_healthy`.
    Soak,
}

impl Step {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Preflight => "preflight",
            Step::Drain => "drain",
            Step::Restart => "restart",
            Step::Ready => "ready",
            Step::Health => "health",
            Step::Router => "router",
            Step::Metrics => "metrics",
            Step::Soak => "soak",
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
pub struct Event {
    /// The unit (or `router` for router-wide checks).
    pub unit: String,
    /// The step.
    pub step: Step,
    /// Its status.
    pub status: Status,
    /// Time since the step started.
    pub elapsed_ms: u64,
    /// Step-specific facts (what was measured, why it failed).
    pub detail: Value,
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

/// Why a failure happened, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// A gate did not pass (exit 1).
    Gate,
    /// The configuration names something that does not exist (exit 2).
    Config,
    /// systemd or the journal cannot be reached, or permission denied (exit 3).
    Access,
}

/// The failed gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The unit.
    pub unit: String,
    /// The step.
    pub step: Step,
    /// One sentence.
    pub cause: String,
    /// Kind (exit code).
    pub kind: FailureKind,
    /// The unit's last log lines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_lines: Vec<String>,
}

/// The last line of a rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The result.
    pub result: Outcome,
    /// Total time.
    pub elapsed_ms: u64,
    /// Units restarted and verified, in order.
    pub units: Vec<String>,
    /// The failed gate, unless it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Failure>,
}

/// Where events go.
pub type Sink = tokio::sync::mpsc::UnboundedSender<Event>;
