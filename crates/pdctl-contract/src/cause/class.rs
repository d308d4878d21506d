//! How each cause is classed: its stable code, its kind, the exit code and the HTTP status it
//! gives.

use super::*;
use crate::exit::Exit;

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
            Cause::RoleMismatch { .. } => "role_mismatch",
            Cause::RoleSwitchFailed { .. } => "role_switch_failed",
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
            Cause::SloRegression { .. } => "slo_regression",
            Cause::SloNotJudged { .. } => "slo_not_judged",
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
            Cause::RestartStorm { .. } => "restart_storm",
            Cause::InMaintenance { .. } => "in_maintenance",
            Cause::Reconciling { .. } => "reconciling",
            Cause::DrainNotRestored { .. } => "drain_not_restored",
            Cause::RecordsFailing { .. } => "records_failing",
            Cause::NoSuchRollout { .. } => "no_such_rollout",
            Cause::TooManyStreams { .. } => "too_many_streams",
            Cause::WrongState { .. } => "wrong_state",
            Cause::RecordUnwritable { .. } => "record_unwritable",
            Cause::ChangesPending { .. } => "changes_pending",
            Cause::ConfigMismatch { .. } => "config_mismatch",
            Cause::UnitNotRunning { .. } => "unit_not_running",
            Cause::LoadUnknown { .. } => "load_unknown",
            Cause::StopSlow { .. } => "stop_slow",
            Cause::KillModeUnsafe { .. } => "kill_mode_unsafe",
            Cause::RollbackUnwritable { .. } => "rollback_unwritable",
            Cause::NotAllowed { .. } => "not_allowed",
            Cause::ApiKeyRejected { .. } => "api_key_rejected",
            Cause::PeerRoleDown { .. } => "peer_role_down",
            Cause::RestoreFailed { .. } => "restore_failed",
            Cause::WeightsFailed { .. } => "weights_failed",
            Cause::SwitchFailed { .. } => "switch_failed",
            Cause::MixedVersions { .. } => "mixed_versions",
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
            | Cause::MixedVersions { .. }
            | Cause::ApiKeyRejected { .. }
            | Cause::KillModeUnsafe { .. }
            | Cause::RollbackUnwritable { .. }
            | Cause::AddressBlocked { .. } => FailureKind::Config,
            Cause::FleetUnreachable { .. } | Cause::FleetLost { .. } => FailureKind::Access,
            Cause::SystemdUnreachable { .. }
            | Cause::AccessDenied { .. }
            | Cause::SystemdTimeout { .. }
            | Cause::JournalUnreadable { .. }
            | Cause::RouterUnreachable { .. }
            | Cause::RecordUnwritable { .. }
            | Cause::RestoreFailed { .. }
            | Cause::NotAllowed { .. } => FailureKind::Access,
            Cause::Busy { .. } | Cause::Reconciling { .. } | Cause::RestartStorm { .. } | Cause::InMaintenance { .. } | Cause::TooManyStreams { .. } => {
                FailureKind::Busy
            }
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
            | Cause::RoleMismatch { .. }
            | Cause::RoleSwitchFailed { .. }
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
            | Cause::SloRegression { .. }
            | Cause::SloNotJudged { .. }
            | Cause::SlotTimeout { .. }
            | Cause::MetricsMissing { .. }
            | Cause::DrainNotRestored { .. }
            | Cause::UnitNotRunning { .. }
            | Cause::LoadUnknown { .. }
            | Cause::StopSlow { .. }
            | Cause::PeerRoleDown { .. }
            | Cause::WeightsFailed { .. }
            | Cause::SwitchFailed { .. } => FailureKind::Gate,
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
            Cause::TooManyStreams { .. } => 429,
            Cause::NotAllowed { .. } => 403,
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
}
