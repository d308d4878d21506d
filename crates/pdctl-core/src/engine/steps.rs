//! What each step is — how long the engine may sit in it, whether its failure halts the rollout
//! or is a warning (or it does not run), and why it is skipped — in one exhaustive match. The
//! gates ask [`rule`] instead of reading the settings themselves.

use std::time::Duration;

use crate::config::{MetricsMode, Rollout, Settings, StrandedKv, UnknownLoad, Verify};
use crate::events::Step;

/// How a step's failure counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateMode {
    /// The step does not run (its reason: [`StepRule::off_because`]).
    Off,
    /// A failure is reported as a warning on a passed step; the rollout goes on.
    Warn,
    /// A failure halts the rollout (or rolls it back).
    Required,
}

/// What one step is, for given settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRule {
    /// How long the engine may stay in the step before it must have emitted its next event: the
    /// step's own deadline plus the HTTP timeout of one call inside it. pdctld stops feeding
    /// systemd's watchdog when a running rollout's engine sits in a step longer than this (a hung
    /// engine must not hide behind a daemon that still answers).
    pub deadline: Duration,
    /// Whether a failure halts, warns, or the step does not run.
    pub mode: GateMode,
    /// Why the step does not run for any worker (with [`GateMode::Off`]).
    pub off_because: Option<&'static str>,
}

/// The pair gate of a worker whose role has no counterpart configured.
pub const NO_OTHER_ROLE: &str = "no worker of the other PD role is configured";
/// The router gate of a `check` on a worker the gateway does not list.
pub const NOT_REGISTERED: &str = "not registered in the router";
/// The router gate of a coherent switch's new group before the switch.
pub const HELD_FOR_SWITCH: &str = "held out of the router until the coherent switch: it runs the new model while the old group serves";
/// The ready gate after host maintenance of a worker whose run went on through the drain.
pub const RAN_THROUGH: &str = "its run went on through the host's drain (it was never stopped): its ready line came before";
/// A rollback of a unit whose files are already its last good revision.
pub const NOTHING_TO_RESTORE: &str = "nothing to restore: the unit's files are its last good revision";

/// The longest a prefetch reads before the rollout goes on without the rest (a checkpoint that
/// fits in memory reads in far less at the disk speeds of GPU hosts).
pub const PREFETCH_LIMIT: Duration = Duration::from_secs(600);

/// The step's deadline ([`StepRule::deadline`]) under `[rollout]` `r` and `[verify]` `v`.
pub fn deadline(step: Step, r: &Rollout, v: &Verify) -> Duration {
    let call = Duration::from_secs(30);
    call + match step {
        Step::Preflight => Duration::from_secs(120),
        // Waiting for a slot is bounded by the fleet's slot_timeout (at most a week).
        Step::Slot => Duration::from_secs(7 * 24 * 3600),
        Step::Drain => r.drain_timeout,
        // The stop drains (SGLang waits for its requests), bounded by each unit's
        // TimeoutStopSec, which the config does not know: the longest pdctl waits for it.
        Step::Restart => crate::sglang::stop::job_limit(r.job_timeout, None),
        // The same stop, after a drained prefill is kept for its decodes' KV pulls (bounded by
        // its bootstrap timeout, at most 1h).
        Step::Stop => crate::sglang::stop::job_limit(r.job_timeout, None) + Duration::from_secs(3600),
        Step::Start => r.job_timeout,
        Step::Ready => r.ready_timeout,
        Step::Health => r.health_timeout,
        // The drop-in, a reload, SGLang's preparation check and its switch (a teardown and a
        // rebuild of its KV pools, on the scale of a start: ready_timeout).
        Step::Role => r.job_timeout + r.ready_timeout,
        Step::Router => r.router_timeout,
        Step::Metrics => r.metrics_timeout + call,
        // The service gate waits up to its max_wait beyond the soak; its scrapes at the start
        // and at each look are bounded by metrics_timeout each.
        Step::Soak => r.min_healthy + v.slo.map_or(Duration::ZERO, |slo| slo.max_wait + 3 * r.metrics_timeout),
        Step::Reconcile => r.ready_timeout + r.router_timeout,
        // Restoring files and a reload; its gates are the unit's own steps.
        Step::Rollback => r.job_timeout,
        // The pause, the load (bounded like a start: ready_timeout) and the continue.
        Step::Weights => r.ready_timeout + 2 * r.health_timeout,
        // Each wait of a fleet switch is bounded by its own limit (the slowest: the fleet's
        // slot_timeout, at most a week, and every restart of a host).
        Step::Switch => Duration::from_secs(8 * 24 * 3600),
        // Reading a checkpoint into memory, cut short at its limit (the rollout goes on).
        Step::Prefetch => PREFETCH_LIMIT,
        // Each pair is probed at most twice, each probe bounded by the pair timeout (at most
        // 1h each); the stranded-KV wait is bounded by its timeout (at most 1h).
        Step::Pair | Step::StrandedKv => Duration::from_secs(3 * 3600),
    }
}

/// What `step` is under `s`.
pub fn rule(step: Step, s: &Settings) -> StepRule {
    use GateMode::{Off, Required, Warn};
    let (mode, off_because) = match step {
        Step::Preflight
        | Step::Restart
        | Step::Stop
        | Step::Start
        | Step::Ready
        | Step::Health
        | Step::Soak
        | Step::Reconcile
        | Step::Rollback
        | Step::Weights
        | Step::Role
        | Step::Switch => (Required, None),
        // A read that cannot be made is said, never a failure.
        Step::Prefetch if s.rollout.prefetch_weights => (Warn, None),
        Step::Prefetch => (Off, Some("[rollout] prefetch_weights = false")),
        Step::Slot if s.fleet.is_some() => (Required, None),
        Step::Slot => (Off, Some("no [fleet] configured")),
        // The drain itself always runs; a load it cannot read halts or is a warning.
        Step::Drain => match s.rollout.unknown_load {
            UnknownLoad::Halt => (Required, None),
            UnknownLoad::Warn => (Warn, None),
        },
        Step::Pair if s.verify.pair => (Required, None),
        Step::Pair => (Off, Some("[verify] pair = false")),
        Step::Router if s.verify.router => (Required, None),
        Step::Router => (Off, Some("no router configured or [verify] router = false")),
        Step::Metrics => match s.verify.metrics {
            MetricsMode::Required => (Required, None),
            MetricsMode::Warn => (Warn, None),
            MetricsMode::Off => (Off, Some("[verify] metrics = \"off\"")),
        },
        Step::StrandedKv => match s.verify.stranded_kv {
            StrandedKv::Required => (Required, None),
            StrandedKv::Warn => (Warn, None),
        },
    };
    StepRule { deadline: deadline(step, &s.rollout, &s.verify), mode, off_because }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(extra: &str) -> Settings {
        let text = format!("[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n{extra}");
        crate::config::load_texts(&[(std::path::PathBuf::from("t.toml"), text)]).expect("config")
    }

    #[test]
    fn every_step_has_a_rule_and_off_steps_say_why() {
        for extra in ["", "[verify]\nmetrics = \"off\"\npair = false\nrouter = false\nstranded_kv = \"required\"\n"] {
            let s = settings(extra);
            for step in Step::ALL {
                let r = rule(step, &s);
                assert_eq!(r.mode == GateMode::Off, r.off_because.is_some(), "{step:?}: {r:?}");
                assert!(r.deadline >= Duration::from_secs(30), "{step:?}");
            }
        }
        let s = settings("[verify]\nmetrics = \"warn\"\n");
        assert_eq!(rule(Step::Metrics, &s).mode, GateMode::Warn);
        assert_eq!(rule(Step::Slot, &s).off_because, Some("no [fleet] configured"));
        assert_eq!(rule(Step::Drain, &s).deadline, s.rollout.drain_timeout + Duration::from_secs(30));
    }
}
