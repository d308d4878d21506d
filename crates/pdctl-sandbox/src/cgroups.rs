//! The sandbox's cgroups: a delegated subtree for its manager, entered by the manager's process
//! at exec, and removed with the sandbox.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Cgroup directories to move the sandbox into, so that two sandboxes never share unit cgroups.
pub(crate) fn prepare_cgroups(tag: &str) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => continue,
        };
        let mount = if ctrl.is_empty() {
            ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"].iter().map(PathBuf::from).find(|m| m.join("cgroup.procs").exists() && !m.join("cpu").is_dir())
        } else if ctrl.split(',').any(|c| c == "cpuset") {
            None // cpuset needs cpus/mems set before a task can join
        } else {
            let m = PathBuf::from("/sys/fs/cgroup").join(ctrl.trim_start_matches("name="));
            m.join("cgroup.procs").exists().then_some(m)
        };
        if let Some(m) = mount {
            let dir = m.join(path.trim_start_matches('/')).join(tag);
            if std::fs::create_dir(&dir).is_ok() {
                out.push(dir);
            }
        }
    }
    out
}

/// Have `cmd`'s process join `cgroups` (each `cgroup.procs`) between fork and exec, so that it and
/// everything it starts live there; with `die_with_parent`, it is also SIGKILLed when the thread
/// that started it ends (`PR_SET_PDEATHSIG`).
pub(crate) fn enter_cgroups_at_exec(cmd: &mut Command, cgroups: &[PathBuf], die_with_parent: bool) {
    let procs: Vec<std::ffi::CString> =
        cgroups.iter().filter_map(|d| std::ffi::CString::new(d.join("cgroup.procs").to_string_lossy().as_bytes()).ok()).collect();
    // SAFETY: the closure only calls async-signal-safe functions (open, write, close, prctl) on
    // pointers prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            if die_with_parent {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Remove a cgroup directory tree, deepest first (cgroupfs only removes empty groups).
pub(crate) fn remove_cgroup(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
