//! The fleet's keys and values, and the rules of a slot semaphore: pure, no I/O.

pub use pdctl_contract::records::{FleetWeights, HostResult};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The key prefix of fleet `name`.
pub fn prefix(name: &str) -> String {
    format!("/pdctl/{name}/")
}

/// The semaphore key of `role`.
pub fn slot_key(name: &str, role: &str) -> String {
    format!("{}slots/{role}", prefix(name))
}

/// How many hold `role`'s slots now (its semaphore's holders, as text), written in the same
/// transaction as every grant and release: what waiting hosts watch. A semaphore's value grows
/// with its holders and every change of a watched key goes to every watcher; this one stays a
/// few bytes (watching the semaphores themselves was measured much slower at 1,000 waiting hosts:
/// docs/fleet.md, "Measured: what the fleet asks of etcd").
pub fn free_key(name: &str, role: &str) -> String {
    format!("{}held/{role}", prefix(name))
}

/// The liveness key of `host`.
pub fn host_key(name: &str, host: &str) -> String {
    format!("{}hosts/{host}", prefix(name))
}

/// The limits key.
pub fn limits_key(name: &str) -> String {
    format!("{}limits", prefix(name))
}

/// The pause key.
pub fn pause_key(name: &str) -> String {
    format!("{}paused", prefix(name))
}

/// When the last pause was lifted (seconds since the epoch): self-restarts before it do not
/// make a storm again.
pub fn storm_since_key(name: &str) -> String {
    format!("{}storm_since", prefix(name))
}

/// The fleet-wide limits (in etcd; every host's config must agree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Workers of each role that may be down at once, fleet-wide.
    pub max_unavailable: BTreeMap<String, u32>,
}

impl Limits {
    /// Where `local` disagrees with these (etcd's): the first role whose limits differ.
    pub fn disagreement(&self, local: &Limits) -> Option<LimitsDisagree> {
        let roles: std::collections::BTreeSet<&String> = self.max_unavailable.keys().chain(local.max_unavailable.keys()).collect();
        roles.into_iter().find_map(|r| {
            let (a, b) = (self.max_unavailable.get(r), local.max_unavailable.get(r));
            let show = |v: Option<&u32>| v.map(|n| n.to_string()).unwrap_or_else(|| "unset".into());
            (a != b).then(|| LimitsDisagree { role: r.clone(), etcd: show(a), local: show(b) })
        })
    }

    /// The limit of `role` (a role without one: 1).
    pub fn of(&self, role: &str) -> u32 {
        self.max_unavailable.get(role).copied().unwrap_or(1)
    }
}

/// A role whose fleet-wide limit in etcd (written by the first host) differs from this host's
/// config; each value shown as written, or `unset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsDisagree {
    /// The role.
    pub role: String,
    /// etcd's limit.
    pub etcd: String,
    /// This host's limit.
    pub local: String,
}

impl From<LimitsDisagree> for crate::cause::Cause {
    fn from(d: LimitsDisagree) -> crate::cause::Cause {
        crate::cause::Cause::FleetLimits { role: d.role, etcd: d.etcd, local: d.local }
    }
}

/// One held slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hold {
    /// `host/unit`: who holds it.
    pub holder: String,
    /// Its worker's URL (as the gateway lists it).
    pub url: String,
    /// Drawn per acquisition: a late release of an older hold cannot free a newer one.
    pub token: String,
    /// When it was taken (seconds since the epoch).
    pub since: u64,
    /// The rollout that took it.
    pub rollout: String,
}

/// `holder` of a unit on a host.
pub fn holder(host: &str, unit: &str) -> String {
    format!("{host}/{unit}")
}

/// The holders of one role's slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Semaphore {
    /// Current holds.
    pub holders: Vec<Hold>,
}

/// Whether a slot can be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Take it (add the hold).
    Grant,
    /// The holder holds one already (a retry after a lost answer): it is that hold.
    AlreadyHeld(Hold),
    /// No slot is free: who holds them, and the unhealthy workers counted against the budget.
    Wait {
        /// The holds.
        holders: Vec<Hold>,
        /// URLs the gateway reports unhealthy that hold no slot.
        unhealthy: Vec<String>,
    },
}

impl Semaphore {
    /// Whether `want` may take a slot of a role limited to `max`, with the role's workers the
    /// gateway reports unhealthy (`unhealthy`, URLs): those that hold no slot are down anyway and
    /// count against the budget.
    pub fn decide(&self, want: &Hold, max: u32, unhealthy: &[String]) -> Decision {
        if let Some(h) = self.holders.iter().find(|h| h.holder == want.holder) {
            return Decision::AlreadyHeld(h.clone());
        }
        let down: Vec<String> = unhealthy
            .iter()
            .filter(|u| !self.holders.iter().any(|h| crate::url::same_url(&h.url, u)) && !crate::url::same_url(u, &want.url))
            .cloned()
            .collect();
        if self.holders.len() + down.len() < max as usize {
            Decision::Grant
        } else {
            Decision::Wait { holders: self.holders.clone(), unhealthy: down }
        }
    }

    /// Remove `holder`'s hold if it is the one with `token`; whether it was there.
    pub fn release(&mut self, holder: &str, token: &str) -> bool {
        let before = self.holders.len();
        self.holders.retain(|h| !(h.holder == holder && h.token == token));
        self.holders.len() != before
    }

    /// Remove every hold of `holder` — `host/unit`, or `host` for all of that host's (an
    /// operator's release); the removed holds.
    pub fn release_all(&mut self, holder: &str) -> Vec<Hold> {
        let host_prefix = format!("{holder}/");
        let (gone, kept): (Vec<Hold>, Vec<Hold>) =
            std::mem::take(&mut self.holders).into_iter().partition(|h| h.holder == holder || h.holder.starts_with(&host_prefix));
        self.holders = kept;
        gone
    }
}

/// What "waiting for a prefill slot: held by … since …" says.
pub fn waiting_sentence(role: &str, holders: &[Hold], unhealthy: &[String]) -> String {
    let mut parts: Vec<String> = holders
        .iter()
        .map(|h| {
            // A host in maintenance says so: it is rebooting, not stuck.
            let what = if h.rollout.ends_with(pdctl_contract::records::MAINTENANCE_HOLD) { " (its host is in maintenance)" } else { "" };
            format!("held by {}{what} since {}", h.holder, clock(h.since))
        })
        .collect();
    parts.extend(unhealthy.iter().map(|u| format!("{u} is unhealthy in the gateway")));
    format!("waiting for a {role} slot: {}", parts.join("; "))
}

/// `14:02:11` (UTC) of a time in seconds since the epoch.
pub fn clock(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    s.get(11..19).map(String::from).unwrap_or(s)
}

/// A host's liveness value (bound to its lease).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Read by other hosts, never rewritten by them: a newer pdctl's added field is tolerated
// (skipped), so one host's upgrade does not blind the others.
pub struct HostState {
    /// The host.
    pub host: String,
    /// pdctld's version.
    pub version: String,
    /// The rollout it runs, if any.
    pub rollout: Option<String>,
    /// Its workers.
    pub workers: Vec<HostWorker>,
    /// Its workers' restarts pdctl did not make, within the storm rule's window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub self_restarts: Vec<crate::service::storm::SelfRestart>,
    /// Its maintenance, while it is in one (its slots are held meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<InMaintenance>,
    /// When this value was written (seconds since the epoch).
    pub updated_at: u64,
}

/// A host's maintenance in its liveness value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// Read by other hosts: a newer pdctl's added field is tolerated.
pub struct InMaintenance {
    /// The host drain.
    pub id: String,
    /// Where it stands.
    pub phase: pdctl_contract::records::MaintenancePhase,
    /// Since when (seconds since the epoch).
    pub since: u64,
}

/// One worker in a host's liveness value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Read by other hosts, never rewritten by them: a newer pdctl's added field is tolerated
// (skipped), so one host's upgrade does not blind the others.
pub struct HostWorker {
    /// The unit.
    pub unit: String,
    /// Its URL (as the gateway lists it).
    #[serde(default)]
    pub url: String,
    /// Its role.
    pub role: String,
    /// `active/running`, …
    pub state: String,
    /// KV usage (0..1), when its gauges are published.
    pub kv_usage: Option<f64>,
}

/// Per role, the URLs of the workers the hosts report not `active/running` (crashed, restarting
/// by themselves, stopped): down whoever caused it, so they count against the role's budget.
pub fn down_workers(hosts: &[HostState]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in hosts.iter().flat_map(|h| &h.workers) {
        if w.state != "active/running" && !w.url.is_empty() {
            out.entry(w.role.clone()).or_default().push(w.url.clone());
        }
    }
    out
}

/// A fleet-wide pause: no new slot is granted while it is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pause {
    /// Who (`uid N on HOST`).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (seconds since the epoch).
    pub at: u64,
}

/// A slot this host holds or is about to take, written down before the transaction (so that a
/// crash between the grant and the release finds it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotRecord {
    /// The role's semaphore.
    pub role: String,
    /// The hold.
    pub hold: Hold,
}

/// A token for a new hold.
pub fn token() -> String {
    format!("{:016x}", crate::sglang::pairing::room())
}

/// Now, in seconds since the epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A fleet rollout as stored in etcd (`rollouts/<id>`), watched by every pdctld.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// Read by other hosts, never rewritten by them: a newer pdctl's added field is tolerated
// (skipped), so one host's upgrade does not blind the others.
pub struct FleetRollout {
    /// Its id (`f<seconds>`).
    pub id: String,
    /// The hosts taking part.
    pub hosts: Vec<String>,
    /// Taking the only worker of a role (fleet-wide) down is accepted.
    pub allow_outage: bool,
    /// Who started it (`uid N on HOST`).
    pub by: String,
    /// Why.
    pub reason: Option<String>,
    /// This host goes first; the others start only once it succeeded.
    pub canary: Option<String>,
    /// When (seconds since the epoch).
    pub created_at: u64,
    /// Only these units (empty: every worker of each host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    /// A repair: the restarted prefill (`host/unit`) whose stale pairing this fixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_of: Option<String>,
    /// Each host's restart may load unit changes its workers do not run yet (`--load-changes`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub load_changes: bool,
    /// After the last host: how long (seconds) every changed worker is watched, a breach
    /// reverting the changed hosts (`[fleet] bake` of the host that wrote the request).
    /// Another host's value, so bounded as `[fleet] bake` is (at most [`MAX_BAKE_SECS`]): a larger
    /// one does not decode (an `Instant` that far ahead would overflow).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "bounded_bake")]
    pub bake_secs: Option<u64>,
    /// Not a restart: new weights, every host's workers paused, loaded and continued in step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<FleetWeights>,
}

/// The longest bake a fleet request may ask for (24 h, `[fleet] bake`'s bound).
pub const MAX_BAKE_SECS: u64 = 24 * 3600;

fn bounded_bake<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let v: Option<u64> = Option::deserialize(d)?;
    match v {
        Some(s) if s > MAX_BAKE_SECS => Err(serde::de::Error::custom(format!("bake_secs {s} is more than {MAX_BAKE_SECS} (24 h)"))),
        v => Ok(v),
    }
}

/// A host's step of a fleet rollout that moves every host in step
/// (`rollouts/<id>/hosts/<host>/<kind>/<phase>`): for new weights (`kind` `weights`), `paused`
/// once all its workers are paused and `loaded` once each serves the new weights; for a
/// coherent fleet switch (`kind` `switch`), `verified`, `out`, `in` and `back`
/// (see `engine/fleet/switch.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// Read by other hosts, never rewritten by them: a newer pdctl's added field is tolerated
// (skipped), so one host's upgrade does not blind the others.
pub struct HostPhase {
    /// The host.
    pub host: String,
    /// Whether it got there (`false`: `why`).
    pub ok: bool,
    /// What failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The key of `host`'s `phase` of `kind` (`weights`, `switch`) in fleet rollout `id`.
pub fn phase_key(name: &str, id: &str, host: &str, kind: &str, phase: &str) -> String {
    format!("{}{host}/{kind}/{phase}", rollout_hosts_prefix(name, id))
}

/// One host's event of a fleet rollout (`rollouts/<id>/hosts/<host>/events/<seq>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Read by other hosts, never rewritten by them: a newer pdctl's added field is tolerated
// (skipped), so one host's upgrade does not blind the others.
pub struct HostEvent {
    /// The host.
    pub host: String,
    /// The event of its local rollout.
    pub event: crate::events::Event,
}

/// How one host's part ended (`rollouts/<id>/hosts/<host>/summary`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Read by other hosts, never rewritten by them: a newer pdctl's added field is tolerated
// (skipped), so one host's upgrade does not blind the others.
pub struct HostSummary {
    /// The host.
    pub host: String,
    /// Its result.
    pub result: HostResult,
    /// Its local rollout's id, if one started.
    pub local_id: Option<String>,
    /// Its local rollout's summary, if it ended with one.
    pub summary: Option<crate::events::Summary>,
    /// Why it did not start, or ended without a summary.
    pub why: Option<String>,
    /// When it ended (seconds since the epoch): a revert goes from the last to have finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
}

impl HostSummary {
    /// `host`'s part ended now with `result` and no local rollout (not started, or cut short
    /// before one), saying why.
    pub fn ended_without_rollout(host: &str, result: HostResult, why: String) -> HostSummary {
        HostSummary { host: host.to_string(), result, local_id: None, summary: None, why: Some(why), finished_at: Some(crate::fleet::now_secs()) }
    }
}

/// Where fleet rollout requests are (every pdctld reads this prefix, so it holds only requests).
pub fn requests_prefix(name: &str) -> String {
    format!("{}requests/", prefix(name))
}

/// The key of fleet rollout `id`'s request.
pub fn rollout_key(name: &str, id: &str) -> String {
    format!("{}{id}", requests_prefix(name))
}

/// Where the hosts' lines of fleet rollout `id` are.
pub fn rollout_hosts_prefix(name: &str, id: &str) -> String {
    format!("{}rollouts/{id}/hosts/", prefix(name))
}

/// The key of `host`'s event number `seq` of fleet rollout `id`.
pub fn host_event_key(name: &str, id: &str, host: &str, seq: usize) -> String {
    format!("{}{host}/events/{seq:08}", rollout_hosts_prefix(name, id))
}

/// The key of `host`'s summary of fleet rollout `id`.
pub fn host_summary_key(name: &str, id: &str, host: &str) -> String {
    format!("{}{host}/summary", rollout_hosts_prefix(name, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bake_beyond_its_bound_from_another_host_does_not_decode() {
        let req = |bake: u64| serde_json::json!({"id": "f1", "hosts": ["a"], "allow_outage": false, "by": "uid 0 on a", "reason": null, "canary": null, "created_at": 1, "bake_secs": bake});
        assert_eq!(serde_json::from_value::<FleetRollout>(req(600)).map(|r| r.bake_secs).ok(), Some(Some(600)));
        // u64::MAX seconds would overflow `Instant::now() + bake` and panic the bake task.
        let e = serde_json::from_value::<FleetRollout>(req(u64::MAX)).expect_err("out of bounds");
        assert!(e.to_string().contains("more than 86400"), "{e}");
    }
}
