//! The small traits the engine talks through — systemd, the journal, the HTTP probes — and their
//! real implementations over `pdctl-systemd`, `pdctl-journal` and `pdctl-probe`. Unit tests of
//! the engine use in-memory fakes behind the same traits.

use std::future::Future;
use std::time::Duration;

use pdctl_journal::{Entry, Follower, Source};
use pdctl_probe::kv::KvReport;
use pdctl_probe::{Health, Http, HttpError, MetricsProblem, Router, RouterWorker};
use pdctl_systemd::{RestartOutcome, Systemd, UnitConfig, UnitState, UnitWatch};

pub use pdctl_journal::Error as JournalError;
pub use pdctl_systemd::Error as SystemdError;

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
    fn state(&self, unit: &str) -> impl Future<Output = Result<UnitState, SystemdError>> + Send;
    /// Parsed configuration.
    fn config(&self, unit: &str) -> impl Future<Output = Result<UnitConfig, SystemdError>> + Send;
    /// daemon-reload.
    fn reload(&self) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// ResetFailedUnit.
    fn reset_failed(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// Start watching (before acting).
    fn watch(&self, unit: &str) -> impl Future<Output = Result<Self::W, SystemdError>> + Send;
    /// Restart and wait for our job.
    fn restart(&self, unit: &str, job_timeout: Duration) -> impl Future<Output = Result<RestartOutcome, SystemdError>> + Send;
}

/// A stream of journal entries for one unit.
pub trait Follow: Send {
    /// The next entry.
    fn next(&mut self) -> impl Future<Output = Option<Result<Entry, JournalError>>> + Send;
}

/// The journal.
pub trait Logs: Send + Sync {
    /// Follower type.
    type F: Follow;
    /// The tail cursor (take it before the restart).
    fn tail_cursor(&self) -> impl Future<Output = Result<Option<String>, JournalError>> + Send;
    /// Follow a unit after `cursor`.
    fn follow(&self, cursor: Option<String>, unit: &str) -> Self::F;
    /// The unit's last `n` lines.
    fn last_lines(&self, unit: &str, n: usize) -> impl Future<Output = Result<Vec<String>, JournalError>> + Send;
}

/// HTTP checks of workers and the router.
pub trait Probes: Send + Sync {
    /// Worker `/health`.
    fn health(&self, url: &str) -> impl Future<Output = Health> + Send;
    /// Worker `/metrics` KV gauges.
    fn kv(&self, url: &str) -> impl Future<Output = Result<KvReport, MetricsProblem>> + Send;
    /// Worker `/get_load`: requests running + queued.
    fn in_flight(&self, url: &str) -> impl Future<Output = Result<u64, HttpError>> + Send;
    /// One request straight to a worker (regular workers) to make it publish its gauges.
    fn warm_worker(&self, url: &str) -> impl Future<Output = Result<(), HttpError>> + Send;
    /// Router `GET /workers`.
    fn router_workers(&self) -> impl Future<Output = Result<Vec<RouterWorker>, HttpError>> + Send;
    /// Router `POST /workers`.
    fn register(&self, url: &str, worker_type: &str, bootstrap_port: Option<u16>) -> impl Future<Output = Result<String, HttpError>> + Send;
    /// Router `DELETE /workers/{id}`.
    fn deregister(&self, id: &str) -> impl Future<Output = Result<(), HttpError>> + Send;
    /// Router circuit-breaker state of a worker (`None`: no metrics URL or no series).
    fn cb_state(&self, url: &str) -> impl Future<Output = Result<Option<f64>, MetricsProblem>> + Send;
    /// One small request through the router.
    fn smoke(&self, max_new_tokens: u32) -> impl Future<Output = Result<(), HttpError>> + Send;
}

impl Watch for UnitWatch {
    fn changed(&mut self) -> impl Future<Output = Option<()>> + Send {
        UnitWatch::changed(self)
    }
}

impl Units for Systemd {
    type W = UnitWatch;
    fn state(&self, unit: &str) -> impl Future<Output = Result<UnitState, SystemdError>> + Send {
        Systemd::state(self, unit)
    }
    fn config(&self, unit: &str) -> impl Future<Output = Result<UnitConfig, SystemdError>> + Send {
        Systemd::config(self, unit)
    }
    fn reload(&self) -> impl Future<Output = Result<(), SystemdError>> + Send {
        Systemd::reload(self)
    }
    fn reset_failed(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send {
        Systemd::reset_failed(self, unit)
    }
    fn watch(&self, unit: &str) -> impl Future<Output = Result<UnitWatch, SystemdError>> + Send {
        Systemd::watch(self, unit)
    }
    fn restart(&self, unit: &str, job_timeout: Duration) -> impl Future<Output = Result<RestartOutcome, SystemdError>> + Send {
        Systemd::restart(self, unit, job_timeout)
    }
}

impl Follow for Follower {
    fn next(&mut self) -> impl Future<Output = Option<Result<Entry, JournalError>>> + Send {
        Follower::next(self)
    }
}

/// The journal on this host or in a directory.
#[derive(Debug, Clone)]
pub struct Journald(pub Source);

impl Logs for Journald {
    type F = Follower;
    fn tail_cursor(&self) -> impl Future<Output = Result<Option<String>, JournalError>> + Send {
        pdctl_journal::tail_cursor(&self.0)
    }
    fn follow(&self, cursor: Option<String>, unit: &str) -> Follower {
        Follower::start(&self.0, cursor, unit)
    }
    fn last_lines(&self, unit: &str, n: usize) -> impl Future<Output = Result<Vec<String>, JournalError>> + Send {
        pdctl_journal::last_lines(&self.0, unit, n)
    }
}

/// Real HTTP probes.
#[derive(Debug, Clone)]
pub struct HttpProbes {
    /// Client.
    pub http: Http,
    /// The router, if configured.
    pub router: Option<Router>,
}

fn no_router() -> HttpError {
    HttpError::Unreachable { url: "(router)".into(), detail: "no [router] url is configured".into() }
}

impl Probes for HttpProbes {
    async fn health(&self, url: &str) -> Health {
        pdctl_probe::health(&self.http, url).await
    }
    async fn kv(&self, url: &str) -> Result<KvReport, MetricsProblem> {
        pdctl_probe::kv_metrics(&self.http, url).await
    }
    async fn in_flight(&self, url: &str) -> Result<u64, HttpError> {
        let u = format!("{url}/get_load");
        let v = self.http.get_json(&u).await?;
        let list = v.as_array().cloned().unwrap_or_default();
        Ok(list.iter().map(|r| r.get("num_reqs").and_then(|x| x.as_u64()).unwrap_or(0) + r.get("num_waiting_reqs").and_then(|x| x.as_u64()).unwrap_or(0)).sum())
    }
    async fn warm_worker(&self, url: &str) -> Result<(), HttpError> {
        let u = format!("{url}/generate");
        let (status, body) = self.http.post_json(&u, &serde_json::json!({"text": "pdctl warm-up", "sampling_params": {"max_new_tokens": 1}})).await?;
        if status == 200 {
            Ok(())
        } else {
            Err(HttpError::Status { url: u, status, body })
        }
    }
    async fn router_workers(&self) -> Result<Vec<RouterWorker>, HttpError> {
        match &self.router {
            Some(r) => r.workers(&self.http).await,
            None => Err(no_router()),
        }
    }
    async fn register(&self, url: &str, worker_type: &str, bootstrap_port: Option<u16>) -> Result<String, HttpError> {
        match &self.router {
            Some(r) => r.register(&self.http, url, worker_type, bootstrap_port).await,
            None => Err(no_router()),
        }
    }
    async fn deregister(&self, id: &str) -> Result<(), HttpError> {
        match &self.router {
            Some(r) => r.deregister(&self.http, id).await,
            None => Err(no_router()),
        }
    }
    async fn cb_state(&self, url: &str) -> Result<Option<f64>, MetricsProblem> {
        match &self.router {
            Some(r) => r.cb_state(&self.http, url).await,
            None => Ok(None),
        }
    }
    async fn smoke(&self, max_new_tokens: u32) -> Result<(), HttpError> {
        match &self.router {
            Some(r) => r.smoke(&self.http, max_new_tokens).await,
            None => Err(no_router()),
        }
    }
}

/// The engine over the real drivers.
pub type RealEngine = crate::engine::Engine<Systemd, Journald, HttpProbes>;

/// The bus `settings` name.
pub fn bus(settings: &crate::config::Settings) -> pdctl_systemd::Bus {
    match &settings.bus {
        crate::config::BusSetting::System => pdctl_systemd::Bus::System,
        crate::config::BusSetting::User => pdctl_systemd::Bus::User,
        crate::config::BusSetting::Address(a) => pdctl_systemd::Bus::Address(a.clone()),
    }
}

/// The journal `settings` name (a directory, else this host's).
pub fn journal(settings: &crate::config::Settings) -> Source {
    match &settings.journal_directory {
        Some(d) => Source::Directory(d.clone()),
        None => Source::Local,
    }
}

/// HTTP probes of the workers and the router `settings` name.
pub fn probes(settings: &crate::config::Settings) -> HttpProbes {
    HttpProbes {
        http: Http::new(pdctl_probe::REQUEST_TIMEOUT),
        router: settings.router.as_ref().map(|r| Router { url: r.url.clone(), metrics_url: r.metrics_url.clone() }),
    }
}

/// Connect the real drivers for `settings` (systemd on its bus, the journal, HTTP probes).
pub async fn connect(settings: crate::config::Settings) -> Result<RealEngine, SystemdError> {
    let units = Systemd::connect(&bus(&settings)).await?;
    Ok(crate::engine::Engine { units, logs: Journald(journal(&settings)), probes: probes(&settings), settings })
}
