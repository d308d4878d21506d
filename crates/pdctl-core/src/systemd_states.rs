//! The names systemd gives a unit's states and a job's and a service's results: the ones pdctl
//! decides by are variants, any other is kept by its name. A leaf: imports nothing of the crate.

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
