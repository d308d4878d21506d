//! The shared plumbing of a step: its failure before it becomes an event ([`Fail`]), the event
//! stream of one step ([`StepRun`]), bounded waits, and what each step is ([`rule`]).

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;

use serde_json::Value;

use crate::cause::Cause;
use crate::details::Said;
use crate::engine::steps::GateMode;
use crate::events::{Event, Sink, Status, Step};
use crate::ports::UnitsError;

/// Pause between polls of HTTP state that offers no events (loopback calls; cheap).
pub(in crate::engine) const POLL: Duration = Duration::from_millis(100);

/// A step's failure before it becomes a [`Failure`]: the cause, and facts for the event's detail.
#[derive(Debug)]
pub(in crate::engine) struct Fail {
    pub(in crate::engine) cause: Cause,
    pub(in crate::engine) detail: Value,
    /// The unit that failed, when it is not the one being rolled (a decode restarted as a
    /// repair of the prefill's stale pairing).
    pub(in crate::engine) unit: Option<String>,
    /// The failed run's own last lines, as the ready gate's follower saw them up to its exit
    /// (empty: the unit's journal tail is read when the failure is reported). A unit that systemd
    /// restarts by itself, or a rollback's start, writes more lines after them.
    pub(in crate::engine) last_lines: Vec<String>,
}

impl From<Cause> for Fail {
    fn from(cause: Cause) -> Fail {
        Fail { cause, detail: Value::Null, unit: None, last_lines: Vec::new() }
    }
}

impl From<UnitsError> for Fail {
    fn from(e: UnitsError) -> Fail {
        e.cause().into()
    }
}

/// How a gate ends its step, before it is an event (the runbook writes a worker step's): its typed
/// detail — serialized only into the event — with what is said beside it (a warning, a note for
/// the summary), or why it did not run.
#[derive(Debug)]
pub(in crate::engine) enum Verdict<D> {
    /// Passed: the step's detail, and what is said beside it.
    Passed(D, Said),
    /// Skipped, and why.
    Skipped(String),
}

impl<D> Verdict<D> {
    /// Passed, nothing said beside it.
    pub(in crate::engine) fn passed(d: D) -> Self {
        Verdict::Passed(d, Said::default())
    }

    /// Passed with `cause` as a warning (its sentence and code beside the detail).
    pub(in crate::engine) fn warned(d: D, cause: &Cause) -> Self {
        Verdict::Passed(d, Said { warning: Some(cause.sentence()), cause_code: Some(cause.code().to_string()), ..Said::default() })
    }

    /// Under [`GateMode::Warn`], a failure of `cause` passed with it as a warning beside
    /// `detail`; otherwise `None` (the step fails).
    pub(in crate::engine) fn warned_under(mode: GateMode, cause: &Cause, detail: D) -> Option<Self> {
        (mode == GateMode::Warn).then(|| Verdict::warned(detail, cause))
    }
}

#[cfg(test)]
impl<D: serde::Serialize> Verdict<D> {
    /// The event's detail this verdict becomes (a skip: its reason).
    pub(in crate::engine) fn json(&self) -> Value {
        match self {
            Verdict::Passed(d, said) => said.clone().written_into(detail_of(d)),
            Verdict::Skipped(why) => Said { reason: Some(why.clone()), ..Said::default() }.written_into(Value::Null),
        }
    }
}

pub(in crate::engine) struct StepRun<'a> {
    pub(in crate::engine) sink: &'a Sink,
    pub(in crate::engine) unit: String,
    pub(in crate::engine) step: Step,
    pub(in crate::engine) t0: Instant,
}

impl<'a> StepRun<'a> {
    pub(in crate::engine) fn start(sink: &'a Sink, unit: &str, step: Step) -> StepRun<'a> {
        let s = StepRun { sink, unit: unit.to_string(), step, t0: Instant::now() };
        s.emit(Status::Started, Value::Null);
        s
    }
    pub(in crate::engine) fn emit(&self, status: Status, detail: Value) {
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
    pub(in crate::engine) fn pass(self, detail: Value) {
        self.emit(Status::Passed, detail);
    }
    pub(in crate::engine) fn skip(self, why: &str) {
        self.emit(Status::Skipped, Said { reason: Some(why.to_string()), ..Said::default() }.written_into(Value::Null));
    }
    /// End the step as its gate's verdict says: the typed detail serialized here, into the event.
    pub(in crate::engine) fn end<D: serde::Serialize>(self, v: Verdict<D>) {
        match v {
            Verdict::Passed(d, said) => self.pass(said.written_into(detail_of(&d))),
            Verdict::Skipped(why) => self.skip(&why),
        }
    }

    pub(in crate::engine) fn fail(self, f: &Fail) {
        // The step's own facts beside the cause (as they were: a restart that failed after a
        // killed stop keeps that stop's `cause_code`).
        let mut d = Said { cause: Some(f.cause.sentence()), cause_code: Some(f.cause.code().to_string()), ..Said::default() }.written_into(Value::Null);
        if let (Some(o), Value::Object(extra)) = (d.as_object_mut(), &f.detail) {
            o.extend(extra.clone());
        }
        self.emit(Status::Failed, d);
    }
}

/// Run one step and write its events: started, then the gate's verdict (its typed detail
/// serialized here), or its failure. What the runbook and the plan's steps
/// write for a step.
pub(in crate::engine) async fn report<D: Serialize, T>(
    sink: &Sink,
    unit: &str,
    step: Step,
    fut: impl Future<Output = Result<(Verdict<D>, T), Fail>>,
) -> Result<T, (Step, Fail)> {
    let s = StepRun::start(sink, unit, step);
    match fut.await {
        Ok((verdict, v)) => {
            s.end(verdict);
            Ok(v)
        }
        Err(f) => {
            s.fail(&f);
            Err((step, f))
        }
    }
}

/// [`report`] of a gate that hands nothing on.
pub(in crate::engine) async fn judged<D: Serialize>(
    sink: &Sink,
    unit: &str,
    step: Step,
    fut: impl Future<Output = Result<Verdict<D>, Fail>>,
) -> Result<(), (Step, Fail)> {
    report(sink, unit, step, async { fut.await.map(|v| (v, ())) }).await
}

/// A step's typed detail as the event's JSON (the contract's keys: each type's test holds them).
pub(in crate::engine) fn detail_of(d: &impl serde::Serialize) -> Value {
    serde_json::to_value(d).unwrap_or_default()
}

/// One event as a log sentence: unit, step, status, duration, and the cause of a failure.
pub fn sentence(e: &Event) -> String {
    let secs = e.elapsed_ms as f64 / 1000.0;
    match e.status {
        Status::Started => format!("{}: {} started", e.unit, e.step.as_str()),
        Status::Passed => format!("{}: {} passed in {secs:.1}s", e.unit, e.step.as_str()),
        Status::Skipped => format!("{}: {} skipped ({})", e.unit, e.step.as_str(), Said::of(&e.detail).reason.as_deref().unwrap_or("not needed")),
        Status::Failed => {
            format!("{}: {} failed after {secs:.1}s: {}", e.unit, e.step.as_str(), Said::of(&e.detail).cause.as_deref().unwrap_or("unknown cause"))
        }
    }
}

/// Run `fut`, but give up when the gate's time (`limit` from `t0`) is over: one hung HTTP call
/// must not stretch a gate's deadline.
pub(in crate::engine) async fn within<T>(t0: Instant, limit: Duration, fut: impl std::future::Future<Output = T>) -> Option<T> {
    let left = limit.saturating_sub(t0.elapsed());
    tokio::time::timeout(left.max(Duration::from_millis(100)), fut).await.ok()
}

pub(in crate::engine) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A gate that failed while its worker's run ended since `after` failed on that crash: the
/// crash as the failure (`phase`: when), `None` when the run still goes on.
pub(in crate::engine) async fn crash_since<U: crate::ports::Units>(
    units: &U,
    unit: &str,
    after: &crate::ports::UnitState,
    phase: crate::cause::Phase,
) -> Result<Option<Fail>, Fail> {
    let st = units.state(unit).await?;
    Ok(crate::sglang::judge::crashed_since(&st, after).map(|why| Fail::from(Cause::Crashed { unit: unit.to_string(), phase, why })))
}
