//! The rollout state machine. For each worker, in plan order:
//!
//! 1. **preflight** (all workers, before the first restart): the unit exists; reload the manager if
//!    `NeedDaemonReload`; `--enable-metrics` is in ExecStart when the metrics gate is required; GPU
//!    sets do not overlap; the router answers.
//! 2. **drain**: take the worker out of the router, wait (bounded) for its in-flight requests.
//! 3. **restart**: journal cursor, watch the unit, `RestartUnit(name, "replace")`, our job's result.
//! 4. **ready**: the ready line of *this* run (InvocationID, else main PID); fail fast on a fatal
//!    line, the manager's exit/failure messages, or a crash/auto-restart of the unit.
//! 5. **health**: `/health` answers 200.
//! 6. **router**: registered (re-registered if the router dropped it) with the right type, healthy,
//!    circuit breaker not open, one small request through the router answers 200.
//! 7. **metrics**: KV gauges exposed and sane (one warm-up request if they are not published yet).
//! 8. **soak**: the same run (InvocationID, NRestarts) stays up for `min_healthy`.
//!
//! The first failure halts the rollout with its cause and the unit's last log lines; nothing after
//! it is touched. One unit is down at a time.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pdctl_journal::{Judge, Run, Verdict};
use pdctl_probe::{Health, MetricsProblem};
use pdctl_systemd::UnitState;
use serde_json::{json, Value};

use crate::config::{MetricsMode, Role, Settings, Worker};
use crate::events::{Event, Failure, FailureKind, Outcome, Sink, Status, Step, Summary};
use crate::plan::Plan;
use crate::ports::{Follow, Logs, Probes, SystemdError, Units, Watch};

/// Lines of the unit's log attached to a failure.
pub const LAST_LINES: usize = 20;
/// Pause between polls of HTTP state that offers no events (loopback calls; cheap).
const POLL: Duration = Duration::from_millis(100);

/// A step's failure before it becomes a [`Failure`].
#[derive(Debug)]
struct Fail {
    cause: String,
    kind: FailureKind,
    detail: Value,
}

fn gate(cause: impl Into<String>) -> Fail {
    Fail { cause: cause.into(), kind: FailureKind::Gate, detail: Value::Null }
}

fn from_sd(e: SystemdError) -> Fail {
    let kind = match &e {
        SystemdError::NoSuchUnit { .. } => FailureKind::Config,
        e if e.is_access() => FailureKind::Access,
        _ => FailureKind::Gate,
    };
    Fail { cause: e.to_string(), kind, detail: Value::Null }
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
        let ev = Event { unit: self.unit.clone(), step: self.step, status, elapsed_ms: self.t0.elapsed().as_millis() as u64, detail };
        tracing::info!(unit = %ev.unit, step = self.step.as_str(), status = ?status, elapsed_ms = ev.elapsed_ms, "step");
        let _ = self.sink.send(ev);
    }
    fn pass(self, detail: Value) {
        self.emit(Status::Passed, detail);
    }
    fn skip(self, why: &str) {
        self.emit(Status::Skipped, json!({ "reason": why }));
    }
    fn fail(self, f: &Fail) {
        let mut d = json!({ "cause": f.cause });
        if let (Some(o), Value::Object(extra)) = (d.as_object_mut(), &f.detail) {
            o.extend(extra.clone());
        }
        self.emit(Status::Failed, d);
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
}

/// What `check` does not do: restart, soak, and anything that changes the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rollout,
    Check,
}

impl<U: Units, L: Logs, P: Probes> Engine<U, L, P> {
    /// Restart the plan's workers one at a time through every gate.
    pub async fn rolling_restart(&self, plan: &Plan, sink: &Sink) -> Summary {
        self.run(plan, sink, Mode::Rollout, &AtomicBool::new(false)).await
    }

    /// [`Engine::rolling_restart`] that stops when `abort` is set — between units only, so that
    /// every unit is left verified (never in the middle of a restart).
    pub async fn rolling_restart_abortable(&self, plan: &Plan, sink: &Sink, abort: &AtomicBool) -> Summary {
        self.run(plan, sink, Mode::Rollout, abort).await
    }

    /// Every gate except restart and soak, on every worker, changing nothing.
    pub async fn check(&self, plan: &Plan, sink: &Sink) -> Summary {
        self.run(plan, sink, Mode::Check, &AtomicBool::new(false)).await
    }

    async fn run(&self, plan: &Plan, sink: &Sink, mode: Mode, abort: &AtomicBool) -> Summary {
        let t0 = Instant::now();
        let mut done = Vec::new();
        let summary = |failed: Option<Failure>, done: Vec<String>| Summary {
            result: if failed.is_some() { Outcome::Failed } else { Outcome::Succeeded },
            elapsed_ms: t0.elapsed().as_millis() as u64,
            units: done,
            failed,
        };
        if let Err((unit, f)) = self.preflight(plan, sink, false).await {
            return summary(Some(self.failure(&unit, Step::Preflight, f).await), done);
        }
        for w in &plan.workers {
            if abort.load(Ordering::SeqCst) {
                return Summary { result: Outcome::Aborted, elapsed_ms: t0.elapsed().as_millis() as u64, units: done, failed: None };
            }
            let r = match mode {
                Mode::Rollout => self.restart_one(w, sink).await,
                Mode::Check => self.check_one(w, sink).await,
            };
            if let Err((step, f)) = r {
                return summary(Some(self.failure(&w.unit, step, f).await), done);
            }
            done.push(w.unit.clone());
        }
        summary(None, done)
    }

    async fn failure(&self, unit: &str, step: Step, f: Fail) -> Failure {
        let last_lines = if unit == "router" { Vec::new() } else { self.logs.last_lines(unit, LAST_LINES).await.unwrap_or_default() };
        Failure { unit: unit.to_string(), step, cause: f.cause, kind: f.kind, last_lines }
    }

    /// `--dry-run`: the plan's preflight verdict, touching nothing (no daemon-reload either).
    pub async fn dry_run(&self, plan: &Plan, sink: &Sink) -> Summary {
        let t0 = Instant::now();
        let failed = match self.preflight(plan, sink, true).await {
            Ok(()) => None,
            Err((unit, f)) => Some(self.failure(&unit, Step::Preflight, f).await),
        };
        Summary {
            result: if failed.is_some() { Outcome::Failed } else { Outcome::Succeeded },
            elapsed_ms: t0.elapsed().as_millis() as u64,
            units: Vec::new(),
            failed,
        }
    }

    /// Preflight for every worker of the plan, before anything is touched.
    async fn preflight(&self, plan: &Plan, sink: &Sink, dry: bool) -> Result<(), (String, Fail)> {
        let mut reloaded = false;
        let mut sets: Vec<(String, BTreeSet<u32>)> = Vec::new();
        for w in &plan.workers {
            let s = StepRun::start(sink, &w.unit, Step::Preflight);
            let r = async {
                let st = self.units.state(&w.unit).await.map_err(from_sd)?;
                let mut cfg = self.units.config(&w.unit).await.map_err(from_sd)?;
                let mut did_reload = false;
                if cfg.need_daemon_reload && dry {
                    did_reload = true; // reported as "would reload"
                } else if cfg.need_daemon_reload && !reloaded {
                    self.units.reload().await.map_err(from_sd)?;
                    reloaded = true;
                    did_reload = true;
                    cfg = self.units.config(&w.unit).await.map_err(from_sd)?;
                }
                let args: Vec<&String> = cfg.exec_start.iter().flatten().collect();
                let metrics_flag = args.iter().any(|a| *a == "--enable-metrics" || a.starts_with("--enable-metrics="));
                if self.settings.verify.metrics == MetricsMode::Required && !metrics_flag {
                    return Err(gate(format!(
                        "the metrics gate is required but --enable-metrics is not in the ExecStart of {}: add it to the unit (then daemon-reload), or set [verify] metrics = \"warn\" or \"off\"",
                        w.unit
                    )));
                }
                let gpus = gpus_of(w, &cfg.environment);
                if let Some(g) = &gpus {
                    if let Some((other, og)) = sets.iter().find(|(_, og)| !og.is_disjoint(g)) {
                        return Err(gate(format!(
                            "GPUs {} of {} overlap with GPUs {} of {other}: two servers cannot share GPUs; fix gpus or CUDA_VISIBLE_DEVICES",
                            fmt_set(g), w.unit, fmt_set(og)
                        )));
                    }
                    sets.push((w.unit.clone(), g.clone()));
                }
                Ok(json!({
                    "active_state": st.active_state, "sub_state": st.sub_state, "invocation_id": st.invocation_id,
                    "main_pid": st.main_pid, "fragment_path": cfg.fragment_path, "drop_ins": cfg.drop_in_paths,
                    "daemon_reload": did_reload, "dry_run": dry, "enable_metrics": metrics_flag,
                    "gpus": gpus.as_ref().map(fmt_set),
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
        if self.settings.verify.router {
            let s = StepRun::start(sink, "router", Step::Preflight);
            match self.probes.router_workers().await {
                Ok(list) => s.pass(json!({ "workers": list })),
                Err(e) => {
                    let f = Fail {
                        cause: format!("the router does not answer: {e}; start it or fix [router] url (or set [verify] router = false)"),
                        kind: FailureKind::Access,
                        detail: Value::Null,
                    };
                    s.fail(&f);
                    return Err(("router".into(), f));
                }
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

    /// Restart one worker through every gate.
    async fn restart_one(&self, w: &Worker, sink: &Sink) -> Result<(), (Step, Fail)> {
        let unit = w.unit.as_str();
        if self.settings.rollout.drain {
            let s = StepRun::start(sink, unit, Step::Drain);
            match self.drain(w).await {
                Ok(Some(d)) => s.pass(d),
                Ok(None) => s.skip("not registered in the router"),
                Err(f) => {
                    s.fail(&f);
                    return Err((Step::Drain, f));
                }
            }
        }
        let (mut watch, cursor, after) = self
            .step(sink, unit, Step::Restart, async {
                let before = self.units.state(unit).await.map_err(from_sd)?;
                if before.result == "start-limit-hit" {
                    self.units.reset_failed(unit).await.map_err(from_sd)?;
                }
                let cursor = self.logs.tail_cursor().await.map_err(|e| Fail { cause: e.to_string(), kind: FailureKind::Access, detail: Value::Null })?;
                let watch = self.units.watch(unit).await.map_err(from_sd)?;
                let out = self.units.restart(unit, self.settings.rollout.job_timeout).await.map_err(from_sd)?;
                let detail = json!({
                    "job_result": out.job_result, "job_ms": out.job_time.as_millis() as u64,
                    "old_invocation_id": before.invocation_id, "invocation_id": out.state.invocation_id,
                    "main_pid": out.state.main_pid, "exec_main_start_us": out.state.exec_main_start_us,
                });
                if out.job_result != "done" {
                    return Err(Fail {
                        cause: format!("the restart job of {unit} ended with result \"{}\" (systemd: {})", out.job_result, out.state.result),
                        kind: FailureKind::Gate,
                        detail,
                    });
                }
                Ok((detail, (watch, cursor, out.state)))
            })
            .await?;
        self.step(sink, unit, Step::Ready, async { self.ready(w, cursor, &mut watch, &after).await.map(|d| (d, ())) }).await?;
        self.step(sink, unit, Step::Health, async { self.health(w, Some(&after)).await.map(|d| (d, ())) }).await?;
        if self.settings.verify.router {
            self.step(sink, unit, Step::Router, async { self.router(w, true).await.map(|d| (d, ())) }).await?;
        } else {
            StepRun::start(sink, unit, Step::Router).skip("no router configured or [verify] router = false");
        }
        self.metrics_step(w, sink, true).await?;
        self.step(sink, unit, Step::Soak, async { self.soak(unit, &mut watch, &after).await.map(|d| (d, ())) }).await?;
        Ok(())
    }

    /// Re-verify a unit without restarting it: health, router (re-registering it if the router
    /// lost it), metrics. Used to resume an interrupted rollout.
    pub async fn verify(&self, w: &Worker, sink: &Sink) -> bool {
        if self.step(sink, &w.unit, Step::Health, async { self.health(w, None).await.map(|d| (d, ())) }).await.is_err() {
            return false;
        }
        if self.settings.verify.router && self.step(sink, &w.unit, Step::Router, async { self.router(w, true).await.map(|d| (d, ())) }).await.is_err() {
            return false;
        }
        self.metrics_step(w, sink, true).await.is_ok()
    }

    /// `check`: health, router, metrics — without changing anything.
    async fn check_one(&self, w: &Worker, sink: &Sink) -> Result<(), (Step, Fail)> {
        self.step(sink, &w.unit, Step::Health, async { self.health(w, None).await.map(|d| (d, ())) }).await?;
        if self.settings.verify.router {
            self.step(sink, &w.unit, Step::Router, async { self.router(w, false).await.map(|d| (d, ())) }).await?;
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
                s.pass(json!({ "warning": f.cause }));
                Ok(())
            }
            Err(f) => {
                s.fail(&f);
                Err((Step::Metrics, f))
            }
        }
    }

    async fn drain(&self, w: &Worker) -> Result<Option<Value>, Fail> {
        let list = self.probes.router_workers().await.map_err(|e| gate(format!("cannot drain {}: the router does not answer: {e}", w.unit)))?;
        let Some(entry) = list.iter().find(|x| x.url == w.url) else {
            return Ok(None);
        };
        self.probes.deregister(&entry.id).await.map_err(|e| gate(format!("the router refused to remove {}: {e}", w.url)))?;
        let t0 = Instant::now();
        let mut left = None;
        while t0.elapsed() < self.settings.rollout.drain_timeout {
            match self.probes.in_flight(&w.url).await {
                Ok(0) => {
                    left = Some(0);
                    break;
                }
                Ok(n) => left = Some(n),
                Err(_) => break, // no load endpoint: nothing to wait on
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(Some(json!({
            "removed_router_id": entry.id, "router_load": entry.load, "in_flight_left": left,
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
        let mut crashed: Option<String> = after.crashed_since(after);
        while crashed.is_none() {
            tokio::select! {
                e = follow.next() => match e {
                    None => return Err(gate("the journal follower stopped")),
                    Some(Err(e)) => return Err(Fail { cause: e.to_string(), kind: FailureKind::Access, detail: Value::Null }),
                    Some(Ok(entry)) => match judge.judge(&entry) {
                        Verdict::Ready => {
                            return Ok(json!({
                                "line": entry.message(), "pid": entry.pid(),
                                "invocation_id": entry.get("_SYSTEMD_INVOCATION_ID"),
                                "detect_ms": entry.latency().as_secs_f64() * 1000.0,
                                "journal_realtime_us": entry.realtime_us,
                                "ignored_ready_lines_of_other_runs": foreign,
                                "since_restart_ms": t0.elapsed().as_millis() as u64,
                            }))
                        }
                        Verdict::Fatal(line) => return Err(gate(format!("{} logged a fatal line: {line}", w.unit))),
                        Verdict::ManagerFailure(m) => crashed = Some(format!("systemd reports: {m}")),
                        Verdict::ForeignReady => foreign += 1,
                        Verdict::Ignore => {}
                    },
                },
                c = watch.changed() => {
                    if c.is_none() {
                        return Err(gate("the D-Bus connection to systemd closed"));
                    }
                    let st = self.units.state(&w.unit).await.map_err(from_sd)?;
                    crashed = st.crashed_since(after);
                }
                _ = &mut deadline => {
                    return Err(gate(format!(
                        "{} logged no ready line (\"{}\") of this run within {:?}{}",
                        w.unit, ro.ready_pattern, ro.ready_timeout,
                        if foreign > 0 { format!(" ({foreign} ready line(s) of another run were ignored)") } else { String::new() }
                    )))
                }
            }
        }
        // The unit died: look briefly for the fatal line that explains it.
        let mut cause = crashed.unwrap_or_default();
        let _ = tokio::time::timeout(Duration::from_millis(300), async {
            while let Some(Ok(e)) = follow.next().await {
                if let Verdict::Fatal(l) = judge.judge(&e) {
                    cause = format!("{cause}; fatal line: {l}");
                    break;
                }
            }
        })
        .await;
        Err(gate(format!("{} did not become ready: {cause}", w.unit)))
    }

    async fn health(&self, w: &Worker, after: Option<&UnitState>) -> Result<Value, Fail> {
        let t0 = Instant::now();
        let limit = self.settings.rollout.health_timeout;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last = match within(t0, limit, self.probes.health(&w.url)).await {
                Some(Health::Up) => return Ok(json!({ "attempts": attempts })),
                Some(Health::Unavailable(s)) => format!("{s} (warming up or unhealthy)"),
                Some(Health::Down(s)) => s,
                None => "no answer".into(),
            };
            if let Some(after) = after {
                let st = self.units.state(&w.unit).await.map_err(from_sd)?;
                if let Some(why) = st.crashed_since(after) {
                    return Err(gate(format!("{} went down while waiting for /health: {why}", w.unit)));
                }
            }
            if t0.elapsed() >= limit {
                return Err(gate(format!("{}/health did not answer 200 within {limit:?} (last: {last})", w.url)));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn router(&self, w: &Worker, may_register: bool) -> Result<Value, Fail> {
        let t0 = Instant::now();
        let limit = self.settings.rollout.router_timeout;
        let role = w.role.as_str();
        let mut registered: Option<String> = None;
        let mut last;
        loop {
            match within(t0, limit, self.probes.router_workers()).await.unwrap_or_else(|| Err(pdctl_probe::HttpError::Timeout { url: "router /workers".into(), after: limit })) {
                Err(e) => last = format!("the router does not answer: {e}"),
                Ok(list) => match list.iter().find(|x| x.url == w.url) {
                    None if may_register && registered.is_none() => {
                        let bp = if w.role == Role::Prefill { w.bootstrap_port } else { None };
                        match self.probes.register(&w.url, role, bp).await {
                            Ok(id) => registered = Some(id),
                            Err(e) => return Err(gate(format!("the router does not list {} and refused to register it: {e}", w.url))),
                        }
                        last = "registered; waiting for the router to admit it".into();
                    }
                    None => last = if registered.is_some() { "registration still pending".into() } else { format!("the router does not list {}", w.url) },
                    Some(x) if x.worker_type != role => {
                        return Err(gate(format!(
                            "the router lists {} as \"{}\", not \"{role}\" (registered without worker_type?): remove it from the router and re-add it with worker_type \"{role}\"",
                            w.url, x.worker_type
                        )))
                    }
                    Some(x) if !x.is_healthy => last = "listed but not healthy yet".into(),
                    Some(x) => {
                        let cb = self.probes.cb_state(&w.url).await;
                        match cb {
                            Ok(Some(1.0)) => last = "healthy, but its circuit breaker is open (smg_worker_cb_state=1): requests are still refused".into(),
                            _ => {
                                let smoke = if self.settings.verify.smoke_request { Some(self.probes.smoke(1).await) } else { None };
                                match smoke {
                                    Some(Err(e)) => last = format!("healthy, but a request through the router failed: {e}"),
                                    _ => {
                                        return Ok(json!({
                                            "router_id": x.id, "worker_type": x.worker_type, "re_registered": registered.is_some(),
                                            "cb_state": cb.ok().flatten(), "smoke_request": smoke.map(|_| "200"),
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
                return Err(gate(format!("the router did not admit {} within {:?}: {last}", w.url, t0.elapsed())));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn metrics(&self, w: &Worker, may_warm: bool) -> Result<Value, Fail> {
        let t0 = Instant::now();
        let limit = self.settings.rollout.metrics_timeout;
        let mut warmed = None;
        loop {
            let problem = match within(t0, limit, self.probes.kv(&w.url))
                .await
                .unwrap_or_else(|| Err(MetricsProblem::Http(pdctl_probe::HttpError::Timeout { url: format!("{}/metrics", w.url), after: limit })))
            {
                Ok(r) => {
                    let mut d = serde_json::to_value(&r).unwrap_or(Value::Null);
                    if let Some(o) = d.as_object_mut() {
                        o.insert("warm_up_request".into(), json!(warmed));
                        o.insert("waited_ms".into(), json!(t0.elapsed().as_millis() as u64));
                    }
                    return Ok(d);
                }
                Err(p) => p,
            };
            if !problem.may_resolve() && !matches!(problem, MetricsProblem::Http(_)) {
                return Err(gate(format!("{}: {problem}", w.unit)));
            }
            if may_warm && warmed.is_none() && self.settings.verify.warmup_request && matches!(problem, MetricsProblem::Kv(_)) {
                // Gauges appear on the first batch; a PD decode server also needs 40 decode steps.
                let sent = match (self.settings.verify.router, w.role) {
                    (true, _) => self.probes.smoke(48).await.map(|_| "sent through the router".to_string()),
                    (false, Role::Regular) => self.probes.warm_worker(&w.url).await.map(|_| "sent to the worker".to_string()),
                    (false, _) => Ok("not sent: a PD worker needs the router".to_string()),
                };
                warmed = Some(sent.unwrap_or_else(|e| format!("failed: {e}")));
                continue; // the request has finished: the gauges may be there now
            }
            if t0.elapsed() >= limit {
                return Err(gate(format!("{}: KV gauges not usable within {limit:?}: {problem}", w.unit)));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn soak(&self, unit: &str, watch: &mut U::W, after: &UnitState) -> Result<Value, Fail> {
        let limit = self.settings.rollout.min_healthy;
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                c = watch.changed() => {
                    if c.is_none() {
                        return Err(gate("the D-Bus connection to systemd closed during the soak"));
                    }
                    let st = self.units.state(unit).await.map_err(from_sd)?;
                    if let Some(why) = st.crashed_since(after) {
                        return Err(gate(format!("{unit} did not stay up: {why}")));
                    }
                }
                _ = &mut deadline => break,
            }
        }
        // Changes between signals are caught by comparing once more.
        let st = self.units.state(unit).await.map_err(from_sd)?;
        if let Some(why) = st.crashed_since(after) {
            return Err(gate(format!("{unit} did not stay up: {why}")));
        }
        if st.active_state != "active" {
            return Err(gate(format!("{unit} is {}/{} after the soak, not active", st.active_state, st.sub_state)));
        }
        Ok(json!({ "held_ms": limit.as_millis() as u64, "invocation_id": st.invocation_id, "n_restarts": st.n_restarts }))
    }
}
