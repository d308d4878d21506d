//! `pdctl-sandbox`: a private, real systemd user manager + journald + D-Bus, booted in new mount
//! and PID namespaces (and its own cgroup), for tests and for `pdctl-demo`. How and why it boots
//! this way: docs/architecture.md, "How a test boots the sandbox".
//!
//! ```no_run
//! let sb = pdctl_sandbox::Sandbox::start().unwrap();
//! sb.write_unit("hello.service", "[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
//! sb.daemon_reload().unwrap();
//! sb.systemctl(&["start", "hello.service"]).unwrap();
//! println!("bus: {}  journal: {}", sb.bus_address(), sb.journal_dir().display());
//! // dropping `sb` kills everything inside it
//! ```
//!
//! Everything inside is reached from outside through `/proc/<pid>/root/` of the namespace's first
//! process: the bus at [`Sandbox::bus_address`], the journal at [`Sandbox::journal_dir`]. The
//! network is shared with the host, so services listen on loopback ports chosen by [`free_port`].
//! Teardown is certain: the namespace's first process exits when the owner's end of its stdin
//! closes (on drop, or when the owning process dies for any reason), and the kernel then kills
//! every process in the namespace.

#![warn(missing_docs)]

mod cgroups;
pub mod etcd;
pub mod flags_file;
pub mod init;
pub mod journal;
pub mod stack;
pub mod system;
pub mod unit_files;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::cgroups::{enter_cgroups_at_exec, prepare_cgroups, remove_cgroup};

/// Why a sandbox could not be booted or used.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Not running as root.
    #[error("the sandbox needs root (it mounts a private /run and runs systemd in new namespaces); run the tests or the demo as root")]
    NotRoot,
    /// A program the sandbox needs is missing.
    #[error("{0} was not found; install it (Debian: apt-get install systemd util-linux dbus) and retry")]
    Missing(String),
    /// A binary of this workspace is not built.
    #[error("{name} was not found at {path}; build the workspace first (cargo build --workspace --bins) or set {env}")]
    BinaryNotBuilt {
        /// The binary's name.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
        /// The environment variable that overrides the location.
        env: String,
    },
    /// Booting failed; the message says where.
    #[error("the sandbox did not boot: {0}")]
    Boot(String),
    /// A command run inside the sandbox failed.
    #[error("`{cmd}` failed in the sandbox: {detail}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its stderr/stdout or the spawn error.
        detail: String,
    },
    /// Local I/O.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
    let what = what.into();
    move |source| SandboxError::Io { what, source }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, SandboxError>;

/// How long booting may take before it is reported as failed.
const BOOT_DEADLINE: Duration = Duration::from_secs(60);

/// A running sandbox. Dropping it kills every process inside and removes its files.
pub struct Sandbox {
    unshare: Child,
    /// Keeps the first process alive; closing it ends the sandbox.
    stdin: Option<ChildStdin>,
    init_pid: u32,
    pidfd: Option<std::os::fd::OwnedFd>,
    dir: tempfile::TempDir,
    cgroups: Vec<PathBuf>,
    machine_id: String,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("init_pid", &self.init_pid).field("dir", &self.dir.path()).finish()
    }
}

/// Locate a binary of this workspace: `$env` if set, else next to the running executable
/// (`target/<profile>/`, also from `target/<profile>/deps/` where test binaries live).
pub fn workspace_bin(name: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(io("find the running executable"))?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(SandboxError::BinaryNotBuilt { name: name.into(), path, env: env.into() })
    }
}

/// The repository's top directory (where the README's commands put `.venv`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// Which generation of the real SGLang gateway a stack runs (both are installed by
/// `scripts/setup`, each in a venv of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gateway {
    /// PyPI `smg` 1.13.0: today's gateway (worker `status`, a ~5 s `draining` state).
    Smg113,
    /// PyPI `sglang-router` 0.3.2: the generation pdctl was first built against.
    SglangRouter032,
}

impl Gateway {
    /// The default: `$PDCTL_GATEWAY` (`smg-1.13` or `sglang-router-0.3.2`), else smg 1.13.
    pub fn from_env() -> Gateway {
        match std::env::var("PDCTL_GATEWAY").as_deref() {
            Ok("sglang-router-0.3.2") => Gateway::SglangRouter032,
            _ => Gateway::Smg113,
        }
    }

    /// Its name and version.
    pub fn name(self) -> &'static str {
        match self {
            Gateway::Smg113 => "smg 1.13.0",
            Gateway::SglangRouter032 => "sglang-router 0.3.2",
        }
    }

    /// Its `smg` entry point in the repository's venvs.
    pub fn bin(self) -> Result<PathBuf> {
        let venv = match self {
            Gateway::Smg113 => ".venv-smg",
            Gateway::SglangRouter032 => ".venv",
        };
        let p = repo_root().join(venv).join("bin/smg");
        if p.is_file() {
            Ok(p)
        } else {
            Err(SandboxError::Missing(format!("the SGLang gateway {} ({}; run scripts/setup to install it)", self.name(), p.display())))
        }
    }
}

/// The real SGLang server as `scripts/setup` installs it (`./.venv-sglang`, a link to a cache
/// directory named by the hash of `scripts/real-sglang/`'s files): `sglang==0.5.23` on this CPU
/// with a tiny model made locally. What each part is for: scripts/setup and docs/real-sglang.md.
#[derive(Debug, Clone)]
pub struct RealSglang {
    /// The venv's Python.
    pub python: PathBuf,
    /// The directory holding the stand-in `libcuda.so.1` (the units' `LD_LIBRARY_PATH`).
    pub lib: PathBuf,
    /// The tiny model: config, tokenizer and real weight files (random from seed 0).
    pub model: PathBuf,
    /// The same model with other weights (seed 1): the target of an in-place weights update.
    pub model_v2: PathBuf,
    /// The directory of `sitecustomize.py` (the units' `PYTHONPATH`).
    pub site: PathBuf,
}

/// The flags the real server runs with on this CPU, after `--model-path`: the CPU path that needs
/// no CPU build of sglang-kernel, a small KV pool, no idle busy-polling, and the overlap scheduler
/// off (its PD path calls CUDA). Why each: [`stack::real_worker_unit`]. The weights are real files
/// (not `--load-format dummy`): 0.5.23 refuses `/update_weights_from_disk` on a dummy-loaded server.
const CPU_FLAGS: &[&str] = &[
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--disable-overlap-schedule",
    "--max-total-tokens",
    "8192",
    "--mem-fraction-static",
    "0.05",
    "--sleep-on-idle",
    "--host",
    "127.0.0.1",
];

impl RealSglang {
    /// `--model-path MODEL` and the flags the real server runs with on this CPU (the port and the
    /// role are the caller's).
    pub fn cpu_flags(&self) -> Vec<String> {
        let model = ["--model-path".to_string(), self.model.display().to_string()];
        model.into_iter().chain(CPU_FLAGS.iter().map(|s| s.to_string())).collect()
    }

    /// The environment the real server needs on this CPU (`KEY`, `value`): the CPU engine, one
    /// OpenMP thread, no model hub, unbuffered output, the stand-in `libcuda.so.1` and the import
    /// hook.
    pub fn env(&self) -> Vec<(String, String)> {
        let s = |k: &str, v: &str| (k.to_string(), v.to_string());
        vec![
            s("SGLANG_USE_CPU_ENGINE", "1"),
            s("OMP_NUM_THREADS", "1"),
            s("HF_HUB_OFFLINE", "1"),
            s("PYTHONUNBUFFERED", "1"),
            s("LD_LIBRARY_PATH", &self.lib.display().to_string()),
            s("PYTHONPATH", &self.site.display().to_string()),
        ]
    }

    /// Find it, or say that `scripts/setup` installs it.
    pub fn find() -> Result<RealSglang> {
        let root = repo_root();
        let dir = std::env::var_os("PDCTL_REAL_SGLANG").map(PathBuf::from).unwrap_or_else(|| root.join(".venv-sglang"));
        let r = RealSglang {
            python: dir.join("venv/bin/python"),
            lib: dir.join("lib"),
            model: dir.join("model"),
            model_v2: dir.join("model-v2"),
            site: root.join("scripts/real-sglang"),
        };
        let needed = [
            r.python.clone(),
            r.lib.join("libcuda.so.1"),
            r.model.join("model.safetensors"),
            r.model_v2.join("model.safetensors"),
            r.site.join("sitecustomize.py"),
            dir.join("ok"),
        ];
        for p in &needed {
            if !p.exists() {
                return Err(SandboxError::Missing(format!("the real SGLang server ({} is missing; run scripts/setup to install it)", p.display())));
            }
        }
        Ok(r)
    }
}

/// The real SGLang gateway's `smg` entry point: `$PDCTL_ROUTER_BIN`, else `gateway`'s in the
/// repository's venvs (installed by `scripts/setup`).
pub fn router_bin(gateway: Gateway) -> Result<PathBuf> {
    match std::env::var_os("PDCTL_ROUTER_BIN").map(PathBuf::from) {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => Err(SandboxError::Missing(format!("the SGLang gateway at PDCTL_ROUTER_BIN={}", p.display()))),
        None => gateway.bin(),
    }
}

/// A loopback TCP port that is free now, not handed out before by this process, and not claimed
/// by another process that uses this function (parallel tests): see the lock files below.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    // The ports this process holds, each with its lock file kept open (the lock is the claim).
    static GIVEN: Mutex<Vec<(u16, std::fs::File)>> = Mutex::new(Vec::new());
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // Below Linux's ephemeral range (32768-60999 by default): a port picked from that range can be
    // taken by any outgoing connection (the tests make many) before the server binds it. And
    // outside 22000-29999, where sglang 0.5.23 picks the port its scheduler binds later when no
    // `--nccl-port` is given (`get_free_port_below_ephemeral`, srt/utils/network.py): a port
    // claimed here but not yet bound looks free to it. (A fixed `--nccl-port` is no way out: each
    // attention-DP rank of one server binds its own, and one fixed port fails the second with
    // EADDRINUSE.) So 17000-21999 and 30000-32767. Test
    // processes run in parallel and a port is bound by its server only later, inside a sandbox: a
    // bind check alone lets two processes pick the same port. So each port is claimed across
    // processes by an exclusive lock on a file named after it, held until this process exits (the
    // kernel drops the lock then, whatever the exit); a port another process claimed is skipped.
    let dir = std::env::temp_dir().join("pdctl-test-ports");
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    let seed =
        std::process::id() as u64 * 7919 + std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos() as u64).unwrap_or(0);
    for _ in 0..1024 {
        let n = seed.wrapping_add(SEQ.fetch_add(1, Ordering::Relaxed).wrapping_mul(2654435761));
        let k = (n % (5000 + 2768)) as u16;
        let port = if k < 5000 { 17000 + k } else { 30000 + (k - 5000) };
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if given.iter().any(|(p, _)| *p == port) {
            continue;
        }
        let path = dir.join(port.to_string());
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io(format!("open {}", path.display())))?;
        // SAFETY: flock on a file descriptor this function owns; it blocks nothing (LOCK_NB).
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // another test process holds it
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push((port, file));
            return Ok(port);
        }
    }
    Err(SandboxError::Boot("no free loopback port found in 17000-21999 or 30000-32767".into()))
}

impl Sandbox {
    /// Boot a sandbox. Needs root, `unshare`/`nsenter` (util-linux), systemd and journald.
    pub fn start() -> Result<Sandbox> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(SandboxError::NotRoot);
        }
        for p in ["/lib/systemd/systemd", "/lib/systemd/systemd-journald", "/usr/bin/unshare", "/usr/bin/nsenter"] {
            if !Path::new(p).exists() {
                return Err(SandboxError::Missing(p.into()));
            }
        }
        let init_bin = workspace_bin("pdctl-sandbox", "PDCTL_SANDBOX_BIN")?;
        let dir = tempfile::Builder::new().prefix("pdctl-sandbox-").tempdir().map_err(io("create the sandbox directory"))?;
        let config_home = dir.path().join("config");
        std::fs::create_dir_all(config_home.join("systemd/user")).map_err(io("create the unit directory"))?;
        let machine_id = std::fs::read_to_string("/etc/machine-id").map(|s| s.trim().to_string()).map_err(io("read /etc/machine-id (journald needs it)"))?;
        let tag = dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| format!("pdctl-sandbox-{}", std::process::id()));
        // A per-sandbox cgroup named like a slice: the manager roots its units there, and
        // journald, skipping slices, still derives `_SYSTEMD_UNIT=x.service` from the path.
        let cgroups = prepare_cgroups(&format!("{tag}.slice"));

        let mut cmd = Command::new("/usr/bin/unshare");
        cmd.args(["--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "--"])
            .arg(&init_bin)
            .arg("__init")
            .arg(&config_home)
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("init.log")).map(Stdio::from).unwrap_or_else(|_| Stdio::null()));
        enter_cgroups_at_exec(&mut cmd, &cgroups, false);
        let mut unshare = cmd.spawn().map_err(io("start unshare"))?;
        let stdin = unshare.stdin.take();
        let stdout = unshare.stdout.take();
        let (tx, rx) = mpsc::channel();
        if let Some(out) = stdout {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let mut sb = Sandbox { unshare, stdin, init_pid: 0, pidfd: None, dir, cgroups, machine_id };
        match rx.recv_timeout(BOOT_DEADLINE) {
            Ok(l) if l == "READY" => {}
            Ok(l) => return Err(SandboxError::Boot(l.strip_prefix("ERROR ").unwrap_or(&l).to_string())),
            Err(_) => {
                let log = std::fs::read_to_string(sb.dir.path().join("init.log")).unwrap_or_default();
                return Err(SandboxError::Boot(format!("no READY within {BOOT_DEADLINE:?}; init said: {}", log.trim())));
            }
        }
        let uid = sb.unshare.id();
        let children = std::fs::read_to_string(format!("/proc/{uid}/task/{uid}/children")).map_err(io("find the sandbox's first process"))?;
        sb.init_pid = children.split_whitespace().next().and_then(|p| p.parse().ok()).ok_or_else(|| SandboxError::Boot("unshare has no child".into()))?;
        // SAFETY: pidfd_open takes a pid and flags; the returned fd (if any) is owned by us.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, sb.init_pid as libc::pid_t, 0) };
        if fd >= 0 {
            // SAFETY: `fd` is a fresh descriptor returned by the kernel, owned by nobody else.
            sb.pidfd = Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) });
        }
        Ok(sb)
    }

    /// Host PID of the namespace's first process.
    pub fn init_pid(&self) -> u32 {
        self.init_pid
    }

    /// Host PIDs of the sandbox's processes (those in its PID namespace) whose `comm` is `comm`
    /// (at most 15 characters, as the kernel keeps it).
    pub fn host_pids_named(&self, comm: &str) -> Vec<u32> {
        self.processes().into_iter().filter(|(_, _, c)| c == comm).map(|(host, _, _)| host).collect()
    }

    /// The host PID of the sandbox's process known inside it as `ns_pid` (a unit's `MainPID`).
    pub fn host_pid(&self, ns_pid: u32) -> Option<u32> {
        self.processes().into_iter().find(|(_, inside, _)| *inside == ns_pid).map(|(host, _, _)| host)
    }

    /// (host PID, PID inside, comm) of every process in the sandbox's PID namespace, from
    /// `/proc/<pid>/ns/pid` and the last `NSpid:` field of `/proc/<pid>/status`.
    fn processes(&self) -> Vec<(u32, u32, String)> {
        let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/pid", self.init_pid)) else {
            return Vec::new();
        };
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
            .filter(|pid| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok().as_ref() == Some(&ns))
            .filter_map(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let inside = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()?;
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim().to_string();
                Some((pid, inside, comm))
            })
            .collect()
    }

    /// The sandbox's root as seen from outside (`/proc/<pid>/root`).
    pub fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.init_pid))
    }

    /// D-Bus address of the session bus the user manager serves (`org.freedesktop.systemd1`).
    pub fn bus_address(&self) -> String {
        format!("unix:path=/proc/{}/root{}/bus", self.init_pid, init::RUNTIME_DIR)
    }

    /// The manager's runtime directory, seen from outside.
    pub fn runtime_dir(&self) -> PathBuf {
        self.root().join(init::RUNTIME_DIR.trim_start_matches('/'))
    }

    /// The journal directory (volatile storage), seen from outside; for `sd_journal_open_directory`
    /// or `journalctl -D`.
    pub fn journal_dir(&self) -> PathBuf {
        self.root().join("run/log/journal").join(&self.machine_id)
    }

    /// Host directory the sandbox keeps its files in (unit files, logs). Removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where unit files go (`$XDG_CONFIG_HOME/systemd/user`).
    pub fn unit_dir(&self) -> PathBuf {
        self.dir.path().join("config/systemd/user")
    }

    /// Write (or replace) a unit file. Call [`Sandbox::daemon_reload`] afterwards.
    pub fn write_unit(&self, name: &str, contents: &str) -> Result<PathBuf> {
        let p = self.unit_dir().join(name);
        std::fs::write(&p, contents).map_err(io(format!("write {}", p.display())))?;
        Ok(p)
    }

    /// A command that runs inside the sandbox's namespaces with the manager's environment.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("/usr/bin/nsenter");
        c.arg(format!("--target={}", self.init_pid))
            .args(["--mount", "--pid", "--"])
            .arg("/usr/bin/env")
            .arg(format!("XDG_RUNTIME_DIR={}", init::RUNTIME_DIR))
            .arg(format!("DBUS_SESSION_BUS_ADDRESS=unix:path={}/bus", init::RUNTIME_DIR))
            .arg(program)
            .stdin(Stdio::null());
        c
    }

    fn run(&self, mut c: Command, shown: String) -> Result<Output> {
        let out = c.output().map_err(|e| SandboxError::Command { cmd: shown.clone(), detail: e.to_string() })?;
        if out.status.success() {
            Ok(out)
        } else {
            Err(SandboxError::Command {
                cmd: shown,
                detail: format!("{} {}{}", out.status, String::from_utf8_lossy(&out.stderr).trim(), String::from_utf8_lossy(&out.stdout).trim()),
            })
        }
    }

    /// `systemctl --user ARGS` inside the sandbox; an error unless it exits 0.
    pub fn systemctl(&self, args: &[&str]) -> Result<Output> {
        let mut c = self.command("systemctl");
        c.arg("--user").args(args);
        self.run(c, format!("systemctl --user {}", args.join(" ")))
    }

    /// `systemctl --user daemon-reload`.
    pub fn daemon_reload(&self) -> Result<()> {
        self.systemctl(&["daemon-reload"]).map(|_| ())
    }

    /// `journalctl -D <journal> ARGS` (read from outside; no namespace needed).
    pub fn journalctl(&self, args: &[&str]) -> Result<Output> {
        let mut c = Command::new("journalctl");
        c.arg("-D").arg(self.journal_dir()).args(args).stdin(Stdio::null());
        self.run(c, format!("journalctl {}", args.join(" ")))
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Closing stdin asks the first process to exit; SIGKILL makes sure it does.
        self.stdin.take();
        if self.init_pid > 0 {
            // SAFETY: signalling a pid we own (the namespace's init) is harmless if it is gone.
            unsafe { libc::kill(self.init_pid as libc::pid_t, libc::SIGKILL) };
            if let Some(fd) = &self.pidfd {
                let mut p = libc::pollfd { fd: std::os::fd::AsRawFd::as_raw_fd(fd), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd; readable once the process has exited.
                unsafe { libc::poll(&mut p, 1, 10_000) };
            }
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        for c in &self.cgroups {
            remove_cgroup(c);
        }
    }
}
