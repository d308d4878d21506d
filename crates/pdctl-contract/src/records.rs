//! The values the API shows that pdctld also keeps or exchanges: a worker's role, a drain in the
//! ledger (and a coherent switch's hold on it), a change that failed and is not rolled out again,
//! and a fleet rollout's summary, host results and new weights.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A worker's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// PD prefill server.
    Prefill,
    /// PD decode server.
    Decode,
    /// A regular (non-disaggregated) server.
    Regular,
}

impl Role {
    /// The router's `worker_type` for this role.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Regular => "regular",
        }
    }
}

/// One drain pdctl made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    /// The unit.
    pub unit: String,
    /// The worker's URL as configured.
    pub url: String,
    /// Its role (the router's `worker_type`).
    pub role: Role,
    /// Its bootstrap port (prefill), for re-registration.
    pub bootstrap_port: Option<u16>,
    /// The unit's InvocationID when it was drained: the run that had passed the gates.
    pub invocation_id: String,
    /// The router's id of the worker that was removed.
    pub router_id: String,
    /// The rollout that drained it.
    pub rollout_id: String,
    /// When (seconds since the epoch).
    pub drained_at: u64,
    /// Held out of the gateway on purpose by a coherent switch: such a drain is not undone as a
    /// plain one (re-admitting it could pair two models); see [`Hold`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

/// Why a coherent switch keeps a worker out of the gateway (a rollout whose change alters the
/// model the workers compute with, rolled so that no PD request pairs two models): what
/// pdctld's reconcile may do with it after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// In the new group, restarting onto the new model while the old group serves: it may only
    /// come back with its whole group, at the switch (never next to the old group).
    New,
    /// In the new group, which passed every gate inside itself: the switch may admit it.
    Verified,
    /// In the old group, taken out at the switch (the new group serves): it still runs the old
    /// model and comes back only restarted onto the new one.
    Old,
}

/// A change that failed: the files of `unit` with this fingerprint are not rolled out again by
/// `rollout apply` until they change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quarantine {
    /// The unit.
    pub unit: String,
    /// The fingerprint of its files when the change failed.
    pub fingerprint: String,
    /// The rollout where it failed.
    pub rollout_id: String,
    /// Why (the failure's sentence).
    pub cause: String,
    /// When (seconds since the epoch).
    pub at: u64,
}

impl Quarantine {
    /// "in rollout r17…: <its cause>", for [`crate::cause::Cause::ChangesPending`].
    pub fn clause(&self) -> String {
        format!("in rollout {}: {}", self.rollout_id, self.cause)
    }
}

/// The last line of `pdctl fleet watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSummary {
    /// The fleet rollout.
    pub id: String,
    /// `succeeded` when every host succeeded (and the bake found no breach), `rolled_back` when
    /// a bake's breach was reverted on every changed host, else `failed`.
    pub result: crate::events::Outcome,
    /// Each host's result.
    pub hosts: BTreeMap<String, HostResult>,
    /// The bake (`[fleet] bake`), one sentence: passed, not judged, or the breach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake: Option<String>,
    /// After a breach: each changed host's revert, by host (`succeeded`: it runs its files from
    /// before the rollout again, verified; `not_started`: a revert before it failed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reverted: BTreeMap<String, HostResult>,
}

/// How one host's part of a fleet rollout ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostResult {
    /// Its local rollout succeeded.
    Succeeded,
    /// Its local rollout failed (halted, rolled back).
    Failed,
    /// Its local rollout was aborted (another host failed).
    Aborted,
    /// Its local rollout was interrupted (pdctld stopped, or etcd was lost).
    Interrupted,
    /// It did not start: the canary or another host failed first, or it could not start.
    NotStarted,
}

/// New weights for every host of a fleet rollout (`pdctl fleet weights`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// Read by other hosts, never rewritten by them: a newer pdctl's added field is tolerated
// (skipped), so one host's upgrade does not blind the others.
pub struct FleetWeights {
    /// The checkpoint (a path every host's servers read).
    pub model_path: String,
    /// Its version (`weight_version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// What a fleet slot held by a host drain says after its rollout id (`r1764511331 (host
/// maintenance)`): the host may be rebooting, its pdctld down, and the slot is still its own.
pub const MAINTENANCE_HOLD: &str = " (host maintenance)";

/// Where this host's maintenance stands (`pdctl host drain`, a FleetLock `pre-reboot`): written
/// to pdctld's ledger before anything is touched, kept until the host's workers passed their
/// gates after the reboot and its slots are given back (`pdctl host status`, `GET /v1/host`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Maintenance {
    /// The host drain's rollout id (its record holds every step).
    pub id: String,
    /// Where it stands.
    pub phase: MaintenancePhase,
    /// When the drain began (seconds since the epoch).
    pub began: u64,
    /// When the phase began (seconds since the epoch).
    pub since: u64,
    /// Who asked: `uid N`, or `fleetlock ID` for an update agent.
    pub by: String,
    /// Why (`--reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The kernel's boot id when the drain began: a resume at pdctld's start runs only after a
    /// reboot (another boot id) or once a worker runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Each worker of the host as the drain found it, in drain order.
    pub units: Vec<MaintainedUnit>,
    /// Why the last drain or resume failed (then the phase says which).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// One worker of a host in maintenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintainedUnit {
    /// The unit.
    pub unit: String,
    /// Its run when the drain began (a resume finds whether it ran through the reboot).
    pub invocation_id: String,
    /// The journal's tail before its stop: its ready line after the reboot is looked for after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Stopped by the drain.
    #[serde(default)]
    pub stopped: bool,
}

/// Where a host's maintenance stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaintenancePhase {
    /// Its slots taken (with `[fleet]`), its workers being drained and stopped.
    Draining,
    /// Every worker drained and stopped: the host may reboot (FleetLock `pre-reboot` answers 200).
    Down,
    /// Its workers back through the restart's gates; the slots are given back at the end.
    Resuming,
    /// A drain or a resume failed: its slots stay held (the budget protects the fleet) until
    /// `pdctl host resume` passes.
    Failed,
}

impl MaintenancePhase {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            MaintenancePhase::Draining => "draining",
            MaintenancePhase::Down => "down",
            MaintenancePhase::Resuming => "resuming",
            MaintenancePhase::Failed => "failed",
        }
    }
}

/// `GET /v1/host` (`pdctl host status`): this host's maintenance, and whether one may begin now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostStatus {
    /// Its maintenance on record (`null`: in service).
    pub maintenance: Option<Maintenance>,
    /// Why a new maintenance would wait now (outside every window, an alert firing, the fleet
    /// paused, a rollout running); `null`: it may begin.
    pub waits: Option<String>,
    /// Where the FleetLock endpoint listens (`null`: no `[maintenance]`, or none configured).
    pub fleetlock: Option<String>,
    /// The FleetLock id and group it answers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleetlock_id: Option<String>,
    /// The FleetLock group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleetlock_group: Option<String>,
}
