//! systemd's vocabulary in types: the names it gives a unit's states and a job's and a service's
//! results (the ones pdctl decides by are variants, any other is kept by its name), and a unit's
//! runtime state as its D-Bus properties give it. The systemd driver (`pdctl-systemd`) reads
//! them into these; pdctl-core decides by them.

/// An enum of systemd's names: the named variants, `Other(String)` for the rest, the first
/// named variant the default; `as_str`, `From<&str>`, `From<String>`, `Display`.
macro_rules! systemd_names {
    ($(#[$doc:meta])* $name:ident { $first_doc:literal $first:ident = $first_s:literal, $($vdoc:literal $v:ident = $s:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub enum $name {
            #[doc = $first_doc]
            #[default]
            $first,
            $(#[doc = $vdoc] $v,)*
            /// Any other, by systemd's name.
            Other(String),
        }

        impl $name {
            /// systemd's name for it.
            pub fn as_str(&self) -> &str {
                match self {
                    $name::$first => $first_s,
                    $($name::$v => $s,)*
                    $name::Other(s) => s,
                }
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> $name {
                match s {
                    $first_s => $name::$first,
                    $($s => $name::$v,)*
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> $name {
                $name::from(s.as_str())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

systemd_names! {
    /// A unit's `ActiveState` (`org.freedesktop.systemd1.Unit`).
    ActiveState {
        "`inactive`: stopped, or never started." Inactive = "inactive",
        "`active`: started (for a service: its main process runs)." Active = "active",
        "`reloading`." Reloading = "reloading",
        "`failed`: stopped by a failure (a crash, a start limit)." Failed = "failed",
        "`activating`: starting." Activating = "activating",
        "`deactivating`: stopping." Deactivating = "deactivating",
    }
}

systemd_names! {
    /// A service's `SubState` (`start`, `stop-sigterm`, `exited`, … are kept by name).
    SubState {
        "`dead`: not running." Dead = "dead",
        "`running`: the main process runs." Running = "running",
        "`auto-restart`: waiting to be restarted by `Restart=`." AutoRestart = "auto-restart",
    }
}

systemd_names! {
    /// How a job ended (the `JobRemoved` signal's result).
    JobResult {
        "`done`: it did what it was asked (for a start or restart: not failed *yet*)." Done = "done",
        "`canceled`: another job replaced it." Canceled = "canceled",
        "`timeout`: `JobTimeoutSec=` ran out." Timeout = "timeout",
        "`failed`: the unit failed while the job ran." Failed = "failed",
        "`dependency`: a unit it needs failed." Dependency = "dependency",
        "`skipped`: there was nothing to do." Skipped = "skipped",
    }
}

systemd_names! {
    /// A service's `Result` (`exit-code`, `signal`, `core-dump`, `timeout`, `oom-kill`, … are
    /// kept by name).
    ServiceResult {
        "`success`." Success = "success",
        "`start-limit-hit`: `StartLimitBurst=` starts within `StartLimitIntervalSec=`; systemd starts it no more." StartLimitHit = "start-limit-hit",
    }
}

/// A unit's runtime state, read uncached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitState {
    /// `loaded`, `not-found`, `masked`, …
    pub load_state: String,
    /// `active`, `activating`, `failed`, …
    pub active_state: ActiveState,
    /// `running`, `auto-restart`, `dead`, …
    pub sub_state: SubState,
    /// Hex InvocationID of the current run ("" when none).
    pub invocation_id: String,
    /// Main PID (0 when none).
    pub main_pid: u32,
    /// PID of the last main process, kept after it exits.
    pub exec_main_pid: u32,
    /// Automatic restarts so far.
    pub n_restarts: u32,
    /// Service result (`success`, `exit-code`, `timeout`, `start-limit-hit`, …).
    pub result: ServiceResult,
    /// CLD_* code of the main process's exit (1 exited, 2 killed, 3 dumped core).
    pub exec_main_code: i32,
    /// Exit status or signal of the main process.
    pub exec_main_status: i32,
    /// When the unit last entered `active` (µs since the epoch, 0 = never).
    pub active_enter_us: u64,
    /// When the current main process started (µs since the epoch).
    pub exec_main_start_us: u64,
    /// When the unit last left `active` — a stop began (µs since the epoch, 0 = never).
    pub active_exit_us: u64,
    /// When the unit last entered `inactive` — a stop ended (µs since the epoch, 0 = never).
    pub inactive_enter_us: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_states_keep_their_names_and_an_unknown_one_is_kept_by_name() {
        for s in ["active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance"] {
            assert_eq!(ActiveState::from(s).as_str(), s);
        }
        for s in ["running", "auto-restart", "dead", "stop-sigterm"] {
            assert_eq!(SubState::from(s).to_string(), s);
        }
        assert_eq!(ActiveState::from("failed"), ActiveState::Failed);
        assert_eq!(ActiveState::from("maintenance"), ActiveState::Other("maintenance".into()));
        assert_eq!(SubState::from("auto-restart"), SubState::AutoRestart);
        assert_eq!((ActiveState::default(), SubState::default()), (ActiveState::Inactive, SubState::Dead));
        assert_eq!(JobResult::from("done"), JobResult::Done);
        assert_eq!(JobResult::from("canceled").to_string(), "canceled");
        assert_eq!(ServiceResult::from("start-limit-hit"), ServiceResult::StartLimitHit);
        assert_eq!(ServiceResult::from("exit-code"), ServiceResult::Other("exit-code".into()));
    }
}
