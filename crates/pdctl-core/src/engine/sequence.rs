//! One worker's restart in runbook order: slot → drain → restart → ready → health → pair (and a
//! stale pair's repair) → router → metrics → stranded KV → soak; and the same gates without the
//! restart for `check` and a resumed rollout.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::gates::Deferred;
use crate::engine::step_run::{lock, Fail, StepRun};
use crate::engine::steps::{rule, HELD_FOR_SWITCH, NOT_REGISTERED};
use crate::engine::{Ctx, Engine, Outage, Repaired, Stale};
use crate::events::{Failure, Sink, Step};
use crate::ports::{Logs, Probes, UnitState, Units};
use crate::revisions;

impl<U: Units, L: Logs, P: Probes> Engine<U, L, P> {
    pub(in crate::engine) async fn step<T>(
        &self,
        sink: &Sink,
        unit: &str,
        step: Step,
        fut: impl std::future::Future<Output = Result<(Value, T), Fail>>,
    ) -> Result<T, (Step, Fail)> {
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
    pub(in crate::engine) async fn restart_one(&self, w: &Worker, sink: &Sink, ctx: Ctx<'_>, may_repair: bool) -> Result<Repaired, (Step, Fail)> {
        // Fleet: a slot of the role's semaphore before the drain (a pair restarted together
        // took both slots at once before).
        let slots = if ctx.scope.together_with.is_none() { self.slot_step(&[w], sink, ctx).await? } else { Vec::new() };
        // The service gate's baseline when it is alone in its role: its figures before the drain —
        // before this rollout first touched it. A worker restarted again in the same rollout (a
        // rollback onto its last good revision, a repair) is judged against those, not against
        // the run that just failed.
        let measured = self.slo_before(w).await;
        let before = match (ctx.before, measured) {
            (Some(keep), m) => {
                let mut kept = crate::engine::step_run::lock(keep);
                match kept.get(&w.unit) {
                    Some(first) => Some(first.clone()),
                    None => {
                        if let Some(b) = &m {
                            kept.insert(w.unit.clone(), b.clone());
                        }
                        m
                    }
                }
            }
            (None, m) => m,
        };
        let drain_began = Instant::now();
        let (watch, after, stale, taken_out) = self.restart_to_pair(w, sink, ctx).await?;
        // Out of the router since its drain — or since the restart took it out (deferred).
        let out_since = taken_out.unwrap_or(drain_began);
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
        self.restart_after_pair(w, sink, ctx, watch, after, out_since, before).await?;
        // Verified: the slot goes back.
        self.release_slots(&w.unit, &slots, ctx).await;
        Ok(repaired)
    }

    /// drain, restart, ready, health, pair: returns the unit's watch and state after the restart,
    /// the decodes found with a stale pairing (to be repaired) and when the restart took the worker
    /// out of the router (a deferred drain).
    pub(in crate::engine) async fn restart_to_pair(
        &self,
        w: &Worker,
        sink: &Sink,
        ctx: Ctx<'_>,
    ) -> Result<(U::W, UnitState, Vec<Stale>, Option<Instant>), (Step, Fail)> {
        let (watch, after, taken_out) = self.restart_to_health(w, sink, ctx).await?;
        // Still out of the router: a stale pair is found (and repaired) before the router's
        // smoke request and breaker could fail on it, and before clients reach this worker.
        let stale = self.pair_step(w, sink, ctx, &after).await?;
        Ok((watch, after, stale, taken_out))
    }

    /// drain, restart, ready, health: returns the unit's watch, its state after the restart and
    /// when the restart took it out of the router (a deferred drain, see [`Deferred`]).
    pub(in crate::engine) async fn restart_to_health(&self, w: &Worker, sink: &Sink, ctx: Ctx<'_>) -> Result<(U::W, UnitState, Option<Instant>), (Step, Fail)> {
        let unit = w.unit.as_str();
        let mut deferred = None;
        let mut drained = Ok(());
        if self.settings.rollout.drain {
            let s = StepRun::start(sink, unit, Step::Drain);
            match self.drain(w, ctx).await {
                Ok(Some((d, later))) => {
                    s.pass(d);
                    deferred = later;
                }
                Ok(None) => s.skip(NOT_REGISTERED),
                Err(f) => {
                    s.fail(&f);
                    drained = Err((Step::Drain, f));
                }
            }
        }
        // Restarted together: neither stops while the other still drains (`Together`).
        if let Some(t) = ctx.scope.together_with {
            t.drained.wait().await;
        }
        drained?;
        let (watch, after, started_in, taken_out) = self.restart_and_ready(w, sink, deferred.as_ref()).await?;
        // How long this start took: the interruption to expect next time, if it is alone in its role.
        if let (Some(dir), Some(t)) = (ctx.revisions, started_in) {
            if let Err(e) = revisions::record_start(dir, unit, t.as_millis() as u64) {
                tracing::warn!(pdctl_unit = %unit, "cannot record how long {unit}'s start took: {e}");
            }
        }
        self.step(sink, unit, Step::Health, async { self.health(w, Some(&after), true).await.map(|d| (d, ())) }).await?;
        Ok((watch, after, taken_out))
    }

    /// router, metrics, stranded KV (a decode), soak. `out_since`: when the worker left the
    /// router (its drain began): the window out of the router is recorded at its re-admission;
    /// `before`: its service figures before the drain (see [`Engine::soak`]).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::engine) async fn restart_after_pair(
        &self,
        w: &Worker,
        sink: &Sink,
        ctx: Ctx<'_>,
        mut watch: U::W,
        after: UnitState,
        out_since: Instant,
        before: Option<pdctl_probe::service::ServiceScrape>,
    ) -> Result<(), (Step, Fail)> {
        let unit = w.unit.as_str();
        if ctx.scope.hold.is_some() {
            // A coherent switch's new group stays out until the whole group is verified: it runs
            // the new model while the old group serves (see `switch.rs`).
            StepRun::start(sink, unit, Step::Router).skip(HELD_FOR_SWITCH);
        } else if self.settings.verify.router {
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
            StepRun::start(sink, unit, Step::Router).skip(rule(Step::Router, &self.settings).off_because.unwrap_or_default());
        }
        self.metrics_step(w, sink, true, ctx).await?;
        if w.role == Role::Decode {
            self.stranded_step(w, sink).await?;
        }
        let soaked = self
            .step(sink, unit, Step::Soak, async {
                self.soak(w, &mut watch, &after, before).await.map(|d| {
                    let note = d["note"].as_str().map(String::from);
                    (d, note)
                })
            })
            .await?;
        // "Not judged" is said in the summary, not hidden in a passed step.
        if let (Some(note), Some(notes)) = (soaked, ctx.notes) {
            lock(notes).push(note);
        }
        Ok(())
    }

    /// Only the restart and ready gates of one worker, exactly as a rollout runs them (events go
    /// to `sink`; the ready event's detail has `detect_ms`): for the benchmark, and for anyone who
    /// wants to time them. Returns the unit's state after the restart.
    pub async fn restart_until_ready(&self, w: &Worker, sink: &Sink) -> Result<UnitState, Failure> {
        match self.restart_and_ready(w, sink, None).await {
            Ok((_, after, _, _)) => Ok(after),
            Err((step, f)) => Err(self.failure(&w.unit, step, f).await),
        }
    }

    /// The restart and ready gates; returns the unit's watch, its state after the restart (the
    /// run the later gates hold it to), how long its start took, and when it was taken out of the
    /// router during its stop (`deferred`: a drain that left that to the restart).
    pub(in crate::engine) async fn restart_and_ready(
        &self,
        w: &Worker,
        sink: &Sink,
        deferred: Option<&Deferred>,
    ) -> Result<(U::W, UnitState, Option<Duration>, Option<Instant>), (Step, Fail)> {
        let unit = w.unit.as_str();
        let (mut watch, cursor, after, taken_out) = self
            .step(sink, unit, Step::Restart, async {
                let before = self.units.state(unit).await?;
                // A unit systemd stopped for starting too often refuses a restart until its
                // failed state is reset. Its Result says so only for a manual start: when the
                // limit stops an auto-restart it keeps the crash's own (`exit-code`, measured on
                // systemd 252), so any failed unit is reset before pdctl restarts it.
                if before.result == "start-limit-hit" || before.active_state == crate::ports::ActiveState::Failed {
                    self.units.reset_failed(unit).await?;
                }
                let cursor = self.logs.tail_cursor().await.map_err(|e| Fail::from(Cause::JournalUnreadable { message: e.to_string() }))?;
                let watch = self.units.watch(unit).await?;
                // SGLang's stop drains (it waits for its requests in flight, no timeout of its
                // own): the job lasts the stop, bounded by TimeoutStopSec, plus the start.
                let timeout_stop = self.units.config(unit).await?.timeout_stop;
                let limit = crate::stop::job_limit(self.settings.rollout.job_timeout, timeout_stop);
                let (out, taken_out) = match deferred {
                    None => (self.units.restart(unit, limit).await?, None),
                    Some(d) => {
                        // On the heap: the follower and the job side by side make a future too
                        // large for a worker thread's stack in a debug build (measured: overflow).
                        let (out, taken) = Box::pin(self.restart_taking_out(w, d, cursor.clone(), &before.invocation_id, limit)).await;
                        (out?, Some(taken))
                    }
                };
                let took = crate::stop::duration(out.state.active_exit_us, out.state.inactive_enter_us);
                // The old process's last lines reach the journal through its own stream; a
                // SIGTERM line without a watchdog check yet is read again (bounded) so the last
                // check, written just before the exit, is not missed.
                let mut stop = crate::stop::report(&[], took, timeout_stop);
                for _ in 0..5 {
                    let lines = self.logs.last_lines(unit, 300).await.unwrap_or_default();
                    stop = crate::stop::report(&lines, took, timeout_stop);
                    if stop.checks > 0 || stop.killed || stop.ended_by == "sglang_tree_kill" || !lines.iter().any(|l| l.contains(crate::stop::SIGTERM_MARK)) {
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
                if let Some(t) = &taken_out {
                    detail["taken_out"] = t.detail();
                }
                if stop.killed {
                    let c = Cause::StopSlow { unit: unit.to_string(), why: stop.why.clone() };
                    tracing::warn!(pdctl_unit = unit, "{}", c.sentence());
                    detail["warning"] = json!(c.sentence());
                    detail["cause_code"] = json!(c.code());
                } else if stop.ended_by == "sglang_tree_kill" {
                    // Not the manager's timeout: SGLang killed its own tree after a child died.
                    let said = format!("{unit}: {}", stop.why);
                    tracing::warn!(pdctl_unit = unit, "{said}");
                    detail["warning"] = json!(said);
                }
                if out.job_result != "done" {
                    let cause = Cause::JobFailed { unit: unit.to_string(), job_result: out.job_result.clone(), service_result: out.state.result.clone() };
                    return Err(Fail { cause, detail, unit: None });
                }
                Ok((detail, (watch, cursor, out.state, taken_out.map(|t| t.at))))
            })
            .await?;
        let ready_us = self
            .step(sink, unit, Step::Ready, async {
                self.ready(w, cursor, &mut watch, &after).await.map(|d| (serde_json::to_value(&d).unwrap_or_default(), d.journal_realtime_us))
            })
            .await?;
        let started_in = Some(ready_us).filter(|_| after.exec_main_start_us > 0).map(|r| Duration::from_micros(r.saturating_sub(after.exec_main_start_us)));
        Ok((watch, after, started_in, taken_out))
    }

    /// Re-verify a unit without restarting it: health, router (re-registering it if the router
    /// lost it), metrics.
    pub(in crate::engine) async fn verify(&self, w: &Worker, sink: &Sink) -> bool {
        if self.step(sink, &w.unit, Step::Health, async { self.health(w, None, true).await.map(|d| (d, ())) }).await.is_err() {
            return false;
        }
        // Its pairs too: it may have stopped right after its restart, before the pair gate. A
        // stale pair found now is repaired the usual way: the unit goes through its restart.
        let Ok(now) = self.units.state(&w.unit).await else { return false };
        match self.pair_step(w, sink, Ctx::none(Outage::Accepted, true), &now).await {
            Ok(stale) if stale.is_empty() => {}
            _ => return false,
        }
        if self.settings.verify.router && self.step(sink, &w.unit, Step::Router, async { self.router(w, true, false).await.map(|d| (d, ())) }).await.is_err() {
            return false;
        }
        if self.metrics_step(w, sink, true, Ctx::none(Outage::Accepted, true)).await.is_err() {
            return false;
        }
        w.role != Role::Decode || self.stranded_step(w, sink).await.is_ok()
    }

    /// `check`: health, router, metrics — without changing anything.
    pub(in crate::engine) async fn check_one(&self, w: &Worker, sink: &Sink) -> Result<(), (Step, Fail)> {
        self.step(sink, &w.unit, Step::Health, async { self.health(w, None, false).await.map(|d| (d, ())) }).await?;
        if self.settings.verify.router {
            self.step(sink, &w.unit, Step::Router, async { self.router(w, false, false).await.map(|d| (d, ())) }).await?;
        }
        self.metrics_step(w, sink, false, Ctx::none(Outage::Check, false)).await
    }
}
