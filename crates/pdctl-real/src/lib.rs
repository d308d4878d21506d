//! `pdctl-real`: pdctl-core's ports over the real drivers — `pdctl-systemd` (D-Bus),
//! `pdctl-journal` (libsystemd), `pdctl-probe` (HTTP), `pdctl-fleet` (etcd) — translating their
//! facts into core's types, and the one mapping from [`Settings`] to connected drivers, used by
//! the CLI and pdctld alike. pdctl-core decides and knows the drivers only through its ports
//! (`pdctl_core::ports`); this crate is the only place that connects the two.

#![warn(missing_docs)]

use std::time::Duration;

use pdctl_journal::{Follower, Source};
use pdctl_probe::{Http, HttpError, MetricsProblem, Router};

use pdctl_core::cause::MetricsDiagnosis;
use pdctl_core::config::Settings;
use pdctl_core::engine::Engine;
use pdctl_core::ports::{Auth, Follow, Health, HttpFailure, KvReport, LogEntry, LogError, Logs, MetricsError, PairTarget, Probes, RouterWorker, UnitsError};
use pdctl_core::sglang::pairing::{Half, PairProbe, PdQueues};

mod units;
pub use units::{bus, DbusWatch, SystemdUnits};

/// A libsystemd follower.
pub struct JournalFollow(Follower);

fn log_entry(e: pdctl_journal::Entry) -> LogEntry {
    LogEntry { realtime_us: e.realtime_us, read_at: e.read_at, fields: e.fields }
}

impl Follow for JournalFollow {
    async fn next(&mut self) -> Option<Result<LogEntry, LogError>> {
        self.0.next().await.map(|r| r.map(log_entry).map_err(|e| LogError(e.to_string())))
    }
}

/// The journal on this host or in a directory.
#[derive(Debug, Clone)]
pub struct Journald(pub Source);

impl Logs for Journald {
    type F = JournalFollow;
    async fn tail_cursor(&self) -> Result<Option<String>, LogError> {
        pdctl_journal::tail_cursor(&self.0).await.map_err(|e| LogError(e.to_string()))
    }
    async fn boot_head_cursor(&self, boot_id: &str) -> Result<Option<String>, LogError> {
        pdctl_journal::boot_head_cursor(&self.0, boot_id).await.map_err(|e| LogError(e.to_string()))
    }
    fn follow(&self, cursor: Option<String>, unit: &str) -> JournalFollow {
        JournalFollow(Follower::start(&self.0, cursor, unit))
    }
    async fn last_lines(&self, unit: &str, n: usize) -> Result<Vec<String>, LogError> {
        pdctl_journal::last_lines(&self.0, unit, n).await.map_err(|e| LogError(e.to_string()))
    }
}

/// Real HTTP probes.
#[derive(Debug, Clone)]
pub struct HttpProbes {
    /// Client.
    pub http: Http,
    /// The gateway's replicas, in config order (empty: no router).
    pub routers: Vec<Router>,
    /// Per worker URL: which key pdctl sends it, in words ("the key from /etc/…", "no key:
    /// cannot read …", "no key: api_key_file is not set") — never the key.
    pub key_notes: std::collections::BTreeMap<String, String>,
    /// Worker URLs whose configured key this process cannot read (the CLI of a user who may not
    /// read pdctld's key files), with why.
    pub unreadable_keys: std::collections::BTreeMap<String, String>,
}

impl HttpProbes {
    /// A pair probe's request that a half got no answer for, aborted by its rid on both servers
    /// (each call bounded by the client's timeout): what was done, in words.
    async fn abandon(&self, urls: &[&str; 2], room: u64) -> String {
        let rid = pdctl_probe::pair_rid(room);
        let (a, b) = tokio::join!(pdctl_probe::abort_rid(&self.http, urls[0], &rid), pdctl_probe::abort_rid(&self.http, urls[1], &rid));
        match (a, b) {
            (Ok(()), Ok(())) => format!("its request {rid} aborted on both servers"),
            (a, b) => {
                let why: Vec<String> = [a, b].into_iter().filter_map(Result::err).map(|e| admin_failure(e).0).collect();
                format!("its request {rid} could not be aborted on every server ({}): a prefill keeps its room until its bootstrap timeout", why.join("; "))
            }
        }
    }
}

fn failure(e: HttpError) -> HttpFailure {
    HttpFailure(e.to_string())
}

/// [`failure`] of a call to one of SGLang's admin routes ([`pdctl_core::sglang::ADMIN_ROUTES`]): a
/// refusal (401/403) says which key the route takes.
fn admin_failure(e: HttpError) -> HttpFailure {
    match &e {
        HttpError::Status { status: 401 | 403, .. } => HttpFailure(format!(
            "{e} — SGLang guards this route with --admin-api-key when the server has one (else with --api-key): set the worker's admin_api_key_file (or api_key_file) to the key the server was started with"
        )),
        _ => failure(e),
    }
}

fn no_router() -> HttpFailure {
    HttpFailure("no [router] url is configured".into())
}

fn metrics_error(p: MetricsProblem) -> MetricsError {
    use pdctl_probe::kv::KvProblem;
    let diagnosis = match &p {
        MetricsProblem::Disabled { .. } => MetricsDiagnosis::Disabled,
        MetricsProblem::Http(_) => MetricsDiagnosis::Unreachable,
        MetricsProblem::Unparseable { .. } => MetricsDiagnosis::Unparseable,
        MetricsProblem::Kv(KvProblem::NotPublished { .. } | KvProblem::RanksUnpublished { .. }) => MetricsDiagnosis::NotPublished,
        MetricsProblem::Kv(KvProblem::OtherNames { .. }) => MetricsDiagnosis::UnknownNames,
        MetricsProblem::Kv(KvProblem::Insane(_)) => MetricsDiagnosis::Insane,
    };
    let pending_ranks = match &p {
        MetricsProblem::Kv(KvProblem::RanksUnpublished { published, expected, .. }) => expected.saturating_sub(*published),
        _ => 0,
    };
    MetricsError { diagnosis, message: p.to_string(), pending_ranks }
}

impl Probes for HttpProbes {
    async fn health(&self, url: &str) -> Health {
        match pdctl_probe::health(&self.http, url).await {
            pdctl_probe::Health::Up => Health::Up,
            pdctl_probe::Health::Unavailable(s) => Health::Unavailable(s),
            pdctl_probe::Health::Down(s) => Health::Down(s),
        }
    }
    async fn ready(&self, url: &str) -> Option<Health> {
        pdctl_probe::ready(&self.http, url).await.map(|h| match h {
            pdctl_probe::Health::Up => Health::Up,
            pdctl_probe::Health::Unavailable(s) => Health::Unavailable(s),
            pdctl_probe::Health::Down(s) => Health::Down(s),
        })
    }
    async fn kv(&self, url: &str) -> Result<KvReport, MetricsError> {
        pdctl_probe::kv_metrics(&self.http, url).await.map_err(metrics_error)
    }
    async fn in_flight(&self, url: &str) -> Result<u64, HttpFailure> {
        pdctl_probe::in_flight(&self.http, url).await.map_err(failure)
    }
    async fn auth(&self, url: &str) -> Auth {
        // A key this process cannot read is not a wrong key: pdctld, which reads it, checks it.
        if let Some(why) = self.unreadable_keys.get(url.trim_end_matches('/')) {
            return Auth::Unknown(format!("its API key cannot be read here ({why}); pdctld, which reads it, checks it"));
        }
        let u = format!("{}/server_info", url.trim_end_matches('/'));
        match self.http.get(&u, None).await {
            Ok((status @ (401 | 403), _)) => {
                let key = self.key_notes.get(url.trim_end_matches('/')).cloned().unwrap_or_else(|| "no key: api_key_file is not set for this worker".into());
                Auth::Rejected { endpoint: u, status, key }
            }
            Ok(_) => Auth::Accepted,
            Err(e) => Auth::Unknown(e.to_string()),
        }
    }
    async fn abort_all(&self, url: &str) -> Result<(), HttpFailure> {
        pdctl_probe::abort_all(&self.http, url).await.map_err(admin_failure)
    }
    async fn warm_worker(&self, url: &str) -> Result<(), HttpFailure> {
        pdctl_probe::warm_worker(&self.http, url).await.map_err(failure)
    }
    fn replicas(&self) -> usize {
        self.routers.len()
    }
    async fn router_workers(&self, r: usize) -> Result<Vec<RouterWorker>, HttpFailure> {
        let router = self.routers.get(r).ok_or_else(no_router)?;
        router.workers(&self.http).await.map_err(failure)
    }
    async fn register(&self, r: usize, url: &str, worker_type: &str, bootstrap_port: Option<u16>) -> Result<String, HttpFailure> {
        self.routers.get(r).ok_or_else(no_router)?.register(&self.http, url, worker_type, bootstrap_port).await.map_err(failure)
    }
    async fn settle_now(&self, r: usize, id: &str) -> Result<(), HttpFailure> {
        self.routers.get(r).ok_or_else(no_router)?.set_drain_settle(&self.http, id, 0).await.map_err(failure)
    }
    async fn deregister(&self, r: usize, id: &str) -> Result<(), HttpFailure> {
        self.routers.get(r).ok_or_else(no_router)?.deregister(&self.http, id).await.map_err(failure)
    }
    async fn service(&self, url: &str) -> Result<pdctl_probe::service::ServiceScrape, MetricsError> {
        pdctl_probe::service_figures(&self.http, url).await.map_err(metrics_error)
    }
    async fn gateway_outcomes(&self, url: &str) -> Option<(f64, f64)> {
        let mut sum: Option<(f64, f64)> = None;
        for r in &self.routers {
            if let Ok(Some((ok, failed))) = r.outcomes(&self.http, url).await {
                let s = sum.get_or_insert((0.0, 0.0));
                s.0 += ok;
                s.1 += failed;
            }
        }
        sum
    }
    async fn gateway_responses(&self) -> Option<(f64, f64)> {
        let mut sum: Option<(f64, f64)> = None;
        for r in &self.routers {
            if let Ok(Some((all, failed))) = r.responses(&self.http).await {
                let s = sum.get_or_insert((0.0, 0.0));
                s.0 += all;
                s.1 += failed;
            }
        }
        sum
    }
    async fn open_breakers(&self, r: usize) -> Result<Vec<String>, MetricsError> {
        match self.routers.get(r) {
            Some(router) => router.open_breakers(&self.http).await.map_err(metrics_error),
            None => Ok(Vec::new()),
        }
    }
    async fn cb_state(&self, r: usize, url: &str) -> Result<Option<f64>, MetricsError> {
        match self.routers.get(r) {
            Some(router) => router.cb_state(&self.http, url).await.map_err(metrics_error),
            None => Ok(None),
        }
    }
    async fn smoke(&self, r: usize, max_new_tokens: u32) -> Result<(), HttpFailure> {
        self.routers.get(r).ok_or_else(no_router)?.smoke(&self.http, max_new_tokens).await.map_err(failure)
    }
    async fn pair(&self, t: PairTarget<'_>, limit: std::time::Duration) -> PairProbe {
        let t0 = std::time::Instant::now();
        let (p, d) = pdctl_probe::pd_pair(&self.http, t.prefill_url, t.decode_url, (t.bootstrap_host, t.bootstrap_port), t.room, t.max_new_tokens, limit).await;
        let half = |r: Result<(u16, String), pdctl_probe::HttpError>| match r {
            Ok((status, body)) => Half::Answered { status, body },
            Err(pdctl_probe::HttpError::Timeout { .. }) => Half::NoAnswer,
            Err(e) => Half::Unreachable { error: e.to_string() },
        };
        let (prefill, decode) = (half(p), half(d));
        let took = t0.elapsed();
        let abandoned = match prefill == Half::NoAnswer || decode == Half::NoAnswer {
            true => Some(self.abandon(&[t.prefill_url, t.decode_url], t.room).await),
            false => None,
        };
        PairProbe { room: t.room, prefill, decode, took, abandoned }
    }
    async fn model_info(&self, url: &str) -> Result<(String, String), HttpFailure> {
        pdctl_probe::weights::model_info(&self.http, url).await.map(|m| (m.model_path, m.weight_version)).map_err(failure)
    }
    async fn running_role(&self, url: &str) -> Result<Option<pdctl_core::config::Role>, HttpFailure> {
        use pdctl_core::config::Role;
        let mode = pdctl_probe::role::running_role(&self.http, url).await.map_err(failure)?;
        Ok(match mode.as_deref() {
            Some("prefill") => Some(Role::Prefill),
            Some("decode") => Some(Role::Decode),
            _ => None,
        })
    }
    async fn decode_graph_gb(&self, url: &str) -> Result<Option<f64>, MetricsError> {
        pdctl_probe::decode_graph_gb(&self.http, url).await.map_err(metrics_error)
    }
    async fn role_switch(
        &self,
        url: &str,
        ask: &pdctl_core::sglang::role_switch::Ask,
        limit: Duration,
    ) -> Result<pdctl_core::sglang::role_switch::Answer, HttpFailure> {
        let v = pdctl_probe::role::pd_role_switch(&self.http, url, &ask.body(), limit).await.map_err(admin_failure)?;
        pdctl_core::sglang::role_switch::Answer::of(&v).ok_or_else(|| HttpFailure(format!("{url}/pd_role_switch answered {v} (no success and message)")))
    }
    async fn pause(&self, url: &str, mode: pdctl_core::ports::PauseMode, limit: Duration) -> Result<(), HttpFailure> {
        pdctl_probe::weights::pause(&self.http, url, mode.as_str(), limit).await.map_err(admin_failure)
    }
    async fn resume(&self, url: &str, limit: Duration) -> Result<(), HttpFailure> {
        pdctl_probe::weights::resume(&self.http, url, limit).await.map_err(admin_failure)
    }
    async fn update_weights(&self, url: &str, model_path: &str, version: Option<&str>, limit: Duration) -> Result<String, HttpFailure> {
        pdctl_probe::weights::update_weights(&self.http, url, model_path, version, limit).await.map_err(admin_failure)
    }
    async fn flush_cache(&self, url: &str, limit: Duration) -> Result<bool, HttpFailure> {
        pdctl_probe::weights::flush_cache(&self.http, url, limit).await.map_err(admin_failure)
    }
    async fn server_info(&self, url: &str) -> Result<serde_json::Value, HttpFailure> {
        self.http.get_json(&format!("{}/server_info", url.trim_end_matches('/'))).await.map_err(failure)
    }
    async fn reach(&self, url: &str) -> pdctl_core::ports::Reach {
        use pdctl_core::ports::Reach;
        let Ok(c) = pdctl_core::config::canonical_url(url) else {
            return Reach::Unknown(format!("{url} is not a URL"));
        };
        let authority = c.split_once("://").map(|(_, r)| r).unwrap_or(&c).split('/').next().unwrap_or_default().to_string();
        match tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(authority.as_str())).await {
            Ok(Ok(_)) => Reach::Open,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => Reach::Blocked(format!("connect to {authority}: {e}")),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Reach::Open,
            Ok(Err(e)) => Reach::Unknown(e.to_string()),
            Err(_) => Reach::Unknown(format!("no answer from {authority} within 2s")),
        }
    }
    async fn pd_queues(&self, url: &str) -> Result<PdQueues, MetricsError> {
        // The live snapshot where the server has one (0.5.23); the gauges lag up to ~30 s.
        if let Ok(Some((held_reqs, used_tokens))) = pdctl_probe::pd_load(&self.http, url).await {
            return Ok(PdQueues { held_reqs, used_tokens, source: "/v1/loads" });
        }
        let u = format!("{}/metrics", url.trim_end_matches('/'));
        let text = pdctl_probe::fetch_metrics(&self.http, &u).await.map_err(metrics_error)?;
        let e = pdctl_probe::prom::parse(&text).map_err(|err| metrics_error(MetricsProblem::Unparseable { url: u.clone(), err }))?;
        let held: Vec<f64> = e
            .samples
            .iter()
            .filter(|s| pdctl_core::sglang::PREFILL_HELD_GAUGES.iter().any(|n| s.name == *n || s.name == n.replace(':', "_")))
            .map(|s| s.value)
            .collect();
        if held.is_empty() {
            return Err(MetricsError { diagnosis: MetricsDiagnosis::NotPublished, message: format!("{u} has no prefill queue gauges yet"), pending_ranks: 0 });
        }
        let used = pdctl_probe::kv::read(&e).map(|r| r.used_tokens).unwrap_or(0.0);
        Ok(PdQueues { held_reqs: held.iter().sum(), used_tokens: used, source: "/metrics" })
    }
}

/// The engine over the real drivers.
pub type RealEngine = Engine<SystemdUnits, Journald, HttpProbes>;

/// The journal `settings` name (a directory, else this host's).
pub fn journal(settings: &Settings) -> Source {
    match &settings.journal_directory {
        Some(d) => Source::Directory(d.clone()),
        None => Source::Local,
    }
}

/// HTTP probes of the workers and the router `settings` name. Each worker's and the gateway's
/// API key is read here (in pdctld, which may read the key files); a key that cannot be read is
/// logged and noted, and the worker's calls go without it (`pdctl check` then names it).
pub fn probes(settings: &Settings) -> HttpProbes {
    let mut keys = Vec::new();
    let mut key_notes = std::collections::BTreeMap::new();
    let mut unreadable_keys = std::collections::BTreeMap::new();
    for w in &settings.workers {
        let Some(src) = &w.api_key else { continue };
        match src.read() {
            Ok(key) => {
                keys.push(pdctl_probe::ApiKey { base: w.url.clone(), key, exempt: pdctl_core::sglang::API_KEY_EXEMPT, only: None });
                key_notes.insert(w.url.clone(), format!("the key from {}", src.describe()));
            }
            Err(why) => {
                tracing::info!(pdctl_unit = %w.unit, "the API key of {} cannot be read: {why}", w.unit);
                key_notes.insert(w.url.clone(), format!("no key: {why}"));
                unreadable_keys.insert(w.url.clone(), why);
            }
        }
    }
    for w in &settings.workers {
        let Some(src) = &w.admin_api_key else { continue };
        match src.read() {
            Ok(key) => keys.push(pdctl_probe::ApiKey { base: w.url.clone(), key, exempt: &[], only: Some(pdctl_core::sglang::ADMIN_ROUTES) }),
            Err(why) => tracing::info!(pdctl_unit = %w.unit, "the admin API key of {} cannot be read: {why}", w.unit),
        }
    }
    if let Some(r) = &settings.router {
        if let Some(src) = &r.api_key {
            match src.read() {
                Ok(key) => keys.extend(r.replicas.iter().map(|x| pdctl_probe::ApiKey { base: x.url.clone(), key: key.clone(), exempt: &[], only: None })),
                Err(why) => tracing::info!("the gateway's API key cannot be read: {why}"),
            }
        }
    }
    HttpProbes {
        http: Http::new(pdctl_probe::REQUEST_TIMEOUT).with_keys(keys),
        routers: settings
            .router
            .as_ref()
            .map(|r| r.replicas.iter().map(|x| Router { url: x.url.clone(), metrics_url: x.metrics_url.clone() }).collect())
            .unwrap_or_default(),
        key_notes,
        unreadable_keys,
    }
}

/// Connect the real drivers for `settings` (systemd on its bus, the journal, HTTP probes), each
/// worker's role read from its unit ([`pdctl_core::engine::role_change::resolve_roles`]).
pub async fn connect(mut settings: Settings) -> Result<RealEngine, UnitsError> {
    let units = SystemdUnits::connect(&settings).await?;
    // A worker's role is its unit's (`pdctl role set` changes it there).
    for said in pdctl_core::engine::role_change::resolve_roles(&units, &mut settings).await {
        tracing::debug!("{said}");
    }
    let coordinator = settings.fleet.as_ref().map(|f| std::sync::Arc::new(EtcdCoordinator::new(f)) as std::sync::Arc<dyn pdctl_core::ports::Coordinator>);
    Ok(Engine { units, logs: Journald(journal(&settings)), probes: probes(&settings), settings, coordinator })
}

/// The fleet's etcd, connected on first use (a host whose etcd is down still answers `status`).
pub struct EtcdCoordinator {
    endpoints: Vec<String>,
    user: Option<(String, std::path::PathBuf)>,
    tls: Option<pdctl_core::config::FleetTls>,
    conn: tokio::sync::Mutex<Option<pdctl_fleet::Etcd>>,
}

/// Time limit of one etcd call.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(5);

impl EtcdCoordinator {
    /// For `[fleet]`.
    pub fn new(f: &pdctl_core::config::FleetSettings) -> EtcdCoordinator {
        EtcdCoordinator { endpoints: f.etcd.clone(), user: f.user.clone(), tls: f.tls.clone(), conn: tokio::sync::Mutex::new(None) }
    }

    async fn etcd(&self) -> Result<pdctl_fleet::Etcd, pdctl_core::ports::FleetFailure> {
        let mut g = self.conn.lock().await;
        if let Some(e) = g.as_ref() {
            return Ok(e.clone());
        }
        let e = etcd_connect(&self.endpoints, self.user.as_ref(), self.tls.as_ref()).await?;
        *g = Some(e.clone());
        Ok(e)
    }
}

/// An etcd watch behind the [`pdctl_core::ports::ChangeWatch`] port.
struct EtcdWatch(pdctl_fleet::Watch);

impl pdctl_core::ports::ChangeWatch for EtcdWatch {
    fn next(&mut self, limit: Duration) -> pdctl_core::ports::BoxFut<'_, Result<Option<Vec<pdctl_core::ports::KvChange>>, pdctl_core::ports::FleetFailure>> {
        Box::pin(async move {
            let got = self.0.next(limit).await.map_err(fleet_failure)?;
            Ok(got.map(|v| v.into_iter().map(|c| pdctl_core::ports::KvChange { key: c.key, value: c.value, revision: c.revision }).collect()))
        })
    }
}

/// Connect to the fleet's etcd (reading the password file when `[fleet] user` is set, and the
/// TLS files when given).
pub async fn etcd_connect(
    endpoints: &[String],
    user: Option<&(String, std::path::PathBuf)>,
    tls: Option<&pdctl_core::config::FleetTls>,
) -> Result<pdctl_fleet::Etcd, pdctl_core::ports::FleetFailure> {
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| pdctl_core::ports::FleetFailure::Credentials(format!("cannot read {}: {e}", p.display())));
    let tls = match tls {
        Some(t) => Some(pdctl_fleet::Tls {
            ca: t.ca_file.as_deref().map(read).transpose()?,
            identity: match &t.identity {
                Some((c, k)) => Some((read(c)?, read(k)?)),
                None => None,
            },
        }),
        None => None,
    };
    let user = match user {
        Some((u, file)) => Some((
            u.clone(),
            std::fs::read_to_string(file)
                .map(|p| p.trim_end().to_string())
                .map_err(|e| pdctl_core::ports::FleetFailure::Credentials(format!("cannot read the etcd password file {}: {e}", file.display())))?,
        )),
        None => None,
    };
    pdctl_fleet::Etcd::connect(endpoints, user, tls, ETCD_TIMEOUT).await.map_err(fleet_failure)
}

fn fleet_failure(e: pdctl_fleet::Error) -> pdctl_core::ports::FleetFailure {
    pdctl_core::ports::FleetFailure::Unreachable(format!("{e}; start it or fix [fleet] etcd"))
}

fn kv(e: pdctl_fleet::Entry) -> pdctl_core::ports::KvEntry {
    pdctl_core::ports::KvEntry { key: e.key, value: e.value, mod_revision: e.mod_revision }
}

impl pdctl_core::ports::Coordinator for EtcdCoordinator {
    fn get<'a>(&'a self, key: &'a str) -> pdctl_core::ports::BoxFut<'a, Result<Option<pdctl_core::ports::KvEntry>, pdctl_core::ports::FleetFailure>> {
        Box::pin(async move { self.etcd().await?.get(key).await.map(|o| o.map(kv)).map_err(fleet_failure) })
    }
    fn get_prefix<'a>(&'a self, prefix: &'a str) -> pdctl_core::ports::BoxFut<'a, Result<Vec<pdctl_core::ports::KvEntry>, pdctl_core::ports::FleetFailure>> {
        Box::pin(async move { self.etcd().await?.get_prefix(prefix).await.map(|v| v.into_iter().map(kv).collect()).map_err(fleet_failure) })
    }
    fn cas(&self, changes: Vec<pdctl_core::ports::CasChange>) -> pdctl_core::ports::BoxFut<'_, Result<bool, pdctl_core::ports::FleetFailure>> {
        Box::pin(async move {
            let changes: Vec<pdctl_fleet::Change> = changes
                .into_iter()
                .map(|c| pdctl_fleet::Change {
                    key: c.key,
                    expect: c.expect,
                    value: match c.write {
                        pdctl_core::ports::Write::Keep => None,
                        pdctl_core::ports::Write::Put(v) => Some(Some(v)),
                        pdctl_core::ports::Write::Delete => Some(None),
                    },
                })
                .collect();
            self.etcd().await?.cas(&changes).await.map_err(fleet_failure)
        })
    }
    fn revision(&self) -> pdctl_core::ports::BoxFut<'_, Result<i64, pdctl_core::ports::FleetFailure>> {
        Box::pin(async move { self.etcd().await?.revision().await.map_err(fleet_failure) })
    }
    fn watch(
        &self,
        keys: Vec<(String, bool)>,
        after: i64,
    ) -> pdctl_core::ports::BoxFut<'_, Result<Box<dyn pdctl_core::ports::ChangeWatch>, pdctl_core::ports::FleetFailure>> {
        Box::pin(async move {
            let w = self.etcd().await?.watch_from(&keys, after).await.map_err(fleet_failure)?;
            Ok(Box::new(EtcdWatch(w)) as Box<dyn pdctl_core::ports::ChangeWatch>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_this_process_cannot_read_is_not_checked_here_and_never_rejected() {
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"regular\"\nurl = \"http://127.0.0.1:9\"\napi_key_file = \"/nonexistent/pdctl-key\"\n";
        let settings = pdctl_core::config::load_texts(&[(std::path::PathBuf::from("t.toml"), text.to_string())]).expect("config");
        let p = probes(&settings);
        assert!(p.key_notes["http://127.0.0.1:9"].starts_with("no key: cannot read /nonexistent/pdctl-key"), "{:?}", p.key_notes);
        match p.auth("http://127.0.0.1:9").await {
            Auth::Unknown(why) => assert!(why.contains("cannot be read here") && why.contains("pdctld"), "{why}"),
            other => panic!("expected not checked, got {other:?}"),
        }
    }
}
