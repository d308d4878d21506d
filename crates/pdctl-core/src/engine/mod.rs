//! The rollout state machine. It reads like the runbook — for each worker, in plan order:
//!
//! 1. **preflight** (all workers, before the first restart): the unit exists; reload the manager if
//!    `NeedDaemonReload`; `--enable-metrics` is in ExecStart when the metrics gate is required; GPU
//!    sets do not overlap; a PD worker's ExecStart can pair with its running peers
//!    ([`crate::pairing::compare`]); the router answers.
//! 2. **drain**: take the worker out of the router, wait (bounded) for its in-flight requests.
//! 3. **restart**: journal cursor, watch the unit, `RestartUnit(name, "replace")`, our job's result.
//! 4. **ready**: the ready line of *this* run ([`crate::judge::Judge`]); fail fast on a fatal line,
//!    the manager's exit/failure messages, or a crash/auto-restart ([`crate::judge::crashed_since`]).
//! 5. **health**: `/health` answers 200.
//! 6. **pair** (a PD worker, still out of the router): a PD request sent straight to each pair it
//!    is in; a decode found with a stale pairing after a prefill restart is restarted through every
//!    gate as a repair (`repair_of`), or the rollout halts (`on_stale_pair`).
//! 7. **router**: registered (re-registered if the router dropped it) with the right type, healthy,
//!    circuit breaker not open, one small request through the router answers 200.
//! 8. **metrics**: KV gauges exposed and sane (one warm-up request if they are not published yet).
//! 9. **stranded_kv** (a decode): the prefills release the KV they held for its old process's rooms.
//! 10. **soak**: the same run (InvocationID, NRestarts) stays up for `min_healthy`; then the files it
//!     runs with are recorded as its good revision.
//!
//! The first failure halts the rollout with its [`Cause`] and the unit's last log lines; nothing
//! after it is touched. One unit is down at a time. With `on_failure = "rollback"` the failed unit's
//! last good revision is restored and run through the same gates ([`Engine::execute`]). A resumed
//! rollout re-verifies the unit it stopped at and restarts it only if that fails.

mod bake_look;
mod fleet_switch;
mod gates;
mod in_place;
mod in_step;
mod recovery;
mod repair;
mod run;
pub mod runbook;
mod step_run;
pub mod steps;
mod switch;
mod weights;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::config::{Settings, Worker};
use crate::drain_ledger::Ledger;
use crate::events::{Failure, Outcome, Summary};
use crate::plan::Plan;

use crate::revisions;

pub use bake_look::{BakeLook, BakeMarks};
pub use recovery::quarantine_clause;
pub use step_run::sentence;
pub use weights::{paused_path, PausedWorker, WeightsTarget};

/// Lines of the unit's log attached to a failure.
pub const LAST_LINES: usize = 20;

/// The engine: settings plus the three ports.
pub struct Engine<U, L, P> {
    /// systemd.
    pub units: U,
    /// The journal.
    pub logs: L,
    /// HTTP checks.
    pub probes: P,
    /// Validated settings.
    pub settings: Settings,
    /// The fleet's store (etcd), with `[fleet]`.
    pub coordinator: Option<std::sync::Arc<dyn crate::ports::Coordinator>>,
}

/// What `check` does not do: restart, soak, and anything that changes the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rollout,
    Check,
}

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
}

impl<'a> Work<'a> {
    /// The weights it loads, if that is what it does.
    pub fn weights(&self) -> Option<WeightsTarget<'a>> {
        match self {
            Work::Weights { target } => Some(*target),
            _ => None,
        }
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

/// The other half of a 1P1D pair restarted at once (`single_pair = "together"`), and the point
/// both pass between their drain and their stop. A decode's request waits for its KV from the
/// prefill (and a prefill's request for its decode to take the KV): a prefill stopped while its
/// decode still drains cuts that request, which then waits on the decode until its waiting
/// timeout — the decode's drain counts it for all of `drain_timeout` — or fails. So each waits for
/// the other's drain (its wait for requests in flight, or its deferral) before its stop; both stop
/// together, and the window is no longer than the longer drain plus the slower start.
#[derive(Clone, Copy)]
struct Together<'a> {
    /// The other unit.
    unit: &'a str,
    /// Passed by both once their drains ended (failed or not: neither waits for ever).
    drained: &'a tokio::sync::Barrier,
}

/// What a run writes to besides events.
/// Whether a run restarts anything, and if it does, whether taking the only worker of a role
/// down is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outage {
    /// A check: nothing is restarted, so there is no outage to judge.
    Check,
    /// Restarts; the only worker of a role is refused.
    Refused,
    /// Restarts; taking the only worker of a role down is accepted (`--allow-outage`, or
    /// `[rollout] allow_outage`).
    Accepted,
}

impl Outage {
    /// A run that restarts, accepting an outage or not.
    fn of(accepted: bool) -> Outage {
        if accepted {
            Outage::Accepted
        } else {
            Outage::Refused
        }
    }

    /// Whether the run restarts anything.
    fn restarts(self) -> bool {
        self != Outage::Check
    }

    /// Whether taking the only worker of a role down is accepted.
    fn accepted(self) -> bool {
        self == Outage::Accepted
    }
}

/// Where in a rollout a worker's gates run: alone (the default), beside the other half of its
/// pair restarted at once, or inside a coherent switch.
#[derive(Clone, Copy, Default)]
struct Scope<'a> {
    /// The other unit restarting at the same time (`single_pair = "together"`): the pair gate
    /// waits for it to serve instead of skipping it, and neither stops before both drains ended.
    together_with: Option<Together<'a>>,
    /// A coherent switch's new group: its drains are written down as held and its router gate
    /// waits for the switch ([`crate::drain_ledger::Hold`]).
    hold: Option<crate::drain_ledger::Hold>,
    /// The only peers the pair gate may pair with (a coherent switch's group); `None`: all.
    pair_scope: Option<&'a [String]>,
    /// The plan may be rolled as a coherent switch ([`switch::Groups`]): the coherence preflight
    /// says a change needs it instead of refusing it.
    switch: Option<&'a switch::SwitchPlan>,
}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    revisions: Option<&'a Path>,
    ledger: Option<&'a Ledger>,
    id: &'a str,
    /// Whether anything is restarted, and whether a role's only worker may go down.
    outage: Outage,
    /// Where in the rollout the worker's gates run (the pair restarted with it, a coherent
    /// switch's group and plan).
    scope: Scope<'a>,
    /// The availability probe's view, when it runs.
    clients: Option<&'a Clients>,
    /// Changes a worker does not run yet may be loaded ([`RolloutRun::load_changes`]).
    load_changes: bool,
    /// Without the revisions directory (a dry run outside pdctld): what pdctld said is pending.
    known: Option<&'a KnownChanges>,
    /// Abort what the worker still runs after the drain (a stale decode's requests can never
    /// finish and would hold its stop until SIGKILL).
    abort_in_flight: bool,
    /// Notes for the summary from deep inside a worker's gates (a service not judged).
    notes: Option<&'a std::sync::Mutex<Vec<String>>>,
    /// Each restarted worker's service figures from before its drain, kept for the fleet bake.
    before: Option<&'a std::sync::Mutex<std::collections::BTreeMap<String, pdctl_probe::service::ServiceScrape>>>,
    /// This host's part of a fleet rollout (its id).
    fleet_rollout: Option<&'a str>,
}

impl Ctx<'_> {
    fn none(outage: Outage, load_changes: bool) -> Ctx<'static> {
        Ctx {
            revisions: None,
            ledger: None,
            id: "",
            outage,
            scope: Scope::default(),
            clients: None,
            load_changes,
            known: None,
            abort_in_flight: false,
            notes: None,
            before: None,
            fleet_rollout: None,
        }
    }
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

/// A unit restarted to repair a stale pairing, and the prefill whose restart needed it.
type Repaired = Vec<(Worker, String)>;

/// A decode found with a stale pairing: this host's, or another host's (`owner`: host and unit).
struct Stale {
    decode: Worker,
    owner: Option<(String, String)>,
}

/// Shared between the rollout and its availability probe.
#[derive(Default)]
struct Clients {
    /// The unit being rolled (tags samples).
    current: std::sync::Mutex<Option<String>>,
    /// Failed probe requests so far.
    failed: std::sync::atomic::AtomicU64,
    /// The rollout is over: the probe stops.
    done: AtomicBool,
    /// Samples, in time order.
    samples: std::sync::Mutex<Vec<crate::availability::Sample>>,
}

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
    pub availability_by_unit: std::collections::BTreeMap<String, crate::availability::Availability>,
    /// Each restarted worker's service figures from before its drain (taken with `[verify.slo]`
    /// when the fleet bakes, or when it is the only worker of its role): the bake's baseline.
    pub service_before: std::collections::BTreeMap<String, pdctl_probe::service::ServiceScrape>,
    /// A config rollout's new weights were loaded in place (not restarted).
    pub in_place: bool,
}

/// A run in progress, as the functions that roll its workers share it (instead of the same five
/// parameters each): where its events go, the operator's abort, the context its gates run in, and
/// what it has written so far — its notes for the summary and its tally.
pub(in crate::engine) struct Underway<'a> {
    /// Where its events go.
    pub(in crate::engine) sink: &'a crate::events::Sink,
    /// Set by an operator: stop between units.
    pub(in crate::engine) abort: &'a AtomicBool,
    /// The context its gates run in.
    pub(in crate::engine) ctx: Ctx<'a>,
    /// Sentences for the summary: what was recorded, restored, repaired or left.
    pub(in crate::engine) notes: &'a mut Vec<String>,
    /// Units done so far, repairs, and its start.
    pub(in crate::engine) t: &'a mut Tally,
}

/// What a run has done so far, and its summary.
pub(in crate::engine) struct Tally {
    /// When the run began.
    pub(in crate::engine) t0: std::time::Instant,
    /// Units restarted (or checked) and verified, in order.
    pub(in crate::engine) done: Vec<String>,
    /// Decode → the prefill whose restart needed its repair.
    pub(in crate::engine) repairs: std::collections::BTreeMap<String, String>,
}

impl Tally {
    pub(in crate::engine) fn summary(&self, result: Outcome, failed: Option<Failure>) -> Summary {
        Summary {
            availability: None,
            id: None,
            result,
            elapsed_ms: self.t0.elapsed().as_millis() as u64,
            units: self.done.clone(),
            checked: Vec::new(),
            repairs: self.repairs.clone(),
            failed,
        }
    }
}
