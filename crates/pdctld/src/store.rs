//! The state directory: one JSON record per rollout (plan, every event, result, revisions),
//! written atomically (write a temporary file, fsync it, rename it over the old one, fsync the
//! directory), so that a crash or SIGKILL leaves either the old or the new record, never half.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use pdctl_core::events::{Event, Summary};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// In progress.
    Running,
    /// Every unit passed.
    Succeeded,
    /// A gate failed; halted.
    Failed,
    /// A gate failed; the unit was restored to its last good revision.
    RolledBack,
    /// Stopped by an operator between units.
    Aborted,
    /// The daemon died while it ran; nothing resumed by itself.
    Interrupted,
}

/// One rollout's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Its id.
    pub id: String,
    /// `restart`, `apply`, `resume`.
    pub kind: String,
    /// Units in order.
    pub plan: Vec<String>,
    /// Where it stands.
    pub state: State,
    /// Seconds since the epoch.
    pub created_at: u64,
    /// Seconds since the epoch, when finished.
    #[serde(default)]
    pub finished_at: Option<u64>,
    /// Every event so far.
    #[serde(default)]
    pub events: Vec<Event>,
    /// The summary, when finished.
    #[serde(default)]
    pub summary: Option<Summary>,
    /// Where it was interrupted, and each unit's verified state then.
    #[serde(default)]
    pub interrupted: Option<Value>,
    /// Why the workers were chosen (config rollouts: what changed).
    #[serde(default)]
    pub reasons: Value,
    /// Rollback details, revisions recorded.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The rollout this one resumes.
    #[serde(default)]
    pub resumes: Option<String>,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Write `bytes` to `path` atomically.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.tmp", path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

impl Store {
    /// Open (and create) the state directory.
    pub fn open(dir: &Path) -> std::io::Result<Store> {
        std::fs::create_dir_all(dir.join("rollouts"))?;
        std::fs::create_dir_all(dir.join("revisions"))?;
        Ok(Store { dir: dir.to_path_buf() })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join("rollouts").join(format!("{id}.json"))
    }

    /// Persist a record.
    pub fn save(&self, r: &Record) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
        atomic_write(&self.path(&r.id), &bytes)
    }

    /// One record.
    pub fn load(&self, id: &str) -> Option<Record> {
        if id.contains('/') || id.starts_with('.') {
            return None;
        }
        let text = std::fs::read(self.path(id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Every record, oldest first.
    pub fn all(&self) -> Vec<Record> {
        let mut out: Vec<Record> = std::fs::read_dir(self.dir.join("rollouts"))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                    .filter_map(|e| std::fs::read(e.path()).ok())
                    .filter_map(|b| serde_json::from_slice::<Record>(&b).ok())
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        out
    }

    /// A new id: time-ordered and unique in this directory.
    pub fn new_id(&self) -> String {
        let base = format!("r{}", now());
        (0..1000).map(|i| if i == 0 { base.clone() } else { format!("{base}-{i}") }).find(|id| !self.path(id).exists()).unwrap_or(base)
    }
}

/// Where a record stopped: the last unit and step that started.
pub fn last_position(r: &Record) -> (Option<String>, Option<String>) {
    r.events.iter().rev().find(|e| e.unit != "router").map(|e| (Some(e.unit.clone()), Some(e.step.as_str().to_string()))).unwrap_or((None, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_round_trip_and_writes_are_atomic() {
        let dir = std::env::temp_dir().join(format!("pdctld-store-{}", std::process::id()));
        let s = Store::open(&dir).unwrap();
        let id = s.new_id();
        let r = Record {
            id: id.clone(),
            kind: "restart".into(),
            plan: vec!["a.service".into()],
            state: State::Running,
            created_at: now(),
            finished_at: None,
            events: vec![],
            summary: None,
            interrupted: None,
            reasons: Value::Null,
            notes: vec![],
            resumes: None,
        };
        s.save(&r).unwrap();
        assert_eq!(s.load(&id).unwrap().plan, vec!["a.service"]);
        assert_ne!(s.new_id(), id);
        assert!(!std::fs::read_dir(dir.join("rollouts")).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".tmp")));
        assert!(s.load("../etc/passwd").is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
