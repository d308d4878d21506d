//! pdctl's own state files (records, revisions, the drain ledger, slots): private modes and
//! atomic writes. It imports only `safe_path`, the write it shares with restores.

use std::path::Path;

/// Mode of pdctl's own state files (records, revisions, the drain ledger): they hold unit files
/// and environment files, so not world-readable, whatever the umask.
pub const STATE_FILE_MODE: u32 = 0o640;

/// Mode of pdctl's state directories.
pub const STATE_DIR_MODE: u32 = 0o750;

/// Create `dir` (and its parents) and give it [`STATE_DIR_MODE`].
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(STATE_DIR_MODE))
}

/// Write `bytes` to `path` atomically with file mode `mode` (set explicitly, whatever the umask):
/// a temporary file next to it, fsync, rename over `path`, fsync the directory. A crash leaves the
/// old or the new contents, never half.
///
/// The temporary file is created new (`O_EXCL`: an existing file or symlink of that name is an
/// error, never written through), not followed if a link (`O_NOFOLLOW`), under a name unique to
/// this process, call and moment. The rename replaces `path` itself — a symlink there is replaced,
/// its target untouched — so a user who can write in the directory cannot make pdctld write
/// anywhere else.
pub fn atomic_write(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    atomic_write_owned(path, bytes, mode, None)
}

/// [`atomic_write`], and the file given `owner` (uid, gid) before it takes `path`'s place.
pub fn atomic_write_owned(path: &Path, bytes: &[u8], mode: u32, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Some(name) = path.file_name() else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} names no file", path.display())));
    };
    // pdctl's own directory: opened by its path (a unit's files go through `safe_path::open_dir`).
    let dir = std::fs::File::open(dir)?;
    super::safe_path::write_in(&dir.into(), name, bytes, mode, owner)
}

/// Read a file to configure from: a regular file (a symlink to one is followed, as systemd
/// does), at most `most` bytes; a FIFO, a device or a directory is an error, never opened for a
/// blocking read (`O_NONBLOCK` until it is known to be a regular file).
pub fn read_regular(path: &Path, most: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} is not a regular file", path.display())));
    }
    if meta.len() > most {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} is larger than {most} bytes", path.display())));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    f.take(most).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_never_follows_a_link_and_a_fifo_is_never_read() {
        let dir = std::env::temp_dir().join(format!("pdctl-state-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A symlink where the file is: replaced, its target untouched.
        let target = dir.join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.join("unit.conf");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        atomic_write(&link, b"new", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep", "not written through the link");
        assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link itself was replaced");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "new");
        // A FIFO is refused at once instead of blocking the reader.
        let fifo = dir.join("fifo");
        if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
            let e = read_regular(&fifo, 1024).expect_err("a FIFO");
            assert!(e.to_string().contains("not a regular file"), "{e}");
        } else {
            eprintln!("mkfifo is not available: the FIFO half could not observe");
        }
        assert_eq!(read_regular(&link, 1024).unwrap(), b"new");
        assert!(read_regular(&link, 2).is_err(), "larger than allowed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
