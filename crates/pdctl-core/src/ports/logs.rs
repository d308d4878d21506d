//! The journal port ([`Logs`]): its entries for one unit, followed from a cursor.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, SystemTime};

/// One journal entry.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// `__REALTIME_TIMESTAMP` (µs since the epoch): when journald received it.
    pub realtime_us: u64,
    /// When the follower read it.
    pub read_at: SystemTime,
    /// Its fields.
    pub fields: BTreeMap<String, String>,
}

impl LogEntry {
    /// A field's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
    /// `MESSAGE` ("" when absent).
    pub fn message(&self) -> &str {
        self.get("MESSAGE").unwrap_or("")
    }
    /// Logged by pdctl or pdctld about the unit (their syslog identifier, or a `PDCTL_*` field),
    /// not by the unit or its manager.
    pub fn is_pdctl_own(&self) -> bool {
        self.get("SYSLOG_IDENTIFIER").is_some_and(|s| s == "pdctld" || s == "pdctl") || self.fields.keys().any(|k| k.starts_with("PDCTL_"))
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

/// The journal cannot be read (the driver's sentence, with what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogError(pub String);

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stream of journal entries for one unit.
pub trait Follow: Send {
    /// The next entry.
    fn next(&mut self) -> impl Future<Output = Option<Result<LogEntry, LogError>>> + Send;
}

/// The journal.
pub trait Logs: Send + Sync {
    /// Follower type.
    type F: Follow;
    /// The tail cursor (take it before the restart).
    fn tail_cursor(&self) -> impl Future<Output = Result<Option<String>, LogError>> + Send;
    /// The cursor of the first entry of boot `boot_id` (the kernel's boot id) the journal holds;
    /// `None` when it holds none. After a reboot, a ready line is looked for after it: a cursor
    /// recorded before the reboot names another boot's journal, placed only by the wall clock.
    fn boot_head_cursor(&self, boot_id: &str) -> impl Future<Output = Result<Option<String>, LogError>> + Send;
    /// Follow a unit after `cursor`.
    fn follow(&self, cursor: Option<String>, unit: &str) -> Self::F;
    /// The unit's last `n` lines: its own output and its manager's messages about it.
    fn last_lines(&self, unit: &str, n: usize) -> impl Future<Output = Result<Vec<String>, LogError>> + Send;
}
