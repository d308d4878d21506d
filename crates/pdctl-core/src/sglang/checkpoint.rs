//! A checkpoint's files read into the page cache before anyone needs them. SGLang reads its
//! weights from `--model-path` at start (and at `/update_weights_from_disk`) from the files of
//! the checkpoint directory; when they are not in memory, every start of a rollout that changes
//! the model reads them from disk while the worker is out of service. Read once before the first
//! worker stops, they come from memory. What a directory holds is the Hugging Face layout SGLang
//! loads: the weight shards (`*.safetensors`, `*.bin`, …), their index and the configuration
//! files side by side at its top level; every regular file there is read, hidden ones (a
//! download's `.cache`) and subdirectories are not.
//!
//! How much may be read: the page cache is memory the kernel takes back as it needs, so a read
//! never takes memory from a process; what it can do is push out other cached files, or — for a
//! checkpoint larger than the memory left — its own first files before the server reads them,
//! which would make the whole read useless. So a checkpoint is read only when it fits in
//! `MemAvailable` (the kernel's estimate of what can be had without swapping) minus a headroom
//! ([`headroom`]); otherwise nothing is read and the rollout says why.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The most files a checkpoint directory is read with (the largest published checkpoints have
/// a few hundred shards).
pub const MOST_FILES: usize = 10_000;

/// The least memory left free after a read: 1 GiB, or a tenth of the host's memory if more.
pub fn headroom(total: u64) -> u64 {
    (total / 10).max(1 << 30)
}

/// A checkpoint directory's files, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Each regular file at its top level, with its size, by name.
    pub files: Vec<(PathBuf, u64)>,
    /// Their sizes together.
    pub bytes: u64,
}

/// Why a checkpoint is not read ahead (each said as one phrase after "not read ahead: ").
#[derive(Debug, thiserror::Error)]
pub enum NotRead {
    /// The directory cannot be read by this process.
    #[error("{} cannot be read on this host ({source})", dir.display())]
    Unreadable {
        /// The directory.
        dir: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// `--model-path` is not a directory here (a hub id, a file).
    #[error("{} is not a directory on this host", .0.display())]
    NotADirectory(PathBuf),
    /// Its entries cannot be listed.
    #[error("{} cannot be listed ({source})", dir.display())]
    Unlisted {
        /// The directory.
        dir: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// More than [`MOST_FILES`] files.
    #[error("{} holds more than {MOST_FILES} files: not a checkpoint directory", .0.display())]
    TooManyFiles(PathBuf),
    /// The host's memory cannot be read.
    #[error("/proc/meminfo cannot be read ({0})")]
    Meminfo(std::io::Error),
    /// The host's memory reads without its figures.
    #[error("/proc/meminfo has no MemTotal or MemAvailable")]
    MeminfoIncomplete,
    /// Larger than the memory available less the headroom ([`fits`]).
    #[error(
        "its {} do not fit in this host's available memory ({} available, {} kept free): read now, they would push their own first files out before the server reads them",
        gib(*bytes),
        gib(mem.available),
        gib(headroom(mem.total))
    )]
    DoesNotFit {
        /// The checkpoint's size.
        bytes: u64,
        /// The host's memory then.
        mem: Memory,
    },
    /// A file cannot be opened.
    #[error("{} cannot be opened ({source})", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file cannot be read through.
    #[error("{} cannot be read ({source})", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// The files of the checkpoint directory `dir`; `Err`: why it cannot be read here.
/// Blocking: call it off the async threads.
pub fn list(dir: &Path) -> Result<Checkpoint, NotRead> {
    let meta = std::fs::metadata(dir).map_err(|source| NotRead::Unreadable { dir: dir.into(), source })?;
    if !meta.is_dir() {
        return Err(NotRead::NotADirectory(dir.into()));
    }
    let entries = std::fs::read_dir(dir).map_err(|source| NotRead::Unlisted { dir: dir.into(), source })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| NotRead::Unlisted { dir: dir.into(), source })?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        // A symlink to a shard (the hub's cache layout) is read as its target; a FIFO or a
        // device would block or never end: only regular files.
        let Ok(m) = std::fs::metadata(entry.path()) else { continue };
        if m.is_file() {
            files.push((entry.path(), m.len()));
        }
        if files.len() > MOST_FILES {
            return Err(NotRead::TooManyFiles(dir.into()));
        }
    }
    files.sort();
    let bytes = files.iter().map(|f| f.1).sum();
    Ok(Checkpoint { files, bytes })
}

/// The host's memory as `/proc/meminfo` gives it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`.
    pub available: u64,
}

/// `MemTotal` and `MemAvailable` of a `/proc/meminfo` text (`None`: either missing).
pub fn parse_meminfo(text: &str) -> Option<Memory> {
    let kb =
        |key: &str| text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()).map(|k| k * 1024);
    Some(Memory { total: kb("MemTotal")?, available: kb("MemAvailable")? })
}

/// This host's memory now.
pub fn memory() -> Result<Memory, NotRead> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(NotRead::Meminfo)?;
    parse_meminfo(&text).ok_or(NotRead::MeminfoIncomplete)
}

/// Whether `bytes` may be read into the cache with `mem` as it is: `Err` says why not.
pub fn fits(bytes: u64, mem: Memory) -> Result<(), NotRead> {
    let budget = mem.available.saturating_sub(headroom(mem.total));
    if bytes <= budget {
        return Ok(());
    }
    Err(NotRead::DoesNotFit { bytes, mem })
}

/// `bytes` as GiB with two decimals.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Read `files` through, counting into `read` as it goes, until the end or `stop`. Returns the
/// bytes read. Blocking: call it off the async threads.
pub fn read(files: &[(PathBuf, u64)], read: &AtomicU64, stop: &AtomicBool) -> Result<u64, NotRead> {
    let mut buf = vec![0u8; 8 << 20];
    let mut total = 0u64;
    for (path, _) in files {
        let mut f = std::fs::File::open(path).map_err(|source| NotRead::Open { path: path.clone(), source })?;
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(total);
            }
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    read.fetch_add(n as u64, Ordering::SeqCst);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => return Err(NotRead::Read { path: path.clone(), source }),
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_level_regular_files_are_the_checkpoint() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("model-00001-of-00002.safetensors"), vec![1u8; 3000]).unwrap();
        std::fs::write(d.path().join("config.json"), b"{}").unwrap();
        std::fs::write(d.path().join(".lock"), b"x").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/other.bin"), vec![0u8; 100]).unwrap();
        let c = list(d.path()).unwrap();
        let names: Vec<String> = c.files.iter().map(|f| f.0.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["config.json", "model-00001-of-00002.safetensors"]);
        assert_eq!(c.bytes, 3002);
        let read_so_far = AtomicU64::new(0);
        assert_eq!(read(&c.files, &read_so_far, &AtomicBool::new(false)).ok(), Some(3002));
        assert_eq!(read_so_far.load(Ordering::SeqCst), 3002);
        assert_eq!(read(&c.files, &AtomicU64::new(0), &AtomicBool::new(true)).ok(), Some(0), "a stop reads nothing more");
        assert!(matches!(list(&d.path().join("config.json")), Err(NotRead::NotADirectory(_))));
        assert!(list(&d.path().join("config.json")).unwrap_err().to_string().contains("not a directory"));
        assert!(list(&d.path().join("missing")).unwrap_err().to_string().contains("cannot be read"));
    }

    #[test]
    fn a_checkpoint_is_read_only_where_it_fits_with_headroom() {
        let text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\n";
        let m = parse_meminfo(text).unwrap();
        assert_eq!(m, Memory { total: 24_576_000 * 1024, available: 20_480_000 * 1024 });
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None, "no MemAvailable: not known, not zero");
        // A tenth of 24 GB is kept free.
        let keep = headroom(m.total);
        assert_eq!(keep, m.total / 10);
        assert!(fits(m.available - keep, m).is_ok());
        let why = fits(m.available - keep + 1, m).unwrap_err().to_string();
        assert!(why.contains("do not fit") && why.contains("kept free"), "{why}");
        // A small host keeps 1 GiB.
        assert_eq!(headroom(4 << 30), 1 << 30);
    }
}
