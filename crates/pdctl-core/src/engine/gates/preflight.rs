//! Preflight, for every worker before the first restart: the unit exists and runs what it should,
//! GPU sets do not overlap, a PD worker's new arguments can pair with its running peers, the
//! stop and pair timings fit, the gateway and the fleet answer.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::details::PreflightDetail;
use crate::engine::context::{Ctx, Outage};
use crate::engine::gates;
use crate::engine::gates::pd_checks;
use crate::engine::machine::Engine;
use crate::engine::step_run::Fail;
use crate::engine::steps::{rule, GateMode};
use crate::engine::work::KnownChanges;
use crate::events::Step;
use crate::plan::Plan;
use crate::ports::{ActiveState, Probes, UnitState, Units};
use crate::state::revisions;

fn gpus_of(w: &Worker, env: &[String]) -> Option<BTreeSet<u32>> {
    w.gpus.clone().or_else(|| env.iter().find_map(|kv| kv.strip_prefix("CUDA_VISIBLE_DEVICES=")).and_then(crate::config::parse_gpus))
}

/// What `w` would load by a plain restart that its running process does not run: files changed
/// since its last good revision (or, without one, since the process started), drop-ins systemd has
/// not loaded, `NeedDaemonReload`; and whether those files are a change that already failed.
fn pending_changes(
    w: &Worker,
    cfg: &crate::ports::UnitConfig,
    st: &UnitState,
    not_loaded: &[String],
    dir: Option<&Path>,
    known: Option<&KnownChanges>,
) -> Option<Cause> {
    let files = revisions::paths(&w.unit, cfg, &w.watch_files);
    let current = revisions::snapshot(&w.unit, &files, "current");
    let last = dir.and_then(|d| revisions::load(d, &w.unit));
    let known = known.and_then(|k| k.get(&w.unit)).filter(|_| dir.is_none());
    let mut changes = match known {
        Some(k) => k.reasons.clone(),
        None => revisions::stale_reasons(&current, last.as_ref(), st.exec_main_start_us, cfg.need_daemon_reload),
    };
    changes.extend(not_loaded.iter().map(|p| format!("{p} is not loaded by systemd")));
    changes.sort();
    changes.dedup();
    let quarantined = match known {
        Some(k) => k.quarantined.clone(),
        None => dir.and_then(|d| revisions::quarantined(d, &current)).map(|q| q.clause()),
    };
    if changes.is_empty() && quarantined.is_none() {
        return None;
    }
    Some(Cause::ChangesPending { unit: w.unit.clone(), changes: changes.join("; "), quarantined })
}

/// What preflight has seen of the workers before this one.
pub(in crate::engine) struct Seen {
    /// The manager was reloaded (once is enough).
    reloaded: bool,
    /// GPU sets of the workers checked so far.
    gpu_sets: Vec<(String, BTreeSet<u32>)>,
    /// The gateway's workers (every host's), when it is verified and answered: who else
    /// serves each role ([`crate::engine::role_floor`]).
    gateway: Option<Vec<crate::ports::RouterWorker>>,
}

fn fmt_set(s: &BTreeSet<u32>) -> String {
    s.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// What preflight has seen so far across the plan's workers (runbook.rs runs them in order).
impl Seen {
    /// Before the first worker: the gateway's workers, when it is verified and answers.
    pub(in crate::engine) async fn first<U, L, P: Probes>(eng: &Engine<U, L, P>) -> Seen {
        let gateway = if eng.settings.verify.router { eng.probes.router_workers(0).await.ok() } else { None };
        Seen { reloaded: false, gpu_sets: Vec::new(), gateway }
    }
}

/// A PD worker's restart needs a worker of the other role serving: without one its pair gate
/// cannot pass and the restart would only add an outage (then a rollback, another). Refused
/// here (`peer_role_down`, nothing touched) unless a peer of the plan is restarted first or
/// with it (`together`), which brings it back. With `[fleet]` the other hosts' workers may
/// serve: the gateway's gates judge.
async fn a_peer_serves<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, plan: &Plan) -> Result<(), Fail> {
    let peers = gates::pair::peers(eng, w);
    if peers.is_empty() || eng.settings.fleet.is_some() {
        return Ok(());
    }
    let mine = plan.workers.iter().position(|x| x.unit == w.unit).unwrap_or(usize::MAX);
    let together = eng.settings.rollout.single_pair == crate::config::SinglePair::Together;
    if peers.iter().any(|p| plan.workers.iter().position(|x| x.unit == p.unit).is_some_and(|i| i < mine || together)) {
        return Ok(());
    }
    let mut down = Vec::new();
    for p in &peers {
        let st = eng.units.state(&p.unit).await?;
        if st.active_state != ActiveState::Active {
            down.push(format!("{} is {}/{}", p.unit, st.active_state, st.sub_state));
            continue;
        }
        match gates::pair::peer_serves(eng, p, false).await {
            Ok(()) => return Ok(()),
            Err(why) => down.push(format!("{} does not serve ({why})", p.unit)),
        }
    }
    let role = if w.role == Role::Prefill { "decode" } else { "prefill" };
    Err(Fail::from(Cause::PeerRoleDown {
        url: w.url.clone(),
        role: role.into(),
        error: format!(
            "no {role} worker serves: {}; refused in preflight, nothing touched — restarting {} now could not pass its pair gate; bring the {role} back first (systemctl start {}), then run this again",
            down.join("; "),
            w.unit,
            peers[0].unit
        ),
    }))
}

/// One worker's preflight: its state and files (a reload when systemd has not loaded them),
/// metrics flag, GPUs, reachability, API key, pairing, stop and pair timing, and whether it
/// is the only worker of its role.
pub(in crate::engine) async fn preflight_worker<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    plan: &Plan,
    dry: bool,
    ctx: Ctx<'_>,
    seen: &mut Seen,
) -> Result<PreflightDetail, Fail> {
    let Loaded { st, cfg, needs_reload, did_reload, on_disk } = loaded(eng, w, dry, ctx, seen).await?;
    let metrics_flag = would_start(eng, w, &cfg).map_err(Fail::from)?;
    let gpus = gpus_disjoint(w, &cfg, seen).map_err(Fail::from)?;
    not_blocked(eng, &w.unit, &w.url).await?;
    if ctx.outage.restarts() {
        a_peer_serves(eng, w, plan).await?;
    } else {
        // `check` sends requests through the gateway and between pairs: a worker switched to the
        // other role at run time would make those fail under another worker's name. A restart
        // needs no such look: it brings the unit's role back, and its health gate verifies it.
        super::health::runs_its_role(eng, w).await?;
    }
    let exposed = rollback_writes(eng, w, &cfg, ctx).map_err(Fail::from)?;
    let api_key_check = api_key_check(eng, w, &st).await?;
    let pairing = pd_checks::pairing_preflight(eng, w, plan, &cfg).await?;
    let mut warnings = stop_and_pair_risks(eng, w, &cfg);
    warnings.extend(exposed);
    warnings.extend(kill_mode_check(eng, w, &cfg).map_err(Fail::from)?);
    // A dry run does not reload the manager: the restart's command line is read from the files.
    let disk_argv = if dry && needs_reload {
        let rev = revisions::snapshot(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), "dry run");
        crate::state::in_place::effective_argv(&rev).ok().flatten()
    } else {
        None
    };
    let (said, coherence) = pd_checks::coherence_preflight(eng, w, plan, &cfg, disk_argv.as_deref(), ctx).await?.unzip();
    warnings.extend(said);
    let coherence = coherence.flatten();
    let outage = outage_of(eng, w, plan, seen.gateway.as_deref(), ctx).map_err(Fail::from)?;
    Ok(PreflightDetail {
        outage,
        active_state: st.active_state.to_string(),
        sub_state: st.sub_state.to_string(),
        invocation_id: st.invocation_id,
        main_pid: st.main_pid,
        fragment_path: cfg.fragment_path,
        drop_ins: cfg.drop_in_paths,
        drop_ins_not_loaded: on_disk,
        daemon_reload: did_reload,
        dry_run: dry,
        enable_metrics: metrics_flag,
        gpus: gpus.as_ref().map(fmt_set),
        pairing,
        timeout_stop_ms: cfg.timeout_stop.map(|d| d.as_millis() as u64),
        kill_mode: cfg.kill_mode.clone(),
        warnings,
        api_key_check,
        coherence,
    })
}

/// A worker's unit as its restart will find it.
struct Loaded {
    st: UnitState,
    cfg: crate::ports::UnitConfig,
    /// Its files changed since systemd loaded them.
    needs_reload: bool,
    /// systemd was reloaded for it (a dry run: would be).
    did_reload: bool,
    /// Drop-ins on disk systemd has still not loaded.
    on_disk: Vec<String>,
}

/// The unit's state and config as its restart will find them: under `check` a unit that is not
/// running fails; drop-ins on disk systemd has not loaded (a new one does not set
/// NeedDaemonReload) are a change a plain restart refuses unless it may load changes, and are
/// loaded by one reload of the manager (a dry run only says it would).
async fn loaded<U: Units, L, P>(eng: &Engine<U, L, P>, w: &Worker, dry: bool, ctx: Ctx<'_>, seen: &mut Seen) -> Result<Loaded, Fail> {
    let st = eng.units.state(&w.unit).await?;
    // `check` (nothing restarts): a worker that is not running fails its own check.
    if ctx.outage == Outage::Check && st.active_state != ActiveState::Active {
        return Err(Fail::from(Cause::UnitNotRunning { unit: w.unit.clone(), state: format!("{}/{}", st.active_state, st.sub_state) }));
    }
    let mut cfg = eng.units.config(&w.unit).await?;
    let not_loaded = |cfg: &crate::ports::UnitConfig| -> Vec<String> {
        revisions::paths(&w.unit, cfg, &[])
            .into_iter()
            .map(|p| p.display().to_string())
            .filter(|p| p.ends_with(".conf") && !cfg.drop_in_paths.contains(p))
            .collect()
    };
    let needs_reload = cfg.need_daemon_reload || !not_loaded(&cfg).is_empty();
    // A restart that is not a config rollout loads nothing the worker does not run
    // yet (checked before any reload): a pending change is rolled out by `rollout
    // apply`, through every gate, or accepted with --load-changes.
    if ctx.outage.restarts() && !ctx.load_changes {
        if let Some(c) = pending_changes(w, &cfg, &st, &not_loaded(&cfg), ctx.writes.revisions, ctx.known) {
            return Err(Fail::from(c));
        }
    }
    let mut did_reload = false;
    if needs_reload && dry {
        did_reload = true; // reported as "would reload"
    } else if needs_reload && !seen.reloaded {
        eng.units.reload().await?;
        seen.reloaded = true;
        did_reload = true;
        cfg = eng.units.config(&w.unit).await?;
    }
    let on_disk = not_loaded(&cfg);
    Ok(Loaded { st, cfg, needs_reload, did_reload, on_disk })
}

/// What SGLang would refuse at its start (a `--config` file it cannot read, a parallel width
/// its GPUs cannot hold), and the metrics flag a required metrics gate needs. `Ok`: whether
/// `--enable-metrics` is given.
fn would_start<U, L, P>(eng: &Engine<U, L, P>, w: &Worker, cfg: &crate::ports::UnitConfig) -> Result<bool, Cause> {
    if let Some(why) = &cfg.launch_config_error {
        return Err(Cause::ConfigInvalid { message: format!("{}'s ExecStart --config {why}; SGLang would not start with it", w.unit) });
    }
    if let Some(why) = cfg.exec_start.first().and_then(|argv| crate::sglang::pairing::width_problem(argv)) {
        return Err(Cause::ConfigInvalid { message: format!("{}'s ExecStart asks for {why}; SGLang would not start with it", w.unit) });
    }
    let args: Vec<&String> = cfg.exec_start.iter().flatten().collect();
    let metrics_flag = args.iter().any(|a| *a == "--enable-metrics" || a.starts_with("--enable-metrics="));
    if rule(Step::Metrics, &eng.settings).mode == GateMode::Required && !metrics_flag {
        return Err(Cause::MetricsDisabled { unit: w.unit.clone() });
    }
    Ok(metrics_flag)
}

/// A unit whose stop would kill SGLang's scheduler (systemd's default `KillMode=control-group`):
/// refused, or (`kill_mode = "warn"`) the warning to report.
fn kill_mode_check<U, L, P>(eng: &Engine<U, L, P>, w: &Worker, cfg: &crate::ports::UnitConfig) -> Result<Option<String>, Cause> {
    let Some(fix) = crate::sglang::stop::kill_mode_risk(&w.unit, cfg.kill_mode.as_deref(), eng.settings.rollout.drain_timeout) else { return Ok(None) };
    if eng.settings.rollout.kill_mode == crate::config::KillModePolicy::Refuse {
        let kill_mode = cfg.kill_mode.clone().unwrap_or_default();
        return Err(Cause::KillModeUnsafe { unit: w.unit.clone(), kill_mode, fix });
    }
    tracing::warn!(pdctl_unit = %w.unit, "{fix}");
    Ok(Some(fix))
}

/// The worker's GPUs, refused when they overlap another worker's seen so far (then noted).
fn gpus_disjoint(w: &Worker, cfg: &crate::ports::UnitConfig, seen: &mut Seen) -> Result<Option<BTreeSet<u32>>, Cause> {
    let gpus = gpus_of(w, &cfg.environment);
    if let Some(g) = &gpus {
        if let Some((other, og)) = seen.gpu_sets.iter().find(|(_, og)| !og.is_disjoint(g)) {
            return Err(Cause::GpuOverlap { unit: w.unit.clone(), gpus: fmt_set(g), other: other.clone(), other_gpus: fmt_set(og) });
        }
        seen.gpu_sets.push((w.unit.clone(), g.clone()));
    }
    Ok(gpus)
}

/// With `on_failure = "rollback"`: every file the rollback would restore can be written by this
/// process (known in pdctld, which keeps the revisions), or the worker would be left
/// half-restored (`Err`: the refusal); the directories on the way to the unit's files that another
/// account can change are said, in a dry run too (a warning: a restore stops at a link such an
/// account placed there rather than follow it).
fn rollback_writes<U, L, P>(eng: &Engine<U, L, P>, w: &Worker, cfg: &crate::ports::UnitConfig, ctx: Ctx<'_>) -> Result<Vec<String>, Cause> {
    let (true, crate::config::OnFailure::Rollback) = (ctx.outage.restarts(), eng.settings.rollout.on_failure) else {
        return Ok(Vec::new());
    };
    let paths = revisions::paths(&w.unit, cfg, &w.watch_files);
    if let Some(last) = ctx.writes.revisions.and_then(|dir| revisions::load(dir, &w.unit)) {
        let dirs = revisions::unwritable(&last, &revisions::snapshot(&w.unit, &paths, "preflight"));
        if !dirs.is_empty() {
            return Err(Cause::RollbackUnwritable { unit: w.unit.clone(), dirs });
        }
    }
    let exposed = revisions::exposed(&paths);
    Ok((!exposed.is_empty())
        .then(|| {
            format!(
                "{}: a rollback would write its files under {}, where an account other than root can replace a directory with a link: it would stop there rather than follow one; keep a unit's files in directories only root can write",
                w.unit,
                exposed.join(", ")
            )
        })
        .into_iter()
        .collect())
}

/// Does the worker refuse pdctl's calls for want of its API key? A worker started with
/// --api-key refuses every call pdctl makes but /health, /ready and /metrics without its key:
/// found now, before anything is touched. `None`: not checked (the unit is not running).
async fn api_key_check<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, st: &UnitState) -> Result<Option<String>, Fail> {
    if st.active_state != ActiveState::Active {
        return Ok(None);
    }
    match eng.probes.auth(&w.url).await {
        crate::ports::Auth::Rejected { endpoint, status, key } => Err(Fail::from(Cause::ApiKeyRejected { endpoint, status, key })),
        crate::ports::Auth::Unknown(why) => Ok(Some(format!("not checked: {why}"))),
        crate::ports::Auth::Accepted => Ok(Some("accepted".to_string())),
    }
}

/// What a stop of this worker may run into (SGLang's stop waits for its requests), and
/// whether the pair gate's timeout covers a decode's own timing; each is logged.
fn stop_and_pair_risks<U, L, P>(eng: &Engine<U, L, P>, w: &Worker, cfg: &crate::ports::UnitConfig) -> Vec<String> {
    let bootstrap = (w.role == Role::Prefill).then(|| crate::sglang::bootstrap_timeout(&cfg.environment));
    let mut warnings = crate::sglang::stop::risks(&w.unit, cfg.timeout_stop, eng.settings.rollout.drain_timeout, bootstrap);
    if w.role == Role::Decode && eng.settings.verify.pair {
        warnings.extend(crate::sglang::pairing::timing_risk(&w.unit, &crate::sglang::DecodeTiming::of(&cfg.environment), eng.settings.verify.pair_timeout));
    }
    for warning in &warnings {
        tracing::warn!(pdctl_unit = %w.unit, "{warning}");
    }
    warnings
}

/// The only worker of its role: restarting it stops serving (PD needs both roles). With
/// [fleet], counted over the whole fleet as the router sees it; else this host's. Refused
/// unless an outage is allowed (`Err`: the refusal, with the outage to expect); then said.
fn outage_of<U, L, P>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    plan: &Plan,
    gateway: Option<&[crate::ports::RouterWorker]>,
    ctx: Ctx<'_>,
) -> Result<Option<String>, Cause> {
    let peers = crate::engine::role_floor::peers(w.role, &[&w.url], gateway, &eng.settings.workers);
    let (true, true) = (peers.alone(), ctx.outage.restarts()) else { return Ok(None) };
    let allowed = ctx.outage.accepted();
    let expected_of = |unit: &str| match (ctx.writes.revisions, ctx.known.and_then(|k| k.get(unit))) {
        (Some(d), _) => revisions::last_start(d, unit),
        (None, Some(k)) => k.timing.clone(),
        (None, None) => None,
    };
    let expected = expected_of(&w.unit);
    if !allowed {
        let (unit, role) = (w.unit.clone(), w.role.as_str().into());
        return Err(Cause::OnlyWorkerOfRole { unit, role, expected: expected.map(Box::new), peers: peers.basis, host_drain: false });
    }
    // A 1P1D pair restarted at once: one interruption for both, said as such.
    let together = match plan.workers.as_slice() {
        [a, b]
            if eng.settings.rollout.single_pair == crate::config::SinglePair::Together
                && a.role != b.role
                && a.role != Role::Regular
                && b.role != Role::Regular =>
        {
            [a, b].into_iter().find(|o| o.unit != w.unit).map(|o| o.unit.as_str())
        }
        _ => None,
    };
    let how = match together {
        Some(other) => format!("restarted together with {other} (single_pair = \"together\"): serving stops once, while both restart"),
        None => "serving stops while it restarts".to_string(),
    };
    // Together, both say the same interruption: the pair's when it was measured, else the
    // longer of the two windows on record (each from its own take-out: a lower bound).
    let expected = match together {
        Some(other) => [expected, expected_of(other)].into_iter().flatten().max_by_key(|t| (t.together_with.is_some(), t.window_ms, t.ms)),
        None => expected,
    };
    Ok(Some(format!("{} is the only {} worker: {how}, for {} (accepted: allow_outage)", w.unit, w.role.as_str(), crate::cause::outage(expected.as_ref()))))
}

/// With [fleet]: etcd answers, the fleet's limits agree with this host's, and what is paused
/// and held. Runs with `[fleet]` and its coordinator (`gates::slot::applies`).
pub(in crate::engine) async fn preflight_fleet<U, L, P: Probes>(eng: &Engine<U, L, P>, dry: bool) -> Result<Option<FleetSeen<'_>>, Fail> {
    let (Some(c), Some(f)) = (&eng.coordinator, &eng.settings.fleet) else { return Ok(None) };
    let local = crate::fleet::Limits { max_unavailable: f.max_unavailable.clone() };
    let r = async {
        for e in &f.etcd {
            not_blocked(eng, "etcd", e).await?;
        }
        let limits = if dry {
            match c.get(&crate::fleet::limits_key(&f.name)).await {
                Ok(Some(e)) => {
                    serde_json::from_slice::<crate::fleet::Limits>(&e.value).map(|l| l.disagreement(&local).map_or(Ok(l), Err)).unwrap_or(Ok(local.clone()))
                }
                Ok(None) => Ok(local.clone()),
                Err(e) => Err(Fail::from(Cause::FleetUnreachable { message: e.to_string() }))?,
            }
        } else {
            crate::fleet::ensure_limits(c.as_ref(), &f.name, &local).await.map_err(|e| Fail::from(Cause::FleetUnreachable { message: e.to_string() }))?
        };
        let limits = limits.map_err(|d| Fail::from(Cause::from(d)))?;
        let paused = crate::fleet::paused(c.as_ref(), &f.name).await.map_err(|e| Fail::from(Cause::FleetUnreachable { message: e.to_string() }))?;
        let slots = crate::fleet::slots(c.as_ref(), &f.name).await.map_err(|e| Fail::from(Cause::FleetUnreachable { message: e.to_string() }))?;
        Ok::<_, Fail>(Some(FleetSeen { fleet: &f.name, host: &f.host, limits, paused, slots }))
    }
    .await;
    r
}

/// The gateway (every replica) answers; its worker lists are the step's detail. Runs when the
/// router is verified.
pub(in crate::engine) async fn preflight_router<U, L, P: Probes>(eng: &Engine<U, L, P>) -> Result<GatewaySeen, Fail> {
    if let Some(r) = &eng.settings.router {
        for u in std::iter::once(&r.url).chain(r.metrics_url.as_ref()) {
            not_blocked(eng, "the router", u).await?;
        }
    }
    // Every replica answers, or nothing is touched.
    let mut lists = Vec::new();
    for r in 0..eng.probes.replicas() {
        lists.push(eng.probes.router_workers(r).await.map_err(|e| Fail::from(Cause::RouterUnreachable { error: e.to_string() }))?);
    }
    Ok(match lists.len() {
        1 => GatewaySeen { workers: lists.pop(), replicas: None },
        _ => GatewaySeen { workers: None, replicas: Some(lists) },
    })
}

/// A configured address this process may not connect to at all (pdctld's unit allows
/// loopback only unless a drop-in allows more): refused in preflight, naming the fix.
pub(in crate::engine) async fn not_blocked<U, L, P: Probes>(eng: &Engine<U, L, P>, what: &str, url: &str) -> Result<(), Fail> {
    let host = crate::sglang::pairing::bootstrap_host(url);
    if matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1") || host.starts_with("127.") {
        return Ok(());
    }
    match eng.probes.reach(url).await {
        crate::ports::Reach::Blocked(_) => Err(Fail::from(Cause::AddressBlocked { what: what.to_string(), url: url.to_string() })),
        _ => Ok(()),
    }
}

/// The fleet's preflight: its name, this host, the limits, the pause and every role's slots.
#[derive(Serialize)]
pub(in crate::engine) struct FleetSeen<'a> {
    fleet: &'a str,
    host: &'a str,
    limits: crate::fleet::Limits,
    paused: Option<crate::fleet::Pause>,
    slots: std::collections::BTreeMap<String, crate::fleet::Semaphore>,
}

/// The gateway's preflight: its worker list (one replica) or each replica's.
#[derive(Serialize)]
pub(in crate::engine) struct GatewaySeen {
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<Vec<crate::ports::RouterWorker>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<Vec<Vec<crate::ports::RouterWorker>>>,
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use crate::engine::step_run::detail_of;
    use serde_json::json;

    #[test]
    fn the_preflight_details_have_the_keys_of_the_contract() {
        assert_eq!(detail_of(&GatewaySeen { workers: Some(Vec::new()), replicas: None }), json!({"workers": []}));
        assert_eq!(detail_of(&GatewaySeen { workers: None, replicas: Some(vec![Vec::new()]) }), json!({"replicas": [[]]}));
    }
}
