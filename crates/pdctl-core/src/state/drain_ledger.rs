//! The drain ledger: every worker pdctl takes out of the router is written down *before* the router
//! is touched, and crossed off only once the router admits it again. A drain still in the ledger
//! is one pdctl made and has not undone — after a crash, a SIGKILL, a watchdog kill or a failed
//! gate — and [`crate::engine::Engine::reconcile`] restores it. pdctl acts only on drains in its
//! ledger, never on workers an operator removed from the router.
//!
//! One JSON file per unit in the ledger directory (pdctld: `<state>/drains/`), written atomically.

pub use pdctl_contract::records::{Drain, Hold, MaintainedUnit, Maintenance, MaintenancePhase};
use std::path::{Path, PathBuf};

use crate::state::state_file::{atomic_write, STATE_FILE_MODE};

/// The ledger directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    dir: PathBuf,
}

/// A ledger file that does not parse (reported, never deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: String,
}

impl Ledger {
    /// The ledger in `dir` (created if needed, mode 0750).
    pub fn open(dir: &Path) -> std::io::Result<Ledger> {
        crate::state::state_file::create_private_dir(dir)?;
        Ok(Ledger { dir: dir.to_path_buf() })
    }

    fn path(&self, unit: &str) -> PathBuf {
        self.dir.join(format!("{}.json", unit.replace('/', "_")))
    }

    /// Write the drain down (before the router is touched).
    pub fn record(&self, d: &Drain) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(d).map_err(std::io::Error::other)?;
        atomic_write(&self.path(&d.unit), &bytes, STATE_FILE_MODE)
    }

    /// Cross it off (the router admits the worker again).
    pub fn clear(&self, unit: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.path(unit)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => std::fs::File::open(&self.dir)?.sync_all(),
        }
    }

    /// The drain of `unit`, if pdctl made one and has not undone it.
    pub fn get(&self, unit: &str) -> Option<Drain> {
        serde_json::from_slice(&std::fs::read(self.path(unit)).ok()?).ok()
    }

    /// Every open drain, and the files that do not parse.
    pub fn all(&self) -> (Vec<Drain>, Vec<Unreadable>) {
        let (mut ok, mut bad) = (Vec::new(), Vec::new());
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return (ok, bad);
        };
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
        paths.sort();
        for path in paths {
            match std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| serde_json::from_slice::<Drain>(&b).map_err(|e| e.to_string())) {
                Ok(d) => ok.push(d),
                Err(error) => bad.push(Unreadable { path, error }),
            }
        }
        (ok, bad)
    }
}

impl Ledger {
    fn slot_path(&self, unit: &str) -> PathBuf {
        self.dir.join("slots").join(format!("{}.json", unit.replace('/', "_")))
    }

    /// Write down a fleet slot this host is about to take or holds (before the transaction).
    pub fn record_slot(&self, unit: &str, r: &[crate::fleet::SlotRecord]) -> std::io::Result<()> {
        crate::state::state_file::create_private_dir(&self.dir.join("slots"))?;
        let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
        atomic_write(&self.slot_path(unit), &bytes, STATE_FILE_MODE)
    }

    /// Cross a slot off (given back).
    pub fn clear_slot(&self, unit: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.slot_path(unit)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every slot on record: (unit, its records).
    pub fn slots(&self) -> Vec<(String, Vec<crate::fleet::SlotRecord>)> {
        let Ok(rd) = std::fs::read_dir(self.dir.join("slots")) else {
            return Vec::new();
        };
        let mut out: Vec<(String, Vec<crate::fleet::SlotRecord>)> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().strip_suffix(".json")?.to_string();
                let recs = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                Some((name, recs))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

impl Ledger {
    fn maintenance_path(&self) -> PathBuf {
        self.dir.join("maintenance").join("host.json")
    }

    /// Write down where this host's maintenance stands (before what it says is done).
    pub fn record_maintenance(&self, m: &Maintenance) -> std::io::Result<()> {
        crate::state::state_file::create_private_dir(&self.dir.join("maintenance"))?;
        let bytes = serde_json::to_vec_pretty(m).map_err(std::io::Error::other)?;
        atomic_write(&self.maintenance_path(), &bytes, STATE_FILE_MODE)
    }

    /// This host's maintenance, if one is on record; `Err`: its file does not parse (reported,
    /// never deleted: a host whose record cannot be read is treated as in maintenance).
    pub fn maintenance(&self) -> Result<Option<Maintenance>, Unreadable> {
        let path = self.maintenance_path();
        match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Unreadable { path, error: e.to_string() }),
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| Unreadable { path, error: e.to_string() }),
        }
    }

    /// Cross the maintenance off (its workers passed their gates, its slots are given back).
    pub fn clear_maintenance(&self) -> std::io::Result<()> {
        match std::fs::remove_file(self.maintenance_path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Role;

    #[test]
    fn record_get_clear() {
        let dir = std::env::temp_dir().join(format!("pdctl-ledger-{}", std::process::id()));
        let l = Ledger::open(&dir).unwrap();
        let d = Drain {
            hold: None,
            unit: "p.service".into(),
            url: "http://127.0.0.1:1".into(),
            role: Role::Prefill,
            bootstrap_port: Some(8998),
            invocation_id: "abc".into(),
            router_id: "w1".into(),
            rollout_id: "r1".into(),
            drained_at: 1,
        };
        l.record(&d).unwrap();
        assert_eq!(l.get("p.service"), Some(d.clone()));
        std::fs::write(dir.join("junk.json"), "{").unwrap();
        let (ok, bad) = l.all();
        assert_eq!(ok, vec![d]);
        assert_eq!(bad.len(), 1, "an unreadable file is reported, not dropped");
        l.clear("p.service").unwrap();
        l.clear("p.service").unwrap();
        assert_eq!(l.get("p.service"), None);
        // The maintenance record lives apart from the drains (never read as one).
        assert_eq!(l.maintenance().unwrap(), None);
        let m = Maintenance {
            id: "r2".into(),
            phase: MaintenancePhase::Down,
            began: 1,
            since: 2,
            by: "fleetlock node-a".into(),
            reason: None,
            boot_id: Some("b1".into()),
            units: vec![MaintainedUnit { unit: "p.service".into(), invocation_id: "abc".into(), cursor: Some("s=1".into()), stopped: true }],
            failed: None,
        };
        l.record_maintenance(&m).unwrap();
        assert_eq!(l.maintenance().unwrap(), Some(m));
        assert_eq!(l.all().1.len(), 1, "only the junk file is unreadable");
        std::fs::write(dir.join("maintenance/host.json"), "{").unwrap();
        assert!(l.maintenance().is_err(), "an unreadable record is an error, not none");
        l.clear_maintenance().unwrap();
        l.clear_maintenance().unwrap();
        assert_eq!(l.maintenance().unwrap(), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
