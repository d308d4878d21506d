//! Where a unit's time out of the router went: each step from the start of its drain (or, for the
//! only worker of its role, from when its restart took it out: `taken_out` in the restart's
//! detail) to its re-admission, read from the rollout's events — the restart split into the stop (SGLang's stop
//! waits for its requests and exits at a watchdog check, every 5 s) and the start — so that what
//! pdctl's own steps add to an outage is on record beside what the server and the gateway take.
//! Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::events::{Event, Status, Step};

/// One step's share of a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowPart {
    /// The step (`stop` and `start` for the two halves of the restart).
    pub step: String,
    /// How long it took.
    pub ms: u64,
}

/// A unit's last window out of the router in a rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Drain to re-admission: the sum of the parts.
    pub total_ms: u64,
    /// The steps in order.
    pub parts: Vec<WindowPart>,
}

impl Window {
    /// "7.1 s out of the router: drain 0.0 s, stop 4.9 s, start 0.6 s, ready 1.1 s, …".
    pub fn sentence(&self) -> String {
        let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
        let parts: Vec<String> = self.parts.iter().map(|p| format!("{} {}", p.step, secs(p.ms))).collect();
        format!("{} out of the router: {}", secs(self.total_ms), parts.join(", "))
    }
}

/// Each unit's last window out of the router (drain passed, then every step through its router
/// gate passed), from a rollout's events in order. A unit not re-admitted has none.
pub fn windows(events: &[Event]) -> BTreeMap<String, Window> {
    let mut open: BTreeMap<&str, Vec<WindowPart>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for e in events.iter().filter(|e| e.status == Status::Passed) {
        let part = |step: &str, ms: u64| WindowPart { step: step.to_string(), ms };
        match e.step {
            Step::Drain => {
                open.insert(e.unit.as_str(), vec![part(Step::Drain.as_str(), e.elapsed_ms)]);
            }
            Step::Restart => {
                if let Some(parts) = open.get_mut(e.unit.as_str()) {
                    let seen = crate::details::RestartSeen::of(&e.detail);
                    let stop = seen.stop.and_then(|s| s.stop_ms).filter(|s| *s <= e.elapsed_ms);
                    // A deferred drain: the worker served through its drain step and the stop's
                    // first part; its window starts when the restart took it out.
                    let taken_out = seen.taken_out.and_then(|t| t.after_ms);
                    if taken_out.is_some() {
                        parts.clear();
                    }
                    match (stop, taken_out) {
                        (Some(stop), t) => {
                            parts.push(part("stop", stop.saturating_sub(t.unwrap_or(0))));
                            parts.push(part("start", e.elapsed_ms - stop));
                        }
                        (None, t) => parts.push(part(Step::Restart.as_str(), e.elapsed_ms.saturating_sub(t.unwrap_or(0)))),
                    }
                }
            }
            Step::Ready | Step::Health | Step::Pair => {
                if let Some(parts) = open.get_mut(e.unit.as_str()) {
                    parts.push(part(e.step.as_str(), e.elapsed_ms));
                }
            }
            Step::Router => {
                if let Some(mut parts) = open.remove(e.unit.as_str()) {
                    parts.push(part(Step::Router.as_str(), e.elapsed_ms));
                    out.insert(e.unit.clone(), Window { total_ms: parts.iter().map(|p| p.ms).sum(), parts });
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(unit: &str, step: Step, status: Status, ms: u64, detail: serde_json::Value) -> Event {
        Event { unit: unit.into(), step, status, elapsed_ms: ms, at: String::new(), detail, repair_of: None }
    }

    #[test]
    fn a_window_is_every_step_from_the_drain_to_the_router_with_the_restart_split_into_stop_and_start() {
        let events = vec![
            ev("p", Step::Preflight, Status::Passed, 5, json!(null)),
            ev("p", Step::Drain, Status::Started, 0, json!(null)),
            ev("p", Step::Drain, Status::Passed, 10, json!(null)),
            ev("p", Step::Restart, Status::Passed, 5000, json!({"stop": {"stop_ms": 4200}})),
            ev("p", Step::Ready, Status::Passed, 900, json!(null)),
            ev("p", Step::Health, Status::Passed, 3, json!(null)),
            ev("p", Step::Pair, Status::Passed, 40, json!(null)),
            ev("p", Step::Router, Status::Passed, 1020, json!(null)),
            ev("p", Step::Metrics, Status::Passed, 200, json!(null)),
            // Never re-admitted: no window.
            ev("d", Step::Drain, Status::Passed, 1, json!(null)),
            ev("d", Step::Restart, Status::Passed, 100, json!({})),
        ];
        let w = windows(&events);
        assert_eq!(w.len(), 1, "{w:?}");
        let p = &w["p"];
        assert_eq!(p.total_ms, 10 + 4200 + 800 + 900 + 3 + 40 + 1020);
        let steps: Vec<&str> = p.parts.iter().map(|x| x.step.as_str()).collect();
        assert_eq!(steps, ["drain", "stop", "start", "ready", "health", "pair", "router"]);
        assert_eq!(p.sentence(), "7.0 s out of the router: drain 0.0 s, stop 4.2 s, start 0.8 s, ready 0.9 s, health 0.0 s, pair 0.0 s, router 1.0 s");
    }

    #[test]
    fn a_deferred_drain_starts_the_window_when_the_restart_took_the_worker_out() {
        let events = vec![
            ev("d", Step::Drain, Status::Passed, 15, json!({"taken_out": "deferred"})),
            ev("d", Step::Restart, Status::Passed, 5000, json!({"stop": {"stop_ms": 4200}, "taken_out": {"after_ms": 4100}})),
            ev("d", Step::Ready, Status::Passed, 900, json!(null)),
            ev("d", Step::Router, Status::Passed, 1000, json!(null)),
        ];
        let d = &windows(&events)["d"];
        let steps: Vec<&str> = d.parts.iter().map(|x| x.step.as_str()).collect();
        assert_eq!(steps, ["stop", "start", "ready", "router"], "the drain step served: not in the window");
        assert_eq!(d.total_ms, 100 + 800 + 900 + 1000);
    }
}
