//! Writing a unit's files back where they were, without following a link someone else placed.
//! A leaf: it imports nothing of this crate.
//!
//! A rollback runs as root and writes into directories a service account may own (an
//! `EnvironmentFile=` under a directory in the unit's `ReadWritePaths=`). `O_NOFOLLOW` guards
//! the last component only: had that account replaced a directory on the way with a symlink to a
//! root-owned one, a write by path would land there. So the parent directory is opened one
//! component at a time from `/` (`openat` with `O_NOFOLLOW|O_DIRECTORY`), a symlink on the way is
//! followed only when no one but root could have placed it — owned by root, in a directory only
//! root can write (`/lib` → `usr/lib` is such a link) — and the write, the rename and the fsync
//! then act on that directory's descriptor, never on the path again.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat, CWD};

/// At most this many links on one path (Linux's own limit: `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// May an account other than root change the entries of the directory `st` describes? (Its
/// owner; anyone through the other bits, or a group other than root's through the group bits. In
/// a sticky directory of root's — `/tmp` — others may add entries but never replace root's.)
pub fn others_may_write(st: &Stat) -> Option<String> {
    let mode = st.st_mode & 0o7777;
    if st.st_uid != 0 {
        Some(format!("owned by uid {}", st.st_uid))
    } else if mode & 0o1000 != 0 {
        None
    } else if mode & 0o002 != 0 {
        Some(format!("mode {mode:04o}: anyone can write in it"))
    } else if mode & 0o020 != 0 && st.st_gid != 0 {
        Some(format!("mode {mode:04o}: group gid {} can write in it", st.st_gid))
    } else {
        None
    }
}

fn refused(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)
}

/// Open the directory `dir` (absolute) for writing into it, never through a link an account other
/// than root could have placed or replaced. Errors name the component and why.
pub fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    if !dir.is_absolute() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} is not an absolute path", dir.display())));
    }
    let root = rustix::fs::openat(CWD, "/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    // The directories open so far (`..` goes back one), where they are (for the messages), and
    // whether only root could have changed any of them up to there (None) or who else (Some).
    let root_why = others_may_write(&rustix::fs::fstat(&root)?).map(|why| format!("/ ({why})"));
    let mut open: Vec<(OwnedFd, PathBuf, Option<String>)> = vec![(root, PathBuf::from("/"), root_why)];
    let mut todo: Vec<OsString> = components(dir).into_iter().rev().collect();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        match name.as_bytes() {
            b"." => continue,
            b".." => {
                if open.len() > 1 {
                    open.pop();
                }
                continue;
            }
            _ => {}
        }
        let (cur, at, exposed) = open.last().expect("the root stays open");
        let here = at.join(&name);
        let st = rustix::fs::statat(cur, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let fd = rustix::fs::openat(cur, name.as_os_str(), OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
                    // Replaced by a link between the look and the open: the same refusal.
                    .map_err(|e| refused(format!("{} changed while it was opened ({e})", here.display())))?;
                let exposed = exposed.clone().or_else(|| others_may_write(&st).map(|why| format!("{} ({why})", here.display())));
                open.push((fd, here, exposed));
            }
            FileType::Symlink => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(refused(format!("{} has more than {MAX_LINKS} symbolic links on its way", dir.display())));
                }
                if st.st_uid != 0 {
                    return Err(refused(format!("{} is a symbolic link owned by uid {}, not followed", here.display(), st.st_uid)));
                }
                if let Some(why) = exposed {
                    return Err(refused(format!("{} is a symbolic link under {why}, not followed", here.display())));
                }
                let target = rustix::fs::readlinkat(cur, name.as_os_str(), Vec::new())?;
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    open.truncate(1);
                }
                todo.extend(components(&target).into_iter().rev());
            }
            _ => return Err(std::io::Error::new(std::io::ErrorKind::NotADirectory, format!("{} is not a directory", here.display()))),
        }
    }
    let (last, _, _) = open.last().expect("the root stays open");
    // A descriptor that can be written through and synced (an `O_PATH` one cannot).
    Ok(rustix::fs::openat(last, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?)
}

/// `p`'s components as names (`.` and `..` kept: the walk resolves them where they stand).
fn components(p: &Path) -> Vec<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::CurDir => Some(".".into()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// `path`'s directory, opened by [`open_dir`], and its file name.
pub fn open_parent(path: &Path) -> std::io::Result<(OwnedFd, OsString)> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} names no file", path.display())));
    };
    Ok((open_dir(dir)?, name.to_os_string()))
}

/// The file `name` in `dir`, not followed if a link: its mode bits, owner and group.
pub fn owner_in(dir: &OwnedFd, name: &OsStr) -> Option<(u32, u32, u32)> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    (FileType::from_raw_mode(st.st_mode) == FileType::RegularFile).then_some((st.st_mode & 0o7777, st.st_uid, st.st_gid))
}

/// Write `bytes` as `name` in `dir` atomically: a new temporary file there (`O_EXCL|O_NOFOLLOW`),
/// its mode set whatever the umask, given `owner` last, fsynced, renamed over `name` (a link there
/// is replaced, its target untouched), the directory fsynced. A crash leaves the old or the new
/// contents, never half.
pub fn write_in(dir: &OwnedFd, name: &OsStr, bytes: &[u8], mode: u32, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.{}.{nanos:08x}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let written = (|| -> std::io::Result<()> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, tmp.as_os_str(), flags, Mode::from_raw_mode(mode & 0o777))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes)?;
        // Last: once another user owns it, changing its mode would need CAP_FOWNER, which
        // pdctld's unit does not grant (CAP_CHOWN does this).
        if let Some((uid, gid)) = owner {
            rustix::fs::fchown(&f, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))?;
        }
        f.sync_all()?;
        Ok(rustix::fs::renameat(dir, tmp.as_os_str(), dir, name)?)
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_os_str(), AtFlags::empty());
    }
    written?;
    Ok(rustix::fs::fsync(dir)?)
}

/// Rename `name` to `new_name` within `dir`, and fsync it.
pub fn rename_in(dir: &OwnedFd, name: &OsStr, new_name: &OsStr) -> std::io::Result<()> {
    rustix::fs::renameat(dir, name, dir, new_name)?;
    Ok(rustix::fs::fsync(dir)?)
}

/// The directories on the way to `path` (lexically, each as it is now) that an account other than
/// root — and other than pdctld's own, when it runs as one — can write in, each with who: there
/// such an account could put a link where a directory was. Directories that do not exist are
/// skipped.
pub fn writable_by_others(path: &Path) -> Vec<String> {
    let me = Own::now();
    path.ancestors()
        .skip(1)
        .filter_map(|d| {
            let st = rustix::fs::stat(d).ok()?;
            (FileType::from_raw_mode(st.st_mode) == FileType::Directory).then_some(())?;
            (!me.alone_may_write(&st)).then_some(())?;
            others_may_write(&st).map(|why| format!("{} ({why})", d.display()))
        })
        .collect()
}

/// pdctld's own account when it is not root (the packaged `pdctld-as-pdctl-user.conf`): the
/// directories it is given to write in are its own — owned by it, or writable through a group
/// no other account is in (`pdctl-units`, by /etc/group and /etc/passwd).
struct Own {
    uid: u32,
    name: Option<String>,
    passwd: String,
    group: String,
}

impl Own {
    fn now() -> Own {
        let uid = rustix::process::geteuid().as_raw();
        if uid == 0 {
            return Own { uid, name: None, passwd: String::new(), group: String::new() };
        }
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
        let name = passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() > 3 && f[2].parse() == Ok(uid)).map(|f| f[0].to_string());
        Own { uid, name, passwd, group }
    }

    /// Only this account (besides root) may change `st`'s entries.
    fn alone_may_write(&self, st: &Stat) -> bool {
        let mode = st.st_mode & 0o7777;
        if self.uid == 0 || mode & 0o002 != 0 {
            return false;
        }
        let owner_ours = st.st_uid == 0 || st.st_uid == self.uid;
        let group_ours = mode & 0o020 == 0 || st.st_gid == 0 || self.sole_member(st.st_gid);
        owner_ours && group_ours
    }

    /// No account but this one is in the group `gid` (as a member or by its primary group).
    fn sole_member(&self, gid: u32) -> bool {
        let Some(me) = &self.name else { return false };
        let field = |l: &str, i: usize| l.split(':').nth(i).map(str::to_string);
        let listed = self.group.lines().find(|l| field(l, 2).and_then(|g| g.parse().ok()) == Some(gid));
        let Some(entry) = listed else { return false };
        let members_ok = field(entry, 3).unwrap_or_default().split(',').filter(|m| !m.is_empty()).all(|m| m == me);
        let primary_ok =
            self.passwd.lines().filter(|l| field(l, 3).and_then(|g| g.parse().ok()) == Some(gid)).all(|l| field(l, 0).as_deref() == Some(me.as_str()));
        members_ok && primary_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pdctl-safe-path-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_directory_replaced_by_a_link_is_not_written_through() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = dir("link");
        // envdir: a service account's (here: anyone may write in it).
        let envdir = d.join("envdir");
        std::fs::create_dir_all(&envdir).unwrap();
        std::fs::set_permissions(&envdir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let target = d.join("target");
        std::fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(&target, envdir.join("sub")).unwrap();
        let e = open_parent(&envdir.join("sub/w1.conf")).expect_err("a link others could place");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("sub is a symbolic link under") && e.to_string().contains("envdir (mode 0777: anyone can write"), "{e}");
        assert!(!target.join("w1.conf").exists());
        // A real directory there: written, with its mode.
        std::fs::remove_file(envdir.join("sub")).unwrap();
        std::fs::create_dir(envdir.join("sub")).unwrap();
        let (fd, name) = open_parent(&envdir.join("sub/w1.conf")).unwrap();
        write_in(&fd, &name, b"A=1\n", 0o600, None).unwrap();
        assert_eq!(std::fs::read_to_string(envdir.join("sub/w1.conf")).unwrap(), "A=1\n");
        assert_eq!(owner_in(&fd, &name).map(|o| o.0), Some(0o600));
        // Root's link in root's directory (`/lib` → `usr/lib`): followed.
        let mine = d.join("mine");
        std::fs::create_dir_all(mine.join("real")).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("real", mine.join("alias")).unwrap();
        let owned_by_root = std::fs::symlink_metadata(mine.join("alias")).map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap();
        match open_parent(&mine.join("alias/../alias/x.conf")) {
            Ok((fd, name)) => {
                assert!(owned_by_root, "followed only when root owns the link");
                write_in(&fd, &name, b"x", 0o644, None).unwrap();
                assert!(mine.join("real/x.conf").exists());
            }
            Err(e) => assert!(!owned_by_root, "{e}"),
        }
        assert!(writable_by_others(&envdir.join("sub/w1.conf")).iter().any(|w| w.contains("envdir (mode 0777")), "named as writable by others");
        let _ = std::fs::remove_dir_all(&d);
    }
}
