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
    /// A final `pdctl_contract::lifecycle::RolloutState` (succeeded, failed, rolled_back, aborted,
    /// interrupted), or a reconcile's result (restored, not_restored).
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
    /// The cause's stable code (`pdctl_contract::cause::Cause::code`: a fixed set, never free text).
    pub cause: String,
}

/// `unit` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnitLabel {
    /// A configured worker's unit.
    pub unit: String,
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
    /// `pdctl_drained_workers`: workers pdctl took out of the router and has not re-admitted.
    pub drained: Gauge,
    /// `pdctl_reconciles_total{result}`: drains undone (`restored`) or not (`not_restored`).
    pub reconciles: Family<ResultLabel, Counter>,
    /// `pdctl_records_failing`: 1 while rollout records cannot be saved (no rollout starts).
    pub records_failing: Gauge,
    /// `pdctl_record_write_failures_total`: record writes that failed after their retries.
    pub record_write_failures: Counter,
    /// `pdctl_corrupt_records`: record files that do not read.
    pub corrupt_records: Gauge,
    /// `pdctl_availability_probes_total`: requests the availability probe sent through the router.
    pub probes: Counter,
    /// `pdctl_availability_probes_failed_total`: of those, the ones that did not answer 200.
    pub probes_failed: Counter,
    /// `pdctl_availability_longest_error_seconds`: the last rollout's longest error window.
    pub longest_error: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Restarts pdctl did not make (systemd's `Restart=`, or outside any rollout), by unit.
    pub self_restarts: Family<UnitLabel, Counter>,
    /// 1 while this host is in a restart storm (no rollout starts).
    pub storm: Gauge,
    /// `pdctl_unresolved`: what pdctld has to undo and could not yet (a paused worker, a drain
    /// it cannot re-admit): no rollout starts while it is above 0.
    pub unresolved: Gauge,
    /// 1 while this host is in maintenance (drained for a reboot, or coming back).
    pub maintenance: Gauge,
    /// 1 while this host's maintenance has failed (its workers failed their gates; it keeps its
    /// slots): the alert.
    pub maintenance_failed: Gauge,
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
        let drained = Gauge::default();
        let reconciles = Family::<ResultLabel, Counter>::default();
        let records_failing = Gauge::default();
        let record_write_failures = Counter::default();
        let corrupt_records = Gauge::default();
        let probes = Counter::default();
        let probes_failed = Counter::default();
        let longest_error = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let self_restarts = Family::<UnitLabel, Counter>::default();
        let storm = Gauge::default();
        let unresolved = Gauge::default();
        let maintenance = Gauge::default();
        let maintenance_failed = Gauge::default();
        registry.register("host_maintenance", "1 while this host is in maintenance (pdctl host drain … host resume)", maintenance.clone());
        registry.register(
            "host_maintenance_failed",
            "1 while this host's maintenance failed: its workers failed their gates after the reboot, and it keeps its slots",
            maintenance_failed.clone(),
        );
        registry.register("rollouts", "Rollouts finished, by result", rollouts.clone());
        registry.register("step_duration_seconds", "Duration of passed gates, by step", step_duration.clone());
        registry.register("gate_failures", "Gates that failed, by step and cause code", gate_failures.clone());
        registry.register("units_restarted", "Units restarted and verified", units_restarted.clone());
        registry.register("last_success_timestamp_seconds", "When the last rollout succeeded (seconds since the epoch)", last_success.clone());
        registry.register("rollout_running", "1 while a rollout runs", running.clone());
        registry.register("drained_workers", "Workers pdctl took out of the router and has not re-admitted (not serving)", drained.clone());
        registry.register("reconciles", "Drains undone after a failure or a restart of pdctld, by result (restored, not_restored)", reconciles.clone());
        registry.register("records_failing", "1 while rollout records cannot be saved (no rollout starts meanwhile)", records_failing.clone());
        registry.register("record_write_failures", "Rollout record writes that failed after their retries", record_write_failures.clone());
        registry.register("corrupt_records", "Rollout record files that do not read", corrupt_records.clone());
        registry.register("availability_probes", "Requests the availability probe sent through the router during rollouts", probes.clone());
        registry.register("availability_probes_failed", "Availability probe requests that did not answer 200", probes_failed.clone());
        registry.register("availability_longest_error_seconds", "The last rollout's longest window of errors as clients saw them", longest_error.clone());
        registry.register("self_restarts", "Worker restarts pdctl did not make (systemd's Restart=, or outside any rollout), by unit", self_restarts.clone());
        registry.register("restart_storm", "1 while this host's self-restarts exceed the storm rule (no rollout starts)", storm.clone());
        registry.register(
            "unresolved",
            "What pdctld has to undo after a stop or a start and could not yet (a paused worker, a drain it cannot re-admit); no rollout starts while above 0",
            unresolved.clone(),
        );
        Metrics {
            registry,
            rollouts,
            step_duration,
            gate_failures,
            units_restarted,
            last_success,
            running,
            drained,
            reconciles,
            records_failing,
            record_write_failures,
            corrupt_records,
            probes,
            probes_failed,
            longest_error,
            self_restarts,
            storm,
            unresolved,
            maintenance,
            maintenance_failed,
        }
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
