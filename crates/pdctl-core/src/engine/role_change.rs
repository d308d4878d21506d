//! `pdctl role set`: workers changed between prefill and decode, one at a time, each through
//! the runbook's role sequence ([`Sequence::Role`]: its slot, its drain in its old role, the role
//! step, then every gate a restart passes in its new role). Which workers flip is decided in
//! [`crate::sglang::role_switch::plan_ratio`], which way each flips in [`gates::role::path`];
//! a failure puts the unit's files back and the worker in its old role ([`undo`]).

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use crate::config::{Role, Worker};
use crate::engine::context::{Ctx, Notes, Outage, Scope, Tally, Writes};
use crate::engine::gates::switch_role::{self, RoleChange, Undo};
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::plan_steps;
use crate::engine::runbook::{self, Sequence, WorkerRun};
use crate::engine::step_run::lock;
use crate::engine::work::{Finished, RolloutRun};
use crate::events::{Outcome, Sink, Step, Summary};
use crate::plan::Plan;
use crate::ports::{Logs, Probes, Units};
use crate::sglang::role_switch::{self, Candidate, Flip, SwitchPath, Way};
use pdctl_contract::clock::StartTime;

/// What an operator asked of `pdctl role set`.
#[derive(Debug, Clone)]
pub enum RoleAsk {
    /// One worker to a role.
    One {
        /// The unit (`NAME` means `NAME.service`).
        unit: String,
        /// Its new role.
        role: Role,
    },
    /// This host's PD workers to `prefill`:`decode`.
    Ratio {
        /// Prefills wanted.
        prefill: usize,
        /// Decodes wanted.
        decode: usize,
    },
}

impl RoleAsk {
    /// From the request's words: `unit` and `role`, or `ratio`; `Err`: the sentence.
    pub fn of(unit: Option<&str>, role: Option<&str>, ratio: Option<&str>) -> Result<RoleAsk, String> {
        match (unit, role, ratio) {
            (Some(u), Some(r), None) => match r {
                "prefill" => Ok(RoleAsk::One { unit: crate::plan::unit_name(u), role: Role::Prefill }),
                "decode" => Ok(RoleAsk::One { unit: crate::plan::unit_name(u), role: Role::Decode }),
                other => Err(format!("role {other:?} is not prefill or decode")),
            },
            (None, None, Some(r)) => role_switch::parse_ratio(r).map(|(prefill, decode)| RoleAsk::Ratio { prefill, decode }),
            _ => Err("give a unit and its new role (pdctl role set UNIT prefill|decode) or --ratio P:D, not both".into()),
        }
    }
}

/// What a flip does, as the record and the dry run say it.
pub fn planned(f: &Flip, way: &Way, timing: Option<&StartTime>) -> String {
    let how = match &way.path {
        SwitchPath::Runtime => format!(
            "{}: {} -> {}, switched at run time (drained, POST /pd_role_switch, no restart{})",
            f.unit,
            f.from.as_str(),
            f.to.as_str(),
            way.graph_memory_gb
                .filter(|gb| *gb > 0.0)
                .map(|gb| format!("; its decode CUDA graphs' footprint {gb:.2} GB, measured on a serving decode"))
                .unwrap_or_default()
        ),
        SwitchPath::Restart(why) => format!("{}: {} -> {}, restarted with its new role ({why})", f.unit, f.from.as_str(), f.to.as_str()),
    };
    format!("{how}; {}", expected_out(way, timing))
}

/// How long a flip keeps its worker out of the gateway, in words (`timing`: its last measured
/// start and window, for the restart path); the other workers of its role serve meanwhile.
pub fn expected_out(way: &Way, timing: Option<&StartTime>) -> String {
    match &way.path {
        SwitchPath::Runtime => "out of the gateway for its drain, the switch (under a second measured here: no stop, no start) and its gates".into(),
        SwitchPath::Restart(_) => format!("out of the gateway {}", pdctl_contract::cause::outage(timing)),
    }
}

/// A flip and the worker in its new role.
fn as_new(old: &Worker, to: Role, launch: Option<&[String]>) -> Worker {
    let bootstrap_port = match to {
        Role::Prefill => old.bootstrap_port.or_else(|| Some(launch.map_or(crate::sglang::BOOTSTRAP_PORT_DEFAULT, role_switch::bootstrap_port))),
        _ => old.bootstrap_port,
    };
    Worker { role: to, bootstrap_port, ..old.clone() }
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// The flips `ask` makes on this host; `Err`: why it cannot (a refusal: nothing is touched).
    pub async fn role_flips(&self, ask: &RoleAsk) -> Result<Vec<Flip>, String> {
        match ask {
            RoleAsk::One { unit, role } => {
                let w = self.settings.workers.iter().find(|w| &w.unit == unit).ok_or_else(|| {
                    format!(
                        "{unit} is not a configured worker (configured: {})",
                        self.settings.workers.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", ")
                    )
                })?;
                if w.role == Role::Regular {
                    return Err(format!("{unit} is not a PD worker: only a prefill or a decode changes role"));
                }
                if w.role == *role {
                    return Ok(Vec::new());
                }
                let left = self.settings.workers.iter().filter(|o| o.role == w.role).count() - 1;
                if left == 0 {
                    return Err(format!("{unit} is this host's only {}: every pair needs both roles", w.role.as_str()));
                }
                Ok(vec![Flip { unit: unit.clone(), from: w.role, to: *role }])
            }
            RoleAsk::Ratio { prefill, decode } => {
                let mut pd = Vec::new();
                for w in self.settings.workers.iter().filter(|w| w.role != Role::Regular) {
                    let other = if w.role == Role::Prefill { Role::Decode } else { Role::Prefill };
                    let runtime = switch_role::way(self, w, other).await.path == SwitchPath::Runtime;
                    pd.push(Candidate { unit: w.unit.clone(), role: w.role, in_flight: self.probes.in_flight(&w.url).await.ok(), runtime });
                }
                role_switch::plan_ratio(&pd, *prefill, *decode).map_err(|e| e.to_string())
            }
        }
    }

    /// Which way each flip goes, in plan order (the dry run says it; the run takes it).
    pub async fn role_paths(&self, flips: &[Flip]) -> Vec<(Flip, Way)> {
        let mut out = Vec::new();
        for f in flips {
            let Some(w) = self.settings.workers.iter().find(|w| w.unit == f.unit) else { continue };
            out.push((f.clone(), switch_role::way(self, w, f.to).await));
        }
        out
    }

    /// Each role's pressure as `pdctl status` judges it, from every PD worker's figures (its KV
    /// report: requests queued and running, KV used) in the role its unit runs; a worker that
    /// does not answer is not read (said in the verdict, never counted as idle).
    pub async fn role_pressure(&self) -> crate::service::role_pressure::Pressure {
        use crate::service::role_pressure::{pressure, Load};
        let mut loads = Vec::new();
        for w in self.settings.workers.iter().filter(|w| w.role != Role::Regular) {
            loads.push(Load::of(w.role, self.probes.kv(&w.url).await.ok().as_ref()));
        }
        pressure(&loads)
    }

    /// `pdctl role set --dry-run`'s verdict: the run's own first step — the preflight of the
    /// workers that would change, in their old roles (the unit, its pending changes, the role's
    /// floor) — touching nothing. `Some`: the failure the run would stop at.
    pub async fn role_preflight(&self, flips: &[Flip], sink: &Sink, known: Option<&crate::engine::KnownChanges>) -> Option<crate::events::Failure> {
        let ctx = Ctx { known, ..Ctx::none(Outage::of(self.settings.rollout.allow_outage), false) };
        match plan_steps::preflight(self, &Plan { workers: old_workers(self, flips) }, sink, true, ctx).await {
            Ok(()) => None,
            Err((unit, f)) => Some(halt::failure(self, &unit, Step::Preflight, f).await),
        }
    }

    /// `pdctl role set` as pdctld runs it: the old workers' preflight (a restart's: the unit, its
    /// pending changes, the role's floor), then each flip in turn through [`Sequence::Role`], its
    /// unit's files recorded as its good revision once it passed; the first failure undone and
    /// the rest left alone. `r.plan` and `r.work` are not read: the flips are the plan.
    pub async fn change_roles(&mut self, r: RolloutRun<'_>, flips: &[Flip], sink: &Sink) -> Finished {
        let notes = Notes::default();
        let summary = change(self, &r, flips, sink, &notes).await;
        Finished { summary, notes: notes.into_vec(), availability_by_unit: Default::default(), service_before: Default::default(), in_place: false }
    }
}

async fn change<U: Units, L: Logs, P: Probes>(eng: &mut Engine<U, L, P>, r: &RolloutRun<'_>, flips: &[Flip], sink: &Sink, notes: &Notes) -> Summary {
    let mut t = Tally { t0: Instant::now(), done: Vec::new(), repairs: Default::default() };
    let old = old_workers(eng, flips);
    let ctx = Ctx {
        writes: Writes { id: r.id, revisions: r.revisions, ledger: r.ledger, notes: Some(notes), before: None },
        outage: Outage::of(r.allow_outage || eng.settings.rollout.allow_outage),
        scope: Scope::default(),
        clients: None,
        load_changes: false,
        known: None,
        abort_in_flight: false,
        fleet_rollout: None,
    };
    if let Err((unit, f)) = plan_steps::preflight(eng, &Plan { workers: old.clone() }, sink, false, ctx).await {
        return t.summary(Outcome::Failed, Some(halt::failure(eng, &unit, Step::Preflight, f).await));
    }
    if let Some(dir) = r.revisions {
        // Every unit about to change has a revision to go back to (recorded before its change).
        let _ = eng.staleness(dir).await;
    }
    let paths = eng.role_paths(flips).await;
    for ((flip, way), was) in paths.iter().zip(&old) {
        if r.abort.load(Ordering::SeqCst) {
            return t.summary(Outcome::Aborted, None);
        }
        let launch = match eng.probes.server_info(&was.url).await {
            Ok(info) => crate::sglang::launch_argv(&info),
            Err(_) => None,
        };
        let new = as_new(was, flip.to, launch.as_deref());
        let undone = Mutex::new(Undo::default());
        let run = WorkerRun { role: Some(RoleChange { was, way, undo: &undone }), ..WorkerRun::new(&new, Sequence::Role, sink, ctx) };
        match runbook::run_sequence(eng, &run).await {
            Ok(repaired) => {
                for (d, of) in repaired {
                    notes.push(format!("{} was restarted to repair its stale pairing with {of}", d.unit));
                }
                if let Some(dir) = r.revisions {
                    notes.push(eng.record_revision_of(&new, dir, r.id, way.path == SwitchPath::Runtime).await);
                }
                notes.push(match &way.path {
                    SwitchPath::Runtime => format!("{} runs as {} now: switched at run time, without a restart", new.unit, new.role.as_str()),
                    SwitchPath::Restart(why) => format!("{} runs as {} now: restarted ({why})", new.unit, new.role.as_str()),
                });
                if let Some(w) = eng.settings.workers.iter_mut().find(|w| w.unit == new.unit) {
                    *w = new.clone();
                }
                t.done.push(new.unit.clone());
            }
            Err((step, f)) => {
                let unit = f.unit.clone().unwrap_or_else(|| new.unit.clone());
                let failure = halt::failure(eng, &unit, step, f).await;
                let left = lock(&undone).clone();
                undo(eng, was, left, ctx, sink, notes).await;
                return t.summary(Outcome::Failed, Some(failure));
            }
        }
    }
    t.summary(Outcome::Succeeded, None)
}

/// The workers `flips` change, as they are now (in plan order).
fn old_workers<U, L, P>(eng: &Engine<U, L, P>, flips: &[Flip]) -> Vec<Worker> {
    flips.iter().filter_map(|f| eng.settings.workers.iter().find(|w| w.unit == f.unit).cloned()).collect()
}

/// A failed change of `was`'s role undone: its unit's files as they were (and the manager
/// reloaded); then, if its server may have torn its old role down, restarted in it through
/// every gate; else re-admitted in it as it runs.
async fn undo<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, was: &Worker, left: Undo, ctx: Ctx<'_>, sink: &Sink, notes: &Notes) {
    if let Some((path, before)) = &left.dropin {
        match crate::state::role_dropin::undo(path, before) {
            Ok(()) => notes.push(format!("{}'s role drop-in {} was put back as it was before", was.unit, path.display())),
            Err(e) => notes.push(format!(
                "{}'s role drop-in {} could not be put back ({e}): fix it by hand, then `systemctl daemon-reload`",
                was.unit,
                path.display()
            )),
        }
        if let Err(e) = eng.units.reload().await {
            notes.push(format!("the manager could not be reloaded after {}'s drop-in was put back: {}", was.unit, e.cause().sentence()));
        }
    }
    if left.torn_down {
        match runbook::restart_one(eng, was, sink, ctx).await {
            Ok(_) => {
                notes.push(format!("{} was restarted in its old role ({}) and passed every gate", was.unit, was.role.as_str()));
                return;
            }
            Err((step, f)) => notes.push(format!("{}'s restart in its old role failed at {}: {}", was.unit, step.as_str(), f.cause.sentence())),
        }
    }
    halt::reconcile_drains(eng, &was.unit, Step::Role, ctx, sink, notes).await;
}

/// Each worker's role as its unit says it: the `--disaggregation-mode` its ExecStart asks for
/// (its `--config` file merged in, drop-ins included — a `pdctl role set` drop-in too) over the
/// config's `role`, which is what a unit that names no mode runs as; a prefill's bootstrap port
/// from its command when the config gives none. A unit that cannot be read keeps the config's.
/// Returns what differs from the config, one sentence each.
pub async fn resolve_roles<U: Units>(units: &U, settings: &mut crate::config::Settings) -> Vec<String> {
    let mut said = Vec::new();
    for w in settings.workers.iter_mut().filter(|w| w.role != Role::Regular) {
        let Ok(cfg) = units.config(&w.unit).await else { continue };
        let Some(argv) = cfg.exec_start.first() else { continue };
        let Some(runs) = role_switch::unit_role(argv) else { continue };
        if runs != w.role {
            said.push(format!("{} runs as {}: its unit says so (--disaggregation-mode), the config says {}", w.unit, runs.as_str(), w.role.as_str()));
            w.role = runs;
        }
        if runs == Role::Prefill && w.bootstrap_port.is_none() {
            w.bootstrap_port = Some(role_switch::bootstrap_port(argv));
        }
    }
    said
}
