//! What a rollout is asked to do ([`Work`], [`RolloutRun`]), what pdctld knows of each worker's
//! files ([`Known`], [`Staleness`]), and how it ended ([`Finished`]).

use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::engine::WeightsTarget;
use crate::events::Summary;
use crate::plan::Plan;
use crate::state::drain_ledger::Ledger;
use crate::state::revisions;

/// What a rollout does to its plan's workers.
#[derive(Clone, Copy)]
pub enum Work<'a> {
    /// Restart each through every gate, in plan order. `resume`: the rest of an interrupted
    /// rollout — its first `resume` units (the one it stopped at, and those it had already
    /// restarted) are re-verified, each restarted only if that fails.
    Restart {
        /// Units re-verified first.
        resume: usize,
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
        asked: crate::engine::host::Asked<'a>,
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
    /// Its current files are a change that failed (as a clause: [`quarantine_clause`]).
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
    pub service_before: std::collections::BTreeMap<String, pdctl_probe::service::ServiceScrape>,
    /// A config rollout's new weights were loaded in place (not restarted).
    pub in_place: bool,
}
