//! The context a worker's gates run in ([`Ctx`]: where the run writes, its scope, its outage
//! rule), a run in progress ([`Underway`]) and its tally ([`Tally`]).

use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::config::Worker;
use crate::engine::work::KnownChanges;
use crate::engine::work::SwitchPlan;
use crate::events::{Failure, Outcome, Summary};
use crate::state::drain_ledger::Ledger;

/// The other half of a 1P1D pair restarted at once (`single_pair = "together"`), and the point
/// both pass between their drain and their stop. A decode's request waits for its KV from the
/// prefill (and a prefill's request for its decode to take the KV): a prefill stopped while its
/// decode still drains cuts that request, which then waits on the decode until its waiting
/// timeout — the decode's drain counts it for all of `drain_timeout` — or fails. So each waits for
/// the other's drain (its wait for requests in flight, or its deferral) before its stop; both stop
/// together, and the window is no longer than the longer drain plus the slower start.
#[derive(Clone, Copy)]
pub(in crate::engine) struct Together<'a> {
    /// The other unit.
    pub(in crate::engine) unit: &'a str,
    /// Passed by both once their drains ended (failed or not: neither waits for ever).
    pub(in crate::engine) drained: &'a tokio::sync::Barrier,
    /// The first half to leave the gateway (its drain, or its restart's deferred taking out):
    /// from then on the gateway sends the other half nothing (a PD request needs both), so a
    /// deferred other half leaves too ([`Together::left`], [`Together::other_left`]).
    pub(in crate::engine) out: &'a tokio::sync::watch::Sender<Option<String>>,
}

impl Together<'_> {
    /// `unit` (this half) left the gateway; the first to leave is kept.
    pub(in crate::engine) fn left(&self, unit: &str) {
        self.out.send_if_modified(|o| {
            let first = o.is_none();
            if first {
                *o = Some(unit.to_string());
            }
            first
        });
    }

    /// Once the other half left the gateway (at once if it already has).
    pub(in crate::engine) async fn other_left(&self) {
        let mut rx = self.out.subscribe();
        if rx.wait_for(|o| o.as_deref() == Some(self.unit)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// What a run writes to besides events.
/// Whether a run restarts anything, and if it does, whether taking the only worker of a role
/// down is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::engine) enum Outage {
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
    pub(in crate::engine) fn of(accepted: bool) -> Outage {
        if accepted {
            Outage::Accepted
        } else {
            Outage::Refused
        }
    }

    /// Whether the run restarts anything.
    pub(in crate::engine) fn restarts(self) -> bool {
        self != Outage::Check
    }

    /// Whether taking the only worker of a role down is accepted.
    pub(in crate::engine) fn accepted(self) -> bool {
        self == Outage::Accepted
    }
}

/// Where in a rollout a worker's gates run: alone (the default), beside the other half of its
/// pair restarted at once, or inside a coherent switch.
#[derive(Clone, Copy, Default)]
pub(in crate::engine) struct Scope<'a> {
    /// The other unit restarting at the same time (`single_pair = "together"`): the pair gate
    /// waits for it to serve instead of skipping it, and neither stops before both drains ended.
    pub(in crate::engine) together_with: Option<Together<'a>>,
    /// A coherent switch's new group: its drains are written down as held and its router gate
    /// waits for the switch ([`crate::state::drain_ledger::Hold`]).
    pub(in crate::engine) hold: Option<crate::state::drain_ledger::Hold>,
    /// The only peers the pair gate may pair with (a coherent switch's group); `None`: all.
    pub(in crate::engine) pair_scope: Option<&'a [String]>,
    /// The plan may be rolled as a coherent switch ([`switch::Groups`]): the coherence preflight
    /// says a change needs it instead of refusing it.
    pub(in crate::engine) switch: Option<&'a SwitchPlan>,
}

/// What a run writes besides its events — none of it for `check` or a dry run
/// ([`Ctx::none`]).
#[derive(Clone, Copy, Default)]
pub(in crate::engine) struct Writes<'a> {
    /// The rollout's id: in the drain ledger, the fleet's slots, and the names of files a
    /// rollback moves aside.
    pub(in crate::engine) id: &'a str,
    /// Where good revisions and measured starts are recorded (pdctld's state directory).
    pub(in crate::engine) revisions: Option<&'a Path>,
    /// Where drains are written down before the gateway is touched.
    pub(in crate::engine) ledger: Option<&'a Ledger>,
    /// Notes for the summary from deep inside a worker's gates (a service not judged).
    pub(in crate::engine) notes: Option<&'a Notes>,
    /// Each restarted worker's service figures from before its drain, kept for the fleet bake.
    pub(in crate::engine) before: Option<&'a std::sync::Mutex<std::collections::BTreeMap<String, pdctl_parse::service::ServiceScrape>>>,
}

#[derive(Clone, Copy)]
pub(in crate::engine) struct Ctx<'a> {
    /// What the run writes besides its events.
    pub(in crate::engine) writes: Writes<'a>,
    /// Whether anything is restarted, and whether a role's only worker may go down.
    pub(in crate::engine) outage: Outage,
    /// Where in the rollout the worker's gates run (the pair restarted with it, a coherent
    /// switch's group and plan).
    pub(in crate::engine) scope: Scope<'a>,
    /// The availability probe's view, when it runs.
    pub(in crate::engine) clients: Option<&'a Clients>,
    /// Changes a worker does not run yet may be loaded ([`RolloutRun::load_changes`]).
    pub(in crate::engine) load_changes: bool,
    /// Without the revisions directory (a dry run outside pdctld): what pdctld said is pending.
    pub(in crate::engine) known: Option<&'a KnownChanges>,
    /// Abort what the worker still runs after the drain (a stale decode's requests can never
    /// finish and would hold its stop until SIGKILL).
    pub(in crate::engine) abort_in_flight: bool,
    /// This host's part of a fleet rollout (its id).
    pub(in crate::engine) fleet_rollout: Option<&'a str>,
}

impl Ctx<'_> {
    pub(in crate::engine) fn none(outage: Outage, load_changes: bool) -> Ctx<'static> {
        Ctx {
            writes: Writes::default(),
            outage,
            scope: Scope::default(),
            clients: None,
            load_changes,
            known: None,
            abort_in_flight: false,
            fleet_rollout: None,
        }
    }
}

/// A unit restarted to repair a stale pairing, and the prefill whose restart needed it.
pub(in crate::engine) type Repaired = Vec<(Worker, String)>;

/// A decode found with a stale pairing: this host's, or another host's (`owner`: host and unit).
pub(in crate::engine) struct Stale {
    pub(in crate::engine) decode: Worker,
    pub(in crate::engine) owner: Option<(String, String)>,
}

/// Shared between the rollout and its availability probe.
#[derive(Default)]
pub(in crate::engine) struct Clients {
    /// The unit being rolled (tags samples).
    pub(in crate::engine) current: std::sync::Mutex<Option<String>>,
    /// Failed probe requests so far.
    pub(in crate::engine) failed: std::sync::atomic::AtomicU64,
    /// The rollout is over: the probe stops.
    pub(in crate::engine) done: AtomicBool,
    /// Samples, in time order.
    pub(in crate::engine) samples: std::sync::Mutex<Vec<crate::service::availability::Sample>>,
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
    pub(in crate::engine) notes: &'a Notes,
    /// Units done so far, repairs, and its start.
    pub(in crate::engine) t: &'a mut Tally,
}

/// What a run says in its record's notes, in the order it happened: the one way every layer
/// says something for the summary (a shared reference: a pair restarted together says its
/// notes from both halves). A service the soak could not judge is said after the rest.
#[derive(Debug, Default)]
pub(in crate::engine) struct Notes {
    said: std::sync::Mutex<Vec<String>>,
    last: std::sync::Mutex<Vec<String>>,
}

impl Notes {
    /// Say `note`.
    pub(in crate::engine) fn push(&self, note: String) {
        crate::engine::step_run::lock(&self.said).push(note);
    }

    /// Say each of `notes`.
    pub(in crate::engine) fn extend(&self, notes: impl IntoIterator<Item = String>) {
        crate::engine::step_run::lock(&self.said).extend(notes);
    }

    /// Say `note` after every other note of the run (a service the soak could not judge).
    pub(in crate::engine) fn push_last(&self, note: String) {
        crate::engine::step_run::lock(&self.last).push(note);
    }

    /// Change what was said so far (a note made untrue by what came after).
    pub(in crate::engine) fn amend(&self, f: impl FnOnce(&mut [String])) {
        f(&mut crate::engine::step_run::lock(&self.said));
    }

    /// Every note, in order.
    pub(in crate::engine) fn into_vec(self) -> Vec<String> {
        let mut all = self.said.into_inner().unwrap_or_else(|p| p.into_inner());
        all.extend(self.last.into_inner().unwrap_or_else(|p| p.into_inner()));
        all
    }
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
