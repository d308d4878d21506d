//! A private systemd *system* manager: systemd as PID 1 of its own PID namespace, with its own
//! system bus (dbus-daemon), polkitd and journald — for what the user-manager [`crate::Sandbox`]
//! cannot show: polkit deciding what an unprivileged account may ask of systemd (pdctld run as
//! its own user). This machine's PID 1 is not systemd, so nothing else here has a system manager.
//!
//! Inside, in a mount namespace of its own: `/run` and `/var/lib` are fresh tmpfs; the units are
//! only those given (`SYSTEMD_UNIT_PATH` is the sandbox's unit directory, bound at
//! [`UNIT_DIR`]), besides journald's own and a bus and polkitd; `/etc/passwd` and `/etc/group`
//! are copies of the host's with the accounts of the given sysusers.d files added by
//! `systemd-sysusers --root` (the host's are untouched); polkit's rules directory
//! `/etc/polkit-1/rules.d` holds exactly the given rules; `/run/log/journal` is the group
//! `systemd-journal`'s (setgid), as systemd-tmpfiles makes it at a real boot, so that its members
//! read the journal. The network is the host's.
//! Teardown: SIGKILL to the namespace's PID 1 (on drop, or when the test process dies:
//! `PR_SET_PDEATHSIG`) ends every process in it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{io, Result, SandboxError};

/// Where the sandbox's shared directory is inside (unit files under `units/`; anything a test
/// puts in [`SystemManager::shared`] is seen here).
pub const SHARED: &str = "/run/pdctl-system";
/// The unit directory inside (the manager's only unit path).
pub const UNIT_DIR: &str = "/run/pdctl-system/units";

/// The bus, polkitd and journald, and the targets systemd's default dependencies name (empty).
fn base_units() -> Result<Vec<(String, String)>> {
    let mut u: Vec<(String, String)> =
        ["sysinit", "sockets", "basic", "shutdown", "paths", "timers", "slices", "local-fs", "local-fs-pre", "swap", "umount", "network", "multi-user"]
            .iter()
            .map(|t| (format!("{t}.target"), format!("[Unit]\nDescription={t} (empty, pdctl-sandbox)\n")))
            .collect();
    for j in ["systemd-journald.service", "systemd-journald.socket", "systemd-journald-dev-log.socket"] {
        let text = std::fs::read_to_string(Path::new("/lib/systemd/system").join(j)).map_err(io(format!("read /lib/systemd/system/{j}")))?;
        u.push((j.to_string(), text));
    }
    u.push(("dbus.socket".into(), "[Unit]\nDescription=D-Bus system bus socket\n[Socket]\nListenStream=/run/dbus/system_bus_socket\n".into()));
    u.push((
        "dbus.service".into(),
        "[Unit]\nDescription=D-Bus system bus\nRequires=dbus.socket\n[Service]\n\
         ExecStart=/usr/bin/dbus-daemon --system --address=systemd: --nofork --nopidfile --systemd-activation --syslog-only\n"
            .into(),
    ));
    u.push((
        "polkit.service".into(),
        "[Unit]\nDescription=polkit\n[Service]\nType=dbus\nBusName=org.freedesktop.PolicyKit1\nExecStart=/usr/lib/polkit-1/polkitd --no-debug\n".into(),
    ));
    Ok(u)
}

/// What to boot.
#[derive(Debug, Default)]
pub struct Boot {
    /// Unit files (name, or `NAME.d/DROPIN.conf`; text), besides the base ones.
    pub units: Vec<(String, String)>,
    /// Files (path under the shared directory, text) written before boot.
    pub files: Vec<(String, String)>,
    /// Programs copied into the shared directory (path under it, source), mode 0755: a unit
    /// with `PrivateTmp=yes` does not see a build under /tmp or /var/tmp, but sees /run.
    pub programs: Vec<(String, PathBuf)>,
    /// Units to start at boot (their start is not waited for).
    pub start: Vec<String>,
    /// polkit rules (file name, text) for `/etc/polkit-1/rules.d`.
    pub rules: Vec<(String, String)>,
    /// sysusers.d files whose accounts are added to the private `/etc/passwd` and `/etc/group`.
    pub sysusers: Vec<PathBuf>,
    /// Directories to create inside the shared one before boot: (path under it, owner uid or
    /// account name from the sysusers files, group name, mode).
    pub dirs: Vec<(String, String, String, u32)>,
}

/// A running system manager. Dropping it kills everything inside and removes its files.
pub struct SystemManager {
    unshare: Child,
    init_pid: u32,
    dir: tempfile::TempDir,
    cgroups: Vec<PathBuf>,
}

impl std::fmt::Debug for SystemManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemManager").field("init_pid", &self.init_pid).field("dir", &self.dir.path()).finish()
    }
}

/// The id of `name` in a passwd- or group-format file.
fn id_in(file: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() > 2 && f[0] == name).and_then(|f| f[2].parse().ok())
}

/// Lay out the sandbox's tree in `d`: the shared directory with the units and files, the
/// private `/etc` with the sysusers accounts, polkit's rules, the directories asked for.
fn prepare(b: &Boot, d: &Path) -> Result<()> {
    let shared = d.join("shared");
    let units = shared.join("units");
    let etc = d.join("root/etc");
    let rules = d.join("rules.d");
    for x in [&units, &etc, &rules] {
        std::fs::create_dir_all(x).map_err(io(format!("create {}", x.display())))?;
    }
    // The account pdctld runs as must reach the shared directory (a tempdir is 0700).
    for x in [&shared, &units, &rules] {
        std::fs::set_permissions(x, std::fs::Permissions::from_mode(0o755)).map_err(io("chmod the shared directory"))?;
    }
    for f in ["passwd", "group", "shadow", "gshadow"] {
        if Path::new("/etc").join(f).exists() {
            std::fs::copy(Path::new("/etc").join(f), etc.join(f)).map_err(io(format!("copy /etc/{f}")))?;
        }
    }
    if !b.sysusers.is_empty() {
        let out = Command::new("/usr/bin/systemd-sysusers")
            .arg(format!("--root={}", d.join("root").display()))
            .args(&b.sysusers)
            .output()
            .map_err(io("run systemd-sysusers"))?;
        if !out.status.success() {
            return Err(SandboxError::Command { cmd: "systemd-sysusers --root".into(), detail: String::from_utf8_lossy(&out.stderr).into_owned() });
        }
    }
    let files = base_units()?.into_iter().chain(b.units.iter().cloned()).map(|(n, t)| (units.join(n), t));
    for (path, text) in files.chain(b.files.iter().map(|(n, t)| (shared.join(n), t.clone()))) {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))?;
    }
    let wants: Vec<String> = ["systemd-journald.socket", "systemd-journald-dev-log.socket", "systemd-journald.service", "dbus.socket", "polkit.service"]
        .iter()
        .map(|s| s.to_string())
        .chain(b.start.iter().cloned())
        .collect();
    std::fs::write(units.join("pdctl-sandbox.target"), format!("[Unit]\nDescription=pdctl-sandbox\nWants={}\n", wants.join(" ")))
        .map_err(io("write the target"))?;
    for (name, text) in &b.rules {
        let p = rules.join(name);
        std::fs::write(&p, text).map_err(io(format!("write the rule {name}")))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).map_err(io("chmod a rule"))?;
    }
    for (sub, from) in &b.programs {
        let to = shared.join(sub);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        std::fs::copy(from, &to).map_err(io(format!("copy {} into the sandbox", from.display())))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).map_err(io("chmod a program"))?;
    }
    for (sub, owner, group, mode) in &b.dirs {
        let p = shared.join(sub);
        std::fs::create_dir_all(&p).map_err(io(format!("create {}", p.display())))?;
        let uid = owner.parse().ok().or_else(|| id_in(&etc.join("passwd"), owner));
        let gid = group.parse().ok().or_else(|| id_in(&etc.join("group"), group));
        std::os::unix::fs::chown(&p, uid, gid).map_err(io(format!("chown {}", p.display())))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).map_err(io(format!("chmod {}", p.display())))?;
    }
    Ok(())
}

impl SystemManager {
    /// Boot one. Needs root, systemd, dbus-daemon, polkitd, `unshare`/`nsenter` and
    /// `systemd-sysusers`.
    pub fn boot(b: &Boot) -> Result<SystemManager> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(SandboxError::NotRoot);
        }
        for p in
            ["/lib/systemd/systemd", "/usr/bin/dbus-daemon", "/usr/lib/polkit-1/polkitd", "/usr/bin/unshare", "/usr/bin/nsenter", "/usr/bin/systemd-sysusers"]
        {
            if !Path::new(p).exists() {
                return Err(SandboxError::Missing(p.into()));
            }
        }
        let dir = tempfile::Builder::new().prefix("pdctl-system-").tempdir().map_err(io("create the sandbox directory"))?;
        prepare(b, dir.path())?;
        let d = dir.path();
        let (shared, etc, rules) = (d.join("shared"), d.join("root/etc"), d.join("rules.d"));
        let script = format!(
            "set -e\nmount --make-rprivate /\nmount -t tmpfs -o mode=0755 tmpfs /run\nmkdir -p /run/dbus {SHARED}\n\
             mount --bind {shared} {SHARED}\nmount -t tmpfs -o mode=0755 tmpfs /var/lib\nmkdir -p /var/lib/systemd\n\
             for f in passwd group shadow gshadow; do [ -e {etc}/$f ] && [ -e /etc/$f ] && mount --bind {etc}/$f /etc/$f; done\n\
             mount --bind {rules} /etc/polkit-1/rules.d\n\
             mkdir -p /run/log/journal\nchgrp systemd-journal /run/log/journal\nchmod 2755 /run/log/journal\n\
             export container=pdctl-sandbox SYSTEMD_UNIT_PATH={UNIT_DIR}\n\
             exec /lib/systemd/systemd --system --unit=pdctl-sandbox.target --log-target=journal\n",
            shared = shared.display(),
            etc = etc.display(),
            rules = rules.display(),
        );
        let tag = d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| format!("pdctl-system-{}", std::process::id()));
        let cgroups = crate::cgroups::prepare_cgroups(&format!("{tag}.slice"));
        let mut cmd = Command::new("/usr/bin/unshare");
        cmd.args(["--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "--", "/bin/sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("boot.log")).map(Stdio::from).unwrap_or_else(|_| Stdio::null()));
        crate::cgroups::enter_cgroups_at_exec(&mut cmd, &cgroups, true);
        let unshare = cmd.spawn().map_err(io("start unshare"))?;
        let mut sm = SystemManager { unshare, init_pid: 0, dir, cgroups };
        sm.wait_up()?;
        Ok(sm)
    }

    /// Wait (60 s at most) until the manager runs journald, the bus and polkitd.
    fn wait_up(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.init_pid == 0 {
                let u = self.unshare.id();
                self.init_pid = std::fs::read_to_string(format!("/proc/{u}/task/{u}/children"))
                    .ok()
                    .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
                    .unwrap_or(0);
            }
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.init_pid)).unwrap_or_default();
            if self.init_pid > 0 && comm.trim() == "systemd" {
                let up = self.run(&["systemctl", "is-active", "systemd-journald.service", "dbus.service", "polkit.service"]);
                if up.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| *l == "active").count() == 3) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline || matches!(self.unshare.try_wait(), Ok(Some(_))) {
                let log = std::fs::read_to_string(self.dir.path().join("boot.log")).unwrap_or_default();
                let failed = self.run(&["systemctl", "--failed", "--no-legend"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
                return Err(SandboxError::Boot(format!(
                    "the system manager did not bring up journald, the bus and polkitd within 60 s; boot said: {} failed units: {}",
                    log.trim(),
                    failed.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Run `argv` inside (mount and PID namespaces), as root; its output whatever its exit.
    pub fn run(&self, argv: &[&str]) -> Result<Output> {
        let pid = self.init_pid.to_string();
        Command::new("/usr/bin/nsenter")
            .args(["-t", &pid, "-m", "-p", "--"])
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .map_err(io(format!("run {} in the system manager", argv.join(" "))))
    }

    /// Run `argv` inside as `account` (its uid, primary group and no other), via setpriv.
    pub fn run_as(&self, account: &str, argv: &[&str]) -> Result<Output> {
        let uid = self.id("passwd", account)?;
        let passwd = std::fs::read_to_string(self.dir.path().join("root/etc/passwd")).unwrap_or_default();
        let gid = passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() > 3 && f[0] == account)
            .and_then(|f| f[3].parse::<u32>().ok())
            .unwrap_or(uid);
        let (u, g) = (format!("--reuid={uid}"), format!("--regid={gid}"));
        let mut all = vec!["/usr/bin/setpriv", u.as_str(), g.as_str(), "--clear-groups", "--"];
        all.extend_from_slice(argv);
        self.run(&all)
    }

    /// `account`'s id in the private `/etc/passwd` or `/etc/group` (`file`).
    pub fn id(&self, file: &str, account: &str) -> Result<u32> {
        id_in(&self.dir.path().join("root/etc").join(file), account)
            .ok_or_else(|| SandboxError::Command { cmd: format!("look up {account} in /etc/{file}"), detail: "no such entry".into() })
    }

    /// `systemctl ARGS` inside, as root; an error unless it exits 0.
    pub fn systemctl(&self, args: &[&str]) -> Result<Output> {
        let mut argv = vec!["systemctl"];
        argv.extend_from_slice(args);
        let out = self.run(&argv)?;
        if out.status.success() {
            Ok(out)
        } else {
            Err(SandboxError::Command { cmd: format!("systemctl {}", args.join(" ")), detail: String::from_utf8_lossy(&out.stderr).into_owned() })
        }
    }

    /// The shared directory, seen from outside (inside: [`SHARED`]).
    pub fn shared(&self) -> PathBuf {
        self.dir.path().join("shared")
    }

    /// Host PID of the manager (PID 1 inside).
    pub fn init_pid(&self) -> u32 {
        self.init_pid
    }
}

impl Drop for SystemManager {
    fn drop(&mut self) {
        if self.init_pid > 0 {
            // SAFETY: signalling the namespace's init, which we started; harmless if gone.
            unsafe { libc::kill(self.init_pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        let gone = Instant::now() + Duration::from_secs(10);
        while self.init_pid > 0 && Path::new(&format!("/proc/{}", self.init_pid)).exists() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in &self.cgroups {
            crate::cgroups::remove_cgroup(c);
        }
    }
}
