//! The engine itself: the settings and the three ports every gate reaches the world through.

use crate::config::Settings;

/// Lines of the unit's log attached to a failure.
pub const LAST_LINES: usize = 20;

/// The engine: settings plus the three ports.
pub struct Engine<U, L, P> {
    /// systemd.
    pub units: U,
    /// The journal.
    pub logs: L,
    /// HTTP checks.
    pub probes: P,
    /// Validated settings.
    pub settings: Settings,
    /// The fleet's store (etcd), with `[fleet]`.
    pub coordinator: Option<std::sync::Arc<dyn crate::ports::Coordinator>>,
}
