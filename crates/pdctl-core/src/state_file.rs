//! pdctl's own state files (records, revisions, the drain ledger, slots): private modes and
//! atomic writes. A leaf: it imports nothing of this crate.

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
/// a temporary file next to it (unique to this process and call), fsync, rename over `path`,
/// fsync the directory. A crash leaves the old or the new contents, never half.
pub fn atomic_write(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
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
