//! Wall-clock time as pdctl records it, and the measured time of a unit's start. A leaf: it
//! imports nothing of this crate.

use serde::{Deserialize, Serialize};

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// How long `unit`'s last verified start took (ExecMainStartTimestamp → its ready line), in ms,
/// and its last window out of the router (drain, stop, start, gates, re-admission): the
/// interruption to expect when it is the only worker of its role is the window; the start is a
/// lower bound where no window was measured yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartTime {
    /// Milliseconds of the start.
    pub ms: u64,
    /// When it was measured (seconds since the epoch).
    pub at: u64,
    /// Milliseconds out of the router, drain to re-admission, at its last verified restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
}
