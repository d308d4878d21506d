//! The only worker of its role keeps serving through its stop's drain: its taking out of the
//! gateway is deferred to its server's first drain check ([`Deferred`]), when nothing is lost by
//! it — how busy it is looked at first, its `TimeoutStopSec=` must reach past that check, and on
//! smg 1.x its entry's settle is set to 0 so that the gateway removes it at once.

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
    /// Taken out this long after its SIGTERM at the latest.
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
    /// Looks that found it busy.
    busy_looks: u32,
    /// Looks in all.
    looks: u32,
    /// smg's settle set for it (0), when every replica took it.
    drain_settle_secs: Option<u64>,
    /// What the replicas that refused the settle said.
    warning: Option<String>,
}

/// A drain whose taking out of the gateway waits for the stop: the worker is the only one of its
/// role the gateway admits, so taking it out before its stop only starts the outage early. SGLang
/// 0.5.23 keeps serving new requests while SIGTERM drains it (only `/health` and `/ready` answer
/// 503; `generate_request` has no shutdown check) and looks for requests left only every 5 s
/// from its start (`sigterm_watchdog`, `managers/tokenizer_manager.py:3508-3545`): 0-5 s of a
/// stop that, taken out first, would all be outage. So the restart takes it out at the first
/// `Gracefully exiting... Remaining number of requests N` line of the old process: with N = 0 the
/// server exits now; with N > 0 the gateway stops sending and the next check, 5 s later, finds
/// them done (the same wait a drain before the stop would have had, rounded up to a check). Or
/// before that check, at a deadline after SIGTERM set by how busy it was ([`take_out_by`]), so
/// that a busy worker's requests end before the check instead of holding the stop 5 s more. At
/// the latest when the restart job ends. The ledger is written before the stop, as for any drain.
#[derive(Debug, Clone)]
pub(in crate::engine) struct Deferred {
    /// Each replica that lists the worker, and the worker's id there.
    pub(in crate::engine) entries: Vec<(usize, String)>,
    /// Looks before its stop that found it running a request, of all looks: where the deadline
    /// after SIGTERM starts ([`take_out_by`]); the restart goes on looking during the stop
    /// ([`StopLook`]).
    pub(in crate::engine) busy: (u32, u32),
}

/// The look at a deferred worker's load that goes on after its SIGTERM, while it still serves:
/// every look adds to the share the look before the stop began, and the deadline
/// ([`take_out_by`]) follows the share. A look before the stop long enough to tell a busy
/// worker from an idle one would itself be part of every drain's time (it was 1 s); looking on
/// while the stop runs costs nothing, since the worker serves then anyway.
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct StopLook {
    busy: (u32, u32),
    /// Looks tried, read or not.
    tried: u32,
}

impl StopLook {
    pub(in crate::engine) fn from(d: &Deferred) -> Self {
        StopLook { busy: d.busy, tried: d.busy.1 }
    }

    /// How long after SIGTERM the worker is to be taken out, by what the looks found so far;
    /// `None` before [`MIN_LOOKS`] looks were tried (an unreadable one counts as tried, so that
    /// a load that cannot be read does not hold the deadline off).
    pub(in crate::engine) fn deadline(&self) -> Option<Duration> {
        (self.tried >= MIN_LOOKS).then(|| take_out_by(self.busy))
    }

    /// One more look: `Some(n)` requests in flight, `None` unreadable (tried, but not in the share).
    pub(in crate::engine) fn saw(&mut self, in_flight: Option<u64>) {
        self.tried += 1;
        if let Some(n) = in_flight {
            self.busy = (self.busy.0 + u32::from(n > 0), self.busy.1 + 1);
        }
    }

    /// The share of looks that found it busy, and how many looks there were.
    pub(in crate::engine) fn share(&self) -> (f64, u32) {
        (busy_share(self.busy), self.busy.1)
    }
}

/// The looks the deadline is judged by at the least: as many as the 1 s look before the stop
/// used to take (every 20 ms). Judged on fewer (the 250 ms look alone), a worker's share is
/// noisier and the deadline fires early more often: under the model of `scripts/model-take-out`
/// with requests that outlive an early take-out, 0.05-0.14 s more outage on average.
pub(in crate::engine) const MIN_LOOKS: u32 = 50;

/// How often a deferred worker's load is read, before and during its stop.
pub(in crate::engine) const LOAD_POLL: Duration = Duration::from_millis(20);

/// When, after its SIGTERM, a deferred worker that ran requests in a fraction `busy` of the
/// looks at it is taken out of the gateway if its server's first drain check has not come yet.
/// That check comes at a moment U spread evenly over the 5 s after SIGTERM (the watchdog wakes
/// every 5 s from the server's first request). Taken out at x before it, the outage starts U − x
/// early and the check finds its requests done (they end within x); taken out at the check
/// itself, the outage starts at U but the check counts a request with probability `busy`, and
/// SGLang then waits 5 s more. The expected extra outage, (5 − x)²/10 + busy·x, is least at
/// x = 5 s × (1 − busy): at the check alone for an idle worker, 2.5 s after SIGTERM for one busy
/// half the time (the most the deferral takes).
fn take_out_by(busy: (u32, u32)) -> Duration {
    crate::sglang::stop::WATCHDOG_PERIOD.mul_f64((1.0 - busy_share(busy)).clamp(0.0, 1.0))
}

/// The share of looks that found the worker running a request: `(busy, looks)`; 0 without a look.
fn busy_share((busy, looks): (u32, u32)) -> f64 {
    f64::from(busy) / f64::from(looks.max(1))
}

/// How long the only worker of its role is looked at before its drain is deferred: a first
/// share of how busy it is, which the restart refines during the stop ([`StopLook`]). Each
/// look's time is the drain step's own; 250 ms gives a dozen looks.
const LOAD_LOOK: Duration = Duration::from_millis(250);

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
/// and its requests counted first. Then only when it is expected to shorten the outage and
/// costs the requests it runs nothing:
/// - shorter, however busy it is: drained before its stop, its outage holds the drain's wait and
///   then its first drain check, 0-5 s after SIGTERM (2.5 s on average); deferred, it is taken
///   out at that check or at the deadline [`take_out_by`] sets from how busy it is (its load
///   read every 20 ms for 250 ms while it serves, [`LOAD_LOOK`], and on through the stop,
///   [`StopLook`]), whose expected extra outage,
///   5·b − 2.5·b² s for a busy share b, is at most those 2.5 s (b = 1: taken out at SIGTERM, the
///   drain's wait spent serving instead) — when what it runs ends before the check; requests that
///   outlive an early take-out cost more (`scripts/model-take-out` models both). An earlier rule also refused a worker busy half the
///   time or more; it predates the deadline, which made it redundant, and it put a loaded
///   `together` pair's whole stop inside the window;
/// - nothing lost: a drain before the stop gives what it runs `drain_timeout` and then the
///   stop's `TimeoutStopSec=`; deferred, the stop's bound alone. So it runs none at the end of
///   that look (looked for up to [`IDLE_SEARCH`] more), or its `TimeoutStopSec=` covers
///   `drain_timeout` and two drain checks;
/// - never killed while routed to: its `TimeoutStopSec=` reaches past its first drain check
///   ([`FIRST_CHECK_MARGIN`]); a shorter stop SIGKILLs it while the gateway still sends it
///   requests.
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
    let (mut samples, mut busy) = (0u32, 0u32);
    let mut last = None;
    while t0.elapsed() < LOAD_LOOK || (!covers && last.is_some_and(|n| n > 0) && t0.elapsed() < LOAD_LOOK + IDLE_SEARCH) {
        match eng.probes.in_flight(&w.url).await {
            Ok(n) => {
                if t0.elapsed() < LOAD_LOOK {
                    samples += 1;
                    busy += u32::from(n > 0);
                }
                last = Some(n);
            }
            Err(e) => return Err(format!("its load could not be read ({e})")),
        }
        tokio::time::sleep(LOAD_POLL).await;
    }
    if samples == 0 {
        return Err(format!("its load was not read within {:.2} s", LOAD_LOOK.as_secs_f64()));
    }
    let why = match last {
        Some(0) => "it runs no request now".to_string(),
        _ if covers => format!(
            "its TimeoutStopSec={} covers drain_timeout and two of SGLang's drain checks",
            stop_bound.map(|t| format!("{}s", t.as_secs())).unwrap_or_else(|| "infinity".into())
        ),
        _ => return Err("it still runs a request, and its TimeoutStopSec alone would give that less time than drain_timeout and the stop".into()),
    };
    Ok(Deferral { why, in_flight: last, busy: (busy, samples) })
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
        take_out_by_ms: take_out_by(busy).as_millis() as u64,
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
    (detail, Some(Deferred { entries: entries.iter().map(|(r, e)| (*r, e.id.clone())).collect(), busy }))
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
    fn the_look_during_the_stop_moves_the_deadline_once_it_has_enough_looks() {
        let mut look = StopLook::from(&Deferred { entries: vec![], busy: (0, 12) });
        assert_eq!(look.deadline(), None, "12 looks: not yet judged");
        for _ in 0..(MIN_LOOKS - 12) {
            look.saw(Some(1));
        }
        assert_eq!(look.share(), (38.0 / 50.0, 50));
        assert_eq!(look.deadline().map(|d| d.as_millis()), Some(1200), "busy in 38 of 50 looks: 5 s × 0.24");
        let mut unread = StopLook::from(&Deferred { entries: vec![], busy: (0, 0) });
        for _ in 0..MIN_LOOKS {
            unread.saw(None);
        }
        assert_eq!(unread.deadline(), Some(Duration::from_secs(5)), "a load never read holds nothing off: as idle");
    }

    #[test]
    fn a_busier_worker_is_taken_out_sooner_before_its_drain_check() {
        let ms = |busy| take_out_by(busy).as_millis();
        assert_eq!(ms((0, 50)), 5000, "idle: at the check itself");
        assert_eq!(ms((10, 50)), 4000);
        assert_eq!(ms((25, 50)), 2500, "busy half the time: 2.5 s after SIGTERM");
        assert_eq!(ms((0, 0)), 5000, "no look: as idle");
        assert_eq!(ms((60, 50)), 0, "never past SIGTERM itself");
    }
}
