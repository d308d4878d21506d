//! The HTTP port ([`Probes`]): checks of workers and the gateway, and SGLang's runtime calls, with
//! the facts they report.

use std::future::Future;
use std::time::Duration;

use crate::cause::MetricsDiagnosis;
pub use crate::pair_probe::{Half, PairProbe, PdQueues};

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
