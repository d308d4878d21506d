//! What each cause says to the operator: one sentence, with what to do where pdctl knows it.

use super::*;

impl Cause {
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
            Cause::OnlyWorkerOfRole { unit, role, peers, host_drain: true, .. } => format!(
                "{unit} is the only {role} worker ({peers}): draining this host for its reboot stops serving {role} requests until the host is back and resumed; pass --allow-outage to pdctl host drain (or set [rollout] allow_outage = true) to accept that, or add a {role} worker on another host"
            ),
            Cause::OnlyWorkerOfRole { unit, role, expected, peers, host_drain: false } => format!(
                "{unit} is the only {role} worker ({peers}): restarting it stops serving for {}; pass --allow-outage (or set [rollout] allow_outage = true) to accept that, or add a second {role} worker",
                outage(expected.as_deref())
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
                Phase::Router => format!("{unit} went down before the gateway admitted it: {why}"),
                Phase::Soak => format!("{unit} did not stay up: {why}"),
            },
            Cause::ReadyTimeout { unit, pattern, after, foreign } => format!(
                "{unit} logged no ready line (\"{pattern}\") of this run within {}{}",
                dur(after),
                if *foreign > 0 { format!(" ({foreign} ready line(s) of another run were ignored)") } else { String::new() }
            ),
            Cause::HealthTimeout { url, after, last } => format!("{url}/health did not answer 200 within {} (last: {last})", dur(after)),
            Cause::RoleMismatch { unit, url, runs, configured, .. } => format!(
                "{url} runs as {runs} (its /model_info) while {unit}'s configuration says {configured}: it was switched at run time (POST /pd_role_switch) without its configuration, so the gateway's worker type and its pairs no longer match, and a restart would bring back {configured}"
            ),
            Cause::RoleSwitchFailed { url, to, message, .. } => format!("{url} did not switch to {to} at run time (POST /pd_role_switch): {message}"),
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
            Cause::SloRegression { unit, figure, against, requests, baseline_requests } => format!(
                "{unit} serves worse than {against} since its restart: {figure}, over {requests} and {baseline_requests} requests"
            ),
            Cause::SloNotJudged { unit, why } => {
                format!("{unit}'s service could not be judged ({why}): a restarted worker that saw too little traffic is not taken as a pass")
            }
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
            Cause::RestartStorm { who, count, limit, within } => format!(
                "this host is in a restart storm: {count} restarts pdctl did not make within {} (more than {limit}): {who}; a rollout now would add restarts to serving that is already falling over",
                dur(within)
            ),
            Cause::InMaintenance { phase, id } => format!(
                "this host is in maintenance ({phase}, host drain {id}): its workers are out of service or coming back, and nothing else is rolled on it until `pdctl host resume` has passed"
            ),
            Cause::Busy { id } => format!("another rollout is running: {id} (pdctl rollout watch {id}; pdctl rollout abort {id})"),
            Cause::Reconciling { units } => format!(
                "pdctld is re-admitting workers it had drained before it stopped, or continuing workers a weights rollout left paused ({}); retry when `pdctl status` no longer says reconciling",
                units.join(", ")
            ),
            Cause::DrainNotRestored { unit, why } => format!(
                "{unit} is out of the router and not serving ({why}); pdctl keeps its drain on record: fix the unit, then `pdctl restart --rolling --unit {unit}` re-admits it"
            ),
            Cause::RecordsFailing { error } => format!(
                "pdctld cannot save its rollout records ({error}); no rollout starts until it can: free space or fix the state directory's permissions, then retry"
            ),
            Cause::NoSuchRollout { id } => format!("no rollout {id}; list them with pdctl rollout history"),
            Cause::TooManyStreams { who, limit } => {
                format!("{who} has {limit} event streams of pdctld open, as many as one account may: close one (each `pdctl rollout watch ID` holds one) and ask again")
            }
            Cause::WrongState { id, state, needs } => format!("rollout {id} is {state}: {needs}"),
            Cause::RecordUnwritable { dir, error } => {
                format!("cannot write the rollout record in {dir}: {error}; check the state directory's space and permissions")
            }
            Cause::ChangesPending { unit, changes, quarantined: None } => format!(
                "{unit} has changes on disk that its running process does not run ({changes}): a plain restart would load them; roll them out with `pdctl rollout apply` (gated, recorded, rolled back on failure), or pass --load-changes to restart with them"
            ),
            Cause::ChangesPending { unit, changes, quarantined: Some(q) } => format!(
                "{unit} has changes on disk that its running process does not run ({changes}); this change already failed ({q}) and is quarantined: `pdctl rollout apply` leaves it alone until its files change; fix it, or pass --load-changes to restart with it anyway"
            ),
            Cause::LoadUnknown { url, error } => format!(
                "cannot tell how many requests {url} still runs ({error}): the drain would restart it blind; check that the server is SGLang and serves GET /v1/loads (or /get_load before 0.5.13)"
            ),
            Cause::ApiKeyRejected { endpoint, status, key } => format!(
                "{endpoint} answered {status} to pdctl ({key}): the worker runs with --api-key and pdctl's key is missing or wrong; put the unit's key in the file its api_key_file names (readable by pdctld only) and restart pdctld"
            ),
            Cause::NotAllowed { uid, group } => format!(
                "uid {uid} may read pdctld's state but not act: starting, resuming, reverting or aborting a rollout takes root or membership in {group}; nothing was touched"
            ),
            Cause::RollbackUnwritable { unit, dirs } => format!(
                "on_failure = \"rollback\" could not put {unit}'s files back: pdctld cannot write {}; nothing was touched",
                dirs.join(", ")
            ),
            Cause::KillModeUnsafe { fix, .. } => format!("{fix}; nothing was touched (or set [rollout] kill_mode = \"warn\" to restart it anyway)"),
            Cause::StopSlow { unit, why } => format!(
                "{unit}: {why}; the requests it still ran were lost: raise its TimeoutStopSec, or lower drain_timeout and the requests' lengths"
            ),
            Cause::MixedVersions { unit, changes, peers } => format!(
                "{unit}'s restart changes the model it computes with ({changes}) while {peers} of the other role run the old one: a rolling restart would pair the two versions, and such PD requests decode KV their own model did not compute, answered 200; nothing was touched"
            ),
            Cause::WeightsFailed { unit, why } => format!("{unit}: the new weights were not taken: {why}"),
            Cause::SwitchFailed { phase, why, held } => {
                format!("the coherent fleet switch did not get every host to '{phase}' ({why}); {held}")
            }
            Cause::RestoreFailed { unit, error } => format!(
                "the files {unit} ran before cannot be put back ({error}): it was not restarted, and nothing after it was reverted"
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
}
