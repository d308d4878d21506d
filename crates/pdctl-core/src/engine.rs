//! The rollout state machine. It reads like the runbook — for each worker, in plan order:
//!
//! 1. **preflight** (all workers, before the first restart): the unit exists; reload the manager if
//!    `NeedDaemonReload`; `--enable-metrics` is in ExecStart when the metrics gate is required; GPU
//!    sets do not overlap; a PD worker's ExecStart can pair with its running peers
//!    ([`crate::pairing::compare`]); the router answers.
//! 2. **drain**: take the worker out of the router, wait (bounded) for its in-flight requests.
//! 3. **restart**: journal cursor, watch the unit, `RestartUnit(name, "replace")`, our job's result.
//! 4. **ready**: the ready line of *this* run ([`crate::judge::Judge`]); fail fast on a fatal line,
//!    the manager's exit/failure messages, or a crash/auto-restart ([`crate::judge::crashed_since`]).
//! 5. **health**: `/health` answers 200.
//! 6. **pair** (a PD worker, still out of the router): a PD request sent straight to each pair it
//!    is in; a decode found with a stale pairing after a prefill restart is restarted through every
//!    gate as a repair (`repair_of`), or the rollout halts (`on_stale_pair`).
//! 7. **router**: registered (re-registered if the router dropped it) with the right type, healthy,
//!    circuit breaker not open, one small request through the router answers 200.
//! 8. **metrics**: KV gauges exposed and sane (one warm-up request if they are not published yet).
//! 9. **stranded_kv** (a decode): the prefills release the KV they held for its old process's rooms.
//! 10. **soak**: the same run (InvocationID, NRestarts) stays up for `min_healthy`; then the files it
//!     runs with are recorded as its good revision.
//!
//! The first failure halts the rollout with its [`Cause`] and the unit's last log lines; nothing
//! after it is touched. One unit is down at a time. With `on_failure = "rollback"` the failed unit's
//! last good revision is restored and run through the same gates ([`Engine::execute`]). A resumed
//! rollout re-verifies the unit it stopped at and restarts it only if that fails.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::api::{FLEET, ROUTER};
use crate::cause::{Cause, MetricsDiagnosis, Phase, RouterSeen};
use crate::config::{MetricsMode, OnFailure, Role, Settings, Worker};
use crate::drains::{Drain, Ledger};
use crate::events::{Event, Failure, Outcome, Sink, Status, Step, Summary};
use crate::judge::{crashed_since, Judge, Run, Verdict};
use crate::plan::Plan;
use crate::ports::{Follow, Health, Logs, PairTarget, Probes, UnitState, Units, UnitsError, Watch};
use crate::revisions;

/// Lines of the unit's log attached to a failure.
pub const LAST_LINES: usize = 20;
/// Pause between polls of HTTP state that offers no events (loopback calls; cheap).
/// How long a worker pdctl has seen serve may stay `not_ready` in the gateway (smg 1.x) before
/// pdctl removes and re-adds it: a few of the gateway's health-check rounds.
const STUCK_NOT_READY: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(100);

/// A step's failure before it becomes a [`Failure`]: the cause, and facts for the event's detail.
#[derive(Debug)]
struct Fail {
    cause: Cause,
    detail: Value,
    /// The unit that failed, when it is not the one being rolled (a decode restarted as a
    /// repair of the prefill's stale pairing).
    unit: Option<String>,
}

impl From<Cause> for Fail {
    fn from(cause: Cause) -> Fail {
        Fail { cause, detail: Value::Null, unit: None }
    }
}

impl From<UnitsError> for Fail {
    fn from(e: UnitsError) -> Fail {
        e.cause().into()
    }
}

struct StepRun<'a> {
    sink: &'a Sink,
    unit: String,
    step: Step,
    t0: Instant,
}

impl<'a> StepRun<'a> {
    fn start(sink: &'a Sink, unit: &str, step: Step) -> StepRun<'a> {
        let s = StepRun { sink, unit: unit.to_string(), step, t0: Instant::now() };
        s.emit(Status::Started, Value::Null);
        s
    }
    fn emit(&self, status: Status, detail: Value) {
        let ev = Event {
            unit: self.unit.clone(),
            step: self.step,
            status,
            elapsed_ms: self.t0.elapsed().as_millis() as u64,
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            detail,
            repair_of: None,
        };
        // Never a field named `unit`: journald would store it as UNIT=, which systemd's unit
        // filters match, and pdctl's lines would show up among the unit's own.
        tracing::debug!(pdctl_unit = %ev.unit, pdctl_step = self.step.as_str(), "{}", sentence(&ev));
        let _ = self.sink.send(ev);
    }
    fn pass(self, detail: Value) {
        self.emit(Status::Passed, detail);
    }
    fn skip(self, why: &str) {
        self.emit(Status::Skipped, json!({ "reason": why }));
    }
    fn fail(self, f: &Fail) {
        let mut d = json!({ "cause": f.cause.sentence(), "cause_code": f.cause.code() });
        if let (Some(o), Value::Object(extra)) = (d.as_object_mut(), &f.detail) {
            o.extend(extra.clone());
        }
        self.emit(Status::Failed, d);
    }
}

/// One event as a log sentence: unit, step, status, duration, and the cause of a failure.
pub fn sentence(e: &Event) -> String {
    let secs = e.elapsed_ms as f64 / 1000.0;
    match e.status {
        Status::Started => format!("{}: {} started", e.unit, e.step.as_str()),
        Status::Passed => format!("{}: {} passed in {secs:.1}s", e.unit, e.step.as_str()),
        Status::Skipped => format!("{}: {} skipped ({})", e.unit, e.step.as_str(), e.detail["reason"].as_str().unwrap_or("not needed")),
        Status::Failed => format!("{}: {} failed after {secs:.1}s: {}", e.unit, e.step.as_str(), e.detail["cause"].as_str().unwrap_or("unknown cause")),
    }
}

/// Run `fut`, but give up when the gate's time (`limit` from `t0`) is over: one hung HTTP call
/// must not stretch a gate's deadline.
async fn within<T>(t0: Instant, limit: Duration, fut: impl std::future::Future<Output = T>) -> Option<T> {
    let left = limit.saturating_sub(t0.elapsed());
    tokio::time::timeout(left.max(Duration::from_millis(100)), fut).await.ok()
}

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
        None => dir.and_then(|d| revisions::quarantined(d, &current)).map(|q| quarantine_clause(&q)),
    };
    if changes.is_empty() && quarantined.is_none() {
        return None;
    }
    Some(Cause::ChangesPending { unit: w.unit.clone(), changes: changes.join("; "), quarantined })
}

/// "in rollout r17…: <its cause>", for [`Cause::ChangesPending`].
pub fn quarantine_clause(q: &revisions::Quarantine) -> String {
    format!("in rollout {}: {}", q.rollout_id, q.cause)
}

fn fmt_set(s: &BTreeSet<u32>) -> String {
    s.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The engine: settings plus the three ports.
pub struct Engine<U, L, P> {
    /// systemd.
    pub units: U,
    /// The journal.
    pub logs: L,
    /// HTTP checks.
    pub probes: P,
    /// Validated settings.
    pub settings: Settings,
    /// The fleet's store (etcd), with `[fleet]`.
    pub coordinator: Option<std::sync::Arc<dyn crate::ports::Coordinator>>,
}

/// What `check` does not do: restart, soak, and anything that changes the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rollout,
    Check,
}

/// A rollout for [`Engine::execute`].
pub struct RolloutRun<'a> {
    /// The workers, in order.
    pub plan: &'a Plan,
    /// Continue an interrupted rollout: the first unit is re-verified and restarted only if that fails.
    pub resume: bool,
    /// Set by an operator: stop between units.
    pub abort: &'a AtomicBool,
    /// Where good revisions live (pdctld's state directory); `None`: no revisions, no rollback.
    pub revisions: Option<&'a Path>,
    /// Where drains are written down before the router is touched; `None`: drains are not
    /// persisted (only for in-process runs that cannot outlive their caller).
    pub ledger: Option<&'a Ledger>,
    /// The rollout's id (names files moved aside by a rollback; in the drain ledger).
    pub id: &'a str,
    /// Taking the only worker of a role down is accepted (`--allow-outage`; or the config's).
    pub allow_outage: bool,
    /// Changes on disk that a worker does not run yet may be loaded by its restart (a config
    /// rollout, or `--load-changes`); else such a worker is refused in preflight.
    pub load_changes: bool,
}

/// What a run writes to besides events.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    revisions: Option<&'a Path>,
    ledger: Option<&'a Ledger>,
    id: &'a str,
    /// `None`: nothing is restarted (check); else whether an outage is accepted.
    allow_outage: Option<bool>,
    /// The availability probe's view, when it runs.
    clients: Option<&'a Clients>,
    /// The other unit restarting at the same time (`single_pair = "together"`): the pair gate
    /// waits for it to serve instead of skipping it.
    together_with: Option<&'a str>,
    /// Changes a worker does not run yet may be loaded ([`RolloutRun::load_changes`]).
    load_changes: bool,
    /// Without the revisions directory (a dry run outside pdctld): what pdctld said is pending.
    known: Option<&'a KnownChanges>,
    /// Abort what the worker still runs after the drain (a stale decode's requests can never
    /// finish and would hold its stop until SIGKILL).
    abort_in_flight: bool,
}

impl Ctx<'_> {
    fn none(allow_outage: Option<bool>, load_changes: bool) -> Ctx<'static> {
        Ctx { revisions: None, ledger: None, id: "", allow_outage, clients: None, together_with: None, load_changes, known: None, abort_in_flight: false }
    }
}

/// What pdctld's `GET /v1/diff` says of one worker: what a dry run run outside pdctld knows of
/// the state it cannot read.
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// What changed since its last good revision.
    pub reasons: Vec<String>,
    /// Its current files are a change that failed (as a clause: [`quarantine_clause`]).
    pub quarantined: Option<String>,
    /// Its last measured start and window out of the router.
    pub timing: Option<revisions::StartTime>,
}

/// Unit → what pdctld knows of it ([`Known`]).
pub type KnownChanges = std::collections::BTreeMap<String, Known>;

/// A unit restarted to repair a stale pairing, and the prefill whose restart needed it.
type Repaired = Vec<(Worker, String)>;

/// A decode found with a stale pairing: this host's, or another host's (`owner`: host and unit).
struct Stale {
    decode: Worker,
    owner: Option<(String, String)>,
}

/// Shared between the rollout and its availability probe.
#[derive(Default)]
struct Clients {
    /// The unit being rolled (tags samples).
    current: std::sync::Mutex<Option<String>>,
    /// Failed probe requests so far.
    failed: std::sync::atomic::AtomicU64,
    /// The rollout is over: the probe stops.
    done: AtomicBool,
    /// Samples, in time order.
    samples: std::sync::Mutex<Vec<crate::availability::Sample>>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a worker runs its current files.
#[derive(Debug, Clone)]
pub struct Staleness {
    /// The unit.
    pub unit: String,
    /// What changed since its last good revision (empty: nothing).
    pub reasons: Vec<String>,
    /// Its current files are a change that failed before (not rolled out again by `apply`).
    pub quarantined: Option<revisions::Quarantine>,
}

/// How a rollout ended, and what was done besides the gates (revisions recorded, rollback).
#[derive(Debug, Clone)]
pub struct Finished {
    /// The summary.
    pub summary: Summary,
    /// What was recorded or restored, one sentence each.
    pub notes: Vec<String>,
    /// What clients saw during each unit's window (the availability probe).
    pub availability_by_unit: std::collections::BTreeMap<String, crate::availability::Availability>,
}

impl<U: Units, L: Logs, P: Probes> Engine<U, L, P> {
    /// Restart the plan's workers one at a time through every gate.
    pub async fn rolling_restart(&self, plan: &Plan, sink: &Sink) -> Summary {
        let mut notes = Vec::new();
        self.run(plan, sink, Mode::Rollout, &AtomicBool::new(false), Ctx::none(Some(true), true), &mut notes).await
    }

    /// Every gate except restart and soak, on every worker, changing nothing.
    pub async fn check(&self, plan: &Plan, sink: &Sink) -> Summary {
        let mut s = self.run(plan, sink, Mode::Check, &AtomicBool::new(false), Ctx::none(None, false), &mut Vec::new()).await;
        // Nothing was restarted: the units passed their checks.
        s.checked = std::mem::take(&mut s.units);
        s
    }

    /// A rollout as pdctld runs it: a rolling restart (or the rest of an interrupted one), stopped
    /// between units when `abort` is set, recording each verified unit's files as its good revision,
    /// and with `on_failure = "rollback"` restoring the failed unit's last good revision and
    /// verifying it through the same gates (then the result is `rolled_back`).
    pub async fn execute(&self, r: RolloutRun<'_>, sink: &Sink) -> Finished {
        let t0 = Instant::now();
        let mut notes = Vec::new();
        let mut plan = r.plan.clone();
        if r.resume {
            if let Some(first) = plan.workers.first().cloned() {
                if self.verify(&first, sink).await {
                    plan.workers.remove(0);
                    notes.push(format!("{} passed its gates again without a restart", first.unit));
                }
            }
        }
        let clients = Clients::default();
        let probing = self.settings.verify.availability_probe.filter(|_| self.settings.verify.router);
        let ctx = Ctx {
            revisions: r.revisions,
            ledger: r.ledger,
            id: r.id,
            allow_outage: Some(r.allow_outage || self.settings.rollout.allow_outage),
            clients: probing.map(|_| &clients),
            together_with: None,
            load_changes: r.load_changes,
            known: None,
            abort_in_flight: false,
        };
        if let Some(dir) = r.revisions {
            // Every unit about to restart has a revision to roll back to (recorded before the restart).
            let _ = self.staleness(dir).await;
        }
        // The probe watches the whole rollout, a rollback included: what clients saw while a
        // failed worker was out and put back is part of the figures.
        let run = async {
            let mut summary = self.run(&plan, sink, Mode::Rollout, r.abort, ctx, &mut notes).await;
            if let (Outcome::Failed, Some(f), Some(dir)) = (summary.result, &summary.failed, r.revisions) {
                if f.step != Step::Preflight && f.unit != ROUTER && f.unit != FLEET {
                    notes.extend(self.quarantine_if_changed(&f.unit, &f.cause, dir, r.id).await);
                }
                // A slot never granted changed nothing to roll back.
                if self.settings.rollout.on_failure == OnFailure::Rollback && f.unit != ROUTER && f.unit != FLEET && f.step != Step::Slot {
                    let unit = f.unit.clone();
                    let restart = f.step != Step::Preflight;
                    match self.rollback(&unit, ctx, dir, restart, sink, &mut notes).await {
                        Ok(true) => summary.result = Outcome::RolledBack,
                        Ok(false) => {}
                        Err(why) => notes.push(format!("rollback of {unit} failed: {why}")),
                    }
                }
            }
            clients.done.store(true, Ordering::SeqCst);
            summary
        };
        let (mut summary, _) = tokio::join!(run, async {
            if let Some(rate) = probing {
                self.watch_clients(rate, &clients).await;
            }
        });
        // The whole rollout's time: a resume's re-verification and a rollback included.
        summary.elapsed_ms = t0.elapsed().as_millis() as u64;
        let samples = std::mem::take(&mut *lock(&clients.samples));
        let end = Instant::now();
        if probing.is_some() {
            summary.availability = Some(crate::availability::summarize(&samples, end));
        }
        Finished { summary, notes, availability_by_unit: crate::availability::by_unit(&samples, end) }
    }

    async fn run(&self, plan: &Plan, sink: &Sink, mode: Mode, abort: &AtomicBool, ctx: Ctx<'_>, notes: &mut Vec<String>) -> Summary {
        let t0 = Instant::now();
        let mut done = Vec::new();
        let mut repairs = std::collections::BTreeMap::new();
        let summary = |result: Outcome, failed: Option<Failure>, done: Vec<String>, repairs: &std::collections::BTreeMap<String, String>| Summary {
            availability: None,
            id: None,
            result,
            elapsed_ms: t0.elapsed().as_millis() as u64,
            units: done,
            checked: Vec::new(),
            repairs: repairs.clone(),
            failed,
        };
        if let Err((unit, f)) = self.preflight(plan, sink, false, ctx).await {
            return summary(Outcome::Failed, Some(self.failure(&unit, Step::Preflight, f).await), done, &repairs);
        }
        // `single_pair = "together"` on a 1P1D plan: both at once, each through every gate (one
        // interruption instead of two).
        if let (Mode::Rollout, crate::config::SinglePair::Together, [p, d]) = (mode, self.settings.rollout.single_pair, plan.workers.as_slice()) {
            if p.role == Role::Prefill && d.role == Role::Decode {
                if let Some(c) = ctx.clients {
                    *lock(&c.current) = Some(format!("{} + {}", p.unit, d.unit));
                }
                // Fleet: both slots in one transaction, or none.
                let slots = match self.slot_step(&[p, d], sink, ctx).await {
                    Ok(s) => s,
                    Err((step, f)) => return summary(Outcome::Failed, Some(self.failure(&p.unit, step, f).await), done, &repairs),
                };
                let (cp, cd) = (Ctx { together_with: Some(&d.unit), ..ctx }, Ctx { together_with: Some(&p.unit), ..ctx });
                let (rp, rd) = tokio::join!(self.restart_one(p, sink, cp, true), self.restart_one(d, sink, cd, true));
                if rp.is_ok() && rd.is_ok() {
                    self.release_slots(&p.unit, &slots, ctx).await;
                }
                for (w, r) in [(p, rp), (d, rd)] {
                    match r {
                        Ok(_) => {
                            if let Some(dir) = ctx.revisions {
                                notes.push(self.record_revision(w, dir).await);
                            }
                            done.push(w.unit.clone());
                        }
                        Err((step, f)) => {
                            let failure = self.failure(&w.unit, step, f).await;
                            if let Some(l) = ctx.ledger.filter(|l| l.get(&w.unit).is_some_and(|d| d.rollout_id == ctx.id)) {
                                if let Some(dr) = l.get(&w.unit) {
                                    notes.push(self.reconcile(&dr, l, self.settings.rollout.ready_timeout, sink).await.unwrap_or_else(|c| c.sentence()));
                                }
                            }
                            return summary(Outcome::Failed, Some(failure), done, &repairs);
                        }
                    }
                }
                return summary(Outcome::Succeeded, None, done, &repairs);
            }
        }
        for w in &plan.workers {
            if abort.load(Ordering::SeqCst) {
                return summary(Outcome::Aborted, None, done, &repairs);
            }
            if done.contains(&w.unit) {
                notes.push(format!(
                    "{} was not restarted again: it was restarted and verified earlier in this rollout, as a repair of {}",
                    w.unit,
                    repairs.get(&w.unit).map(String::as_str).unwrap_or("a prefill")
                ));
                continue;
            }
            if let Some(c) = ctx.clients {
                *lock(&c.current) = Some(w.unit.clone());
            }
            let r = match mode {
                Mode::Rollout => self.restart_one(w, sink, ctx, true).await,
                Mode::Check => self.check_one(w, sink).await.map(|()| Vec::new()),
            };
            let repaired = match r {
                Ok(rep) => rep,
                Err((step, f)) => {
                    let unit = f.unit.clone().unwrap_or_else(|| w.unit.clone());
                    let failure = self.failure(&unit, step, f).await;
                    // A drain this run made is never left behind: re-admit each worker (the one
                    // rolled, a decode being repaired) if it serves.
                    if let Some(l) = ctx.ledger {
                        for d in l.all().0.into_iter().filter(|d| d.rollout_id == ctx.id) {
                            let budget = if step == Step::Restart && d.unit == unit { self.settings.rollout.ready_timeout } else { Duration::ZERO };
                            notes.push(match self.reconcile(&d, l, budget, sink).await {
                                Ok(n) => n,
                                Err(c) => c.sentence(),
                            });
                        }
                    }
                    return summary(Outcome::Failed, Some(failure), done, &repairs);
                }
            };
            for (d, of) in repaired {
                // Another host's decode records its revision there.
                if let (Some(dir), true) = (ctx.revisions, self.settings.workers.iter().any(|x| x.unit == d.unit)) {
                    notes.push(self.record_revision(&d, dir).await);
                }
                notes.push(format!("{} was restarted to repair its stale pairing with {of}", d.unit));
                done.push(d.unit.clone());
                repairs.insert(d.unit.clone(), of);
            }
            if let (Mode::Rollout, Some(dir)) = (mode, ctx.revisions) {
                notes.push(self.record_revision(w, dir).await);
            }
            done.push(w.unit.clone());
            // What clients saw is a gate too: no next unit after too many failed requests.
            if let (Some(c), Some(max)) = (ctx.clients, self.settings.rollout.max_failed_probes) {
                let failed = c.failed.load(Ordering::SeqCst);
                if failed > max && done.len() < plan.workers.len() {
                    let f = Fail::from(Cause::ClientsFailing { unit: w.unit.clone(), failed, max });
                    StepRun::start(sink, &w.unit, Step::Soak).fail(&f);
                    done.pop();
                    return summary(Outcome::Failed, Some(self.failure(&w.unit, Step::Soak, f).await), done, &repairs);
                }
            }
        }
        summary(Outcome::Succeeded, None, done, &repairs)
    }

    async fn failure(&self, unit: &str, step: Step, f: Fail) -> Failure {
        let last_lines = if unit == ROUTER || unit == FLEET { Vec::new() } else { self.logs.last_lines(unit, LAST_LINES).await.unwrap_or_default() };
        Failure::new(unit, step, &f.cause, last_lines)
    }

    /// `--dry-run`: the plan's preflight verdict, touching nothing (no daemon-reload either).
    /// `load_changes`: as the real run's ([`RolloutRun::load_changes`]); `known`: pdctld's view of
    /// pending changes and quarantines, where it could be asked.
    pub async fn dry_run(&self, plan: &Plan, sink: &Sink, allow_outage: bool, load_changes: bool, known: Option<&KnownChanges>) -> Summary {
        let t0 = Instant::now();
        let ctx = Ctx { known, ..Ctx::none(Some(allow_outage || self.settings.rollout.allow_outage), load_changes) };
        let failed = match self.preflight(plan, sink, true, ctx).await {
            Ok(()) => None,
            Err((unit, f)) => Some(self.failure(&unit, Step::Preflight, f).await),
        };
        Summary {
            id: None,
            availability: None,
            repairs: Default::default(),
            result: if failed.is_some() { Outcome::Failed } else { Outcome::Succeeded },
            elapsed_ms: t0.elapsed().as_millis() as u64,
            units: Vec::new(),
            checked: Vec::new(),
            failed,
        }
    }

    /// Preflight for every worker of the plan, before anything is touched.
    async fn preflight(&self, plan: &Plan, sink: &Sink, dry: bool, ctx: Ctx<'_>) -> Result<(), (String, Fail)> {
        let mut reloaded = false;
        let fleet_view = match (&self.settings.fleet, self.settings.verify.router) {
            (Some(_), true) => self.probes.router_workers(0).await.ok(),
            _ => None,
        };
        let mut sets: Vec<(String, BTreeSet<u32>)> = Vec::new();
        for w in &plan.workers {
            let s = StepRun::start(sink, &w.unit, Step::Preflight);
            let r = async {
                let st = self.units.state(&w.unit).await?;
                // `check` (nothing restarts): a worker that is not running fails its own check.
                if ctx.allow_outage.is_none() && st.active_state != "active" {
                    return Err(Fail::from(Cause::UnitNotRunning { unit: w.unit.clone(), state: format!("{}/{}", st.active_state, st.sub_state) }));
                }
                let mut cfg = self.units.config(&w.unit).await?;
                // Drop-ins on disk that systemd has not loaded yet (a new one does not set
                // NeedDaemonReload): a restart without a reload would not apply them.
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
                if ctx.allow_outage.is_some() && !ctx.load_changes {
                    if let Some(c) = pending_changes(w, &cfg, &st, &not_loaded(&cfg), ctx.revisions, ctx.known) {
                        return Err(Fail::from(c));
                    }
                }
                let mut did_reload = false;
                if needs_reload && dry {
                    did_reload = true; // reported as "would reload"
                } else if needs_reload && !reloaded {
                    self.units.reload().await?;
                    reloaded = true;
                    did_reload = true;
                    cfg = self.units.config(&w.unit).await?;
                }
                let on_disk = not_loaded(&cfg);
                let args: Vec<&String> = cfg.exec_start.iter().flatten().collect();
                let metrics_flag = args.iter().any(|a| *a == "--enable-metrics" || a.starts_with("--enable-metrics="));
                if self.settings.verify.metrics == MetricsMode::Required && !metrics_flag {
                    return Err(Fail::from(Cause::MetricsDisabled { unit: w.unit.clone() }));
                }
                let gpus = gpus_of(w, &cfg.environment);
                if let Some(g) = &gpus {
                    if let Some((other, og)) = sets.iter().find(|(_, og)| !og.is_disjoint(g)) {
                        return Err(Fail::from(Cause::GpuOverlap { unit: w.unit.clone(), gpus: fmt_set(g), other: other.clone(), other_gpus: fmt_set(og) }));
                    }
                    sets.push((w.unit.clone(), g.clone()));
                }
                self.not_blocked(&w.unit, &w.url).await?;
                // A worker started with --api-key refuses every call pdctl makes but /health,
                // /ready and /metrics without its key: found now, before anything is touched.
                // `None`: not checked (the unit is not running).
                let mut api_key_check = None;
                if st.active_state == "active" {
                    match self.probes.auth(&w.url).await {
                        crate::ports::Auth::Rejected { endpoint, status, key } => return Err(Fail::from(Cause::ApiKeyRejected { endpoint, status, key })),
                        crate::ports::Auth::Unknown(why) => api_key_check = Some(format!("not checked: {why}")),
                        crate::ports::Auth::Accepted => api_key_check = Some("accepted".to_string()),
                    }
                }
                let pairing = self.pairing_preflight(w, plan, &cfg).await?;
                // What a stop of this worker may run into (SGLang's stop waits for its requests).
                let bootstrap = (w.role == Role::Prefill).then(|| crate::sglang::bootstrap_timeout(&cfg.environment));
                let mut warnings = crate::stop::risks(&w.unit, cfg.timeout_stop, self.settings.rollout.drain_timeout, bootstrap);
                if w.role == Role::Decode && self.settings.verify.pair {
                    warnings.extend(crate::pairing::timing_risk(
                        &w.unit,
                        &crate::sglang::DecodeTiming::of(&cfg.environment),
                        self.settings.verify.pair_timeout,
                    ));
                }
                for warning in &warnings {
                    tracing::warn!(pdctl_unit = %w.unit, "{warning}");
                }
                // The only worker of its role: restarting it stops serving (PD needs both roles).
                let mut outage = None;
                // With [fleet], over the whole fleet as the router sees it; else this host's.
                let alone = match &fleet_view {
                    Some(list) => list.iter().filter(|x| x.worker_type == w.role.as_str() && !x.draining()).count() <= 1,
                    None => self.settings.workers.iter().filter(|o| o.role == w.role).count() == 1,
                };
                if let (true, Some(allowed)) = (alone, ctx.allow_outage) {
                    let expected = match (ctx.revisions, ctx.known.and_then(|k| k.get(&w.unit))) {
                        (Some(d), _) => revisions::last_start(d, &w.unit),
                        (None, Some(k)) => k.timing.clone(),
                        (None, None) => None,
                    };
                    if !allowed {
                        return Err(Fail::from(Cause::OnlyWorkerOfRole { unit: w.unit.clone(), role: w.role.as_str().into(), expected }));
                    }
                    outage = Some(format!(
                        "{} is the only {} worker: serving stops while it restarts, for {} (accepted: allow_outage)",
                        w.unit,
                        w.role.as_str(),
                        crate::cause::outage(&expected)
                    ));
                }
                Ok(json!({
                    "outage": outage,
                    "active_state": st.active_state, "sub_state": st.sub_state, "invocation_id": st.invocation_id,
                    "main_pid": st.main_pid, "fragment_path": cfg.fragment_path, "drop_ins": cfg.drop_in_paths,
                    "drop_ins_not_loaded": on_disk,
                    "daemon_reload": did_reload, "dry_run": dry, "enable_metrics": metrics_flag,
                    "gpus": gpus.as_ref().map(fmt_set), "pairing": pairing,
                    "timeout_stop_ms": cfg.timeout_stop.map(|d| d.as_millis() as u64), "warnings": warnings,
                    "api_key_check": api_key_check,
                }))
            }
            .await;
            match r {
                Ok(d) => s.pass(d),
                Err(f) => {
                    s.fail(&f);
                    return Err((w.unit.clone(), f));
                }
            }
        }
        if let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) {
            let s = StepRun::start(sink, FLEET, Step::Preflight);
            let local = crate::fleet::Limits { max_unavailable: f.max_unavailable.clone() };
            let r = async {
                for e in &f.etcd {
                    self.not_blocked("etcd", e).await?;
                }
                let limits = if dry {
                    match c.get(&crate::fleet::limits_key(&f.name)).await {
                        Ok(Some(e)) => serde_json::from_slice::<crate::fleet::Limits>(&e.value)
                            .map(|l| l.disagreement(&local).map_or(Ok(l), Err))
                            .unwrap_or(Ok(local.clone())),
                        Ok(None) => Ok(local.clone()),
                        Err(e) => Err(Fail::from(Cause::FleetUnreachable { message: e.0 }))?,
                    }
                } else {
                    crate::fleet::ensure_limits(c.as_ref(), &f.name, &local).await.map_err(|e| Fail::from(Cause::FleetUnreachable { message: e.0 }))?
                };
                let limits = limits.map_err(|(role, etcd, local)| Fail::from(Cause::FleetLimits { role, etcd, local }))?;
                let paused = crate::fleet::paused(c.as_ref(), &f.name).await.map_err(|e| Fail::from(Cause::FleetUnreachable { message: e.0 }))?;
                let slots = crate::fleet::slots(c.as_ref(), &f.name).await.map_err(|e| Fail::from(Cause::FleetUnreachable { message: e.0 }))?;
                Ok::<Value, Fail>(json!({ "fleet": f.name, "host": f.host, "limits": limits, "paused": paused, "slots": slots }))
            }
            .await;
            match r {
                Ok(d) => s.pass(d),
                Err(f) => {
                    s.fail(&f);
                    return Err((FLEET.into(), f));
                }
            }
        }
        if self.settings.verify.router {
            let s = StepRun::start(sink, ROUTER, Step::Preflight);
            if let Some(r) = &self.settings.router {
                for u in std::iter::once(&r.url).chain(r.metrics_url.as_ref()) {
                    if let Err(f) = self.not_blocked("the router", u).await {
                        s.fail(&f);
                        return Err((ROUTER.into(), f));
                    }
                }
            }
            // Every replica answers, or nothing is touched.
            let mut lists = Vec::new();
            for r in 0..self.probes.replicas() {
                match self.probes.router_workers(r).await {
                    Ok(list) => lists.push(list),
                    Err(e) => {
                        let f = Fail::from(Cause::RouterUnreachable { error: e.to_string() });
                        s.fail(&f);
                        return Err((ROUTER.into(), f));
                    }
                }
            }
            match lists.len() {
                1 => s.pass(json!({ "workers": lists.pop() })),
                _ => s.pass(json!({ "replicas": lists })),
            }
        }
        Ok(())
    }

    async fn step<T>(&self, sink: &Sink, unit: &str, step: Step, fut: impl std::future::Future<Output = Result<(Value, T), Fail>>) -> Result<T, (Step, Fail)> {
        let s = StepRun::start(sink, unit, step);
        match fut.await {
            Ok((detail, v)) => {
                s.pass(detail);
                Ok(v)
            }
            Err(f) => {
                s.fail(&f);
                Err((step, f))
            }
        }
    }

    /// Restart one worker through every gate. Returns the decodes restarted to repair a stale
    /// pairing found by its pair gate (only when `may_repair`: a repair repairs nothing itself).
    async fn restart_one(&self, w: &Worker, sink: &Sink, ctx: Ctx<'_>, may_repair: bool) -> Result<Repaired, (Step, Fail)> {
        // Fleet: a slot of the role's semaphore before the drain (a pair restarted together
        // took both slots at once before).
        let slots = if ctx.together_with.is_none() { self.slot_step(&[w], sink, ctx).await? } else { Vec::new() };
        let out_since = Instant::now();
        let (watch, after, stale) = self.restart_to_pair(w, sink, ctx).await?;
        let mut repaired = Vec::new();
        for st in stale {
            if !may_repair {
                break;
            }
            match &st.owner {
                None => self.repair(&st.decode, w, sink, ctx).await?,
                // A decode of another host: its own pdctld restarts it, through the fleet.
                Some((host, unit)) => self.fleet_repair(&st.decode, host, unit, w, sink, ctx).await?,
            }
            repaired.push((st.decode, w.unit.clone()));
        }
        self.restart_after_pair(w, sink, ctx, watch, after, out_since).await?;
        // Verified: the slot goes back.
        self.release_slots(&w.unit, &slots, ctx).await;
        Ok(repaired)
    }

    /// drain, restart, ready, health, pair: returns the unit's watch and state after the restart
    /// and the decodes found with a stale pairing (to be repaired).
    async fn restart_to_pair(&self, w: &Worker, sink: &Sink, ctx: Ctx<'_>) -> Result<(U::W, UnitState, Vec<Stale>), (Step, Fail)> {
        let unit = w.unit.as_str();
        if self.settings.rollout.drain {
            let s = StepRun::start(sink, unit, Step::Drain);
            match self.drain(w, ctx).await {
                Ok(Some(d)) => s.pass(d),
                Ok(None) => s.skip("not registered in the router"),
                Err(f) => {
                    s.fail(&f);
                    return Err((Step::Drain, f));
                }
            }
        }
        let (watch, after, started_in) = self.restart_and_ready(w, sink).await?;
        // How long this start took: the interruption to expect next time, if it is alone in its role.
        if let (Some(dir), Some(t)) = (ctx.revisions, started_in) {
            if let Err(e) = revisions::record_start(dir, unit, t.as_millis() as u64) {
                tracing::warn!(pdctl_unit = %unit, "cannot record how long {unit}'s start took: {e}");
            }
        }
        self.step(sink, unit, Step::Health, async { self.health(w, Some(&after)).await.map(|d| (d, ())) }).await?;
        // Still out of the router: a stale pair is found (and repaired) before the router's
        // smoke request and breaker could fail on it, and before clients reach this worker.
        let stale = self.pair_step(w, sink, ctx, &after).await?;
        Ok((watch, after, stale))
    }

    /// router, metrics, stranded KV (a decode), soak. `out_since`: when the worker left the
    /// router (its drain began): the window out of the router is recorded at its re-admission.
    async fn restart_after_pair(
        &self,
        w: &Worker,
        sink: &Sink,
        ctx: Ctx<'_>,
        mut watch: U::W,
        after: UnitState,
        out_since: Instant,
    ) -> Result<(), (Step, Fail)> {
        let unit = w.unit.as_str();
        if self.settings.verify.router {
            self.step(sink, unit, Step::Router, async {
                // Every worker of the other PD role out of the router by this rollout's own drains
                // (a decode repaired while its prefill waits drained): no request can pass the
                // router now; the pair gate proved the pair directly.
                let peers = self.peers(w);
                let peers_drained =
                    !peers.is_empty() && ctx.ledger.is_some_and(|l| peers.iter().all(|p| l.get(&p.unit).is_some_and(|d| d.rollout_id == ctx.id)));
                let d = self.router_recorded(w, true, peers_drained, ctx.ledger.map(|l| (l, ctx.id))).await?;
                // Admitted again: the drain is undone.
                if let Some(l) = ctx.ledger {
                    l.clear(unit).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))?;
                }
                // Drain, stop, start, gates, re-admission: the outage to expect next time if it
                // is alone in its role.
                if let Some(dir) = ctx.revisions {
                    if let Err(e) = revisions::record_window(dir, unit, out_since.elapsed().as_millis() as u64) {
                        tracing::warn!(pdctl_unit = %unit, "cannot record how long {unit} was out of the router: {e}");
                    }
                }
                Ok((d, ()))
            })
            .await?;
        } else {
            StepRun::start(sink, unit, Step::Router).skip("no router configured or [verify] router = false");
        }
        self.metrics_step(w, sink, true).await?;
        if w.role == Role::Decode {
            self.stranded_step(w, sink).await?;
        }
        self.step(sink, unit, Step::Soak, async { self.soak(unit, &mut watch, &after).await.map(|d| (d, ())) }).await?;
        Ok(())
    }

    /// Only the restart and ready gates of one worker, exactly as a rollout runs them (events go
    /// to `sink`; the ready event's detail has `detect_ms`): for the benchmark, and for anyone who
    /// wants to time them. Returns the unit's state after the restart.
    pub async fn restart_until_ready(&self, w: &Worker, sink: &Sink) -> Result<UnitState, Failure> {
        match self.restart_and_ready(w, sink).await {
            Ok((_, after, _)) => Ok(after),
            Err((step, f)) => Err(self.failure(&w.unit, step, f).await),
        }
    }

    /// The restart and ready gates; returns the unit's watch and its state after the restart (the
    /// run the later gates hold it to).
    async fn restart_and_ready(&self, w: &Worker, sink: &Sink) -> Result<(U::W, UnitState, Option<Duration>), (Step, Fail)> {
        let unit = w.unit.as_str();
        let (mut watch, cursor, after) = self
            .step(sink, unit, Step::Restart, async {
                let before = self.units.state(unit).await?;
                // A unit systemd stopped for starting too often refuses a restart until its
                // failed state is reset. Its Result says so only for a manual start: when the
                // limit stops an auto-restart it keeps the crash's own (`exit-code`, measured on
                // systemd 252), so any failed unit is reset before pdctl restarts it.
                if before.result == "start-limit-hit" || before.active_state == "failed" {
                    self.units.reset_failed(unit).await?;
                }
                let cursor = self.logs.tail_cursor().await.map_err(|e| Fail::from(Cause::JournalUnreadable { message: e.to_string() }))?;
                let watch = self.units.watch(unit).await?;
                // SGLang's stop drains (it waits for its requests in flight, no timeout of its
                // own): the job lasts the stop, bounded by TimeoutStopSec, plus the start.
                let timeout_stop = self.units.config(unit).await?.timeout_stop;
                let limit = crate::stop::job_limit(self.settings.rollout.job_timeout, timeout_stop);
                let out = self.units.restart(unit, limit).await?;
                let took = crate::stop::duration(out.state.active_exit_us, out.state.inactive_enter_us);
                // The old process's last lines reach the journal through its own stream; a
                // SIGTERM line without a watchdog check yet is read again (bounded) so the last
                // check, written just before the exit, is not missed.
                let mut stop = crate::stop::report(&[], took, timeout_stop);
                for _ in 0..5 {
                    let lines = self.logs.last_lines(unit, 300).await.unwrap_or_default();
                    stop = crate::stop::report(&lines, took, timeout_stop);
                    if stop.checks > 0 || stop.killed || !lines.iter().any(|l| l.contains(crate::stop::SIGTERM_MARK)) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                let mut detail = json!({
                    "job_result": out.job_result, "job_ms": out.job_time.as_millis() as u64, "job_limit_ms": limit.as_millis() as u64,
                    "old_invocation_id": before.invocation_id, "invocation_id": out.state.invocation_id,
                    "main_pid": out.state.main_pid, "exec_main_start_us": out.state.exec_main_start_us,
                    "stop": stop,
                });
                if stop.killed {
                    let c = Cause::StopSlow { unit: unit.to_string(), why: stop.why.clone() };
                    tracing::warn!(pdctl_unit = unit, "{}", c.sentence());
                    detail["warning"] = json!(c.sentence());
                    detail["cause_code"] = json!(c.code());
                }
                if out.job_result != "done" {
                    let cause = Cause::JobFailed { unit: unit.to_string(), job_result: out.job_result.clone(), service_result: out.state.result.clone() };
                    return Err(Fail { cause, detail, unit: None });
                }
                Ok((detail, (watch, cursor, out.state)))
            })
            .await?;
        let ready_us = self
            .step(sink, unit, Step::Ready, async {
                self.ready(w, cursor, &mut watch, &after).await.map(|d| {
                    let us = d["journal_realtime_us"].as_u64();
                    (d, us)
                })
            })
            .await?;
        let started_in = ready_us.filter(|_| after.exec_main_start_us > 0).map(|r| Duration::from_micros(r.saturating_sub(after.exec_main_start_us)));
        Ok((watch, after, started_in))
    }

    /// Re-verify a unit without restarting it: health, router (re-registering it if the router
    /// lost it), metrics.
    async fn verify(&self, w: &Worker, sink: &Sink) -> bool {
        if self.step(sink, &w.unit, Step::Health, async { self.health(w, None).await.map(|d| (d, ())) }).await.is_err() {
            return false;
        }
        // Its pairs too: it may have stopped right after its restart, before the pair gate. A
        // stale pair found now is repaired the usual way: the unit goes through its restart.
        let Ok(now) = self.units.state(&w.unit).await else { return false };
        match self.pair_step(w, sink, Ctx::none(Some(true), true), &now).await {
            Ok(stale) if stale.is_empty() => {}
            _ => return false,
        }
        if self.settings.verify.router && self.step(sink, &w.unit, Step::Router, async { self.router(w, true, false).await.map(|d| (d, ())) }).await.is_err() {
            return false;
        }
        if self.metrics_step(w, sink, true).await.is_err() {
            return false;
        }
        w.role != Role::Decode || self.stranded_step(w, sink).await.is_ok()
    }

    /// `check`: health, router, metrics — without changing anything.
    async fn check_one(&self, w: &Worker, sink: &Sink) -> Result<(), (Step, Fail)> {
        self.step(sink, &w.unit, Step::Health, async { self.health(w, None).await.map(|d| (d, ())) }).await?;
        if self.settings.verify.router {
            self.step(sink, &w.unit, Step::Router, async { self.router(w, false, false).await.map(|d| (d, ())) }).await?;
        }
        self.metrics_step(w, sink, false).await
    }

    async fn metrics_step(&self, w: &Worker, sink: &Sink, may_warm: bool) -> Result<(), (Step, Fail)> {
        if self.settings.verify.metrics == MetricsMode::Off {
            StepRun::start(sink, &w.unit, Step::Metrics).skip("[verify] metrics = \"off\"");
            return Ok(());
        }
        let s = StepRun::start(sink, &w.unit, Step::Metrics);
        match self.metrics(w, may_warm).await {
            Ok(d) => {
                s.pass(d);
                Ok(())
            }
            Err(f) if self.settings.verify.metrics == MetricsMode::Warn => {
                s.pass(json!({ "warning": f.cause.sentence(), "cause_code": f.cause.code() }));
                Ok(())
            }
            Err(f) => {
                s.fail(&f);
                Err((Step::Metrics, f))
            }
        }
    }

    /// A configured address this process may not connect to at all (pdctld's unit allows
    /// loopback only unless a drop-in allows more): refused in preflight, naming the fix.
    async fn not_blocked(&self, what: &str, url: &str) -> Result<(), Fail> {
        let host = crate::pairing::bootstrap_host(url);
        if matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1") || host.starts_with("127.") {
            return Ok(());
        }
        match self.probes.reach(url).await {
            crate::ports::Reach::Blocked(_) => Err(Fail::from(Cause::AddressBlocked { what: what.to_string(), url: url.to_string() })),
            _ => Ok(()),
        }
    }

    /// Preflight of a PD worker: the settings its ExecStart asks for are compared with what each
    /// peer of the other role runs (`/server_info`; for a peer restarted together with it, the
    /// peer's ExecStart), so that a change that would break every transfer is refused before
    /// anything is touched.
    async fn pairing_preflight(&self, w: &Worker, plan: &Plan, cfg: &crate::ports::UnitConfig) -> Result<Value, Fail> {
        use crate::pairing::{compare, describe, settings_of_argv, settings_of_info};
        let Some(argv) = cfg.exec_start.first().filter(|_| self.settings.verify.pair && w.role != Role::Regular) else {
            return Ok(Value::Null);
        };
        let ours = settings_of_argv(argv);
        let together = self.settings.rollout.single_pair == crate::config::SinglePair::Together && plan.workers.len() == 2;
        let mut checked = Vec::new();
        for peer in self.peers(w) {
            let theirs = if together && plan.workers.iter().any(|x| x.unit == peer.unit) {
                self.units.config(&peer.unit).await.ok().and_then(|c| c.exec_start.first().map(|a| settings_of_argv(a)))
            } else {
                self.probes.server_info(&peer.url).await.ok().map(|v| settings_of_info(&v))
            };
            let Some(theirs) = theirs else {
                checked.push(json!({"peer": peer.unit, "compared": false, "why": "its settings could not be read"}));
                continue;
            };
            let m = compare(&ours, &theirs);
            if !m.is_empty() {
                return Err(Fail {
                    cause: Cause::IncompatibleChange {
                        unit: w.unit.clone(),
                        peer: peer.unit.clone(),
                        detail: describe(&m, &format!("{} new", w.unit), &format!("{} running", peer.unit)),
                    },
                    detail: json!({"mismatches": m}),
                    unit: None,
                });
            }
            checked.push(json!({"peer": peer.unit, "compared": true, "settings": ours}));
        }
        Ok(json!(checked))
    }

    /// Fleet: take a slot of each worker's role in one transaction (waiting, bounded by
    /// `slot_timeout`, while the fleet's slots are held or it is paused). Written down in the
    /// ledger before the transaction. Without `[fleet]`: nothing.
    async fn slot_step(&self, ws: &[&Worker], sink: &Sink, ctx: Ctx<'_>) -> Result<Vec<crate::fleet::SlotRecord>, (Step, Fail)> {
        use crate::fleet::{self as fl, Acquired, Hold, SlotRecord};
        let (Some(c), Some(f), Some(first)) = (&self.coordinator, &self.settings.fleet, ws.first()) else {
            return Ok(Vec::new());
        };
        let s = StepRun::start(sink, &first.unit, Step::Slot);
        let limits = fl::Limits { max_unavailable: f.max_unavailable.clone() };
        let mut recs: Vec<SlotRecord> = ws
            .iter()
            .map(|w| SlotRecord {
                role: w.role.as_str().to_string(),
                hold: Hold { holder: fl::holder(&f.host, &w.unit), url: w.url.clone(), token: fl::token(), since: fl::now_secs(), rollout: ctx.id.to_string() },
            })
            .collect();
        let write = |recs: &[SlotRecord]| -> Result<(), Box<Fail>> {
            if let Some(l) = ctx.ledger {
                l.record_slot(&first.unit, recs)
                    .map_err(|e| Box::new(Fail::from(Cause::RecordUnwritable { dir: "the slot ledger".into(), error: e.to_string() })))?;
            }
            Ok(())
        };
        if let Err(e) = write(&recs) {
            s.fail(&e);
            return Err((Step::Slot, *e));
        }
        let wants: Vec<(String, Hold)> = recs.iter().map(|r| (r.role.clone(), r.hold.clone())).collect();
        let t0 = Instant::now();
        let mut last = String::new();
        loop {
            let unhealthy = self.unhealthy_by_role().await;
            let fail = match fl::try_acquire(c.as_ref(), &f.name, &limits, &wants, &unhealthy).await {
                Ok(Acquired::Granted(held)) => {
                    // A retry may have found an older hold of ours: that is the one to give back.
                    for (r, (_, h)) in recs.iter_mut().zip(&held) {
                        r.hold = h.clone();
                    }
                    if let Err(e) = write(&recs) {
                        s.fail(&e);
                        return Err((Step::Slot, *e));
                    }
                    s.pass(json!({ "held": recs, "waited_ms": t0.elapsed().as_millis() as u64 }));
                    return Ok(recs);
                }
                Ok(Acquired::Wait(why)) if t0.elapsed() < f.slot_timeout => {
                    if why != last {
                        tracing::info!(pdctl_unit = %first.unit, "{why}");
                        s.emit(Status::Started, json!({ "waiting": why }));
                        last = why;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Ok(Acquired::Wait(why)) => Fail::from(Cause::SlotTimeout { last: why, after: f.slot_timeout }),
                Err(e) => Fail::from(Cause::FleetLost { message: e.0 }),
            };
            if let Some(l) = ctx.ledger {
                let _ = l.clear_slot(&first.unit);
            }
            s.fail(&fail);
            return Err((Step::Slot, fail));
        }
    }

    /// Per role, the URLs the gateway lists but does not admit (down anyway: they count against
    /// the fleet's budget).
    async fn unhealthy_by_role(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        if let Ok(list) = self.probes.router_workers(0).await {
            for x in list.iter().filter(|x| !x.admitted() && !x.draining()) {
                out.entry(x.worker_type.clone()).or_default().push(x.url.clone());
            }
        }
        out
    }

    /// Give back the slots of `unit` (verified now); crossed off the ledger once etcd took them.
    /// A release that fails stays on record: pdctld gives it back when etcd answers again.
    async fn release_slots(&self, unit: &str, recs: &[crate::fleet::SlotRecord], ctx: Ctx<'_>) {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return;
        };
        if recs.is_empty() {
            return;
        }
        let mut all = true;
        for r in recs {
            if let Err(e) = crate::fleet::release(c.as_ref(), &f.name, &r.role, &r.hold.holder, &r.hold.token).await {
                tracing::warn!(pdctl_unit = %unit, "{unit}'s {} slot could not be given back yet ({e}); it stays on record and is given back when etcd answers", r.role);
                all = false;
            }
        }
        if all {
            if let Some(l) = ctx.ledger {
                let _ = l.clear_slot(unit);
            }
        }
    }

    /// A 48-token PD request sent straight to `w` and the first serving peer (`None`: no peer
    /// serves).
    async fn warm_pair(&self, w: &Worker) -> Option<Result<String, crate::ports::HttpFailure>> {
        for peer in self.peers(w) {
            if self.probes.health(&peer.url).await != Health::Up {
                continue;
            }
            let (p, d) = if w.role == Role::Prefill { (w, peer) } else { (peer, w) };
            let host = crate::pairing::bootstrap_host(&p.url);
            let t = PairTarget {
                prefill_url: &p.url,
                bootstrap_host: &host,
                bootstrap_port: p.bootstrap_port.unwrap_or(crate::sglang::BOOTSTRAP_PORT_DEFAULT),
                decode_url: &d.url,
                room: crate::pairing::room(),
                max_new_tokens: 48,
            };
            let probe = self.probes.pair(t, self.settings.verify.pair_timeout).await;
            return Some(match probe.decode {
                crate::pairing::Half::Answered { status: 200, .. } => Ok(format!("sent straight to the pair {} + {}", p.unit, d.unit)),
                other => Err(crate::ports::HttpFailure(format!("the pair {} + {} answered: {}", p.unit, d.unit, other.describe()))),
            });
        }
        None
    }

    /// With `[fleet]`: the workers of the other PD role on other hosts, as the gateway lists them
    /// (a prefill pairs with every decode behind the same gateway), each with its host and unit
    /// when that host's liveness key names it.
    async fn remote_peers(&self, w: &Worker) -> Vec<(Worker, Option<(String, String)>)> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return Vec::new();
        };
        let other = match w.role {
            Role::Prefill => Role::Decode,
            Role::Decode => Role::Prefill,
            Role::Regular => return Vec::new(),
        };
        let Ok(list) = self.probes.router_workers(0).await else {
            return Vec::new();
        };
        let hosts = crate::fleet::hosts(c.as_ref(), &f.name).await.unwrap_or_default();
        list.into_iter()
            .filter(|x| x.worker_type == other.as_str() && !x.draining())
            .filter(|x| !self.settings.workers.iter().any(|o| crate::config::same_url(&o.url, &x.url)))
            .map(|x| {
                let owner =
                    hosts.iter().find_map(|h| h.workers.iter().find(|hw| crate::config::same_url(&hw.url, &x.url)).map(|hw| (h.host.clone(), hw.unit.clone())));
                let unit = owner.as_ref().map(|(h, u)| format!("{h}/{u}")).unwrap_or_else(|| x.url.clone());
                (Worker { unit, role: other, url: x.url, bootstrap_port: x.bootstrap_port, gpus: None, watch_files: Vec::new(), api_key: None }, owner)
            })
            .collect()
    }

    /// Repair another host's decode through the fleet: a fleet request for that unit on that host
    /// (its pdctld restarts it through every gate, taking its slot), waited for, then the pair
    /// probed again.
    async fn fleet_repair(&self, d: &Worker, host: &str, unit: &str, p: &Worker, sink: &Sink, ctx: Ctx<'_>) -> Result<(), (Step, Fail)> {
        use crate::ports::{CasChange, Write};
        let blocked = |why: String| -> (Step, Fail) {
            let f = Fail::from(Cause::RepairBlocked { decode: d.unit.clone(), prefill: p.unit.clone(), why });
            StepRun::start(sink, &p.unit, Step::Pair).fail(&f);
            (Step::Pair, f)
        };
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return Err(blocked("it is on another host and this host has no [fleet] to ask it".into()));
        };
        let id = format!("f{}-repair-{}", crate::fleet::now_secs(), &crate::fleet::token()[..6]);
        let r = crate::fleet::FleetRollout {
            id: id.clone(),
            hosts: vec![host.to_string()],
            allow_outage: ctx.allow_outage == Some(true),
            by: format!("pdctld on {} (rollout {})", f.host, ctx.id),
            reason: Some(format!("repair of {unit}'s stale pairing with {}/{}", f.host, p.unit)),
            canary: None,
            created_at: crate::fleet::now_secs(),
            units: vec![unit.to_string()],
            repair_of: Some(format!("{}/{}", f.host, p.unit)),
            load_changes: false,
        };
        let value = serde_json::to_vec(&r).unwrap_or_default();
        let s = StepRun::start(sink, &p.unit, Step::Pair);
        s.emit(Status::Started, json!({ "repair_through_fleet": id, "host": host, "unit": unit }));
        match c.cas(vec![CasChange { key: crate::fleet::rollout_key(&f.name, &id), expect: 0, write: Write::Put(value) }]).await {
            Ok(true) => {}
            Ok(false) => return Err(blocked(format!("the fleet request {id} exists already"))),
            Err(e) => return Err((Step::Pair, Fail::from(Cause::FleetLost { message: e.0 }))),
        }
        let ro = &self.settings.rollout;
        let limit = f.slot_timeout + ro.ready_timeout + ro.health_timeout + ro.router_timeout + ro.metrics_timeout + ro.min_healthy;
        let key = crate::fleet::host_summary_key(&f.name, &id, host);
        let t0 = Instant::now();
        let summary = loop {
            if let Ok(Some(e)) = c.get(&key).await {
                if let Ok(hs) = serde_json::from_slice::<crate::fleet::HostSummary>(&e.value) {
                    break hs;
                }
            }
            if t0.elapsed() >= limit {
                return Err(blocked(format!("{host} did not report its repair {id} within {}", humantime::format_duration(limit))));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        if summary.result != crate::api::HostResult::Succeeded {
            let why = summary
                .why
                .or_else(|| summary.summary.and_then(|x| x.failed).map(|x| format!("{} failed at {}: {}", x.unit, x.step.as_str(), x.cause)))
                .unwrap_or_default();
            return Err(blocked(format!("{host}'s pdctld did not repair it ({:?}): {why}", summary.result)));
        }
        let (verdict, _, probes) = self.probe_pair(p, d).await;
        if verdict != crate::pairing::Verdict::Paired {
            let f = Fail { cause: Cause::StalePair { decode: d.unit.clone(), prefill: p.unit.clone() }, detail: json!({ "probes": probes }), unit: None };
            s.fail(&f);
            return Err((Step::Pair, f));
        }
        s.pass(json!({ "repaired_through_fleet": id, "host": host, "unit": unit, "local_id": summary.local_id, "probes": probes }));
        Ok(())
    }

    /// The peers a worker pairs with: every configured worker of the other PD role.
    fn peers(&self, w: &Worker) -> Vec<&Worker> {
        let other = match w.role {
            Role::Prefill => Role::Decode,
            Role::Decode => Role::Prefill,
            Role::Regular => return Vec::new(),
        };
        self.settings.workers.iter().filter(|o| o.role == other).collect()
    }

    /// The pair gate of a restarted worker: a PD request pair sent straight to it and each peer
    /// that serves (a prefill with each decode, a decode with each prefill). A failed pair is
    /// diagnosed from its signature; returns the decodes with a stale pairing when they are to
    /// be repaired (`on_stale_pair = "restart-decode"`).
    async fn pair_step(&self, w: &Worker, sink: &Sink, ctx: Ctx<'_>, after: &UnitState) -> Result<Vec<Stale>, (Step, Fail)> {
        // This host's peers, and with [fleet] those of other hosts the gateway lists.
        let mut peers: Vec<(Worker, Option<(String, String)>)> = self.peers(w).into_iter().map(|p| (p.clone(), None)).collect();
        peers.extend(self.remote_peers(w).await);
        if w.role == Role::Regular {
            return Ok(Vec::new());
        }
        if !self.settings.verify.pair {
            StepRun::start(sink, &w.unit, Step::Pair).skip("[verify] pair = false");
            return Ok(Vec::new());
        }
        if peers.is_empty() {
            StepRun::start(sink, &w.unit, Step::Pair).skip("no worker of the other PD role is configured");
            return Ok(Vec::new());
        }
        let s = StepRun::start(sink, &w.unit, Step::Pair);
        let mut pairs = Vec::new();
        let mut stale: Vec<Stale> = Vec::new();
        let mut failed: Option<Fail> = None;
        for (peer, owner) in &peers {
            let (p, d) = if w.role == Role::Prefill { (w, peer) } else { (peer, w) };
            if let Err(why) = self.peer_serves(peer, ctx.together_with == Some(peer.unit.as_str())).await {
                pairs.push(json!({"prefill": p.unit, "decode": d.unit, "result": "skipped", "why": format!("{} is not serving ({why}): its pairing is not checked", peer.unit)}));
                continue;
            }
            let (verdict, refreshed, probes) = self.probe_pair(p, d).await;
            pairs.push(json!({
                "prefill": p.unit, "decode": d.unit, "result": if refreshed { "refreshed" } else { verdict.as_str() },
                "probes": probes, "at": crate::lifecycle::now(),
            }));
            let cause = match verdict {
                crate::pairing::Verdict::Paired => continue,
                crate::pairing::Verdict::Stale => {
                    if self.settings.rollout.on_stale_pair == crate::config::OnStalePair::RestartDecode && w.role == Role::Prefill {
                        stale.push(Stale { decode: d.clone(), owner: owner.clone() });
                        continue;
                    }
                    Cause::StalePair { decode: d.unit.clone(), prefill: p.unit.clone() }
                }
                crate::pairing::Verdict::Incompatible(m) => {
                    Cause::PairIncompatible { prefill: p.unit.clone(), decode: d.unit.clone(), detail: crate::pairing::describe(&m, &p.unit, &d.unit) }
                }
                crate::pairing::Verdict::PrefillBroken(e) => {
                    Cause::PairBroken { prefill: p.unit.clone(), decode: d.unit.clone(), side: "prefill".into(), error: e }
                }
                crate::pairing::Verdict::DecodeBroken(e) => {
                    Cause::PairBroken { prefill: p.unit.clone(), decode: d.unit.clone(), side: "decode".into(), error: e }
                }
                crate::pairing::Verdict::TransferFailed(e) => {
                    Cause::PairBroken { prefill: p.unit.clone(), decode: d.unit.clone(), side: "transfer".into(), error: e }
                }
            };
            failed.get_or_insert(Fail { cause, detail: Value::Null, unit: None });
        }
        // A pair that failed because the restarted worker itself went down is that crash.
        if failed.is_some() {
            let st = self.units.state(&w.unit).await.map_err(|e| (Step::Pair, Fail::from(e)))?;
            if let Some(why) = crashed_since(&st, after) {
                failed = Some(Fail::from(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Pair, why }));
            }
        }
        let detail = json!({
            "pairs": pairs,
            "stale": stale.iter().map(|d| d.decode.unit.clone()).collect::<Vec<_>>(),
            "repair": (!stale.is_empty()).then_some("restart-decode"),
        });
        match failed {
            Some(mut f) => {
                f.detail = detail;
                s.fail(&f);
                Err((Step::Pair, f))
            }
            None => {
                s.pass(detail);
                Ok(stale)
            }
        }
    }

    /// Whether a peer serves (`/health` 200). One restarting at the same time is waited for, up
    /// to its ready and health timeouts.
    async fn peer_serves(&self, peer: &Worker, restarting: bool) -> Result<(), String> {
        let t0 = Instant::now();
        let limit = if restarting { self.settings.rollout.ready_timeout + self.settings.rollout.health_timeout } else { Duration::ZERO };
        loop {
            let why = match within(t0, limit.max(Duration::from_secs(30)), self.probes.health(&peer.url)).await {
                Some(Health::Up) => return Ok(()),
                Some(Health::Unavailable(s)) | Some(Health::Down(s)) => s,
                None => "no answer".into(),
            };
            if t0.elapsed() >= limit {
                return Err(why);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Probe one pair; a failure that a fixed decode recovers from by itself (SGLang with PR
    /// 36029 drops the stale entry on the failed request) is probed once more. Returns the
    /// verdict, whether the second probe found it refreshed, and the probes.
    async fn probe_pair(&self, p: &Worker, d: &Worker) -> (crate::pairing::Verdict, bool, Vec<crate::pairing::PairProbe>) {
        use crate::pairing::Verdict;
        let host = crate::pairing::bootstrap_host(&p.url);
        let target = |room| PairTarget {
            prefill_url: &p.url,
            bootstrap_host: &host,
            bootstrap_port: p.bootstrap_port.unwrap_or(crate::sglang::BOOTSTRAP_PORT_DEFAULT),
            decode_url: &d.url,
            room,
            max_new_tokens: 1,
        };
        let limit = self.settings.verify.pair_timeout;
        let first = self.probes.pair(target(crate::pairing::room()), limit).await;
        let v = self.judge_pair(p, d, &first).await;
        if !matches!(v, Verdict::Stale | Verdict::TransferFailed(_)) {
            return (v, false, vec![first]);
        }
        // A decode that got no answer within pair_timeout may still be waiting on a stale cached
        // prefill that it drops by itself at its waiting timeout (SGLang 0.5.23): the second
        // probe is given that long before the pair is called stale.
        let timing = match self.units.config(&d.unit).await {
            Ok(c) => crate::sglang::DecodeTiming::of(&c.environment),
            Err(_) => crate::sglang::DecodeTiming::of(&[]),
        };
        let limit = crate::pairing::second_probe_limit(&first, limit, &timing);
        let second = self.probes.pair(target(crate::pairing::room()), limit).await;
        let v2 = self.judge_pair(p, d, &second).await;
        let refreshed = v2 == Verdict::Paired;
        (if refreshed { Verdict::Paired } else { v2 }, refreshed, vec![first, second])
    }

    async fn judge_pair(&self, p: &Worker, d: &Worker, probe: &crate::pairing::PairProbe) -> crate::pairing::Verdict {
        use crate::pairing::{compare, diagnose, settings_of_info};
        if matches!(probe.decode, crate::pairing::Half::Answered { status: 200, .. }) {
            return diagnose(probe, &[], None);
        }
        let mismatches = match (self.probes.server_info(&p.url).await, self.probes.server_info(&d.url).await) {
            (Ok(a), Ok(b)) => compare(&settings_of_info(&a), &settings_of_info(&b)),
            _ => Vec::new(),
        };
        let older = match (self.units.state(&d.unit).await, self.units.state(&p.unit).await) {
            (Ok(ds), Ok(ps)) if ds.exec_main_start_us > 0 && ps.exec_main_start_us > 0 => Some(ds.exec_main_start_us < ps.exec_main_start_us),
            _ => None,
        };
        diagnose(probe, &mismatches, older)
    }

    /// Restart decode `d` through every gate to repair its stale pairing with prefill `p`, under
    /// the same rules as any restart; its events carry `repair_of`. Refused (the rollout halts)
    /// when its own files have pending changes or it is the only decode without
    /// `--allow-outage`.
    async fn repair(&self, d: &Worker, p: &Worker, sink: &Sink, ctx: Ctx<'_>) -> Result<(), (Step, Fail)> {
        let blocked = |why: String| -> (Step, Fail) {
            let f = Fail::from(Cause::RepairBlocked { decode: d.unit.clone(), prefill: p.unit.clone(), why });
            StepRun::start(sink, &p.unit, Step::Pair).fail(&f);
            (Step::Pair, f)
        };
        if let Some(dir) = ctx.revisions {
            if let Ok(all) = self.staleness(dir).await {
                if let Some(st) = all.iter().find(|s| s.unit == d.unit && !s.reasons.is_empty()) {
                    return Err(blocked(format!(
                        "its own config has changes that were never verified ({}): restarting it as a repair would roll them out unchecked; roll it out with `pdctl rollout apply` (or revert them), then the pairing is renewed",
                        st.reasons.join("; ")
                    )));
                }
            }
        }
        let alone = self.settings.workers.iter().filter(|o| o.role == Role::Decode).count() == 1;
        if alone && ctx.allow_outage != Some(true) {
            return Err(blocked(
                "it is the only decode worker: restarting it stops serving; pass --allow-outage (or set [rollout] allow_outage = true) to accept that".into(),
            ));
        }
        tracing::warn!(pdctl_unit = %d.unit, "{}: restarting it to repair its stale pairing with {}", d.unit, p.unit);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let forward = async {
            while let Some(mut e) = rx.recv().await {
                e.repair_of = Some(p.unit.clone());
                let _ = sink.send(e);
            }
        };
        let work = async move {
            let ctx = Ctx { together_with: None, abort_in_flight: true, ..ctx };
            // A decode's own pair gate finds no stale decodes: nothing is repaired from a repair.
            let r = async {
                let slots = self.slot_step(&[d], &tx, ctx).await?;
                let out_since = Instant::now();
                let (watch, after, _) = self.restart_to_pair(d, &tx, ctx).await?;
                self.restart_after_pair(d, &tx, ctx, watch, after, out_since).await?;
                self.release_slots(&d.unit, &slots, ctx).await;
                Ok(())
            }
            .await;
            drop(tx);
            r
        };
        let (r, ()) = tokio::join!(work, forward);
        r.map_err(|(step, mut f)| {
            f.unit.get_or_insert_with(|| d.unit.clone());
            (step, f)
        })
    }

    /// After a decode restart: the prefills' queues of requests held for a decode drain to zero
    /// within `stranded_kv_timeout` (rooms of requests the old decode process never fetched are
    /// held until the prefill's bootstrap timeout). The prefill's queues — from its live
    /// `/v1/loads?include=disagg` where served (0.5.23), else its queue gauges — not the KV level,
    /// which moves with live load; they are per prefill, not per decode, so under steady traffic to other
    /// decodes the gate waits for a moment they are all empty. A warning unless
    /// `stranded_kv = "required"`.
    async fn stranded_step(&self, w: &Worker, sink: &Sink) -> Result<(), (Step, Fail)> {
        let prefills = self.peers(w);
        if prefills.is_empty() {
            return Ok(());
        }
        let s = StepRun::start(sink, &w.unit, Step::StrandedKv);
        let read = |p: &Worker| {
            let url = p.url.clone();
            async move { self.probes.pd_queues(&url).await }
        };
        let mut start = serde_json::Map::new();
        let mut watched = Vec::new();
        let mut unreadable = Vec::new();
        for p in &prefills {
            match read(p).await {
                Ok(q) if q.held_reqs > 0.0 => {
                    start.insert(p.unit.clone(), json!({"held_reqs": q.held_reqs, "used_tokens": q.used_tokens, "source": q.source}));
                    watched.push(*p);
                }
                Ok(_) => {}
                Err(e) => unreadable.push(format!("{}: {e}", p.unit)),
            }
        }
        if watched.is_empty() {
            s.pass(json!({"held": {}, "unreadable": unreadable}));
            return Ok(());
        }
        // Read from the gauges (a server without `/v1/loads`), a released room can show until the
        // next idle publish: the default limit covers that lag too.
        let from_gauges = start.values().any(|v| v["source"] != "/v1/loads");
        let limit = match self.settings.verify.stranded_kv_timeout {
            Some(l) => l,
            None => {
                let mut longest = Duration::ZERO;
                for p in &watched {
                    let env = self.units.config(&p.unit).await.map(|c| c.environment).unwrap_or_default();
                    longest = longest.max(crate::sglang::bootstrap_timeout(&env));
                }
                let lag = if from_gauges { crate::sglang::GAUGE_IDLE_PUBLISH } else { Duration::ZERO };
                longest + Duration::from_secs(10) + lag
            }
        };
        let t0 = Instant::now();
        let mut still: Vec<(String, f64, f64)>;
        loop {
            still = Vec::new();
            for p in &watched {
                if let Ok(q) = read(p).await {
                    if q.held_reqs > 0.0 {
                        still.push((p.unit.clone(), q.held_reqs, q.used_tokens));
                    }
                }
            }
            if still.is_empty() || t0.elapsed() >= limit {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut detail = json!({"held_at_start": start, "limit_ms": limit.as_millis() as u64, "waited_ms": t0.elapsed().as_millis() as u64});
        if still.is_empty() {
            detail["released"] = json!(true);
            s.pass(detail);
            return Ok(());
        }
        let held = still.iter().map(|(u, r, t)| format!("{u} holds {r} request(s) ({t} tokens in use)")).collect::<Vec<_>>().join(", ");
        let cause = Cause::StrandedKv { decode: w.unit.clone(), held, after: limit };
        if self.settings.verify.stranded_kv == crate::config::StrandedKv::Required {
            let f = Fail { cause, detail, unit: None };
            s.fail(&f);
            return Err((Step::StrandedKv, f));
        }
        detail["released"] = json!(false);
        detail["warning"] = json!(cause.sentence());
        detail["cause_code"] = json!(cause.code());
        s.pass(detail);
        Ok(())
    }

    async fn drain(&self, w: &Worker, ctx: Ctx<'_>) -> Result<Option<Value>, Fail> {
        let drain_failed = |error: String| Fail::from(Cause::DrainFailed { unit: w.unit.clone(), error });
        // Listed on which replicas (a gateway of several replicas: each is drained).
        let mut entries = Vec::new();
        for r in 0..self.probes.replicas() {
            let list = self.probes.router_workers(r).await.map_err(|e| drain_failed(format!("the router does not answer: {e}")))?;
            if let Some(entry) = list.into_iter().find(|x| crate::config::same_url(&x.url, &w.url) && !x.draining()) {
                entries.push((r, entry));
            }
        }
        let Some((_, entry)) = entries.first().cloned() else {
            return Ok(None);
        };
        // Written down before the router is touched: whatever happens next (a failed gate, a
        // crash, SIGKILL), the drain is found and undone.
        if let Some(l) = ctx.ledger {
            let st = self.units.state(&w.unit).await?;
            let d = Drain {
                unit: w.unit.clone(),
                url: w.url.clone(),
                role: w.role,
                bootstrap_port: w.bootstrap_port,
                invocation_id: st.invocation_id,
                router_id: entry.id.clone(),
                rollout_id: ctx.id.to_string(),
                drained_at: crate::lifecycle::now(),
            };
            l.record(&d).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))?;
        }
        for (r, e) in &entries {
            self.probes.deregister(*r, &e.id).await.map_err(|er| drain_failed(format!("the router refused to remove {}: {er}", w.url)))?;
        }
        let t0 = Instant::now();
        // Wait until the gateway no longer lists it (smg 1.x lists it as draining for ~5 s and
        // still finishes its requests meanwhile); bounded by drain_timeout. Not for the only
        // worker of its role: nothing else serves meanwhile, so that wait would only lengthen the
        // outage (measured behind smg 1.13: 10 s per unit instead of ~7 s); the router gate waits
        // out the draining entry before it re-registers the worker.
        let alone = self.settings.workers.iter().filter(|o| o.role == w.role).count() == 1;
        let mut listed_for_ms = None;
        'wait: while !alone && t0.elapsed() < self.settings.rollout.drain_timeout {
            for (r, _) in &entries {
                if let Ok(l) = self.probes.router_workers(*r).await {
                    if l.iter().any(|x| crate::config::same_url(&x.url, &w.url)) {
                        tokio::time::sleep(POLL).await;
                        continue 'wait;
                    }
                }
            }
            listed_for_ms = Some(t0.elapsed().as_millis() as u64);
            break;
        }
        // Wait (bounded) for the requests it runs: read from the server's load endpoint. One that
        // cannot be read is a cause, never taken for "nothing in flight".
        let mut left = None;
        let mut at_start = None;
        let mut unknown: Option<Cause> = None;
        let wait_t0 = Instant::now();
        while t0.elapsed() < self.settings.rollout.drain_timeout {
            match self.probes.in_flight(&w.url).await {
                Ok(n) => {
                    at_start.get_or_insert(n);
                    left = Some(n);
                    if n == 0 {
                        break;
                    }
                }
                Err(e) => {
                    let c = Cause::LoadUnknown { url: w.url.clone(), error: e.to_string() };
                    if self.settings.rollout.unknown_load == crate::config::UnknownLoad::Halt {
                        return Err(c.into());
                    }
                    tracing::warn!(pdctl_unit = %w.unit, "{}", c.sentence());
                    unknown = Some(c);
                    break;
                }
            }
            tokio::time::sleep(POLL).await;
        }
        // What is left would hold the stop (SGLang waits for it, up to TimeoutStopSec and
        // SIGKILL): aborted when it can never finish or by the setting. On a stale decode, requests
        // paired with a healthy prefill end within the drain's wait; those still running then are
        // the ones waiting for KV from the old prefill process (until the decode's waiting
        // timeout), so aborting what is left aborts those.
        let mut aborted = None;
        if left.is_some_and(|n| n > 0) && (ctx.abort_in_flight || self.settings.rollout.abort_after_drain_timeout) {
            self.probes.abort_all(&w.url).await.map_err(|e| drain_failed(format!("POST /abort_request failed: {e}")))?;
            aborted = left;
            tracing::warn!(pdctl_unit = %w.unit, "aborted {} request(s) still in flight on {} before its restart", left.unwrap_or(0), w.url);
        }
        Ok(Some(json!({
            "warning": unknown.as_ref().map(Cause::sentence),
            "cause_code": unknown.as_ref().map(Cause::code),
            "aborted": aborted,
            "aborted_why": aborted.map(|_| if ctx.abort_in_flight { "its pairing is stale: its requests can never finish" } else { "abort_after_drain_timeout = true" }),
            "removed_router_id": entry.id, "router_load": entry.load, "in_flight_left": left, "replicas_drained": entries.len(),
            "in_flight_at_start": at_start, "waited_for_requests_ms": wait_t0.elapsed().as_millis() as u64,
            "router_status": entry.status, "unlisted_after_ms": listed_for_ms,
            "waited_ms": t0.elapsed().as_millis() as u64,
            "timed_out": left.is_some_and(|n| n > 0),
        })))
    }

    async fn ready(&self, w: &Worker, cursor: Option<String>, watch: &mut U::W, after: &UnitState) -> Result<Value, Fail> {
        let ro = &self.settings.rollout;
        let judge = Judge {
            ready_pattern: ro.ready_pattern.clone(),
            fatal_patterns: ro.fatal_patterns.clone(),
            run: Run {
                invocation_id: after.invocation_id.clone(),
                main_pid: if after.main_pid != 0 { after.main_pid } else { after.exec_main_pid },
                procfs: self.settings.procfs.clone(),
            },
        };
        let mut follow = self.logs.follow(cursor, &w.unit);
        let t0 = Instant::now();
        let deadline = tokio::time::sleep(ro.ready_timeout);
        tokio::pin!(deadline);
        let mut foreign = 0u32;
        // A traceback of this run so far: the explanation if the run exits, nothing if it gets ready.
        let mut suspect: Option<String> = None;
        let mut crashed: Option<String> = crashed_since(after, after);
        while crashed.is_none() {
            tokio::select! {
                e = follow.next() => match e {
                    None => return Err(Cause::EventSourceClosed { what: "the journal follower".into() }.into()),
                    Some(Err(e)) => return Err(Cause::JournalUnreadable { message: e.to_string() }.into()),
                    Some(Ok(entry)) => match judge.judge(&entry) {
                        Verdict::Ready => {
                            return Ok(json!({
                                "line": entry.message(), "pid": entry.pid(),
                                "invocation_id": entry.get("_SYSTEMD_INVOCATION_ID"),
                                "detect_ms": entry.latency().as_secs_f64() * 1000.0,
                                "journal_realtime_us": entry.realtime_us,
                                "ignored_ready_lines_of_other_runs": foreign,
                                "warning": suspect.as_ref().map(|l| format!("this run logged a traceback before its ready line and went on to be ready (not a failed start): {l}")),
                                "since_restart_ms": t0.elapsed().as_millis() as u64,
                            }))
                        }
                        Verdict::Fatal(line) => return Err(Cause::FatalLine { unit: w.unit.clone(), line }.into()),
                        Verdict::ManagerFailure(m) => crashed = Some(format!("systemd reports: {m}")),
                        Verdict::ForeignReady => foreign += 1,
                        Verdict::Suspect(l) => suspect = suspect.or(Some(l)),
                        Verdict::Ignore => {}
                    },
                },
                c = watch.changed() => {
                    if c.is_none() {
                        return Err(Cause::EventSourceClosed { what: "the D-Bus connection to systemd".into() }.into());
                    }
                    let st = self.units.state(&w.unit).await?;
                    crashed = crashed_since(&st, after);
                }
                _ = &mut deadline => {
                    return Err(Cause::ReadyTimeout { unit: w.unit.clone(), pattern: ro.ready_pattern.clone(), after: ro.ready_timeout, foreign }.into())
                }
            }
        }
        // The unit died: look briefly for the fatal line that explains it. Found, the cause is
        // that line (`fatal_line`), whichever of the two arrived first: an argparse rejection
        // is always `fatal_line`, never `crashed` by a race between journald and systemd.
        let why = crashed.unwrap_or_default();
        let fatal = tokio::time::timeout(Duration::from_secs(1), async {
            while let Some(Ok(e)) = follow.next().await {
                match judge.judge(&e) {
                    Verdict::Fatal(l) => return Some(l),
                    Verdict::Suspect(l) if suspect.is_none() => suspect = Some(l),
                    _ => {}
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        // The run exited: a traceback it logged is what explains it.
        .or(suspect);
        match fatal {
            Some(line) => Err(Cause::FatalLine { unit: w.unit.clone(), line }.into()),
            None => Err(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Starting, why }.into()),
        }
    }

    async fn health(&self, w: &Worker, after: Option<&UnitState>) -> Result<Value, Fail> {
        let t0 = Instant::now();
        let limit = self.settings.rollout.health_timeout;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last = match within(t0, limit, self.probes.health(&w.url)).await {
                // Where the server serves `/ready` (0.5.23), it must say ready too: `/health` can
                // answer 200 again after a failed PD warm-up, and a paused server is not serving.
                Some(Health::Up) => match within(t0, limit, self.probes.ready(&w.url)).await {
                    Some(None) => return Ok(json!({ "attempts": attempts, "checked": ["/health"] })),
                    Some(Some(Health::Up)) => return Ok(json!({ "attempts": attempts, "checked": ["/health", "/ready"] })),
                    Some(Some(Health::Unavailable(s) | Health::Down(s))) => format!("/health 200, but {s}"),
                    None => "/health 200, /ready did not answer".into(),
                },
                Some(Health::Unavailable(s)) => format!("{s} (warming up or unhealthy)"),
                Some(Health::Down(s)) => s,
                None => "no answer".into(),
            };
            if let Some(after) = after {
                let st = self.units.state(&w.unit).await?;
                if let Some(why) = crashed_since(&st, after) {
                    return Err(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Health, why }.into());
                }
            }
            if t0.elapsed() >= limit {
                return Err(Cause::HealthTimeout { url: w.url.clone(), after: limit, last }.into());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The router gate on every replica (each must admit the worker); one replica's detail as
    /// is, several under `replicas`.
    async fn router(&self, w: &Worker, may_register: bool, peers_drained: bool) -> Result<Value, Fail> {
        self.router_recorded(w, may_register, peers_drained, None).await
    }

    /// [`Engine::router`], writing to `ledger` (with the rollout's id) before it removes an entry
    /// the gateway lists `failed`, so that a crash before the re-add is reconciled like a drain.
    async fn router_recorded(&self, w: &Worker, may_register: bool, peers_drained: bool, ledger: Option<(&Ledger, &str)>) -> Result<Value, Fail> {
        let t0 = Instant::now();
        let n = self.probes.replicas();
        let mut details = Vec::new();
        for r in 0..n {
            details.push(self.router_on(r, w, may_register, peers_drained, t0, ledger).await?);
        }
        Ok(match details.len() {
            1 => details.pop().unwrap_or_default(),
            _ => json!({ "replicas": details, "waited_ms": t0.elapsed().as_millis() as u64 }),
        })
    }

    async fn router_on(
        &self,
        replica: usize,
        w: &Worker,
        may_register: bool,
        peers_drained: bool,
        t0: Instant,
        ledger: Option<(&Ledger, &str)>,
    ) -> Result<Value, Fail> {
        let limit = self.settings.rollout.router_timeout;
        let role = w.role.as_str();
        let mut registered: Option<String> = None;
        let mut seen;
        // The smoke request failed while no worker of the other PD role was admitted.
        let mut peer_down = false;
        // The gateway listed the worker `failed` (or stuck `not_ready`) and pdctl removed and
        // re-added it (once): that status.
        let mut re_added: Option<String> = None;
        let other_role = match w.role {
            Role::Prefill => "decode",
            Role::Decode => "prefill",
            Role::Regular => "",
        };
        loop {
            match within(t0, limit, self.probes.router_workers(replica)).await {
                None => seen = RouterSeen::Down(format!("router /workers did not answer within {limit:?}")),
                Some(Err(e)) => seen = RouterSeen::Down(e.to_string()),
                Some(Ok(list)) => match list.iter().filter(|x| crate::config::same_url(&x.url, &w.url)).min_by_key(|x| x.draining()) {
                    None if may_register && registered.is_none() => {
                        let bp = if w.role == Role::Prefill { w.bootstrap_port } else { None };
                        match self.probes.register(replica, &w.url, role, bp).await {
                            Ok(id) => registered = Some(id),
                            Err(e) => return Err(Cause::RegisterRefused { url: w.url.clone(), error: e.to_string() }.into()),
                        }
                        seen = RouterSeen::RegistrationPending;
                    }
                    None => seen = if registered.is_some() { RouterSeen::RegistrationPending } else { RouterSeen::NotListed },
                    Some(x) if x.draining() => seen = RouterSeen::Unhealthy("listed as draining: the gateway is still removing an old entry".into()),
                    Some(x) if x.worker_type != role => {
                        return Err(Cause::WrongWorkerType { url: w.url.clone(), listed: x.worker_type.clone(), role: role.to_string() }.into())
                    }
                    Some(x) if !x.admitted() => {
                        let status = x.status.as_deref().unwrap_or("-").to_string();
                        // smg 1.x gives up on a worker it lists `failed`; `not_ready` flips back once
                        // its health checks pass, so only one stuck past STUCK_NOT_READY (after the
                        // health gate saw the worker serve) is re-added too. Once.
                        let stuck = status == "failed" || (status == "not_ready" && t0.elapsed() >= STUCK_NOT_READY);
                        if may_register && re_added.is_none() && stuck {
                            tracing::warn!(pdctl_unit = %w.unit, "the gateway lists {} as {status}: removing and re-adding it", w.url);
                            // Written down before the gateway is touched, as a drain is.
                            if let Some((l, id)) = ledger.filter(|(l, _)| l.get(&w.unit).is_none()) {
                                let st = self.units.state(&w.unit).await?;
                                let d = Drain {
                                    unit: w.unit.clone(),
                                    url: w.url.clone(),
                                    role: w.role,
                                    bootstrap_port: w.bootstrap_port,
                                    invocation_id: st.invocation_id,
                                    router_id: x.id.clone(),
                                    rollout_id: id.to_string(),
                                    drained_at: crate::lifecycle::now(),
                                };
                                l.record(&d).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))?;
                            }
                            self.probes.deregister(replica, &x.id).await.map_err(|e| {
                                Fail::from(Cause::RegisterRefused { url: w.url.clone(), error: format!("removing the {status} entry failed: {e}") })
                            })?;
                            re_added = Some(status.clone());
                            registered = None;
                        }
                        seen = RouterSeen::Unhealthy(format!("is_healthy: {}, status: {status}", x.is_healthy))
                    }
                    Some(x) => {
                        let cb = self.probes.cb_state(replica, &w.url).await;
                        match cb {
                            Ok(Some(1.0)) => seen = RouterSeen::BreakerOpen,
                            _ => {
                                let other_admitted = list.iter().any(|o| o.admitted() && o.worker_type != role && o.worker_type != "regular");
                                let smoke = if !self.settings.verify.smoke_request || (peers_drained && !other_admitted) {
                                    None
                                } else {
                                    Some(self.probes.smoke(replica, 1).await)
                                };
                                match smoke {
                                    Some(Err(e)) => {
                                        peer_down = w.role != Role::Regular && !other_admitted;
                                        // No worker of the other role is even listed: none can be
                                        // admitted while this gate waits, so it ends now (the worker
                                        // itself is admitted) instead of at router_timeout.
                                        let other_listed = list.iter().any(|o| o.worker_type == other_role && !o.draining());
                                        if peer_down && !other_listed {
                                            let cause = Cause::PeerRoleDown { url: w.url.clone(), role: other_role.into(), error: e.to_string() };
                                            let detail = json!({
                                                "router_id": x.id, "re_registered": registered.is_some(), "re_added_after": re_added,
                                                "ended_early": format!("the gateway lists no {other_role} worker: none can be admitted while this gate waits"),
                                                "waited_ms": t0.elapsed().as_millis() as u64,
                                            });
                                            return Err(Fail { cause, detail, unit: None });
                                        }
                                        seen = RouterSeen::SmokeFailed(e.to_string())
                                    }
                                    _ => {
                                        return Ok(json!({
                                            "router_id": x.id, "worker_type": x.worker_type, "re_registered": registered.is_some(), "re_added_after": re_added,
                                            "cb_state": cb.ok().flatten(),
                                            "smoke_request": smoke.map(|_| "200").or((peers_drained && !other_admitted).then_some("not sent: every worker of the other role is drained by this rollout (the pair gate proved the pair)")),
                                            "waited_ms": t0.elapsed().as_millis() as u64,
                                        }))
                                    }
                                }
                            }
                        }
                    }
                },
            }
            if t0.elapsed() >= limit || (!may_register && t0.elapsed() >= Duration::from_secs(5)) {
                let (url, after) = (w.url.clone(), t0.elapsed());
                return Err(match seen {
                    RouterSeen::BreakerOpen => Cause::CircuitOpen { url, after },
                    RouterSeen::SmokeFailed(error) if peer_down => {
                        Cause::PeerRoleDown { url, role: if w.role == Role::Prefill { "decode" } else { "prefill" }.into(), error }
                    }
                    RouterSeen::SmokeFailed(error) => Cause::SmokeFailed { url, after, error },
                    other => Cause::RouterNeverAdmits { url, after, last: other.to_string() },
                }
                .into());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn metrics(&self, w: &Worker, may_warm: bool) -> Result<Value, Fail> {
        let t0 = Instant::now();
        let limit = self.settings.rollout.metrics_timeout;
        let mut warmed = None;
        loop {
            let problem = match within(t0, limit, self.probes.kv(&w.url)).await {
                Some(Ok(r)) => {
                    let mut d = serde_json::to_value(&r).unwrap_or(Value::Null);
                    if let Some(o) = d.as_object_mut() {
                        o.insert("warm_up_request".into(), json!(warmed));
                        o.insert("waited_ms".into(), json!(t0.elapsed().as_millis() as u64));
                    }
                    return Ok(d);
                }
                Some(Err(p)) => p,
                None => crate::ports::MetricsError {
                    diagnosis: MetricsDiagnosis::Unreachable,
                    message: format!("{}/metrics did not answer within {limit:?}", w.url),
                },
            };
            if !problem.may_resolve() {
                return Err(Cause::MetricsMissing { unit: w.unit.clone(), diagnosis: problem.diagnosis, detail: problem.message, waited: None }.into());
            }
            if may_warm && warmed.is_none() && self.settings.verify.warmup_request && problem.diagnosis == MetricsDiagnosis::NotPublished {
                // Gauges appear on the first batch; a PD decode server also needs 40 decode steps.
                // A PD worker is warmed with a pair sent straight to it and a serving peer (it may
                // be the only one of its role in the router, or its peers may be out of it).
                let direct = if w.role == Role::Regular { None } else { self.warm_pair(w).await };
                let sent = match (direct, self.settings.verify.router, w.role) {
                    (Some(r), _, _) => r,
                    (None, true, _) => self.probes.smoke(0, 48).await.map(|_| "sent through the router".to_string()),
                    (None, false, Role::Regular) => self.probes.warm_worker(&w.url).await.map(|_| "sent to the worker".to_string()),
                    (None, false, _) => Ok("not sent: no peer of the other PD role serves".to_string()),
                };
                warmed = Some(sent.unwrap_or_else(|e| format!("failed: {e}")));
                continue; // the request has finished: the gauges may be there now
            }
            if t0.elapsed() >= limit {
                return Err(Cause::MetricsMissing { unit: w.unit.clone(), diagnosis: problem.diagnosis, detail: problem.message, waited: Some(limit) }.into());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn soak(&self, unit: &str, watch: &mut U::W, after: &UnitState) -> Result<Value, Fail> {
        let limit = self.settings.rollout.min_healthy;
        let crashed = |why: String| Fail::from(Cause::Crashed { unit: unit.to_string(), phase: Phase::Soak, why });
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                c = watch.changed() => {
                    if c.is_none() {
                        return Err(Cause::EventSourceClosed { what: "the D-Bus connection to systemd".into() }.into());
                    }
                    let st = self.units.state(unit).await?;
                    if let Some(why) = crashed_since(&st, after) {
                        return Err(crashed(why));
                    }
                }
                _ = &mut deadline => break,
            }
        }
        // Changes between signals are caught by comparing once more.
        let st = self.units.state(unit).await?;
        if let Some(why) = crashed_since(&st, after) {
            return Err(crashed(why));
        }
        if st.active_state != "active" {
            return Err(crashed(format!("it is {}/{} after the soak, not active", st.active_state, st.sub_state)));
        }
        Ok(json!({ "held_ms": limit.as_millis() as u64, "invocation_id": st.invocation_id, "n_restarts": st.n_restarts }))
    }

    /// Record the files `w` was just verified with as its good revision — only those its running
    /// process can have started with ([`revisions::baseline`]); returns the note.
    async fn record_revision(&self, w: &Worker, dir: &Path) -> String {
        let (cfg, st) = match (self.units.config(&w.unit).await, self.units.state(&w.unit).await) {
            (Ok(c), Ok(s)) => (c, s),
            (Err(e), _) | (_, Err(e)) => return format!("could not record the revision of {}: {e}", w.unit),
        };
        let mut rev = revisions::baseline(&w.unit, &revisions::paths(&w.unit, &cfg, &w.watch_files), st.exec_main_start_us);
        rev.why = "started".into();
        match revisions::save(dir, &rev) {
            Ok(()) => format!("recorded the revision {} runs with: {}", w.unit, rev.files.keys().cloned().collect::<Vec<_>>().join(", ")),
            Err(er) => format!("could not record the revision of {}: {er}", w.unit),
        }
    }

    /// A unit failed its gates with files that differ from its last good revision: that change
    /// failed, so `rollout apply` does not roll the same files out again until they change.
    async fn quarantine_if_changed(&self, unit: &str, cause: &str, dir: &Path, id: &str) -> Option<String> {
        let w = self.settings.workers.iter().find(|w| w.unit == unit)?;
        let cfg = self.units.config(unit).await.ok()?;
        let current = revisions::snapshot(unit, &revisions::paths(unit, &cfg, &w.watch_files), "current");
        let last = revisions::load(dir, unit)?;
        if revisions::stale_reasons(&current, Some(&last), 0, false).is_empty() {
            return None;
        }
        let q = revisions::Quarantine {
            unit: unit.into(),
            fingerprint: revisions::fingerprint(&current),
            rollout_id: id.into(),
            cause: cause.into(),
            at: crate::lifecycle::now(),
        };
        Some(match revisions::quarantine(dir, &q) {
            Ok(()) => format!("quarantined the change of {unit} that failed (its files' fingerprint {}): `pdctl rollout apply` will not roll it out again until the files change", &q.fingerprint[..12]),
            Err(e) => format!("could not quarantine the failed change of {unit}: {e}"),
        })
    }

    /// Restore `unit`'s last good revision, reload, and — when it was restarted (`restart`) — run
    /// it through the same gates. A preflight failure restarted nothing: the running process still
    /// has its old files, so the change is only taken back (files restored, manager reloaded).
    /// `Ok(false)`: there was nothing to take back.
    async fn rollback(&self, unit: &str, ctx: Ctx<'_>, dir: &Path, restart: bool, sink: &Sink, notes: &mut Vec<String>) -> Result<bool, String> {
        let w = self.settings.workers.iter().find(|w| w.unit == unit).ok_or("not a configured worker")?;
        let last = revisions::load(dir, unit).ok_or_else(|| format!("no good revision of {unit} was ever recorded"))?;
        let cfg = self.units.config(unit).await.map_err(|er| er.to_string())?;
        let current = revisions::snapshot(unit, &revisions::paths(unit, &cfg, &w.watch_files), "current");
        let step = StepRun::start(sink, unit, Step::Rollback);
        let done = match revisions::restore(&last, &current, ctx.id) {
            Ok(d) => d,
            Err(er) => {
                let why = format!("cannot restore the files: {er}");
                step.emit(Status::Failed, json!({ "cause": why }));
                return Err(why);
            }
        };
        if !restart && done.is_empty() {
            step.skip("nothing to restore: the unit's files are its last good revision");
            return Ok(false);
        }
        tracing::warn!(pdctl_unit = %unit, "{unit}: rolling back to its last good revision: {}", done.join("; "));
        if let Err(er) = self.units.reload().await {
            step.emit(Status::Failed, json!({ "cause": er.to_string(), "restored": done }));
            return Err(er.to_string());
        }
        step.pass(json!({ "revision_recorded_at": last.recorded_at, "restored": done, "restart": restart }));
        notes.extend(done);
        if !restart {
            notes.push(format!("{unit} was not restarted (preflight refused the change): its files are back to what it runs, and the manager reloaded them"));
            return Ok(true);
        }
        let plan = Plan { workers: vec![w.clone()] };
        // The restored files are what it ran last: loading them is the point.
        let s = self.run(&plan, sink, Mode::Rollout, &AtomicBool::new(false), Ctx { load_changes: true, ..ctx }, notes).await;
        match s.result {
            Outcome::Succeeded => {
                notes.push(format!("{unit} runs its last good revision (recorded {}) and passed every gate", last.recorded_at));
                Ok(true)
            }
            _ => Err(format!("the old revision did not pass either: {}", s.failed.map(|f| f.cause).unwrap_or_default())),
        }
    }

    /// The availability probe: every `1/rate` s, one 1-token request through the router — unless a
    /// role has no worker the gateway admits (then nothing is sent, and the tick counts as an error
    /// from the gateway's view) — until the rollout is over.
    async fn watch_clients(&self, rate: f64, c: &Clients) {
        use crate::availability::Sample;
        let mut roles: Vec<Role> = self.settings.workers.iter().map(|w| w.role).collect();
        roles.sort();
        roles.dedup();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // One last sample after the rollout ended: a worker still out at the end (a halt)
            // keeps the error window open until then.
            let last = c.done.load(Ordering::SeqCst);
            let at = Instant::now();
            let unit = lock(&c.current).clone();
            let admitted = match tokio::time::timeout(Duration::from_secs(5), self.probes.router_workers(0)).await {
                Ok(Ok(list)) => roles.iter().all(|r| list.iter().any(|x| x.worker_type == r.as_str() && x.admitted())),
                _ => false,
            };
            let sample = if admitted {
                let t = Instant::now();
                let ok = matches!(tokio::time::timeout(Duration::from_secs(5), self.probes.smoke(0, 1)).await, Ok(Ok(())));
                if !ok {
                    c.failed.fetch_add(1, Ordering::SeqCst);
                }
                Sample { at, sent: true, ok, latency: ok.then(|| t.elapsed()), unit }
            } else {
                Sample { at, sent: false, ok: false, latency: None, unit }
            };
            lock(&c.samples).push(sample);
            if last {
                break;
            }
        }
    }

    /// Undo a drain pdctl made (step `reconcile`): the worker is re-admitted to the router only
    /// when it serves. Still on the run that was drained and healthy: re-registered at once (that
    /// process passed the gates). On a new run: only after `/health` and the router gate pass,
    /// waiting up to `budget` for it to come up while systemd is still starting it (a 0.3.2 router
    /// loses for good a worker registered while it is still starting). Anything else stays in
    /// the ledger and is reported. Returns a note for the record.
    pub async fn reconcile(&self, d: &Drain, ledger: &Ledger, budget: Duration, sink: &Sink) -> Result<String, Cause> {
        let s = StepRun::start(sink, &d.unit, Step::Reconcile);
        let t0 = Instant::now();
        let w = self.settings.workers.iter().find(|w| w.unit == d.unit).cloned().unwrap_or_else(|| Worker {
            unit: d.unit.clone(),
            role: d.role,
            url: d.url.clone(),
            bootstrap_port: d.bootstrap_port,
            gpus: None,
            watch_files: Vec::new(),
            api_key: None,
        });
        let r = async {
            let st = self.units.state(&d.unit).await?;
            let same_run = !d.invocation_id.is_empty() && st.invocation_id == d.invocation_id;
            let mut last;
            let mut stopped_since: Option<Instant> = None;
            loop {
                last = match within(t0, budget.max(Duration::from_secs(30)), self.probes.health(&w.url)).await {
                    Some(Health::Up) => break,
                    Some(Health::Unavailable(x)) | Some(Health::Down(x)) => x,
                    None => "no answer".into(),
                };
                let st = self.units.state(&d.unit).await?;
                // A restart passes through deactivating and, briefly, inactive: only a failed unit,
                // or one that stays inactive, is not coming up.
                stopped_since = match st.active_state.as_str() {
                    "inactive" => stopped_since.or(Some(Instant::now())),
                    _ => None,
                };
                // A crash loop (`auto-restart`) is not coming up either: waiting for it would hold
                // the rollout lock for the whole budget.
                let gone = st.active_state == "failed" || st.sub_state == "auto-restart" || stopped_since.is_some_and(|t| t.elapsed() > Duration::from_secs(10));
                if gone || t0.elapsed() >= budget {
                    return Err(Fail::from(Cause::DrainNotRestored {
                        unit: d.unit.clone(),
                        why: format!("{}/{}, /health: {last}", st.active_state, st.sub_state),
                    }));
                }
                tokio::time::sleep(POLL).await;
            }
            let admitted = self.router(&w, true, false).await?;
            ledger.clear(&d.unit).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))?;
            Ok(json!({ "same_run": same_run, "drained_by": d.rollout_id, "drained_at": d.drained_at, "router": admitted, "waited_ms": t0.elapsed().as_millis() as u64 }))
        }
        .await;
        match r {
            Ok(detail) => {
                s.pass(detail);
                let slot = self.reconcile_slots(ledger, Some(&d.unit)).await.join("; ");
                Ok(format!(
                    "{} was drained by {} and is back in the router{}",
                    d.unit,
                    d.rollout_id,
                    if slot.is_empty() { String::new() } else { format!("; {slot}") }
                ))
            }
            Err(f) => {
                s.fail(&f);
                Err(f.cause)
            }
        }
    }

    /// Fleet slots this host still has on record (only `unit`'s when given): each whose worker
    /// has no open drain and serves (`/health` 200) is given back; one etcd no longer lists is
    /// crossed off. A worker still down keeps its slot (it really is down). Returns one sentence
    /// per slot given back.
    pub async fn reconcile_slots(&self, ledger: &Ledger, unit: Option<&str>) -> Vec<String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, recs) in ledger.slots() {
            if unit.is_some_and(|u| u.replace('/', "_") != name) || ledger.get(&name).is_some() {
                continue;
            }
            let mut serving = true;
            for r in &recs {
                serving &= self.probes.health(&r.hold.url).await == Health::Up;
            }
            if !serving {
                continue;
            }
            let mut done = true;
            for r in &recs {
                match crate::fleet::release(c.as_ref(), &f.name, &r.role, &r.hold.holder, &r.hold.token).await {
                    Ok(true) => out.push(format!("gave back {}'s {} slot (held since {})", r.hold.holder, r.role, crate::fleet::clock(r.hold.since))),
                    Ok(false) => {}
                    Err(_) => done = false,
                }
            }
            if done {
                let _ = ledger.clear_slot(&name);
            }
        }
        out
    }

    /// `st` if the unit's run is settled: active and running, up for `min_healthy` (waiting
    /// out the rest, at most `min_healthy`) on the same run without an auto-restart; else `None`.
    async fn settled(&self, unit: &str, st: UnitState) -> Option<UnitState> {
        if st.active_state != "active" || st.sub_state != "running" {
            return None;
        }
        let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let up = Duration::from_micros(now_us.saturating_sub(st.exec_main_start_us));
        let need = self.settings.rollout.min_healthy;
        if up < need {
            tokio::time::sleep(need - up).await;
            let again = self.units.state(unit).await.ok()?;
            if again.invocation_id != st.invocation_id || again.n_restarts != st.n_restarts || again.main_pid != st.main_pid || again.active_state != "active" {
                return None;
            }
            return Some(again);
        }
        Some(st)
    }

    /// Each configured worker, in config order: why it is stale (no reasons: it runs its current
    /// files) and whether its current files are a change that already failed. A worker without a
    /// recorded revision gets one first: what its running process started with
    /// ([`revisions::baseline`]), so that a rollback works from the first day.
    pub async fn staleness(&self, dir: &Path) -> Result<Vec<Staleness>, Cause> {
        let mut out = Vec::new();
        for w in &self.settings.workers {
            let cfg = self.units.config(&w.unit).await.map_err(UnitsError::cause)?;
            let st = self.units.state(&w.unit).await.map_err(UnitsError::cause)?;
            let files = revisions::paths(&w.unit, &cfg, &w.watch_files);
            let current = revisions::snapshot(&w.unit, &files, "current");
            let last = match revisions::load(dir, &w.unit) {
                Some(r) => Some(r),
                None => match self.settled(&w.unit, st.clone()).await {
                    // Only a run that stayed up for `min_healthy` is taken for a good one: a
                    // crash-looping run of a bad change (active for a moment between crashes)
                    // would otherwise become the "good" revision a rollback restores.
                    Some(st) => {
                        let base = revisions::baseline(&w.unit, &files, st.exec_main_start_us);
                        match revisions::save_if_absent(dir, &base) {
                            Ok(false) => revisions::load(dir, &w.unit),
                            _ => Some(base),
                        }
                    }
                    None => None,
                },
            };
            let reasons = revisions::stale_reasons(&current, last.as_ref(), st.exec_main_start_us, cfg.need_daemon_reload);
            let quarantined = if reasons.is_empty() { None } else { revisions::quarantined(dir, &current) };
            out.push(Staleness { unit: w.unit.clone(), reasons, quarantined });
        }
        Ok(out)
    }
}
