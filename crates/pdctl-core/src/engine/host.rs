//! Host maintenance: a GPU driver, CUDA or kernel update reboots the whole host, every prefill and
//! decode on it at once. The drain takes the host's whole budget first — with `[fleet]`, a slot
//! of its role's fleet-wide semaphore for every worker in one etcd transaction, the same
//! semaphore restarts take, so a reboot and a rollout never exceed `max_unavailable` together —
//! then takes each worker out of the gateway, waits for what it runs and stops it (a prefill
//! kept until its decodes pulled their KV). After the reboot the resume holds each worker to the
//! restart's gates and only then gives the slots back; a host that fails them keeps its slots.
//! Every step is written to the ledger's maintenance record before it is taken.

use std::sync::atomic::Ordering;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::{Notes, Tally, Underway};
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::plan_steps;
use crate::engine::runbook::{self, Sequence, WorkerRun};
use crate::engine::step_run::{Fail, StepRun};
use crate::engine::work::Asked;
use crate::events::{Outcome, Step, Summary};
use crate::plan::Plan;
use crate::ports::{ActiveState, Logs, Probes, Units};
use crate::state::drain_ledger::{Ledger, MaintainedUnit, Maintenance, MaintenancePhase};

/// The kernel's boot id (a resume at pdctld's start tells a reboot from a restart of pdctld).
pub fn boot_id(procfs: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(procfs.join("sys/kernel/random/boot_id")).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The order a host's workers are drained in: decodes first (a decode's requests still pull KV
/// from prefills; a prefill stopped before them would cut them), then prefills, then the rest.
/// A resume brings them back the other way round (a decode's pair gate needs its prefills).
fn drain_order(plan: &Plan) -> Vec<&Worker> {
    drain_order_of(&plan.workers)
}

/// [`drain_order`] of `workers` (what a dry run prints).
pub fn drain_order_of(workers: &[Worker]) -> Vec<&Worker> {
    let rank = |w: &Worker| match w.role {
        Role::Decode => 0,
        Role::Prefill => 1,
        Role::Regular => 2,
    };
    let mut ws: Vec<&Worker> = workers.iter().collect();
    ws.sort_by_key(|w| rank(w));
    ws
}

/// The `rollout` a host drain's slot holds carry: its id and what it is (pdctl-contract's
/// [`pdctl_contract::records::MAINTENANCE_HOLD`]).
pub fn maintenance_hold(id: &str) -> String {
    format!("{id}{}", pdctl_contract::records::MAINTENANCE_HOLD)
}

/// A worker's preflight before a host drain: the outage it accepts (`None`: none).
#[derive(serde::Serialize)]
struct HostPreflight {
    /// No other worker of its role serves behind the gateway, accepted by `--allow-outage`.
    outage: Option<String>,
}

/// Whether the host's drain leaves `w`'s role with no worker the gateway admits (every
/// host's, as it lists them, but this host's `down`; without a gateway: this host's config,
/// where the host's workers are all of their role): refused unless accepted (then said).
fn host_outage(
    w: &Worker,
    down: &[&str],
    gateway: Option<&[crate::ports::RouterWorker]>,
    configured: &[Worker],
    allow_outage: bool,
) -> Result<Option<String>, crate::engine::role_floor::Peers> {
    if w.role == Role::Regular {
        return Ok(None);
    }
    let peers = crate::engine::role_floor::peers(w.role, down, gateway, configured);
    if !peers.alone() {
        return Ok(None);
    }
    if !allow_outage {
        return Err(peers);
    }
    Ok(Some(format!(
        "no other {} worker serves behind the gateway ({}): serving stops until this host is back (accepted: allow_outage)",
        w.role.as_str(),
        peers.basis
    )))
}

fn unwritable(e: std::io::Error) -> Fail {
    Fail::from(Cause::RecordUnwritable { dir: "the maintenance record".into(), error: e.to_string() })
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// What refuses a host drain before anything is touched.
    async fn host_preflight(&self, order: &[&Worker], ledger: &Ledger, allow_outage: bool, sink: &crate::events::Sink) -> Result<(), (String, Fail)> {
        let first = order.first().map(|w| w.unit.clone()).unwrap_or_default();
        match ledger.maintenance() {
            Ok(Some(m)) => return Err((first, Fail::from(Cause::InMaintenance { phase: m.phase.as_str().into(), id: m.id }))),
            Ok(None) => {}
            Err(u) => return Err((first, Fail::from(Cause::RecordUnwritable { dir: u.path.display().to_string(), error: u.error }))),
        }
        self.host_units_preflight(order, allow_outage, sink).await
    }

    /// The drain's preflight of each worker, the same for `pdctl host drain --dry-run` (run by
    /// the CLI, which asks pdctld whether the host is in maintenance): the unit is read, its
    /// stop would drain, and — without `allow_outage` — its role keeps a worker the gateway
    /// admits on another host ([`crate::engine::role_floor`], the count restarts use).
    async fn host_units_preflight(&self, order: &[&Worker], allow_outage: bool, sink: &crate::events::Sink) -> Result<(), (String, Fail)> {
        let gateway = if self.settings.verify.router { self.probes.router_workers(0).await.ok() } else { None };
        let down: Vec<&str> = order.iter().map(|w| w.url.as_str()).collect();
        for w in order {
            let s = StepRun::start(sink, &w.unit, Step::Preflight);
            let checked = async {
                self.units.state(&w.unit).await?;
                let cfg = self.units.config(&w.unit).await?;
                if let Some(fix) = crate::sglang::stop::kill_mode_risk(&w.unit, cfg.kill_mode.as_deref(), self.settings.rollout.drain_timeout) {
                    if self.settings.rollout.kill_mode == crate::config::KillModePolicy::Refuse {
                        return Err(Fail::from(Cause::KillModeUnsafe { unit: w.unit.clone(), kill_mode: cfg.kill_mode.unwrap_or_default(), fix }));
                    }
                }
                host_outage(w, &down, gateway.as_deref(), &self.settings.workers, allow_outage).map_err(|peers| {
                    Fail::from(Cause::OnlyWorkerOfRole {
                        unit: w.unit.clone(),
                        role: w.role.as_str().into(),
                        expected: None,
                        peers: peers.basis,
                        host_drain: true,
                    })
                })
            };
            match checked.await {
                Ok(outage) => s.pass(crate::engine::step_run::detail_of(&HostPreflight { outage })),
                Err(f) => {
                    s.fail(&f);
                    return Err((w.unit.clone(), f));
                }
            }
        }
        Ok(())
    }

    /// `pdctl host drain --dry-run`: the drain's own preflight of every worker
    /// ([`Self::host_units_preflight`]), touching nothing; the caller has asked pdctld whether
    /// the host is in maintenance already.
    pub async fn host_drain_dry_run(&self, plan: &Plan, allow_outage: bool, sink: &crate::events::Sink) -> Summary {
        let t0 = std::time::Instant::now();
        let order = drain_order(plan);
        let failed = match self.host_units_preflight(&order, allow_outage || self.settings.rollout.allow_outage, sink).await {
            Ok(()) => None,
            Err((unit, f)) => Some(halt::failure(self, &unit, Step::Preflight, f).await),
        };
        Summary::untouched(t0.elapsed().as_millis() as u64, failed)
    }

    /// A host drain that failed at `unit`'s `step`: before any stop, everything undone (its
    /// drains re-admitted, its slots given back, the record crossed off); after one, the record
    /// says `failed` and keeps the slots (a worker is down: the budget protects the fleet).
    async fn host_drain_failed(&self, unit: &str, step: Step, f: Fail, m: &mut Maintenance, ledger: &Ledger, run: &mut Underway<'_>) -> Summary {
        let (sink, ctx) = (run.sink, run.ctx);
        let failure = halt::failure(self, unit, step, f).await;
        halt::reconcile_drains(self, unit, step, ctx, sink, run.notes).await;
        if m.units.iter().any(|u| u.stopped) {
            m.phase = MaintenancePhase::Failed;
            m.since = crate::fleet::now_secs();
            m.failed = Some(failure.cause.clone());
            if let Err(e) = ledger.record_maintenance(m) {
                tracing::error!("the maintenance record could not be written ({e}): this host still holds its slots");
            }
            run.notes.push(format!(
                "stopped and kept out, holding their slots: {} — `pdctl host resume` brings them back through their gates",
                m.units.iter().filter(|u| u.stopped).map(|u| u.unit.as_str()).collect::<Vec<_>>().join(", ")
            ));
        } else {
            self.give_back_host_slots(&m.id, ledger, run.notes).await;
            let _ = ledger.clear_maintenance();
            run.notes.push("nothing was stopped: every drain was undone and the host's slots given back".into());
        }
        run.t.summary(Outcome::Failed, Some(failure))
    }

    /// After a reboot (the record's boot id is not this one), where each ready line is looked for:
    /// this boot's first entry in the journal. The cursors recorded before the stops name the
    /// last boot's journal — gone with a volatile one — and `sd_journal_seek_cursor` then places
    /// them by the wall clock alone: a clock set back across the reboot would put them after the
    /// new runs' ready lines. `None` (no reboot, or the journal could not say): the recorded ones.
    async fn boot_head_after_reboot(&self, m: &Maintenance) -> Option<String> {
        let now = boot_id(&self.settings.procfs)?;
        if m.boot_id.as_deref().is_none_or(|was| was == now) {
            return None;
        }
        match self.logs.boot_head_cursor(&now).await {
            Ok(head) => head,
            Err(e) => {
                tracing::warn!(
                    "this boot's first journal entry could not be found ({e}): ready lines are looked for after the cursors recorded before the stops"
                );
                None
            }
        }
    }

    /// A resume that did not finish: the record says `failed` (and why) and keeps the slots.
    async fn host_resume_failed(&self, m: &mut Maintenance, ledger: &Ledger, t: &mut Tally, failure: Option<crate::events::Failure>) -> Summary {
        m.phase = MaintenancePhase::Failed;
        m.since = crate::fleet::now_secs();
        m.failed = Some(failure.as_ref().map(|f| f.cause.clone()).unwrap_or_else(|| "aborted by an operator".into()));
        if let Err(e) = ledger.record_maintenance(m) {
            tracing::error!("the maintenance record could not be written ({e}): this host still holds its slots");
        }
        match failure {
            Some(f) => t.summary(Outcome::Failed, Some(f)),
            None => t.summary(Outcome::Aborted, None),
        }
    }

    /// Give back every fleet slot the host drain `id` took (each crossed off the ledger once
    /// etcd took it back); whether all went back. Without `[fleet]`: nothing held, `true`.
    async fn give_back_host_slots(&self, id: &str, ledger: &Ledger, notes: &Notes) -> bool {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return true;
        };
        let mut all = true;
        for (name, recs) in ledger.slots() {
            if !recs.iter().any(|r| r.hold.rollout == maintenance_hold(id)) {
                continue;
            }
            let mut back = true;
            for r in &recs {
                match crate::fleet::release(c.as_ref(), &f.name, &r.role, &r.hold.holder, &r.hold.token).await {
                    Ok(_) => {}
                    Err(e) => {
                        notes.push(format!("{}'s {} slot could not be given back yet ({e}): it stays on record", r.hold.holder, r.role));
                        back = false;
                    }
                }
            }
            if back {
                let _ = ledger.clear_slot(&name);
            }
            all &= back;
        }
        all
    }
}

/// Drain the host for a reboot: refused (touching nothing) when it is in maintenance already,
/// a unit cannot be read or its stop would not drain, or — without `--allow-outage` — a role
/// would be left with no worker the gateway admits; then the record, the slots, every worker
/// out of the gateway (decodes first), and every worker stopped. A failure before any stop
/// undoes it all (drains re-admitted, slots given back, record crossed off); after one, the
/// record says `failed` and keeps the slots until `pdctl host resume` passes.
pub(in crate::engine) async fn drain<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    plan: &Plan,
    asked: Asked<'_>,
    ledger: &Ledger,
    run: &mut Underway<'_>,
) -> Summary {
    let (sink, ctx) = (run.sink, run.ctx);
    let t = &mut *run.t;
    let order = drain_order(plan);
    let Some(first) = order.first().copied() else {
        return t.summary(Outcome::Succeeded, None);
    };
    if let Err((unit, f)) = eng.host_preflight(&order, ledger, ctx.outage.accepted(), sink).await {
        return t.summary(Outcome::Failed, Some(halt::failure(eng, &unit, Step::Preflight, f).await));
    }
    let now = crate::fleet::now_secs();
    let cursor = eng.logs.tail_cursor().await.ok().flatten();
    let mut units = Vec::new();
    for w in &order {
        let invocation_id = eng.units.state(&w.unit).await.map(|s| s.invocation_id).unwrap_or_default();
        units.push(MaintainedUnit { unit: w.unit.clone(), invocation_id, cursor: cursor.clone(), stopped: false });
    }
    let mut m = Maintenance {
        id: ctx.writes.id.to_string(),
        phase: MaintenancePhase::Draining,
        began: now,
        since: now,
        by: asked.by.to_string(),
        reason: asked.reason.map(String::from),
        boot_id: boot_id(&eng.settings.procfs),
        units,
        failed: None,
    };
    if let Err(e) = ledger.record_maintenance(&m) {
        return t.summary(Outcome::Failed, Some(halt::failure(eng, &first.unit, Step::Preflight, unwritable(e)).await));
    }
    // The host's whole budget at once: every worker's slot in one transaction, or none. The
    // holds name the maintenance (`pdctl fleet status` tells a rebooting host from a dead one).
    let holds_as = maintenance_hold(ctx.writes.id);
    let slot_ctx = crate::engine::context::Ctx { writes: crate::engine::context::Writes { id: &holds_as, ..ctx.writes }, ..ctx };
    if let Err((step, f)) = plan_steps::take_slots(eng, &order, sink, slot_ctx).await {
        let _ = ledger.clear_maintenance();
        return t.summary(Outcome::Failed, Some(halt::failure(eng, &first.unit, step, f).await));
    }
    let runs: Vec<WorkerRun<'_>> = order.iter().map(|w| WorkerRun::new(w, Sequence::HostDown, sink, ctx)).collect();
    // Out of the gateway first, every worker: nothing new reaches the host while the first
    // ones stop.
    let mut drained = Vec::new();
    for r in &runs {
        match runbook::drain(eng, r).await {
            Ok(d) => drained.push(d),
            Err((step, f)) => {
                let unit = r.w.unit.clone();
                return eng.host_drain_failed(&unit, step, f, &mut m, ledger, run).await;
            }
        }
    }
    for (i, (r, d)) in runs.iter().zip(drained).enumerate() {
        if let Err((step, f)) = runbook::stop(eng, r, d).await {
            let unit = r.w.unit.clone();
            return eng.host_drain_failed(&unit, step, f, &mut m, ledger, run).await;
        }
        m.units[i].stopped = true;
        if let Err(e) = ledger.record_maintenance(&m) {
            let unit = r.w.unit.clone();
            return eng.host_drain_failed(&unit, Step::Stop, unwritable(e), &mut m, ledger, run).await;
        }
        run.t.done.push(r.w.unit.clone());
    }
    m.phase = MaintenancePhase::Down;
    m.since = crate::fleet::now_secs();
    if let Err(e) = ledger.record_maintenance(&m) {
        return eng.host_drain_failed(&first.unit, Step::Stop, unwritable(e), &mut m, ledger, run).await;
    }
    run.notes.push(format!("every worker of this host is out of the gateway and stopped: the host may reboot now (then `pdctl host resume`, or pdctld resumes at its start after the reboot) — host drain {}", m.id));
    run.t.summary(Outcome::Succeeded, None)
}

/// Bring the host back after its maintenance: each worker (prefills first) started if the
/// boot did not, and through the restart's gates — its ready line of this run, health, pair,
/// router, metrics, stranded KV, the soak — and only once all passed the host's slots given
/// back and the record crossed off. A failure keeps the slots and says `failed`.
pub(in crate::engine) async fn resume<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, plan: &Plan, ledger: &Ledger, run: &mut Underway<'_>) -> Summary {
    let (sink, ctx, abort) = (run.sink, run.ctx, run.abort);
    let mut m = match ledger.maintenance() {
        Ok(Some(m)) => m,
        Ok(None) => {
            run.notes.push("this host is not in maintenance: nothing to resume".into());
            return run.t.summary(Outcome::Succeeded, None);
        }
        Err(u) => {
            let f = Fail::from(Cause::RecordUnwritable { dir: u.path.display().to_string(), error: u.error });
            let unit = plan.workers.first().map(|w| w.unit.clone()).unwrap_or_default();
            return run.t.summary(Outcome::Failed, Some(halt::failure(eng, &unit, Step::Preflight, f).await));
        }
    };
    m.phase = MaintenancePhase::Resuming;
    m.since = crate::fleet::now_secs();
    m.failed = None;
    let _ = ledger.record_maintenance(&m);
    let boot_head = eng.boot_head_after_reboot(&m).await;
    let mut order = drain_order(plan);
    order.reverse();
    // What the boot started already is verified together, each through every gate (a
    // prefill's pair probe waits for nothing: the later of a pair to be ready probes it);
    // only what must be started is started, in order, after them.
    let (booted, stopped) = running_or_not(eng, &order).await;
    let peer = |a: &Worker, b: &Worker| a.role != b.role && a.role != Role::Regular && b.role != Role::Regular;
    // Its recorded stop (and, after a reboot, this boot's journal head for its ready line).
    let maintained = |w: &Worker| {
        m.units.iter().find(|u| u.unit == w.unit).cloned().map(|mut u| {
            if boot_head.is_some() {
                u.cursor.clone_from(&boot_head);
            }
            u
        })
    };
    if abort.load(Ordering::SeqCst) {
        return eng.host_resume_failed(&mut m, ledger, run.t, None).await;
    }
    let together = futures_util::future::join_all(booted.iter().map(|w| {
        let mut r = WorkerRun::new(w, Sequence::HostUp, sink, ctx);
        r.maintained = maintained(w);
        // Its peers come back beside it: none may serve behind the gateway yet.
        r.peers_out = order.iter().any(|o| peer(o, w));
        async move { (w, runbook::run_sequence(eng, &r).await) }
    }))
    .await;
    let mut failed = None;
    for (w, res) in together {
        match res {
            Ok(_) => run.t.done.push(w.unit.clone()),
            Err((step, f)) if failed.is_none() => failed = Some((w.unit.clone(), step, f)),
            Err(_) => {}
        }
    }
    if let Some((unit, step, f)) = failed {
        let failure = halt::failure(eng, &unit, step, f).await;
        return eng.host_resume_failed(&mut m, ledger, run.t, Some(failure)).await;
    }
    for (i, w) in stopped.iter().copied().enumerate() {
        if abort.load(Ordering::SeqCst) {
            return eng.host_resume_failed(&mut m, ledger, run.t, None).await;
        }
        let mut r = WorkerRun::new(w, Sequence::HostUp, sink, ctx);
        r.maintained = maintained(w);
        // Its peers come back after it: none serves behind the gateway yet.
        r.peers_out = order.iter().any(|o| peer(o, w)) && !booted.iter().chain(stopped.iter().take(i)).any(|o| peer(o, w));
        if let Err((step, f)) = runbook::run_sequence(eng, &r).await {
            let failure = halt::failure(eng, &w.unit, step, f).await;
            return eng.host_resume_failed(&mut m, ledger, run.t, Some(failure)).await;
        }
        run.t.done.push(w.unit.clone());
    }
    resumed(eng, &m.id, ledger, run).await
}

/// `order`'s workers the boot started (or that never stopped), and those still stopped.
async fn running_or_not<'w, U: Units, L, P>(eng: &Engine<U, L, P>, order: &[&'w Worker]) -> (Vec<&'w Worker>, Vec<&'w Worker>) {
    let (mut booted, mut stopped) = (Vec::new(), Vec::new());
    for w in order.iter().copied() {
        let running =
            eng.units.state(&w.unit).await.is_ok_and(|st| matches!(st.active_state, ActiveState::Active | ActiveState::Activating | ActiveState::Reloading));
        if running {
            booted.push(w)
        } else {
            stopped.push(w)
        }
    }
    (booted, stopped)
}

/// Every worker passed every gate: the host's budget goes back and its maintenance record is
/// crossed off (kept, and said, while etcd has not taken a slot back).
async fn resumed<U: Units, L: Logs, P: Probes>(eng: &Engine<U, L, P>, id: &str, ledger: &Ledger, run: &mut Underway<'_>) -> Summary {
    let all_back = eng.give_back_host_slots(id, ledger, run.notes).await;
    if all_back {
        if let Err(e) = ledger.clear_maintenance() {
            tracing::warn!("the maintenance record could not be crossed off ({e})");
        }
        run.notes.push(format!("every worker passed its gates after the maintenance and the host's slots are given back (host drain {id})"));
    } else {
        run.notes.push("every worker passed its gates; a slot etcd did not take back yet stays on record and is given back when etcd answers".into());
    }
    run.t.summary(Outcome::Succeeded, None)
}

#[cfg(test)]
mod tests {
    use crate::engine::machine::Engine;
    use crate::engine::work::{RolloutRun, Work};
    use crate::events::{Event, Outcome, Status, Step};
    use crate::fakes::{rollout_of, with_router, world, FakeLogs, FakeProbes, FakeUnits, W};
    use crate::plan::Plan;
    use crate::state::drain_ledger::{Ledger, MaintenancePhase};

    async fn host_run(w: &W, ledger: &Ledger, work: Work<'_>, allow_outage: bool) -> (crate::events::Summary, Vec<Event>) {
        let mut s = with_router(w, true);
        // Only the run's own `--allow-outage` accepts the outage here.
        s.rollout.allow_outage = false;
        let plan = Plan::new(&s, &[]).expect("plan");
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = RolloutRun { work, ledger: Some(ledger), ..rollout_of(&plan, &abort, allow_outage, false) };
        let summary = engine.execute(run, &tx).await.summary;
        drop(tx);
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        (summary, events)
    }

    /// A 1P1D host alone behind its gateway: the drain is refused without `--allow-outage`
    /// (nothing stopped, nothing recorded); with it, both workers leave the gateway and stop,
    /// the decode first, and the record says `down`; the resume starts both (the prefill first)
    /// through every gate, re-admits them and crosses the record off.
    #[tokio::test]
    async fn a_host_is_drained_and_stopped_decode_first_and_resumed_through_the_gates() {
        let w = world();
        let dir = std::env::temp_dir().join(format!("pdctl-host-{}", std::process::id()));
        let ledger = Ledger::open(&dir).expect("ledger");
        let asked = super::Asked { by: "uid 0", reason: Some("kernel 6.8.0-51") };

        let (refused, _) = host_run(&w, &ledger, Work::HostDrain { asked }, false).await;
        assert_eq!(refused.result, Outcome::Failed);
        assert_eq!(refused.failed.as_ref().map(|f| f.cause_code.as_str()), Some("only_worker_of_role"), "{refused:?}");
        assert!(w.lock().expect("world").stopped.is_empty(), "a refusal stops nothing");
        assert_eq!(ledger.maintenance().expect("readable"), None, "a refusal records nothing");

        let (drained, events) = host_run(&w, &ledger, Work::HostDrain { asked }, true).await;
        assert_eq!(drained.result, Outcome::Succeeded, "{drained:?}");
        assert_eq!(w.lock().expect("world").stopped, vec!["d.service".to_string(), "p.service".to_string()]);
        let listed = w.lock().expect("world").router.as_ref().map(|r| r.workers.len()).unwrap_or(0);
        assert_eq!(listed, 0, "both out of the gateway");
        let at = |u: &str, s: Step| events.iter().position(|e| e.unit == u && e.step == s && e.status == Status::Passed).unwrap_or(usize::MAX);
        assert!(at("p.service", Step::Drain) < at("d.service", Step::Stop), "every worker out of the gateway before the first stop");
        let m = ledger.maintenance().expect("readable").expect("on record");
        assert_eq!(m.phase, MaintenancePhase::Down);
        assert!(m.units.iter().all(|u| u.stopped), "{m:?}");
        assert!(ledger.all().0.is_empty(), "a stopped worker is not a drain to undo");

        let (again, _) = host_run(&w, &ledger, Work::HostDrain { asked }, true).await;
        assert_eq!(again.failed.as_ref().map(|f| f.cause_code.as_str()), Some("in_maintenance"), "a second drain is refused");

        let (resumed, events) = host_run(&w, &ledger, Work::HostResume, true).await;
        assert_eq!(resumed.result, Outcome::Succeeded, "{resumed:?}");
        assert_eq!(w.lock().expect("world").started, vec!["p.service".to_string(), "d.service".to_string()]);
        for u in ["p.service", "d.service"] {
            for s in [Step::Start, Step::Ready, Step::Health, Step::Router, Step::Soak] {
                assert!(at_in(&events, u, s), "{u} passed {s:?}");
            }
        }
        assert_eq!(w.lock().expect("world").router.as_ref().map(|r| r.workers.len()), Some(2), "both admitted again");
        assert_eq!(ledger.maintenance().expect("readable"), None, "crossed off once every gate passed");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn at_in(events: &[Event], unit: &str, step: Step) -> bool {
        events.iter().any(|e| e.unit == unit && e.step == step && e.status == Status::Passed)
    }
}
