//! The fleet bake and its revert, on this host (`[fleet] bake`; the rules in
//! `pdctl_core::fleet::bake`, the judgement in `pdctl_core::engine`'s bake gate).
//!
//! After this host's part of a fleet rollout succeeded having restarted workers, it waits for
//! every other host's part; if all succeeded it watches its changed workers for the bake time,
//! looking every [`look_every`] at the window since the bake began against each worker's figures
//! from before its drain. A breach writes the revert request (once, fleet-wide); every changed
//! host then reverts its part in the request's order — through `Request::Revert`, a local
//! rollout with its own record, slots and gates — and writes how it ended.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pdctl_contract::api::{HostResult, Request, Started, StartedBy};
use pdctl_core::config::FleetSettings;
use pdctl_core::fleet::{BakeState, FleetRevert, FleetRollout, HostBake, HostSummary};
use pdctl_core::ports::{CasChange, Coordinator as _, Write};
use pdctl_core::service::slo::{ServiceScrape, Verdict};
use pdctl_real::EtcdCoordinator;

use super::fleet::{fleet_put, fleet_summaries, per_host};
use super::rollouts::start;
use super::{engine, lock, Daemon};

/// How long a host waits for the other hosts' parts before it gives up on the bake (each part is
/// bounded by its own gates and slot timeouts; this only bounds the wait itself).
const PARTS_WAIT: Duration = Duration::from_secs(24 * 3600);
/// How long a host waits for the reverts before its own (each bounded by its gates).
const TURN_WAIT: Duration = Duration::from_secs(12 * 3600);
/// How often etcd is read while waiting (the revert request, other hosts' ends).
const POLL: Duration = Duration::from_secs(2);
/// Baselines kept for rollouts whose bake has not begun yet.
const KEPT: usize = 8;

/// How often the bake looks at the figures: a tenth of the bake, at least every 10 s and at
/// most every minute. Each look judges the whole window since the bake began.
pub fn look_every(bake: Duration) -> Duration {
    (bake / 10).clamp(Duration::from_secs(10), Duration::from_secs(60))
}

impl Daemon {
    /// Keep rollout `id`'s figures from before its drains for a bake (with `[fleet]` only).
    pub(super) fn keep_baseline(&self, id: &str, before: BTreeMap<String, ServiceScrape>) {
        if before.is_empty() {
            return;
        }
        let mut b = lock(&self.baselines);
        b.insert(id.to_string(), before);
        while b.len() > KEPT {
            let Some(oldest) = b.keys().next().cloned() else { break };
            b.remove(&oldest);
        }
    }

    /// After this host's part `local_id` of fleet rollout `r` succeeded: bake, and revert when
    /// any host's bake saw a breach. `sent`: events of `r` already written for this host.
    pub(super) async fn bake_then_revert(
        self: &std::sync::Arc<Self>,
        c: &EtcdCoordinator,
        f: &FleetSettings,
        r: &FleetRollout,
        local_id: &str,
        bake: Duration,
        sent: usize,
    ) {
        let Some(summaries) = wait_for_parts(c, f, r).await else { return };
        let order = pdctl_core::fleet::revert_order(&summaries);
        if !order.contains(&f.host) {
            return; // this host changed nothing: nothing to watch or put back
        }
        let units = summaries.get(&f.host).and_then(|s| s.summary.as_ref()).map(|s| s.units.clone()).unwrap_or_default();
        let baseline = lock(&self.baselines).remove(local_id).unwrap_or_default();
        let revert = match self.bake(c, f, r, &units, &baseline, bake, &order).await {
            Some(rv) => rv,
            None => match wait_for_revert(c, f, r, &order, bake).await {
                Some(rv) => rv,
                None => return,
            },
        };
        self.revert_part(c, f, r, local_id, &revert, sent).await;
    }

    /// Watch `units` for `bake`; returns the revert request when one was written (by this host's
    /// breach or another's), `None` when this host's bake ended without one.
    #[allow(clippy::too_many_arguments)]
    async fn bake(
        &self,
        c: &EtcdCoordinator,
        f: &FleetSettings,
        r: &FleetRollout,
        units: &[String],
        baseline: &BTreeMap<String, ServiceScrape>,
        bake: Duration,
        order: &[String],
    ) -> Option<FleetRevert> {
        let key = pdctl_core::fleet::host_bake_key(&f.name, &r.id, &f.host);
        let started_at = pdctl_core::fleet::now_secs();
        let mut state = HostBake {
            host: f.host.clone(),
            state: BakeState::Baking,
            units: units.to_vec(),
            started_at,
            ends_at: started_at + bake.as_secs(),
            figures: Vec::new(),
            why: None,
        };
        let judged = match engine(self).await {
            Ok(e) => e.settings.verify.slo.map(|slo| (e, slo)).ok_or_else(|| "this host has no [verify.slo]: the bake's tolerances are its".to_string()),
            Err(cause) => Err(format!("this host's engine cannot be built: {}", cause.sentence())),
        };
        let (e, slo) = match judged {
            Ok(x) => x,
            Err(why) => {
                state.state = BakeState::NotJudged;
                state.why = Some(why);
                put_until_taken(c, &key, &state).await;
                return None;
            }
        };
        let marks = e.bake_start(units).await;
        put_until_taken(c, &key, &state).await;
        tracing::info!("fleet rollout {}: baking {} for {}", r.id, units.join(", "), humantime::format_duration(bake));
        let end = Instant::now() + bake;
        let mut next_look = Instant::now() + look_every(bake);
        loop {
            if let Some(rv) = revert_of(c, f, r).await {
                state.state = BakeState::Cancelled;
                state.why = Some(format!("{}'s bake saw a breach: the changed hosts are reverted", rv.by));
                put_until_taken(c, &key, &state).await;
                return Some(rv);
            }
            let now = Instant::now();
            if now >= next_look || now >= end {
                let looks = e.bake_look(&marks, baseline, &slo).await;
                state.figures = looks.iter().map(|l| l.sentence()).collect();
                if let Some(l) = looks.iter().find(|l| matches!(l.report.verdict, Verdict::Breach { .. })) {
                    let why = format!("{}/{}", f.host, l.sentence());
                    state.state = BakeState::Breach;
                    state.why = Some(why.clone());
                    put_until_taken(c, &key, &state).await;
                    tracing::warn!("fleet rollout {}: bake breach: {why}; reverting {}", r.id, order.join(", "));
                    let rv = FleetRevert { by: f.host.clone(), why, at: pdctl_core::fleet::now_secs(), order: order.to_vec() };
                    return Some(write_revert(c, f, r, &rv).await.unwrap_or(rv));
                }
                if now >= end {
                    let thin = not_judged(&looks);
                    state.state = if thin.is_empty() { BakeState::Passed } else { BakeState::NotJudged };
                    state.why = (!thin.is_empty()).then(|| thin.join("; "));
                    put_until_taken(c, &key, &state).await;
                    tracing::info!("fleet rollout {}: bake {}: {}", r.id, state.state.as_str(), state.figures.join("; "));
                    return None;
                }
                put_until_taken(c, &key, &state).await;
                next_look = now + look_every(bake);
            }
            tokio::time::sleep(POLL.min(end.saturating_duration_since(Instant::now())).max(Duration::from_millis(100))).await;
        }
    }

    /// This host's revert, when its turn comes (every host before it in the order reverted
    /// successfully); never after one that failed. Writes how it ended.
    async fn revert_part(
        self: &std::sync::Arc<Self>,
        c: &EtcdCoordinator,
        f: &FleetSettings,
        r: &FleetRollout,
        local_id: &str,
        rv: &FleetRevert,
        mut sent: usize,
    ) {
        let key = pdctl_core::fleet::host_revert_key(&f.name, &r.id, &f.host);
        let ended = |result: HostResult, local: Option<String>, why: String| HostSummary {
            host: f.host.clone(),
            result,
            local_id: local,
            summary: None,
            why: Some(why),
            finished_at: Some(pdctl_core::fleet::now_secs()),
        };
        let deadline = Instant::now() + TURN_WAIT;
        loop {
            use pdctl_core::fleet::RevertTurn;
            match pdctl_core::fleet::revert_turn(&rv.order, &f.host, &reverts(c, f, r).await) {
                RevertTurn::Now => break,
                RevertTurn::Wait if Instant::now() < deadline => tokio::time::sleep(POLL).await,
                RevertTurn::Wait => {
                    let why = format!("not reverted: the reverts before it did not end within {}", humantime::format_duration(TURN_WAIT));
                    put_until_taken(c, &key, &ended(HostResult::NotStarted, None, why)).await;
                    return;
                }
                RevertTurn::Never { failed } => {
                    let why = format!("not reverted: {failed}'s revert did not succeed, so the revert halts (it still runs the rollout's change)");
                    put_until_taken(c, &key, &ended(HostResult::NotStarted, None, why)).await;
                    return;
                }
            }
        }
        let reason = format!("fleet rollout {}'s bake: {}", r.id, rv.why);
        let by = StartedBy {
            uid: None,
            reason: Some(reason.clone()),
            fleet_rollout: Some(r.id.clone()),
            fleet_by: Some(format!("pdctld on {} (bake)", rv.by)),
            fleetlock: None,
            pdctld: false,
        };
        let s = match start(self.clone(), Request::Revert { id: local_id.to_string(), reason: Some(reason), allow_outage: None, config: None }, by).await {
            Ok(Started { id: Some(id), .. }) => self.follow(c, f, &r.id, &id, &mut sent, false).await,
            // Its part changed no file (a plain restart): nothing to put back, and nothing wrong.
            Ok(Started { message, .. }) => ended(HostResult::Succeeded, None, message.unwrap_or_default()),
            Err(cause) => ended(HostResult::Failed, None, format!("the revert could not start: {}", cause.sentence())),
        };
        tracing::info!("fleet rollout {}: this host's revert ended {:?}", r.id, s.result);
        put_until_taken(c, &key, &s).await;
    }
}

/// Every host's part of `r` (bounded): `None` when one did not succeed (no bake: the fleet
/// rollout failed) or they did not all end within [`PARTS_WAIT`].
async fn wait_for_parts(c: &EtcdCoordinator, f: &FleetSettings, r: &FleetRollout) -> Option<BTreeMap<String, HostSummary>> {
    let deadline = Instant::now() + PARTS_WAIT;
    loop {
        let s = fleet_summaries(c, &f.name, &r.id).await;
        if s.values().any(|x| x.result != HostResult::Succeeded) {
            return None;
        }
        if r.hosts.iter().all(|h| s.contains_key(h)) {
            return Some(s);
        }
        if Instant::now() >= deadline {
            tracing::warn!("fleet rollout {}: not every host's part ended within {}: no bake", r.id, humantime::format_duration(PARTS_WAIT));
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// After this host's bake ended without a breach: the revert request, if another host's bake
/// writes one before every changed host's bake ended.
async fn wait_for_revert(c: &EtcdCoordinator, f: &FleetSettings, r: &FleetRollout, order: &[String], bake: Duration) -> Option<FleetRevert> {
    let deadline = Instant::now() + bake + look_every(bake) + Duration::from_secs(600);
    loop {
        if let Some(rv) = revert_of(c, f, r).await {
            return Some(rv);
        }
        let bakes = bakes(c, f, r).await;
        if order.iter().all(|h| bakes.get(h).is_some_and(|b| b.state != BakeState::Baking)) || Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Write the revert request if none is there yet; the one that is there wins (`Some` of it).
async fn write_revert(c: &EtcdCoordinator, f: &FleetSettings, r: &FleetRollout, rv: &FleetRevert) -> Option<FleetRevert> {
    let key = pdctl_core::fleet::revert_key(&f.name, &r.id);
    for _ in 0..30 {
        let value = serde_json::to_vec(rv).unwrap_or_default();
        match c.cas(vec![CasChange { key: key.clone(), expect: 0, write: Write::Put(value) }]).await {
            Ok(true) => return None,
            Ok(false) => return revert_of(c, f, r).await,
            Err(e) => {
                tracing::warn!("fleet rollout {}: the revert request cannot be written yet: {e}", r.id);
                tokio::time::sleep(POLL).await;
            }
        }
    }
    None
}

/// The revert request of `r`, if one was written.
async fn revert_of(c: &EtcdCoordinator, f: &FleetSettings, r: &FleetRollout) -> Option<FleetRevert> {
    let e = c.get(&pdctl_core::fleet::revert_key(&f.name, &r.id)).await.ok().flatten()?;
    serde_json::from_slice(&e.value).ok()
}

/// Each host's bake of `r`.
async fn bakes(c: &EtcdCoordinator, f: &FleetSettings, r: &FleetRollout) -> BTreeMap<String, HostBake> {
    per_host(c, &f.name, &r.id, "/bake", |b: &HostBake| b.host.clone()).await
}

/// Each host's revert of `r`, as it ended.
async fn reverts(c: &EtcdCoordinator, f: &FleetSettings, r: &FleetRollout) -> BTreeMap<String, HostSummary> {
    per_host(c, &f.name, &r.id, "/revert", |s: &HostSummary| s.host.clone()).await
}

/// Write `v` at `key` until etcd takes it (a bounded number of tries): fleet watchers wait for it.
async fn put_until_taken<T: serde::Serialize>(c: &EtcdCoordinator, key: &str, v: &T) {
    for _ in 0..150 {
        if fleet_put(c, key, v).await.is_ok() {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    tracing::error!("{key} could not be written to etcd for 5 minutes");
}

/// The units a bake's looks could not judge, each with why.
fn not_judged(looks: &[pdctl_core::engine::BakeLook]) -> Vec<String> {
    looks
        .iter()
        .filter_map(|l| match &l.report.verdict {
            Verdict::NotJudged { why } => Some(format!("{}: {why}", l.unit)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bake_looks_every_tenth_within_ten_seconds_and_a_minute() {
        assert_eq!(look_every(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(look_every(Duration::from_secs(300)), Duration::from_secs(30));
        assert_eq!(look_every(Duration::from_secs(3600)), Duration::from_secs(60));
    }
}
