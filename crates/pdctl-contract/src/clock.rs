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
    /// When that window ended (its re-admission; milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_until_ms: Option<u64>,
    /// The window is the interruption of a 1P1D pair restarted together with this unit
    /// (`single_pair = "together"`): from the first take-out to the last re-admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub together_with: Option<String>,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// "40s ago", "12min ago", "3h ago", "2d ago" since `at` (seconds since the epoch).
pub fn ago(at: u64) -> String {
    match now().saturating_sub(at) {
        s @ 0..=119 => format!("{s}s ago"),
        s @ 120..=7_199 => format!("{}min ago", s / 60),
        s @ 7_200..=172_799 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}
