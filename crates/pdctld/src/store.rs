//! The state directory: one JSON record per rollout (plan, every event, result, revisions),
//! written atomically (write a temporary file, fsync it, rename it over the old one, fsync the
//! directory), so that a crash or SIGKILL leaves either the old or the new record, never half.

use std::path::{Path, PathBuf};

pub use pdctl_core::api::Record;
use pdctl_core::revisions::atomic_write;

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
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

    /// A new id: time-ordered and unique in this directory (callers hold pdctld's one running
    /// slot, so no two ids are chosen at once).
    pub fn new_id(&self) -> String {
        let base = format!("r{}", pdctl_core::lifecycle::now());
        (0..1000).map(|i| if i == 0 { base.clone() } else { format!("{base}-{i}") }).find(|id| !self.path(id).exists()).unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_round_trip_and_writes_are_atomic() {
        let dir = std::env::temp_dir().join(format!("pdctld-store-{}", std::process::id()));
        let s = Store::open(&dir).unwrap();
        let id = s.new_id();
        let r = Record::new(&id, pdctl_core::api::RolloutKind::Restart, vec!["a.service".into()], Default::default(), None);
        s.save(&r).unwrap();
        assert_eq!(s.load(&id).unwrap().plan, vec!["a.service"]);
        assert_ne!(s.new_id(), id);
        assert!(!std::fs::read_dir(dir.join("rollouts")).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".tmp")));
        assert!(s.load("../etc/passwd").is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
