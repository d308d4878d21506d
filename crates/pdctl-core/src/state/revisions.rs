//! Config drift: which files make up a worker's configuration, the revision (content hashes and
//! contents) it last started successfully with, whether it is stale, and restoring a revision.
//!
//! A worker's files are its unit file, its drop-ins — those systemd loaded *and* any `*.conf` now
//! in the unit's `.d` directories, because a new drop-in does not set `NeedDaemonReload`
//! (measured on systemd 252) — its EnvironmentFiles, and the configured `watch_files`.

pub use pdctl_contract::records::Quarantine;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use crate::clock::StartTime;
use crate::clock::{now, now_ms};
use crate::ports::UnitConfig;
use crate::state::safe_path;
pub use crate::state::state_file::{atomic_write, create_private_dir, STATE_DIR_MODE, STATE_FILE_MODE};

/// One file of a revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRev {
    /// SHA-256 of the contents (`absent` when the file did not exist).
    pub sha256: String,
    /// The contents (text), to restore on rollback.
    pub contents: Option<String>,
    /// Its mode, owner and group when recorded (a restore gives them back: an env file with
    /// secrets stays 0600, a group-readable one keeps its group); absent in records before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<FileOwner>,
}

/// A file's mode (permission bits), owner and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOwner {
    /// Permission bits (`0o640`).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
}

impl FileOwner {
    /// The mode, owner and group of the file at `p` now (a symlink followed, as systemd reads it).
    pub fn of(p: &Path) -> Option<FileOwner> {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(p).ok().map(|m| FileOwner { mode: m.mode() & 0o7777, uid: m.uid(), gid: m.gid() })
    }
}

/// The most of one configuration file read (unit files and env files are a few kB).
const MOST: u64 = 16 * 1024 * 1024;

/// A restore that stopped at a file: what it had done before, the file, and why.
#[derive(Debug)]
pub struct RestoreError {
    /// What was restored or moved aside before it stopped (those files are back).
    pub done: Vec<String>,
    /// The file it could not restore.
    pub path: String,
    /// Why.
    pub error: std::io::Error,
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot restore {}: {}", self.path, self.error)?;
        if self.done.is_empty() {
            write!(f, " (nothing was rewritten before it)")
        } else {
            write!(f, " (already done before it: {}; the files after it are as the change left them)", self.done.join("; "))
        }
    }
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
    // A `--config` YAML is as much the unit's configuration as its drop-ins.
    out.extend(cfg.config_files.iter().map(PathBuf::from));
    out.extend(watch_files.iter().cloned());
    out
}

/// Read the files into a revision.
pub fn snapshot(unit: &str, files: &BTreeSet<PathBuf>, why: &str) -> Revision {
    let files = files
        .iter()
        .map(|p| {
            // A regular file only, bounded, never a blocking open (a FIFO named as an
            // EnvironmentFile would hang the reader): anything else reads as absent.
            let rev = match crate::state::state_file::read_regular(p, MOST) {
                Ok(b) => FileRev { sha256: sha(&b), contents: String::from_utf8(b).ok(), owner: FileOwner::of(p) },
                Err(_) => FileRev { sha256: "absent".into(), contents: None, owner: None },
            };
            (p.display().to_string(), rev)
        })
        .collect();
    Revision { unit: unit.into(), recorded_at: now(), why: why.into(), files }
}

/// The old content of this file is not known (it changed after the running process started).
pub const UNKNOWN: &str = "unknown";

fn modified_us(p: &Path) -> Option<u64> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_micros() as u64)
}

fn created_us(p: &Path) -> Option<u64> {
    std::fs::metadata(p).and_then(|m| m.created()).ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_micros() as u64)
}

fn is_drop_in(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "conf") && p.parent().and_then(|d| d.file_name()).is_some_and(|n| n.to_string_lossy().ends_with(".d"))
}

/// What the running process was started with, as far as the files can tell (a baseline recorded
/// when pdctld first sees a unit, before any restart): every file not changed since the process
/// started (`exec_main_start_us`) with its content; a file changed since — its content then is
/// unknown — as [`UNKNOWN`]; drop-ins written since, and other files created since, are left
/// out: they cannot be what runs, so a rollback moves them aside.
pub fn baseline(unit: &str, files: &BTreeSet<PathBuf>, exec_main_start_us: u64) -> Revision {
    let mut rev = snapshot(unit, files, "baseline");
    rev.files.retain(|p, f| {
        let p = Path::new(p);
        let newer = exec_main_start_us > 0 && modified_us(p).is_some_and(|m| m > exec_main_start_us);
        if !newer || f.sha256 == "absent" {
            return true;
        }
        let created_since = created_us(p).is_some_and(|c| c > exec_main_start_us);
        if is_drop_in(p) || created_since {
            return false;
        }
        *f = FileRev { sha256: UNKNOWN.into(), contents: None, owner: None };
        true
    });
    rev
}

/// A digest of a set of files' contents (which change a failed rollout tried).
pub fn fingerprint(rev: &Revision) -> String {
    let text: String = rev.files.iter().map(|(p, f)| format!("{p}\t{}\n", f.sha256)).collect();
    sha(text.as_bytes())
}

fn quarantine_path(dir: &Path, unit: &str) -> PathBuf {
    dir.join(format!("{}.quarantine.json", unit.replace('/', "_")))
}

/// Record a failed change of `q.unit`.
pub fn quarantine(dir: &Path, q: &Quarantine) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(q).map_err(std::io::Error::other)?;
    atomic_write(&quarantine_path(dir, &q.unit), &bytes, STATE_FILE_MODE)
}

/// The quarantine of `unit` if its files are still the ones that failed.
pub fn quarantined(dir: &Path, current: &Revision) -> Option<Quarantine> {
    let q: Quarantine = serde_json::from_slice(&std::fs::read(quarantine_path(dir, &current.unit)).ok()?).ok()?;
    (q.fingerprint == fingerprint(current)).then_some(q)
}

fn start_path(dir: &Path, unit: &str) -> PathBuf {
    dir.join(format!("{}.start.json", unit.replace('/', "_")))
}

/// Record how long `unit`'s verified start took (its last window is kept).
pub fn record_start(dir: &Path, unit: &str, ms: u64) -> std::io::Result<()> {
    let t = match last_start(dir, unit) {
        Some(last) => StartTime { ms, at: now(), ..last },
        None => StartTime { ms, at: now(), window_ms: None, window_until_ms: None, together_with: None },
    };
    let bytes = serde_json::to_vec(&t).map_err(std::io::Error::other)?;
    atomic_write(&start_path(dir, unit), &bytes, STATE_FILE_MODE)
}

/// Record how long `unit` was out of the router, take-out to re-admission, ending now (its start
/// is kept).
pub fn record_window(dir: &Path, unit: &str, window_ms: u64) -> std::io::Result<()> {
    let ms = last_start(dir, unit).map(|s| s.ms).unwrap_or(0);
    let t = StartTime { ms, at: now(), window_ms: Some(window_ms), window_until_ms: Some(now_ms()), together_with: None };
    let bytes = serde_json::to_vec(&t).map_err(std::io::Error::other)?;
    atomic_write(&start_path(dir, unit), &bytes, STATE_FILE_MODE)
}

/// After a 1P1D pair restarted together: each one's window becomes the pair's interruption, from
/// the first take-out to the last re-admission (what clients saw: no request passes while either
/// is out), where both windows of this restart are on record.
pub fn record_pair_window(dir: &Path, a: &str, b: &str) -> std::io::Result<()> {
    let (Some(ta), Some(tb)) = (last_start(dir, a), last_start(dir, b)) else { return Ok(()) };
    let span = |t: &StartTime| Some((t.window_until_ms?.saturating_sub(t.window_ms?), t.window_until_ms?));
    let (Some((from_a, to_a)), Some((from_b, to_b))) = (span(&ta), span(&tb)) else { return Ok(()) };
    let union = to_a.max(to_b).saturating_sub(from_a.min(from_b));
    for (unit, t, other) in [(a, ta, b), (b, tb, a)] {
        let t = StartTime { window_ms: Some(union), together_with: Some(other.to_string()), ..t };
        let bytes = serde_json::to_vec(&t).map_err(std::io::Error::other)?;
        atomic_write(&start_path(dir, unit), &bytes, STATE_FILE_MODE)?;
    }
    Ok(())
}

/// How long a worker's last load of new weights in place took (`/update_weights_from_disk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadTime {
    /// The load, in milliseconds.
    pub ms: u64,
    /// When (seconds since the epoch).
    pub at: u64,
}

fn load_path(dir: &Path, unit: &str) -> PathBuf {
    dir.join(format!("{}.load.json", unit.replace('/', "_")))
}

/// Record how long `unit`'s load of new weights took.
pub fn record_load(dir: &Path, unit: &str, ms: u64) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(&LoadTime { ms, at: now() }).map_err(std::io::Error::other)?;
    atomic_write(&load_path(dir, unit), &bytes, STATE_FILE_MODE)
}

/// How long `unit`'s last load of new weights took, if one was measured.
pub fn last_load(dir: &Path, unit: &str) -> Option<LoadTime> {
    serde_json::from_slice(&std::fs::read(load_path(dir, unit)).ok()?).ok()
}

/// How long `unit`'s last verified start took, if one was measured.
pub fn last_start(dir: &Path, unit: &str) -> Option<StartTime> {
    serde_json::from_slice(&std::fs::read(start_path(dir, unit)).ok()?).ok()
}

fn rev_path(dir: &Path, unit: &str) -> PathBuf {
    dir.join(format!("{}.json", unit.replace('/', "_")))
}

fn before_path(dir: &Path, rollout_id: &str, unit: &str) -> PathBuf {
    dir.join("before").join(rollout_id.replace('/', "_")).join(format!("{}.json", unit.replace('/', "_")))
}

/// Keep `old`, the revision `old.unit` ran before rollout `rollout_id` replaced it: what a revert
/// of that rollout (`Request::Revert`, a fleet bake's breach) restores. Kept per rollout, so a
/// later rollout never overwrites it.
pub fn save_before(dir: &Path, rollout_id: &str, old: &Revision) -> std::io::Result<()> {
    let path = before_path(dir, rollout_id, &old.unit);
    if let Some(parent) = path.parent() {
        create_private_dir(parent)?;
    }
    let bytes = serde_json::to_vec_pretty(old).map_err(std::io::Error::other)?;
    atomic_write(&path, &bytes, STATE_FILE_MODE)
}

/// The revision `unit` ran before rollout `rollout_id` changed its files (`None`: that rollout
/// did not change them, or kept nothing).
pub fn load_before(dir: &Path, rollout_id: &str, unit: &str) -> Option<Revision> {
    serde_json::from_slice(&std::fs::read(before_path(dir, rollout_id, unit)).ok()?).ok()
}

/// The last good revision of `unit` in the revisions directory `dir`.
pub fn load(dir: &Path, unit: &str) -> Option<Revision> {
    serde_json::from_slice(&std::fs::read(rev_path(dir, unit)).ok()?).ok()
}

/// Record `rev` as the last good revision in the revisions directory `dir`.
pub fn save(dir: &Path, rev: &Revision) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(rev).map_err(std::io::Error::other)?;
    atomic_write(&rev_path(dir, &rev.unit), &bytes, STATE_FILE_MODE)
}

/// Save a first-day baseline only where no revision exists yet, atomically: a baseline computed
/// concurrently (pdctld's start and a rollout's preflight both take one) never replaces a
/// revision written meanwhile — in particular not with the run of a change that was restarted
/// in between. Returns whether it was saved.
pub fn save_if_absent(dir: &Path, rev: &Revision) -> std::io::Result<bool> {
    let path = rev_path(dir, &rev.unit);
    let tmp = dir.join(format!(".{}.baseline.{}.tmp", rev.unit.replace('/', "_"), std::process::id()));
    atomic_write(&tmp, &serde_json::to_vec_pretty(rev).map_err(std::io::Error::other)?, STATE_FILE_MODE)?;
    // link(2) fails when the name exists: the first writer wins.
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
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
                    Some(old) if old.sha256 == UNKNOWN => why.push(format!("{p} was modified after the running process started")),
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

/// Put `last`'s files back: rewrite changed ones (with the mode, owner and group recorded with
/// them, else the ones they have now), move files that did not exist then aside (as
/// `NAME.pdctl-rejected-ID`, which systemd ignores). Returns what was done; stopped half-way, what
/// it had done before, and where it stopped.
pub fn restore(last: &Revision, current: &Revision, rollout_id: &str) -> Result<Vec<String>, RestoreError> {
    let mut done = Vec::new();
    // Each write and each rename acts on its directory as opened by `safe_path` — never through a
    // link an account other than root could have put on the way — and never on the path again.
    let write = |p: &str, old: &FileRev, c: &str| {
        let (dir, name) = safe_path::open_parent(Path::new(p))?;
        let now = safe_path::owner_in(&dir, &name).map(|(mode, uid, gid)| FileOwner { mode, uid, gid });
        let owner = old.owner.or(now);
        // Recorded, else the one it has now, else 0644 (unit files are world-readable).
        let mode = owner.map_or(0o644, |o| o.mode);
        // pdctld run as its own account (not root) cannot give a file to another: the file is
        // then its own, in its directory's group (setgid: the group that may write there), with
        // the recorded mode; the record says so.
        let me = rustix::process::geteuid().as_raw();
        let (owner, kept) = match owner {
            Some(o) if me != 0 && o.uid != me => {
                (None, format!(" (as uid {me}'s, mode {:04o}: pdctld is not root, so owner uid {} was not kept)", o.mode, o.uid))
            }
            o => (o.map(|o| (o.uid, o.gid)), String::new()),
        };
        safe_path::write_in(&dir, &name, c.as_bytes(), mode, owner).map(|()| kept)
    };
    let aside = |p: &str, aside: &str| {
        let (dir, name) = safe_path::open_parent(Path::new(p))?;
        let new_name = Path::new(aside).file_name().unwrap_or_default();
        safe_path::rename_in(&dir, &name, new_name)
    };
    let stop = |done: &mut Vec<String>, path: &str, error: std::io::Error| RestoreError { done: std::mem::take(done), path: path.to_string(), error };
    for (p, f) in &current.files {
        match last.files.get(p) {
            Some(old) if old.sha256 == f.sha256 => {}
            Some(old) if old.sha256 == UNKNOWN => {
                done.push(format!("not restored: {p} changed after the running process started and its old content is unknown; check it by hand"));
            }
            Some(old @ FileRev { contents: Some(c), .. }) => {
                let kept = write(p, old, c).map_err(|e| stop(&mut done, p, e))?;
                done.push(format!("restored {p}{kept}"));
            }
            Some(_) | None if f.sha256 != "absent" => {
                let to = format!("{p}.pdctl-rejected-{rollout_id}");
                aside(p, &to).map_err(|e| stop(&mut done, p, e))?;
                done.push(format!("moved {p} aside to {to}"));
            }
            _ => {}
        }
    }
    for (p, old) in &last.files {
        if !current.files.contains_key(p) {
            if let Some(c) = &old.contents {
                let kept = write(p, old, c).map_err(|e| stop(&mut done, p, e))?;
                done.push(format!("restored {p}{kept}"));
            }
        }
    }
    Ok(done)
}

/// The directories on the way to `files` that an account other than root can change, each with
/// who (deduplicated): a restore writes there only through real directories, and stops at a link
/// such an account could have placed (`safe_path`), so an operator should know of them.
pub fn exposed<'a>(files: impl IntoIterator<Item = &'a PathBuf>) -> Vec<String> {
    let all: BTreeSet<String> = files.into_iter().flat_map(|p| safe_path::writable_by_others(p)).collect();
    all.into_iter().collect()
}

/// The directories a restore of `last` over `now` would write in — those of the files that differ
/// (rewritten, put back, or new and moved aside) — that cannot be written here (read-only to this
/// process: outside a systemd sandbox's `ReadWritePaths=`, or not its account's to write: pdctld
/// as its own user writes in its workers' drop-in directories only), each with why; empty when
/// all can.
pub fn unwritable(last: &Revision, now: &Revision) -> Vec<String> {
    let mut out = Vec::new();
    let sha = |r: &'_ Revision, p: &String| r.files.get(p).map_or("absent", |f| f.sha256.as_str()).to_string();
    let differs = |p: &String| sha(last, p) != sha(now, p);
    let changed = last.files.keys().chain(now.files.keys()).filter(|p| differs(p));
    let dirs: BTreeSet<&Path> = changed.filter_map(|p| Path::new(p).parent()).collect();
    for d in dirs {
        let Ok(c) = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()) else { continue };
        // SAFETY: a valid C string; access(2) reads nothing else.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
            let e = std::io::Error::last_os_error();
            // A directory that does not exist cannot be restored into either, but says so itself.
            if e.raw_os_error() != Some(libc::ENOENT) {
                out.push(format!("{} ({e})", d.display()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_keeps_mode_owner_and_group_and_says_where_it_stopped() {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = std::env::temp_dir().join(format!("pdctld-owner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = dir.join("secrets.env");
        std::fs::write(&env, "API_KEY=s3cret\n").unwrap();
        std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o600)).unwrap();
        let files: BTreeSet<PathBuf> = [env.clone()].into();
        // Owned by another user and group where this test may give it one (as root).
        let chowned = std::os::unix::fs::chown(&env, Some(65534), Some(65534)).is_ok();
        let last = snapshot("x.service", &files, "started");
        assert_eq!(last.files[&env.display().to_string()].owner.map(|o| o.mode), Some(0o600));
        // The change deletes it; the restore brings it back as it was, not 0644 root's.
        std::fs::remove_file(&env).unwrap();
        let current = snapshot("x.service", &files, "current");
        assert_eq!(restore(&last, &current, "r1").unwrap(), vec![format!("restored {}", env.display())]);
        let m = std::fs::metadata(&env).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600, "the secret stays private");
        if chowned {
            assert_eq!((m.uid(), m.gid()), (65534, 65534), "owner and group kept");
        } else {
            eprintln!("not root: the owner half could not observe");
        }
        // Stopped half-way (the second file's directory is gone): what was done is said.
        let gone = dir.join("gone/b.conf");
        let mut last2 = last.clone();
        last2.files.insert(gone.display().to_string(), FileRev { sha256: "b".into(), contents: Some("x".into()), owner: None });
        std::fs::write(&env, "API_KEY=changed\n").unwrap();
        let current = snapshot("x.service", &files, "current");
        let e = restore(&last2, &current, "r2").expect_err("the directory is gone");
        assert_eq!(e.done, vec![format!("restored {}", env.display())]);
        assert_eq!(e.path, gone.display().to_string());
        assert!(e.to_string().contains("already done before it: restored"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_revision_before_a_rollout_is_kept_per_rollout() {
        let dir = std::env::temp_dir().join(format!("pdctld-before-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rev = |tag: &str| Revision { unit: "x.service".into(), recorded_at: 1, why: tag.into(), files: Default::default() };
        assert_eq!(load_before(&dir, "r1", "x.service"), None);
        save_before(&dir, "r1", &rev("old")).unwrap();
        save_before(&dir, "r2", &rev("newer")).unwrap();
        assert_eq!(load_before(&dir, "r1", "x.service").unwrap().why, "old", "a later rollout's does not replace it");
        assert_eq!(load_before(&dir, "r2", "x.service").unwrap().why, "newer");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_baseline_never_replaces_a_revision_written_meanwhile() {
        let dir = std::env::temp_dir().join(format!("pdctld-base-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rev = |tag: &str| Revision { unit: "x.service".into(), recorded_at: 1, why: tag.into(), files: Default::default() };
        assert!(save_if_absent(&dir, &rev("first")).unwrap());
        assert!(!save_if_absent(&dir, &rev("second")).unwrap(), "the first one stays");
        assert_eq!(load(&dir, "x.service").unwrap().why, "first");
        assert!(std::fs::read_dir(&dir).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().ends_with(".tmp")), "no temporary file left");
        let _ = std::fs::remove_dir_all(&dir);
    }

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
