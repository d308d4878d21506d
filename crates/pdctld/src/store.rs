//! The state directory: one JSON record per rollout (plan, lifecycle, every event, result), the
//! last good revision of each worker, and the drain ledger — each file written atomically (a
//! temporary file, fsync, rename over the old one, fsync the directory), so that a crash or
//! SIGKILL leaves either the old or the new record, never half. Files are 0640 and directories
//! 0750 whatever the umask: revisions hold unit files and environment files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pdctl_contract::api::CorruptRecord;
pub use pdctl_contract::api::Record;
use pdctl_contract::lifecycle::RolloutState;
use pdctl_core::state::drain_ledger::Ledger;
use pdctl_core::state::revisions::{atomic_write, create_private_dir, STATE_FILE_MODE};

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    ledger: Ledger,
    /// Records as last parsed, by file, with the file's length and modification time: a record
    /// file is parsed again only when it changed (`status` and `history` list every record, and
    /// anyone who reaches the socket may ask as often as they like).
    parsed: std::sync::Arc<std::sync::Mutex<Parsed>>,
}

/// Parsed records by file: `(length, modification time, record)`. Shared, not copied: `status`
/// lists up to `--keep-records` records (1,000 by default) and takes what it needs from each.
type Parsed = std::collections::BTreeMap<PathBuf, (u64, std::time::SystemTime, Arc<Record>)>;

/// Attempts of one record write before it is reported as failed.
const WRITE_ATTEMPTS: u32 = 3;

impl Store {
    /// Open (and create) the state directory.
    pub fn open(dir: &Path) -> std::io::Result<Store> {
        create_private_dir(dir)?;
        create_private_dir(&dir.join("rollouts"))?;
        create_private_dir(&dir.join("revisions"))?;
        let ledger = Ledger::open(&dir.join("drains"))?;
        Ok(Store { dir: dir.to_path_buf(), ledger, parsed: Default::default() })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where workers' good revisions are kept.
    pub fn revisions_dir(&self) -> PathBuf {
        self.dir.join("revisions")
    }

    /// The drain ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join("rollouts").join(format!("{id}.json"))
    }

    /// Persist a record: tried [`WRITE_ATTEMPTS`] times at once (an NFS hiccup passes); the last
    /// error if every attempt failed. Never sleeps (it runs on the async threads): a record that
    /// could not be written is kept in memory and retried every 5 s by the daemon.
    pub fn save(&self, r: &Record) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
        let mut last = None;
        for _ in 0..WRITE_ATTEMPTS {
            match atomic_write(&self.path(&r.id), &bytes, STATE_FILE_MODE) {
                Ok(()) => {
                    // Parsed again at the next listing, whatever its time stamp says.
                    self.parsed.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.path(&r.id));
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no write attempted")))
    }

    /// One record.
    pub fn load(&self, id: &str) -> Option<Record> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return None;
        }
        let text = std::fs::read(self.path(id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Every record, oldest first, and the files that are not readable records (listed, never
    /// dropped silently: a half-written or hand-edited file is something an operator must see).
    /// Records are shared with the cache (a listing copies none).
    pub fn all(&self) -> (Vec<Arc<Record>>, Vec<CorruptRecord>) {
        let (mut out, mut corrupt) = (Vec::new(), Vec::new());
        let mut parsed = self.parsed.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = std::collections::BTreeSet::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.join("rollouts")) {
            for e in rd.flatten() {
                let path = e.path();
                if path.extension().is_none_or(|x| x != "json") {
                    continue;
                }
                present.insert(path.clone());
                let stamp = e.metadata().ok().and_then(|m| Some((m.len(), m.modified().ok()?)));
                if let (Some((len, at)), Some((l, t, r))) = (stamp, parsed.get(&path)) {
                    if (len, at) == (*l, *t) {
                        out.push(r.clone());
                        continue;
                    }
                }
                match std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| serde_json::from_slice::<Record>(&b).map_err(|e| e.to_string())) {
                    Ok(r) => {
                        let r = Arc::new(r);
                        if let Some((len, at)) = stamp {
                            parsed.insert(path.clone(), (len, at, r.clone()));
                        }
                        out.push(r)
                    }
                    Err(error) => corrupt.push(CorruptRecord { file: path.display().to_string(), error }),
                }
            }
        }
        // Files deleted (retention, by hand) leave the cache too.
        parsed.retain(|p, _| present.contains(p));
        drop(parsed);
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        corrupt.sort_by(|a, b| a.file.cmp(&b.file));
        (out, corrupt)
    }

    /// Retention: delete the oldest finished records beyond the newest `keep`, each with the
    /// revisions kept for its revert (`revisions/before/<id>/`, which hold the unit files and
    /// environment files — secrets included — it replaced). A running or interrupted record is
    /// kept whatever its age (it may be resumed), and so is every corrupt file (an operator must
    /// see it). Returns the ids deleted.
    pub fn prune(&self, keep: usize) -> Vec<String> {
        let (all, _) = self.all();
        let finished: Vec<&Record> =
            all.iter().map(|r| r.as_ref()).filter(|r| !matches!(r.lifecycle.state(), RolloutState::Running | RolloutState::Interrupted)).collect();
        let excess = finished.len().saturating_sub(keep);
        let mut gone = Vec::new();
        for r in finished.into_iter().take(excess) {
            if std::fs::remove_file(self.path(&r.id)).is_ok() {
                let _ = std::fs::remove_dir_all(self.revisions_dir().join("before").join(r.id.replace('/', "_")));
                gone.push(r.id.clone());
            }
        }
        gone
    }

    /// A new id: time-ordered and unique in this directory (callers hold pdctld's one running
    /// slot, so no two ids are chosen at once).
    pub fn new_id(&self) -> String {
        let base = format!("r{}", pdctl_contract::lifecycle::now());
        (0..1000).map(|i| if i == 0 { base.clone() } else { format!("{base}-{i}") }).find(|id| !self.path(id).exists()).unwrap_or(base)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_listing_parses_only_the_records_that_changed_and_sees_every_change() {
        let dir = std::env::temp_dir().join(format!("pdctld-parsed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        let mut r = Record::new("r1", pdctl_contract::api::RolloutKind::Restart, vec![], Default::default(), None);
        store.save(&r).unwrap();
        assert_eq!(store.all().0[0].notes.len(), 0);
        assert_eq!(store.parsed.lock().unwrap().len(), 1, "kept parsed");
        r.notes.push("a note".into());
        store.save(&r).unwrap();
        assert_eq!(store.all().0[0].notes, ["a note"], "a saved change is seen");
        // Changed outside pdctld (a hand edit): seen too.
        let path = dir.join("rollouts/r1.json");
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        v["notes"] = serde_json::json!(["edited by hand, longer"]);
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(store.all().0[0].notes, ["edited by hand, longer"]);
        std::fs::remove_file(&path).unwrap();
        assert!(store.all().0.is_empty() && store.parsed.lock().unwrap().is_empty(), "a deleted file leaves the cache");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn retention_deletes_the_oldest_finished_records_and_their_kept_files_but_never_an_interrupted_one() {
        let dir = std::env::temp_dir().join(format!("pdctld-retention-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        let mut ids = Vec::new();
        for i in 0..5u64 {
            let mut r = Record::new(&format!("r{i}"), pdctl_contract::api::RolloutKind::Restart, vec![], Default::default(), None);
            r.created_at = i;
            if i == 0 {
                // The oldest was interrupted: it may still be resumed.
                r.lifecycle.interrupt().unwrap();
            } else {
                r.lifecycle.finish(pdctl_contract::events::Outcome::Succeeded).unwrap();
            }
            store.save(&r).unwrap();
            let before = store.revisions_dir().join("before").join(&r.id);
            std::fs::create_dir_all(&before).unwrap();
            std::fs::write(before.join("x.service.json"), "SECRET").unwrap();
            ids.push(r.id);
        }
        let gone = store.prune(2);
        assert_eq!(gone, ["r1", "r2"], "the oldest finished beyond the newest 2");
        let left: Vec<String> = store.all().0.into_iter().map(|r| r.id.clone()).collect();
        assert_eq!(left, ["r0", "r3", "r4"], "the interrupted one is kept");
        assert!(!store.revisions_dir().join("before/r1").exists(), "its kept files went with it");
        assert!(store.revisions_dir().join("before/r3").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn records_survive_a_round_trip_are_private_and_corrupt_ones_are_listed() {
        let dir = std::env::temp_dir().join(format!("pdctld-store-{}", std::process::id()));
        let s = Store::open(&dir).unwrap();
        let id = s.new_id();
        let r = Record::new(&id, pdctl_contract::api::RolloutKind::Restart, vec!["a.service".into()], Default::default(), None);
        s.save(&r).unwrap();
        assert_eq!(s.load(&id).unwrap().plan, vec!["a.service"]);
        assert_eq!(std::fs::metadata(s.path(&id)).unwrap().permissions().mode() & 0o777, 0o640);
        assert_eq!(std::fs::metadata(dir.join("rollouts")).unwrap().permissions().mode() & 0o777, 0o750);
        assert_ne!(s.new_id(), id);
        assert!(!std::fs::read_dir(dir.join("rollouts")).unwrap().flatten().any(|e| e.file_name().to_string_lossy().ends_with(".tmp")));
        assert!(s.load("../etc/passwd").is_none());
        std::fs::write(dir.join("rollouts/r1.json"), "{\"id\":").unwrap();
        let (ok, corrupt) = s.all();
        assert_eq!(ok.len(), 1);
        assert_eq!(corrupt.len(), 1);
        assert!(corrupt[0].file.ends_with("r1.json"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
