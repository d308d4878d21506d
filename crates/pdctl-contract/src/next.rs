//! What the operator does next about each cause: the one table behind the `next:` of every failed
//! run's last line (and the summary's `failed.next`). Each entry names commands between backticks;
//! a test parses every `pdctl …` command of every cause against the CLI, so none is advice that
//! does not run. Placeholders an operator fills in are upper case (`ID`, `HOLDER`).

use crate::cause::{Cause, MetricsDiagnosis};

/// `pdctl restart --rolling --unit UNIT` for a worker; the whole plan for a pseudo-unit.
fn retry(unit: &str) -> String {
    if unit.ends_with(".service") {
        format!("`pdctl restart --rolling --unit {unit}`")
    } else {
        "`pdctl restart --rolling`".to_string()
    }
}

/// Read the unit's log, fix the cause, restart it.
fn logs(unit: &str) -> String {
    format!("`journalctl -u {unit} -n 200`, fix the cause, then {}", retry(unit))
}

/// After a restart storm.
const STORM_NEXT: &str = "`pdctl status` and `journalctl -u UNIT -n 200` (why the units restart by themselves); fix that first — the storm ends once the restarts fall out of the window — then retry";

impl Cause {
    /// What to do next, for a failure of `unit` (the failed event's unit, which may be the pseudo
    /// units `router` or `fleet`): commands between backticks, in the order to run them.
    pub fn next_step(&self, unit: &str) -> String {
        match self {
            Cause::UnitMissing { .. } => "install the unit or fix its name in the config, then `pdctl check`".into(),
            Cause::SystemdUnreachable { .. } | Cause::SystemdTimeout { .. } => {
                "`systemctl is-system-running` (the manager must answer over D-Bus), then `pdctl check`".into()
            }
            Cause::AccessDenied { .. } | Cause::SystemdRefused { .. } => {
                "`pdctl polkit-rule --write` (pdctld as its own user: the rule for the configured units; docs/install.md) or run pdctld as root, then `pdctl check`".into()
            }
            Cause::JournalUnreadable { .. } => "`journalctl -n 1` as pdctld's user (the journal must be readable), then `pdctl check`".into(),
            Cause::EventSourceClosed { .. } => format!("`pdctl status`, then {}", retry(unit)),
            Cause::MetricsDisabled { unit } => format!("add --enable-metrics to {unit}'s ExecStart (a drop-in), then `pdctl rollout apply`"),
            Cause::OnlyWorkerOfRole { role, host_drain: true, .. } => {
                format!("`pdctl host drain --allow-outage` to accept the outage until the host is back, or add a {role} worker on another host")
            }
            Cause::OnlyWorkerOfRole { unit, role, .. } => {
                format!("`pdctl restart --rolling --unit {unit} --allow-outage` to accept the outage, or add a second {role} worker")
            }
            Cause::GpuOverlap { .. } => "fix gpus (or CUDA_VISIBLE_DEVICES) in the config, then `pdctl restart --rolling --dry-run`".into(),
            Cause::RouterUnreachable { .. } => "bring the gateway back (it must answer GET /workers), then `pdctl check`".into(),
            Cause::DrainFailed { .. } => format!("`pdctl status` (the gateway's view of each worker), then {}", retry(unit)),
            Cause::JobFailed { .. } | Cause::FatalLine { .. } | Cause::Crashed { .. } | Cause::ReadyTimeout { .. } | Cause::HealthTimeout { .. } => logs(unit),
            Cause::RoleMismatch { unit, configured, runs, .. } => format!(
                "`pdctl restart --rolling --unit {unit}` (it starts again as {configured}, its configured role), or `pdctl role set {unit} {runs}` to keep the role it runs (its unit then says it)"
            ),
            Cause::RoleSwitchFailed { unit, .. } => {
                format!("`pdctl status` (the summary says whether {unit} serves its old role again), then `journalctl -u {unit}` for why it did not switch")
            }
            Cause::WrongWorkerType { .. } => "make the worker's role in the config match its --disaggregation-mode, then `pdctl check`".into(),
            Cause::RegisterRefused { .. } | Cause::RouterNeverAdmits { .. } | Cause::CircuitOpen { .. } => {
                format!("`pdctl status` (is the gateway the fault? the worker's own health is in the event above), fix the gateway, then {}", retry(unit))
            }
            Cause::SmokeFailed { .. } => {
                format!("`pdctl status` (a request through the gateway failed: does every role have a serving worker?), then {}", retry(unit))
            }
            Cause::ClientsFailing { .. } => "`pdctl rollout history`, then `pdctl rollout show ID` (which unit's window failed requests)".into(),
            Cause::StalePair { decode, .. } => format!("`pdctl restart --rolling --unit {decode}` (its cached pairing is stale)"),
            Cause::PairIncompatible { .. } | Cause::IncompatibleChange { .. } => {
                "make page_size and kv_cache_dtype the same on prefill and decode, then `pdctl rollout apply`".into()
            }
            Cause::PairBroken { prefill, decode, side, .. } => logs(if side == "decode" { decode } else { prefill }),
            Cause::RepairBlocked { decode, .. } => format!("`pdctl status`, then `pdctl restart --rolling --unit {decode} --allow-outage`"),
            Cause::SloRegression { unit, .. } => format!(
                "`pdctl rollout show ID` (each soak's figures against its baseline), compare {unit}'s change with its peers' (`systemctl cat {unit}`), then `pdctl rollout apply` with the change fixed or reverted"
            ),
            Cause::SloNotJudged { unit, .. } => format!(
                "`pdctl rollout show ID` (the soak's figures and why pdctl's own sample was not sent), then send {unit} traffic (or lower [verify.slo] min_requests) and `pdctl check`"
            ),
            Cause::StrandedKv { decode, .. } => {
                format!(
                    "`pdctl status` (KV the prefills still hold for {decode}'s old process; they release it at their bootstrap timeout), then `pdctl check`"
                )
            }
            Cause::FleetUnreachable { .. } | Cause::FleetLost { .. } => {
                "`etcdctl endpoint health` (the fleet's etcd must answer), then `pdctl fleet status`".into()
            }
            Cause::FleetLimits { .. } => "make [fleet.max_unavailable] the same on every host, then `pdctl fleet status`".into(),
            Cause::AddressBlocked { .. } => "`pdctl unit-dropin --write`, `systemctl daemon-reload`, then restart pdctld while no rollout runs".into(),
            Cause::SlotTimeout { .. } => "`pdctl fleet status` (who holds the slot); if its host is dead, `pdctl fleet release HOLDER`".into(),
            Cause::MetricsMissing { unit, diagnosis, .. } => match diagnosis {
                MetricsDiagnosis::Disabled => format!("add --enable-metrics to {unit}'s ExecStart (a drop-in), then `pdctl rollout apply`"),
                MetricsDiagnosis::Unreachable | MetricsDiagnosis::NotPublished => logs(unit),
                MetricsDiagnosis::Unparseable | MetricsDiagnosis::UnknownNames | MetricsDiagnosis::Insane => {
                    "compare the server's /metrics with docs/metrics.md (or set [verify] metrics = \"warn\"), then `pdctl check`".into()
                }
            },
            Cause::ConfigInvalid { .. } => "fix the config at the file, line and key named, then `pdctl check`".into(),
            Cause::BadRequest { .. } => "`pdctl --help`".into(),
            Cause::Busy { id } => format!("`pdctl rollout watch {id}`"),
            Cause::RestartStorm { .. } => STORM_NEXT.into(),
            Cause::InMaintenance { .. } => "`pdctl host status`; after the reboot, `pdctl host resume`".into(),
            Cause::Reconciling { .. } => "`pdctl status` (pdctld is re-admitting the workers it had drained), then run this again".into(),
            Cause::DrainNotRestored { unit, .. } => format!("`pdctl status`, then {}", retry(unit)),
            Cause::RecordsFailing { .. } | Cause::RecordUnwritable { .. } => {
                "free space or fix the permissions of pdctld's state directory (/var/lib/pdctl), then `pdctl status`".into()
            }
            Cause::NoSuchRollout { .. } | Cause::WrongState { .. } => "`pdctl rollout history`".into(),
            Cause::TooManyStreams { .. } => "close another stream of this account (each watch of a running rollout holds one), then ask again; `pdctl rollout history` lists the rollouts".into(),
            // A quarantined change is not rolled out by `rollout apply` (it answers "nothing to
            // do: quarantined"): only an explicit --load-changes takes it, or a fix of the files.
            Cause::ChangesPending { unit, quarantined: Some(_), .. } => {
                format!("`pdctl rollout diff`, then fix the change, or `pdctl restart --rolling --unit {unit} --load-changes` to restart with it anyway")
            }
            Cause::ChangesPending { unit, .. } => {
                format!("`pdctl rollout diff`, then `pdctl rollout apply` to roll the change out, or `pdctl restart --rolling --unit {unit} --load-changes`")
            }
            Cause::LoadUnknown { url, .. } => format!("`curl -s {url}/v1/loads` (what the server answers), then {}", retry(unit)),
            Cause::ApiKeyRejected { .. } => {
                "compare the key in the unit's `--api-key` with the file its `api_key_file` names, `systemctl restart pdctld`, then `pdctl check`".into()
            }
            Cause::NotAllowed { group, .. } => format!("run it as root or as a member of {group} (`id` shows your groups)"),
            Cause::RollbackUnwritable { .. } => {
                "add each directory to pdctld's `ReadWritePaths=` (`systemctl edit pdctld`, then `systemctl restart pdctld`), or set `[rollout] on_failure = \"halt\"` for this rollout".into()
            }
            Cause::KillModeUnsafe { unit, .. } => {
                format!("`systemctl edit {unit}` (add `[Service]` `KillMode=mixed`), `systemctl daemon-reload`, then `pdctl check`")
            }
            Cause::StopSlow { unit, .. } => {
                format!("`systemctl show {unit} -p TimeoutStopUSec` and `journalctl -u {unit} -n 200` (the stop's lines), then `pdctl check`")
            }
            Cause::UnitNotRunning { unit, .. } => format!("`journalctl -u {unit} -n 200`, start it (`systemctl start {unit}`), then `pdctl check`"),
            Cause::PeerRoleDown { role, .. } => format!("`pdctl status` (why no {role} worker serves), bring one back, then `pdctl check`"),
            Cause::MixedVersions { .. } => "for new weights of the same model, `pdctl rollout weights --model-path /path/of/the/new/checkpoint` (no restart, all workers at once), or the same change in the units' files with `pdctl rollout apply` once it keeps the tokenizer the servers run (the rollout's notes say what else changes: pin it with --tokenizer-path); otherwise restart both roles in one window (`single_pair = \"together\"` with one of each; two or more of each are switched as groups unless the preflight's `switch_refused` says why not), or accept mixed pairs with `[rollout] coherent = \"never\"`".into(),
            Cause::WeightsFailed { unit, .. } => format!("`journalctl -u {unit} -n 200` (the load's lines) and `pdctl status` (each worker's weight version), then `pdctl check`"),
            Cause::SwitchFailed { .. } => "`pdctl fleet status` (each host's part), `pdctl rollout history` on the host the sentence names, and `pdctl status` on each host (what is held out of the gateway, and why)".into(),
            Cause::RestoreFailed { unit, .. } => format!("`systemctl cat {unit}` (its files now) and `pdctl rollout history` (this revert's record says what it had put back); fix the file, then revert again"),
            Cause::ConfigMismatch { .. } => "`pdctl status` (the config pdctld runs with), then run this again without --config".into(),
        }
    }
}

/// The commands between backticks in a next step that start with `pdctl`.
pub fn pdctl_commands(next: &str) -> Vec<String> {
    next.split('`').skip(1).step_by(2).filter(|c| c.starts_with("pdctl ")).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_says_what_to_do_next_with_a_command() {
        for c in Cause::examples() {
            let n = c.next_step("sglang-prefill.service");
            assert!(n.contains('`'), "{}: {n}", c.code());
        }
    }

    #[test]
    fn a_pseudo_unit_is_never_restarted_by_name() {
        let c = Cause::DrainNotRestored { unit: "router".into(), why: String::new() };
        assert!(!c.next_step("router").contains("--unit router"));
        let c = Cause::RouterNeverAdmits { url: String::new(), after: std::time::Duration::ZERO, last: String::new() };
        assert!(!c.next_step("router").contains("--unit router"), "{}", c.next_step("router"));
    }
}
