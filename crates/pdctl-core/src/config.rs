//! Configuration: `/etc/pdctl/pdctl.toml`, then `/etc/pdctl/config.d/*.toml` merged in name order
//! (`--config PATH` or `PDCTL_CONFIG` replaces the first), validated into [`Settings`].
//!
//! Merging: a later file's keys override an earlier file's, table by table; `[[worker]]` entries
//! are appended (a fragment can add a worker; a unit named twice is an error). Unknown keys, bad
//! durations and bad values are errors that name the file, the line and the key.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::url::{canonical_url, same_url};
use serde::Deserialize;
use toml::Spanned;

/// Default location of the main file.
pub const DEFAULT_PATH: &str = "/etc/pdctl/pdctl.toml";

/// A configuration error: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {msg}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong, naming the key.
    pub msg: String,
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len())).map(|t| t.matches('\n').count() + 1).unwrap_or(1)
}

/// A duration written as "90s", "10m", "1h 30m".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map(Dur)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration {s:?} ({e}); write it like \"90s\", \"10m\" or \"1h 30m\"")))
    }
}

/// A worker's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// PD prefill server.
    Prefill,
    /// PD decode server.
    Decode,
    /// A regular (non-disaggregated) server.
    Regular,
}

impl Role {
    /// The router's `worker_type` for this role.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Regular => "regular",
        }
    }
}

/// What to do when a gate fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Stop; touch nothing else.
    Halt,
    /// Restore the last good revision of the unit's files (needs pdctld's revision store).
    Rollback,
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

/// Which bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusKind {
    /// System manager.
    System,
    /// The caller's user manager.
    User,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSystemd {
    bus: Option<BusKind>,
    address: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJournal {
    directory: Option<PathBuf>,
    procfs: Option<PathBuf>,
}

/// One string or a list of them (`[router] url` of several gateway replicas).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn list(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouter {
    url: Option<OneOrMany>,
    metrics_url: Option<OneOrMany>,
    api_key_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    unit: Spanned<String>,
    role: Role,
    url: Spanned<String>,
    bootstrap_port: Option<u16>,
    gpus: Option<Spanned<String>>,
    #[serde(default)]
    watch_files: Vec<PathBuf>,
    api_key_file: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRollout {
    order: Option<Vec<Role>>,
    ready_pattern: Option<Spanned<String>>,
    fatal_patterns: Option<Vec<String>>,
    ready_timeout: Option<Dur>,
    health_timeout: Option<Dur>,
    router_timeout: Option<Dur>,
    metrics_timeout: Option<Dur>,
    job_timeout: Option<Dur>,
    min_healthy: Option<Dur>,
    on_failure: Option<OnFailure>,
    max_unavailable: Option<Spanned<u32>>,
    drain: Option<bool>,
    drain_timeout: Option<Dur>,
    allow_outage: Option<bool>,
    single_pair: Option<SinglePair>,
    max_failed_probes: Option<u64>,
    on_stale_pair: Option<OnStalePair>,
    abort_after_drain_timeout: Option<bool>,
    unknown_load: Option<UnknownLoad>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVerify {
    router: Option<bool>,
    metrics: Option<MetricsMode>,
    smoke_request: Option<bool>,
    warmup_request: Option<bool>,
    availability_probe: Option<String>,
    pair: Option<bool>,
    pair_timeout: Option<Dur>,
    stranded_kv: Option<StrandedKv>,
    stranded_kv_timeout: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    etcd: Option<Vec<String>>,
    name: Option<String>,
    host: Option<String>,
    slot_timeout: Option<Dur>,
    max_unavailable: Option<std::collections::BTreeMap<Role, u32>>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    canary: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    fleet: Option<RawFleet>,
    systemd: Option<RawSystemd>,
    journal: Option<RawJournal>,
    router: Option<RawRouter>,
    worker: Option<Vec<RawWorker>>,
    rollout: Option<RawRollout>,
    verify: Option<RawVerify>,
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
            Err(format!("{v:?} is neither an absolute path nor a systemd credential's name (LoadCredential=NAME:…, read from $CREDENTIALS_DIRECTORY/NAME)"))
        }
    }

    /// Where the key is, for sentences (never the key).
    pub fn describe(&self) -> String {
        match self {
            KeySource::File(p) => p.display().to_string(),
            KeySource::Credential(n) => format!("the credential {n} ($CREDENTIALS_DIRECTORY/{n})"),
        }
    }

    /// Read the key: the file's content without surrounding whitespace.
    pub fn read(&self) -> Result<String, String> {
        let path = match self {
            KeySource::File(p) => p.clone(),
            KeySource::Credential(n) => match std::env::var_os("CREDENTIALS_DIRECTORY") {
                Some(d) => PathBuf::from(d).join(n),
                None => {
                    return Err(format!(
                        "the credential {n} is not available: $CREDENTIALS_DIRECTORY is not set (add LoadCredential={n}:PATH to pdctld's unit)"
                    ))
                }
            },
        };
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let key = text.trim().to_string();
        if key.is_empty() {
            return Err(format!("{} is empty", path.display()));
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
    /// How a 1P1D pair is restarted.
    pub single_pair: SinglePair,
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
}

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
    /// Files read, in order.
    pub sources: Vec<PathBuf>,
}

fn d(s: u64) -> Duration {
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
];

/// The line where `key = …` is set in `text` (first such line).
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines().position(|l| l.trim_start().strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('='))).map(|i| i + 1)
}

/// A server's base URL: http(s), a host, an optional port, nothing after it.
fn server_url(u: &str) -> Result<String, String> {
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

fn parse_file(path: &Path, text: &str) -> Result<RawFile, ConfigError> {
    toml::from_str::<RawFile>(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let msg = e.message().trim().to_string();
        // toml names the table path in its message for type errors; unknown keys name the key.
        ConfigError { file: path.display().to_string(), line, msg }
    })
}

/// The files to read: the main file, then `config.d/*.toml` next to it, in name order.
pub fn files(main: &Path) -> Vec<PathBuf> {
    let mut out = vec![main.to_path_buf()];
    if let Some(dir) = main.parent().map(|p| p.join("config.d")) {
        if let Ok(rd) = std::fs::read_dir(&dir) {
            let mut frags: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "toml")).collect();
            frags.sort();
            out.extend(frags);
        }
    }
    out
}

/// Which main file: `--config`, else `$PDCTL_CONFIG`, else `/etc/pdctl/pdctl.toml`.
pub fn main_path(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf).or_else(|| std::env::var_os("PDCTL_CONFIG").map(PathBuf::from)).unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

/// The sections that say how this process reaches the host (the bus, the journal), not what a
/// rollout does: a CLI and pdctld may reach the same manager by different addresses.
const ACCESS_SECTIONS: [&str; 2] = ["systemd", "journal"];

/// SHA-256 (hex) of what the config rooted at `main` says, every file in merge order, without
/// [`ACCESS_SECTIONS`] (comments and layout do not count: each file's parsed table is hashed;
/// a file that does not parse is hashed as bytes); `None` when a file cannot be read. Which
/// config a CLI and pdctld run with is compared by this.
pub fn digest(main: &Path) -> Option<String> {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    for f in files(main) {
        let bytes = std::fs::read(&f).ok()?;
        let canonical = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| toml::from_str::<toml::Table>(t).ok())
            .and_then(|mut t| {
                for k in ACCESS_SECTIONS {
                    t.remove(k);
                }
                serde_json::to_vec(&t).ok()
            })
            .unwrap_or(bytes);
        h.update((canonical.len() as u64).to_le_bytes());
        h.update(&canonical);
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Load and validate the configuration rooted at `main`.
pub fn load(main: &Path) -> Result<Settings, ConfigError> {
    let mut texts = Vec::new();
    for f in files(main) {
        let text = std::fs::read_to_string(&f).map_err(|e| ConfigError {
            file: f.display().to_string(),
            line: None,
            msg: format!("cannot read the config file: {e} (use --config PATH or PDCTL_CONFIG to point at another)"),
        })?;
        texts.push((f, text));
    }
    load_texts(&texts)
}

/// Validate already-read files (for tests): `(path, contents)` in merge order.
pub fn load_texts(texts: &[(PathBuf, String)]) -> Result<Settings, ConfigError> {
    let mut sd = RawSystemd::default();
    let mut jn = RawJournal::default();
    let mut rt = RawRouter::default();
    let mut ro = RawRollout::default();
    let mut vf = RawVerify::default();
    let mut fl = RawFleet::default();
    let mut fleet_seen = false;
    let mut workers: Vec<(PathBuf, usize, RawWorker)> = Vec::new();
    let mut ready_origin: Option<(PathBuf, usize)> = None;
    // Which file (and line) last set each `table.key`, for errors found after merging.
    let mut origins: std::collections::BTreeMap<String, (PathBuf, Option<usize>)> = Default::default();
    macro_rules! over {
        ($path:expr, $text:expr, $dst:ident, $src:expr, $($f:ident),*) => { $( if $src.$f.is_some() {
            $dst.$f = $src.$f;
            origins.insert(format!("{}.{}", stringify!($dst), stringify!($f)), ($path.clone(), line_of_key($text, stringify!($f))));
        } )* };
    }
    for (path, text) in texts {
        let raw = parse_file(path, text)?;
        if let Some(s) = raw.systemd {
            over!(path, text, sd, s, bus, address);
        }
        if let Some(s) = raw.journal {
            over!(path, text, jn, s, directory, procfs);
        }
        if let Some(s) = raw.router {
            over!(path, text, rt, s, url, metrics_url, api_key_file);
        }
        if let Some(s) = raw.rollout {
            if let Some(p) = &s.ready_pattern {
                ready_origin = Some((path.clone(), line_of(text, p.span().start)));
            }
            over!(
                path,
                text,
                ro,
                s,
                order,
                ready_pattern,
                fatal_patterns,
                ready_timeout,
                health_timeout,
                router_timeout,
                metrics_timeout,
                job_timeout,
                min_healthy,
                on_failure,
                max_unavailable,
                drain,
                drain_timeout,
                allow_outage,
                single_pair,
                max_failed_probes,
                on_stale_pair,
                abort_after_drain_timeout,
                unknown_load
            );
        }
        if let Some(s) = raw.verify {
            over!(path, text, vf, s, router, metrics, smoke_request, warmup_request, availability_probe, pair, pair_timeout, stranded_kv, stranded_kv_timeout);
        }
        if let Some(s) = raw.fleet {
            fleet_seen = true;
            over!(path, text, fl, s, etcd, name, host, slot_timeout, max_unavailable, user, password_file, canary, ca_file, cert_file, key_file);
        }
        for w in raw.worker.unwrap_or_default() {
            let line = line_of(text, w.unit.span().start);
            workers.push((path.clone(), line, w));
        }
    }
    let err = |path: &Path, line: Option<usize>, msg: String| ConfigError { file: path.display().to_string(), line, msg };
    let last = texts.last().map(|t| t.0.clone()).unwrap_or_default();
    // The error of a merged key: the file and line that set it (else the last file).
    let at = |key: &str, msg: String| {
        let short = key.replace("ro.", "rollout.").replace("rt.", "router.").replace("vf.", "verify.").replace("fl.", "fleet.");
        match origins.get(key) {
            Some((p, l)) => err(p, *l, format!("{short}: {msg}")),
            None => err(&last, None, format!("{short}: {msg}")),
        }
    };
    if workers.is_empty() {
        return Err(err(&last, None, "no [[worker]] is configured: add one per SGLang unit (unit, role, url)".into()));
    }
    let mut out_workers = Vec::new();
    let mut seen: Vec<(String, PathBuf, usize)> = Vec::new();
    for (path, line, w) in workers {
        let unit = w.unit.into_inner();
        if let Some((_, p, l)) = seen.iter().find(|(u, _, _)| *u == unit) {
            return Err(err(&path, Some(line), format!("worker.unit: {unit} is configured twice (first at {}:{l})", p.display())));
        }
        if !unit.contains('.') {
            return Err(err(&path, Some(line), format!("worker.unit: {unit:?} is not a unit name (expected e.g. \"sglang-prefill.service\")")));
        }
        let url_line = line_of(&texts.iter().find(|t| t.0 == path).map(|t| t.1.clone()).unwrap_or_default(), w.url.span().start);
        let url = w.url.into_inner();
        if let Err(why) = server_url(&url) {
            return Err(err(&path, Some(url_line), format!("worker.url of {unit}: {url:?} {why}")));
        }
        if let Some(other) = out_workers.iter().find(|o: &&Worker| same_url(&o.url, &url)) {
            return Err(err(&path, Some(url_line), format!("worker.url of {unit}: {url:?} is also the URL of {}; each worker is its own server", other.unit)));
        }
        if w.bootstrap_port.is_some() && w.role != Role::Prefill {
            return Err(err(&path, Some(line), format!("worker.bootstrap_port of {unit}: only a prefill worker has a bootstrap port")));
        }
        let mut gpus_line = None;
        let gpus =
            match w.gpus {
                None => None,
                Some(g) => {
                    let gl = line_of(&texts.iter().find(|t| t.0 == path).map(|t| t.1.clone()).unwrap_or_default(), g.span().start);
                    gpus_line = Some(gl);
                    Some(parse_gpus(g.get_ref()).ok_or_else(|| {
                        err(&path, Some(gl), format!("worker.gpus of {unit}: {:?} is not a GPU list like \"0-3\" or \"4,5,6,7\"", g.get_ref()))
                    })?)
                }
            };
        if let (Some(g), Some(gl)) = (&gpus, gpus_line) {
            if let Some(o) = out_workers.iter().find(|o: &&Worker| o.gpus.as_ref().is_some_and(|og| !og.is_disjoint(g))) {
                return Err(err(
                    &path,
                    Some(gl),
                    format!("worker.gpus of {unit}: GPUs overlap with those of {}: two servers cannot share GPUs; give each worker its own GPUs", o.unit),
                ));
            }
        }
        let api_key = match w.api_key_file {
            None => None,
            Some(k) => {
                let kl = line_of(&texts.iter().find(|t| t.0 == path).map(|t| t.1.clone()).unwrap_or_default(), k.span().start);
                Some(KeySource::parse(k.get_ref()).map_err(|why| err(&path, Some(kl), format!("worker.api_key_file of {unit}: {why}")))?)
            }
        };
        seen.push((unit.clone(), path.clone(), line));
        out_workers.push(Worker {
            unit,
            role: w.role,
            url: url.trim_end_matches('/').to_string(),
            bootstrap_port: w.bootstrap_port,
            gpus,
            watch_files: w.watch_files,
            api_key,
        });
    }
    let order = ro.order.unwrap_or_else(|| vec![Role::Prefill, Role::Decode, Role::Regular]);
    for w in &out_workers {
        if !order.contains(&w.role) {
            return Err(err(
                &last,
                None,
                format!(
                    "rollout.order: role {:?} of {} is not in the order {:?}",
                    w.role.as_str(),
                    w.unit,
                    order.iter().map(|r| r.as_str()).collect::<Vec<_>>()
                ),
            ));
        }
    }
    let max_unavailable = match ro.max_unavailable {
        Some(m) if *m.get_ref() == 0 => {
            return Err(at("ro.max_unavailable", "must be at least 1 (a restart takes a unit down)".into()));
        }
        Some(m) => m.into_inner(),
        None => 1,
    };
    let router = match rt.url.map(OneOrMany::list) {
        Some(urls) if urls.is_empty() => return Err(at("rt.url", "is an empty list; give the gateway's URL (or each replica's)".into())),
        Some(urls) => {
            let metrics: Vec<String> = rt.metrics_url.map(OneOrMany::list).unwrap_or_default();
            if !metrics.is_empty() && metrics.len() != urls.len() {
                return Err(at(
                    "rt.metrics_url",
                    format!("lists {} endpoint(s) for {} router url(s): give one per replica, in the same order", metrics.len(), urls.len()),
                ));
            }
            let mut replicas = Vec::new();
            for (i, url) in urls.iter().enumerate() {
                server_url(url).map_err(|why| at("rt.url", format!("{url:?} {why}")))?;
                if replicas.iter().any(|r: &Replica| same_url(&r.url, url)) {
                    return Err(at("rt.url", format!("{url:?} is listed twice")));
                }
                let m = metrics.get(i).cloned();
                if let Some(m) = &m {
                    canonical_url(m).map_err(|why| at("rt.metrics_url", format!("{m:?} {why}")))?;
                }
                replicas.push(Replica { url: url.trim_end_matches('/').to_string(), metrics_url: m });
            }
            let api_key = match &rt.api_key_file {
                Some(k) => Some(KeySource::parse(k).map_err(|why| at("rt.api_key_file", why))?),
                None => None,
            };
            Some(RouterSettings { url: replicas[0].url.clone(), metrics_url: replicas[0].metrics_url.clone(), replicas, api_key })
        }
        None => None,
    };
    let availability_probe = match &vf.availability_probe {
        Some(r) => crate::availability::parse_rate(r).map_err(|why| at("vf.availability_probe", why))?,
        None => Some(2.0),
    };
    let verify = Verify {
        router: vf.router.unwrap_or(true) && router.is_some(),
        metrics: vf.metrics.unwrap_or(MetricsMode::Required),
        smoke_request: vf.smoke_request.unwrap_or(true),
        warmup_request: vf.warmup_request.unwrap_or(true),
        availability_probe: if router.is_some() { availability_probe } else { None },
        pair: vf.pair.unwrap_or(true),
        pair_timeout: d(30),
        stranded_kv: vf.stranded_kv.unwrap_or(StrandedKv::Warn),
        stranded_kv_timeout: None,
    };
    if vf.router == Some(true) && router.is_none() {
        return Err(err(&last, None, "verify.router = true needs [router] url".into()));
    }
    let ready_pattern = match (ro.ready_pattern, ready_origin) {
        (Some(p), Some((path, line))) => {
            let p = p.into_inner();
            if let Some(why) = crate::sglang::unusable_ready_pattern(&p) {
                return Err(err(
                    &path,
                    Some(line),
                    format!("rollout.ready_pattern: {p:?} cannot be the ready pattern: {why}; use a substring of SGLang's ready line (the default)"),
                ));
            }
            p
        }
        _ => crate::sglang::READY_LINE.to_string(),
    };
    // `key` is a [rollout] key, or "vf.KEY" for one of [verify].
    let bounded = |key: &str, v: Option<Dur>, default: Duration| -> Result<Duration, ConfigError> {
        let (sect, key) = key.split_once('.').unwrap_or(("ro", key));
        let Some(Dur(v)) = v else {
            return Ok(default);
        };
        let (_, min, max) = DURATION_BOUNDS.iter().find(|(k, _, _)| *k == key).copied().unwrap_or((key, Duration::ZERO, Duration::MAX));
        if v < min || v > max {
            return Err(at(
                &format!("{sect}.{key}"),
                format!(
                    "{} is outside {} to {} (docs/cli.md lists each duration's bounds)",
                    humantime::format_duration(v),
                    humantime::format_duration(min),
                    humantime::format_duration(max)
                ),
            ));
        }
        Ok(v)
    };
    let ready_timeout = bounded("ready_timeout", ro.ready_timeout, d(15 * 60))?;
    let verify = Verify {
        pair_timeout: bounded("vf.pair_timeout", vf.pair_timeout, d(30))?,
        stranded_kv_timeout: match vf.stranded_kv_timeout {
            Some(v) => Some(bounded("vf.stranded_kv_timeout", Some(v), d(0))?),
            None => None,
        },
        ..verify
    };
    let fleet = if fleet_seen {
        let etcd = fl.etcd.unwrap_or_default();
        if etcd.is_empty() {
            return Err(at("fl.etcd", "[fleet] needs etcd = [\"http://HOST:2379\", …] (the endpoints of the fleet's etcd cluster)".into()));
        }
        for e in &etcd {
            server_url(e).map_err(|why| at("fl.etcd", format!("{e:?} {why}")))?;
        }
        let name = fl.name.unwrap_or_default();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(at("fl.name", format!("{name:?} must be a non-empty name of letters, digits, '-', '_' or '.' (it is the key prefix /pdctl/NAME/)")));
        }
        let host = match fl.host {
            Some(h) => h,
            None => std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default(),
        };
        if host.is_empty() || host.contains('/') {
            return Err(at("fl.host", format!("{host:?} must be a non-empty host name without '/'")));
        }
        let max_unavailable: std::collections::BTreeMap<String, u32> =
            fl.max_unavailable.unwrap_or_default().into_iter().map(|(r, n)| (r.as_str().to_string(), n)).collect();
        if let Some((r, _)) = max_unavailable.iter().find(|(_, n)| **n == 0) {
            return Err(at("fl.max_unavailable", format!("{r} = 0 would never let a {r} worker restart; use at least 1")));
        }
        let user = match (fl.user, fl.password_file) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            _ => return Err(at("fl.user", "user and password_file go together (etcd authentication)".into())),
        };
        let identity = match (fl.cert_file, fl.key_file) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(at("fl.cert_file", "cert_file and key_file go together (etcd client certificate)".into())),
        };
        let https = etcd.iter().any(|e| e.starts_with("https://"));
        let tls = (https || fl.ca_file.is_some() || identity.is_some()).then_some(FleetTls { ca_file: fl.ca_file, identity });
        if tls.as_ref().is_some_and(|t| t.ca_file.is_none()) {
            return Err(at("fl.etcd", "https:// endpoints (or a client certificate) need ca_file: the CA that signed etcd's certificates".into()));
        }
        Some(FleetSettings {
            etcd,
            name,
            host,
            slot_timeout: bounded("fl.slot_timeout", fl.slot_timeout, d(30 * 60))?,
            max_unavailable,
            user,
            canary: fl.canary,
            tls,
        })
    } else {
        None
    };
    let bus = match (sd.address, sd.bus) {
        (Some(a), _) => BusSetting::Address(a),
        (None, Some(BusKind::User)) => BusSetting::User,
        (None, _) => BusSetting::System,
    };
    Ok(Settings {
        bus,
        journal_directory: jn.directory,
        procfs: jn.procfs.unwrap_or_else(|| PathBuf::from("/proc")),
        router,
        workers: out_workers,
        rollout: Rollout {
            order,
            ready_pattern,
            fatal_patterns: crate::sglang::fatal_patterns(&ro.fatal_patterns.unwrap_or_default()),
            ready_timeout,
            health_timeout: bounded("health_timeout", ro.health_timeout, d(5 * 60))?,
            router_timeout: bounded("router_timeout", ro.router_timeout, d(3 * 60))?,
            metrics_timeout: bounded("metrics_timeout", ro.metrics_timeout, d(40))?,
            job_timeout: bounded("job_timeout", ro.job_timeout, ready_timeout)?,
            min_healthy: bounded("min_healthy", ro.min_healthy, d(10))?,
            on_failure: ro.on_failure.unwrap_or(OnFailure::Halt),
            max_unavailable,
            drain: ro.drain.unwrap_or(true) && verify.router,
            drain_timeout: bounded("drain_timeout", ro.drain_timeout, d(120))?,
            allow_outage: ro.allow_outage.unwrap_or(false),
            single_pair: ro.single_pair.unwrap_or(SinglePair::Sequential),
            max_failed_probes: ro.max_failed_probes,
            on_stale_pair: ro.on_stale_pair.unwrap_or(OnStalePair::RestartDecode),
            abort_after_drain_timeout: ro.abort_after_drain_timeout.unwrap_or(false),
            unknown_load: ro.unknown_load.unwrap_or(UnknownLoad::Halt),
        },
        verify,
        fleet,
        sources: texts.iter().map(|t| t.0.clone()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[systemd]
bus = "system"
[router]
url = "http://127.0.0.1:30001"
metrics_url = "http://127.0.0.1:29001/metrics"
[[worker]]
unit = "sglang-dsv4-prefill.service"
role = "prefill"
url = "http://127.0.0.1:30003"
bootstrap_port = 8998
gpus = "0-3"
[[worker]]
unit = "sglang-dsv4-decode.service"
role = "decode"
url = "http://127.0.0.1:30002"
gpus = "4-7"
[rollout]
order = ["prefill", "decode"]
ready_pattern = "The server is fired up and ready to roll!"
ready_timeout = "15m"
min_healthy = "10s"
on_failure = "halt"
max_unavailable = 1
drain = true
drain_timeout = "2m"
[verify]
router = true
metrics = "required"
smoke_request = true
"#;

    fn one(text: &str) -> Result<Settings, ConfigError> {
        load_texts(&[(PathBuf::from("/etc/pdctl/pdctl.toml"), text.to_string())])
    }

    #[test]
    fn the_design_contract_parses() {
        let s = one(BASE).unwrap();
        assert_eq!(s.workers.len(), 2);
        assert_eq!(s.workers[0].gpus, Some((0..=3).collect()));
        assert_eq!(s.rollout.ready_timeout, Duration::from_secs(900));
        assert_eq!(s.bus, BusSetting::System);
        assert!(s.verify.router && s.rollout.drain);
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = BASE.replace("min_healthy = \"10s\"", "min_healthy = \"10s\"\nmin_heathy = \"5s\"");
        let e = one(&text).unwrap_err();
        assert_eq!(e.file, "/etc/pdctl/pdctl.toml");
        assert_eq!(e.line, Some(text.lines().position(|l| l.starts_with("min_heathy")).unwrap() + 1));
        assert!(e.msg.contains("min_heathy"), "{e}");
        assert!(e.to_string().starts_with("/etc/pdctl/pdctl.toml:"), "{e}");
    }

    #[test]
    fn bad_duration_and_enum_name_the_line() {
        let e = one(&BASE.replace("\"15m\"", "\"fifteen minutes\"")).unwrap_err();
        assert!(e.msg.contains("invalid duration"), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("ready_timeout")).unwrap() + 1));
        let e = one(&BASE.replace("on_failure = \"halt\"", "on_failure = \"pray\"")).unwrap_err();
        assert!(e.msg.contains("pray"), "{e}");
    }

    #[test]
    fn fragments_override_and_add_workers() {
        let frag = "[rollout]\nmin_healthy = \"1s\"\n[[worker]]\nunit = \"extra.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:1\"\n";
        let s = load_texts(&[(PathBuf::from("a.toml"), BASE.into()), (PathBuf::from("config.d/10.toml"), frag.into())]).unwrap();
        assert_eq!(s.rollout.min_healthy, Duration::from_secs(1));
        assert_eq!(s.workers.len(), 3);
        let dup = "[[worker]]\nunit = \"sglang-dsv4-decode.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:1\"\n";
        let e = load_texts(&[(PathBuf::from("a.toml"), BASE.into()), (PathBuf::from("config.d/20.toml"), dup.into())]).unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("config.d/20.toml", Some(2)));
        assert!(e.msg.contains("configured twice"), "{e}");
    }

    #[test]
    fn semantic_errors() {
        assert!(one(&BASE.replace("gpus = \"4-7\"", "gpus = \"four\"")).unwrap_err().msg.contains("worker.gpus"));
        assert!(one(&BASE.replace("max_unavailable = 1", "max_unavailable = 0")).unwrap_err().msg.contains("max_unavailable"));
        assert!(one(&BASE.replace("order = [\"prefill\", \"decode\"]", "order = [\"prefill\"]")).unwrap_err().msg.contains("not in the order"));
        assert!(one("").unwrap_err().msg.contains("no [[worker]]"));
    }

    #[test]
    fn the_shipped_example_config_is_valid() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/pdctl.toml");
        let s = load(&p).unwrap();
        assert_eq!(s.workers.iter().map(|w| w.role).collect::<Vec<_>>(), vec![Role::Prefill, Role::Decode]);
        assert_eq!(s.router.unwrap().metrics_url.as_deref(), Some("http://127.0.0.1:29001/metrics"));
    }

    #[test]
    fn ready_pattern_cannot_match_early_lines_and_fatal_patterns_only_add() {
        let e = one(&BASE.replace("ready_pattern = \"The server is fired up and ready to roll!\"", "ready_pattern = \"\"")).unwrap_err();
        assert!(e.msg.contains("rollout.ready_pattern") && e.msg.contains("empty"), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("ready_pattern")).unwrap() + 1));
        let e = one(&BASE.replace("ready_pattern = \"The server is fired up and ready to roll!\"", "ready_pattern = \"server\"")).unwrap_err();
        assert!(e.msg.contains("server_args") || e.msg.contains("Started server process"), "{e}");
        let s = one(&BASE.replace("drain_timeout = \"2m\"", "drain_timeout = \"2m\"\nfatal_patterns = [\"CUDA out of memory\"]")).unwrap();
        assert!(s.rollout.fatal_patterns.iter().any(|p| p == "CUDA out of memory"));
        assert!(s.rollout.fatal_patterns.iter().any(|p| p == "Initialization failed"), "SGLang's patterns stay");
        let s = one(&BASE.replace("drain_timeout = \"2m\"", "drain_timeout = \"2m\"\nfatal_patterns = []")).unwrap();
        assert_eq!(s.rollout.fatal_patterns.len(), crate::sglang::FATAL_PATTERNS.len(), "an empty list cannot remove them");
    }

    #[test]
    fn durations_have_bounds_and_errors_name_file_line_key() {
        for (key, bad) in [("min_healthy", "0s"), ("drain_timeout", "0s"), ("ready_timeout", "48h"), ("job_timeout", "500ms")] {
            let base: Vec<&str> = BASE.lines().filter(|l| !l.starts_with(&format!("{key} ="))).collect();
            let text = base.join("\n").replace("[verify]", &format!("{key} = \"{bad}\"\n[verify]"));
            let e = one(&text).unwrap_err();
            assert!(e.msg.starts_with(&format!("rollout.{key}: ")) && e.msg.contains("outside"), "{key}: {e}");
            assert_eq!(e.line, Some(text.lines().position(|l| l.starts_with(&format!("{key} = "))).unwrap() + 1), "{key}: {e}");
        }
        // A fragment that sets it is the one named.
        let frag = "[rollout]\nmin_healthy = \"0s\"\n";
        let e = load_texts(&[(PathBuf::from("a.toml"), BASE.into()), (PathBuf::from("config.d/10.toml"), frag.into())]).unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("config.d/10.toml", Some(2)), "{e}");
    }

    #[test]
    fn urls_are_checked_and_compared_canonically() {
        for bad in ["http://", "ftp://127.0.0.1:1", "127.0.0.1:30003", "http://127.0.0.1:99999", "http://127.0.0.1:30003/generate", "http://u:p@127.0.0.1:1"] {
            let e = one(&BASE.replace("url = \"http://127.0.0.1:30003\"", &format!("url = \"{bad}\""))).unwrap_err();
            assert!(e.msg.starts_with("worker.url of sglang-dsv4-prefill.service"), "{bad}: {e}");
            assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("url = \"http://127.0.0.1:30003")).unwrap() + 1));
        }
        let e = one(&BASE.replace("url = \"http://127.0.0.1:30001\"", "url = \"http//127.0.0.1:30001\"")).unwrap_err();
        assert!(e.msg.starts_with("router.url: "), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("url = \"http://127.0.0.1:30001")).unwrap() + 1));
        let e = one(&BASE.replace("url = \"http://127.0.0.1:30002\"", "url = \"HTTP://127.0.0.1:30003/\"")).unwrap_err();
        assert!(e.msg.contains("also the URL of sglang-dsv4-prefill.service"), "{e}");
        assert!(same_url("http://LOCALHOST:80/", "http://localhost"));
        assert!(same_url("http://127.0.0.1:30003", "http://127.0.0.1:30003/"));
        assert!(!same_url("http://127.0.0.1:30003", "https://127.0.0.1:30003"));
        assert!(!same_url("http://127.0.0.1:30003", "http://127.0.0.1:30004"));
    }

    #[test]
    fn overlapping_gpus_are_a_config_error() {
        let e = one(&BASE.replace("gpus = \"4-7\"", "gpus = \"3-7\"")).unwrap_err();
        assert!(e.msg.contains("overlap with those of sglang-dsv4-prefill.service"), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("gpus = \"4-7\"")).unwrap() + 1));
    }

    #[test]
    fn gpu_lists() {
        assert_eq!(parse_gpus("0-1,6"), Some([0, 1, 6].into_iter().collect()));
        assert_eq!(parse_gpus("3-1"), None);
        assert_eq!(parse_gpus(""), None);
    }
}
