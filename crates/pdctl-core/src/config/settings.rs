//! The resolved settings: what every part of pdctl reads, validated and with defaults applied.

pub use crate::service::slo::{Slo, Unjudged};
pub use pdctl_contract::records::Role;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::url::canonical_url;

/// What to do when a gate fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Stop; touch nothing else.
    Halt,
    /// Restore the last good revision of the unit's files (needs pdctld's revision store).
    Rollback,
}

/// Which changes a rolling restart must roll coherently (`[rollout] coherent`): no PD request
/// may pair a prefill and a decode of two model versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Coherent {
    /// The changes of `crate::sglang::coherence::COHERENT_FLAGS` (model path, tokenizer, quantization,
    /// dtype, served model name, revision, load format, weight version) and `coherent_flags`.
    Auto,
    /// Every setting a PD worker's new ExecStart gives that its running server reports.
    Always,
    /// None: today's order, prefills then decodes (the plan warns of mixed pairs).
    Never,
}

/// What preflight does with a worker unit whose `KillMode=` lets the stop's SIGTERM reach
/// SGLang's scheduler (`control-group`, systemd's default; `[rollout] kill_mode`): that stop is
/// a crash, not a drain (see [`crate::sglang::stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KillModePolicy {
    /// Refuse the restart before anything is touched (`kill_mode_unsafe`), naming the drop-in.
    Refuse,
    /// Restart it anyway, with the same sentence as a preflight warning.
    Warn,
}

/// Whether a config rollout whose only change is the weights may load them without a restart
/// (`[rollout] in_place`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InPlace {
    /// The default: when every PD worker's files change only in `--model-path` and/or
    /// `--weight-version` (the same new values everywhere, no fleet), the rollout loads them
    /// into the running servers as `pdctl rollout weights` does: requests wait, none fails,
    /// none pairs two versions.
    Auto,
    /// Always restart (the change goes through the restart gates, and the coherence check).
    Never,
}

/// What an in-place config rollout does when a worker does not take the new weights
/// (`[rollout] weights_fallback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightsFallback {
    /// The default: every worker gets its previous weights back and continues; the rollout
    /// fails with `weights_failed` (the change stays on disk, quarantined).
    Revert,
    /// After the previous weights are back, roll the change out by restarting the workers,
    /// through every gate and the coherence check (which refuses what would pair versions).
    Restart,
}

/// How a host with one prefill and one decode worker restarts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinglePair {
    /// One at a time (the default): two interruptions, but a bad change breaks one unit and a
    /// rollback restores it.
    Sequential,
    /// Both at once, each through every gate: one interruption instead of two.
    Together,
}

/// What the pair gate does about a decode holding a stale pairing with a restarted prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnStalePair {
    /// Restart the decode through every gate, as part of the same rollout (`repair_of`).
    RestartDecode,
    /// Stop with the stale-pair cause, naming the decode.
    Halt,
}

/// How strict the stranded-KV check after a decode restart is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StrandedKv {
    /// KV still held at the deadline is reported; the rollout goes on.
    Warn,
    /// KV still held at the deadline fails the gate.
    Required,
}

/// How strict the metrics gate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsMode {
    /// Missing or insane KV gauges fail the gate.
    Required,
    /// They are reported but do not fail.
    Warn,
    /// Not checked.
    Off,
}

/// One SGLang worker unit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Worker {
    /// The systemd unit.
    pub unit: String,
    /// Its role.
    pub role: Role,
    /// Its HTTP URL (as the router knows it).
    pub url: String,
    /// Prefill bootstrap port (for re-registration).
    pub bootstrap_port: Option<u16>,
    /// GPU indices, when configured.
    pub gpus: Option<BTreeSet<u32>>,
    /// More files whose change makes the worker stale (model configs, …).
    pub watch_files: Vec<PathBuf>,
    /// Where its `--api-key` is (`api_key_file`): pdctl sends it on every call SGLang guards and
    /// gives it to the gateway when it registers the worker. Never the key itself.
    pub api_key: Option<KeySource>,
    /// Where its `--admin-api-key` is (`admin_api_key_file`): pdctl sends it instead of the API
    /// key on the routes SGLang guards with it ([`crate::sglang::ADMIN_ROUTES`]: pause,
    /// continue, weight updates, cache flush, abort).
    pub admin_api_key: Option<KeySource>,
}

/// Where an API key is read from: a file readable by pdctld only, or a systemd credential
/// (`LoadCredential=`, read from `$CREDENTIALS_DIRECTORY/<name>`). The key never appears in the
/// TOML, a log, an event or a record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// An absolute path.
    File(PathBuf),
    /// A credential of pdctld's unit, by name.
    Credential(String),
}

impl KeySource {
    /// `api_key_file = "…"`: an absolute path, or a bare name (a systemd credential).
    pub fn parse(v: &str) -> Result<KeySource, String> {
        if v.starts_with('/') {
            Ok(KeySource::File(PathBuf::from(v)))
        } else if !v.is_empty() && !v.contains('/') && v != "." && v != ".." {
            Ok(KeySource::Credential(v.to_string()))
        } else {
            // Not repeated: a key pasted here by mistake must not reach a log or a record.
            Err("is neither an absolute path nor a systemd credential's name (LoadCredential=NAME:…, read from $CREDENTIALS_DIRECTORY/NAME); its value is not repeated here".into())
        }
    }

    /// Where the key is, for sentences (never the key). A credential's name is not repeated:
    /// a key pasted as `api_key_file` by mistake reads as a name, and this sentence reaches
    /// logs, records and etcd; the config says which name it is.
    pub fn describe(&self) -> String {
        match self {
            KeySource::File(p) => p.display().to_string(),
            KeySource::Credential(_) => "the systemd credential the config names (in $CREDENTIALS_DIRECTORY)".into(),
        }
    }

    /// Read the key: the file's content without surrounding whitespace.
    pub fn read(&self) -> Result<String, String> {
        let path = match self {
            KeySource::File(p) => p.clone(),
            KeySource::Credential(n) => match std::env::var_os("CREDENTIALS_DIRECTORY") {
                Some(d) => PathBuf::from(d).join(n),
                None => {
                    return Err(
                        "the systemd credential the config names is not available: $CREDENTIALS_DIRECTORY is not set (add LoadCredential=NAME:PATH to pdctld's unit, NAME as in the config)"
                            .into(),
                    )
                }
            },
        };
        let shown = match self {
            KeySource::File(p) => p.display().to_string(),
            KeySource::Credential(_) => self.describe(),
        };
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let key = text.trim().to_string();
        if key.is_empty() {
            return Err(format!("{shown} is empty"));
        }
        Ok(key)
    }
}

/// The router: one gateway, or several replicas of it (`url` a list), each drained, re-registered
/// and checked for admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterSettings {
    /// Base URL of the first replica (the one status and the availability probe use).
    pub url: String,
    /// Its Prometheus endpoint (for the circuit-breaker check).
    pub metrics_url: Option<String>,
    /// Every replica, the first included, in config order.
    pub replicas: Vec<Replica>,
    /// The gateway's own admin key (`[router] api_key_file`), sent to every replica.
    pub api_key: Option<KeySource>,
}

/// One gateway replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// Base URL.
    pub url: String,
    /// Its Prometheus endpoint.
    pub metrics_url: Option<String>,
}

/// `[rollout]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    /// Roles in order.
    pub order: Vec<Role>,
    /// Substring of the ready line (default: SGLang's, [`crate::sglang::READY_LINE`]).
    pub ready_pattern: String,
    /// Substrings of fatal lines: SGLang's ([`crate::sglang::FATAL_PATTERNS`]) and the configured
    /// extra ones (`fatal_patterns` adds; nothing removes the built-in ones).
    pub fatal_patterns: Vec<String>,
    /// Restart → ready line.
    pub ready_timeout: Duration,
    /// Ready → `/health` 200.
    pub health_timeout: Duration,
    /// → router admission (healthy, breaker closed, smoke 200).
    pub router_timeout: Duration,
    /// → KV gauges present (SGLang publishes on the first batch or after 30 s idle).
    pub metrics_timeout: Duration,
    /// RestartUnit → our job's JobRemoved.
    pub job_timeout: Duration,
    /// Soak: the unit must stay up this long.
    pub min_healthy: Duration,
    /// Halt or roll back.
    pub on_failure: OnFailure,
    /// Units of a role allowed down at once (pdctl restarts one unit at a time in any case).
    pub max_unavailable: u32,
    /// Take the worker out of the router before the restart.
    pub drain: bool,
    /// Bound on waiting for in-flight requests to finish.
    pub drain_timeout: Duration,
    /// Taking the only worker of a role down (an interruption of serving) is accepted.
    pub allow_outage: bool,
    /// A rollout that changes `--model-path` to a checkpoint directory on this host reads its
    /// files into the page cache before the first worker stops (or pauses for an in-place
    /// load), where they fit in the memory available (`pdctl_core::sglang::checkpoint`).
    pub prefetch_weights: bool,
    /// How a 1P1D pair is restarted.
    pub single_pair: SinglePair,
    /// Which changes must not pair two versions.
    pub coherent: Coherent,
    /// A worker unit with `KillMode=control-group`: refused or warned of.
    pub kill_mode: KillModePolicy,
    /// More flags whose change breaks coherence (`coherent_flags`).
    pub coherent_flags: Vec<String>,
    /// Where new weights may be loaded from (`model_roots`: absolute directories); empty: any
    /// absolute path ([`Rollout::model_path_allowed`]).
    pub model_roots: Vec<PathBuf>,
    /// A config rollout of new weights only loads them without a restart.
    pub in_place: InPlace,
    /// What such a rollout does when a worker does not take them.
    pub weights_fallback: WeightsFallback,
    /// Halt when the availability probe sees more failed requests than this.
    pub max_failed_probes: Option<u64>,
    /// A decode found with a stale pairing after a prefill restart: repair it or halt.
    pub on_stale_pair: OnStalePair,
    /// Requests still in flight when the drain's wait ends are aborted (SGLang's
    /// `POST /abort_request {"abort_all": true}`) instead of holding the stop, which waits for
    /// them until `TimeoutStopSec=` and SIGKILL. A stale decode's requests are always aborted
    /// before its repair (they can never finish).
    pub abort_after_drain_timeout: bool,
    /// A drain that cannot read the worker's in-flight requests: the cause `load_unknown`
    /// (`halt`, the default) or a warning on the drain step, and the restart goes on (SGLang's own
    /// stop still waits for what it runs).
    pub unknown_load: UnknownLoad,
}

impl Rollout {
    /// Whether new weights may be loaded from `path` (already absolute): under one of
    /// `model_roots` when any are set (compared by path components, after refusing `..`);
    /// `Err`: the sentence saying where they may come from.
    pub fn model_path_allowed(&self, path: &str) -> Result<(), String> {
        if self.model_roots.is_empty() {
            return Ok(());
        }
        let p = std::path::Path::new(path);
        let climbs = p.components().any(|c| c == std::path::Component::ParentDir);
        if !climbs && self.model_roots.iter().any(|r| p.starts_with(r)) {
            return Ok(());
        }
        Err(format!(
            "the model path {path:?} is not under [rollout] model_roots ({}): weights are loaded only from there",
            self.model_roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
        ))
    }
}

/// `[rollout] unknown_load`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownLoad {
    /// The drain fails with `load_unknown`; the worker is re-admitted.
    Halt,
    /// The drain passes with the `load_unknown` warning.
    Warn,
}

/// `[verify]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verify {
    /// Check the router's view.
    pub router: bool,
    /// KV metrics gate.
    pub metrics: MetricsMode,
    /// One small request through the router.
    pub smoke_request: bool,
    /// Send one request to make SGLang publish its gauges when they are missing.
    pub warmup_request: bool,
    /// Requests per second of the availability probe through the router (`None`: off).
    pub availability_probe: Option<f64>,
    /// The pair gate: PD requests sent straight to each prefill/decode pair of a restarted worker.
    pub pair: bool,
    /// How long one pair probe may take (a healthy pair answers a 1-token request in well under
    /// a second; a stale one only at the decode's waiting timeout, 300 s by default).
    pub pair_timeout: Duration,
    /// Whether KV still held by prefills after a decode restart fails the gate.
    pub stranded_kv: StrandedKv,
    /// How long prefills may take to release a restarted decode's rooms (`None`: the prefill
    /// unit's `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`, 300 s when unset, plus 10 s).
    pub stranded_kv_timeout: Option<Duration>,
    /// The service gate (`[verify.slo]`; `None`: none).
    pub slo: Option<Slo>,
}

/// `[maintenance]`: host maintenance (reboots for drivers and kernels) through pdctl's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceSettings {
    /// Where the FleetLock endpoint listens (`fleetlock_listen`; loopback by default: the update
    /// agent runs on the host). `None`: `fleetlock_listen = ""`, no endpoint.
    pub fleetlock_listen: Option<std::net::SocketAddr>,
    /// The FleetLock client id this host answers to (`fleetlock_id`; default the host's name:
    /// `[fleet] host` or the machine's). Any other id is refused: a lock belongs to its host.
    pub fleetlock_id: String,
    /// The local accounts besides root whose update agent may ask the FleetLock endpoint
    /// (`fleetlock_users`, e.g. `["zincati"]`; none by default). The protocol carries no
    /// credential: on loopback pdctld tells the caller's account from the kernel's socket table.
    pub fleetlock_users: Vec<String>,
    /// The FleetLock group asked for (`[fleet] name`, or `default` without `[fleet]`, Zincati's
    /// default group).
    pub group: String,
    /// Weekly windows a maintenance may begin in (none: any time).
    pub windows: Vec<crate::service::reboot_window::RebootWindow>,
    /// A Prometheus instant-query URL (`…/api/v1/query?query=…`): while it returns any series,
    /// no maintenance begins.
    pub hold_while_alerting: Option<String>,
    /// `balance_roles` (default false): pdctld changes this host's P:D ratio by itself (`pdctl
    /// role set --ratio`) once the role pressure has suggested the same ratio for
    /// `balance_after`, only when a maintenance could begin (its windows, the fleet not paused,
    /// the hold query quiet, no rollout running) and within the budget every rollout keeps.
    pub balance_roles: bool,
    /// `balance_after` (default 15 min): how long the same suggestion must stand first.
    pub balance_after: Duration,
}

/// The FleetLock endpoint's address when `[maintenance]` does not say (loopback).
pub const FLEETLOCK_LISTEN: &str = "127.0.0.1:9753";

/// `[fleet]`: this host is one of many behind one gateway, coordinated through etcd v3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSettings {
    /// etcd client endpoints (`http://10.0.0.5:2379`).
    pub etcd: Vec<String>,
    /// The fleet's name (the key prefix `/pdctl/<name>/`).
    pub name: String,
    /// This host's name in the fleet (default: the machine's hostname).
    pub host: String,
    /// How long to wait for a slot before halting.
    pub slot_timeout: Duration,
    /// Workers of each role that may be down at once, fleet-wide (stored in etcd; every host
    /// must agree).
    pub max_unavailable: std::collections::BTreeMap<String, u32>,
    /// etcd authentication: user and the file holding the password.
    pub user: Option<(String, PathBuf)>,
    /// A fleet rollout starts here first; the other hosts only once it succeeded.
    pub canary: Option<String>,
    /// `[fleet] keep_rollouts`: finished fleet rollouts kept in etcd (their request, events and
    /// summaries); older ones are deleted by the hosts (default 200).
    pub keep_rollouts: u32,
    /// `[fleet] bake`: after the last host of a fleet rollout, how long every changed worker's
    /// service figures are watched (with `[verify.slo]`'s tolerances, against its own figures from
    /// before its drain); a breach rolls the changed hosts back. `None`: no bake.
    pub bake: Option<Duration>,
    /// `[fleet.storm]`: self-restarts fleet-wide that pause the fleet.
    pub storm: crate::service::storm::Storm,
    /// TLS to etcd (`https://` endpoints): the CA file, and this client's certificate and key
    /// files when the cluster requires client certificates.
    pub tls: Option<FleetTls>,
}

/// `[fleet] ca_file`, `cert_file`, `key_file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetTls {
    /// The CA that signed etcd's certificates (else the system's roots are not used: give it).
    pub ca_file: Option<PathBuf>,
    /// This client's certificate and key (PEM).
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl Settings {
    /// Every URL pdctld connects to (etcd, the router and its metrics, the workers, a prefill's
    /// bootstrap server), with what it is: pdctld's unit must allow their addresses.
    pub fn urls(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(f) = &self.fleet {
            out.extend(f.etcd.iter().map(|e| ("etcd".to_string(), e.clone())));
        }
        if let Some(r) = &self.router {
            out.push(("the router".into(), r.url.clone()));
            out.extend(r.metrics_url.iter().map(|m| ("the router's metrics".to_string(), m.clone())));
        }
        for w in &self.workers {
            out.push((w.unit.clone(), w.url.clone()));
        }
        out
    }
}

/// Where systemd is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusSetting {
    /// System bus.
    System,
    /// User bus.
    User,
    /// Explicit address.
    Address(String),
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The bus.
    pub bus: BusSetting,
    /// The journal directory (`None`: the local journal).
    pub journal_directory: Option<PathBuf>,
    /// procfs for PID ancestry.
    pub procfs: PathBuf,
    /// The router.
    pub router: Option<RouterSettings>,
    /// Workers in file order.
    pub workers: Vec<Worker>,
    /// `[rollout]`.
    pub rollout: Rollout,
    /// `[verify]`.
    pub verify: Verify,
    /// `[fleet]` (`None`: a single host).
    pub fleet: Option<FleetSettings>,
    /// `[maintenance]`, when the table is present.
    pub maintenance: Option<MaintenanceSettings>,
    /// Files read, in order.
    pub sources: Vec<PathBuf>,
}

pub(super) fn d(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The bounds of every `[rollout]` duration: key, minimum, maximum. "0s" is never valid: a zero
/// wait turns a gate into a failure (or a drain into no drain).
pub const DURATION_BOUNDS: &[(&str, Duration, Duration)] = &[
    ("ready_timeout", Duration::from_secs(1), Duration::from_secs(24 * 3600)),
    ("job_timeout", Duration::from_secs(1), Duration::from_secs(24 * 3600)),
    ("health_timeout", Duration::from_secs(1), Duration::from_secs(3600)),
    ("router_timeout", Duration::from_secs(1), Duration::from_secs(3600)),
    ("metrics_timeout", Duration::from_secs(1), Duration::from_secs(3600)),
    ("min_healthy", Duration::from_secs(1), Duration::from_secs(3600)),
    ("drain_timeout", Duration::from_secs(1), Duration::from_secs(3600)),
    ("pair_timeout", Duration::from_secs(1), Duration::from_secs(3600)),
    ("stranded_kv_timeout", Duration::from_secs(1), Duration::from_secs(3600)),
    ("slot_timeout", Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600)),
    ("slo.max_wait", Duration::from_secs(0), Duration::from_secs(3600)),
    ("storm.within", Duration::from_secs(10), Duration::from_secs(24 * 3600)),
    ("bake", Duration::from_secs(10), Duration::from_secs(24 * 3600)),
    ("balance_after", Duration::from_secs(1), Duration::from_secs(7 * 24 * 3600)),
];

/// A server's base URL: http(s), a host, an optional port, nothing after it.
pub(super) fn server_url(u: &str) -> Result<String, String> {
    let c = canonical_url(u)?;
    let (_, rest) = c.split_once("://").unwrap_or(("", &c));
    if rest.contains(['/', '?', '#']) {
        return Err("must be the server's base URL (scheme, host, port), without a path".into());
    }
    Ok(c)
}

/// Parse `"0-3"`, `"0,1,2,3"`, `"0-1,6"`.
pub fn parse_gpus(s: &str) -> Option<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b || b - a > 1024 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().ok()?);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}
