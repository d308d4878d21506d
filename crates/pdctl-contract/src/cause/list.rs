//! The [`Cause`] enum itself, its kind ([`FailureKind`]) and what a failure carries; the derived
//! sentence, code, class and examples are in the sibling files.

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
    /// While the gateway was to admit it.
    Router,
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
        expected: Option<Box<crate::clock::StartTime>>,
        /// What was counted: the gateway's admitted workers of the role on every host, or
        /// this host's config when no gateway was read.
        peers: String,
        /// Refused to a host drain (the worker stops until the host is back from its reboot),
        /// not to a restart.
        host_drain: bool,
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
    /// The server runs another PD role than its configuration says (`/model_info`: switched at
    /// run time through `POST /pd_role_switch`).
    RoleMismatch {
        /// The unit.
        unit: String,
        /// The worker URL.
        url: String,
        /// The role it runs.
        runs: String,
        /// The role its configuration says.
        configured: String,
    },
    /// `pdctl role set`: the server did not take its new role at run time (`POST
    /// /pd_role_switch` refused or failed).
    RoleSwitchFailed {
        /// The unit.
        unit: String,
        /// The worker URL.
        url: String,
        /// The role asked for.
        to: String,
        /// What the server said.
        message: String,
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
    /// The service gate: a restarted worker serves worse than its baseline (`[verify.slo]`).
    SloRegression {
        /// The restarted worker.
        unit: String,
        /// The figure over its limit, as an operator reads it ("time to first token p50 0.93 s
        /// vs 0.31 s (×3.0, limit ×1.5)").
        figure: String,
        /// What it was compared with ("its peer sglang-prefill-2.service").
        against: String,
        /// Requests the restarted worker served in the window.
        requests: u64,
        /// Requests the baseline served in its window.
        baseline_requests: u64,
    },
    /// The service gate could not judge the restarted worker (too little traffic from the
    /// gateway, and `[verify.slo] unjudged` is `fail`, or `probe` could not send its own
    /// sample): a canary that saw no traffic is no pass.
    SloNotJudged {
        /// The restarted worker.
        unit: String,
        /// Why it was not judged.
        why: String,
    },
    /// This host is in maintenance (`pdctl host drain`): its workers are out of service or
    /// coming back; nothing else is rolled on it until `pdctl host resume` passed.
    InMaintenance {
        /// Where its maintenance stands (`draining`, `down`, `resuming`, `failed`).
        phase: String,
        /// The host drain that began it.
        id: String,
    },
    /// This host's workers restart by themselves (a restart storm): no rollout starts.
    RestartStorm {
        /// Who restarted and how often ("sglang-decode.service ×4").
        who: String,
        /// Self-restarts within the window.
        count: u32,
        /// The rule: more than this many…
        limit: u32,
        /// …within this window.
        within: Duration,
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
    /// One account has as many event streams open as it may (`GET /v1/rollouts/ID/events`).
    TooManyStreams {
        /// Whose (`uid N`, or `an unknown account`).
        who: String,
        /// The limit per account.
        limit: usize,
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
    /// The unit's `KillMode=` lets the stop's SIGTERM reach SGLang's scheduler process
    /// (`control-group`, systemd's default): the scheduler dies of it and SGLang SIGKILLs its own
    /// tree ~5 s later, so nothing drains. Refused in preflight unless `[rollout] kill_mode =
    /// "warn"`.
    KillModeUnsafe {
        /// The unit.
        unit: String,
        /// Its `KillMode=`.
        kill_mode: String,
        /// The sentence with the drop-in that fixes it (pdctl-core's `sglang::stop::kill_mode_risk`).
        fix: String,
    },
    /// The client on the control socket may read but not act: pdctld runs with an operate group
    /// (`--operate-group`) and the peer (its uid, from the kernel) is neither root nor in it.
    NotAllowed {
        /// The peer's uid.
        uid: u32,
        /// The group that may act.
        group: String,
    },
    /// `on_failure = "rollback"`, and a file the rollback would restore lies in a directory this
    /// process cannot write (outside the unit's `ReadWritePaths=`, or not root's): a failed gate
    /// would leave the worker half-restored. Refused in preflight.
    RollbackUnwritable {
        /// The unit.
        unit: String,
        /// The directories, each with why (`/etc/sglang (Read-only file system)`).
        dirs: Vec<String>,
    },
    /// A stop that lasted until systemd's SIGKILL at `TimeoutStopSec=` (SGLang's stop waits for
    /// its requests in flight): requests were lost. Reported as a warning of the restart step.
    StopSlow {
        /// The unit.
        unit: String,
        /// What the stop took and why (pdctl-core's `sglang::stop::StopReport::why`).
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
    /// A restart would change the model a PD worker computes with (pdctl-core's `sglang::coherence`) while
    /// workers of the other role run the old one: a rolling restart would pair versions.
    MixedVersions {
        /// The unit.
        unit: String,
        /// The changes (`--model-path /m/a → /m/b`; …).
        changes: String,
        /// The other role's workers that would pair with it.
        peers: String,
    },
    /// `pdctl rollout weights`: a worker did not take the new weights (its load failed, or it
    /// does not report them), or a gate failed after they were loaded; every worker that loaded
    /// them was given its previous weights again.
    WeightsFailed {
        /// The unit.
        unit: String,
        /// What failed.
        why: String,
    },
    /// A coherent fleet switch did not get through one of its phases on every host (a host's
    /// new workers not verified, its old ones not taken out, its new ones not admitted, or a host
    /// that did not get there in time); each host put back what it could so that no PD pair of
    /// two models is routable.
    SwitchFailed {
        /// The phase (`verified`, `out`, `in`).
        phase: String,
        /// The host that failed it, and why (or who did not get there in time).
        why: String,
        /// What this host holds out now (and why it stays out).
        held: String,
    },
    /// A revert could not put back the files a worker ran before the reverted rollout (or
    /// reload them): that worker was not restarted, and the revert halted.
    RestoreFailed {
        /// The unit.
        unit: String,
        /// What failed (the file and the error).
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

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.sentence())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cause::dur;

    #[test]
    fn codes_are_snake_case_and_sentences_end_cleanly() {
        for c in Cause::examples() {
            assert!(c.code().chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'), "{}", c.code());
            assert!(!c.sentence().is_empty());
        }
        // metrics_disabled is one cause found in two places (preflight's ExecStart, the gate's
        // 404); only_worker_of_role is said to a restart and to a host drain.
        let codes: std::collections::BTreeSet<&str> = Cause::examples().iter().map(Cause::code).collect();
        assert_eq!(codes.len(), Cause::examples().len() - 2);
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
