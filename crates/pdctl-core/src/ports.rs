//! The boundary of the engine: three small traits — systemd ([`Units`]), the journal ([`Logs`]),
//! HTTP checks of workers and the router ([`Probes`]) — and the facts they report, in core's own
//! types. Drivers report facts; the engine and `sglang::judge` decide what they mean. The real
//! implementations are in the crate `pdctl-real`; unit tests use in-memory fakes behind the same traits.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::cause::{Cause, MetricsDiagnosis};
pub use crate::pair_probe::{Half, PairProbe, PdQueues};

pub use crate::systemd_states::{ActiveState, JobResult, ServiceResult, SubState};

/// A unit's runtime state, read uncached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitState {
    /// `loaded`, `not-found`, `masked`, …
    pub load_state: String,
    /// `active`, `activating`, `failed`, …
    pub active_state: ActiveState,
    /// `running`, `auto-restart`, `dead`, …
    pub sub_state: SubState,
    /// Hex InvocationID of the current run ("" when none).
    pub invocation_id: String,
    /// Main PID (0 when none).
    pub main_pid: u32,
    /// PID of the last main process, kept after it exits.
    pub exec_main_pid: u32,
    /// Automatic restarts so far.
    pub n_restarts: u32,
    /// Service result (`success`, `exit-code`, `timeout`, `start-limit-hit`, …).
    pub result: ServiceResult,
    /// CLD_* code of the main process's exit (1 exited, 2 killed, 3 dumped core).
    pub exec_main_code: i32,
    /// Exit status or signal of the main process.
    pub exec_main_status: i32,
    /// When the unit last entered `active` (µs since the epoch, 0 = never).
    pub active_enter_us: u64,
    /// When the current main process started (µs since the epoch).
    pub exec_main_start_us: u64,
    /// When the unit last left `active` — a stop began (µs since the epoch, 0 = never).
    pub active_exit_us: u64,
    /// When the unit last entered `inactive` — a stop ended (µs since the epoch, 0 = never).
    pub inactive_enter_us: u64,
}

/// A unit's configuration as systemd parsed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitConfig {
    /// argv of each ExecStart= command, with a `--config FILE.yaml` merged in as SGLang merges
    /// it (`sglang::launch_config`): what the server runs with.
    pub exec_start: Vec<Vec<String>>,
    /// argv of each ExecStart= command as systemd holds it (no `--config` file merged in): what a
    /// drop-in that replaces the command starts from (`pdctl role set`).
    pub exec_start_words: Vec<Vec<String>>,
    /// The `--config` files ExecStart names: part of the unit's configuration (snapshotted with
    /// its revision, restored by a rollback, a change of one is a change of the unit).
    pub config_files: Vec<String>,
    /// Why a `--config` file cannot be merged (unreadable, not YAML…): SGLang would not start.
    pub launch_config_error: Option<String>,
    /// `KEY=value` from Environment= (unit and drop-ins merged).
    pub environment: Vec<String>,
    /// EnvironmentFile= paths (and whether a missing one is ignored).
    pub environment_files: Vec<(String, bool)>,
    /// The unit file.
    pub fragment_path: String,
    /// Drop-ins systemd loaded.
    pub drop_in_paths: Vec<String>,
    /// The unit file changed on disk since the last daemon-reload.
    pub need_daemon_reload: bool,
    /// `TimeoutStopSec=`: how long systemd lets a stop take before SIGKILL (`None`: infinity).
    /// SGLang's stop waits for its requests in flight, so this bounds a stop.
    pub timeout_stop: Option<Duration>,
    /// `KillMode=` (`None`: not known). With systemd's default `control-group` the stop's
    /// SIGTERM also reaches SGLang's scheduler process, which dies of it; see `sglang::stop`.
    pub kill_mode: Option<String>,
}

/// How our job (a restart, stop or start) ended.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    /// The job's result: `done`, `failed`, `timeout`, `canceled`, `dependency`, `skipped`, …
    pub job_result: JobResult,
    /// Time from the call to our job's removal.
    pub job_time: Duration,
    /// The unit right after the job (uncached).
    pub state: UnitState,
}

/// What went wrong talking to systemd: which class, and the driver's sentence (what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitsError {
    /// The unit does not exist.
    NoSuchUnit(String),
    /// The bus or manager cannot be reached.
    Unreachable(String),
    /// Permission denied (or interactive authentication required).
    Denied(String),
    /// A call or the job took longer than its limit.
    Timeout(String),
    /// Anything else systemd said.
    Refused(String),
}

impl UnitsError {
    /// The cause it is.
    pub fn cause(self) -> Cause {
        match self {
            UnitsError::NoSuchUnit(message) => Cause::UnitMissing { message },
            UnitsError::Unreachable(message) => Cause::SystemdUnreachable { message },
            UnitsError::Denied(message) => Cause::AccessDenied { message },
            UnitsError::Timeout(message) => Cause::SystemdTimeout { message },
            UnitsError::Refused(message) => Cause::SystemdRefused { message },
        }
    }
}

impl std::fmt::Display for UnitsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnitsError::NoSuchUnit(m) | UnitsError::Unreachable(m) | UnitsError::Denied(m) | UnitsError::Timeout(m) | UnitsError::Refused(m) => f.write_str(m),
        }
    }
}

/// One journal entry.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// `__REALTIME_TIMESTAMP` (µs since the epoch): when journald received it.
    pub realtime_us: u64,
    /// When the follower read it.
    pub read_at: SystemTime,
    /// Its fields.
    pub fields: BTreeMap<String, String>,
}

impl LogEntry {
    /// A field's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
    /// `MESSAGE` ("" when absent).
    pub fn message(&self) -> &str {
        self.get("MESSAGE").unwrap_or("")
    }
    /// Logged by pdctl or pdctld about the unit (their syslog identifier, or a `PDCTL_*` field),
    /// not by the unit or its manager.
    pub fn is_pdctl_own(&self) -> bool {
        self.get("SYSLOG_IDENTIFIER").is_some_and(|s| s == "pdctld" || s == "pdctl") || self.fields.keys().any(|k| k.starts_with("PDCTL_"))
    }
    /// `_PID`.
    pub fn pid(&self) -> Option<u32> {
        self.get("_PID").and_then(|p| p.parse().ok())
    }
    /// Detection latency: read time minus journald's receive time.
    pub fn latency(&self) -> Duration {
        let received = SystemTime::UNIX_EPOCH + Duration::from_micros(self.realtime_us);
        self.read_at.duration_since(received).unwrap_or_default()
    }
}

/// The journal cannot be read (the driver's sentence, with what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogError(pub String);

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a worker's `/health` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// 200.
    Up,
    /// 503: still warming up (or unhealthy).
    Unavailable(String),
    /// Anything else, or no answer.
    Down(String),
}

/// What a worker's KV gauges say, in total and per stats rank (read by `pdctl-parse`).
pub use pdctl_parse::kv::{KvReport, RankKv};

/// Why a worker's `/metrics` gives no usable KV gauges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsError {
    /// Which known cause.
    pub diagnosis: MetricsDiagnosis,
    /// The probe's sentence.
    pub message: String,
    /// Stats ranks that have not published yet while others have (attention DP: each group's
    /// scheduler publishes on its own first batch); 0 otherwise.
    pub pending_ranks: usize,
}

impl std::fmt::Display for MetricsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl MetricsError {
    /// Worth waiting for (not published yet, or not listening yet) rather than failing at once.
    pub fn may_resolve(&self) -> bool {
        match self.diagnosis {
            MetricsDiagnosis::NotPublished | MetricsDiagnosis::Unreachable => true,
            MetricsDiagnosis::Disabled | MetricsDiagnosis::Unparseable | MetricsDiagnosis::UnknownNames | MetricsDiagnosis::Insane => false,
        }
    }
}

/// One worker as the gateway lists it (read by `pdctl-parse`).
pub use pdctl_parse::gateway::RouterWorker;

/// How `/pause_generation` stops the requests in flight (0.5.23 `scheduler.py`
/// `pause_generation`; new requests wait at their admission either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Stop them and rebuild their KV under the weights served at the continue (a decode asks
    /// its prefill to recompute it).
    Retract,
    /// Stop them where they are: they finish with the KV they have, computed by the weights
    /// served before.
    InPlace,
}

impl PauseMode {
    /// The `mode` SGLang takes.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseMode::Retract => "retract",
            PauseMode::InPlace => "in_place",
        }
    }
}

/// An HTTP call failed (the probe's sentence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpFailure(pub String);

impl std::fmt::Display for HttpFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Change notifications for one unit.
pub trait Watch: Send {
    /// The next change (`None`: the source ended).
    fn changed(&mut self) -> impl Future<Output = Option<()>> + Send;
}

/// systemd.
pub trait Units: Send + Sync {
    /// Watch type.
    type W: Watch;
    /// Uncached state.
    fn state(&self, unit: &str) -> impl Future<Output = Result<UnitState, UnitsError>> + Send;
    /// Parsed configuration.
    fn config(&self, unit: &str) -> impl Future<Output = Result<UnitConfig, UnitsError>> + Send;
    /// daemon-reload.
    fn reload(&self) -> impl Future<Output = Result<(), UnitsError>> + Send;
    /// ResetFailedUnit.
    fn reset_failed(&self, unit: &str) -> impl Future<Output = Result<(), UnitsError>> + Send;
    /// Start watching (before acting).
    fn watch(&self, unit: &str) -> impl Future<Output = Result<Self::W, UnitsError>> + Send;
    /// Restart and wait for our job.
    fn restart(&self, unit: &str, job_timeout: Duration) -> impl Future<Output = Result<JobOutcome, UnitsError>> + Send;
    /// Stop (host maintenance: the unit stays down until the host's resume) and wait for our job.
    fn stop(&self, unit: &str, job_timeout: Duration) -> impl Future<Output = Result<JobOutcome, UnitsError>> + Send;
    /// Start a unit that is not running (a host's resume) and wait for our job.
    fn start(&self, unit: &str, job_timeout: Duration) -> impl Future<Output = Result<JobOutcome, UnitsError>> + Send;
}

/// A stream of journal entries for one unit.
pub trait Follow: Send {
    /// The next entry.
    fn next(&mut self) -> impl Future<Output = Option<Result<LogEntry, LogError>>> + Send;
}

/// The journal.
pub trait Logs: Send + Sync {
    /// Follower type.
    type F: Follow;
    /// The tail cursor (take it before the restart).
    fn tail_cursor(&self) -> impl Future<Output = Result<Option<String>, LogError>> + Send;
    /// The cursor of the first entry of boot `boot_id` (the kernel's boot id) the journal holds;
    /// `None` when it holds none. After a reboot, a ready line is looked for after it: a cursor
    /// recorded before the reboot names another boot's journal, placed only by the wall clock.
    fn boot_head_cursor(&self, boot_id: &str) -> impl Future<Output = Result<Option<String>, LogError>> + Send;
    /// Follow a unit after `cursor`.
    fn follow(&self, cursor: Option<String>, unit: &str) -> Self::F;
    /// The unit's last `n` lines: its own output and its manager's messages about it.
    fn last_lines(&self, unit: &str, n: usize) -> impl Future<Output = Result<Vec<String>, LogError>> + Send;
}

/// HTTP checks of workers and the router.
pub trait Probes: Send + Sync {
    /// Worker `/health`.
    fn health(&self, url: &str) -> impl Future<Output = Health> + Send;
    /// Worker `/ready` (`None`: the server does not serve it).
    fn ready(&self, url: &str) -> impl Future<Output = Option<Health>> + Send;
    /// Worker `/metrics` KV gauges.
    fn kv(&self, url: &str) -> impl Future<Output = Result<KvReport, MetricsError>> + Send;
    /// Requests the worker is running or has queued.
    fn in_flight(&self, url: &str) -> impl Future<Output = Result<u64, HttpFailure>> + Send;
    /// Whether the worker accepts pdctl's calls that SGLang's `--api-key` guards (a `GET
    /// /server_info` with the worker's key, if one is configured).
    fn auth(&self, url: &str) -> impl Future<Output = Auth> + Send;
    /// Abort every request the worker runs (SGLang's `POST /abort_request {"abort_all": true}`).
    fn abort_all(&self, url: &str) -> impl Future<Output = Result<(), HttpFailure>> + Send;
    /// One request straight to a (regular) worker so that it publishes its gauges.
    fn warm_worker(&self, url: &str) -> impl Future<Output = Result<(), HttpFailure>> + Send;
    /// How many gateway replicas there are (`[router] url` may list several; 0: no router).
    fn replicas(&self) -> usize;
    /// Replica `r`'s worker list.
    fn router_workers(&self, r: usize) -> impl Future<Output = Result<Vec<RouterWorker>, HttpFailure>> + Send;
    /// Add a worker to replica `r`; returns its id there.
    fn register(&self, r: usize, url: &str, worker_type: &str, bootstrap_port: Option<u16>) -> impl Future<Output = Result<String, HttpFailure>> + Send;
    /// Replica `r` (smg 1.x) removes worker `id` at its next removal without keeping it listed
    /// `draining` first (its `drain_settle_secs` set to 0).
    fn settle_now(&self, r: usize, id: &str) -> impl Future<Output = Result<(), HttpFailure>> + Send;
    /// Remove a worker from replica `r` by its id there.
    fn deregister(&self, r: usize, id: &str) -> impl Future<Output = Result<(), HttpFailure>> + Send;
    /// Replica `r`'s circuit-breaker state of a worker (`None`: not exported).
    fn cb_state(&self, r: usize, url: &str) -> impl Future<Output = Result<Option<f64>, MetricsError>> + Send;
    /// Replica `r`'s workers whose circuit breaker is open (URLs; empty when not exported).
    fn open_breakers(&self, r: usize) -> impl Future<Output = Result<Vec<String>, MetricsError>> + Send;
    /// One small request through replica `r`.
    fn smoke(&self, r: usize, max_new_tokens: u32) -> impl Future<Output = Result<(), HttpFailure>> + Send;
    /// One PD request pair sent straight to a prefill and a decode, as the router sends it (the
    /// same `bootstrap_room` to both, the prefill's bootstrap address); each half waits at most
    /// `limit`.
    fn pair(&self, pair: PairTarget<'_>, limit: Duration) -> impl Future<Output = PairProbe> + Send;
    /// A worker's `/server_info`.
    fn server_info(&self, url: &str) -> impl Future<Output = Result<serde_json::Value, HttpFailure>> + Send;
    /// A prefill's PD queue gauges.
    fn pd_queues(&self, url: &str) -> impl Future<Output = Result<PdQueues, MetricsError>> + Send;
    /// Whether this process may open a TCP connection to `url`'s host and port at all (a unit's
    /// IP sandbox, `IPAddressAllow=`, refuses with EPERM before anything is sent).
    fn reach(&self, url: &str) -> impl Future<Output = Reach> + Send;
    /// A worker's service figures now (latency histograms, request counters; cumulative).
    fn service(&self, url: &str) -> impl Future<Output = Result<pdctl_parse::service::ServiceScrape, MetricsError>> + Send;
    /// The gateway's attempts to a worker, `(successes, failures)`, summed over the replicas that
    /// export them (`None`: none does, or no metrics URL is configured).
    fn gateway_outcomes(&self, url: &str) -> impl Future<Output = Option<(f64, f64)>> + Send;
    /// The gateway's own answers to clients, `(answered, failed with a 5xx)`, summed over the
    /// replicas that export them (`None`: none does, or no metrics URL is configured).
    fn gateway_responses(&self) -> impl Future<Output = Option<(f64, f64)>> + Send;
    /// A worker's `/model_info`: `(model_path, weight_version)`.
    fn model_info(&self, url: &str) -> impl Future<Output = Result<(String, String), HttpFailure>> + Send;
    /// The role a worker runs now (`/model_info`, which follows a runtime role switch; `None`:
    /// not reported, or not a PD role).
    fn running_role(&self, url: &str) -> impl Future<Output = Result<Option<pdctl_contract::records::Role>, HttpFailure>> + Send;
    /// A decode's captured CUDA graphs' footprint in GB (`sglang:graph_memory_usage_gb`, its
    /// decode phases; `None`: not exported or nothing captured): what a flip to decode asks for.
    fn decode_graph_gb(&self, url: &str) -> impl Future<Output = Result<Option<f64>, MetricsError>> + Send;
    /// `POST /pd_role_switch` (`sglang::role_switch` says what the answers mean), within `limit`: the server's
    /// answer, a refusal included.
    fn role_switch(&self, url: &str, ask: &crate::wire::Ask, limit: Duration) -> impl Future<Output = Result<crate::wire::Answer, HttpFailure>> + Send;
    /// `POST /pause_generation {"mode": mode}`, within `limit`.
    fn pause(&self, url: &str, mode: PauseMode, limit: Duration) -> impl Future<Output = Result<(), HttpFailure>> + Send;
    /// `POST /continue_generation`, within `limit`.
    fn resume(&self, url: &str, limit: Duration) -> impl Future<Output = Result<(), HttpFailure>> + Send;
    /// `POST /update_weights_from_disk` (`version`: its `weight_version`), within `limit`: the
    /// server's message, or why it refused.
    fn update_weights(&self, url: &str, model_path: &str, version: Option<&str>, limit: Duration) -> impl Future<Output = Result<String, HttpFailure>> + Send;
    /// `POST /flush_cache`, within `limit`: `true` flushed, `false` refused (requests still
    /// running or waiting).
    fn flush_cache(&self, url: &str, limit: Duration) -> impl Future<Output = Result<bool, HttpFailure>> + Send;
}

/// What a worker said to a call its `--api-key` guards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// Any answer but 401/403.
    Accepted,
    /// 401 or 403: the key is missing or wrong.
    Rejected {
        /// The URL called.
        endpoint: String,
        /// The status.
        status: u16,
        /// Which key pdctl sent, in words (never the key).
        key: String,
    },
    /// No answer (the worker is down: other gates say so).
    Unknown(String),
}

/// What a bare TCP connect to an address said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Connected (or refused by the peer: the path is open).
    Open,
    /// This process is not allowed to connect there (EPERM: an IP sandbox).
    Blocked(String),
    /// Anything else (timeout, unresolvable): not this check's business.
    Unknown(String),
}

/// The two servers of a pair probe.
#[derive(Debug, Clone, Copy)]
pub struct PairTarget<'a> {
    /// The prefill's HTTP URL.
    pub prefill_url: &'a str,
    /// Its bootstrap host (the host of its URL, as the router derives it).
    pub bootstrap_host: &'a str,
    /// Its bootstrap port.
    pub bootstrap_port: u16,
    /// The decode's HTTP URL.
    pub decode_url: &'a str,
    /// The room both halves carry.
    pub room: u64,
    /// Tokens the decode generates (1 for a probe; more for a warm-up: a PD decode publishes
    /// its gauges every 40 decode steps).
    pub max_new_tokens: u32,
}

/// A boxed future (for the object-safe [`Coordinator`]).
pub type BoxFut<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A key of the fleet's store as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of its last change.
    pub mod_revision: i64,
}

/// One change of an all-or-nothing compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasChange {
    /// The key.
    pub key: String,
    /// Its mod revision when read (0: absent); the whole transaction fails if it moved. A
    /// negative value: not compared (a key written along, whatever its revision).
    pub expect: i64,
    /// What to write.
    pub write: Write,
}

/// What a [`CasChange`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Nothing: the key is only compared.
    Keep,
    /// This value.
    Put(Vec<u8>),
    /// Delete the key.
    Delete,
}

/// Why the fleet's store did not give pdctl what it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetFailure {
    /// etcd did not answer or refused the call (the driver's sentence, with what to do).
    Unreachable(String),
    /// A credential file named in `[fleet]` cannot be read (its sentence).
    Credentials(String),
    /// `key` holds a value pdctl cannot decode (another version's, or not pdctl's).
    Unreadable {
        /// The key.
        key: String,
        /// The decoder's error.
        error: String,
    },
    /// `key` kept changing under every compare-and-swap pdctl tried, bounded.
    Contended {
        /// The key.
        key: String,
        /// What pdctl tried (`"while pdctl tried to read it"`; empty: a change).
        doing: String,
    },
}

impl std::fmt::Display for FleetFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetFailure::Unreachable(s) | FleetFailure::Credentials(s) => f.write_str(s),
            FleetFailure::Unreadable { key, error } => write!(f, "{key} holds a value pdctl cannot read ({error}); inspect it with `etcdctl get {key}`"),
            FleetFailure::Contended { key, doing } if doing.is_empty() => write!(f, "{key} kept changing"),
            FleetFailure::Contended { key, doing } => write!(f, "{key} kept changing {doing}"),
        }
    }
}

/// The fleet's replicated store (etcd v3): reads and all-or-nothing compare-and-swap.
pub trait Coordinator: Send + Sync {
    /// One key (`None`: absent).
    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Result<Option<KvEntry>, FleetFailure>>;
    /// Every key under a prefix.
    fn get_prefix<'a>(&'a self, prefix: &'a str) -> BoxFut<'a, Result<Vec<KvEntry>, FleetFailure>>;
    /// Apply all changes iff no key moved since it was read; whether they applied.
    fn cas(&self, changes: Vec<CasChange>) -> BoxFut<'_, Result<bool, FleetFailure>>;
    /// The store's revision now: every change made after this call is newer. Without a store
    /// that keeps revisions: 0 (and [`Coordinator::watch`] polls).
    fn revision(&self) -> BoxFut<'_, Result<i64, FleetFailure>> {
        Box::pin(async { Ok(0) })
    }
    /// Watch `keys` (`(key, true)`: every key under a prefix) for the changes made after
    /// revision `after` (none is missed between a read at `after` and the watch). Without a
    /// store that can watch: a [`Polling`] watch (it says nothing, after a second: read again).
    fn watch(&self, keys: Vec<(String, bool)>, after: i64) -> BoxFut<'_, Result<Box<dyn ChangeWatch>, FleetFailure>> {
        let _ = (keys, after);
        Box::pin(async { Ok(Box::new(Polling) as Box<dyn ChangeWatch>) })
    }
}

/// One change a [`ChangeWatch`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvChange {
    /// The key.
    pub key: String,
    /// Its new value; `None`: deleted.
    pub value: Option<Vec<u8>>,
    /// The change's revision.
    pub revision: i64,
}

/// A watch made by [`Coordinator::watch`].
pub trait ChangeWatch: Send {
    /// The next changes, or `None` when `limit` passed first (or the watch cannot tell: read
    /// again). An error: the watch ended (read again, then watch again).
    fn next(&mut self, limit: Duration) -> BoxFut<'_, Result<Option<Vec<KvChange>>, FleetFailure>>;
}

/// The watch of a store that cannot watch: every `next` waits up to a second and says nothing.
pub struct Polling;

impl ChangeWatch for Polling {
    fn next(&mut self, limit: Duration) -> BoxFut<'_, Result<Option<Vec<KvChange>>, FleetFailure>> {
        Box::pin(async move {
            tokio::time::sleep(limit.min(Duration::from_secs(1))).await;
            Ok(None)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_states_keep_their_names_and_an_unknown_one_is_kept_by_name() {
        for s in ["active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance"] {
            assert_eq!(ActiveState::from(s).as_str(), s);
        }
        for s in ["running", "auto-restart", "dead", "stop-sigterm"] {
            assert_eq!(SubState::from(s).to_string(), s);
        }
        assert_eq!(ActiveState::from("failed"), ActiveState::Failed);
        assert_eq!(ActiveState::from("maintenance"), ActiveState::Other("maintenance".into()));
        assert_eq!(SubState::from("auto-restart"), SubState::AutoRestart);
        assert_eq!((ActiveState::default(), SubState::default()), (ActiveState::Inactive, SubState::Dead));
        assert_eq!(JobResult::from("done"), JobResult::Done);
        assert_eq!(JobResult::from("canceled").to_string(), "canceled");
        assert_eq!(ServiceResult::from("start-limit-hit"), ServiceResult::StartLimitHit);
        assert_eq!(ServiceResult::from("exit-code"), ServiceResult::Other("exit-code".into()));
    }
}
