//! `pdctl-journal`: follow journald from a cursor, and judge whether a line belongs to *this* run.
//!
//! Backed by the host's own libsystemd (`sd-journal` through the `systemd` crate) on a dedicated
//! thread — the journal handle is `!Send` — polling `sd_journal_wait` with a short timeout, which
//! journal-facts.md measured at 2-51 ms (inotify-based waits sit on journald's 250 ms timer).
//! Entries reach tokio over a channel.
//!
//! A cursor alone is not enough to find the new run's ready line: the old process can flush the
//! same line while it is being stopped. [`Judge`] accepts a line only when its
//! `_SYSTEMD_INVOCATION_ID` is the new InvocationID, or, where journald did not record one, when
//! its `_PID` is the new main PID or one of its descendants.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use systemd::journal::{Journal, OpenDirectoryOptions, OpenOptions};

/// How long the follower thread blocks in `sd_journal_wait` between polls.
pub const POLL: Duration = Duration::from_millis(5);

/// `SD_MESSAGE_UNIT_PROCESS_EXIT`: the manager's "Main process exited" message.
pub const MSG_PROCESS_EXIT: &str = "98e322203f7a4ed290d09fe03c09fe15";
/// `SD_MESSAGE_UNIT_FAILURE_RESULT`: the manager's "Failed with result" message.
pub const MSG_FAILURE_RESULT: &str = "d9b373ed55a64feb8242e02dbe79a49c";

/// Where to read the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// This machine's journal (`sd_journal_open` with `SD_JOURNAL_LOCAL_ONLY`).
    Local,
    /// A journal directory (`sd_journal_open_directory`), e.g. a sandbox's
    /// `/proc/PID/root/run/log/journal/MACHINE-ID`.
    Directory(PathBuf),
}

/// Journal errors, each with what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The journal cannot be opened or read.
    #[error("cannot read the journal{where_}: {detail}; pdctl needs read access to it (run as root, or add the user to the systemd-journal group)")]
    Read {
        /// " at DIR" or "".
        where_: String,
        /// libsystemd's error.
        detail: String,
    },
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

fn read_err(src: &Source, e: impl std::fmt::Display) -> Error {
    Error::Read {
        where_: match src {
            Source::Local => String::new(),
            Source::Directory(d) => format!(" at {}", d.display()),
        },
        detail: e.to_string(),
    }
}

fn open(src: &Source) -> Result<Journal> {
    match src {
        Source::Local => OpenOptions::default().local_only(true).open(),
        Source::Directory(d) => OpenDirectoryOptions::default().open_directory(d.as_path().to_string_lossy().as_ref()),
    }
    .map_err(|e| read_err(src, e))
}

/// One journal entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its cursor.
    pub cursor: String,
    /// `__REALTIME_TIMESTAMP` (µs since the epoch): when journald received it.
    pub realtime_us: u64,
    /// When the follower read it.
    pub read_at: SystemTime,
    /// Its fields.
    pub fields: BTreeMap<String, String>,
}

impl Entry {
    /// A field's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
    /// `MESSAGE` ("" when absent).
    pub fn message(&self) -> &str {
        self.get("MESSAGE").unwrap_or("")
    }
    /// `_PID`.
    pub fn pid(&self) -> Option<u32> {
        self.get("_PID").and_then(|p| p.parse().ok())
    }
    /// Detection latency: read time minus journald's receive time.
    pub fn latency(&self) -> Duration {
        let received = SystemTime::UNIX_EPOCH + Duration::from_micros(self.realtime_us);
        self.read_at.duration_since(received).unwrap_or_default()
    }
}

fn add_unit_matches(j: &mut Journal, unit: &str) -> std::result::Result<(), std::io::Error> {
    // The unit's own lines (system or user unit) OR the manager's messages about it.
    j.match_add("_SYSTEMD_UNIT", unit)?;
    j.match_or()?;
    j.match_add("_SYSTEMD_USER_UNIT", unit)?;
    j.match_or()?;
    j.match_add("UNIT", unit)?;
    j.match_or()?;
    j.match_add("USER_UNIT", unit)?;
    Ok(())
}

fn read_entry(j: &mut Journal) -> std::result::Result<Option<Entry>, std::io::Error> {
    let Some(fields) = j.next_entry()? else {
        return Ok(None);
    };
    Ok(Some(Entry { cursor: j.cursor()?, realtime_us: j.timestamp_usec().unwrap_or(0), read_at: SystemTime::now(), fields }))
}

/// The cursor of the journal's current tail (`None` for an empty journal). Take it *before* the
/// restart; follow from it afterwards.
pub async fn tail_cursor(src: &Source) -> Result<Option<String>> {
    let src = src.clone();
    run_blocking(move || {
        let mut j = open(&src)?;
        j.seek_tail().map_err(|e| read_err(&src, e))?;
        match j.previous() {
            Ok(0) => Ok(None),
            Ok(_) => j.cursor().map(Some).map_err(|e| read_err(&src, e)),
            Err(e) => Err(read_err(&src, e)),
        }
    })
    .await
}

/// The last `n` messages of `unit` (its own lines and the manager's about it), oldest first.
pub async fn last_lines(src: &Source, unit: &str, n: usize) -> Result<Vec<String>> {
    let (src, unit) = (src.clone(), unit.to_string());
    run_blocking(move || {
        let mut j = open(&src)?;
        add_unit_matches(&mut j, &unit).map_err(|e| read_err(&src, e))?;
        j.seek_tail().map_err(|e| read_err(&src, e))?;
        let mut out = Vec::new();
        while out.len() < n {
            match j.previous_entry() {
                Ok(Some(f)) => out.push(f.get("MESSAGE").cloned().unwrap_or_default()),
                Ok(None) => break,
                Err(e) => return Err(read_err(&src, e)),
            }
        }
        out.reverse();
        Ok(out)
    })
    .await
}

async fn run_blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(Error::Read { where_: String::new(), detail: format!("journal reader thread failed: {e}") }))
}

/// A live follower of one unit's entries; stops its thread when dropped.
pub struct Follower {
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<Entry>>,
    stop: Arc<AtomicBool>,
}

impl Follower {
    /// Start following `unit` after `cursor` (or from the tail when `None`).
    pub fn start(src: &Source, cursor: Option<String>, unit: &str) -> Follower {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (src, unit, stop2) = (src.clone(), unit.to_string(), stop.clone());
        let spawned = std::thread::Builder::new().name(format!("journal:{unit}")).spawn(move || {
            if let Err(e) = follow_loop(&src, cursor.as_deref(), &unit, &stop2, &tx) {
                let _ = tx.send(Err(e));
            }
        });
        if let Err(e) = spawned {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let _ = tx.send(Err(Error::Read { where_: String::new(), detail: format!("cannot start the reader thread: {e}") }));
            return Follower { rx, stop };
        }
        Follower { rx, stop }
    }

    /// The next entry; `None` when the reader thread ended.
    pub async fn next(&mut self) -> Option<Result<Entry>> {
        self.rx.recv().await
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn follow_loop(src: &Source, cursor: Option<&str>, unit: &str, stop: &AtomicBool, tx: &tokio::sync::mpsc::UnboundedSender<Result<Entry>>) -> Result<()> {
    let mut j = open(src)?;
    add_unit_matches(&mut j, unit).map_err(|e| read_err(src, e))?;
    match cursor {
        Some(c) => {
            j.seek_cursor(c).map_err(|e| read_err(src, e))?;
            // seek_cursor positions *at* the cursor's entry: skip it (it is before the restart).
            if let Some(e) = read_entry(&mut j).map_err(|e| read_err(src, e))? {
                if !j.test_cursor(c).unwrap_or(false) && tx.send(Ok(e)).is_err() {
                    return Ok(());
                }
            }
        }
        None => {
            j.seek_tail().map_err(|e| read_err(src, e))?;
            let _ = j.previous();
        }
    }
    while !stop.load(Ordering::Relaxed) {
        while let Some(e) = read_entry(&mut j).map_err(|e| read_err(src, e))? {
            if tx.send(Ok(e)).is_err() {
                return Ok(());
            }
        }
        j.wait(Some(POLL)).map_err(|e| read_err(src, e))?;
    }
    Ok(())
}

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
    /// The manager reports our run's main process exited or failed.
    ManagerFailure(String),
    /// A ready line, but from another run (e.g. the old process flushing while it stopped).
    ForeignReady,
    /// Nothing to act on.
    Ignore,
}

/// Classifies journal entries for one run.
#[derive(Debug, Clone)]
pub struct Judge {
    /// Substring of the ready line.
    pub ready_pattern: String,
    /// Substrings that mean the run failed.
    pub fatal_patterns: Vec<String>,
    /// The run.
    pub run: Run,
}

/// SGLang's ready line.
pub const DEFAULT_READY: &str = "The server is fired up and ready to roll!";

/// Fatal lines of SGLang start-up (sglang-facts.md, "Error strings").
pub fn default_fatal_patterns() -> Vec<String> {
    [
        "Traceback (most recent call last)",
        "Initialization failed",
        "Not enough memory",
        "Received sigquit",
        "unrecognized arguments",
        "Scheduler hit an exception",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn parent_of(procfs: &Path, pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(procfs.join(pid.to_string()).join("stat")).ok()?;
    // comm may contain spaces and parentheses: the fields after the last ')' are fixed.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

impl Judge {
    /// Is this entry from our run?
    pub fn of_this_run(&self, e: &Entry) -> bool {
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

    /// Classify one entry.
    pub fn judge(&self, e: &Entry) -> Verdict {
        if let Some(id) = e.get("MESSAGE_ID") {
            if id == MSG_PROCESS_EXIT || id == MSG_FAILURE_RESULT {
                let inv = e.get("USER_INVOCATION_ID").or_else(|| e.get("INVOCATION_ID"));
                if inv.is_some_and(|i| i == self.run.invocation_id) {
                    return Verdict::ManagerFailure(e.message().to_string());
                }
                return Verdict::Ignore;
            }
        }
        let msg = e.message();
        let ready = msg.contains(&self.ready_pattern);
        let fatal = self.fatal_patterns.iter().find(|p| msg.contains(p.as_str()));
        if !ready && fatal.is_none() {
            return Verdict::Ignore;
        }
        if !self.of_this_run(e) {
            return if ready { Verdict::ForeignReady } else { Verdict::Ignore };
        }
        match fatal {
            Some(p) => Verdict::Fatal(format!("{p}: {msg}")),
            None => Verdict::Ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[(&str, &str)]) -> Entry {
        Entry { cursor: "c".into(), realtime_us: 0, read_at: SystemTime::now(), fields: fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    fn judge(inv: &str, pid: u32) -> Judge {
        Judge {
            ready_pattern: DEFAULT_READY.into(),
            fatal_patterns: default_fatal_patterns(),
            run: Run { invocation_id: inv.into(), main_pid: pid, procfs: "/nonexistent".into() },
        }
    }

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
        assert_eq!(j.judge(&entry(&[("MESSAGE", &format!("[t] INFO:     {}", DEFAULT_READY)), ("_PID", "100")])), Verdict::Ready, "uvicorn prefix");
    }

    #[test]
    fn fatal_lines_and_manager_messages_of_this_run_only() {
        let j = judge("new", 100);
        assert!(matches!(j.judge(&entry(&[("MESSAGE", "launch_server.py: error: unrecognized arguments: --x"), ("_PID", "100")])), Verdict::Fatal(_)));
        assert_eq!(j.judge(&entry(&[("MESSAGE", "Traceback (most recent call last):"), ("_PID", "7")])), Verdict::Ignore);
        let exit = |inv: &str| {
            entry(&[
                ("MESSAGE", "x.service: Main process exited, code=exited, status=1/FAILURE"),
                ("MESSAGE_ID", MSG_PROCESS_EXIT),
                ("USER_INVOCATION_ID", inv),
            ])
        };
        assert!(matches!(j.judge(&exit("new")), Verdict::ManagerFailure(_)));
        assert_eq!(j.judge(&exit("old")), Verdict::Ignore, "the old run's exit during the restart");
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
}
