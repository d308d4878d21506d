//! pdctld's own metrics, declared together (prometheus-client), served as Prometheus text on a
//! loopback TCP address. Names are prefixed `pdctl_`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `result` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// A final `pdctl_core::lifecycle::RolloutState` (succeeded, failed, rolled_back, aborted,
    /// interrupted).
    pub result: String,
}

/// `step` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    /// The gate.
    pub step: String,
}

/// `step` and `cause` labels of a gate failure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabel {
    /// The gate.
    pub step: String,
    /// The cause's stable code (`pdctl_core::cause::Cause::code`: a fixed set, never free text).
    pub cause: String,
}

/// Every metric pdctld exports.
pub struct Metrics {
    registry: Registry,
    /// `pdctl_rollouts_total{result}`.
    pub rollouts: Family<ResultLabel, Counter>,
    /// `pdctl_step_duration_seconds{step}` (passed steps).
    pub step_duration: Family<StepLabel, Histogram>,
    /// `pdctl_gate_failures_total{step,cause}`.
    pub gate_failures: Family<FailureLabel, Counter>,
    /// `pdctl_units_restarted_total`.
    pub units_restarted: Counter,
    /// `pdctl_last_success_timestamp_seconds`.
    pub last_success: Gauge,
    /// `pdctl_rollout_running` (1 while a rollout runs).
    pub running: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("pdctl");
        let rollouts = Family::<ResultLabel, Counter>::default();
        let step_duration = Family::<StepLabel, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.01, 2.5, 14)));
        let gate_failures = Family::<FailureLabel, Counter>::default();
        let units_restarted = Counter::default();
        let last_success = Gauge::default();
        let running = Gauge::default();
        registry.register("rollouts", "Rollouts finished, by result", rollouts.clone());
        registry.register("step_duration_seconds", "Duration of passed gates, by step", step_duration.clone());
        registry.register("gate_failures", "Gates that failed, by step and cause code", gate_failures.clone());
        registry.register("units_restarted", "Units restarted and verified", units_restarted.clone());
        registry.register("last_success_timestamp_seconds", "When the last rollout succeeded (seconds since the epoch)", last_success.clone());
        registry.register("rollout_running", "1 while a rollout runs", running.clone());
        Metrics { registry, rollouts, step_duration, gate_failures, units_restarted, last_success, running }
    }
}

impl Metrics {
    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
