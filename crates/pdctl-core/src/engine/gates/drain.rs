//! The drain: the worker out of the gateway (the ledger written first), then a bounded wait for its
//! requests in flight — or, for the only worker of its role, the ledger written and its taking out
//! deferred to its server's own drain check during the stop ([`Deferred`]).

use std::time::Instant;

use crate::cause::Cause;
use crate::config::Worker;
use crate::engine::context::Ctx;
use crate::engine::gates::deferred_drain::{defer, defers_take_out, settle_now, Deferral, Deferred};
use crate::engine::machine::Engine;
use crate::engine::step_run::{Fail, Verdict, POLL};
use crate::engine::steps::{rule, GateMode, NOT_REGISTERED};
use crate::ports::{Probes, RouterWorker, Units};
use crate::state::drain_ledger::{Drain, Hold, Ledger};

/// The drain step's detail (the JSON in docs/cli.md) when the worker was taken out now and its
/// requests waited for. `null` fields: not read, not done, or nothing to say.
#[derive(serde::Serialize)]
pub(in crate::engine) struct Drained {
    /// A load that could not be read (warn mode), as its cause's sentence.
    warning: Option<String>,
    /// That cause's code.
    cause_code: Option<&'static str>,
    /// Requests aborted before the stop.
    aborted: Option<u64>,
    /// Why they were aborted.
    aborted_why: Option<&'static str>,
    /// The gateway's id of the entry removed.
    removed_router_id: String,
    /// The gateway's load of it when removed.
    router_load: i64,
    /// Requests still in flight at the end of the wait.
    in_flight_left: Option<u64>,
    /// Replicas it was removed from.
    replicas_drained: usize,
    /// Requests in flight when the wait began.
    in_flight_at_start: Option<u64>,
    /// How long the requests were waited for.
    waited_for_requests_ms: u64,
    /// The status the gateway listed it with.
    router_status: Option<String>,
    /// When the gateway stopped listing it (not waited for the only worker of its role).
    unlisted_after_ms: Option<u64>,
    /// smg's settle set for it (0), when every replica took it.
    drain_settle_secs: Option<u64>,
    /// What the replicas that refused the settle said.
    settle_warning: Option<String>,
    /// Why its taking out was not deferred to its stop (the only worker of its role).
    not_deferred: Option<String>,
    /// How long the step took.
    waited_ms: u64,
    /// Requests were still running when the wait ended.
    timed_out: bool,
}

/// The drain step's detail for a worker a coherent switch took out already.
#[derive(serde::Serialize)]
pub(in crate::engine) struct HeldDrain {
    /// Who took it out.
    taken_out: &'static str,
    /// The switch's hold on it.
    hold: Option<Hold>,
    /// The gateway's id of the entry removed.
    removed_router_id: String,
    /// A load that could not be read, as its cause's sentence.
    warning: Option<String>,
    /// That cause's code.
    cause_code: Option<&'static str>,
    /// Requests in flight when the wait began.
    in_flight_at_start: Option<u64>,
    /// Requests still in flight at its end.
    in_flight_left: Option<u64>,
    /// How long the requests were waited for.
    waited_for_requests_ms: u64,
    /// How long the step took.
    waited_ms: u64,
    /// Requests were still running when the wait ended.
    timed_out: bool,
}

/// The drain step's detail: taken out now, held out by the coherent switch, or its taking out
/// left to its stop.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub(in crate::engine) enum DrainDetail {
    /// Taken out now, its requests waited for.
    Now(Drained),
    /// Taken out already by the coherent switch.
    Held(HeldDrain),
    /// Taken out at its server's first drain check during its stop.
    Deferred(super::deferred_drain::DeferredDrain),
}

/// The drain of a worker this rollout's coherent switch took out already: its requests waited
/// for (bounded) before its stop.
async fn held_drain<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, held: Drain) -> Result<HeldDrain, Fail> {
    let t0 = Instant::now();
    let (at_start, left, unknown) = wait_in_flight(eng, w, t0).await?;
    Ok(HeldDrain {
        taken_out: "by the coherent switch",
        hold: held.hold,
        removed_router_id: held.router_id,
        warning: unknown.as_ref().map(Cause::sentence),
        cause_code: unknown.as_ref().map(Cause::code),
        in_flight_at_start: at_start,
        in_flight_left: left,
        waited_for_requests_ms: t0.elapsed().as_millis() as u64,
        waited_ms: t0.elapsed().as_millis() as u64,
        timed_out: left.is_some_and(|n| n > 0),
    })
}

/// The drain step: skipped when no replica lists the worker; the detail, and the taking out
/// left to the restart when it is deferred.
pub(in crate::engine) async fn drain<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    ctx: Ctx<'_>,
) -> Result<(Verdict<DrainDetail>, Option<Deferred>), Fail> {
    let drain_failed = |error: String| Fail::from(Cause::DrainFailed { unit: w.unit.clone(), error });
    let (entries, another_serves) = listed(eng, w).await?;
    let Some((_, entry)) = entries.first().cloned() else {
        // Taken out already by this rollout's coherent switch (all of a group at once, the
        // ledger written first): its requests are still waited for before its stop.
        if let Some(held) = ctx.writes.ledger.and_then(|l| l.get(&w.unit)).filter(|d| d.rollout_id == ctx.writes.id && d.hold.is_some()) {
            return Ok((Verdict::passed(DrainDetail::Held(held_drain(eng, w, held).await?)), None));
        }
        return Ok((Verdict::Skipped(NOT_REGISTERED.to_string()), None));
    };
    // Taken out now: because another worker of its role serves (`None`), or why it cannot wait
    // for its stop (`Some`).
    let deferral: Result<Deferral, Option<String>> = if another_serves { Err(None) } else { defers_take_out(eng, w, ctx).await.map_err(Some) };
    // Written down before the router is touched: whatever happens next (a failed gate, a
    // crash, SIGKILL), the drain is found and undone.
    if let Some(l) = ctx.writes.ledger {
        record_drain(eng, l, w, &entry.id, ctx.writes.id, ctx.scope.hold).await?;
    }
    let not_deferred = match deferral {
        Ok(d) => {
            let (detail, deferred) = defer(eng, w, &entries, d).await;
            return Ok((Verdict::passed(DrainDetail::Deferred(detail)), deferred));
        }
        Err(why) => why,
    };
    // Alone in its role and drained before its stop all the same: the gateway's settle keeps
    // nothing else serving; it only keeps the restarted worker from being registered again.
    let settle = if another_serves { (None, Vec::new()) } else { settle_now(eng, w, &entries).await };
    for (r, e) in &entries {
        eng.probes.deregister(*r, &e.id).await.map_err(|er| drain_failed(format!("the router refused to remove {}: {er}", w.url)))?;
    }
    let t0 = Instant::now();
    // Wait until the gateway no longer lists it (smg 1.x lists it as draining for ~5 s and
    // still finishes its requests meanwhile); bounded by drain_timeout. Not for the only
    // worker of its role: nothing else serves meanwhile, so that wait would only lengthen the
    // outage (docs/benchmarks.md, "Figures the code's choices rest on"); the router gate waits
    // out the draining entry before it re-registers the worker.
    let listed_for_ms = wait_unlisted(eng, w, &entries, t0).await;
    // Wait (bounded) for the requests it runs: read from the server's load endpoint. One that
    // cannot be read is a cause, never taken for "nothing in flight".
    let wait_t0 = Instant::now();
    let (at_start, left, unknown) = wait_in_flight(eng, w, t0).await?;
    // What is left would hold the stop (SGLang waits for it, up to TimeoutStopSec and
    // SIGKILL): aborted when it can never finish or by the setting. On a stale decode, requests
    // paired with a healthy prefill end within the drain's wait; those still running then are
    // the ones waiting for KV from the old prefill process (until the decode's waiting
    // timeout), so aborting what is left aborts those.
    let aborted = if ctx.abort_in_flight || eng.settings.rollout.abort_after_drain_timeout { abort_left(eng, w, left).await? } else { None };
    let d = Drained {
        warning: unknown.as_ref().map(Cause::sentence),
        cause_code: unknown.as_ref().map(Cause::code),
        aborted,
        aborted_why: aborted
            .map(|_| if ctx.abort_in_flight { "its pairing is stale: its requests can never finish" } else { "abort_after_drain_timeout = true" }),
        removed_router_id: entry.id,
        router_load: entry.load,
        in_flight_left: left,
        replicas_drained: entries.len(),
        in_flight_at_start: at_start,
        waited_for_requests_ms: wait_t0.elapsed().as_millis() as u64,
        router_status: entry.status,
        unlisted_after_ms: listed_for_ms,
        drain_settle_secs: settle.0,
        settle_warning: (!settle.1.is_empty()).then(|| settle.1.join("; ")),
        not_deferred,
        waited_ms: t0.elapsed().as_millis() as u64,
        timed_out: left.is_some_and(|n| n > 0),
    };
    Ok((Verdict::passed(DrainDetail::Now(d)), None))
}

/// On which replicas the gateway lists `w` (a gateway of several replicas: each is drained), and
/// whether any replica admits another worker of its role (then it is not alone).
async fn listed<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker) -> Result<(Vec<(usize, RouterWorker)>, bool), Fail> {
    let mut entries = Vec::new();
    let mut another_serves = false;
    for r in 0..eng.probes.replicas() {
        let list = eng
            .probes
            .router_workers(r)
            .await
            .map_err(|e| Fail::from(Cause::DrainFailed { unit: w.unit.clone(), error: format!("the router does not answer: {e}") }))?;
        another_serves |= list.iter().any(|x| !crate::config::same_url(&x.url, &w.url) && x.worker_type == w.role.as_str() && x.admitted());
        if let Some(entry) = list.into_iter().find(|x| crate::config::same_url(&x.url, &w.url) && !x.draining()) {
            entries.push((r, entry));
        }
    }
    Ok((entries, another_serves))
}

/// Abort the requests `w` still runs (`left`) after the drain's wait; returns how many.
async fn abort_left<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, left: Option<u64>) -> Result<Option<u64>, Fail> {
    if left.is_none_or(|n| n == 0) {
        return Ok(None);
    }
    eng.probes
        .abort_all(&w.url)
        .await
        .map_err(|e| Fail::from(Cause::DrainFailed { unit: w.unit.clone(), error: format!("POST /abort_request failed: {e}") }))?;
    tracing::warn!(pdctl_unit = %w.unit, "aborted {} request(s) still in flight on {} before its restart", left.unwrap_or(0), w.url);
    Ok(left)
}

/// Write down in `ledger` that rollout `rollout_id` takes `w` (the gateway's entry
/// `router_id`) out of the gateway — before the gateway is touched, so that whatever happens
/// next (a failed gate, a crash, SIGKILL) the drain is found and undone (`hold`: kept out
/// by a coherent switch, see [`Hold`]).
pub(in crate::engine) async fn record_drain<U: Units, L, P>(
    eng: &Engine<U, L, P>,
    ledger: &Ledger,
    w: &Worker,
    router_id: &str,
    rollout_id: &str,
    ctx_hold: Option<Hold>,
) -> Result<(), Fail> {
    let st = eng.units.state(&w.unit).await?;
    let d = Drain {
        unit: w.unit.clone(),
        url: w.url.clone(),
        role: w.role,
        bootstrap_port: w.bootstrap_port,
        invocation_id: st.invocation_id,
        router_id: router_id.to_string(),
        rollout_id: rollout_id.to_string(),
        drained_at: crate::lifecycle::now(),
        hold: ctx_hold,
    };
    ledger.record(&d).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))
}

/// Wait until the gateway no longer lists the worker (smg 1.x lists it as draining for ~5 s
/// and still finishes its requests meanwhile); bounded by drain_timeout. Not for the only
/// worker of its role: nothing else serves meanwhile, so that wait would only lengthen the
/// outage (docs/benchmarks.md, "Figures the code's choices rest on"); the router gate waits
/// out the draining entry before it re-registers the worker. Returns when it was unlisted.
async fn wait_unlisted<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, entries: &[(usize, RouterWorker)], t0: Instant) -> Option<u64> {
    let alone = eng.settings.workers.iter().filter(|o| o.role == w.role).count() == 1;
    'wait: while !alone && t0.elapsed() < eng.settings.rollout.drain_timeout {
        for (r, _) in entries {
            if let Ok(l) = eng.probes.router_workers(*r).await {
                if l.iter().any(|x| crate::config::same_url(&x.url, &w.url)) {
                    tokio::time::sleep(POLL).await;
                    continue 'wait;
                }
            }
        }
        return Some(t0.elapsed().as_millis() as u64);
    }
    None
}

/// Wait (bounded by drain_timeout from `t0`) until the worker runs no request: in flight at
/// the start, left at the end, and a load that could not be read (a warning by the setting,
/// else the failure). Read at least once, even when the wait for the gateway used the whole
/// drain_timeout: what is left is then measured, not assumed.
async fn wait_in_flight<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, t0: Instant) -> Result<(Option<u64>, Option<u64>, Option<Cause>), Fail> {
    let mut left = None;
    let mut at_start = None;
    let mut unknown: Option<Cause> = None;
    loop {
        match eng.probes.in_flight(&w.url).await {
            Ok(n) => {
                at_start.get_or_insert(n);
                left = Some(n);
                if n == 0 || t0.elapsed() >= eng.settings.rollout.drain_timeout {
                    break;
                }
            }
            Err(e) => {
                let c = Cause::LoadUnknown { url: w.url.clone(), error: e.to_string() };
                if rule(crate::events::Step::Drain, &eng.settings).mode == GateMode::Required {
                    return Err(c.into());
                }
                tracing::warn!(pdctl_unit = %w.unit, "{}", c.sentence());
                unknown = Some(c);
                break;
            }
        }
        tokio::time::sleep(POLL).await;
    }
    Ok((at_start, left, unknown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::step_run::detail_of;
    use serde_json::Value;

    fn keys(v: &Value) -> Vec<String> {
        v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default()
    }

    #[test]
    fn the_drain_details_have_the_keys_of_the_contract() {
        let d = Drained {
            warning: None,
            cause_code: None,
            aborted: None,
            aborted_why: None,
            removed_router_id: "i".into(),
            router_load: 0,
            in_flight_left: Some(0),
            replicas_drained: 1,
            in_flight_at_start: Some(1),
            waited_for_requests_ms: 2,
            router_status: None,
            unlisted_after_ms: None,
            drain_settle_secs: None,
            settle_warning: None,
            not_deferred: None,
            waited_ms: 3,
            timed_out: false,
        };
        let mut want = vec![
            "aborted",
            "aborted_why",
            "cause_code",
            "drain_settle_secs",
            "in_flight_at_start",
            "in_flight_left",
            "not_deferred",
            "removed_router_id",
            "replicas_drained",
            "router_load",
            "router_status",
            "settle_warning",
            "timed_out",
            "unlisted_after_ms",
            "waited_for_requests_ms",
            "waited_ms",
            "warning",
        ];
        assert_eq!(keys(&detail_of(&d)), want);
        let h = HeldDrain {
            taken_out: "by the coherent switch",
            hold: None,
            removed_router_id: "i".into(),
            warning: None,
            cause_code: None,
            in_flight_at_start: None,
            in_flight_left: None,
            waited_for_requests_ms: 0,
            waited_ms: 0,
            timed_out: false,
        };
        want = vec![
            "cause_code",
            "hold",
            "in_flight_at_start",
            "in_flight_left",
            "removed_router_id",
            "taken_out",
            "timed_out",
            "waited_for_requests_ms",
            "waited_ms",
            "warning",
        ];
        assert_eq!(keys(&detail_of(&h)), want);
    }
}

/// The drain inside a rollout over fakes of the gateway: when it does not defer the take-out.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

    /// A stop that would SIGKILL the only worker of its role before SGLang's first drain check (5 s
    /// after SIGTERM) would kill it while the gateway still routes to it: its drain takes it out
    /// before the stop, as for any other worker, and says why it was not deferred.
    #[tokio::test]
    async fn the_only_worker_whose_stop_ends_before_the_first_drain_check_is_taken_out_before_it() {
        let w = world();
        let s = with_router(&w, true);
        w.lock().unwrap().timeout_stop.insert("p.service".into(), Duration::from_secs(1));
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let drain = event(&events, "p.service", Step::Drain, Status::Passed).detail.clone();
        assert!(drain["not_deferred"].as_str().is_some_and(|t| t.contains("TimeoutStopSec=1.0s")), "{drain}");
        let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
        let at = |prefix: &str| log.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {log:?}"));
        assert!(at("deregister w1 after 0 restart(s)") < at("register http://p"), "out before its restart: {log:?}");
    }
}
