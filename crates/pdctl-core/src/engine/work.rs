//! What a rollout is asked to do ([`Work`], [`RolloutRun`]), what pdctld knows of each worker's
//! files ([`Known`], [`Staleness`]), and how it ended ([`Finished`]); and the types the layers
//! of the engine hand each other: who asked for a host drain ([`Asked`]), the weights to load
//! ([`WeightsTarget`]), a coherent switch's groups ([`SwitchPlan`]), a fleet step's phase
//! ([`Phase`]).

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::config::{Role, Worker};
use crate::events::Summary;
use crate::plan::Plan;
use crate::state::drain_ledger::Ledger;
use crate::state::revisions;

/// What a rollout does to its plan's workers.
#[derive(Clone, Copy)]
pub enum Work<'a> {
    /// Restart each through every gate, in plan order. `resume`: the rest of an interrupted
    /// rollout — its first `resume` units (the one it stopped at, and those it had already
    /// restarted) are re-verified, each restarted only if that fails; one that passes has its
    /// files recorded as its good revision.
    Restart {
        /// Units re-verified first.
        resume: usize,
        /// The interrupted rollout was a change of role: a worker that passes again runs its
        /// unit's files as they are now, its role drop-in included though it may be newer than
        /// its process (switched at run time).
        role: bool,
    },
    /// A revert: each worker gets back its files from before the reverted rollout (step
    /// `rollback`) and is restarted through every gate, in plan order.
    Revert {
        /// Unit → the revision it ran before the reverted rollout.
        restore: &'a std::collections::BTreeMap<String, revisions::Revision>,
    },
    /// New weights loaded into every worker of the plan at once, without a restart
    /// (`pdctl rollout weights`, or a config rollout that only changes them).
    Weights {
        /// What to load.
        target: WeightsTarget<'a>,
    },
    /// Host maintenance before a reboot (`pdctl host drain`): every worker of the plan out of
    /// the gateway and stopped under the host's whole budget, held until its resume.
    HostDrain {
        /// Who asked, and why.
        asked: Asked<'a>,
    },
    /// Host maintenance after the reboot (`pdctl host resume`): every worker through the
    /// restart's gates, then the host's budget given back.
    HostResume,
}

impl<'a> Work<'a> {
    /// The weights it loads, if that is what it does.
    pub fn weights(&self) -> Option<WeightsTarget<'a>> {
        match self {
            Work::Weights { target } => Some(*target),
            _ => None,
        }
    }

    /// Whether it is host maintenance (no revision, rollback or quarantine: nothing's files
    /// change).
    pub fn is_host(&self) -> bool {
        matches!(self, Work::HostDrain { .. } | Work::HostResume)
    }
}

/// A rollout for [`Engine::execute`].
pub struct RolloutRun<'a> {
    /// The workers, in order.
    pub plan: &'a Plan,
    /// What it does to them.
    pub work: Work<'a>,
    /// Set by an operator: stop between units.
    pub abort: &'a AtomicBool,
    /// Where good revisions live (pdctld's state directory); `None`: no revisions, no rollback.
    pub revisions: Option<&'a Path>,
    /// Where drains are written down before the router is touched; `None`: drains are not
    /// persisted (only for in-process runs that cannot outlive their caller).
    pub ledger: Option<&'a Ledger>,
    /// The rollout's id (names files moved aside by a rollback; in the drain ledger).
    pub id: &'a str,
    /// Taking the only worker of a role down is accepted (`--allow-outage`; or the config's).
    pub allow_outage: bool,
    /// Changes on disk that a worker does not run yet may be loaded by its restart (a config
    /// rollout, or `--load-changes`); else such a worker is refused in preflight.
    pub load_changes: bool,
    /// This host's part of fleet rollout ID (`pdctl fleet restart`): a change of the model the
    /// workers compute with is then switched fleet-wide, hosts in step ([`fleet_switch`]).
    pub fleet_rollout: Option<&'a str>,
}

/// What pdctld's `GET /v1/diff` says of one worker: what a dry run run outside pdctld knows of
/// the state it cannot read.
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// What changed since its last good revision.
    pub reasons: Vec<String>,
    /// Its current files are a change that failed (as a clause: [`revisions::Quarantine::clause`]).
    pub quarantined: Option<String>,
    /// Its last measured start and window out of the router.
    pub timing: Option<revisions::StartTime>,
}

/// Unit → what pdctld knows of it ([`Known`]).
pub type KnownChanges = std::collections::BTreeMap<String, Known>;

/// Whether a worker runs its current files.
#[derive(Debug, Clone)]
pub struct Staleness {
    /// The unit.
    pub unit: String,
    /// What changed since its last good revision (empty: nothing).
    pub reasons: Vec<String>,
    /// Its current files are a change that failed before (not rolled out again by `apply`).
    pub quarantined: Option<revisions::Quarantine>,
}

impl Staleness {
    /// The workers `rollout apply` rolls out of `stale`: every stale one (`all`: every one) but
    /// a quarantined change.
    pub fn to_roll(stale: &[Staleness], all: bool) -> Vec<String> {
        stale.iter().filter(|w| w.quarantined.is_none() && (all || !w.reasons.is_empty())).map(|w| w.unit.clone()).collect()
    }
}

/// How a rollout ended, and what was done besides the gates (revisions recorded, rollback).
#[derive(Debug, Clone)]
pub struct Finished {
    /// The summary.
    pub summary: Summary,
    /// What was recorded or restored, one sentence each.
    pub notes: Vec<String>,
    /// What clients saw during each unit's window (the availability probe).
    pub availability_by_unit: std::collections::BTreeMap<String, crate::service::availability::Availability>,
    /// Each restarted worker's service figures from before its drain (taken with `[verify.slo]`
    /// when the fleet bakes, or when it is the only worker of its role): the bake's baseline.
    pub service_before: std::collections::BTreeMap<String, pdctl_parse::service::ServiceScrape>,
    /// A config rollout's new weights were loaded in place (not restarted).
    pub in_place: bool,
}

/// Who asked for a host drain, and why (kept in the maintenance record).
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// `uid N`, or `fleetlock ID`.
    pub by: &'a str,
    /// `--reason`.
    pub reason: Option<&'a str>,
}

/// The weights to load.
#[derive(Debug, Clone, Copy)]
pub struct WeightsTarget<'a> {
    /// The checkpoint (`model_path` of `/update_weights_from_disk`).
    pub model_path: &'a str,
    /// Its version (`weight_version`), when given.
    pub version: Option<&'a str>,
    /// This host's part of fleet rollout ID (`pdctl fleet weights`): every host pauses, then
    /// loads, then continues only once every host has loaded (a step in etcd per phase).
    pub fleet_rollout: Option<&'a str>,
    /// A config rollout's change loaded in place ([`crate::state::in_place`]): the units' files already
    /// name these weights (recorded as what each worker runs once they serve them).
    pub config: bool,
}

/// The two groups of a coherent switch, each holding both PD roles.
#[derive(Debug, Clone)]
pub(in crate::engine) struct Groups {
    /// Restarted first, out of the gateway, then switched in.
    pub(in crate::engine) new: Vec<Worker>,
    /// Serves until the switch, then restarted and re-admitted one at a time.
    pub(in crate::engine) old: Vec<Worker>,
    /// With `[fleet]`: the groups are hosts, moved in step (this host's workers are all in
    /// `new` or all in `old`); see `fleet/switch.rs`.
    pub(in crate::engine) fleet: Option<FleetGroups>,
}

/// A fleet switch's groups of hosts (see `fleet/switch.rs`; its plan and phases are there).
#[derive(Debug, Clone)]
pub(in crate::engine) struct FleetGroups {
    /// The fleet rollout (`None`: a dry run, as if every live host took part).
    pub(in crate::engine) id: Option<String>,
    /// Restarted first, out of the gateway, then switched in.
    pub(in crate::engine) new_hosts: Vec<String>,
    /// Serve until the switch, then restarted.
    pub(in crate::engine) old_hosts: Vec<String>,
    /// This host is in the new group.
    pub(in crate::engine) mine_new: bool,
    /// Prefills and decodes of the new group, then of the old one (fleet-wide).
    pub(in crate::engine) counts: [(usize, usize); 2],
    /// How long an old host waits for every new host to be `verified` (their slots, restarts
    /// and gates).
    pub(in crate::engine) verify_wait: Duration,
}

/// Whether a plan may be rolled as a coherent switch, and whether its preflight found that it must.
#[derive(Debug)]
pub(in crate::engine) struct SwitchPlan {
    /// The groups, or why the plan cannot be switched (said with `mixed_versions`).
    pub(in crate::engine) groups: Result<Groups, String>,
    /// Set by the coherence preflight: some worker's change breaks coherence.
    pub(in crate::engine) needed: AtomicBool,
}

impl Groups {
    pub(in crate::engine) fn units(ws: &[Worker]) -> Vec<String> {
        ws.iter().map(|w| w.unit.clone()).collect()
    }

    /// What the plan does and the capacity at each phase, in one sentence (the dry run says it).
    pub(in crate::engine) fn sentence(&self, all: &[&Worker]) -> String {
        if let Some(f) = &self.fleet {
            return f.sentence();
        }
        let count = |ws: &[Worker], r: Role| ws.iter().filter(|w| w.role == r).count();
        let total = |r: Role| all.iter().filter(|w| w.role == r).count();
        let (np, nd) = (total(Role::Prefill), total(Role::Decode));
        format!(
            "coherent switch: {new} restart onto the new model out of the router while {old} serve ({op} of {np} prefills, {od} of {nd} decodes); \
             then the gateway switches from the old group to the new one (no PD pair is routable until it admits the new group: about 1 s behind smg 1.13 or sglang-router 0.3.2, measured and reported); \
             then {old} restart and rejoin one at a time",
            new = Self::units(&self.new).join(", "),
            old = Self::units(&self.old).join(", "),
            op = count(&self.old, Role::Prefill),
            od = count(&self.old, Role::Decode),
        )
    }
}

/// One phase of a fleet rollout in step: which rollout, which kind of step, which phase.
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct Phase<'a> {
    /// The fleet rollout's id.
    pub(in crate::engine) id: &'a str,
    /// The kind of step.
    pub(in crate::engine) kind: FleetStep,
    /// The phase.
    pub(in crate::engine) name: PhaseName,
}

/// The kinds of fleet steps hosts take together (a key's part in etcd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum FleetStep {
    /// `pdctl fleet weights`: paused, loaded, continued.
    Weights,
    /// The fleet's coherent switch: verified, out, in, back.
    Switch,
}

impl FleetStep {
    /// Its name in etcd's keys.
    pub(in crate::engine) fn as_str(self) -> &'static str {
        match self {
            FleetStep::Weights => "weights",
            FleetStep::Switch => "switch",
        }
    }
}

/// The phases of the fleet's steps, in the order hosts reach them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum PhaseName {
    /// Weights: every worker of the host paused.
    Paused,
    /// Weights: the new weights loaded and verified.
    Loaded,
    /// Switch: the new group restarted and verified, held out.
    Verified,
    /// Switch: the old group taken out of the gateway.
    Out,
    /// Switch: the new group admitted.
    In,
    /// Switch: the new group out again after a failed switch.
    Back,
    /// A host that takes no part in the steps of this kind (written failed, with why): a wait
    /// for it ends at once.
    None,
}

impl PhaseName {
    /// Its name in etcd's keys and in the `switch` step's detail.
    pub(in crate::engine) fn as_str(self) -> &'static str {
        match self {
            PhaseName::Paused => "paused",
            PhaseName::Loaded => "loaded",
            PhaseName::Verified => "verified",
            PhaseName::Out => "out",
            PhaseName::In => "in",
            PhaseName::Back => "back",
            PhaseName::None => "none",
        }
    }
}
