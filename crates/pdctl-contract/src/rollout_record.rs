//! A rollout's record, as pdctld keeps it in its state directory and serves it
//! (`GET /v1/rollouts/{id}`): its plan, events, summary and lifecycle, where an interruption
//! stopped it, and the lines `history` lists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::events::{Event, Failure, Step, Summary};
use crate::lifecycle::{Lifecycle, RolloutState};
use crate::started_by::StartedBy;

/// One unit's systemd state when an interruption was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitSnapshot {
    /// The unit.
    pub unit: String,
    /// `active`, `failed`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_state: Option<String>,
    /// `running`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_state: Option<String>,
    /// The run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
    /// Automatic restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_restarts: Option<u32>,
    /// Why the state is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where an interrupted rollout stopped, and each unit's state when that was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interruption {
    /// The last unit that started a step.
    pub unit: Option<String>,
    /// That step.
    pub step: Option<Step>,
    /// When pdctld found it (seconds since the epoch).
    pub detected_at: u64,
    /// Every unit of the plan.
    pub units: Vec<UnitSnapshot>,
}

/// One rollout's record (`GET /v1/rollouts/{id}`, and the file in the state directory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Its id.
    pub id: String,
    /// What started it.
    pub kind: RolloutKind,
    /// Units in order.
    pub plan: Vec<String>,
    /// Its state, position and when that changed.
    pub lifecycle: Lifecycle,
    /// Seconds since the epoch.
    pub created_at: u64,
    /// Seconds since the epoch, when finished.
    #[serde(default)]
    pub finished_at: Option<u64>,
    /// Every event so far.
    #[serde(default)]
    pub events: Vec<Event>,
    /// The summary, when finished.
    #[serde(default)]
    pub summary: Option<Summary>,
    /// Where it was interrupted.
    #[serde(default)]
    pub interrupted: Option<Interruption>,
    /// Why the workers were chosen (config rollouts: unit → what changed).
    #[serde(default)]
    pub reasons: BTreeMap<String, Vec<String>>,
    /// Rollback details, revisions recorded.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The rollout this one resumes.
    #[serde(default)]
    pub resumes: Option<String>,
    /// The rollout this one reverts (`pdctl rollout revert ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverts: Option<String>,
    /// It was allowed to take the only worker of a role down (a resume inherits it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_outage: bool,
    /// It may load unit changes the workers did not run yet (a config rollout, or a restart
    /// with `--load-changes`; a resume inherits it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub load_changes: bool,
    /// What clients saw during each unit's window (the availability probe).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub availability_by_unit: BTreeMap<String, crate::availability::Availability>,
    /// Each re-admitted unit's last window out of the router, step by step ([`crate::window`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub windows: BTreeMap<String, crate::window::Window>,
    /// Who started it, and why (the audit trail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_by: Option<StartedBy>,
    /// A config rollout whose change was new weights only, loaded into the running workers
    /// without a restart (`[rollout] in_place`; false when it fell back to restarting them).
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_place: bool,
}

/// One line of `GET /v1/rollouts` (and of `pdctl rollout history --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryItem {
    /// The id.
    pub id: String,
    /// What started it.
    pub kind: RolloutKind,
    /// Its state.
    pub state: RolloutState,
    /// Units in order.
    pub plan: Vec<String>,
    /// Seconds since the epoch.
    pub created_at: u64,
    /// Seconds since the epoch.
    pub finished_at: Option<u64>,
    /// The failed gate.
    pub failed: Option<Failure>,
    /// Where it was interrupted.
    pub interrupted: Option<Interruption>,
}

/// A file in the records directory that is not a readable record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorruptRecord {
    /// The file.
    pub file: String,
    /// Why it does not read.
    pub error: String,
}

/// `GET /v1/rollouts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    /// Oldest first.
    pub rollouts: Vec<HistoryItem>,
    /// The running rollout's id.
    pub running: Option<String>,
    /// Record files that do not read (listed, never dropped).
    #[serde(default)]
    pub corrupt: Vec<CorruptRecord>,
}

impl Record {
    /// What an operator runs after this rollout was interrupted: a resume for a restart or
    /// config rollout; what pdctld refuses to resume is started again instead — a weights
    /// rollout (pdctld continued its workers at its start: `pdctl status` shows each one's
    /// weights), a config rollout loading weights in place, a revert (of the same rollout).
    pub fn next_after_interruption(&self) -> String {
        match self.kind {
            RolloutKind::Weights => {
                "pdctl status (each worker's weights; pdctld continued every paused worker when it started), then pdctl rollout weights again".into()
            }
            RolloutKind::Apply if self.in_place => {
                "pdctl rollout apply (the weights it was loading are loaded again; pdctld continued every paused worker)".into()
            }
            RolloutKind::Revert => match &self.reverts {
                Some(old) => format!("pdctl rollout revert {old}"),
                None => "pdctl rollout history".into(),
            },
            _ => format!("pdctl rollout resume {}", self.id),
        }
    }

    /// A new, running record.
    pub fn new(id: &str, kind: RolloutKind, plan: Vec<String>, reasons: BTreeMap<String, Vec<String>>, resumes: Option<String>) -> Record {
        Record {
            id: id.to_string(),
            kind,
            plan,
            lifecycle: Lifecycle::new(),
            created_at: crate::lifecycle::now(),
            finished_at: None,
            events: vec![],
            summary: None,
            interrupted: None,
            reasons,
            notes: vec![],
            resumes,
            reverts: None,
            allow_outage: false,
            load_changes: false,
            availability_by_unit: BTreeMap::new(),
            windows: BTreeMap::new(),
            started_by: None,
            in_place: false,
        }
    }

    /// The line of `GET /v1/rollouts` for this record.
    pub fn history_item(&self) -> HistoryItem {
        HistoryItem {
            id: self.id.clone(),
            kind: self.kind,
            state: self.lifecycle.state(),
            plan: self.plan.clone(),
            created_at: self.created_at,
            finished_at: self.finished_at,
            failed: self.summary.as_ref().and_then(|s| s.failed.clone()),
            interrupted: self.interrupted.clone(),
        }
    }
}

pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

/// What kind of rollout a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutKind {
    /// `pdctl restart --rolling`.
    Restart,
    /// `pdctl rollout apply`.
    Apply,
    /// `pdctl rollout resume`.
    Resume,
    /// `pdctl rollout revert` (also a fleet bake's breach).
    Revert,
    /// `pdctl rollout weights`.
    Weights,
    /// `pdctl host drain` (or a FleetLock `pre-reboot`).
    HostDrain,
    /// `pdctl host resume` (or a FleetLock `steady-state`, or pdctld's start after a reboot).
    HostResume,
    /// `pdctl role set`: workers changed between prefill and decode.
    Role,
}

impl RolloutKind {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutKind::Restart => "restart",
            RolloutKind::Apply => "apply",
            RolloutKind::Resume => "resume",
            RolloutKind::Revert => "revert",
            RolloutKind::Weights => "weights",
            RolloutKind::HostDrain => "host_drain",
            RolloutKind::HostResume => "host_resume",
            RolloutKind::Role => "role",
        }
    }
}
