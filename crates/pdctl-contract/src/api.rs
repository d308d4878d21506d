//! The contract between `pdctl`, `pdctld` and whatever scripts read them: the exit-code table,
//! the control-API requests and responses, the rollout record, and the NDJSON lines of an event
//! stream. Both binaries use these types; every one rejects unknown fields, and a test checks
//! that each JSON example in docs/cli.md parses into its type.

use serde::{Deserialize, Serialize};

use crate::cause::Cause;
pub use crate::events::{Event, Failure, Outcome, Status, Step, Summary};
pub use crate::exit::Exit;
use crate::lifecycle::RolloutState;
pub use crate::names::{FLEET, ROUTER};
pub use crate::records::{FleetSummary, HostResult, HostStatus};
use crate::rollout_record::is_false;
pub use crate::rollout_record::{CorruptRecord, History, HistoryItem, Interruption, Record, RolloutKind, UnitSnapshot};

/// What a client asks pdctld to start (`POST /v1/rollouts`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// A rolling restart.
    Restart {
        /// Only these units (empty: every configured worker).
        #[serde(default)]
        units: Vec<String>,
        /// Accept taking the only worker of a role down (`--allow-outage`).
        #[serde(default, skip_serializing_if = "is_false")]
        allow_outage: bool,
        /// Why (`--reason`; kept in the record with who started it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Restart with unit changes the running processes do not run yet (`--load-changes`);
        /// without it a worker with pending or quarantined changes is refused (`changes_pending`).
        #[serde(default, skip_serializing_if = "is_false")]
        load_changes: bool,
        /// The config the client planned with; pdctld refuses (`config_mismatch`) when its own
        /// differs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
    /// A config rollout of stale workers.
    Apply {
        /// Do nothing (no record) when no worker is stale.
        #[serde(default)]
        if_changed: bool,
        /// Roll every worker, stale or not.
        #[serde(default)]
        all: bool,
        /// Accept taking the only worker of a role down (`--allow-outage`).
        #[serde(default, skip_serializing_if = "is_false")]
        allow_outage: bool,
        /// Why (`--reason`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The config the client planned with (see `Restart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
    /// Continue an interrupted rollout.
    Resume {
        /// The interrupted rollout.
        id: String,
        /// The config the client planned with (see `Restart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
    /// New weights without a restart (`pdctl rollout weights`): every worker paused, loaded with
    /// `model_path`, verified to serve it, continued; a failure puts the previous weights back.
    Weights {
        /// The checkpoint to load (`/update_weights_from_disk`'s `model_path`).
        model_path: String,
        /// Its version (`weight_version`), verified on every worker.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<String>,
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// This host's part of fleet rollout ID (`pdctl fleet weights`): every host pauses, loads
        /// and continues in step, through etcd. Without it a host with `[fleet]` refuses.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fleet_rollout: Option<String>,
        /// The config the client planned with (see `Restart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
    /// Host maintenance (`pdctl host drain`, or a FleetLock `pre-reboot`): a slot for every
    /// worker of the host in its role's budget (with `[fleet]`: in one etcd transaction), each
    /// worker drained through the gateway and stopped (SGLang's own SIGTERM drain), the host
    /// recorded as in maintenance. Its slots stay held until `HostResume` passed.
    HostDrain {
        /// Accept a role with no worker left (without `[fleet]`: this host's workers are the
        /// only ones the gateway admits of a role).
        #[serde(default, skip_serializing_if = "is_false")]
        allow_outage: bool,
        /// Why (`--reason`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The config the client planned with (see `Restart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
    /// After host maintenance (`pdctl host resume`, a FleetLock `steady-state`, or pdctld's
    /// start after the reboot): each worker started if the reboot did not, then its ready line
    /// of this boot, health, pair, router, metrics, stranded KV and the soak — the restart's
    /// gates — and only then the host's slots given back.
    HostResume {
        /// Why (`--reason`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The config the client planned with (see `Restart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
    /// Put back what a finished rollout changed: each worker it restarted with changed files, in
    /// reverse order, gets the files it ran before (kept when that rollout recorded the new ones)
    /// and is restarted through every gate. Workers it restarted unchanged are left alone.
    Revert {
        /// The rollout to revert.
        id: String,
        /// Why (`--reason`; a fleet bake's breach says which figure).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// `--allow-outage`, asked for this revert; absent: as the reverted rollout ran (a fleet
        /// bake's revert of its own rollout), never taken from it for an operator's revert.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allow_outage: Option<bool>,
        /// The config the client planned with (see `Restart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
    /// `pdctl role set`: one worker to `role`, or this host's PD workers to `ratio` (`P:D`; pdctl
    /// chooses which flip). Each flipped worker is drained, given its unit's role drop-in, and
    /// switched at run time (`--enable-pd-role-switch`) or restarted, through every gate.
    Role {
        /// The worker (with `role`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unit: Option<String>,
        /// Its new role: `prefill` or `decode` (with `unit`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<String>,
        /// `P:D` (instead of `unit` and `role`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ratio: Option<String>,
        /// Why (`--reason`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The config the client planned with (see `Restart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<ConfigIdentity>,
    },
}

/// Which config a client or pdctld runs with: the main file's path and a digest of the contents of
/// every file merged (pdctl-core's `config::identity`). Two paths with the same contents are the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigIdentity {
    /// The main file.
    pub path: String,
    /// SHA-256 of the merged files' contents, in merge order.
    pub sha256: String,
}

impl ConfigIdentity {
    /// `/etc/pdctl/pdctl.toml (sha256 1a2b3c4d5e6f)`, for a sentence.
    pub fn describe(&self) -> String {
        format!("{} (sha256 {})", self.path, self.sha256.get(..12).unwrap_or(&self.sha256))
    }
}

pub use crate::started_by::StartedBy;

/// What pdctld's own process may not reach (`GET /v1/reach`): its unit's IP sandbox refuses a
/// configured address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReachReport {
    /// The configured addresses checked (not loopback).
    pub checked: Vec<String>,
    /// Those refused, with what is there.
    pub blocked: Vec<BlockedAddress>,
}

/// One configured address pdctld may not connect to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockedAddress {
    /// What is there (`etcd`, `the router`, a unit).
    pub what: String,
    /// The URL.
    pub url: String,
}

/// A fleet rollout asked of the local pdctld (`POST /v1/fleet/rollouts`), which writes it to etcd
/// for every host's pdctld.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FleetRequest {
    /// Only these hosts (empty: every host alive now).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Accept taking the only worker of a role (fleet-wide) down.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_outage: bool,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Each host's restart may load unit changes its workers do not run yet (`--load-changes`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub load_changes: bool,
    /// Not a restart: new weights into every worker of every host at once (`pdctl fleet weights`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<crate::records::FleetWeights>,
}

/// 202 answer to `POST /v1/rollouts` (`id` null: a config rollout found nothing stale).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Started {
    /// The new rollout's id.
    pub id: Option<String>,
    /// Why nothing started, when `id` is null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Every control-API error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    /// One sentence: what is wrong and what to do.
    pub error: String,
    /// The exit code the CLI ends with.
    pub exit_code: Exit,
    /// The cause's stable code.
    pub cause_code: String,
    /// What to do next ([`Cause::next_step`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub next: String,
}

impl ApiError {
    /// The error body of `cause`.
    pub fn of(cause: &Cause) -> ApiError {
        ApiError { error: cause.sentence(), exit_code: cause.exit(), cause_code: cause.code().to_string(), next: cause.next_step("") }
    }
}

/// 202 answer to `POST /v1/rollouts/{id}/abort`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbortAccepted {
    /// The rollout.
    pub id: String,
    /// What happens now.
    pub message: String,
}

/// One worker of `GET /v1/diff`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffWorker {
    /// The unit.
    pub unit: String,
    /// Whether it runs other files than it has now.
    pub stale: bool,
    /// What changed.
    pub reasons: Vec<String>,
    /// The current files are a change that failed: `rollout apply` skips the worker until they
    /// change again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<crate::records::Quarantine>,
    /// Its last measured start and window out of the router (the outage to expect when it is
    /// the only worker of its role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<crate::clock::StartTime>,
}

/// `GET /v1/diff`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Diff {
    /// Every configured worker.
    pub workers: Vec<DiffWorker>,
    /// What `pdctl rollout apply` would do with the stale workers, before anything starts: load
    /// new weights in place (every worker paused for the load: requests wait) or restart them,
    /// and why (one sentence; absent when nothing is stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply: Option<String>,
}

/// The last rollout, in `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LastRollout {
    /// Its id.
    pub id: String,
    /// Its state.
    pub state: RolloutState,
    /// Its kind.
    pub kind: RolloutKind,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonStatus {
    /// The running rollout.
    pub running: Option<String>,
    /// The newest record.
    pub last: Option<LastRollout>,
    /// The main config file.
    pub config: String,
    /// The state directory.
    pub state_dir: String,
    /// pdctld is restoring drains it made before (no rollout starts until it is done).
    #[serde(default)]
    pub reconciling: bool,
    /// Workers pdctl took out of the router and has not re-admitted (they are not serving).
    #[serde(default)]
    pub drained: Vec<crate::records::Drain>,
    /// Why the last record write failed, while records are not being saved (no rollout starts).
    #[serde(default)]
    pub record_error: Option<String>,
    /// Record files that do not read.
    #[serde(default)]
    pub corrupt: Vec<CorruptRecord>,
    /// Changes that failed and are not rolled out again until their files change.
    #[serde(default)]
    pub quarantined: Vec<crate::records::Quarantine>,
    /// Per decode and prefill, the last pair probe pdctl sent them (from the rollout records).
    #[serde(default)]
    pub pairs: Vec<PairStatus>,
    /// What pdctld has to undo and could not yet — a worker a weights rollout left paused that
    /// does not continue, drains it cannot re-admit because systemd or the config cannot be used,
    /// a `paused.json` that does not read — each a sentence with what to do; no rollout starts
    /// while any is left (`reconciling`), and pdctld keeps trying.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unresolved: Vec<String>,
    /// `[maintenance] balance_roles`: what pdctld's last look at the roles' pressure saw — the
    /// ratio suggested and for how long, why a due change waits, or the change it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_balance: Option<String>,
}

/// The last pair probe of one prefill/decode pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairStatus {
    /// The decode.
    pub decode: String,
    /// The prefill.
    pub prefill: String,
    /// They paired (`paired`, or `refreshed`: after one failed request).
    pub ok: bool,
    /// The probe's result (`paired`, `refreshed`, `stale`, `incompatible`, `prefill_broken`,
    /// `decode_broken`, `transfer_failed`).
    pub result: crate::details::PairOutcome,
    /// When it was probed (RFC 3339).
    pub checked_at: String,
    /// The rollout that probed it.
    pub rollout_id: String,
}

impl PairStatus {
    /// The last probe of each pair found in `records` (oldest first); a pair whose decode was
    /// then restarted (a repair) shows that restart's probe.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a Record>) -> Vec<PairStatus> {
        let mut last: std::collections::BTreeMap<(String, String), PairStatus> = std::collections::BTreeMap::new();
        for r in records {
            for e in r.events.iter().filter(|e| e.step == crate::events::Step::Pair && e.status != crate::events::Status::Started) {
                let detail: crate::details::PairDetail = serde_json::from_value(e.detail.clone()).unwrap_or_default();
                for p in detail.pairs {
                    if p.result == crate::details::PairOutcome::Skipped {
                        continue;
                    }
                    let st =
                        PairStatus { ok: p.ok(), decode: p.decode, prefill: p.prefill, result: p.result, checked_at: e.at.clone(), rollout_id: r.id.clone() };
                    last.insert((st.decode.clone(), st.prefill.clone()), st);
                }
            }
        }
        last.into_values().collect()
    }
}

/// The `result` of an interrupted rollout's last stream line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptedResult {
    /// The only value.
    Interrupted,
}

/// The last stream line of a rollout pdctld found interrupted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterruptedEnd {
    /// `"interrupted"`.
    pub result: InterruptedResult,
    /// Where and each unit's state.
    pub interrupted: Interruption,
}

/// One NDJSON line of `GET /v1/rollouts/{id}/events` (and of `pdctl --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StreamLine {
    /// A step transition.
    Event(Event),
    /// The last line of a finished rollout (boxed: it is far larger than an event line).
    Summary(Box<Summary>),
    /// The last line of an interrupted rollout.
    Interrupted(InterruptedEnd),
}

impl Record {
    /// The last line of its event stream, once it has ended.
    pub fn end_line(&self) -> Option<StreamLine> {
        match (&self.summary, &self.interrupted) {
            (Some(s), _) => Some(StreamLine::Summary(Box::new(s.clone()))),
            (None, Some(i)) => Some(StreamLine::Interrupted(InterruptedEnd { result: InterruptedResult::Interrupted, interrupted: i.clone() })),
            (None, None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_reject_unknown_fields() {
        let ok: Request = serde_json::from_str(r#"{"kind":"restart","units":["a.service"]}"#).unwrap();
        assert_eq!(ok, Request::Restart { units: vec!["a.service".into()], allow_outage: false, reason: None, load_changes: false, config: None });
        let typo = serde_json::from_str::<Request>(r#"{"kind":"restart","unit":["x"]}"#).unwrap_err();
        assert!(typo.to_string().contains("unknown field `unit`"), "{typo}");
        assert!(serde_json::from_str::<Request>(r#"{"kind":"reboot"}"#).is_err());
    }

    #[test]
    fn exit_codes_round_trip() {
        for e in Exit::ALL {
            assert_eq!(Exit::try_from(e.code()), Ok(e));
        }
        assert!(Exit::try_from(9).is_err());
        assert_eq!(serde_json::to_string(&Exit::Busy).unwrap(), "4");
    }
}
