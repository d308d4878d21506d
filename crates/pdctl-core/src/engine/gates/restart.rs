//! The restart: the unit's journal cursor and watch, `RestartUnit(name, "replace")` bounded by
//! the stop SGLang's drain may take, and what the stop was (a drain, a watchdog kill, SGLang's own
//! tree kill). A worker whose drain was deferred ([`Deferred`]) is taken out of the gateway during
//! its stop, at its server's first drain check.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cause::Cause;
use crate::config::Worker;
use crate::details::Said;
use crate::engine::context::Together;
use crate::engine::gates::deferred_drain::{take_out_after_check, FIRST_CHECK_BY};
use crate::engine::gates::Deferred;
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, Fail, Verdict, POLL};
use crate::ports::{Follow, JobOutcome, JobResult, Logs, Probes, ServiceResult, UnitState, Units, UnitsError};

/// When a deferred drain's worker left the gateway during its restart.
#[derive(Debug, Clone)]
pub(in crate::engine) struct TakenOut {
    /// The moment.
    pub(in crate::engine) at: Instant,
    /// After the restart job began (its stop's SIGTERM).
    pub(in crate::engine) after_ms: u64,
    /// At what: the drain check's line, or the job's end.
    pub(in crate::engine) when: String,
    /// Replicas that refused the removal.
    pub(in crate::engine) refused: Vec<String>,
}

impl TakenOut {
    /// Its part of the restart step's detail (`taken_out`), which the record's window starts at.
    fn detail(&self) -> TakenOutDetail {
        TakenOutDetail { after_ms: self.after_ms, when: self.when.clone(), warning: (!self.refused.is_empty()).then(|| self.refused.join("; ")) }
    }
}

/// The restart step's detail (the JSON in docs/cli.md): the job, the old and new run, the stop.
#[derive(Serialize)]
pub(in crate::engine) struct RestartDetail {
    /// The job's result (`done` unless it failed).
    job_result: String,
    /// How long the job took.
    job_ms: u64,
    /// How long it was allowed (the stop's `TimeoutStopSec=` plus `job_timeout`).
    job_limit_ms: u64,
    /// The run before the restart.
    old_invocation_id: String,
    /// The run after it.
    invocation_id: String,
    /// Its main process.
    main_pid: u32,
    /// When its main process started (µs since the epoch).
    exec_main_start_us: u64,
    /// What the stop took and why.
    stop: crate::sglang::stop::StopReport,
    /// A deferred drain: when the worker left the gateway during the stop.
    #[serde(skip_serializing_if = "Option::is_none")]
    taken_out: Option<TakenOutDetail>,
}

/// When a deferred drain's worker left the gateway, in the restart's detail (`taken_out`).
#[derive(Serialize)]
struct TakenOutDetail {
    /// After the restart job began.
    after_ms: u64,
    /// At what.
    when: String,
    /// Replicas that refused the removal (`null`: none).
    warning: Option<String>,
}

/// What the restart step hands to the steps after it: the unit's watch and journal cursor (from
/// before the restart), its state after the restart (the run the later gates hold it to), and
/// when it left the gateway during its stop (a deferred drain).
pub(in crate::engine) struct Restarted<W> {
    /// The unit's property changes, from before the restart.
    pub(in crate::engine) watch: W,
    /// The journal's tail before the restart: the ready line is looked for after it.
    pub(in crate::engine) cursor: Option<String>,
    /// The unit's state after the restart job.
    pub(in crate::engine) after: UnitState,
    /// When a deferred drain took it out of the gateway.
    pub(in crate::engine) taken_out: Option<Instant>,
    /// Host maintenance: its run went on through the host's drain (it was never stopped), so its
    /// ready line came before; the ready gate has nothing new to wait for.
    pub(in crate::engine) ran_through: bool,
}

/// The restart step: a failed unit's state reset, the cursor and watch taken, the restart
/// job run (taking a deferred worker out during its stop), and the stop reported from the
/// old process's last lines.
pub(in crate::engine) async fn restart<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    deferred: Option<&Deferred>,
    pair: Option<Together<'_>>,
) -> Result<(Verdict<RestartDetail>, Restarted<U::W>), Fail> {
    let unit = w.unit.as_str();
    let before = eng.units.state(unit).await?;
    reset_if_failed(eng, unit, &before).await?;
    let cursor = eng.logs.tail_cursor().await.map_err(|e| Fail::from(Cause::JournalUnreadable { message: e.to_string() }))?;
    let watch = eng.units.watch(unit).await?;
    // SGLang's stop drains (it waits for its requests in flight, no timeout of its
    // own): the job lasts the stop, bounded by TimeoutStopSec, plus the start.
    let timeout_stop = eng.units.config(unit).await?.timeout_stop;
    let limit = crate::sglang::stop::job_limit(eng.settings.rollout.job_timeout, timeout_stop);
    let (out, taken_out) = match deferred {
        None => (eng.units.restart(unit, limit).await?, None),
        Some(d) => {
            // On the heap: the follower and the job side by side make a future too
            // large for a worker thread's stack in a debug build (measured: overflow).
            let (out, taken) = Box::pin(restart_taking_out(eng, w, d, pair, cursor.clone(), &before.invocation_id, limit)).await;
            (out?, Some(taken))
        }
    };
    let took = crate::sglang::stop::duration(out.state.active_exit_us, out.state.inactive_enter_us);
    let stop = stop_report(eng, unit, took, timeout_stop).await;
    let typed = RestartDetail {
        job_result: out.job_result.to_string(),
        job_ms: out.job_time.as_millis() as u64,
        job_limit_ms: limit.as_millis() as u64,
        old_invocation_id: before.invocation_id.clone(),
        invocation_id: out.state.invocation_id.clone(),
        main_pid: out.state.main_pid,
        exec_main_start_us: out.state.exec_main_start_us,
        stop: stop.clone(),
        taken_out: taken_out.as_ref().map(TakenOut::detail),
    };
    let mut said = Said::default();
    if stop.killed {
        let c = Cause::StopSlow { unit: unit.to_string(), why: stop.why.clone() };
        tracing::warn!(pdctl_unit = unit, "{}", c.sentence());
        said = Said { warning: Some(c.sentence()), cause_code: Some(c.code().to_string()), ..Said::default() };
    } else if stop.ended_by.by_sglang_itself() {
        // Not the manager's timeout: SGLang killed its own tree after a child died, or its
        // watchdog force-exited an UnHealthy server: what ran on it was not waited for.
        let warning = format!("{unit}: {}", stop.why);
        tracing::warn!(pdctl_unit = unit, "{warning}");
        said = Said { warning: Some(warning), ..Said::default() };
    }
    if out.job_result != JobResult::Done {
        let cause = Cause::JobFailed { unit: unit.to_string(), job_result: out.job_result.to_string(), service_result: out.state.result.to_string() };
        return Err(Fail { cause, detail: said.written_into(detail_of(&typed)), unit: None, last_lines: Vec::new() });
    }
    Ok((Verdict::Passed(typed, said), Restarted { watch, cursor, after: out.state, taken_out: taken_out.map(|t| t.at), ran_through: false }))
}

/// A unit systemd stopped for starting too often refuses a restart (or a start) until its
/// failed state is reset. Its Result says so only for a manual start: when the limit stops an
/// auto-restart it keeps the crash's own (`exit-code`, measured on systemd 252), so any failed
/// unit is reset before pdctl restarts or starts it.
pub(in crate::engine) async fn reset_if_failed<U: Units, L, P>(eng: &Engine<U, L, P>, unit: &str, st: &UnitState) -> Result<(), UnitsError> {
    if st.result == ServiceResult::StartLimitHit || st.active_state == crate::ports::ActiveState::Failed {
        eng.units.reset_failed(unit).await?;
    }
    Ok(())
}

/// What the stop of `unit`'s old process was (a drain, a watchdog kill, SGLang's own tree kill),
/// from its last lines and `took` (how long it took, when known). The old process's last
/// lines reach the journal through its own stream; a SIGTERM line without a watchdog check yet is
/// read again (bounded) so the last check, written just before the exit, is not missed.
pub(in crate::engine) async fn stop_report<U, L: Logs, P>(
    eng: &Engine<U, L, P>,
    unit: &str,
    took: Option<Duration>,
    timeout_stop: Option<Duration>,
) -> crate::sglang::stop::StopReport {
    let mut stop = crate::sglang::stop::report(&[], took, timeout_stop);
    for _ in 0..5 {
        let lines = eng.logs.last_lines(unit, 300).await.unwrap_or_default();
        stop = crate::sglang::stop::report(&lines, took, timeout_stop);
        if stop.checks > 0 || stop.killed || stop.ended_by.by_sglang_itself() || !lines.iter().any(|l| l.contains(crate::sglang::stop::SIGTERM_MARK)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop
}

/// The restart job of a worker whose drain was deferred, taking it out of every replica during
/// its stop ([`Deferred`] says when): after the old process's first drain check
/// (`old_invocation`'s `Gracefully exiting... Remaining number of requests N` line, followed
/// from `cursor`) — at once when it counted none, else just before the next check — or
/// [`FIRST_CHECK_BY`] after SIGTERM without one; sooner when it serves nothing any more (its old
/// process gone, the gateway's own health checks, the other half of its `pair` out); when the
/// job ends at the latest, or the journal cannot be followed.
pub(in crate::engine) async fn restart_taking_out<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    d: &Deferred,
    pair: Option<Together<'_>>,
    cursor: Option<String>,
    old_invocation: &str,
    limit: Duration,
) -> (Result<JobOutcome, UnitsError>, TakenOut) {
    let t0 = Instant::now();
    let checked = std::sync::atomic::AtomicBool::new(false);
    let stay = stay_through_first_check(eng, w, cursor, old_invocation, t0, &checked);
    let serves_no_more = serves_no_more(eng, w, d, old_invocation);
    // A pair restarted together: once the other half is out of the gateway, this one is sent
    // nothing new (a PD request needs a prefill and a decode).
    let other_left = async {
        match pair {
            Some(t) => {
                t.other_left().await;
                format!("when the other half of its pair, {}, left the gateway: a PD request needs both", t.unit)
            }
            None => std::future::pending().await,
        }
    };
    let mut restart = Box::pin(eng.units.restart(&w.unit, limit));
    // In this order when several are ready at once, so that a run over fakes says one thing.
    let (done, when) = tokio::select! {
        biased;
        out = &mut restart => (Some(out), match checked.load(std::sync::atomic::Ordering::Relaxed) {
            false => "when its restart job ended: no drain check was logged".to_string(),
            true => "when its restart job ended, before the next drain check".to_string(),
        }),
        why = stay => (None, why),
        why = other_left => (None, why),
        why = serves_no_more => (None, why),
    };
    let at = Instant::now();
    let refused = take_out_deferred(eng, w, d).await;
    if let Some(t) = pair {
        t.left(&w.unit);
    }
    let taken = TakenOut { at, after_ms: at.duration_since(t0).as_millis() as u64, when, refused };
    let out = match done {
        Some(out) => out,
        None => restart.await,
    };
    (out, taken)
}

/// Until the deferred worker is to leave the gateway by SGLang's drain looks (`old_invocation`'s
/// `Gracefully exiting... Remaining number of requests N` lines, followed from `cursor`): at the
/// first look when it counted none, just before the next when it counted some
/// ([`take_out_after_check`]), or [`FIRST_CHECK_BY`] after `t0` (its SIGTERM) without a look.
/// Returns why; `checked` is set once a look was seen.
async fn stay_through_first_check<U, L: Logs, P>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    cursor: Option<String>,
    old_invocation: &str,
    t0: Instant,
    checked: &std::sync::atomic::AtomicBool,
) -> String {
    let mut follow = eng.logs.follow(cursor, &w.unit);
    let first_check = async {
        while let Some(Ok(e)) = follow.next().await {
            let of_old = e.get("_SYSTEMD_INVOCATION_ID").is_none_or(|i| old_invocation.is_empty() || i == old_invocation);
            if of_old && e.message().contains(crate::sglang::stop::REMAINING_MARK) {
                return Some(e.message().to_string());
            }
        }
        None
    };
    match tokio::time::timeout(FIRST_CHECK_BY.saturating_sub(t0.elapsed()), first_check).await {
        Err(_) => format!("{:.1} s after its SIGTERM: its server logged no drain check by then", t0.elapsed().as_secs_f64()),
        Ok(None) => "when the journal could no longer be followed during its stop".to_string(),
        Ok(Some(line)) => {
            checked.store(true, std::sync::atomic::Ordering::Relaxed);
            let remaining = crate::sglang::stop::remaining_in(&line);
            let stay = take_out_after_check(remaining);
            if stay.is_zero() {
                format!("at its server's first drain check: {}", crate::sglang::stop::remaining_part(&line))
            } else {
                tokio::time::sleep(stay).await;
                format!(
                    "{:.1} s after its server's first drain check counted {} request(s), {:.0} s before the next: {}",
                    stay.as_secs_f64(),
                    remaining.unwrap_or_default(),
                    crate::sglang::stop::WATCHDOG_PERIOD.saturating_sub(stay).as_secs_f64(),
                    crate::sglang::stop::remaining_part(&line)
                )
            }
        }
    }
}

/// Once the deferred worker serves nothing any more: its old process gone (killed or crashed
/// before a look was logged), or the gateway no longer routes to it — its own health checks see
/// the 503 SGLang's `/health` answers while it drains (smg and 0.3.2: after 3 failed checks), and
/// the outage on record starts there. Returns why.
async fn serves_no_more<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, d: &Deferred, old_invocation: &str) -> String {
    loop {
        tokio::time::sleep(POLL).await;
        if let Ok(st) = eng.units.state(&w.unit).await {
            if st.main_pid == 0 || (!old_invocation.is_empty() && st.invocation_id != old_invocation) {
                return format!("when its old process was gone before a drain check was logged ({}/{})", st.active_state, st.sub_state);
            }
        }
        for (r, id) in &d.entries {
            if let Ok(list) = eng.probes.router_workers(*r).await {
                match list.iter().find(|x| &x.id == id) {
                    None => return format!("when the gateway no longer listed it (replica {r})"),
                    Some(x) if !x.admitted() => {
                        return format!(
                            "when the gateway's own health checks stopped routing to it (is_healthy: {}, status: {})",
                            x.is_healthy,
                            x.status.as_deref().unwrap_or("-")
                        )
                    }
                    Some(_) => {}
                }
            }
        }
    }
}

/// Take a deferred drain's worker out of every replica now; what could not be removed is
/// returned (said as a warning: the router gate finds the old entry and deals with it).
async fn take_out_deferred<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, d: &Deferred) -> Vec<String> {
    let mut refused = Vec::new();
    for (r, id) in &d.entries {
        if let Err(e) = eng.probes.deregister(*r, id).await {
            refused.push(format!("the router refused to remove {}: {e}", w.url));
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_restart_detail_has_the_keys_of_the_contract() {
        let stop = crate::sglang::stop::report(&[], Some(Duration::from_millis(900)), None);
        let mut d = RestartDetail {
            job_result: "done".into(),
            job_ms: 2,
            job_limit_ms: 3,
            old_invocation_id: "a".into(),
            invocation_id: "b".into(),
            main_pid: 4,
            exec_main_start_us: 5,
            stop: stop.clone(),
            taken_out: None,
        };
        let without = json!({"job_result": "done", "job_ms": 2, "job_limit_ms": 3, "old_invocation_id": "a", "invocation_id": "b", "main_pid": 4, "exec_main_start_us": 5, "stop": stop});
        assert_eq!(serde_json::to_value(&d).unwrap_or_default(), without);
        d.taken_out = Some(TakenOutDetail { after_ms: 6, when: "w".into(), warning: None });
        let mut with = without;
        with["taken_out"] = json!({"after_ms": 6, "when": "w", "warning": null});
        assert_eq!(serde_json::to_value(&d).unwrap_or_default(), with);
    }
}

/// The restart inside a rollout over fakes of the gateway: when a deferred worker is taken out.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

    #[tokio::test]
    async fn the_only_worker_of_its_role_is_taken_out_by_its_restart_not_before_it() {
        let w = world();
        let s = with_router(&w, true);
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let passed = |step: Step| event(&events, "p.service", step, Status::Passed).detail.clone();
        let drain = passed(Step::Drain);
        assert!(drain["taken_out"].as_str().is_some_and(|t| t.starts_with("deferred")), "{drain}");
        let restart = passed(Step::Restart);
        assert!(restart["taken_out"]["when"].as_str().is_some_and(|t| t.contains("restart job ended")), "no drain check in these logs: {restart}");
        let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
        let at = |prefix: &str| log.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {log:?}"));
        assert!(at("settle_now w1") < at("deregister w1 after 1 restart(s)"), "settle 0 set first, the removal during the restart: {log:?}");
        // The drain was written down before anything touched the gateway, and undone at re-admission.
        assert!(w.lock().unwrap().router.as_ref().unwrap().workers.iter().any(|x| x.url == "http://p"), "re-admitted");
    }

    /// A deferred worker whose old process is gone before any drain check was logged (killed,
    /// crashed) serves nothing: it is taken out then, not when the restart job ends.
    #[tokio::test]
    async fn a_deferred_worker_whose_old_process_is_gone_is_taken_out_then() {
        let w = world();
        let s = with_router(&w, true);
        w.lock().unwrap().restart_takes = Some(Duration::from_secs(2));
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let restart = event(&events, "p.service", Step::Restart, Status::Passed).detail.clone();
        assert!(restart["taken_out"]["when"].as_str().is_some_and(|t| t.contains("old process was gone")), "{restart}");
        assert!(restart["taken_out"]["after_ms"].as_u64().is_some_and(|ms| ms < 2000), "before the job ended: {restart}");
        let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
        assert!(log.iter().any(|l| l.starts_with("deregister w1 after 0 restart(s)")), "out while the restart job ran: {log:?}");
    }

    /// A deferred worker whose stop logs no drain check (the fake's journal has none) and whose old
    /// process keeps running is taken out [`FIRST_CHECK_BY`] after SIGTERM (SGLang's first check
    /// comes within 5 s), not only when the restart job ends.
    #[tokio::test]
    async fn a_deferred_worker_is_taken_out_6_s_after_its_sigterm_when_no_drain_check_comes() {
        let w = world();
        let s = with_router(&w, true);
        {
            let mut world = w.lock().unwrap();
            (world.restart_takes, world.old_process_stays) = (Some(Duration::from_secs(8)), true);
        }
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let passed = |step: Step| event(&events, "p.service", step, Status::Passed).detail.clone();
        assert_eq!(passed(Step::Drain)["take_out_by_ms"], 9000, "at the latest 4 s after a first check 5 s after SIGTERM");
        let restart = passed(Step::Restart);
        let taken = &restart["taken_out"];
        assert!(taken["when"].as_str().is_some_and(|t| t.starts_with("6.0 s after its SIGTERM: its server logged no drain check")), "{restart}");
        assert!(taken["after_ms"].as_u64().is_some_and(|ms| (6000..8000).contains(&ms)), "then, before the job ended: {restart}");
    }

    /// A first drain check that counts no request: the server exits now, and the worker leaves
    /// the gateway now — the outage starts with the server's own.
    #[tokio::test]
    async fn a_deferred_worker_whose_first_drain_check_counts_none_is_taken_out_at_it() {
        let w = world();
        let s = with_router(&w, true);
        {
            let mut world = w.lock().unwrap();
            (world.restart_takes, world.old_process_stays) = (Some(Duration::from_secs(4)), true);
            world.drain_check.insert("p.service".into(), (Duration::from_millis(300), 0));
        }
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let restart = event(&events, "p.service", Step::Restart, Status::Passed).detail.clone();
        let taken = &restart["taken_out"];
        assert!(taken["when"].as_str().is_some_and(|t| t.starts_with("at its server's first drain check")), "{restart}");
        assert!(taken["after_ms"].as_u64().is_some_and(|ms| (300..4000).contains(&ms)), "at the check, before the job ended: {restart}");
    }

    /// A first drain check that counts requests: SGLang waits 5 s for the next, and the worker
    /// serves on meanwhile; it leaves the gateway 1 s before that next check, not at the first.
    #[tokio::test]
    async fn a_deferred_worker_whose_first_drain_check_counts_requests_stays_in_until_just_before_the_next() {
        let w = world();
        let s = with_router(&w, true);
        {
            let mut world = w.lock().unwrap();
            (world.restart_takes, world.old_process_stays) = (Some(Duration::from_secs(6)), true);
            world.drain_check.insert("p.service".into(), (Duration::from_millis(300), 2));
        }
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let restart = event(&events, "p.service", Step::Restart, Status::Passed).detail.clone();
        let taken = &restart["taken_out"];
        assert!(
            taken["when"].as_str().is_some_and(|t| t.starts_with("4.0 s after its server's first drain check counted 2 request(s), 1 s before the next")),
            "{restart}"
        );
        assert!(taken["after_ms"].as_u64().is_some_and(|ms| (4300..6000).contains(&ms)), "4 s after the check, before the job ended: {restart}");
    }

    /// A pair restarted together: once one half has left the gateway (its first drain check
    /// counted none), the other serves nothing new and leaves too, before its own check.
    #[tokio::test]
    async fn a_pair_restarted_together_leaves_the_gateway_with_its_first_half() {
        let w = world();
        let mut s = with_router(&w, true);
        s.rollout.single_pair = crate::config::SinglePair::Together;
        {
            let mut world = w.lock().unwrap();
            (world.restart_takes, world.old_process_stays) = (Some(Duration::from_secs(4)), true);
            world.drain_check.insert("p.service".into(), (Duration::from_millis(300), 0));
        }
        let (summary, events) = run(&w, s).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let taken = |unit: &str| event(&events, unit, Step::Restart, Status::Passed).detail["taken_out"].clone();
        let (p, d) = (taken("p.service"), taken("d.service"));
        assert!(p["when"].as_str().is_some_and(|t| t.starts_with("at its server's first drain check")), "{p}");
        assert!(d["when"].as_str().is_some_and(|t| t.starts_with("when the other half of its pair, p.service, left the gateway")), "{d}");
        assert!(d["after_ms"].as_u64().is_some_and(|ms| ms < 4000), "with the prefill, not at its own job's end: {d}");
    }
}
