//! Who started a rollout, as its record keeps it: an account (the control socket's peer, or the
//! FleetLock caller the kernel's socket table names), a fleet rollout, or pdctld itself.

use serde::{Deserialize, Serialize};

/// Who started a rollout: the control socket's peer (its uid, from the kernel: `SO_PEERCRED`), or
/// a fleet rollout (its id, and who started that), and the `--reason` given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StartedBy {
    /// The uid of the process on the other end of the control socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The fleet rollout this host's part belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_rollout: Option<String>,
    /// Who started that fleet rollout (`uid N on HOST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_by: Option<String>,
    /// The update agent's FleetLock id whose `pre-reboot` (or `steady-state`) started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleetlock: Option<String>,
    /// pdctld started it by itself, not for a caller: at its start, the resume of a host whose
    /// maintenance was under way; a change of ratio by `[maintenance] balance_roles`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pdctld: bool,
}

impl StartedBy {
    /// Who, in a few words: `fleetlock ID`, `fleet rollout ID`, `uid N`, `pdctld itself`, or
    /// `unknown` (a caller whose uid the control socket could not tell).
    pub fn who(&self) -> String {
        match (&self.fleetlock, &self.fleet_rollout, self.uid) {
            (Some(id), _, Some(uid)) => format!("fleetlock {id} (uid {uid})"),
            (Some(id), _, None) => format!("fleetlock {id}"),
            (None, Some(f), _) => format!("fleet rollout {f}"),
            (None, None, Some(uid)) => format!("uid {uid}"),
            (None, None, None) if self.pdctld => "pdctld itself".into(),
            (None, None, None) => "unknown".into(),
        }
    }
}
