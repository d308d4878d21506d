//! Restarts pdctl did not make, watched while pdctld runs, and the restart-storm breaker
//! (`pdctl_core::service::storm` decides what counts and what a storm is): every 10 s each worker's
//! NRestarts and InvocationID are read; a single host refuses a new rollout while it is in a
//! storm; in a fleet, each host publishes its self-restarts in its liveness key and any pdctld
//! that sees more than the rule fleet-wide pauses the fleet (an operator unpauses it).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pdctl_contract::cause::Cause;
use pdctl_core::config::Settings;
use pdctl_core::service::storm::{between, storm, Report, Seen, SelfRestart, Storm};

use super::{config, lock, Daemon};
use crate::metrics::UnitLabel;

/// What the watch remembers.
#[derive(Debug, Default)]
pub struct StormWatch {
    /// Each worker as last seen.
    seen: BTreeMap<String, Seen>,
    /// Self-restarts still within the longest window that matters.
    events: Vec<SelfRestart>,
    /// The rollout count at the last look (a rollout that began and ended between two looks
    /// may have restarted a unit).
    rollouts_at_last_look: u64,
}

/// How often the units are looked at. NRestarts counts every automatic restart, so nothing of
/// systemd's is missed between two looks; two restarts by hand within one period count once.
/// Each look reads both units' properties over D-Bus: at 2 s that was 3.4 ms of CPU per second
/// idle (debug build, 4× pdctld's idle cost before it; docs/benchmarks.md).
const EVERY: Duration = Duration::from_secs(10);

/// The rule in force: `[fleet.storm]`, or its defaults on a single host.
pub(super) fn rule(s: &Settings) -> Storm {
    s.fleet.as_ref().map(|f| f.storm).unwrap_or_default()
}

impl Daemon {
    /// Look at every worker every 10 s and note the restarts pdctl did not make. One D-Bus
    /// connection is kept (made again after a failed read or a change of `[systemd]`).
    pub async fn storm_watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(EVERY);
        let mut conn: Option<(pdctl_core::config::BusSetting, pdctl_real::SystemdUnits)> = None;
        loop {
            tick.tick().await;
            let Ok(settings) = config(&self) else { continue };
            if conn.as_ref().is_none_or(|(bus, _)| *bus != settings.bus) {
                conn = match tokio::time::timeout(Duration::from_secs(5), pdctl_real::SystemdUnits::connect(&settings)).await {
                    Ok(Ok(u)) => Some((settings.bus.clone(), u)),
                    _ => None,
                };
            }
            let Some((_, units)) = &conn else { continue };
            let begun = self.rollouts_begun.load(Ordering::SeqCst);
            let running = self.running_id().is_some();
            let mut states = Vec::new();
            let mut failed = false;
            for w in &settings.workers {
                match tokio::time::timeout(Duration::from_secs(5), pdctl_core::ports::Units::state(units, &w.unit)).await {
                    Ok(Ok(st)) => states.push((w.unit.clone(), Seen { invocation_id: st.invocation_id, n_restarts: st.n_restarts })),
                    _ => failed = true,
                }
            }
            if failed {
                conn = None;
            }
            let r = rule(&settings);
            let now = pdctl_core::fleet::now_secs();
            let keep = r.within.as_secs().max(3600);
            let mut w = lock(&self.storm);
            // A host in maintenance: its workers stop and start with the host (the reboot's
            // start is no restart storm).
            let maintained = !matches!(self.store.ledger().maintenance(), Ok(None));
            let ours = running || begun != w.rollouts_at_last_look || maintained;
            w.rollouts_at_last_look = begun;
            for (unit, seen) in states {
                if let Some(before) = w.seen.get(&unit) {
                    for by in between(before, &seen, ours) {
                        tracing::warn!(pdctl_unit = %unit, "{unit} restarted without pdctl ({by}); more than {} such restarts within {} is a restart storm", r.restarts, humantime::format_duration(r.within));
                        self.metrics.self_restarts.get_or_create(&UnitLabel { unit: unit.clone() }).inc();
                        w.events.push(SelfRestart { unit: unit.clone(), at: now, by: by.into() });
                    }
                }
                w.seen.insert(unit, seen);
            }
            w.events.retain(|x| x.at + keep >= now);
            let in_storm = storm(w.events.iter().map(|x| (x.unit.clone(), x)), &r, now).is_some();
            self.metrics.storm.set(i64::from(in_storm));
        }
    }

    /// This host's self-restarts within the rule's window (for its liveness key).
    pub(super) fn self_restarts(&self, rule: &Storm) -> Vec<SelfRestart> {
        let since = pdctl_core::fleet::now_secs().saturating_sub(rule.within.as_secs());
        lock(&self.storm).events.iter().filter(|x| x.at >= since).cloned().collect()
    }

    /// On a single host: refuse a new rollout while the host is in a storm (`restart_storm`,
    /// exit 4). A fleet's storm pauses the fleet instead ([`Daemon::fleet_storm`]).
    pub(super) fn storm_refusal(&self, s: &Settings) -> Result<(), Cause> {
        if s.fleet.is_some() {
            return Ok(());
        }
        let r = rule(s);
        let w = lock(&self.storm);
        match storm(w.events.iter().map(|x| (x.unit.clone(), x)), &r, pdctl_core::fleet::now_secs()) {
            Some(Report { count, by }) => Err(Cause::RestartStorm { who: Report { count, by }.who(), count, limit: r.restarts, within: r.within }),
            None => Ok(()),
        }
    }

    /// In a fleet: every host's self-restarts (from the liveness keys) against the rule; a storm
    /// sets the fleet-wide pause, naming the hosts and units. After a pause was lifted, only
    /// restarts from then on count (`storm_since`: those before were the pause's). Returns the pause's reason
    /// when it set one.
    pub(super) async fn fleet_storm(&self, c: &pdctl_real::EtcdCoordinator) -> Option<String> {
        let s = config(self).ok()?;
        let f = s.fleet.as_ref()?;
        let now = pdctl_core::fleet::now_secs();
        if pdctl_core::fleet::paused(c, &f.name).await.ok()?.is_some() {
            return None;
        }
        let since = pdctl_core::fleet::storm_since(c, &f.name).await.ok()?;
        let hosts = pdctl_core::fleet::hosts(c, &f.name).await.ok()?;
        let events: Vec<(String, &SelfRestart)> =
            hosts.iter().flat_map(|h| h.self_restarts.iter().filter(|x| x.at > since).map(move |x| (format!("{}/{}", h.host, x.unit), x))).collect();
        let report = storm(events, &f.storm, now)?;
        let reason = format!(
            "restart storm: {} restarts pdctl did not make within {} (more than {}): {}",
            report.count,
            humantime::format_duration(f.storm.within),
            f.storm.restarts,
            report.who()
        );
        let p = pdctl_core::fleet::Pause { by: format!("pdctld on {}", f.host), reason: reason.clone(), at: now };
        pdctl_core::fleet::set_pause(c, &f.name, Some(&p)).await.ok()?;
        tracing::error!("fleet {} paused: {reason}; pdctl fleet unpause once the cause is fixed", f.name);
        Some(reason)
    }
}
