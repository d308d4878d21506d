//! The `Units` port over `pdctl-systemd` (systemd's D-Bus API): a unit's state, its
//! configuration as systemd has it, its jobs and its property changes, in core's types.

use std::future::Future;
use std::time::Duration;

use pdctl_systemd::{Systemd, UnitWatch};

use pdctl_core::config::{BusSetting, Settings};
use pdctl_core::ports::{JobOutcome, UnitConfig, UnitState, Units, UnitsError, Watch};

fn units_error(e: pdctl_systemd::Error) -> UnitsError {
    use pdctl_systemd::Error as E;
    let m = e.to_string();
    match e {
        E::NoSuchUnit { .. } => UnitsError::NoSuchUnit(m),
        E::Unreachable { .. } => UnitsError::Unreachable(m),
        E::AccessDenied { .. } | E::InteractiveAuth { .. } => UnitsError::Denied(m),
        E::Timeout { .. } => UnitsError::Timeout(m),
        E::Other { .. } => UnitsError::Refused(m),
    }
}

fn unit_config(c: pdctl_systemd::UnitConfig) -> UnitConfig {
    use pdctl_core::sglang::launch_config;
    let mut config_files = Vec::new();
    let mut launch_config_error = None;
    let exec_start_words = c.exec_start.clone();
    let exec_start = c
        .exec_start
        .into_iter()
        .map(|argv| {
            config_files.extend(launch_config::config_path(&argv).map(String::from));
            launch_config::expand(&argv, read_config_file).unwrap_or_else(|e| {
                launch_config_error = Some(e.to_string());
                argv
            })
        })
        .collect();
    UnitConfig {
        exec_start,
        exec_start_words,
        config_files,
        launch_config_error,
        environment: c.environment,
        environment_files: c.environment_files,
        fragment_path: c.fragment_path,
        drop_in_paths: c.drop_in_paths,
        need_daemon_reload: c.need_daemon_reload,
        timeout_stop: (c.timeout_stop_us != u64::MAX).then(|| std::time::Duration::from_micros(c.timeout_stop_us)),
        kill_mode: (!c.kill_mode.is_empty()).then_some(c.kill_mode),
    }
}

/// A `--config` file's text, at most [`pdctl_core::sglang::launch_config::MAX_BYTES`].
fn read_config_file(path: &str) -> Result<String, String> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    f.take(pdctl_core::sglang::launch_config::MAX_BYTES + 1).read_to_string(&mut text).map_err(|e| e.to_string())?;
    if text.len() as u64 > pdctl_core::sglang::launch_config::MAX_BYTES {
        return Err(format!("larger than {} bytes: not a server config", pdctl_core::sglang::launch_config::MAX_BYTES));
    }
    Ok(text)
}

/// systemd over D-Bus.
#[derive(Debug, Clone)]
pub struct SystemdUnits(pub Systemd);

/// A D-Bus PropertiesChanged stream.
pub struct DbusWatch(UnitWatch);

impl Watch for DbusWatch {
    fn changed(&mut self) -> impl Future<Output = Option<()>> + Send {
        self.0.changed()
    }
}

impl SystemdUnits {
    /// Connect to the manager `settings` name.
    pub async fn connect(settings: &Settings) -> Result<SystemdUnits, UnitsError> {
        Systemd::connect(&bus(settings)).await.map(SystemdUnits).map_err(units_error)
    }
}

impl Units for SystemdUnits {
    type W = DbusWatch;
    async fn state(&self, unit: &str) -> Result<UnitState, UnitsError> {
        self.0.state(unit).await.map_err(units_error)
    }
    async fn config(&self, unit: &str) -> Result<UnitConfig, UnitsError> {
        self.0.config(unit).await.map(unit_config).map_err(units_error)
    }
    async fn reload(&self) -> Result<(), UnitsError> {
        self.0.reload().await.map_err(units_error)
    }
    async fn reset_failed(&self, unit: &str) -> Result<(), UnitsError> {
        self.0.reset_failed(unit).await.map_err(units_error)
    }
    async fn watch(&self, unit: &str) -> Result<DbusWatch, UnitsError> {
        self.0.watch(unit).await.map(DbusWatch).map_err(units_error)
    }
    async fn restart(&self, unit: &str, job_timeout: Duration) -> Result<JobOutcome, UnitsError> {
        let o = self.0.restart(unit, job_timeout).await.map_err(units_error)?;
        Ok(JobOutcome { job_result: o.job_result.into(), job_time: o.job_time, state: o.state })
    }
    async fn stop(&self, unit: &str, job_timeout: Duration) -> Result<JobOutcome, UnitsError> {
        let o = self.0.stop(unit, job_timeout).await.map_err(units_error)?;
        Ok(JobOutcome { job_result: o.job_result.into(), job_time: o.job_time, state: o.state })
    }
    async fn start(&self, unit: &str, job_timeout: Duration) -> Result<JobOutcome, UnitsError> {
        let o = self.0.start(unit, job_timeout).await.map_err(units_error)?;
        Ok(JobOutcome { job_result: o.job_result.into(), job_time: o.job_time, state: o.state })
    }
}
/// The bus `settings` name.
pub fn bus(settings: &Settings) -> pdctl_systemd::Bus {
    match &settings.bus {
        BusSetting::System => pdctl_systemd::Bus::System,
        BusSetting::User => pdctl_systemd::Bus::User,
        BusSetting::Address(a) => pdctl_systemd::Bus::Address(a.clone()),
    }
}
