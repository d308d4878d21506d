//! `pdctl-journal`: follow journald from a cursor for one unit, and read a unit's last lines.
//! It reports entries; which of them belong to *this* run is decided in pdctl-core (`judge`).
//!
//! Backed by the host's own libsystemd (`sd-journal` through the `systemd` crate) on a dedicated
//! thread — the journal handle is `!Send` — polling `sd_journal_wait` with a short timeout
//! (measured: the ready line detected 2-51 ms after journald received it; an inotify-only wait
//! sits on journald's 250 ms sync timer). Entries reach tokio over a channel. libsystemd follows
//! rotation and vacuuming by itself (it re-scans the directory when `sd_journal_wait` reports
//! `SD_JOURNAL_INVALIDATE`).

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use systemd::journal::{Journal, OpenDirectoryOptions, OpenOptions};

/// How long the follower thread blocks in `sd_journal_wait` between polls.
pub const POLL: Duration = Duration::from_millis(5);

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

/// One journal entry, as journald stored it (pdctl-core reads its fields).
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

/// Whether an entry the unit's matches found is the unit's: its own output (journald's trusted
/// `_SYSTEMD_UNIT`/`_SYSTEMD_USER_UNIT`), or a service manager's message about it (`UNIT=` and
/// `USER_UNIT=` are fields any client may write, so only from a trusted `_UID` of root or this
/// process's user, as a manager's are). A line any local user wrote with `logger --journald
/// UNIT=…` is not: it never reaches a gate, a stop report or a failure's last lines.
fn is_the_units(fields: &BTreeMap<String, String>, unit: &str) -> bool {
    if fields.get("_SYSTEMD_UNIT").or_else(|| fields.get("_SYSTEMD_USER_UNIT")).is_some_and(|u| u == unit) {
        return true;
    }
    let about = fields.get("UNIT").or_else(|| fields.get("USER_UNIT")).is_some_and(|u| u == unit);
    about && from_a_manager(fields)
}

/// Written by a service manager: its trusted `_UID` is root's or this process's own.
fn from_a_manager(fields: &BTreeMap<String, String>) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    static OWN: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let Some(uid) = fields.get("_UID").and_then(|u| u.parse::<u32>().ok()) else { return false };
    uid == 0 || *OWN.get_or_init(|| std::fs::metadata("/proc/self").ok().map(|m| m.uid())) == Some(uid)
}

fn read_entry(j: &mut Journal) -> std::result::Result<Option<Entry>, std::io::Error> {
    let Some(fields) = j.next_entry()? else {
        return Ok(None);
    };
    Ok(Some(Entry { cursor: j.cursor()?, realtime_us: j.timestamp_usec().unwrap_or(0), read_at: SystemTime::now(), fields }))
}

/// The cursor of the first entry the journal holds of boot `boot_id` (`None` when it holds none).
/// Following from it reads everything logged since that boot began, in the journal's own order,
/// whatever the wall clock did across the reboot.
pub async fn boot_head_cursor(src: &Source, boot_id: &str) -> Result<Option<String>> {
    let boot = boot_id.replace('-', "");
    cursor_at(src, move |j| {
        j.match_add("_BOOT_ID", boot.as_str())?;
        j.seek_head()?;
        Ok(j.next()?)
    })
    .await
}

/// The cursor of the journal's current tail (`None` for an empty journal). Take it *before* the
/// restart; follow from it afterwards.
pub async fn tail_cursor(src: &Source) -> Result<Option<String>> {
    cursor_at(src, |j| {
        j.seek_tail()?;
        Ok(j.previous()?)
    })
    .await
}

/// The cursor of the entry `step` moves a fresh reader of `src` to (it returns how many entries
/// it moved: 0 is none, then `None`).
async fn cursor_at(
    src: &Source,
    step: impl FnOnce(&mut Journal) -> std::result::Result<u64, Box<dyn std::error::Error>> + Send + 'static,
) -> Result<Option<String>> {
    let src = src.clone();
    run_blocking(move || {
        let mut j = open(&src)?;
        match step(&mut j) {
            Ok(0) => Ok(None),
            Ok(_) => j.cursor().map(Some).map_err(|e| read_err(&src, e)),
            Err(e) => Err(read_err(&src, e)),
        }
    })
    .await
}

/// An entry pdctl (or pdctld) logged itself, about the unit: not the unit's own output. pdctl never
/// names a tracing field `unit` (journald would store it as `UNIT=`, which the unit filters
/// match), but its daemon's entries carry `PDCTL_*` fields and its syslog identifier.
fn is_pdctl_own(fields: &BTreeMap<String, String>) -> bool {
    fields.get("SYSLOG_IDENTIFIER").is_some_and(|s| s == "pdctld" || s == "pdctl") || fields.keys().any(|k| k.starts_with("PDCTL_"))
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
                Ok(Some(f)) if is_pdctl_own(&f) || !is_the_units(&f, &unit) => {}
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
                if !j.test_cursor(c).unwrap_or(false) && is_the_units(&e.fields, unit) && tx.send(Ok(e)).is_err() {
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
            if is_the_units(&e.fields, unit) && tx.send(Ok(e)).is_err() {
                return Ok(());
            }
        }
        j.wait(Some(POLL)).map_err(|e| read_err(src, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_units_lines_are_its_own_output_and_its_managers_messages_not_anyones_unit_field() {
        let u = "sglang-prefill.service";
        assert!(is_the_units(&fields(&[("_SYSTEMD_UNIT", u), ("_UID", "1000")]), u), "its own output");
        assert!(is_the_units(&fields(&[("_SYSTEMD_USER_UNIT", u)]), u), "a user unit's output");
        assert!(is_the_units(&fields(&[("UNIT", u), ("_UID", "0"), ("_PID", "1")]), u), "the system manager's message");
        assert!(!is_the_units(&fields(&[("UNIT", u), ("USER_UNIT", u), ("_UID", "65534")]), u), "`logger --journald UNIT=…` by nobody");
        assert!(!is_the_units(&fields(&[("UNIT", u)]), u), "no trusted uid");
        assert!(!is_the_units(&fields(&[("_SYSTEMD_UNIT", "other.service"), ("UNIT", u), ("_UID", "65534")]), u));
    }
}
