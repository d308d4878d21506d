//! What a request comes to before anything is touched: a plan to run ([`Planned`]) or nothing
//! to roll, said. Each kind of request has its plan here (the decisions themselves are
//! pdctl-core's: `apply::order`, `resume::order`, `revert::order`, `role_change`);
//! [`super::rollouts`] takes the running slot, records the plan and runs it.

use std::collections::BTreeMap;

use pdctl_contract::api::{Request, RolloutKind};
use pdctl_contract::cause::Cause;
use pdctl_contract::lifecycle::RolloutState;
use pdctl_core::plan::Plan;
use pdctl_core::ports::Units as _;
use pdctl_core::sglang::role_switch::Flip;
use pdctl_real::RealEngine;

use super::{lock, Daemon};

/// The plan of `req` on this host (`id`: the rollout about to run it, which a resume's record
/// names).
pub(super) async fn plan(daemon: &Daemon, e: &RealEngine, req: Request, id: &str) -> Result<Planning, Cause> {
    Ok(Planning::Run(Box::new(match req {
        Request::HostDrain { .. } | Request::HostResume { .. } => match plan_host(daemon, e, &req)? {
            Planning::Run(p) => *p,
            nothing @ Planning::Nothing(_) => return Ok(nothing),
        },
        // An unreadable maintenance record counts as one: the host may be down for a reboot.
        _ if !matches!(daemon.store.ledger().maintenance(), Ok(None)) => return Err(in_maintenance(daemon)),
        Request::Restart { units, allow_outage, load_changes, .. } => {
            let plan = Plan::new(&e.settings, &units).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
            Planned { load_changes, ..Planned::of(RolloutKind::Restart, plan, allow_outage) }
        }
        // Nothing stale: no record whether or not `--if-changed` was given (it only says so for
        // the timer's sake).
        Request::Apply { all, allow_outage, .. } => match plan_apply(e, &daemon.store.revisions_dir(), all, allow_outage).await? {
            Planning::Run(p) => *p,
            nothing @ Planning::Nothing(_) => return Ok(nothing),
        },
        Request::Resume { id: old_id, .. } => plan_resume(daemon, e, old_id, id).await?,
        Request::Weights { model_path, version, fleet_rollout, .. } => plan_weights(e, model_path, version, fleet_rollout)?,
        Request::Revert { id: old_id, allow_outage, .. } => match plan_revert(daemon, e, &old_id, allow_outage)? {
            Planning::Run(p) => *p,
            nothing @ Planning::Nothing(_) => return Ok(nothing),
        },
        Request::Role { unit, role, ratio, .. } => {
            match plan_role(e, &daemon.store.revisions_dir(), unit.as_deref(), role.as_deref(), ratio.as_deref()).await? {
                Planning::Run(p) => *p,
                nothing @ Planning::Nothing(_) => return Ok(nothing),
            }
        }
    })))
}

/// A weights rollout's checkpoint, version and fleet rollout.
pub(super) type Weights = (String, Option<String>, Option<String>);

/// A revert's revisions: unit → the revision it ran before the reverted rollout.
pub(super) type Restore = Option<BTreeMap<String, pdctl_core::state::revisions::Revision>>;

/// What a start will run.
pub(super) struct Planned {
    pub(super) kind: RolloutKind,
    pub(super) plan: Plan,
    /// Unit → why it is stale (a config rollout).
    pub(super) reasons: BTreeMap<String, Vec<String>>,
    /// The interrupted rollout this one resumes.
    pub(super) resumes: Option<String>,
    pub(super) allow_outage: bool,
    pub(super) load_changes: bool,
    /// A resume: how many leading units of the plan are re-verified before (instead of) a
    /// restart — the one it stopped at (not when it stopped waiting for a fleet slot: untouched)
    /// and those it had already restarted (this same run still serving).
    pub(super) reverify: usize,
    /// A revert: unit → the revision it ran before the reverted rollout.
    pub(super) restore: Option<BTreeMap<String, pdctl_core::state::revisions::Revision>>,
    /// A weights rollout: the checkpoint, its version, and the fleet rollout it is this host's
    /// part of.
    pub(super) weights: Option<Weights>,
    /// Said in the record from its start (a config rollout: why it restarts rather than loads).
    pub(super) notes: Vec<String>,
    /// `pdctl role set`: the workers that change role, in order.
    pub(super) flips: Option<Vec<Flip>>,
}

/// A host in maintenance rolls nothing but its resume.
fn in_maintenance(daemon: &Daemon) -> Cause {
    match daemon.store.ledger().maintenance() {
        Ok(Some(m)) => Cause::InMaintenance { phase: m.phase.as_str().into(), id: m.id },
        Ok(None) => Cause::InMaintenance { phase: "none".into(), id: "none".into() },
        Err(u) => Cause::InMaintenance { phase: format!("unreadable: {}: {}", u.path.display(), u.error), id: "unknown".into() },
    }
}

/// Host maintenance's plan: every configured worker. A drain of a host in maintenance already is
/// refused (as is one whose record cannot be read); a resume of a host in service is nothing to do.
fn plan_host(daemon: &Daemon, e: &RealEngine, req: &Request) -> Result<Planning, Cause> {
    let plan = Plan::new(&e.settings, &[]).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
    let on_record = daemon.store.ledger().maintenance().map(|m| m.is_some()).unwrap_or(true);
    Ok(match req {
        Request::HostDrain { .. } if on_record => return Err(in_maintenance(daemon)),
        Request::HostDrain { allow_outage, .. } => {
            // The record's plan in the order the drain takes them (decodes first), as said.
            let order: Vec<String> = pdctl_core::engine::host::drain_order_of(&plan.workers).iter().map(|w| w.unit.clone()).collect();
            let plan = Plan::in_order(&e.settings, &order).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
            Planning::Run(Box::new(Planned::of(RolloutKind::HostDrain, plan, *allow_outage)))
        }
        _ if !on_record => Planning::Nothing("this host is not in maintenance: nothing to resume".into()),
        _ => Planning::Run(Box::new(Planned::of(RolloutKind::HostResume, plan, true))),
    })
}

impl Planned {
    /// `kind` of `plan`, with nothing else to say (no reasons, resume, revert or weights).
    fn of(kind: RolloutKind, plan: Plan, allow_outage: bool) -> Planned {
        Planned {
            kind,
            plan,
            reasons: BTreeMap::new(),
            resumes: None,
            allow_outage,
            load_changes: false,
            flips: None,
            reverify: 0,
            restore: None,
            weights: None,
            notes: Vec::new(),
        }
    }
}

/// What a request comes to: a plan to run, or nothing to roll — said, with no record (an empty
/// "succeeded" one would say a rollout happened).
pub(super) enum Planning {
    /// Run it.
    Run(Box<Planned>),
    /// Nothing to roll, and why.
    Nothing(String),
}

/// New weights for every worker of this host: the path checked (and bounded by this host's
/// setting, also for another host's fleet part); with `[fleet]`, only as a fleet part.
fn plan_weights(e: &RealEngine, model_path: String, version: Option<String>, fleet_rollout: Option<String>) -> Result<Planned, Cause> {
    if let Some(why) = pdctl_core::sglang::model_path_problem(&model_path) {
        return Err(Cause::BadRequest { message: format!("{why}; nothing was touched") });
    }
    // This host's own bound, also for another host's fleet part.
    if let Err(why) = e.settings.rollout.model_path_allowed(&model_path) {
        return Err(Cause::BadRequest { message: format!("{why}; nothing was touched") });
    }
    if e.settings.fleet.is_some() && fleet_rollout.is_none() {
        return Err(Cause::BadRequest {
            message: "pdctl rollout weights loads every worker of this host at once; with [fleet], other hosts' workers behind the same gateway would pair with these across versions: load the weights into every host in step with `pdctl fleet weights --model-path PATH`".into(),
        });
    }
    let plan = Plan::new(&e.settings, &[]).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
    Ok(Planned { weights: Some((model_path, version, fleet_rollout)), ..Planned::of(RolloutKind::Weights, plan, true) })
}

/// `pdctl role set`'s plan: the flips (which workers, decided in pdctl-core), each with the way it
/// changes and how long it is out (its last start and window in `dir`), said in the record from
/// its start; a ratio the host has already is nothing to do.
async fn plan_role(e: &RealEngine, dir: &std::path::Path, unit: Option<&str>, role: Option<&str>, ratio: Option<&str>) -> Result<Planning, Cause> {
    let refused = |why: String| Cause::BadRequest { message: format!("{why}; nothing was touched") };
    let ask = pdctl_core::engine::role_change::RoleAsk::of(unit, role, ratio).map_err(refused)?;
    let flips = e.role_flips(&ask).await.map_err(refused)?;
    if flips.is_empty() {
        return Ok(Planning::Nothing(match ask {
            pdctl_core::engine::role_change::RoleAsk::One { unit, role } => format!("{unit} already runs as {}", role.as_str()),
            pdctl_core::engine::role_change::RoleAsk::Ratio { prefill, decode } => format!("this host already runs {prefill}:{decode}"),
        }));
    }
    let units: Vec<String> = flips.iter().map(|f| f.unit.clone()).collect();
    let plan = Plan::new(&e.settings, &units).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
    let timing = |unit: &str| pdctl_core::state::revisions::last_start(dir, unit);
    let notes = e.role_paths(&flips).await.iter().map(|(f, p)| pdctl_core::engine::role_change::planned(f, p, timing(&f.unit).as_ref())).collect();
    Ok(Planning::Run(Box::new(Planned { notes, flips: Some(flips), ..Planned::of(RolloutKind::Role, plan, false) })))
}

/// A config rollout's plan: which workers (`pdctl_core::apply::order`: the stale ones, all with
/// `all`, never a quarantined change), systemd reloaded when their files changed, and whether the
/// change loads in place.
async fn plan_apply(e: &RealEngine, dir: &std::path::Path, all: bool, allow_outage: bool) -> Result<Planning, Cause> {
    let stale = e.staleness(dir).await?;
    use pdctl_core::apply::ApplyOrder;
    let order = pdctl_core::apply::order(stale, all);
    let (ApplyOrder::Nothing { held, .. } | ApplyOrder::Run { held, .. }) = &order;
    for h in held {
        tracing::warn!("not rolling out {h}; change its files to try again");
    }
    let (chosen, reload, reasons) = match order {
        ApplyOrder::Nothing { why, .. } => return Ok(Planning::Nothing(why)),
        ApplyOrder::Run { units, reload, reasons, .. } => (units, reload, reasons),
    };
    let plan = Plan::new(&e.settings, &chosen).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
    if reload {
        e.units.reload().await.map_err(|er| er.cause())?;
    }
    // New weights only: loaded into the running servers, not restarted (`[rollout] in_place`).
    let mut notes = Vec::new();
    let weights = match e.in_place_target(dir, &chosen).await {
        Ok(t) => {
            tracing::info!("rollout apply: the change is new weights only ({}): loaded in place, nothing restarts", pdctl_core::state::in_place::show(&t));
            Some((t.model_path, t.version, None))
        }
        Err(why) => {
            tracing::info!("rollout apply restarts the workers (not loadable in place: {why})");
            // Why a PD change restarts is said on the record (a refusal that follows, such as
            // mixed_versions, then shows what would have let it load in place).
            let pd = plan.workers.iter().any(|w| w.role != pdctl_core::config::Role::Regular);
            if pd && e.settings.rollout.in_place != pdctl_core::config::InPlace::Never {
                notes.push(format!("restarted, not loaded in place: {why}"));
            }
            None
        }
    };
    Ok(Planning::Run(Box::new(Planned {
        kind: RolloutKind::Apply,
        plan,
        reasons,
        resumes: None,
        allow_outage,
        load_changes: true,
        reverify: 0,
        restore: None,
        weights,
        notes,
        flips: None,
    })))
}

/// A resume's plan: the interrupted rollout `old_id` from the unit it stopped at (once; its
/// record says it was resumed by `id`). What is resumed, from where and what is re-verified is
/// decided by `pdctl_core::resume::order`; here the record is loaded, systemd asked, the record
/// saved.
async fn plan_resume(daemon: &Daemon, e: &RealEngine, old_id: String, id: &str) -> Result<Planned, Cause> {
    let mut old = daemon.load(&old_id).ok_or_else(|| Cause::NoSuchRollout { id: old_id.clone() })?;
    let mut now = BTreeMap::new();
    for u in &old.plan {
        if let Ok(st) = e.units.state(u).await {
            now.insert(u.clone(), pdctl_core::resume::RunNow { invocation_id: st.invocation_id, exec_main_start_us: st.exec_main_start_us });
        }
    }
    let decided = pdctl_core::resume::order(&old, &now)?;
    let plan = Plan::in_order(&e.settings, &decided.order).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
    // A change of role wrote its unit's drop-in: a worker that fails its re-verification is
    // restarted with it.
    let (allow_outage, load_changes) = (old.allow_outage, old.load_changes || old.kind == RolloutKind::Role);
    let notes: Vec<String> = decided
        .left
        .iter()
        .map(|u| format!("{u} was not changed: an interrupted change of role resumes only the worker it stopped at; ask `pdctl role set` again for the rest"))
        .collect();
    let state = old.lifecycle.state();
    old.lifecycle.resume(id).map_err(|_| Cause::WrongState {
        id: old_id.clone(),
        state: state.as_str().into(),
        needs: "only an interrupted rollout can be resumed, and only once".into(),
    })?;
    daemon.store.save(&old).map_err(|er| Cause::RecordUnwritable { dir: daemon.store.dir().display().to_string(), error: er.to_string() })?;
    lock(&daemon.unsaved).remove(&old_id);
    Ok(Planned {
        kind: RolloutKind::Resume,
        plan,
        reasons: BTreeMap::new(),
        resumes: Some(old_id),
        allow_outage,
        load_changes,
        reverify: decided.reverify,
        restore: None,
        weights: None,
        notes,
        flips: None,
    })
}

/// A revert's plan: what `pdctl_core::revert::order` decides over the rollout's record and the
/// revisions kept for its workers (read here), with the reverting rollout's own settings.
fn plan_revert(daemon: &Daemon, e: &RealEngine, old_id: &str, allow_outage: Option<bool>) -> Result<Planning, Cause> {
    use pdctl_core::revert::{order, Kept, RevertOrder};
    use pdctl_core::state::revisions;
    let old = daemon.load(old_id).ok_or_else(|| Cause::NoSuchRollout { id: old_id.to_string() })?;
    let dir = daemon.store.revisions_dir();
    let done = old.summary.as_ref().map(|s| s.units.clone()).unwrap_or_default();
    let kept: BTreeMap<String, Kept> =
        done.iter().map(|u| (u.clone(), Kept { before: revisions::load_before(&dir, old_id, u), running: revisions::load(&dir, u) })).collect();
    let reverted_by = || {
        let by = daemon.store.all().0.into_iter().filter(|r| r.reverts.as_deref() == Some(old_id) && r.lifecycle.state() == RolloutState::Succeeded);
        by.max_by_key(|r| r.created_at).map(|r| r.id.clone())
    };
    let (units, restore, reasons) = match order(&old, &kept, reverted_by)? {
        RevertOrder::Nothing(why) => return Ok(Planning::Nothing(why)),
        RevertOrder::Run { units, restore, reasons } => (units, restore, reasons),
    };
    let plan = Plan::in_order(&e.settings, &units).map_err(|er| Cause::BadRequest { message: er.to_string() })?;
    Ok(Planning::Run(Box::new(Planned {
        kind: RolloutKind::Revert,
        plan,
        reasons,
        resumes: None,
        allow_outage: allow_outage.unwrap_or(old.allow_outage),
        load_changes: true,
        reverify: 0,
        restore: Some(restore),
        weights: None,
        notes: Vec::new(),
        flips: None,
    })))
}
