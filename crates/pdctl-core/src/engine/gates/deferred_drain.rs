//! The only worker of its role keeps serving through its stop's drain: its taking out of the
//! gateway is deferred to its server's first drain check ([`Deferred`]), or just before the
//! second when the first counts requests, when nothing is lost by it — it runs no request now
//! or its `TimeoutStopSec=` covers what a drain would have given them and reaches past that
//! check, and on smg 1.x its entry's settle is set to 0 so that the gateway removes it at once.

use std::time::{Duration, Instant};

use crate::config::Worker;
use crate::engine::context::Ctx;
use crate::engine::machine::Engine;
use crate::ports::{Probes, RouterWorker, Units};

/// The drain step's detail when the taking out waits for the stop ([`Deferred`]).
#[derive(serde::Serialize)]
pub(in crate::engine) struct DeferredDrain {
    /// Deferred, and why that loses nothing.
    taken_out: String,
    /// Taken out this long after its SIGTERM at the latest while its stop runs ([`latest_take_out`]).
    take_out_by_ms: u64,
    /// The gateway's id of the entry to remove.
    removed_router_id: Option<String>,
    /// Its load in the gateway.
    router_load: Option<i64>,
    /// The status the gateway lists it with.
    router_status: Option<String>,
    /// Replicas that list it.
    replicas_drained: usize,
    /// Requests in flight at the last look.
    in_flight_at_start: Option<u64>,
    /// Looks at its load that found it busy.
    busy_looks: u32,
    /// Looks in all (one, or more while it was looked at for a moment with no request).
    looks: u32,
    /// smg's settle set for it (0), when every replica took it.
    drain_settle_secs: Option<u64>,
    /// What the replicas that refused the settle said.
    warning: Option<String>,
}

/// A drain whose taking out of the gateway waits for the stop: the worker is the only one of its
/// role the gateway admits, so taking it out before its stop only starts the outage early. SGLang
/// 0.5.23 keeps serving new requests while SIGTERM drains it (only `/health` and `/ready` answer
/// 503; `generate_request` has no shutdown check) and looks for requests left only at its
/// watchdog's next 5 s tick, then every 5 s after each look (`sigterm_watchdog`,
/// `managers/tokenizer_manager.py:3508-3545`); it exits at the first look that counts none. So
/// the restart leaves it in the gateway through that first look ([`take_out_after_check`]):
/// - the look counts none (`Gracefully exiting... Remaining number of requests 0`): the server
///   exits now, and is taken out now — the outage starts where the server's own does;
/// - the look counts requests: SGLang waits 5 s more, and the worker serves on meanwhile; it is
///   taken out [`STAY_MARGIN`] before the next look, so that what it runs then ends before it;
/// - no look logged [`FIRST_CHECK_BY`] after SIGTERM (an older server, a journal behind): then.
///
/// Sooner when it serves nothing any more: its old process gone, the gateway's own health checks
/// stopped routing to it, or (a pair restarted together) the other half left the gateway — a
/// prefill without its decode, or a decode without its prefill, is sent no request. At the latest
/// when the restart job ends. The ledger is written before the stop, as for any drain.
#[derive(Debug, Clone)]
pub(in crate::engine) struct Deferred {
    /// Each replica that lists the worker, and the worker's id there.
    pub(in crate::engine) entries: Vec<(usize, String)>,
}

/// How long before SGLang's second drain look a worker whose first look counted requests is
/// taken out of the gateway: what the gateway sent it until then must end within this to let
/// the second look find it done. Under `scripts/model-take-out` (requests arriving at random,
/// lasting an exponential time) staying in through the first look and leaving 1 s before the
/// second has 2-4× less expected outage before the exit than any deadline set before the first
/// look from how busy the worker was (40 requests/s of 20 ms: 0.54 s against 2.0 s; one of 5 s
/// every 5 s: 4.3 against 6.1), and loses only on a saturated worker (+0.4 s).
pub(in crate::engine) const STAY_MARGIN: Duration = Duration::from_secs(1);

/// How long after SIGTERM a deferred worker stays in the gateway without a drain look logged: the
/// first look comes within [`crate::sglang::stop::WATCHDOG_PERIOD`]; 1 s more for the journal.
pub(in crate::engine) const FIRST_CHECK_BY: Duration = Duration::from_secs(6);

/// When, after SGLang's first drain look that counted `remaining` requests, a deferred worker
/// leaves the gateway: at once when it counted none (the server exits now; an unreadable count
/// too), else [`STAY_MARGIN`] before the next look.
pub(in crate::engine) fn take_out_after_check(remaining: Option<u64>) -> Duration {
    match remaining {
        Some(n) if n > 0 => crate::sglang::stop::WATCHDOG_PERIOD.saturating_sub(STAY_MARGIN),
        _ => Duration::ZERO,
    }
}

/// The latest a deferred worker leaves the gateway after its SIGTERM while its stop runs: a first
/// look at the end of the first watchdog period that counted requests, and the stay after it.
pub(in crate::engine) fn latest_take_out() -> Duration {
    (crate::sglang::stop::WATCHDOG_PERIOD + take_out_after_check(Some(1))).max(FIRST_CHECK_BY)
}

/// How often a deferred worker's load is read while it is looked at for a moment with no request
/// in flight ([`IDLE_SEARCH`]).
const LOAD_POLL: Duration = Duration::from_millis(20);

/// When its `TimeoutStopSec=` would not give a busy worker's requests `drain_timeout` and the
/// stop: how much longer it is looked at for a moment with no request in flight (it serves
/// meanwhile).
const IDLE_SEARCH: Duration = Duration::from_secs(1);

/// How much longer than SGLang's first drain check ([`crate::sglang::stop::WATCHDOG_PERIOD`] after
/// SIGTERM) a deferred worker's `TimeoutStopSec=` must be: a stop that SIGKILLs it before that
/// check kills it while the gateway still routes to it (every request sent then fails, and on smg
/// each counts against the decode's breaker too).
const FIRST_CHECK_MARGIN: Duration = Duration::from_secs(2);

/// Why a drain is deferred, and what its look at the worker's load saw.
#[derive(Debug)]
pub(super) struct Deferral {
    /// Why the requests it runs lose nothing by it.
    why: String,
    /// Requests in flight at the last look.
    in_flight: Option<u64>,
    /// Looks that found a request running, of all looks.
    busy: (u32, u32),
}

/// Whether this drain leaves the taking out to the restart ([`Deferred`]), given that no other
/// worker of its role serves; `Err`: why not (said in the drain's detail). Not for a coherent
/// switch's group (held out on purpose), nor when what is left after the drain is to be
/// aborted (a stale decode's requests, `abort_after_drain_timeout`): those need the worker out
/// and its requests counted first. Then only when it costs the requests it runs nothing — the
/// outage is shorter however busy it is: drained before its stop, the outage holds the drain's
/// wait and then the server's first drain look, 0-5 s after SIGTERM; deferred, it starts at that
/// look when it counts none, or [`STAY_MARGIN`] before the second when it counts some:
/// - nothing lost: a drain before the stop gives what it runs `drain_timeout` and then the
///   stop's `TimeoutStopSec=`; deferred, the stop's bound alone. So it runs none now (looked at
///   every 20 ms for up to [`IDLE_SEARCH`] while it serves), or its `TimeoutStopSec=` covers
///   `drain_timeout` and two drain checks;
/// - never killed while routed to: its `TimeoutStopSec=` reaches past its first drain check
///   ([`FIRST_CHECK_MARGIN`]); a shorter stop SIGKILLs it while the gateway still sends it
///   requests.
///
/// An earlier rule looked at its load for 1 s (then 250 ms) to set a deadline before the first
/// look from how busy it was; staying in through the look needs no share, and that look was most
/// of the drain step's own time.
pub(super) async fn defers_take_out<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, ctx: Ctx<'_>) -> Result<Deferral, String> {
    if ctx.scope.hold.is_some() {
        return Err("held out by the coherent switch".into());
    }
    if ctx.abort_in_flight || eng.settings.rollout.abort_after_drain_timeout {
        return Err("what it runs after the drain is to be aborted".into());
    }
    // `None`: TimeoutStopSec=infinity.
    let stop_bound = match eng.units.config(&w.unit).await {
        Ok(c) => c.timeout_stop,
        Err(e) => return Err(format!("its TimeoutStopSec could not be read ({e})")),
    };
    let first_check = crate::sglang::stop::WATCHDOG_PERIOD + FIRST_CHECK_MARGIN;
    if let Some(t) = stop_bound.filter(|t| *t < first_check) {
        return Err(format!(
            "its TimeoutStopSec={:.1}s would SIGKILL it before SGLang's first drain check ({} s after SIGTERM), while the gateway still routes to it",
            t.as_secs_f64(),
            crate::sglang::stop::WATCHDOG_PERIOD.as_secs()
        ));
    }
    let covers = stop_bound.is_none_or(|t| t >= eng.settings.rollout.drain_timeout + 2 * crate::sglang::stop::WATCHDOG_PERIOD);
    let t0 = Instant::now();
    let (mut looks, mut busy) = (0u32, 0u32);
    let last = loop {
        let n = eng.probes.in_flight(&w.url).await.map_err(|e| format!("its load could not be read ({e})"))?;
        (looks, busy) = (looks + 1, busy + u32::from(n > 0));
        if n == 0 || covers || t0.elapsed() >= IDLE_SEARCH {
            break n;
        }
        tokio::time::sleep(LOAD_POLL).await;
    };
    let why = match last {
        0 => "it runs no request now".to_string(),
        _ if covers => format!(
            "its TimeoutStopSec={} covers drain_timeout and two of SGLang's drain checks",
            stop_bound.map(|t| format!("{}s", t.as_secs())).unwrap_or_else(|| "infinity".into())
        ),
        _ => return Err("it still runs a request, and its TimeoutStopSec alone would give that less time than drain_timeout and the stop".into()),
    };
    Ok(Deferral { why, in_flight: Some(last), busy: (busy, looks) })
}

/// The deferred drain's detail: nothing is taken out yet. On smg 1.x each entry's
/// `drain_settle_secs` is set to 0 first: the gateway then removes it at once when the
/// restart takes it out (the server has said it is done by then; the default 5 s would keep
/// the restarted worker from being registered again for what is left of them). Refused, it
/// is a warning: the router gate waits the settle out.
pub(super) async fn defer<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    entries: &[(usize, RouterWorker)],
    d: Deferral,
) -> (DeferredDrain, Option<Deferred>) {
    let Deferral { why, in_flight, busy } = d;
    let (settle, settle_warnings) = settle_now(eng, w, entries).await;
    let role = w.role.as_str();
    let detail = DeferredDrain {
        taken_out: format!(
            "deferred: the only {role} worker in the gateway serves through its stop's drain and is taken out at its server's first drain check ({why})"
        ),
        take_out_by_ms: latest_take_out().as_millis() as u64,
        removed_router_id: entries.first().map(|(_, e)| e.id.clone()),
        router_load: entries.first().map(|(_, e)| e.load),
        router_status: entries.first().and_then(|(_, e)| e.status.clone()),
        replicas_drained: entries.len(),
        in_flight_at_start: in_flight,
        busy_looks: busy.0,
        looks: busy.1,
        drain_settle_secs: settle,
        warning: (!settle_warnings.is_empty()).then(|| settle_warnings.join("; ")),
    };
    (detail, Some(Deferred { entries: entries.iter().map(|(r, e)| (*r, e.id.clone())).collect() }))
}

/// smg 1.x (a replica that lists a `status`): each entry's `drain_settle_secs` set to 0, so
/// that its removal takes it out at once. Returns 0 when every such replica took it (`None`:
/// no replica has a settle, or one refused) and what the refusals said.
pub(super) async fn settle_now<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, entries: &[(usize, RouterWorker)]) -> (Option<u64>, Vec<String>) {
    let mut refused = Vec::new();
    let mut set = false;
    for (r, e) in entries.iter().filter(|(_, e)| e.status.is_some()) {
        match eng.probes.settle_now(*r, &e.id).await {
            Ok(()) => set = true,
            Err(er) => refused.push(format!("the gateway did not take drain_settle_secs = 0 for {}: {er}", w.url)),
        }
    }
    ((set && refused.is_empty()).then_some(0), refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::step_run::detail_of;
    use serde_json::Value;

    #[test]
    fn the_deferred_drains_detail_has_the_keys_of_the_contract() {
        let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
        let f = DeferredDrain {
            taken_out: "deferred".into(),
            take_out_by_ms: 1,
            removed_router_id: None,
            router_load: None,
            router_status: None,
            replicas_drained: 1,
            in_flight_at_start: None,
            busy_looks: 0,
            looks: 0,
            drain_settle_secs: None,
            warning: None,
        };
        let want = vec![
            "busy_looks",
            "drain_settle_secs",
            "in_flight_at_start",
            "looks",
            "removed_router_id",
            "replicas_drained",
            "router_load",
            "router_status",
            "take_out_by_ms",
            "taken_out",
            "warning",
        ];
        assert_eq!(keys(&detail_of(&f)), want);
    }

    #[test]
    fn a_worker_stays_in_through_a_drain_look_that_counts_requests_until_just_before_the_next() {
        assert_eq!(take_out_after_check(Some(0)), Duration::ZERO, "none left: the server exits now");
        assert_eq!(take_out_after_check(None), Duration::ZERO, "a count that cannot be read: out now");
        assert_eq!(take_out_after_check(Some(3)), Duration::from_secs(4), "1 s before the look 5 s later");
        assert_eq!(latest_take_out(), Duration::from_secs(9), "a first look 5 s after SIGTERM that counted requests");
    }
}
