//! `pdctl-systemd`: systemd over D-Bus (zbus), and nothing else.
//!
//! Connect to the system bus, the caller's user bus, or an explicit address; restart a unit with
//! job tracking (streams opened *before* `RestartUnit`, our job matched by path); watch a unit for
//! changes (PropertiesChanged as a wake-up, then uncached reads — zbus's cache goes stale with
//! systemd); read a unit's configuration; daemon-reload; reset a failed unit. Every call has a
//! timeout, and errors are one sentence that says what to do. What a state means (a crash, a
//! restart behind our back) is decided in pdctl-core, not here.

#![warn(missing_docs)]

use std::time::Duration;

use futures_util::StreamExt as _;
use zbus::proxy::CacheProperties;
use zbus::{Connection, OwnedObjectPath};

pub use pdctl_parse::systemd::UnitState;

/// Timeout of one D-Bus call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of a daemon-reload (it answers when the reload is over).
pub const RELOAD_TIMEOUT: Duration = Duration::from_secs(90);

#[zbus::proxy(interface = "org.freedesktop.systemd1.Manager", default_service = "org.freedesktop.systemd1", default_path = "/org/freedesktop/systemd1")]
trait Manager {
    fn subscribe(&self) -> zbus::Result<()>;
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    fn reload(&self) -> zbus::Result<()>;
    #[zbus(signal)]
    fn job_removed(&self, id: u32, job: OwnedObjectPath, unit: String, result: String) -> zbus::Result<()>;
}

#[zbus::proxy(interface = "org.freedesktop.systemd1.Unit", default_service = "org.freedesktop.systemd1", assume_defaults = false)]
trait Unit {
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
    #[zbus(property, name = "InvocationID")]
    fn invocation_id(&self) -> zbus::Result<Vec<u8>>;
    #[zbus(property)]
    fn active_enter_timestamp(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn active_exit_timestamp(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn inactive_enter_timestamp(&self) -> zbus::Result<u64>;
    #[zbus(property(emits_changed_signal = "false"))]
    fn need_daemon_reload(&self) -> zbus::Result<bool>;
    #[zbus(property(emits_changed_signal = "const"))]
    fn fragment_path(&self) -> zbus::Result<String>;
    #[zbus(property(emits_changed_signal = "const"))]
    fn drop_in_paths(&self) -> zbus::Result<Vec<String>>;
}

type ExecCommand = (String, Vec<String>, bool, u64, u64, u64, u64, u32, i32, i32);

#[zbus::proxy(interface = "org.freedesktop.systemd1.Service", default_service = "org.freedesktop.systemd1", assume_defaults = false)]
trait Service {
    #[zbus(property, name = "MainPID")]
    fn main_pid(&self) -> zbus::Result<u32>;
    #[zbus(property, name = "ExecMainPID")]
    fn exec_main_pid(&self) -> zbus::Result<u32>;
    #[zbus(property, name = "NRestarts")]
    fn n_restarts(&self) -> zbus::Result<u32>;
    #[zbus(property)]
    fn result(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn exec_main_code(&self) -> zbus::Result<i32>;
    #[zbus(property)]
    fn exec_main_status(&self) -> zbus::Result<i32>;
    #[zbus(property)]
    fn exec_main_start_timestamp(&self) -> zbus::Result<u64>;
    #[zbus(property(emits_changed_signal = "invalidates"))]
    fn exec_start(&self) -> zbus::Result<Vec<ExecCommand>>;
    #[zbus(property(emits_changed_signal = "const"))]
    fn environment(&self) -> zbus::Result<Vec<String>>;
    #[zbus(property(emits_changed_signal = "const"), name = "TimeoutStopUSec")]
    fn timeout_stop_usec(&self) -> zbus::Result<u64>;
    #[zbus(property(emits_changed_signal = "const"))]
    fn environment_files(&self) -> zbus::Result<Vec<(String, bool)>>;
    #[zbus(property(emits_changed_signal = "const"))]
    fn kill_mode(&self) -> zbus::Result<String>;
}

/// Which bus reaches the service manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// The system bus (the system manager; production).
    System,
    /// The caller's session bus (its own user manager, like `systemctl --user`).
    User,
    /// An explicit D-Bus address, e.g. `unix:path=/proc/PID/root/run/user/0/bus` (a sandbox).
    Address(String),
}

impl std::fmt::Display for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bus::System => f.write_str("system bus"),
            Bus::User => f.write_str("user (session) bus"),
            Bus::Address(a) => write!(f, "bus at {a}"),
        }
    }
}

/// What went wrong talking to systemd, each with what to do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The bus cannot be reached.
    #[error("cannot reach systemd on the {bus}: {detail}; check that D-Bus runs and that [systemd] bus is right (\"system\" for system units, \"user\" for `systemctl --user` units)")]
    Unreachable {
        /// Which bus.
        bus: String,
        /// The connection error.
        detail: String,
    },
    /// The unit does not exist.
    #[error("unit {unit} does not exist ({detail}); check the name in the config against `systemctl list-unit-files`")]
    NoSuchUnit {
        /// The unit.
        unit: String,
        /// systemd's message.
        detail: String,
    },
    /// Permission denied.
    #[error("permission denied to {action} {unit}: polkit does not let this account do it; where pdctld runs as its own user, `pdctl polkit-rule --write` writes the rule for the configured units, else run pdctld as root")]
    AccessDenied {
        /// What was attempted.
        action: String,
        /// The unit.
        unit: String,
    },
    /// polkit wants an interactive password.
    #[error("systemd asks for interactive authentication to {action} {unit}: polkit's rules do not let this account do it; where pdctld runs as its own user, `pdctl polkit-rule --write` writes the rule for the configured units, else run pdctld as root")]
    InteractiveAuth {
        /// What was attempted.
        action: String,
        /// The unit.
        unit: String,
    },
    /// A call took longer than its timeout.
    #[error("systemd did not answer {what} within {after:?}; the manager may be busy or hung (check `systemctl status`)")]
    Timeout {
        /// The call.
        what: String,
        /// The timeout.
        after: Duration,
    },
    /// Anything else systemd or the bus said.
    #[error("systemd refused to {action} {unit}: {detail}")]
    Other {
        /// What was attempted.
        action: String,
        /// The unit (or the manager).
        unit: String,
        /// The error text.
        detail: String,
    },
}

impl Error {
    /// True for errors that mean "cannot reach systemd / permission denied" (CLI exit code 3).
    pub fn is_access(&self) -> bool {
        matches!(self, Error::Unreachable { .. } | Error::AccessDenied { .. } | Error::InteractiveAuth { .. } | Error::Timeout { .. })
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

fn classify(e: zbus::Error, action: &str, unit: &str) -> Error {
    match e {
        zbus::Error::MethodError(name, msg, _) if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" => {
            Error::NoSuchUnit { unit: unit.into(), detail: msg.unwrap_or_default() }
        }
        zbus::Error::FDO(fdo) => match *fdo {
            zbus::fdo::Error::AccessDenied(_) => Error::AccessDenied { action: action.into(), unit: unit.into() },
            zbus::fdo::Error::InteractiveAuthorizationRequired(_) => Error::InteractiveAuth { action: action.into(), unit: unit.into() },
            other => Error::Other { action: action.into(), unit: unit.into(), detail: other.to_string() },
        },
        other => Error::Other { action: action.into(), unit: unit.into(), detail: other.to_string() },
    }
}

async fn call<T>(action: &str, unit: &str, limit: Duration, f: impl std::future::Future<Output = zbus::Result<T>>) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| classify(e, action, unit)),
        Err(_) => Err(Error::Timeout { what: format!("{action} {unit}"), after: limit }),
    }
}

/// A unit's configuration as systemd parsed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitConfig {
    /// argv of each ExecStart= command.
    pub exec_start: Vec<Vec<String>>,
    /// `KEY=value` from Environment= (unit and drop-ins merged).
    pub environment: Vec<String>,
    /// EnvironmentFile= paths (and whether missing is ignored).
    pub environment_files: Vec<(String, bool)>,
    /// The unit file.
    pub fragment_path: String,
    /// Drop-ins.
    pub drop_in_paths: Vec<String>,
    /// The unit file changed on disk since the last daemon-reload.
    pub need_daemon_reload: bool,
    /// `TimeoutStopSec=` in µs (`u64::MAX`: infinity): how long a stop may take before SIGKILL.
    pub timeout_stop_us: u64,
    /// `KillMode=`: `control-group` (systemd's default: SIGTERM to every process of the unit),
    /// `mixed` (SIGTERM to the main process, SIGKILL to the rest only at the end), `process`,
    /// `none`.
    pub kill_mode: String,
}

/// A job pdctl queues for a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobKind {
    Restart,
    Stop,
    Start,
}

impl JobKind {
    fn as_str(self) -> &'static str {
        match self {
            JobKind::Restart => "restart",
            JobKind::Stop => "stop",
            JobKind::Start => "start",
        }
    }
}

/// How our job (a restart, stop or start) ended.
#[derive(Debug, Clone)]
pub struct RestartOutcome {
    /// The job's result: `done`, `failed`, `timeout`, `canceled`, `dependency`, `skipped`, …
    pub job_result: String,
    /// Time from the call to our JobRemoved.
    pub job_time: Duration,
    /// The unit right after the job (uncached).
    pub state: UnitState,
}

/// A connection to one service manager.
#[derive(Clone)]
pub struct Systemd {
    conn: Connection,
    bus: Bus,
    manager: ManagerProxy<'static>,
}

impl std::fmt::Debug for Systemd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Systemd").field("bus", &self.bus).finish()
    }
}

/// Wakes up whenever one unit's properties change (a PropertiesChanged signal).
pub struct UnitWatch {
    stream: zbus::proxy::SignalStream<'static>,
}

impl UnitWatch {
    /// The next change notification; `None` if the bus connection ended.
    pub async fn changed(&mut self) -> Option<()> {
        self.stream.next().await.map(|_| ())
    }
}

impl Systemd {
    /// Connect to the manager on `bus` and `Subscribe()` to its signals.
    pub async fn connect(bus: &Bus) -> Result<Systemd> {
        let unreachable = |detail: String| Error::Unreachable { bus: bus.to_string(), detail };
        let fut = async {
            match bus {
                Bus::System => Connection::system().await,
                Bus::User => Connection::session().await,
                Bus::Address(a) => zbus::connection::Builder::address(a.as_str()).build().await,
            }
        };
        let conn = match tokio::time::timeout(CALL_TIMEOUT, fut).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Err(_) => return Err(unreachable(format!("no answer within {CALL_TIMEOUT:?}"))),
        };
        let manager = ManagerProxy::builder(&conn).cache_properties(CacheProperties::No).build().await.map_err(|e| unreachable(e.to_string()))?;
        call("subscribe to", "the manager", CALL_TIMEOUT, manager.subscribe()).await.map_err(|e| match e {
            Error::Other { detail, .. } => unreachable(detail),
            other => other,
        })?;
        Ok(Systemd { conn, bus: bus.clone(), manager })
    }

    /// The bus this connection uses.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    async fn unit_path(&self, unit: &str) -> Result<OwnedObjectPath> {
        call("load", unit, CALL_TIMEOUT, self.manager.load_unit(unit)).await
    }

    async fn proxies(&self, unit: &str) -> Result<(UnitProxy<'static>, ServiceProxy<'static>)> {
        let path = self.unit_path(unit).await?;
        let err = |e: zbus::Error| classify(e, "inspect", unit);
        let u = UnitProxy::builder(&self.conn).path(path.clone()).cache_properties(CacheProperties::No).build().await.map_err(err)?;
        let s = ServiceProxy::builder(&self.conn).path(path).cache_properties(CacheProperties::No).build().await.map_err(err)?;
        Ok((u, s))
    }

    /// The unit's state (uncached). A unit that does not exist is [`Error::NoSuchUnit`].
    pub async fn state(&self, unit: &str) -> Result<UnitState> {
        let (u, s) = self.proxies(unit).await?;
        let r = |what: &'static str| move |e: zbus::Error| classify(e, &format!("read {what} of"), "");
        let get = async {
            let st = UnitState {
                load_state: u.load_state().await.map_err(r("LoadState"))?,
                active_state: u.active_state().await.map_err(r("ActiveState"))?.into(),
                sub_state: u.sub_state().await.map_err(r("SubState"))?.into(),
                invocation_id: u.invocation_id().await.map_err(r("InvocationID"))?.iter().map(|b| format!("{b:02x}")).collect(),
                main_pid: s.main_pid().await.map_err(r("MainPID"))?,
                exec_main_pid: s.exec_main_pid().await.map_err(r("ExecMainPID"))?,
                n_restarts: s.n_restarts().await.map_err(r("NRestarts"))?,
                result: s.result().await.map_err(r("Result"))?.into(),
                exec_main_code: s.exec_main_code().await.map_err(r("ExecMainCode"))?,
                exec_main_status: s.exec_main_status().await.map_err(r("ExecMainStatus"))?,
                active_enter_us: u.active_enter_timestamp().await.map_err(r("ActiveEnterTimestamp"))?,
                exec_main_start_us: s.exec_main_start_timestamp().await.map_err(r("ExecMainStartTimestamp"))?,
                active_exit_us: u.active_exit_timestamp().await.map_err(r("ActiveExitTimestamp"))?,
                inactive_enter_us: u.inactive_enter_timestamp().await.map_err(r("InactiveEnterTimestamp"))?,
            };
            Ok::<_, Error>(st)
        };
        let st = match tokio::time::timeout(CALL_TIMEOUT, get).await {
            Ok(r) => r?,
            Err(_) => return Err(Error::Timeout { what: format!("reading the state of {unit}"), after: CALL_TIMEOUT }),
        };
        if st.load_state == "not-found" {
            return Err(Error::NoSuchUnit { unit: unit.into(), detail: "LoadState=not-found".into() });
        }
        Ok(st)
    }

    /// The unit's configuration (uncached: ExecStart/Environment are stale in a cache after reload).
    pub async fn config(&self, unit: &str) -> Result<UnitConfig> {
        let (u, s) = self.proxies(unit).await?;
        let r = |what: &'static str| move |e: zbus::Error| classify(e, &format!("read {what} of"), "");
        let get = async {
            Ok::<_, Error>(UnitConfig {
                exec_start: s.exec_start().await.map_err(r("ExecStart"))?.into_iter().map(|c| c.1).collect(),
                environment: s.environment().await.map_err(r("Environment"))?,
                timeout_stop_us: s.timeout_stop_usec().await.map_err(r("TimeoutStopUSec"))?,
                environment_files: s.environment_files().await.map_err(r("EnvironmentFiles"))?,
                kill_mode: s.kill_mode().await.map_err(r("KillMode"))?,
                fragment_path: u.fragment_path().await.map_err(r("FragmentPath"))?,
                drop_in_paths: u.drop_in_paths().await.map_err(r("DropInPaths"))?,
                need_daemon_reload: u.need_daemon_reload().await.map_err(r("NeedDaemonReload"))?,
            })
        };
        match tokio::time::timeout(CALL_TIMEOUT, get).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout { what: format!("reading the config of {unit}"), after: CALL_TIMEOUT }),
        }
    }

    /// `daemon-reload` (the reply comes when the reload is over).
    pub async fn reload(&self) -> Result<()> {
        call("reload", "the manager", RELOAD_TIMEOUT, self.manager.reload()).await
    }

    /// `ResetFailedUnit` (clears a start-limit hit).
    pub async fn reset_failed(&self, unit: &str) -> Result<()> {
        call("reset the failed state of", unit, CALL_TIMEOUT, self.manager.reset_failed_unit(unit)).await
    }

    /// Start watching `unit` for changes. Open it *before* acting on the unit.
    pub async fn watch(&self, unit: &str) -> Result<UnitWatch> {
        let path = self.unit_path(unit).await?;
        let props = zbus::fdo::PropertiesProxy::builder(&self.conn)
            .destination("org.freedesktop.systemd1")
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| classify(e, "watch", unit))?;
        let stream = call("watch", unit, CALL_TIMEOUT, async { props.inner().receive_signal("PropertiesChanged").await }).await?;
        Ok(UnitWatch { stream })
    }

    /// `RestartUnit(unit, "replace")` and wait (at most `job_timeout`) for *our* job's JobRemoved.
    /// The JobRemoved stream is opened before the call, so fast jobs are not missed.
    pub async fn restart(&self, unit: &str, job_timeout: Duration) -> Result<RestartOutcome> {
        self.job(JobKind::Restart, unit, job_timeout).await
    }

    /// `StopUnit(unit, "replace")`, waited for as [`Systemd::restart`] is.
    pub async fn stop(&self, unit: &str, job_timeout: Duration) -> Result<RestartOutcome> {
        self.job(JobKind::Stop, unit, job_timeout).await
    }

    /// `StartUnit(unit, "replace")`, waited for as [`Systemd::restart`] is.
    pub async fn start(&self, unit: &str, job_timeout: Duration) -> Result<RestartOutcome> {
        self.job(JobKind::Start, unit, job_timeout).await
    }

    /// Queue a `kind` job for `unit` (mode `replace`) and wait, at most `job_timeout`, for its
    /// JobRemoved (the stream opened before the call, so a fast job is not missed).
    async fn job(&self, kind: JobKind, unit: &str, job_timeout: Duration) -> Result<RestartOutcome> {
        let what = kind.as_str();
        let mut removed = call("subscribe to jobs for", unit, CALL_TIMEOUT, self.manager.receive_job_removed()).await?;
        let started = std::time::Instant::now();
        let job = match kind {
            JobKind::Restart => call(what, unit, CALL_TIMEOUT, self.manager.restart_unit(unit, "replace")).await?,
            JobKind::Stop => call(what, unit, CALL_TIMEOUT, self.manager.stop_unit(unit, "replace")).await?,
            JobKind::Start => call(what, unit, CALL_TIMEOUT, self.manager.start_unit(unit, "replace")).await?,
        };
        tracing::debug!(unit, job = job.as_str(), "{what} job queued");
        let wait = async {
            while let Some(sig) = removed.next().await {
                if let Ok(a) = sig.args() {
                    if a.job.as_str() == job.as_str() {
                        return Some(a.result.clone());
                    }
                }
            }
            None
        };
        let job_result = match tokio::time::timeout(job_timeout, wait).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Err(Error::Unreachable { bus: self.bus.to_string(), detail: format!("the bus connection closed while waiting for the {what} job") })
            }
            Err(_) => return Err(Error::Timeout { what: format!("the {what} job of {unit}"), after: job_timeout }),
        };
        let job_time = started.elapsed();
        let state = self.state(unit).await?;
        Ok(RestartOutcome { job_result, job_time, state })
    }
}
