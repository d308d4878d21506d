//! Following the sandbox's journal from outside (`journalctl -D … -f -o json`), for test support
//! and the demo. pdctl itself reads the journal through libsystemd (pdctl-journal); this is only
//! the harness's independent view of what journald recorded.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Result, Sandbox, SandboxError};

/// A live `journalctl -f` on the sandbox's journal; killed on drop.
pub struct JournalFollower {
    child: Child,
    rx: Receiver<Value>,
}

impl JournalFollower {
    /// Wait until an entry satisfies `pred`, at most `deadline`. Entries before it are consumed.
    pub fn wait_for(&mut self, deadline: Duration, mut pred: impl FnMut(&Value) -> bool) -> Option<Value> {
        let end = Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(v) if pred(&v) => return Some(v),
                Ok(_) => continue,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

impl Drop for JournalFollower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The string value of a journal field (`journalctl -o json` gives arrays for binary data).
pub fn field<'a>(entry: &'a Value, name: &str) -> Option<&'a str> {
    entry.get(name).and_then(Value::as_str)
}

impl Sandbox {
    /// Follow the whole journal from its beginning, with journalctl match arguments
    /// (e.g. `["_SYSTEMD_UNIT=x.service"]`; several are OR-ed for the same field).
    pub fn follow_journal(&self, matches: &[&str]) -> Result<JournalFollower> {
        let mut child = Command::new("journalctl")
            .arg("-D")
            .arg(self.journal_dir())
            .args(["-f", "-n", "all", "-o", "json", "--all", "-q"])
            .args(matches)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| SandboxError::Command { cmd: "journalctl -f".into(), detail: e.to_string() })?;
        let out = child.stdout.take().ok_or_else(|| SandboxError::Command { cmd: "journalctl -f".into(), detail: "no stdout".into() })?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(JournalFollower { child, rx })
    }
}
