//! The systemd port ([`Units`]): a unit's state, configuration and jobs, and what went wrong
//! talking to systemd.

use std::future::Future;
use std::time::Duration;

use crate::cause::Cause;
pub use pdctl_parse::systemd::{ActiveState, JobResult, ServiceResult, SubState, UnitState};

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
