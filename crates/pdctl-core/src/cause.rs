//! Every failure pdctl knows, as one enum. The human sentence, the stable `cause_code` (JSON
//! summary, record, metric label), the `kind` (gate / config / access / busy), the exit code and
//! the HTTP status of a control-API error are all derived from a [`Cause`] by exhaustive `match`es
//! below — nothing anywhere matches the text of a message.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exit::Exit;

/// The class of a failure: what the operator must fix, and so the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FailureKind {
    /// A gate did not pass: the server, the router or the change is at fault (exit 1).
    Gate,
    /// The configuration or the request is wrong (exit 2).
    Config,
    /// systemd, the journal, the router in preflight or pdctld's state cannot be reached or
    /// written, or permission denied (exit 3).
    Access,
    /// Another rollout is running (exit 4; control-API errors only, never a rollout's `failed`).
    Busy,
}

impl FailureKind {
    /// The exit code of this kind (the table in [`crate::exit::Exit`]).
    pub fn exit(self) -> Exit {
        match self {
            FailureKind::Gate => Exit::GateFailed,
            FailureKind::Config => Exit::Usage,
            FailureKind::Access => Exit::Unreachable,
            FailureKind::Busy => Exit::Busy,
        }
    }
}

/// When a unit was seen to crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Between the restart and the ready line.
    Starting,
    /// While waiting for `/health`.
    Health,
    /// While its PD pairs were probed.
    Pair,
    /// During the soak.
    Soak,
}

/// What the router showed last before a router gate gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterSeen {
    /// `GET /workers` failed.
    Down(String),
    /// The worker is not listed (and was not, or could not yet be, re-registered).
    NotListed,
    /// Registered by pdctl; the router has not listed it yet.
    RegistrationPending,
    /// Listed, not healthy (or, on gateways that say so, not `ready`).
    Unhealthy(String),
    /// Healthy, but its circuit breaker is open.
    BreakerOpen,
    /// Healthy, breaker closed, but a request through the router failed.
    SmokeFailed(String),
}

impl std::fmt::Display for RouterSeen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouterSeen::Down(e) => write!(f, "the router does not answer: {e}"),
            RouterSeen::NotListed => f.write_str("the router does not list it"),
            RouterSeen::RegistrationPending => f.write_str("registered; waiting for the router to admit it"),
            RouterSeen::Unhealthy(s) => write!(f, "listed but not healthy yet ({s})"),
            RouterSeen::BreakerOpen => f.write_str("healthy, but its circuit breaker is open (smg_worker_cb_state=1): requests are still refused"),
            RouterSeen::SmokeFailed(e) => write!(f, "healthy, but a request through the router failed: {e}"),
        }
    }
}

/// Why `/metrics` gave no usable KV gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsDiagnosis {
    /// 404: the server runs without `--enable-metrics`.
    Disabled,
    /// No answer (connection refused, timeout, an error status).
    Unreachable,
    /// Not valid Prometheus text.
    Unparseable,
    /// SGLang has not published its usage gauges yet (and the warm-up did not make it).
    NotPublished,
    /// SGLang gauges exist but none under a known name (a renamed gauge).
    UnknownNames,
    /// Values out of range, or the KV accounting does not add up.
    Insane,
}

/// The code of [`Cause::FleetLost`]: a rollout that ends on it is interrupted, not finished
/// ([`crate::lifecycle::Lifecycle::conclude`]).
pub const FLEET_LOST: &str = "fleet_lost";

/// Every failure pdctl can report. Variants carry the facts their sentence needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    // --- systemd and the journal (from the drivers' errors) ---
    /// The unit is not known to systemd.
    UnitMissing {
        /// systemd's sentence.
        message: String,
    },
    /// The bus or the manager cannot be reached.
    SystemdUnreachable {
        /// The driver's sentence.
        message: String,
    },
    /// systemd (polkit) said no.
    AccessDenied {
        /// The driver's sentence.
        message: String,
    },
    /// A D-Bus call or our restart job took longer than its limit.
    SystemdTimeout {
        /// The driver's sentence.
        message: String,
    },
    /// systemd refused a call for another reason.
    SystemdRefused {
        /// The driver's sentence.
        message: String,
    },
    /// The journal cannot be read.
    JournalUnreadable {
        /// The driver's sentence.
        message: String,
    },
    /// The journal follower or the D-Bus signal stream ended while a gate waited on it.
    EventSourceClosed {
        /// Which one.
        what: String,
    },
    // --- preflight ---
    /// The metrics gate is required but the unit does not enable metrics.
    MetricsDisabled {
        /// The unit.
        unit: String,
    },
    /// The plan takes the only worker of a role down, and no one said that is acceptable.
    OnlyWorkerOfRole {
        /// The unit.
        unit: String,
        /// Its role.
        role: String,
        /// How long serving stops: its last measured window out of the router, or its last
        /// start (`None`: never measured).
        expected: Option<crate::clock::StartTime>,
    },
    /// Two workers' GPU sets overlap.
    GpuOverlap {
        /// The unit.
        unit: String,
        /// Its GPUs.
        gpus: String,
        /// The other unit.
        other: String,
        /// The other unit's GPUs.
        other_gpus: String,
    },
    /// The router does not answer in preflight.
    RouterUnreachable {
        /// The HTTP error.
        error: String,
    },
    // --- drain ---
    /// The router could not be asked to remove the worker.
    DrainFailed {
        /// The unit.
        unit: String,
        /// What went wrong.
        error: String,
    },
    // --- restart ---
    /// Our restart job ended with a result other than `done`.
    JobFailed {
        /// The unit.
        unit: String,
        /// The job's result.
        job_result: String,
        /// The service's `Result`.
        service_result: String,
    },
    // --- ready, health, soak ---
    /// A fatal line of this run.
    FatalLine {
        /// The unit.
        unit: String,
        /// The pattern and the line.
        line: String,
    },
    /// The unit failed, exited or was restarted behind our back.
    Crashed {
        /// The unit.
        unit: String,
        /// When.
        phase: Phase,
        /// What systemd (and the journal) showed.
        why: String,
    },
    /// No ready line of this run in time.
    ReadyTimeout {
        /// The unit.
        unit: String,
        /// The pattern waited for.
        pattern: String,
        /// The limit.
        after: Duration,
        /// Ready lines of other runs seen and ignored.
        foreign: u32,
    },
    /// `/health` never answered 200 in time.
    HealthTimeout {
        /// The worker URL.
        url: String,
        /// The limit.
        after: Duration,
        /// The last answer.
        last: String,
    },
    // --- router ---
    /// The router lists the worker under another role.
    WrongWorkerType {
        /// The worker URL.
        url: String,
        /// What the router says.
        listed: String,
        /// What the config says.
        role: String,
    },
    /// The router does not list the worker and refused to register it.
    RegisterRefused {
        /// The worker URL.
        url: String,
        /// The HTTP error.
        error: String,
    },
    /// The router did not admit the worker in time.
    RouterNeverAdmits {
        /// The worker URL.
        url: String,
        /// Time waited.
        after: Duration,
        /// The last observation.
        last: String,
    },
    /// Admitted and healthy, but its circuit breaker stayed open.
    CircuitOpen {
        /// The worker URL.
        url: String,
        /// Time waited.
        after: Duration,
    },
    /// Admitted, breaker closed, but a request through the router kept failing.
    SmokeFailed {
        /// The worker URL.
        url: String,
        /// Time waited.
        after: Duration,
        /// The last error.
        error: String,
    },
    /// The availability probe saw more failed requests than `max_failed_probes`.
    ClientsFailing {
        /// The unit the rollout was working on.
        unit: String,
        /// Failed probe requests so far.
        failed: u64,
        /// The limit.
        max: u64,
    },
    // --- PD pairs ---
    /// A decode still uses the bootstrap info of a restarted prefill's previous process.
    StalePair {
        /// The decode.
        decode: String,
        /// The restarted prefill.
        prefill: String,
    },
    /// A prefill and a decode disagree on a setting pairing needs.
    PairIncompatible {
        /// The prefill.
        prefill: String,
        /// The decode.
        decode: String,
        /// Both sides' values.
        detail: String,
    },
    /// A pair probe failed on one side (or in the transfer, unexplained by a restart).
    PairBroken {
        /// The prefill.
        prefill: String,
        /// The decode.
        decode: String,
        /// `prefill`, `decode` or `transfer`.
        side: String,
        /// What that side answered.
        error: String,
    },
    /// A decode with a stale pairing cannot be restarted as a repair.
    RepairBlocked {
        /// The decode.
        decode: String,
        /// The restarted prefill.
        prefill: String,
        /// Why, and what to do.
        why: String,
    },
    /// A change would make a worker unable to pair with its running peers.
    IncompatibleChange {
        /// The unit whose ExecStart changes.
        unit: String,
        /// The peer.
        peer: String,
        /// Both sides' values.
        detail: String,
    },
    /// Prefills still hold KV for a restarted decode's rooms after the deadline.
    StrandedKv {
        /// The restarted decode.
        decode: String,
        /// What is still held, per prefill.
        held: String,
        /// The deadline.
        after: Duration,
    },
    // --- fleet ---
    /// The fleet's etcd cannot be reached before anything was touched.
    FleetUnreachable {
        /// The driver's sentence.
        message: String,
    },
    /// The fleet's etcd was lost during the rollout: the unit in progress was finished, no new
    /// slot is taken.
    FleetLost {
        /// The driver's sentence.
        message: String,
    },
    /// This host's `[fleet.max_unavailable]` disagrees with the fleet's (in etcd).
    FleetLimits {
        /// The role.
        role: String,
        /// etcd's value.
        etcd: String,
        /// This host's.
        local: String,
    },
    /// pdctld's own unit does not let it connect to a configured address.
    AddressBlocked {
        /// What is there (`etcd`, `the router`, a unit).
        what: String,
        /// The URL.
        url: String,
    },
    /// No slot within `slot_timeout`.
    SlotTimeout {
        /// Who held what, last.
        last: String,
        /// The limit.
        after: Duration,
    },
    // --- metrics ---
    /// No usable KV gauges, with the diagnosis.
    MetricsMissing {
        /// The unit.
        unit: String,
        /// Which known cause.
        diagnosis: MetricsDiagnosis,
        /// The probe's sentence.
        detail: String,
        /// Whether the gate waited (and how long) before giving up.
        waited: Option<Duration>,
    },
    // --- control API ---
    /// The configuration does not load.
    ConfigInvalid {
        /// The loader's sentence (file:line: key …).
        message: String,
    },
    /// The request is malformed or names something unknown.
    BadRequest {
        /// What is wrong.
        message: String,
    },
    /// Another rollout is running.
    Busy {
        /// Its id.
        id: String,
    },
    /// pdctld is restoring drains it made before it stopped.
    Reconciling {
        /// The units it is restoring.
        units: Vec<String>,
    },
    /// A drained worker could not be re-admitted: it is out of the router and not serving.
    DrainNotRestored {
        /// The unit.
        unit: String,
        /// What was seen.
        why: String,
    },
    /// pdctld's records are not being saved (a write failed after retries).
    RecordsFailing {
        /// The last error.
        error: String,
    },
    /// No rollout with that id.
    NoSuchRollout {
        /// The id.
        id: String,
    },
    /// The rollout is not in a state that allows the request.
    WrongState {
        /// The id.
        id: String,
        /// Its state.
        state: String,
        /// What was asked and what it needs.
        needs: String,
    },
    /// The state directory cannot be written.
    RecordUnwritable {
        /// The directory.
        dir: String,
        /// The I/O error.
        error: String,
    },
    /// A plain restart would load changes the unit does not run yet (files changed on disk,
    /// drop-ins systemd has not loaded, a change pdctl quarantined): refused unless asked to.
    ChangesPending {
        /// The unit.
        unit: String,
        /// What changed, one clause each.
        changes: String,
        /// The change already failed in a rollout (its id and cause), if it did.
        quarantined: Option<String>,
    },
    /// The drain could not read the worker's in-flight requests: no load endpoint pdctl knows
    /// answered (`/v1/loads`, `/get_load`), so "nothing in flight" is unknown.
    LoadUnknown {
        /// The worker's URL.
        url: String,
        /// What the endpoints answered.
        error: String,
    },
    /// A worker refused pdctl's call for its API key (401/403): the worker runs with `--api-key`
    /// and pdctl's key is missing or wrong.
    ApiKeyRejected {
        /// The URL called.
        endpoint: String,
        /// The status.
        status: u16,
        /// Which key pdctl sent, in words (never the key).
        key: String,
    },
    /// A stop that lasted until systemd's SIGKILL at `TimeoutStopSec=` (SGLang's stop waits for
    /// its requests in flight): requests were lost. Reported as a warning of the restart step.
    StopSlow {
        /// The unit.
        unit: String,
        /// What the stop took and why ([`crate::stop::StopReport::why`]).
        why: String,
    },
    /// `pdctl check`: the unit is not running, so it cannot pass any gate.
    UnitNotRunning {
        /// The unit.
        unit: String,
        /// Its systemd state (`inactive/dead`, `failed/failed`, …).
        state: String,
    },
    /// The worker is admitted, but a request through the gateway fails because no worker of
    /// the other PD role is admitted: that role is the fault, not this worker.
    PeerRoleDown {
        /// The worker's URL.
        url: String,
        /// The role with no admitted worker.
        role: String,
        /// The request's error.
        error: String,
    },
    /// The config the CLI was given is not the one pdctld runs with.
    ConfigMismatch {
        /// The CLI's config path and digest.
        given: String,
        /// pdctld's config path and digest.
        daemon: String,
    },
}

/// A duration for people: "30.1s", "250ms", "2m05s" (never "30.081551416s").
pub fn dur(d: &Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", d.as_secs_f64()),
        _ => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// "about 11s (its last measured window out of the router: drain, stop, start, gates,
/// re-admission)"; where only a start was measured, that start as a lower bound; or what is known
/// without a measurement.
pub fn outage(expected: &Option<crate::clock::StartTime>) -> String {
    let secs = |ms: u64| ms.div_ceil(1000).max(1);
    match expected {
        Some(crate::clock::StartTime { window_ms: Some(w), .. }) => {
            format!("about {}s (its last measured window out of the router: drain, stop, start, gates, re-admission)", secs(*w))
        }
        Some(s) if s.ms > 0 => {
            format!("more than {}s (its last measured start, {}s, plus its drain, stop and re-admission, not measured here yet)", secs(s.ms), secs(s.ms))
        }
        _ => "as long as its drain, stop, start and re-admission take (not measured here yet; a real model's start alone takes 60-80 s)".into(),
    }
}

impl Cause {
    /// The stable snake_case code (`failed.cause_code`, the metric label).
    pub fn code(&self) -> &'static str {
        match self {
            Cause::UnitMissing { .. } => "unit_missing",
            Cause::SystemdUnreachable { .. } => "systemd_unreachable",
            Cause::AccessDenied { .. } => "access_denied",
            Cause::SystemdTimeout { .. } => "systemd_timeout",
            Cause::SystemdRefused { .. } => "systemd_refused",
            Cause::JournalUnreadable { .. } => "journal_unreadable",
            Cause::EventSourceClosed { .. } => "event_source_closed",
            Cause::MetricsDisabled { .. } => "metrics_disabled",
            Cause::GpuOverlap { .. } => "gpu_overlap",
            Cause::OnlyWorkerOfRole { .. } => "only_worker_of_role",
            Cause::RouterUnreachable { .. } => "router_unreachable",
            Cause::DrainFailed { .. } => "drain_failed",
            Cause::JobFailed { .. } => "job_failed",
            Cause::FatalLine { .. } => "fatal_line",
            Cause::Crashed { .. } => "crashed",
            Cause::ReadyTimeout { .. } => "ready_timeout",
            Cause::HealthTimeout { .. } => "health_timeout",
            Cause::WrongWorkerType { .. } => "wrong_worker_type",
            Cause::RegisterRefused { .. } => "register_refused",
            Cause::RouterNeverAdmits { .. } => "router_never_admits",
            Cause::CircuitOpen { .. } => "circuit_open",
            Cause::SmokeFailed { .. } => "smoke_request_failed",
            Cause::ClientsFailing { .. } => "clients_failing",
            Cause::FleetUnreachable { .. } => "fleet_unreachable",
            Cause::FleetLost { .. } => FLEET_LOST,
            Cause::FleetLimits { .. } => "fleet_limits",
            Cause::SlotTimeout { .. } => "slot_timeout",
            Cause::AddressBlocked { .. } => "address_blocked",
            Cause::StalePair { .. } => "stale_pair",
            Cause::PairIncompatible { .. } => "pair_incompatible",
            Cause::PairBroken { .. } => "pair_broken",
            Cause::RepairBlocked { .. } => "repair_blocked",
            Cause::IncompatibleChange { .. } => "incompatible_change",
            Cause::StrandedKv { .. } => "stranded_kv",
            Cause::MetricsMissing { diagnosis, .. } => match diagnosis {
                MetricsDiagnosis::Disabled => "metrics_disabled",
                MetricsDiagnosis::Unreachable => "metrics_unreachable",
                MetricsDiagnosis::Unparseable => "metrics_unparseable",
                MetricsDiagnosis::NotPublished => "metrics_not_published",
                MetricsDiagnosis::UnknownNames => "metrics_unknown_names",
                MetricsDiagnosis::Insane => "metrics_insane",
            },
            Cause::ConfigInvalid { .. } => "config_invalid",
            Cause::BadRequest { .. } => "bad_request",
            Cause::Busy { .. } => "busy",
            Cause::Reconciling { .. } => "reconciling",
            Cause::DrainNotRestored { .. } => "drain_not_restored",
            Cause::RecordsFailing { .. } => "records_failing",
            Cause::NoSuchRollout { .. } => "no_such_rollout",
            Cause::WrongState { .. } => "wrong_state",
            Cause::RecordUnwritable { .. } => "record_unwritable",
            Cause::ChangesPending { .. } => "changes_pending",
            Cause::ConfigMismatch { .. } => "config_mismatch",
            Cause::UnitNotRunning { .. } => "unit_not_running",
            Cause::LoadUnknown { .. } => "load_unknown",
            Cause::StopSlow { .. } => "stop_slow",
            Cause::ApiKeyRejected { .. } => "api_key_rejected",
            Cause::PeerRoleDown { .. } => "peer_role_down",
        }
    }

    /// The kind (and so the exit code).
    pub fn kind(&self) -> FailureKind {
        match self {
            Cause::UnitMissing { .. }
            | Cause::ConfigInvalid { .. }
            | Cause::BadRequest { .. }
            | Cause::NoSuchRollout { .. }
            | Cause::WrongState { .. }
            | Cause::OnlyWorkerOfRole { .. }
            | Cause::FleetLimits { .. }
            | Cause::ChangesPending { .. }
            | Cause::ConfigMismatch { .. }
            | Cause::ApiKeyRejected { .. }
            | Cause::AddressBlocked { .. } => FailureKind::Config,
            Cause::FleetUnreachable { .. } | Cause::FleetLost { .. } => FailureKind::Access,
            Cause::SystemdUnreachable { .. }
            | Cause::AccessDenied { .. }
            | Cause::SystemdTimeout { .. }
            | Cause::JournalUnreadable { .. }
            | Cause::RouterUnreachable { .. }
            | Cause::RecordUnwritable { .. } => FailureKind::Access,
            Cause::Busy { .. } | Cause::Reconciling { .. } => FailureKind::Busy,
            Cause::RecordsFailing { .. } => FailureKind::Access,
            Cause::SystemdRefused { .. }
            | Cause::EventSourceClosed { .. }
            | Cause::MetricsDisabled { .. }
            | Cause::GpuOverlap { .. }
            | Cause::DrainFailed { .. }
            | Cause::JobFailed { .. }
            | Cause::FatalLine { .. }
            | Cause::Crashed { .. }
            | Cause::ReadyTimeout { .. }
            | Cause::HealthTimeout { .. }
            | Cause::WrongWorkerType { .. }
            | Cause::RegisterRefused { .. }
            | Cause::RouterNeverAdmits { .. }
            | Cause::CircuitOpen { .. }
            | Cause::SmokeFailed { .. }
            | Cause::ClientsFailing { .. }
            | Cause::StalePair { .. }
            | Cause::PairIncompatible { .. }
            | Cause::PairBroken { .. }
            | Cause::RepairBlocked { .. }
            | Cause::IncompatibleChange { .. }
            | Cause::StrandedKv { .. }
            | Cause::SlotTimeout { .. }
            | Cause::MetricsMissing { .. }
            | Cause::DrainNotRestored { .. }
            | Cause::UnitNotRunning { .. }
            | Cause::LoadUnknown { .. }
            | Cause::StopSlow { .. }
            | Cause::PeerRoleDown { .. } => FailureKind::Gate,
        }
    }

    /// The exit code.
    pub fn exit(&self) -> Exit {
        self.kind().exit()
    }

    /// The HTTP status of a control-API error with this cause: by its kind (config 400, access
    /// 503, busy 409, gate 422), with the exceptions named here.
    pub fn http_status(&self) -> u16 {
        match self {
            Cause::NoSuchRollout { .. } => 404,
            Cause::WrongState { .. } => 409,
            Cause::RecordUnwritable { .. } => 500,
            // Gate failures of a rollout, but as an API answer the service behind pdctld failed.
            Cause::SystemdRefused { .. } | Cause::EventSourceClosed { .. } => 503,
            _ => match self.kind() {
                FailureKind::Config => 400,
                FailureKind::Access => 503,
                FailureKind::Busy => 409,
                FailureKind::Gate => 422,
            },
        }
    }

    /// The one-sentence explanation, with what to do where pdctl knows it.
    pub fn sentence(&self) -> String {
        match self {
            Cause::UnitMissing { message }
            | Cause::SystemdUnreachable { message }
            | Cause::AccessDenied { message }
            | Cause::SystemdTimeout { message }
            | Cause::SystemdRefused { message }
            | Cause::JournalUnreadable { message } => message.clone(),
            Cause::EventSourceClosed { what } => format!("{what} closed while a gate waited on it; check the journal and the D-Bus connection, then resume"),
            Cause::MetricsDisabled { unit } => format!(
                "the metrics gate is required but --enable-metrics is not in the ExecStart of {unit}: add it to the unit (then daemon-reload), or set [verify] metrics = \"warn\" or \"off\""
            ),
            Cause::OnlyWorkerOfRole { unit, role, expected } => format!(
                "{unit} is the only {role} worker: restarting it stops serving for {}; pass --allow-outage (or set [rollout] allow_outage = true) to accept that, or add a second {role} worker",
                outage(expected)
            ),
            Cause::GpuOverlap { unit, gpus, other, other_gpus } => {
                format!("GPUs {gpus} of {unit} overlap with GPUs {other_gpus} of {other}: two servers cannot share GPUs; fix gpus or CUDA_VISIBLE_DEVICES")
            }
            Cause::RouterUnreachable { error } => {
                format!("the router does not answer: {error}; start it or fix [router] url (or set [verify] router = false)")
            }
            Cause::DrainFailed { unit, error } => format!("cannot drain {unit}: {error}"),
            Cause::JobFailed { unit, job_result, service_result } => {
                format!("the restart job of {unit} ended with result \"{job_result}\" (systemd: {service_result})")
            }
            Cause::FatalLine { unit, line } => format!("{unit} logged a fatal line: {line}"),
            Cause::Crashed { unit, phase, why } => match phase {
                Phase::Starting => format!("{unit} did not become ready: {why}"),
                Phase::Health => format!("{unit} went down while waiting for /health: {why}"),
                Phase::Pair => format!("{unit} went down while its PD pairs were probed: {why}"),
                Phase::Soak => format!("{unit} did not stay up: {why}"),
            },
            Cause::ReadyTimeout { unit, pattern, after, foreign } => format!(
                "{unit} logged no ready line (\"{pattern}\") of this run within {}{}",
                dur(after),
                if *foreign > 0 { format!(" ({foreign} ready line(s) of another run were ignored)") } else { String::new() }
            ),
            Cause::HealthTimeout { url, after, last } => format!("{url}/health did not answer 200 within {} (last: {last})", dur(after)),
            Cause::WrongWorkerType { url, listed, role } => format!(
                "the router lists {url} as \"{listed}\", not \"{role}\" (registered without worker_type?): remove it from the router and re-add it with worker_type \"{role}\""
            ),
            Cause::RegisterRefused { url, error } => format!("the router does not list {url} and refused to register it: {error}"),
            Cause::RouterNeverAdmits { url, after, last } => format!("the router did not admit {url} within {}: {last}", dur(after)),
            Cause::CircuitOpen { url, after } => format!("the router did not admit {url} within {}: {}", dur(after), RouterSeen::BreakerOpen),
            Cause::SmokeFailed { url, after, error } => {
                format!("the router did not admit {url} within {}: {}", dur(after), RouterSeen::SmokeFailed(error.clone()))
            }
            Cause::ClientsFailing { unit, failed, max } => format!(
                "clients saw {failed} failed requests through the router during the rollout (more than max_failed_probes = {max}), last while {unit} was rolled; halted before the next unit"
            ),
            Cause::FleetUnreachable { message } => format!("the fleet's etcd cannot be reached ({message}); nothing was touched"),
            Cause::FleetLost { message } => format!(
                "fleet coordination lost: {message}; the unit in progress was finished and verified, no new slot is taken; run `pdctl rollout resume ID` once etcd answers again"
            ),
            Cause::FleetLimits { role, etcd, local } => format!(
                "the fleet's max_unavailable.{role} in etcd is {etcd}, this host's [fleet.max_unavailable] says {local}: make the configs agree (the fleet's value is the first host's)"
            ),
            Cause::AddressBlocked { what, url } => format!(
                "pdctld's unit does not let it connect to {url} ({what}): its IP sandbox allows loopback only (IPAddressAllow=localhost); run `pdctl unit-dropin --write`, then `systemctl daemon-reload` and restart pdctld while no rollout runs; nothing was touched"
            ),
            Cause::SlotTimeout { last, after } => format!("no fleet slot within slot_timeout ({}): {last}", dur(after)),
            Cause::StalePair { decode, prefill } => format!(
                "{decode} still uses the bootstrap info of {prefill}'s previous process (SGLang before PR 36029 keeps it when a prefill restarts on the same address): every request it gets from {prefill} fails until it restarts; run `pdctl restart --rolling --unit {decode}` (or set [rollout] on_stale_pair = \"restart-decode\" to have pdctl repair it)"
            ),
            Cause::PairIncompatible { prefill, decode, detail } => format!(
                "{prefill} and {decode} cannot pair: {detail}; every KV transfer between them is rejected — give both the same values, then roll both"
            ),
            Cause::PairBroken { prefill, decode, side, error } => match side.as_str() {
                "prefill" => format!("a PD request from {prefill} to {decode} failed on the prefill's side: {error}"),
                "decode" => format!("a PD request from {prefill} to {decode} failed on the decode's side: {error}"),
                _ => format!("the KV transfer from {prefill} to {decode} failed, and no restart explains it: {error}; check the transfer backend (network, RDMA devices) of both"),
            },
            Cause::RepairBlocked { decode, prefill, why } => {
                format!("{decode} has a stale pairing with {prefill} and needs a restart, but pdctl will not restart it as a repair: {why}")
            }
            Cause::IncompatibleChange { unit, peer, detail } => format!(
                "the new ExecStart of {unit} cannot pair with the running {peer}: {detail}; nothing was touched — change both sides together (single_pair = \"together\"), or revert the change"
            ),
            Cause::StrandedKv { decode, held, after } => format!(
                "{} after {decode} restarted, prefills still hold KV for requests no decode will fetch: {held}; it is released at the prefill's bootstrap timeout (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)",
                dur(after)
            ),
            Cause::MetricsMissing { unit, detail, waited, .. } => match waited {
                Some(w) => format!("{unit}: KV gauges not usable within {}: {detail}", dur(w)),
                None => format!("{unit}: {detail}"),
            },
            Cause::ConfigInvalid { message } => format!("config error: {message}"),
            Cause::BadRequest { message } => message.clone(),
            Cause::Busy { id } => format!("another rollout is running: {id} (pdctl rollout watch {id}; pdctl rollout abort {id})"),
            Cause::Reconciling { units } => format!(
                "pdctld is re-admitting workers it had drained before it stopped ({}); retry when `pdctl status` no longer says reconciling",
                units.join(", ")
            ),
            Cause::DrainNotRestored { unit, why } => format!(
                "{unit} is out of the router and not serving ({why}); pdctl keeps its drain on record: fix the unit, then `pdctl restart --rolling --unit {unit}` re-admits it"
            ),
            Cause::RecordsFailing { error } => format!(
                "pdctld cannot save its rollout records ({error}); no rollout starts until it can: free space or fix the state directory's permissions, then retry"
            ),
            Cause::NoSuchRollout { id } => format!("no rollout {id}; list them with pdctl rollout history"),
            Cause::WrongState { id, state, needs } => format!("rollout {id} is {state}: {needs}"),
            Cause::RecordUnwritable { dir, error } => {
                format!("cannot write the rollout record in {dir}: {error}; check the state directory's space and permissions")
            }
            Cause::ChangesPending { unit, changes, quarantined } => format!(
                "{unit} has changes on disk that its running process does not run ({changes}){}: a plain restart would load them; roll them out with `pdctl rollout apply` (gated, recorded, rolled back on failure), or pass --load-changes to restart with them",
                quarantined.as_ref().map(|q| format!("; this change already failed ({q}) and is quarantined")).unwrap_or_default()
            ),
            Cause::LoadUnknown { url, error } => format!(
                "cannot tell how many requests {url} still runs ({error}): the drain would restart it blind; check that the server is SGLang and serves GET /v1/loads (or /get_load before 0.5.13)"
            ),
            Cause::ApiKeyRejected { endpoint, status, key } => format!(
                "{endpoint} answered {status} to pdctl ({key}): the worker runs with --api-key and pdctl's key is missing or wrong; put the unit's key in the file its api_key_file names (readable by pdctld only) and restart pdctld"
            ),
            Cause::StopSlow { unit, why } => format!(
                "{unit}: {why}; the requests it still ran were lost: raise its TimeoutStopSec, or lower drain_timeout and the requests' lengths"
            ),
            Cause::UnitNotRunning { unit, state } => format!("{unit} is not running ({state}): it serves nothing and no gate can pass"),
            Cause::PeerRoleDown { url, role, error } => format!(
                "{url} is admitted by the gateway, but no {role} worker is, so a request through the gateway fails ({error}): the {role} role is down, not this worker"
            ),
            Cause::ConfigMismatch { given, daemon } => format!(
                "the config given ({given}) is not the one pdctld runs with ({daemon}): pdctld would roll out its own; drop --config, or point pdctld at this config and restart it while idle"
            ),
        }
    }

    /// One of each variant (and each metrics diagnosis), with sample facts: for the tests that
    /// hold docs/cli.md's cause table and the runbook to the code. Add a line here with each new
    /// variant.
    pub fn examples() -> Vec<Cause> {
        let unit = || "sglang-prefill.service".to_string();
        let url = || "http://127.0.0.1:30003".to_string();
        let msg = || "…".to_string();
        let d = Duration::from_secs(180);
        let mut out = vec![
            Cause::UnitMissing { message: msg() },
            Cause::SystemdUnreachable { message: msg() },
            Cause::AccessDenied { message: msg() },
            Cause::SystemdTimeout { message: msg() },
            Cause::SystemdRefused { message: msg() },
            Cause::JournalUnreadable { message: msg() },
            Cause::EventSourceClosed { what: "the journal follower".into() },
            Cause::MetricsDisabled { unit: unit() },
            Cause::GpuOverlap { unit: unit(), gpus: "0-3".into(), other: "sglang-decode.service".into(), other_gpus: "3-7".into() },
            Cause::OnlyWorkerOfRole {
                unit: unit(),
                role: "prefill".into(),
                expected: Some(crate::clock::StartTime { ms: 74_000, at: 0, window_ms: Some(81_000) }),
            },
            Cause::RouterUnreachable { error: msg() },
            Cause::DrainFailed { unit: unit(), error: msg() },
            Cause::JobFailed { unit: unit(), job_result: "failed".into(), service_result: "exit-code".into() },
            Cause::FatalLine { unit: unit(), line: msg() },
            Cause::Crashed { unit: unit(), phase: Phase::Soak, why: msg() },
            Cause::ReadyTimeout { unit: unit(), pattern: crate::sglang::READY_LINE.into(), after: d, foreign: 0 },
            Cause::HealthTimeout { url: url(), after: d, last: msg() },
            Cause::WrongWorkerType { url: url(), listed: "regular".into(), role: "prefill".into() },
            Cause::RegisterRefused { url: url(), error: msg() },
            Cause::RouterNeverAdmits { url: url(), after: d, last: msg() },
            Cause::CircuitOpen { url: url(), after: d },
            Cause::SmokeFailed { url: url(), after: d, error: msg() },
            Cause::ClientsFailing { unit: unit(), failed: 7, max: 5 },
            Cause::FleetUnreachable { message: msg() },
            Cause::FleetLost { message: msg() },
            Cause::FleetLimits { role: "prefill".into(), etcd: "1".into(), local: "2".into() },
            Cause::AddressBlocked { what: "etcd".into(), url: "http://10.0.0.5:2379".into() },
            Cause::SlotTimeout { last: "waiting for a prefill slot: held by gpu-node-b/sglang-prefill.service since 14:02:11".into(), after: d },
            Cause::StalePair { decode: "sglang-decode.service".into(), prefill: unit() },
            Cause::PairIncompatible { prefill: unit(), decode: "sglang-decode.service".into(), detail: "page_size 16 (prefill) vs 1 (decode)".into() },
            Cause::PairBroken { prefill: unit(), decode: "sglang-decode.service".into(), side: "decode".into(), error: msg() },
            Cause::RepairBlocked { decode: "sglang-decode.service".into(), prefill: unit(), why: msg() },
            Cause::IncompatibleChange { unit: unit(), peer: "sglang-decode.service".into(), detail: "page_size 16 (new) vs 1 (running)".into() },
            Cause::StrandedKv { decode: "sglang-decode.service".into(), held: msg(), after: d },
            Cause::ConfigInvalid { message: msg() },
            Cause::BadRequest { message: msg() },
            Cause::Busy { id: "r1764500000".into() },
            Cause::Reconciling { units: vec![unit()] },
            Cause::DrainNotRestored { unit: unit(), why: msg() },
            Cause::RecordsFailing { error: msg() },
            Cause::NoSuchRollout { id: "r1764500000".into() },
            Cause::WrongState { id: "r1764500000".into(), state: "succeeded".into(), needs: msg() },
            Cause::RecordUnwritable { dir: "/var/lib/pdctl".into(), error: msg() },
            Cause::ChangesPending { unit: unit(), changes: msg(), quarantined: Some(msg()) },
            Cause::ConfigMismatch { given: msg(), daemon: msg() },
            Cause::UnitNotRunning { unit: unit(), state: "inactive/dead".into() },
            Cause::LoadUnknown { url: url(), error: msg() },
            Cause::StopSlow { unit: unit(), why: msg() },
            Cause::ApiKeyRejected { endpoint: format!("{}/server_info", url()), status: 401, key: "no key: api_key_file is not set for this worker".into() },
            Cause::PeerRoleDown { url: url(), role: "decode".into(), error: msg() },
        ];
        for diagnosis in [
            MetricsDiagnosis::Disabled,
            MetricsDiagnosis::Unreachable,
            MetricsDiagnosis::Unparseable,
            MetricsDiagnosis::NotPublished,
            MetricsDiagnosis::UnknownNames,
            MetricsDiagnosis::Insane,
        ] {
            out.push(Cause::MetricsMissing { unit: unit(), diagnosis, detail: msg(), waited: None });
        }
        out
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.sentence())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_snake_case_and_sentences_end_cleanly() {
        for c in Cause::examples() {
            assert!(c.code().chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'), "{}", c.code());
            assert!(!c.sentence().is_empty());
        }
        // metrics_disabled is one cause found in two places (preflight's ExecStart, the gate's 404).
        let codes: std::collections::BTreeSet<&str> = Cause::examples().iter().map(Cause::code).collect();
        assert_eq!(codes.len(), Cause::examples().len() - 1);
    }

    #[test]
    fn http_statuses_follow_the_kind_with_named_exceptions() {
        let s = String::new;
        assert_eq!(Cause::BadRequest { message: s() }.http_status(), 400);
        assert_eq!(Cause::NoSuchRollout { id: s() }.http_status(), 404);
        assert_eq!(Cause::Busy { id: s() }.http_status(), 409);
        assert_eq!(Cause::AccessDenied { message: s() }.http_status(), 503);
        assert_eq!(Cause::SystemdRefused { message: s() }.http_status(), 503);
        assert_eq!(Cause::FatalLine { unit: s(), line: s() }.http_status(), 422);
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(dur(&Duration::from_nanos(30_081_551_416)), "30.1s");
        assert_eq!(dur(&Duration::from_millis(250)), "250ms");
        assert_eq!(dur(&Duration::from_secs(125)), "2m05s");
        let c = Cause::HealthTimeout { url: "u".into(), after: Duration::from_nanos(30_081_551_416), last: "x".into() };
        assert!(!c.sentence().contains("30.08"), "{}", c.sentence());
    }

    #[test]
    fn kinds_map_to_the_exit_table() {
        assert_eq!(Cause::UnitMissing { message: String::new() }.exit().code(), 2);
        assert_eq!(Cause::AccessDenied { message: String::new() }.exit().code(), 3);
        assert_eq!(Cause::Busy { id: String::new() }.exit().code(), 4);
        assert_eq!(Cause::FatalLine { unit: String::new(), line: String::new() }.exit().code(), 1);
    }
}
