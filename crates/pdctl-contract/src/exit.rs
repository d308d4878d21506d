//! The exit codes of `pdctl` (and the `exit_code` of a control-API error): the one table that
//! gives an outcome a number. A leaf: it imports nothing of this crate.

use serde::{Deserialize, Serialize};

/// The exit codes of `pdctl` (and the `exit_code` of a control-API error). The only place a
/// number is given to an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "i32", try_from = "i32")]
pub enum Exit {
    /// 0: success.
    Ok,
    /// 1: a gate failed; the rollout halted (or was rolled back); for `pdctl status`: a worker is
    /// not serving.
    GateFailed,
    /// 2: bad usage, request or config (also: a configured unit does not exist).
    Usage,
    /// 3: cannot reach systemd / the journal / the daemon / the router in preflight, or
    /// permission denied, or pdctld cannot write its records.
    Unreachable,
    /// 4: another rollout is running, or this host is in a restart storm.
    Busy,
    /// 5: aborted by an operator.
    Aborted,
    /// 130: the CLI was detached by Ctrl-C (SIGINT, as a shell reports it); the rollout goes on
    /// in pdctld (`pdctl rollout watch ID` re-attaches).
    Detached,
}

impl Exit {
    /// Every code, in order (for documentation tests).
    pub const ALL: [Exit; 7] = [Exit::Ok, Exit::GateFailed, Exit::Usage, Exit::Unreachable, Exit::Busy, Exit::Aborted, Exit::Detached];

    /// The process exit code.
    pub fn code(self) -> i32 {
        match self {
            Exit::Ok => 0,
            Exit::GateFailed => 1,
            Exit::Usage => 2,
            Exit::Unreachable => 3,
            Exit::Busy => 4,
            Exit::Aborted => 5,
            Exit::Detached => 130,
        }
    }

    /// The code's meaning, one line (docs/cli.md's table).
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "success",
            Exit::GateFailed => "a gate failed; the rollout halted (or was rolled back); `pdctl status`: a worker is not serving",
            Exit::Usage => "bad usage, request or config",
            Exit::Unreachable => "cannot reach systemd / the journal / pdctld / the router in preflight, or permission denied",
            Exit::Busy => "another rollout is running, or this host is in a restart storm (`restart_storm`) or in maintenance (`in_maintenance`)",
            Exit::Aborted => "aborted by an operator",
            Exit::Detached => "detached by Ctrl-C; the rollout goes on in pdctld (`pdctl rollout watch ID` re-attaches)",
        }
    }

    /// Terminate the process with this code.
    pub fn exit_process(self) -> ! {
        std::process::exit(self.code())
    }
}

impl From<Exit> for i32 {
    fn from(e: Exit) -> i32 {
        e.code()
    }
}

impl TryFrom<i32> for Exit {
    type Error = String;
    fn try_from(c: i32) -> Result<Exit, String> {
        Exit::ALL.into_iter().find(|e| e.code() == c).ok_or_else(|| format!("{c} is not one of pdctl's exit codes"))
    }
}
