//! The typed details of the steps whose detail another place reads back: written by the engine,
//! serialized into the event's `detail` (the JSON is the contract in docs/cli.md), and read back
//! by type — pdctld's pair status (`api::PairStatus`) from the pair step's, the start's
//! measured time from the ready step's, the CLI's notes from a worker's preflight and a waiting
//! slot step. A leaf: it imports nothing of this crate.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What any step's detail may say besides its own facts, in the keys other places read back: why
/// it was skipped (`reason`), the cause of its failure (`cause`, `cause_code`), a warning on a
/// passed step (`warning`, with `cause_code` when a cause has one), and a sentence for the
/// rollout's summary (`note`). Written into the detail beside the step's own facts
/// ([`Said::written_into`]) and read back only through [`Said::of`] — the CLI's tables and warnings,
/// pdctld's failure metric, the log sentence and the summary's notes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Said {
    /// Why the step did not run (a skipped step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The cause's sentence (a failed step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// The cause's stable code (a failed step, or a passed one with a warning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause_code: Option<String>,
    /// What went wrong on a passed step (a gate in warn mode, a slow stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// A sentence for the rollout's summary (a service the soak could not judge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Said {
    /// What `detail` says (nothing for a detail that is no object, or whose keys hold other
    /// types than strings).
    pub fn of(detail: &Value) -> Said {
        Said::deserialize(detail).unwrap_or_default()
    }

    /// `detail` with these keys set beside its own (a detail that is no object becomes one).
    pub fn written_into(self, detail: Value) -> Value {
        let mut d = match detail {
            Value::Object(o) => o,
            _ => serde_json::Map::new(),
        };
        if let Ok(Value::Object(mine)) = serde_json::to_value(self) {
            d.extend(mine);
        }
        Value::Object(d)
    }
}

/// What later readers take from a passed restart step's detail (the record's windows, a resumed
/// rollout's run check): read through one type, never by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RestartSeen {
    /// The run it started.
    #[serde(default)]
    pub invocation_id: Option<String>,
    /// What the stop took.
    #[serde(default)]
    pub stop: Option<StopSeen>,
    /// A deferred drain: when the worker left the gateway during the stop.
    #[serde(default)]
    pub taken_out: Option<TakenOutSeen>,
}

/// The stop's part of [`RestartSeen`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct StopSeen {
    /// How long the stop took (from SIGTERM to the process's exit), when measured.
    #[serde(default)]
    pub stop_ms: Option<u64>,
}

/// The deferred taking out's part of [`RestartSeen`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TakenOutSeen {
    /// After the restart job began.
    #[serde(default)]
    pub after_ms: Option<u64>,
}

impl RestartSeen {
    /// What `detail` says (nothing where it holds other shapes).
    pub fn of(detail: &Value) -> RestartSeen {
        RestartSeen::deserialize(detail).unwrap_or_default()
    }
}

/// The pair step's detail: every pair the restarted worker is in, and what was found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairDetail {
    /// One entry per pair, in probe order.
    pub pairs: Vec<PairResult>,
    /// Decodes found with a stale pairing, to be repaired.
    #[serde(default)]
    pub stale: Vec<String>,
    /// `"restart-decode"` when a repair follows.
    #[serde(default)]
    pub repair: Option<String>,
}

/// One pair's result in [`PairDetail`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairResult {
    /// The prefill unit.
    pub prefill: String,
    /// The decode unit.
    pub decode: String,
    /// What the probe found (`skipped`: not probed, `why` says why).
    pub result: PairOutcome,
    /// Why it was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The probes sent (each request's status and body, as pdctl-core's `sglang::pairing::PairProbe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<Value>,
    /// When it was probed (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
}

impl PairResult {
    /// Whether the two paired (`paired`, or `refreshed`: after one failed request).
    pub fn ok(&self) -> bool {
        self.result.ok()
    }
}

/// What one pair probe found (the JSON names are the contract in docs/cli.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairOutcome {
    /// The decode answered 200: they pair.
    Paired,
    /// They pair after one failed request (the decode refreshed its bootstrap info).
    Refreshed,
    /// The decode still uses an older prefill process's bootstrap info.
    Stale,
    /// Their settings disagree: no transfer can work.
    Incompatible,
    /// The prefill half failed on its own.
    PrefillBroken,
    /// The decode failed for a reason other than the transfer.
    DecodeBroken,
    /// The transfer failed, and no restart explains it.
    TransferFailed,
    /// Not probed: the peer was not serving, or serves another model.
    #[default]
    Skipped,
}

impl PairOutcome {
    /// Whether the two paired.
    pub fn ok(self) -> bool {
        matches!(self, PairOutcome::Paired | PairOutcome::Refreshed)
    }

    /// Its name in events and status (`stale`, `prefill_broken`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            PairOutcome::Paired => "paired",
            PairOutcome::Refreshed => "refreshed",
            PairOutcome::Stale => "stale",
            PairOutcome::Incompatible => "incompatible",
            PairOutcome::PrefillBroken => "prefill_broken",
            PairOutcome::DecodeBroken => "decode_broken",
            PairOutcome::TransferFailed => "transfer_failed",
            PairOutcome::Skipped => "skipped",
        }
    }
}

/// The ready step's detail: the ready line of this run and how it was recognised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadyDetail {
    /// The line.
    pub line: String,
    /// The PID that logged it.
    pub pid: Option<u32>,
    /// Its run's InvocationID.
    pub invocation_id: Option<String>,
    /// Milliseconds from journald's timestamp to pdctl reading it.
    pub detect_ms: f64,
    /// journald's timestamp of the line (µs since the epoch): the start's end.
    pub journal_realtime_us: u64,
    /// Ready lines of other runs skipped (an old process's flushed output).
    pub ignored_ready_lines_of_other_runs: u32,
    /// A traceback this run logged before it went on to be ready.
    pub warning: Option<String>,
    /// Milliseconds since the restart step began.
    pub since_restart_ms: u64,
}

/// A worker's preflight detail (the router's and the fleet's preflight have their own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreflightDetail {
    /// The outage accepted for the only worker of its role (`allow_outage`).
    pub outage: Option<String>,
    /// systemd's ActiveState.
    pub active_state: String,
    /// systemd's SubState.
    pub sub_state: String,
    /// The running InvocationID.
    pub invocation_id: String,
    /// The running MainPID.
    pub main_pid: u32,
    /// The unit file.
    pub fragment_path: String,
    /// The drop-ins systemd has loaded.
    pub drop_ins: Vec<String>,
    /// Drop-ins on disk that systemd has not loaded.
    pub drop_ins_not_loaded: Vec<String>,
    /// systemd was reloaded (in a dry run: would be).
    pub daemon_reload: bool,
    /// A dry run (nothing is touched).
    pub dry_run: bool,
    /// `--enable-metrics` is in ExecStart.
    pub enable_metrics: bool,
    /// The worker's GPUs (`0,1,2,3`).
    pub gpus: Option<String>,
    /// The pairing preflight's facts.
    pub pairing: Value,
    /// The unit's TimeoutStopSec, in ms.
    pub timeout_stop_ms: Option<u64>,
    /// The unit's `KillMode=` (`mixed` lets SGLang drain on SIGTERM; `control-group` does not).
    #[serde(default)]
    pub kill_mode: Option<String>,
    /// What a stop or a pair may run into.
    pub warnings: Vec<String>,
    /// Whether the worker accepts pdctl's API key (`None`: not checked).
    pub api_key_check: Option<String>,
    /// How the rollout keeps PD pairs to one model when this restart changes the model it
    /// computes with (the coherent switch's plan, said once: on the first worker that needs it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coherence: Option<String>,
}

/// The slot step while it waits (a `started` event): who holds the role's slots, or the pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotWait {
    /// One sentence.
    pub waiting: String,
}

/// The prefetch step: a new checkpoint read into the page cache before anyone stops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prefetch {
    /// The checkpoint directory (the new `--model-path`).
    pub model_path: String,
    /// The workers whose next start (or load) reads it.
    pub units: Vec<String>,
    /// Its files (the regular files at its top level).
    pub files: usize,
    /// Their size.
    pub bytes: u64,
    /// What was read (less than `bytes` when the read was cut short: the rollout aborted, or
    /// its time was up).
    pub read_bytes: u64,
    /// `MemAvailable` before the read.
    pub mem_available_bytes: u64,
    /// The memory kept free.
    pub headroom_bytes: u64,
}

/// The prefetch step while it reads (a `started` event, about once a second).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchRead {
    /// Read so far.
    pub read_bytes: u64,
    /// Of.
    pub of_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_restart_detail_is_read_through_its_type() {
        let d = json!({"invocation_id": "i2", "stop": {"stop_ms": 900, "why": "x"}, "taken_out": {"after_ms": 5100, "when": "w"}, "job_ms": 3});
        let seen = RestartSeen::of(&d);
        assert_eq!(seen.invocation_id.as_deref(), Some("i2"));
        assert_eq!(seen.stop.and_then(|s| s.stop_ms), Some(900));
        assert_eq!(seen.taken_out.and_then(|t| t.after_ms), Some(5100));
        // Another shape (a failed step's, an old record's) reads as nothing, not as zero.
        assert_eq!(RestartSeen::of(&json!({"stop": "killed"})), RestartSeen::default());
        assert_eq!(RestartSeen::of(&json!(null)), RestartSeen::default());
    }

    #[test]
    fn what_a_step_says_is_written_and_read_in_the_keys_of_the_contract() {
        let skip = Said { reason: Some("no [fleet] configured".into()), ..Said::default() }.written_into(Value::Null);
        assert_eq!(serde_json::to_string(&skip).unwrap_or_default(), r#"{"reason":"no [fleet] configured"}"#);
        let warned = Said { warning: Some("w".into()), cause_code: Some("load_unknown".into()), ..Said::default() }.written_into(json!({"in_flight": 2}));
        assert_eq!(serde_json::to_string(&warned).unwrap_or_default(), r#"{"cause_code":"load_unknown","in_flight":2,"warning":"w"}"#);
        // A detail that is no object becomes one; its keys beside the step's own facts.
        assert_eq!(Said { note: Some("n".into()), ..Said::default() }.written_into(json!(3)), json!({"note": "n"}));
        // Read back: strings only; a null or another type is nothing, never an error.
        let said = Said::of(&json!({"cause": "c", "cause_code": "job_failed", "warning": null, "job_ms": 5}));
        assert_eq!((said.cause.as_deref(), said.cause_code.as_deref(), said.warning), (Some("c"), Some("job_failed"), None));
        assert_eq!(Said::of(&json!({"note": 5})), Said::default());
        assert_eq!(Said::of(&Value::Null), Said::default());
    }

    #[test]
    fn the_details_serialize_to_the_json_the_contract_shows() {
        let skipped = PairResult { prefill: "p".into(), decode: "d".into(), result: PairOutcome::Skipped, why: Some("w".into()), ..Default::default() };
        let probed =
            PairResult { prefill: "p".into(), decode: "d".into(), result: PairOutcome::Paired, probes: Some(json!([])), at: Some(7), ..Default::default() };
        let d = PairDetail { pairs: vec![skipped, probed], stale: vec![], repair: None };
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"pairs": [{"prefill": "p", "decode": "d", "result": "skipped", "why": "w"}, {"prefill": "p", "decode": "d", "result": "paired", "probes": [], "at": 7}], "stale": [], "repair": null})
        );
        let back: PairDetail = serde_json::from_value(serde_json::to_value(&d).unwrap()).unwrap();
        assert_eq!(back, d);
        assert!(back.pairs[1].ok() && !back.pairs[0].ok());
        for o in [
            PairOutcome::Paired,
            PairOutcome::Refreshed,
            PairOutcome::Stale,
            PairOutcome::Incompatible,
            PairOutcome::PrefillBroken,
            PairOutcome::DecodeBroken,
            PairOutcome::TransferFailed,
            PairOutcome::Skipped,
        ] {
            assert_eq!(serde_json::to_value(o).unwrap(), json!(o.as_str()), "one name per outcome");
        }
        let r = ReadyDetail {
            line: "l".into(),
            pid: Some(1),
            invocation_id: None,
            detect_ms: 1.5,
            journal_realtime_us: 2,
            ignored_ready_lines_of_other_runs: 0,
            warning: None,
            since_restart_ms: 3,
        };
        let p = PreflightDetail {
            outage: None,
            active_state: "active".into(),
            sub_state: "running".into(),
            invocation_id: "i".into(),
            main_pid: 7,
            fragment_path: "/u".into(),
            drop_ins: vec![],
            drop_ins_not_loaded: vec!["/d.conf".into()],
            daemon_reload: true,
            dry_run: false,
            enable_metrics: true,
            gpus: Some("0,1".into()),
            pairing: json!({}),
            timeout_stop_ms: None,
            kill_mode: Some("mixed".into()),
            warnings: vec![],
            api_key_check: None,
            coherence: None,
        };
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"outage": null, "active_state": "active", "sub_state": "running", "invocation_id": "i", "main_pid": 7, "fragment_path": "/u",
                   "drop_ins": [], "drop_ins_not_loaded": ["/d.conf"], "daemon_reload": true, "dry_run": false, "enable_metrics": true,
                   "gpus": "0,1", "pairing": {}, "timeout_stop_ms": null, "kill_mode": "mixed", "warnings": [], "api_key_check": null})
        );
        // The router's preflight detail is not a worker's.
        assert!(serde_json::from_value::<PreflightDetail>(json!({"workers": []})).is_err());
        assert_eq!(serde_json::to_value(SlotWait { waiting: "w".into() }).unwrap(), json!({"waiting": "w"}));
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"line": "l", "pid": 1, "invocation_id": null, "detect_ms": 1.5, "journal_realtime_us": 2, "ignored_ready_lines_of_other_runs": 0, "warning": null, "since_restart_ms": 3})
        );
    }
}
