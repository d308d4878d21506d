//! Config drift: which files make up a worker's configuration, the revision (content hashes and
//! contents) it last started successfully with, whether it is stale, and restoring a revision.
//!
//! A worker's files are its unit file, its drop-ins — those systemd loaded *and* any `*.conf` now
//! in the unit's `.d` directories, because a new drop-in does not set `NeedDaemonReload`
//! (measured on systemd 252) — its EnvironmentFiles, and the configured `watch_files`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::lifecycle::now;
use crate::ports::UnitConfig;

/// One file of a revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRev {
    /// SHA-256 of the contents (`absent` when the file did not exist).
    pub sha256: String,
    /// The contents (text), to restore on rollback.
    pub contents: Option<String>,
}

/// The files a unit ran with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    /// The unit.
    pub unit: String,
    /// When it was recorded (seconds since the epoch).
    pub recorded_at: u64,
    /// Why: `started` (after a verified start) or `baseline` (running with unchanged files when
    /// pdctld first saw it).
    pub why: String,
    /// Path → file.
    pub files: BTreeMap<String, FileRev>,
}

/// Write `bytes` to `path` atomically: a temporary file next to it (unique to this process and
/// call), fsync, rename over `path`, fsync the directory. A crash leaves the old or the new
/// contents, never half.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The paths that make up `unit`'s configuration now.
pub fn paths(unit: &str, cfg: &UnitConfig, watch_files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    if !cfg.fragment_path.is_empty() {
        out.insert(PathBuf::from(&cfg.fragment_path));
    }
    let mut dropin_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for d in &cfg.drop_in_paths {
        out.insert(PathBuf::from(d));
        if let Some(p) = Path::new(d).parent() {
            dropin_dirs.insert(p.to_path_buf());
        }
    }
    if let Some(dir) = Path::new(&cfg.fragment_path).parent() {
        dropin_dirs.insert(dir.join(format!("{unit}.d")));
    }
    for d in dropin_dirs {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "conf") {
                    out.insert(e.path());
                }
            }
        }
    }
    for (f, _optional) in &cfg.environment_files {
        out.insert(PathBuf::from(f));
    }
    out.extend(watch_files.iter().cloned());
    out
}

/// Read the files into a revision.
pub fn snapshot(unit: &str, files: &BTreeSet<PathBuf>, why: &str) -> Revision {
    let files = files
        .iter()
        .map(|p| {
            let rev = match std::fs::read(p) {
                Ok(b) => FileRev { sha256: sha(&b), contents: String::from_utf8(b).ok() },
                Err(_) => FileRev { sha256: "absent".into(), contents: None },
            };
            (p.display().to_string(), rev)
        })
        .collect();
    Revision { unit: unit.into(), recorded_at: now(), why: why.into(), files }
}

fn rev_path(dir: &Path, unit: &str) -> PathBuf {
    dir.join(format!("{}.json", unit.replace('/', "_")))
}

/// The last good revision of `unit` in the revisions directory `dir`.
pub fn load(dir: &Path, unit: &str) -> Option<Revision> {
    serde_json::from_slice(&std::fs::read(rev_path(dir, unit)).ok()?).ok()
}

/// Record `rev` as the last good revision in the revisions directory `dir`.
pub fn save(dir: &Path, rev: &Revision) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(rev).map_err(std::io::Error::other)?;
    atomic_write(&rev_path(dir, &rev.unit), &bytes)
}

/// Why `unit` is stale (empty: it runs with its current files).
pub fn stale_reasons(current: &Revision, last: Option<&Revision>, exec_main_start_us: u64, need_daemon_reload: bool) -> Vec<String> {
    let mut why = Vec::new();
    if need_daemon_reload {
        why.push("the unit file changed on disk (NeedDaemonReload)".to_string());
    }
    match last {
        Some(last) => {
            for (p, f) in &current.files {
                match last.files.get(p) {
                    None if f.sha256 != "absent" => why.push(format!("{p} is new")),
                    None => {}
                    Some(old) if old.sha256 != f.sha256 => why.push(if f.sha256 == "absent" { format!("{p} was removed") } else { format!("{p} changed") }),
                    Some(_) => {}
                }
            }
            for (p, old) in &last.files {
                if !current.files.contains_key(p) && old.sha256 != "absent" && !Path::new(p).exists() {
                    why.push(format!("{p} was removed"));
                }
            }
        }
        None => {
            // No recorded revision: fall back to modification times against the process start.
            for p in current.files.keys() {
                let mtime_us =
                    std::fs::metadata(p).and_then(|m| m.modified()).ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_micros() as u64);
                if let Some(m) = mtime_us {
                    if exec_main_start_us > 0 && m > exec_main_start_us {
                        why.push(format!("{p} was modified after the running process started"));
                    }
                }
            }
        }
    }
    why.sort();
    why.dedup();
    why
}

/// Put `last`'s files back: rewrite changed ones, move files that did not exist then aside (as
/// `NAME.pdctl-rejected-ID`, which systemd ignores). Returns what was done.
pub fn restore(last: &Revision, current: &Revision, rollout_id: &str) -> std::io::Result<Vec<String>> {
    let mut done = Vec::new();
    for (p, f) in &current.files {
        match last.files.get(p) {
            Some(old) if old.sha256 == f.sha256 => {}
            Some(FileRev { contents: Some(c), .. }) => {
                atomic_write(Path::new(p), c.as_bytes())?;
                done.push(format!("restored {p}"));
            }
            Some(_) | None if f.sha256 != "absent" => {
                let aside = format!("{p}.pdctl-rejected-{rollout_id}");
                std::fs::rename(p, &aside)?;
                done.push(format!("moved {p} aside to {aside}"));
            }
            _ => {}
        }
    }
    for (p, old) in &last.files {
        if !current.files.contains_key(p) {
            if let Some(c) = &old.contents {
                atomic_write(Path::new(p), c.as_bytes())?;
                done.push(format!("restored {p}"));
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_restore_round_trip() {
        let dir = std::env::temp_dir().join(format!("pdctld-rev-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("x.service.d")).unwrap();
        let unit = dir.join("x.service");
        std::fs::write(&unit, "[Service]\nExecStart=/bin/true\n").unwrap();
        let cfg = UnitConfig { fragment_path: unit.display().to_string(), ..Default::default() };
        let good = snapshot("x.service", &paths("x.service", &cfg, &[]), "started");
        assert!(stale_reasons(&good, Some(&good), 0, false).is_empty());
        // A new drop-in (not yet loaded by systemd) and an edited unit file.
        std::fs::write(dir.join("x.service.d/50-bad.conf"), "[Service]\nEnvironment=A=1\n").unwrap();
        std::fs::write(&unit, "[Service]\nExecStart=/bin/false\n").unwrap();
        let now = snapshot("x.service", &paths("x.service", &cfg, &[]), "current");
        let why = stale_reasons(&now, Some(&good), 0, false);
        assert_eq!(why.len(), 2, "{why:?}");
        let done = restore(&good, &now, "r1").unwrap();
        assert_eq!(done.len(), 2, "{done:?}");
        assert_eq!(std::fs::read_to_string(&unit).unwrap(), "[Service]\nExecStart=/bin/true\n");
        assert!(!dir.join("x.service.d/50-bad.conf").exists());
        assert!(dir.join("x.service.d/50-bad.conf.pdctl-rejected-r1").exists());
        let after = snapshot("x.service", &paths("x.service", &cfg, &[]), "current");
        assert!(stale_reasons(&after, Some(&good), 0, false).is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }
}
