//! The first process of a sandbox's PID namespace (run by `pdctl-sandbox __init` under `unshare`).
//!
//! It mounts a private `/run`, starts a standalone `systemd-journald` and a real
//! `systemd --user --log-target=journal` (the manager logs to the journal it finds at
//! `/run/systemd/journal/socket`), reports `READY` on stdout, then reaps
//! orphans until its stdin closes — which happens when the owning [`crate::Sandbox`] is dropped or
//! its process dies. When this process exits, the kernel kills everything in the namespace.

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the manager's runtime directory lives inside the sandbox.
pub const RUNTIME_DIR: &str = "/run/user/0";

/// Set to a size (`4G`) to let the sandbox's journald keep that much (its `RuntimeMaxUse=`) and
/// keep every line (no rate limit): for benchmarks with a large journal.
pub const JOURNAL_MAX_ENV: &str = "PDCTL_SANDBOX_JOURNAL_MAX";
const JOURNALD: &str = "/lib/systemd/systemd-journald";
const SYSTEMD: &str = "/lib/systemd/systemd";

fn fail(msg: &str) -> ! {
    println!("ERROR {msg}");
    let _ = std::io::stdout().flush();
    std::process::exit(1);
}

fn mount_tmpfs(target: &str) -> Result<(), String> {
    let c = |s: &str| std::ffi::CString::new(s).map_err(|e| e.to_string());
    let (src, tgt, fs, opts) = (c("tmpfs")?, c(target)?, c("tmpfs")?, c("mode=755")?);
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::mount(src.as_ptr(), tgt.as_ptr(), fs.as_ptr(), 0, opts.as_ptr().cast()) };
    if rc != 0 {
        return Err(format!("mount tmpfs on {target}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn wait_for(what: &str, deadline: Duration, mut ok: impl FnMut() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !ok() {
        if start.elapsed() > deadline {
            return Err(format!("timed out after {deadline:?} waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Run as the namespace's PID 1. Never returns.
pub fn run(config_home: &Path, log_dir: &Path) -> ! {
    if std::process::id() != 1 {
        fail("__init must run as PID 1 of a new PID namespace (use the library, not this command)");
    }
    prepare_filesystems();
    let log = |name: &str| -> Stdio {
        match std::fs::File::create(log_dir.join(name)) {
            Ok(f) => Stdio::from(f),
            Err(_) => Stdio::null(),
        }
    };
    let journald = Command::new(JOURNALD).stdin(Stdio::null()).stdout(log("journald.log")).stderr(log("journald.log")).spawn();
    if let Err(e) = journald {
        fail(&format!("start {JOURNALD}: {e}"));
    }
    if let Err(e) = wait_for("journald's sockets", Duration::from_secs(15), || {
        Path::new("/run/systemd/journal/stdout").exists() && Path::new("/run/systemd/journal/socket").exists()
    }) {
        fail(&e);
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    let manager = Command::new(SYSTEMD)
        .args(["--user", "--log-target=journal"])
        .env_clear()
        .env("PATH", &path)
        .env("HOME", "/root")
        .env("USER", "root")
        .env("XDG_RUNTIME_DIR", RUNTIME_DIR)
        .env("XDG_CONFIG_HOME", config_home)
        .stdin(Stdio::null())
        .stdout(log("manager.log"))
        .stderr(log("manager.log"))
        .spawn();
    let manager_pid = match manager {
        Ok(c) => c.id() as libc::pid_t,
        Err(e) => fail(&format!("start {SYSTEMD} --user: {e}")),
    };
    let bus = PathBuf::from(RUNTIME_DIR).join("bus");
    let answered = wait_for("the user manager's D-Bus API", Duration::from_secs(30), || {
        bus.exists()
            && Command::new("systemctl")
                .args(["--user", "is-system-running"])
                .env("XDG_RUNTIME_DIR", RUNTIME_DIR)
                .env("DBUS_SESSION_BUS_ADDRESS", format!("unix:path={}", bus.display()))
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .map(|o| {
                    let s = String::from_utf8_lossy(&o.stdout);
                    matches!(s.trim(), "running" | "degraded" | "starting" | "offline")
                })
                .unwrap_or(false)
    });
    if let Err(e) = answered {
        fail(&format!("{e} (see {}/manager.log)", log_dir.display()));
    }
    println!("READY");
    let _ = std::io::stdout().flush();

    reap_until_gone(manager_pid)
}

/// `/run` (and a host's persistent journal) as private tmpfs, the runtime directories, and
/// journald's limits lifted when a benchmark asks.
fn prepare_filesystems() {
    if let Err(e) = mount_tmpfs("/run") {
        fail(&e);
    }
    // A persistent journal directory on the host would receive our entries: hide it.
    if Path::new("/var/log/journal").is_dir() {
        if let Err(e) = mount_tmpfs("/var/log/journal") {
            fail(&e);
        }
        let _ = std::fs::remove_dir("/var/log/journal");
    }
    for d in ["/run/systemd/journal", "/run/systemd/system", RUNTIME_DIR, "/run/log/journal"] {
        if let Err(e) = std::fs::create_dir_all(d) {
            fail(&format!("create {d}: {e}"));
        }
    }
    // Benchmarks that need a large journal raise journald's cap (10% of this tmpfs by default)
    // and lift its per-service rate limit (10 000 lines per 30 s), so every line is kept.
    if let Ok(max) = std::env::var(JOURNAL_MAX_ENV) {
        let dir = Path::new("/run/systemd/journald.conf.d");
        let text = format!("[Journal]\nRuntimeMaxUse={max}\nRateLimitBurst=0\n");
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(dir.join("pdctl-sandbox.conf"), text)) {
            fail(&format!("write journald's drop-in: {e}"));
        }
    }
}

/// PID 1's duty: reap every child; end when the owner (stdin's other end) or the manager is gone.
fn reap_until_gone(manager_pid: libc::pid_t) -> ! {
    // Our owner holds the other end of stdin: EOF means it is gone (dropped, or died).
    std::thread::spawn(|| {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            if line.is_err() {
                break;
            }
        }
        std::process::exit(0);
    });
    loop {
        let mut status = 0;
        // SAFETY: plain waitpid on any child; `status` is a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == manager_pid {
            eprintln!("pdctl-sandbox: the systemd user manager exited (status {status}); ending the sandbox");
            std::process::exit(3);
        }
        if pid < 0 {
            // No children at all (cannot happen while the manager lives); avoid a busy loop.
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
