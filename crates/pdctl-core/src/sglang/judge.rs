//! What the drivers' facts mean: which journal lines belong to *this* run of a unit (the ready
//! line, a fatal line, the manager's report that it exited), and whether a unit crashed or was
//! restarted behind our back. The engine's gates ask these two questions and nothing else does.

use std::path::{Path, PathBuf};

use crate::ports::{ActiveState, LogEntry, SubState, UnitState};

/// `SD_MESSAGE_UNIT_PROCESS_EXIT` (systemd's `sd-messages.h`): the manager's "Main process exited".
pub const MSG_PROCESS_EXIT: &str = "98e322203f7a4ed290d09fe03c09fe15";
/// `SD_MESSAGE_UNIT_FAILURE_RESULT`: the manager's "Failed with result".
pub const MSG_FAILURE_RESULT: &str = "d9b373ed55a64feb8242e02dbe79a49c";
/// `SD_MESSAGE_UNIT_STARTING`: the manager's "Starting …", logged before it forks the run's
/// first process (`ExecStartPre=` or the main one).
pub const MSG_UNIT_STARTING: &str = "7d4958e842da4a758f6c1cdc7b36dcc5";

/// The identity of the run we restarted.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Hex InvocationID of the new run.
    pub invocation_id: String,
    /// Its main PID (or ExecMainPID when it already exited).
    pub main_pid: u32,
    /// procfs to walk for descendants (`/proc`, or a sandbox's `/proc/PID/root/proc`).
    pub procfs: PathBuf,
}

/// What a line means for the ready step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The ready line of this run.
    Ready,
    /// A fatal line of this run (the matching pattern and the line).
    Fatal(String),
    /// A line of this run that explains a failure if the run then exits, and is nothing if it
    /// goes on to be ready (a traceback: [`crate::sglang::SUSPECT_PATTERNS`]).
    Suspect(String),
    /// The manager reports our run's main process exited or failed.
    ManagerFailure(String),
    /// A ready line, but from another run (e.g. the old process flushing while it stopped).
    ForeignReady,
    /// Nothing to act on.
    Ignore,
}

/// Classifies journal entries for one run.
///
/// A journal cursor alone is not enough to find the new run's ready line: the old process can
/// flush the same line while it is being stopped, after the cursor was taken. So a line counts
/// only when its `_SYSTEMD_INVOCATION_ID` is the new InvocationID, or, where journald did not
/// record one (user managers of systemd 252 do not), when its `_PID` is the new main PID or a
/// descendant of it.
#[derive(Debug, Clone)]
pub struct Judge {
    /// Substring of the ready line.
    pub ready_pattern: String,
    /// Substrings that mean the run failed.
    pub fatal_patterns: Vec<String>,
    /// The run.
    pub run: Run,
}

fn parent_of(procfs: &Path, pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(procfs.join(pid.to_string()).join("stat")).ok()?;
    // comm may contain spaces and parentheses: the fields after the last ')' are fixed.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

impl Judge {
    /// Is this entry from our run?
    pub fn of_this_run(&self, e: &LogEntry) -> bool {
        if let Some(inv) = e.get("_SYSTEMD_INVOCATION_ID") {
            if !self.run.invocation_id.is_empty() && inv == self.run.invocation_id {
                return true;
            }
            // On systemd 239-244 a user unit's lines carry user@UID.service's id: the PID decides.
            return e.get("_SYSTEMD_USER_UNIT").is_some() && self.is_ours(e.pid());
        }
        self.is_ours(e.pid())
    }

    fn is_ours(&self, pid: Option<u32>) -> bool {
        let (Some(mut p), main) = (pid, self.run.main_pid) else {
            return false;
        };
        if main == 0 {
            return false;
        }
        for _ in 0..64 {
            if p == main {
                return true;
            }
            match parent_of(&self.run.procfs, p) {
                Some(pp) if pp > 1 && pp != p => p = pp,
                _ => return false,
            }
        }
        false
    }

    /// The run (its InvocationID) a manager's message `id` is about, when `e` is one.
    pub fn manager_message<'e>(&self, e: &'e LogEntry, id: &str) -> Option<&'e str> {
        if e.get("MESSAGE_ID") != Some(id) || !from_a_manager(e) {
            return None;
        }
        e.get("USER_INVOCATION_ID").or_else(|| e.get("INVOCATION_ID")).filter(|i| !i.is_empty())
    }

    /// A fatal line by its text alone, whichever process logged it (the matching pattern and
    /// the line): for a run known to have exited, a line between the manager's "Starting" of
    /// the run pdctl started and that run's "Failed with result" is the run's own even where
    /// neither its InvocationID nor its PID can be checked (the process was gone before it was
    /// judged).
    pub fn fatal_text(&self, e: &LogEntry) -> Option<String> {
        let msg = e.message();
        self.fatal_patterns.iter().find(|p| !p.is_empty() && msg.contains(p.as_str())).map(|p| format!("{p}: {msg}"))
    }

    /// Classify one entry.
    pub fn judge(&self, e: &LogEntry) -> Verdict {
        if let Some(id) = e.get("MESSAGE_ID") {
            if id == MSG_PROCESS_EXIT || id == MSG_FAILURE_RESULT {
                // `MESSAGE_ID` and `INVOCATION_ID` are fields any client may write (`logger
                // --journald`), and the new run's InvocationID is world-readable: only `_UID`,
                // which journald sets itself, says the entry comes from a manager.
                if !from_a_manager(e) {
                    return Verdict::Ignore;
                }
                let inv = e.get("USER_INVOCATION_ID").or_else(|| e.get("INVOCATION_ID"));
                if inv.is_some_and(|i| i == self.run.invocation_id) {
                    return Verdict::ManagerFailure(e.message().to_string());
                }
                return Verdict::Ignore;
            }
        }
        let msg = e.message();
        let ready = !self.ready_pattern.is_empty() && msg.contains(&self.ready_pattern);
        let fatal = self.fatal_patterns.iter().find(|p| !p.is_empty() && msg.contains(p.as_str()));
        let suspect = crate::sglang::SUSPECT_PATTERNS.iter().find(|p| msg.contains(*p));
        if !ready && fatal.is_none() && suspect.is_none() {
            return Verdict::Ignore;
        }
        if !self.of_this_run(e) {
            return if ready { Verdict::ForeignReady } else { Verdict::Ignore };
        }
        match (fatal, ready, suspect) {
            (Some(p), _, _) => Verdict::Fatal(format!("{p}: {msg}")),
            (None, true, _) => Verdict::Ready,
            (None, false, Some(p)) => Verdict::Suspect(format!("{p}: {msg}")),
            (None, false, None) => Verdict::Ignore,
        }
    }
}

/// Whether an entry was written by a service manager: its `_UID` (a trusted field: journald sets
/// it from the sender's credentials) is root's — the system manager, PID 1, and root's user
/// manager — or this process's own (a user manager of the user pdctld runs as). An unprivileged
/// user's forged "process exited" is not.
fn from_a_manager(e: &LogEntry) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // This process's effective uid (/proc/self belongs to it), read once.
    static OWN: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let Some(uid) = e.get("_UID").and_then(|u| u.parse::<u32>().ok()) else { return false };
    uid == 0 || *OWN.get_or_init(|| std::fs::metadata("/proc/self").ok().map(|m| m.uid())) == Some(uid)
}

fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// The crash rule: did the unit crash, stop or get restarted since `base` (our run)? Returns
/// what happened. systemd's job result `done` only means "not failed yet", and `Restart=` hides
/// a crash (the unit is `active` again a moment later), so a restart is seen in `NRestarts`, the
/// `auto-restart` sub-state, or a new InvocationID.
pub fn crashed_since(now: &UnitState, base: &UnitState) -> Option<String> {
    if now.active_state == ActiveState::Failed {
        return Some(format!(
            "the unit failed (result {}, main process {} with status {})",
            now.result,
            match now.exec_main_code {
                1 => "exited",
                2 => "was killed",
                3 => "dumped core",
                _ => "ended",
            },
            now.exec_main_status
        ));
    }
    if now.sub_state == SubState::AutoRestart || now.n_restarts > base.n_restarts {
        return Some(format!("the unit crashed and systemd restarted it (NRestarts {} → {}, Restart= hid the crash)", base.n_restarts, now.n_restarts));
    }
    if !base.invocation_id.is_empty() && now.invocation_id != base.invocation_id {
        return Some(format!("the unit was started again by someone else (InvocationID {} → {})", short(&base.invocation_id), short(&now.invocation_id)));
    }
    if matches!(now.active_state, ActiveState::Inactive | ActiveState::Deactivating) {
        return Some(format!("the unit stopped ({}/{}, result {}, exit status {})", now.active_state, now.sub_state, now.result, now.exec_main_status));
    }
    None
}

/// Journal entries and a judge of one run, for the tests of whoever judges lines.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::SystemTime;

    use super::{Judge, Run};
    use crate::ports::LogEntry;
    use crate::sglang::{FATAL_PATTERNS, READY_LINE};

    /// An entry with these fields.
    pub(crate) fn entry(fields: &[(&str, &str)]) -> LogEntry {
        LogEntry { realtime_us: 0, read_at: SystemTime::now(), fields: fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    /// The judge of run `inv` whose main process is `pid`, with SGLang's ready and fatal lines.
    pub(crate) fn judge(inv: &str, pid: u32) -> Judge {
        Judge {
            ready_pattern: READY_LINE.into(),
            fatal_patterns: FATAL_PATTERNS.iter().map(|s| s.to_string()).collect(),
            run: Run { invocation_id: inv.into(), main_pid: pid, procfs: "/nonexistent".into() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{entry, judge};
    use super::*;
    use crate::sglang::READY_LINE;

    const READY: &str = "[2026-05-01 12:00:00] The server is fired up and ready to roll!";

    #[test]
    fn invocation_id_decides_when_present() {
        let j = judge("new", 100);
        assert_eq!(j.judge(&entry(&[("MESSAGE", READY), ("_SYSTEMD_INVOCATION_ID", "new"), ("_PID", "5")])), Verdict::Ready);
        assert_eq!(j.judge(&entry(&[("MESSAGE", READY), ("_SYSTEMD_INVOCATION_ID", "old"), ("_PID", "100")])), Verdict::ForeignReady);
    }

    #[test]
    fn pid_decides_without_invocation_id() {
        let j = judge("new", 100);
        assert_eq!(j.judge(&entry(&[("MESSAGE", READY), ("_PID", "100")])), Verdict::Ready);
        assert_eq!(j.judge(&entry(&[("MESSAGE", READY), ("_PID", "99")])), Verdict::ForeignReady, "the old process flushing its buffer");
        assert_eq!(j.judge(&entry(&[("MESSAGE", &format!("[t] INFO:     {READY_LINE}")), ("_PID", "100")])), Verdict::Ready, "uvicorn prefix");
    }

    #[test]
    fn a_managers_message_names_its_run_and_a_fatal_line_is_found_by_its_text() {
        let j = judge("new", 100);
        let starting = |uid: &str| entry(&[("MESSAGE", "Starting x.service..."), ("MESSAGE_ID", MSG_UNIT_STARTING), ("INVOCATION_ID", "other"), ("_UID", uid)]);
        assert_eq!(j.manager_message(&starting("0"), MSG_UNIT_STARTING), Some("other"), "any run's, not only the judged one's");
        assert_eq!(j.manager_message(&starting("0"), MSG_FAILURE_RESULT), None, "another message");
        assert_eq!(j.manager_message(&starting("65534"), MSG_UNIT_STARTING), None, "written by a client, not a manager");
        let gone = entry(&[("MESSAGE", "launch_server.py: error: unrecognized arguments: --x"), ("_PID", "7")]);
        assert_eq!(j.judge(&gone), Verdict::Ignore, "not attributable to the run by its PID");
        assert_eq!(j.fatal_text(&gone).as_deref(), Some("unrecognized arguments: launch_server.py: error: unrecognized arguments: --x"));
        assert_eq!(j.fatal_text(&entry(&[("MESSAGE", READY)])), None);
    }

    #[test]
    fn fatal_lines_and_manager_messages_of_this_run_only() {
        let j = judge("new", 100);
        assert!(matches!(j.judge(&entry(&[("MESSAGE", "launch_server.py: error: unrecognized arguments: --x"), ("_PID", "100")])), Verdict::Fatal(_)));
        assert_eq!(j.judge(&entry(&[("MESSAGE", "Traceback (most recent call last):"), ("_PID", "7")])), Verdict::Ignore);
        // A traceback of this run alone is not a failed start (SGLang 0.5.23 logs warnings with
        // one); with a fatal pattern on the same line it is fatal.
        assert!(matches!(j.judge(&entry(&[("MESSAGE", "Traceback (most recent call last):"), ("_PID", "100")])), Verdict::Suspect(_)));
        assert!(matches!(
            j.judge(&entry(&[("MESSAGE", "Scheduler hit an exception: Traceback (most recent call last):"), ("_PID", "100")])),
            Verdict::Fatal(_)
        ));
        let exit = |inv: &str, uid: Option<&str>| {
            let mut fields = vec![
                ("MESSAGE", "x.service: Main process exited, code=exited, status=1/FAILURE"),
                ("MESSAGE_ID", MSG_PROCESS_EXIT),
                ("USER_INVOCATION_ID", inv),
            ];
            fields.extend(uid.map(|u| ("_UID", u)));
            entry(&fields)
        };
        assert!(matches!(j.judge(&exit("new", Some("0"))), Verdict::ManagerFailure(_)));
        assert_eq!(j.judge(&exit("old", Some("0"))), Verdict::Ignore, "the old run's exit during the restart");
    }

    #[test]
    fn a_forged_manager_message_is_not_trusted() {
        let j = judge("new", 100);
        // systemd's "process exited" for the new run, written by an unprivileged user with
        // `logger --journald` (MESSAGE_ID and the InvocationID are fields anyone may set).
        let forged = |uid: Option<&str>| {
            let mut fields =
                vec![("MESSAGE", "x.service: Main process exited, code=killed, status=9/KILL"), ("MESSAGE_ID", MSG_PROCESS_EXIT), ("INVOCATION_ID", "new")];
            fields.extend(uid.map(|u| ("_UID", u)));
            entry(&fields)
        };
        assert_eq!(j.judge(&forged(Some("65534"))), Verdict::Ignore, "forged by uid 65534");
        assert_eq!(j.judge(&forged(None)), Verdict::Ignore, "no trusted sender");
        assert!(matches!(j.judge(&forged(Some("0"))), Verdict::ManagerFailure(_)), "the manager's own");
    }

    #[test]
    fn descendants_count_as_this_run() {
        // Our own process tree: this test process's parent chain contains its parent.
        let me = std::process::id();
        let parent = parent_of(Path::new("/proc"), me).unwrap();
        let mut j = judge("", parent);
        j.run.procfs = "/proc".into();
        assert_eq!(j.judge(&entry(&[("MESSAGE", READY), ("_PID", &me.to_string())])), Verdict::Ready);
    }

    fn st(active: &str, sub: &str, inv: &str, n: u32) -> UnitState {
        UnitState {
            load_state: "loaded".into(),
            active_state: active.into(),
            sub_state: sub.into(),
            invocation_id: inv.into(),
            main_pid: 10,
            exec_main_pid: 10,
            n_restarts: n,
            result: "success".into(),
            ..Default::default()
        }
    }

    #[test]
    fn crash_rules() {
        let base = st("active", "running", "aa", 0);
        assert_eq!(crashed_since(&st("active", "running", "aa", 0), &base), None);
        assert_eq!(crashed_since(&st("activating", "start", "aa", 0), &base), None);
        assert!(crashed_since(&st("failed", "failed", "aa", 0), &base).unwrap().contains("failed"));
        assert!(crashed_since(&st("activating", "auto-restart", "aa", 0), &base).unwrap().contains("restarted"));
        // Restart= hid the crash: active again, but NRestarts and InvocationID moved.
        assert!(crashed_since(&st("active", "running", "bb", 1), &base).unwrap().contains("NRestarts 0 → 1"));
        assert!(crashed_since(&st("active", "running", "bb", 0), &base).unwrap().contains("InvocationID"));
        assert!(crashed_since(&st("inactive", "dead", "aa", 0), &base).unwrap().contains("stopped"));
    }
}
