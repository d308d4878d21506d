//! A unit's `ActiveState` and `SubState` as systemd names them: the states pdctl decides by are
//! named, any other is kept by its name. A leaf: imports nothing of the crate.

/// A unit's `ActiveState` as systemd names it (`org.freedesktop.systemd1.Unit`); a state this
/// pdctl does not know is kept by its name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ActiveState {
    /// `active`: started (for a service: its main process runs).
    Active,
    /// `reloading`.
    Reloading,
    /// `inactive`: stopped, or never started.
    #[default]
    Inactive,
    /// `failed`: stopped by a failure (a crash, a start limit).
    Failed,
    /// `activating`: starting.
    Activating,
    /// `deactivating`: stopping.
    Deactivating,
    /// Any other state, by name.
    Other(String),
}

impl ActiveState {
    /// systemd's name for it.
    pub fn as_str(&self) -> &str {
        match self {
            ActiveState::Active => "active",
            ActiveState::Reloading => "reloading",
            ActiveState::Inactive => "inactive",
            ActiveState::Failed => "failed",
            ActiveState::Activating => "activating",
            ActiveState::Deactivating => "deactivating",
            ActiveState::Other(s) => s,
        }
    }
}

impl From<&str> for ActiveState {
    fn from(s: &str) -> ActiveState {
        match s {
            "active" => ActiveState::Active,
            "reloading" => ActiveState::Reloading,
            "inactive" => ActiveState::Inactive,
            "failed" => ActiveState::Failed,
            "activating" => ActiveState::Activating,
            "deactivating" => ActiveState::Deactivating,
            other => ActiveState::Other(other.to_string()),
        }
    }
}

impl From<String> for ActiveState {
    fn from(s: String) -> ActiveState {
        ActiveState::from(s.as_str())
    }
}

impl std::fmt::Display for ActiveState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A unit's `SubState` as systemd names it for a service; the ones pdctl decides by are named,
/// any other is kept by its name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SubState {
    /// `running`: the main process runs.
    Running,
    /// `auto-restart`: waiting to be restarted by `Restart=`.
    AutoRestart,
    /// `dead`: not running.
    #[default]
    Dead,
    /// Any other sub-state (`start`, `stop-sigterm`, `exited`, …), by name.
    Other(String),
}

impl SubState {
    /// systemd's name for it.
    pub fn as_str(&self) -> &str {
        match self {
            SubState::Running => "running",
            SubState::AutoRestart => "auto-restart",
            SubState::Dead => "dead",
            SubState::Other(s) => s,
        }
    }
}

impl From<&str> for SubState {
    fn from(s: &str) -> SubState {
        match s {
            "running" => SubState::Running,
            "auto-restart" => SubState::AutoRestart,
            "dead" => SubState::Dead,
            other => SubState::Other(other.to_string()),
        }
    }
}

impl From<String> for SubState {
    fn from(s: String) -> SubState {
        SubState::from(s.as_str())
    }
}

impl std::fmt::Display for SubState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
