//! Host maintenance's two steps of its own: the stop (a drained worker's unit stopped and left
//! down for the reboot: SGLang's SIGTERM drain, a prefill kept until its decodes pulled the KV
//! it holds for them) and the start (after the reboot: a worker the boot did not start is
//! started; the gates after it hold it to the run it has then).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::details::Said;
use crate::engine::gates::{restart, Deferred, Restarted};
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, Fail, Verdict};
use crate::ports::{ActiveState, JobResult, Logs, Probes, Units};
use crate::state::drain_ledger::MaintainedUnit;

/// The stop step's detail.
#[derive(Serialize)]
pub(in crate::engine) struct StopDetail {
    /// The job's result (`done` unless it failed).
    job_result: String,
    /// How long the job took.
    job_ms: u64,
    /// How long it was allowed (the stop's `TimeoutStopSec=` plus `job_timeout`).
    job_limit_ms: u64,
    /// The run stopped.
    invocation_id: String,
    /// What the stop took and why.
    stop: crate::sglang::stop::StopReport,
    /// A prefill: how long it was kept for its decodes' KV pulls, and whether they ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    kept_for_kv: Option<KeptForKv>,
    /// Its drain had been left to its stop (the only worker of its role): taken out now.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    taken_out_at_stop: bool,
}

/// How long a drained prefill was kept for the KV its decodes still pull.
#[derive(Serialize)]
pub(in crate::engine) struct KeptForKv {
    /// Requests it held for decodes when the wait began.
    held_at_start: f64,
    /// Requests still held when the wait ended (0: every pull ended).
    held_left: f64,
    /// How long it was kept.
    waited_ms: u64,
    /// The bound: its bootstrap timeout (a decode that never pulls is given up by then) plus 10 s.
    limit_ms: u64,
}

/// The start step's detail.
#[derive(Serialize)]
pub(in crate::engine) struct StartDetail {
    /// Whether pdctl started it (`false`: the boot did, or it never stopped).
    started: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<&'static str>,
    /// The job's result, when started.
    #[serde(skip_serializing_if = "Option::is_none")]
    job_result: Option<String>,
    /// The run the gates hold it to.
    invocation_id: String,
    /// Its main process.
    main_pid: u32,
}

/// The stop step of host maintenance: a deferred drain's taking out done now, a prefill kept
/// until the KV it holds for decodes is pulled (bounded), then `StopUnit` waited for (bounded by
/// the unit's `TimeoutStopSec=`: SGLang's SIGTERM drain) and what the stop was.
pub(in crate::engine) async fn stop<U: Units, L: Logs, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    deferred: Option<&Deferred>,
) -> Result<Verdict<StopDetail>, Fail> {
    let unit = w.unit.as_str();
    // Host maintenance takes the worker out of service for a reboot: the gateway stops sending
    // now, not at a drain check that only shortens a restart's outage.
    if let Some(d) = deferred {
        for (r, id) in &d.entries {
            eng.probes
                .deregister(*r, id)
                .await
                .map_err(|e| Fail::from(Cause::DrainFailed { unit: w.unit.clone(), error: format!("the router refused to remove {}: {e}", w.url) }))?;
        }
    }
    let kept_for_kv = if w.role == Role::Prefill { kept_for_pulls(eng, w).await } else { None };
    let before = eng.units.state(unit).await?;
    let timeout_stop = eng.units.config(unit).await?.timeout_stop;
    let limit = crate::sglang::stop::job_limit(eng.settings.rollout.job_timeout, timeout_stop);
    let out = eng.units.stop(unit, limit).await?;
    // systemd unloads a stopped unit that nothing references (one not enabled), and its
    // timestamps with it; the stop job's own time is then the stop's: it runs from the SIGTERM
    // to `inactive`.
    let took = crate::sglang::stop::duration(out.state.active_exit_us, out.state.inactive_enter_us).or(Some(out.job_time));
    let stop = restart::stop_report(eng, unit, took, timeout_stop).await;
    let typed = StopDetail {
        job_result: out.job_result.to_string(),
        job_ms: out.job_time.as_millis() as u64,
        job_limit_ms: limit.as_millis() as u64,
        invocation_id: before.invocation_id,
        stop: stop.clone(),
        kept_for_kv,
        taken_out_at_stop: deferred.is_some(),
    };
    let mut said = Said::default();
    if stop.killed {
        let c = Cause::StopSlow { unit: unit.to_string(), why: stop.why.clone() };
        tracing::warn!(pdctl_unit = unit, "{}", c.sentence());
        said = Said { warning: Some(c.sentence()), cause_code: Some(c.code().to_string()), ..Said::default() };
    }
    if out.job_result != JobResult::Done {
        let cause = Cause::JobFailed { unit: unit.to_string(), job_result: out.job_result.to_string(), service_result: out.state.result.to_string() };
        return Err(Fail { cause, detail: said.written_into(detail_of(&typed)), unit: None, last_lines: Vec::new() });
    }
    Ok(Verdict::Passed(typed, said))
}

/// A drained prefill still holds KV for requests its decodes (on this host or others) have not
/// pulled yet: stopping it now fails them. Kept until its PD queues are empty, bounded by its
/// bootstrap timeout (after which SGLang gives such a room up itself) plus 10 s. `None`: it held
/// nothing, or its queues could not be read (then nothing is waited for: said in the log).
async fn kept_for_pulls<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker) -> Option<KeptForKv> {
    let first = match eng.probes.pd_queues(&w.url).await {
        Ok(q) => q.held_reqs,
        Err(e) => {
            tracing::warn!(pdctl_unit = %w.unit, "{}'s PD queues could not be read ({e}): stopped without waiting for its decodes' KV pulls", w.unit);
            return None;
        }
    };
    if first <= 0.0 {
        return None;
    }
    let env = eng.units.config(&w.unit).await.map(|c| c.environment).unwrap_or_default();
    let limit = crate::sglang::bootstrap_timeout(&env) + Duration::from_secs(10);
    let t0 = Instant::now();
    let mut left = first;
    while left > 0.0 && t0.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(500)).await;
        left = eng.probes.pd_queues(&w.url).await.map(|q| q.held_reqs).unwrap_or(left);
    }
    Some(KeptForKv { held_at_start: first, held_left: left, waited_ms: t0.elapsed().as_millis() as u64, limit_ms: limit.as_millis() as u64 })
}

/// The start step of a host's resume: the unit's watch taken first; a unit the boot started (or
/// that never stopped) is not started again; else (its failed state reset) `StartUnit` waited
/// for. The journal is read for its ready line from the cursor its drain recorded before the
/// stop, so a ready line the boot's start logged before pdctld came up is found.
pub(in crate::engine) async fn start<U: Units, L: Logs, P>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    was: Option<&MaintainedUnit>,
) -> Result<(Verdict<StartDetail>, Restarted<U::W>), Fail> {
    let unit = w.unit.as_str();
    let watch = eng.units.watch(unit).await?;
    let st = eng.units.state(unit).await?;
    let recorded = was.and_then(|m| m.cursor.clone());
    if matches!(st.active_state, ActiveState::Active | ActiveState::Activating) {
        let ran_through = was.is_some_and(|m| m.invocation_id == st.invocation_id);
        let why = if ran_through { "it was never stopped: its run went on through the drain" } else { "the boot started it" };
        let detail = StartDetail { started: false, why: Some(why), job_result: None, invocation_id: st.invocation_id.clone(), main_pid: st.main_pid };
        return Ok((Verdict::passed(detail), Restarted { watch, cursor: recorded, after: st, taken_out: None, ran_through }));
    }
    restart::reset_if_failed(eng, unit, &st).await?;
    let cursor = match recorded {
        Some(c) => Some(c),
        None => eng.logs.tail_cursor().await.map_err(|e| Fail::from(Cause::JournalUnreadable { message: e.to_string() }))?,
    };
    let out = eng.units.start(unit, eng.settings.rollout.job_timeout).await?;
    let detail = StartDetail {
        started: true,
        why: None,
        job_result: Some(out.job_result.to_string()),
        invocation_id: out.state.invocation_id.clone(),
        main_pid: out.state.main_pid,
    };
    if out.job_result != JobResult::Done {
        let cause = Cause::JobFailed { unit: unit.to_string(), job_result: out.job_result.to_string(), service_result: out.state.result.to_string() };
        return Err(Fail { cause, detail: detail_of(&detail), unit: None, last_lines: Vec::new() });
    }
    Ok((Verdict::passed(detail), Restarted { watch, cursor, after: out.state, taken_out: None, ran_through: false }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_stop_and_start_details_have_the_keys_of_the_contract() {
        let start = StartDetail { started: false, why: Some("the boot started it"), job_result: None, invocation_id: "i".into(), main_pid: 7 };
        assert_eq!(detail_of(&start), json!({"started": false, "why": "the boot started it", "invocation_id": "i", "main_pid": 7}));
        let kept = KeptForKv { held_at_start: 2.0, held_left: 0.0, waited_ms: 3, limit_ms: 4 };
        assert_eq!(detail_of(&kept), json!({"held_at_start": 2.0, "held_left": 0.0, "waited_ms": 3, "limit_ms": 4}));
    }
}
