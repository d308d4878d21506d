//! A worker's stop, as SGLang 0.5.23 does it: on SIGTERM it logs `SIGTERM received. … Draining
//! requests and shutting down...`, answers `/health` and `/ready` 503, and every 5 s (its
//! `sigterm_watchdog`) logs `Gracefully exiting... Remaining number of requests N. …` until no
//! request is left — with no timeout of its own (`managers/tokenizer_manager.py`). systemd's
//! `TimeoutStopSec=` (90 s by default) then bounds it with SIGKILL. So a restart job lasts the
//! stop (0-5 s with nothing in flight, as long as the longest request otherwise) plus the start.
//!
//! That drain happens only when SIGTERM reaches SGLang's main process alone. systemd's default
//! `KillMode=control-group` sends it to every process of the unit: the scheduler subprocess dies
//! of it at once, the main process's watchdog logs `Subprocess scheduler_0 (pid=…) crashed with
//! exit code -15. Triggering SIGQUIT for cleanup...` (`utils/watchdog.py`), its SIGQUIT handler
//! logs `SIGQUIT received… It usually means one child failed.`, sleeps 5 s "before crash
//! diagnostics" and SIGKILLs its own tree (`managers/tokenizer_manager.py`): the unit ends
//! `code=killed, status=9/KILL` ~5.5 s after the SIGTERM and whatever ran on the server is lost
//! (measured on the real 0.5.23 server under systemd 252). `KillMode=mixed` (SIGTERM to the main
//! process, SIGKILL to the rest only at `TimeoutStopSec=`) gives the drain: preflight refuses
//! `control-group` ([`kill_mode_risk`]).
//!
//! This file decides how long pdctl waits for a restart job, reads what ended a stop and why it
//! took as long as it did from the unit's journal, and says in preflight when a stop could be
//! SIGKILLed with work in flight.

use std::time::Duration;

use serde::Serialize;

/// The stop's SIGTERM line (a substring; `managers/tokenizer_manager.py`).
pub const SIGTERM_MARK: &str = "Draining requests and shutting down";

/// The watchdog's exit without a drain (`managers/tokenizer_manager.py`, `sigterm_watchdog`):
/// "Signal SIGTERM received while health check failed. Force exiting." on a server whose status
/// is UnHealthy (a `/health` that waited more than 20 s, a failed PD warm-up), or "… while force
/// shutdown flag set. Force exiting." with `SGL_FORCE_SHUTDOWN`.
pub const FORCE_EXIT_MARK: &str = "Force exiting.";

/// A failed PD warm-up (`entrypoints/http_server.py`): the server logs its ready line all the
/// same, with its status UnHealthy.
pub const WARMUP_FAILED_MARK: &str = "Disaggregation warmup failed";
/// The watchdog's line, followed by the number of requests left.
pub const REMAINING_MARK: &str = "Gracefully exiting... Remaining number of requests ";
/// SGLang 0.5.23 serves new requests while SIGTERM drains it (`generate_request` never looks at
/// `gracefully_exit`): what lets the only worker of its role stay in the gateway until its first
/// drain check (the deferred drain). Checked against the wheel by the conformance test.
pub const SERVES_WHILE_DRAINING: bool = true;
/// How often SGLang's watchdog checks (`asyncio.sleep(5)`): a stop with nothing in flight still
/// takes up to this long.
pub const WATCHDOG_PERIOD: Duration = Duration::from_secs(5);

/// After its drain SGLang 0.5.23 waits up to 15 s for its scheduler processes to exit
/// (`_SCHEDULER_EXIT_TIMEOUT_SECS`, `managers/tokenizer_manager.py`) before the process ends: a
/// stop's bound must leave room for it.
pub const SCHEDULER_EXIT_WAIT: Duration = Duration::from_secs(15);
/// systemd's own lines when a stop reached `TimeoutStopSec=` (`State 'stop-sigterm' timed out.
/// Killing.`) and when it killed the process.
const KILLED_MARKS: &[&str] = &["timed out. Killing", "with signal SIGKILL", "status=9/KILL"];
/// SGLang's lines when a child process died and it takes its own process tree down
/// (`utils/watchdog.py`, `managers/tokenizer_manager.py`).
const TREE_KILL_MARKS: &[&str] = &["Triggering SIGQUIT for cleanup", "It usually means one child failed"];
/// systemd's line when the stop reached `TimeoutStopSec=`.
const TIMEOUT_MARK: &str = "timed out. Killing";
/// The longest pdctl waits for a stop whose `TimeoutStopSec=` is infinity.
pub const UNBOUNDED_STOP_WAIT: Duration = Duration::from_secs(3600);

/// How long pdctl waits for a restart job: the stop (bounded by the unit's `TimeoutStopSec=`,
/// [`UNBOUNDED_STOP_WAIT`] when infinity) plus `job_timeout` for the start.
pub fn job_limit(job_timeout: Duration, timeout_stop: Option<Duration>) -> Duration {
    job_timeout + timeout_stop.unwrap_or(UNBOUNDED_STOP_WAIT).min(UNBOUNDED_STOP_WAIT)
}

/// How a stop ended (the stop report's `ended_by`, in snake case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    /// The manager's `TimeoutStopSec=` ran out: SIGKILL.
    TimeoutSigkill,
    /// SGLang killed its own process tree after a child died.
    SglangTreeKill,
    /// SGLang's watchdog force-exited an unhealthy server.
    ForceExit,
    /// SGLang drained its requests after SIGTERM and exited.
    Drained,
    /// It exited without a drain SGLang logged.
    Exited,
}

impl EndedBy {
    /// SGLang ended it itself, without waiting for what ran on it (not the manager's timeout).
    pub fn by_sglang_itself(self) -> bool {
        matches!(self, EndedBy::SglangTreeKill | EndedBy::ForceExit)
    }
}

/// What one stop took and why, from the unit's timestamps and its journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StopReport {
    /// From leaving `active` to `inactive` (`None`: systemd gave no timestamps). A stop for host
    /// maintenance whose unit systemd unloaded after it (nothing references it) takes its stop
    /// job's time instead: the job runs from the SIGTERM to `inactive`.
    pub stop_ms: Option<u64>,
    /// The unit's `TimeoutStopSec=` (`None`: infinity).
    pub timeout_stop_ms: Option<u64>,
    /// Requests the server reported at its first watchdog check after SIGTERM (`None`: it logged
    /// none, e.g. an older SGLang that exits at once).
    pub requests_at_first_check: Option<u64>,
    /// The server's watchdog checks seen (one every 5 s).
    pub checks: u32,
    /// systemd killed it at `TimeoutStopSec=`.
    pub killed: bool,
    /// What ended the process: `drained` (SGLang's own exit after its drain), `timeout_sigkill`
    /// (systemd's SIGKILL at `TimeoutStopSec=`), `sglang_tree_kill` (a child process died — under
    /// `KillMode=control-group`, of the stop's own SIGTERM — and SGLang SIGKILLed its whole tree:
    /// nothing drained), `force_exit` (SGLang's watchdog exited at its first check without
    /// waiting for the requests in flight: the server was UnHealthy, or `SGL_FORCE_SHUTDOWN`),
    /// `exited` (it exited without logging a drain).
    pub ended_by: EndedBy,
    /// Why the stop took that long, in one sentence.
    pub why: String,
}

/// Read a stop from the unit's last journal lines (its own and its manager's) and its duration.
/// Only the lines after the last SIGTERM line count: they belong to this stop.
pub fn report(lines: &[String], stop: Option<Duration>, timeout_stop: Option<Duration>) -> StopReport {
    let start = lines.iter().rposition(|l| l.contains(SIGTERM_MARK));
    let ours: &[String] = match start {
        Some(i) => &lines[i..],
        None => &[],
    };
    let counts: Vec<u64> = ours.iter().filter_map(|l| remaining_in(l)).collect();
    let tree_kill = ours.iter().any(|l| TREE_KILL_MARKS.iter().any(|m| l.contains(m)));
    let forced = ours.iter().find(|l| l.contains(FORCE_EXIT_MARK));
    let timed_out = ours.iter().any(|l| l.contains(TIMEOUT_MARK)) || matches!((stop, timeout_stop), (Some(s), Some(t)) if s >= t);
    let killed = timed_out || !tree_kill && ours.iter().any(|l| KILLED_MARKS.iter().any(|m| l.contains(m)));
    let ms = |d: Duration| d.as_millis() as u64;
    let took = stop.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_else(|| "an unknown time".into());
    let first = counts.first().copied();
    let last = counts.last().copied();
    let why = if killed {
        format!(
            "the stop took {took} and ended in SIGKILL at TimeoutStopSec={}{}",
            timeout_stop.map(|t| format!("{}s", t.as_secs())).unwrap_or_else(|| "infinity".into()),
            match last {
                Some(n) if n > 0 => format!(" with {n} request(s) still in flight"),
                _ => String::new(),
            }
        )
    } else if tree_kill {
        format!(
            "the stop took {took} and was not a drain: a child process of SGLang died (under KillMode=control-group the stop's SIGTERM reaches its scheduler too) and SGLang SIGKILLed its own process tree{}; set KillMode=mixed on the unit",
            match first {
                Some(n) if n > 0 => format!(" with {n} request(s) in flight"),
                _ => String::new(),
            }
        )
    } else if let Some(line) = forced {
        let because = if line.contains("force shutdown flag") {
            "SGL_FORCE_SHUTDOWN is set on the unit".to_string()
        } else if lines.iter().any(|l| l.contains(WARMUP_FAILED_MARK)) {
            "the server was UnHealthy since its PD warm-up failed (\"Disaggregation warmup failed\" in its log, though it logged the ready line)".to_string()
        } else {
            "the server was UnHealthy (its health check had failed: a /health that waited more than 20 s, as behind a long pause or load, marks it so)"
                .to_string()
        };
        format!(
            "the stop took {took} and was not a drain: {because}, so SGLang force-exited at its first {} s watchdog check without waiting for the requests in flight (it logged \"{FORCE_EXIT_MARK}\")",
            WATCHDOG_PERIOD.as_secs(),
        )
    } else if start.is_none() {
        format!("the stop took {took}; the server logged no SIGTERM drain (it exited without waiting for requests)")
    } else {
        match first {
            Some(n) if n > 0 => {
                format!("the stop took {took}: SGLang waited for {n} request(s) in flight to finish, checking every {} s", WATCHDOG_PERIOD.as_secs())
            }
            _ => format!("the stop took {took}: nothing was in flight; SGLang exits at its next {} s watchdog check", WATCHDOG_PERIOD.as_secs()),
        }
    };
    let ended_by = match (killed, tree_kill, forced.is_some(), start.is_some()) {
        (true, _, _, _) => EndedBy::TimeoutSigkill,
        (false, true, _, _) => EndedBy::SglangTreeKill,
        (false, false, true, _) => EndedBy::ForceExit,
        (false, false, false, true) => EndedBy::Drained,
        (false, false, false, false) => EndedBy::Exited,
    };
    StopReport {
        stop_ms: stop.map(ms),
        timeout_stop_ms: timeout_stop.map(ms),
        requests_at_first_check: first,
        checks: counts.len() as u32,
        killed,
        ended_by,
        why,
    }
}

/// The requests a watchdog line reports left (`None`: not such a line).
pub fn remaining_in(line: &str) -> Option<u64> {
    line.split(REMAINING_MARK).nth(1).and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()).and_then(|n| n.parse().ok())
}

/// A watchdog line in a few words: "N request(s) left" ("a check" when unreadable).
pub fn remaining_part(line: &str) -> String {
    match remaining_in(line) {
        Some(n) => format!("{n} request(s) left"),
        None => "a check".into(),
    }
}

/// The stop between two timestamps (µs since the epoch) of systemd: leaving `active` and then
/// entering `inactive`.
pub fn duration(active_exit_us: u64, inactive_enter_us: u64) -> Option<Duration> {
    (active_exit_us > 0 && inactive_enter_us >= active_exit_us).then(|| Duration::from_micros(inactive_enter_us - active_exit_us))
}

/// Preflight: when this worker's stop could be SIGKILLed with work in flight. `drain_timeout`:
/// how long the drain waits for requests before the stop (what is left then holds the stop);
/// `bootstrap_timeout`: a prefill's hold on rooms for a decode that never fetches them (a stop
/// waits for those requests too).
pub fn risks(unit: &str, timeout_stop: Option<Duration>, drain_timeout: Duration, bootstrap_timeout: Option<Duration>) -> Vec<String> {
    let Some(t) = timeout_stop else { return Vec::new() };
    let secs = |d: Duration| format!("{}s", d.as_secs());
    let mut out = Vec::new();
    if let Some(b) = bootstrap_timeout.filter(|b| *b + WATCHDOG_PERIOD > t) {
        out.push(format!(
            "{unit}: a stop waits for rooms held for a decode up to SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT={} and then SGLang's next {} s drain check ({} in all), longer than TimeoutStopSec={}: if a decode dies with rooms held, systemd SIGKILLs this prefill with work in flight; set TimeoutStopSec={} (that, up to {} more while SGLang joins its schedulers, and a margin) or a shorter bootstrap timeout",
            secs(b),
            WATCHDOG_PERIOD.as_secs(),
            secs(b + WATCHDOG_PERIOD),
            secs(t),
            secs(b + WATCHDOG_PERIOD + SCHEDULER_EXIT_WAIT + Duration::from_secs(5)),
            secs(SCHEDULER_EXIT_WAIT),
        ));
    }
    if t < WATCHDOG_PERIOD + Duration::from_secs(1) {
        out.push(format!(
            "{unit}: TimeoutStopSec={} is shorter than SGLang's {} s SIGTERM watchdog: even an idle stop can be SIGKILLed; set TimeoutStopSec=30s or more",
            secs(t),
            WATCHDOG_PERIOD.as_secs()
        ));
    } else if drain_timeout > t {
        out.push(format!(
            "{unit}: drain_timeout ({}) is longer than TimeoutStopSec={}: requests a drain could not wait out are then SIGKILLed within {}",
            secs(drain_timeout),
            secs(t),
            secs(t)
        ));
    }
    out
}

/// Preflight: a `KillMode=` under which the stop cannot drain (`control-group`: systemd's SIGTERM
/// reaches SGLang's scheduler, which dies of it, and SGLang then SIGKILLs its own tree). The
/// sentence names the drop-in that fixes it, with a `TimeoutStopSec=` above the drain.
pub fn kill_mode_risk(unit: &str, kill_mode: Option<&str>, drain_timeout: Duration) -> Option<String> {
    (kill_mode == Some("control-group")).then(|| {
        format!(
            "{unit} has KillMode=control-group: systemd's SIGTERM also reaches SGLang's scheduler, which dies of it, and the server then SIGKILLs its own process tree about 5 s later, so nothing in flight on it finishes; add a drop-in (systemctl edit {unit}) with [Service] KillMode=mixed and TimeoutStopSec={}s, then systemctl daemon-reload",
            (drain_timeout + Duration::from_secs(30)).as_secs()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contracts_example_of_the_kill_mode_refusal_is_this_sentence() {
        let example = crate::cause::Cause::examples().into_iter().find_map(|c| match c {
            crate::cause::Cause::KillModeUnsafe { unit, fix, .. } => Some((unit, fix)),
            _ => None,
        });
        let (unit, fix) = example.expect("an example of kill_mode_unsafe");
        assert_eq!(kill_mode_risk(&unit, Some("control-group"), Duration::from_secs(60)), Some(fix));
    }

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_drained_stop_says_how_many_requests_it_waited_for() {
        let l = lines(&[
            "[t] Gracefully exiting... Remaining number of requests 9. (an older stop)",
            "[t] SIGTERM received. signum=15 frame=<f>. Draining requests and shutting down...",
            "[t] Gracefully exiting... Remaining number of requests 2. Remaining requests remaining_rids=['a', 'b'].",
            "[t] Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].",
        ]);
        let r = report(&l, Some(Duration::from_millis(7300)), Some(Duration::from_secs(90)));
        assert_eq!((r.requests_at_first_check, r.checks, r.killed, r.stop_ms), (Some(2), 2, false, Some(7300)));
        assert!(r.why.contains("waited for 2 request(s)"), "{}", r.why);
    }

    #[test]
    fn a_stop_killed_at_the_timeout_says_so() {
        let l = lines(&[
            "SIGTERM received. signum=15 frame=<f>. Draining requests and shutting down...",
            "Gracefully exiting... Remaining number of requests 3. Remaining requests remaining_rids=[...].",
            "p.service: State 'stop-sigterm' timed out. Killing.",
        ]);
        let r = report(&l, Some(Duration::from_secs(90)), Some(Duration::from_secs(90)));
        assert!(r.killed);
        assert_eq!(r.why, "the stop took 90.0 s and ended in SIGKILL at TimeoutStopSec=90s with 3 request(s) still in flight");
        let idle = report(
            &lines(&["SIGTERM received. x. Draining requests and shutting down...", "Gracefully exiting... Remaining number of requests 0. x"]),
            Some(Duration::from_secs(3)),
            None,
        );
        assert!(!idle.killed && idle.why.contains("nothing was in flight"), "{}", idle.why);
        let old = report(&[], Some(Duration::from_millis(200)), Some(Duration::from_secs(90)));
        assert!(old.why.contains("logged no SIGTERM drain"), "{}", old.why);
    }

    #[test]
    fn a_stop_sglang_ended_by_killing_its_own_tree_is_not_called_a_timeout() {
        // Measured on the real 0.5.23 server under KillMode=control-group: killed ~5.5 s after
        // SIGTERM, far below TimeoutStopSec, by SGLang itself.
        let l = lines(&[
            "[t] SIGTERM received. signum=15 frame=None. Draining requests and shutting down...",
            "[t] Subprocess scheduler_0 (pid=42) crashed with exit code -15. Triggering SIGQUIT for cleanup...",
            "[t] SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
            "[t] Sleeping 5 seconds before crash diagnostics to let GPU activity settle.",
            "p.service: Main process exited, code=killed, status=9/KILL",
            "p.service: Failed with result 'signal'.",
        ]);
        let r = report(&l, Some(Duration::from_millis(5600)), Some(Duration::from_secs(60)));
        assert_eq!((r.killed, r.ended_by), (false, EndedBy::SglangTreeKill));
        assert!(r.why.contains("SIGKILLed its own process tree") && r.why.contains("KillMode=mixed"), "{}", r.why);
        assert!(!r.why.contains("TimeoutStopSec"), "{}", r.why);
        // The manager's own SIGKILL at the timeout is still that.
        let t = report(
            &lines(&["SIGTERM received. Draining requests and shutting down...", "p.service: State 'stop-sigterm' timed out. Killing.", "status=9/KILL"]),
            Some(Duration::from_secs(60)),
            Some(Duration::from_secs(60)),
        );
        assert_eq!((t.killed, t.ended_by), (true, EndedBy::TimeoutSigkill));
        let d =
            report(&lines(&["SIGTERM received. Draining requests and shutting down...", "Gracefully exiting... Remaining number of requests 0."]), None, None);
        assert_eq!(d.ended_by, EndedBy::Drained);
        assert_eq!(report(&[], None, None).ended_by, EndedBy::Exited);
    }

    #[test]
    fn only_control_group_is_a_kill_mode_risk() {
        let r = kill_mode_risk("p.service", Some("control-group"), Duration::from_secs(60)).expect("a risk");
        assert!(r.contains("KillMode=mixed") && r.contains("TimeoutStopSec=90s") && r.contains("systemctl edit p.service"), "{r}");
        for m in [Some("mixed"), Some("process"), None] {
            assert_eq!(kill_mode_risk("p.service", m, Duration::from_secs(60)), None);
        }
    }

    #[test]
    fn the_job_wait_covers_the_stop_and_risks_are_named() {
        assert_eq!(job_limit(Duration::from_secs(60), Some(Duration::from_secs(90))), Duration::from_secs(150));
        assert_eq!(job_limit(Duration::from_secs(60), None), Duration::from_secs(60) + UNBOUNDED_STOP_WAIT);
        let r = risks("p.service", Some(Duration::from_secs(90)), Duration::from_secs(60), Some(Duration::from_secs(300)));
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300s and then SGLang's next 5 s drain check (305s in all), longer than TimeoutStopSec=90s")
                && r[0].contains("TimeoutStopSec=325s (that, up to 15s more while SGLang joins its schedulers"),
            "{}",
            r[0]
        );
        // 8 s of bootstrap timeout is shorter than a 10 s stop, but not with the drain check
        // after it: the sentence says the sum it compares, never "8s, longer than 10s".
        let r = risks("p.service", Some(Duration::from_secs(10)), Duration::from_secs(5), Some(Duration::from_secs(8)));
        assert!(r[0].contains("(13s in all), longer than TimeoutStopSec=10s"), "{}", r[0]);
        assert!(risks("d.service", Some(Duration::from_secs(90)), Duration::from_secs(60), None).is_empty());
        assert!(risks("d.service", Some(Duration::from_secs(3)), Duration::from_secs(60), None)[0].contains("watchdog"));
        assert!(risks("d.service", Some(Duration::from_secs(30)), Duration::from_secs(60), None)[0].contains("drain_timeout (60s)"));
        assert!(risks("d.service", None, Duration::from_secs(60), Some(Duration::from_secs(300))).is_empty());
        assert_eq!(duration(1_000_000, 3_500_000), Some(Duration::from_millis(2500)));
        assert_eq!(duration(0, 3_500_000), None);
    }

    #[test]
    fn an_unhealthy_servers_force_exit_is_not_a_drain() {
        let sigterm = "[t] SIGTERM received. signum=15 frame=None. Draining requests and shutting down...";
        let forced = "[t] Signal SIGTERM received while health check failed. Force exiting.";
        let r = report(&lines(&[sigterm, forced]), Some(Duration::from_millis(5200)), Some(Duration::from_secs(60)));
        assert_eq!(r.ended_by, EndedBy::ForceExit);
        assert!(!r.why.contains("nothing was in flight"), "{}", r.why);
        assert!(r.why.contains("UnHealthy") && r.why.contains("without waiting for the requests in flight"), "{}", r.why);
        // A failed PD warm-up (the ready line logged all the same) is named as the reason.
        let warm = "[t] Disaggregation warmup failed (mode=prefill), status codes: [500]";
        let r = report(&lines(&[warm, "[t] The server is fired up and ready to roll!", sigterm, forced]), None, None);
        assert!(r.why.contains("PD warm-up failed"), "{}", r.why);
        let r = report(&lines(&[sigterm, "[t] Signal SIGTERM received while force shutdown flag set. Force exiting."]), None, None);
        assert!(r.ended_by == EndedBy::ForceExit && r.why.contains("SGL_FORCE_SHUTDOWN"), "{}", r.why);
    }
}
