//! One of each cause with sample facts, for the tests that hold the docs' cause tables to the
//! code.

use std::time::Duration;

use super::*;

impl Cause {
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
                expected: Some(Box::new(crate::clock::StartTime { ms: 74_000, at: 0, window_ms: Some(81_000), window_until_ms: None, together_with: None })),
                peers: "the gateway admits 0 other prefill worker(s) of 1 it lists".into(),
                host_drain: false,
            },
            Cause::OnlyWorkerOfRole { unit: unit(), role: "decode".into(), expected: None, peers: msg(), host_drain: true },
            Cause::RouterUnreachable { error: msg() },
            Cause::DrainFailed { unit: unit(), error: msg() },
            Cause::JobFailed { unit: unit(), job_result: "failed".into(), service_result: "exit-code".into() },
            Cause::FatalLine { unit: unit(), line: msg() },
            Cause::Crashed { unit: unit(), phase: Phase::Soak, why: msg() },
            Cause::ReadyTimeout { unit: unit(), pattern: "The server is fired up and ready to roll!".into(), after: d, foreign: 0 },
            Cause::HealthTimeout { url: url(), after: d, last: msg() },
            Cause::RoleMismatch { unit: unit(), url: url(), runs: "decode".into(), configured: "prefill".into() },
            Cause::RoleSwitchFailed { unit: unit(), url: url(), to: "decode".into(), message: msg() },
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
            Cause::SloRegression {
                unit: "sglang-prefill.service".into(),
                figure: "end-to-end latency p50 0.93 s vs 0.31 s (×3.0, limit ×1.5)".into(),
                against: "its peer sglang-prefill-2.service".into(),
                requests: 42,
                baseline_requests: 80,
            },
            Cause::SloNotJudged { unit: "sglang-prefill.service".into(), why: "2 requests on the restarted worker, fewer than min_requests = 10".into() },
            Cause::ConfigInvalid { message: msg() },
            Cause::BadRequest { message: msg() },
            Cause::Busy { id: "r1764500000".into() },
            Cause::RestartStorm { who: "sglang-decode.service ×4, sglang-prefill.service ×2".into(), count: 6, limit: 5, within: Duration::from_secs(600) },
            Cause::Reconciling { units: vec![unit()] },
            Cause::InMaintenance { phase: "down".into(), id: "r1764500000".into() },
            Cause::DrainNotRestored { unit: unit(), why: msg() },
            Cause::RecordsFailing { error: msg() },
            Cause::NoSuchRollout { id: "r1764500000".into() },
            Cause::TooManyStreams { who: "uid 1000".into(), limit: 16 },
            Cause::WrongState { id: "r1764500000".into(), state: "succeeded".into(), needs: msg() },
            Cause::RecordUnwritable { dir: "/var/lib/pdctl".into(), error: msg() },
            Cause::ChangesPending { unit: unit(), changes: msg(), quarantined: Some(msg()) },
            Cause::ConfigMismatch { given: msg(), daemon: msg() },
            Cause::UnitNotRunning { unit: unit(), state: "inactive/dead".into() },
            Cause::LoadUnknown { url: url(), error: msg() },
            Cause::StopSlow { unit: unit(), why: msg() },
            Cause::NotAllowed { uid: 1000, group: "pdctl-operators".into() },
            Cause::RollbackUnwritable { unit: unit(), dirs: vec!["/etc/sglang (Read-only file system)".into()] },
            Cause::KillModeUnsafe {
                unit: unit(),
                kill_mode: "control-group".into(),
                // As pdctl-core's `sglang::stop::kill_mode_risk` says it (a test there keeps them equal).
                fix: format!(
                    "{u} has KillMode=control-group: systemd's SIGTERM also reaches SGLang's scheduler, which dies of it, and the server then SIGKILLs its own process tree about 5 s later, so nothing in flight on it finishes; add a drop-in (systemctl edit {u}) with [Service] KillMode=mixed and TimeoutStopSec=90s, then systemctl daemon-reload",
                    u = unit()
                ),
            },
            Cause::ApiKeyRejected { endpoint: format!("{}/server_info", url()), status: 401, key: "no key: api_key_file is not set for this worker".into() },
            Cause::PeerRoleDown { url: url(), role: "decode".into(), error: msg() },
            Cause::RestoreFailed { unit: unit(), error: msg() },
            Cause::WeightsFailed { unit: unit(), why: msg() },
            Cause::SwitchFailed { phase: "verified".into(), why: msg(), held: msg() },
            Cause::MixedVersions { unit: unit(), changes: "--model-path /models/a → /models/b".into(), peers: "sglang-decode.service".into() },
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
