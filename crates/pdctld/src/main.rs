//! `pdctld`: the daemon that owns rollouts. `Type=notify` (READY=1 once it serves, WATCHDOG=1,
//! STATUS= with the current rollout); control API over a Unix socket (HTTP/1.1 + JSON, events as
//! NDJSON); its own metrics on a loopback TCP address; logs to journald with `PDCTL_ROLLOUT_ID`,
//! `PDCTL_UNIT`, `PDCTL_STEP` fields when run by systemd, to stderr otherwise.

mod daemon;
mod metrics;
mod peer;
mod serve;
mod store;

use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use pdctl_contract::api::Exit;
use tracing_subscriber::prelude::*;

use serve::{serve, Caller, MAX_CONNECTIONS, METRICS_CONNECTIONS};

#[derive(Parser)]
#[command(name = "pdctld", version, about = "pdctl's daemon: owns rollouts of SGLang units")]
struct Args {
    /// Main config file (default: $PDCTL_CONFIG, else /etc/pdctl/pdctl.toml).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Control socket.
    #[arg(long, default_value = "/run/pdctl/pdctl.sock", env = "PDCTL_SOCKET")]
    socket: PathBuf,
    /// Group that may use the socket (mode 0660).
    #[arg(long)]
    socket_group: Option<String>,
    /// Retention: how many finished rollout records to keep (older ones are deleted with the
    /// unit and environment files kept for their revert).
    #[arg(long, default_value_t = daemon::DEFAULT_KEEP_RECORDS)]
    keep_records: usize,
    /// Group that may act (start, resume, revert, abort rollouts; fleet rollouts); others who
    /// reach the socket (its `--socket-group`) may only read: status, watch, show, diff, history.
    /// Unset: whoever reaches the socket may act.
    #[arg(long)]
    operate_group: Option<String>,
    /// State directory (rollout records, revisions).
    #[arg(long, default_value = "/var/lib/pdctl", env = "STATE_DIRECTORY")]
    state_dir: PathBuf,
    /// Loopback address of the metrics endpoint (`off` to disable).
    #[arg(long, default_value = "127.0.0.1:9731")]
    metrics_listen: String,
    /// On SIGTERM, how long to spend undoing the running rollout's drain before exiting (keep it
    /// below the unit's TimeoutStopSec). What is not undone by then is undone at the next start.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    stop_timeout: std::time::Duration,
    /// Write the man page pdctld.8 into DIR and exit (packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    write_man: Option<PathBuf>,
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PDCTL_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Under systemd (stderr is a journal stream), log natively to journald with our fields.
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        if let Ok(j) = tracing_journald::layer() {
            tracing_subscriber::registry().with(filter).with(j.with_field_prefix(None).with_syslog_identifier("pdctld".into())).init();
            return;
        }
    }
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).init();
}

fn chgrp(path: &std::path::Path, group: &str) -> Result<(), String> {
    let gid = group_id(group)?;
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: valid path; uid -1 keeps the owner.
    if unsafe { libc::chown(p.as_ptr(), u32::MAX, gid) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// The daemon over `store`, with who may act (`--operate-group`: an unknown group is exit 2) and
/// its retention applied once at start.
async fn daemon_for(args: &Args, config: PathBuf, store: store::Store) -> daemon::Daemon {
    let mut daemon = daemon::Daemon::new(config, store).await;
    if let Some(g) = &args.operate_group {
        match group_id(g) {
            Ok(gid) => daemon.operate = Some((g.clone(), gid)),
            Err(e) => {
                eprintln!("pdctld: --operate-group {g}: {e}; name an existing group (getent group {g})");
                Exit::Usage.exit_process();
            }
        }
    }
    daemon.keep_records = args.keep_records;
    daemon.prune_records();
    daemon
}

/// A group's gid by name.
fn group_id(group: &str) -> Result<u32, String> {
    let c = std::ffi::CString::new(group).map_err(|e| e.to_string())?;
    // SAFETY: getgrnam returns a pointer into static storage or null; read gr_gid at once.
    unsafe {
        let g = libc::getgrnam(c.as_ptr());
        if g.is_null() {
            return Err(format!("no group {group}"));
        }
        Ok((*g).gr_gid)
    }
}

/// Why a lock was not taken.
enum NotLocked {
    /// Who holds it ("another pdctld (PID N)").
    Held(String),
    /// Why its file cannot be opened.
    Unopened(String),
}

/// An exclusive lock on `path` (`flock`, released by the kernel when the process ends, however
/// it ends), with this process's PID written into it.
fn hold_lock(path: &std::path::Path) -> Result<std::fs::File, NotLocked> {
    use std::io::{Read as _, Seek as _, Write as _};
    use std::os::fd::AsRawFd as _;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| NotLocked::Unopened(format!("cannot open {} ({e})", path.display())))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut held = String::new();
        let _ = f.read_to_string(&mut held);
        let pid = held.trim();
        return Err(NotLocked::Held(if pid.is_empty() { "another pdctld".to_string() } else { format!("another pdctld (PID {pid})") }));
    }
    let written = f.set_len(0).and_then(|()| f.rewind()).and_then(|()| writeln!(f, "{}", std::process::id()));
    if let Err(e) = written {
        tracing::warn!("cannot write this PID into {}: {e}", path.display());
    }
    Ok(f)
}

/// The state directory's lock (`dir/pdctld.lock`); `Err`: the sentence naming the pdctld that
/// holds it.
fn lock_state_dir(dir: &std::path::Path) -> Result<std::fs::File, String> {
    hold_lock(&dir.join("pdctld.lock")).map_err(|e| match e {
        NotLocked::Held(who) => format!(
            "{who} already runs with the state directory {}: one pdctld per state directory (stop it first — systemctl stop pdctld — or give this one its own --state-dir and --socket)",
            dir.display()
        ),
        NotLocked::Unopened(why) => format!("{why}; check --state-dir and its permissions"),
    })
}

/// The control socket's lock (`SOCKET.lock`, beside it), taken before the socket is replaced: a
/// second pdctld on another state directory would otherwise unlink the first's socket and bind
/// its own, leaving the first running and unreachable. `Err`: the sentence naming the holder.
fn lock_socket(socket: &std::path::Path) -> Result<std::fs::File, String> {
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    hold_lock(std::path::Path::new(&name)).map_err(|e| match e {
        NotLocked::Held(who) => format!(
            "{who} already listens on {}: one pdctld per socket (stop it first — systemctl stop pdctld — or give this one its own --socket)",
            socket.display()
        ),
        NotLocked::Unopened(why) => format!("{why}; check --socket and its directory's permissions"),
    })
}

/// Each worker thread's stack: a rollout's steps nest (a repair's whole sequence runs inside the
/// prefill's pair step), and a future's poll frames are several times larger in a debug build;
/// tokio's 2 MiB default has been overflowed there, and an overflow aborts pdctld mid-rollout.
const WORKER_STACK: usize = 8 << 20;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_stack_size(WORKER_STACK).enable_all().build();
    match rt {
        Ok(rt) => rt.block_on(run()),
        Err(e) => {
            eprintln!("pdctld: cannot start the async runtime: {e}");
            Exit::Unreachable.exit_process();
        }
    }
}

async fn run() {
    let args = Args::parse();
    if let Some(dir) = &args.write_man {
        write_man(dir);
    }
    init_logs();
    let config = pdctl_core::config::main_path(args.config.as_deref());
    let (state_dir, store, _lock) = open_state(&args);
    if let Err(e) = pdctl_core::config::load(&config) {
        tracing::warn!("config error (rollouts will be refused until it is fixed): {e}");
    }
    let d = Arc::new(daemon_for(&args, config, store).await);
    let (listener, _socket_lock) = bind_socket(&args);
    serve_metrics(&args, &d).await;
    serve_fleetlock(&d).await;
    let app = daemon::http::api(d.clone());
    spawn_background(&d, &args);
    tracing::info!(socket = %args.socket.display(), state_dir = %state_dir.display(), "pdctld serving on {}", args.socket.display());
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status("idle")]);
    let accept = || async {
        // Who is on the other end (the kernel's word, SO_PEERCRED): the audit trail's uid.
        listener.accept().await.map(|(s, _)| {
            let uid = s.peer_cred().ok().map(|c| c.uid());
            (s, uid, Caller::of(uid, None))
        })
    };
    tokio::select! {
        _ = serve(accept, app, MAX_CONNECTIONS, None, "the control socket") => {}
        _ = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => { s.recv().await; }
                Err(_) => std::future::pending::<()>().await,
            }
        } => {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping, sd_notify::NotifyState::Status("stopping: undoing the running rollout's drain")]);
            tracing::info!("pdctld stopping");
            // The socket stops answering; the running rollout's drain is undone within the budget.
            d.shutdown(args.stop_timeout).await;
        }
    }
}

/// `--write-man DIR`: write pdctld.8 there and exit.
fn write_man(dir: &std::path::Path) -> ! {
    use clap::CommandFactory as _;
    let page = clap_mangen::Man::new(Args::command()).section("8");
    let mut out = Vec::new();
    let written = page.render(&mut out).and_then(|()| std::fs::write(dir.join("pdctld.8"), &out));
    match written {
        Ok(()) => Exit::Ok.exit_process(),
        Err(e) => {
            eprintln!("pdctld: cannot write {}/pdctld.8: {e}", dir.display());
            Exit::Unreachable.exit_process();
        }
    }
}

/// The state directory, its store, and its lock (held, its descriptor open, for the process's
/// life); a directory that cannot be used or is locked by another pdctld ends the process.
fn open_state(args: &Args) -> (PathBuf, store::Store, std::fs::File) {
    // STATE_DIRECTORY from systemd may list several paths separated by ':'.
    let state_dir = PathBuf::from(args.state_dir.to_string_lossy().split(':').next().unwrap_or("/var/lib/pdctl"));
    let store = match store::Store::open(&state_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "pdctld: cannot use the state directory {}: {e}; check --state-dir (StateDirectory= in the unit) and its permissions",
                state_dir.display()
            );
            Exit::Unreachable.exit_process();
        }
    };
    // One pdctld per state directory: a second would unlink the first's socket and write the same
    // records and ledger.
    let lock = match lock_state_dir(&state_dir) {
        Ok(f) => f,
        Err(why) => {
            eprintln!("pdctld: {why}");
            Exit::Unreachable.exit_process();
        }
    };
    (state_dir, store, lock)
}

/// The control socket: locked, then bound afresh (0660, given to `--socket-group` when set); the
/// lock is held, its descriptor open, for the process's life.
fn bind_socket(args: &Args) -> (tokio::net::UnixListener, std::fs::File) {
    if let Some(dir) = args.socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let lock = match lock_socket(&args.socket) {
        Ok(f) => f,
        Err(why) => {
            eprintln!("pdctld: {why}");
            Exit::Unreachable.exit_process();
        }
    };
    let _ = std::fs::remove_file(&args.socket);
    let listener = match tokio::net::UnixListener::bind(&args.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pdctld: cannot listen on {}: {e}; is another pdctld running? (systemctl status pdctld)", args.socket.display());
            Exit::Unreachable.exit_process();
        }
    };
    let _ = std::fs::set_permissions(&args.socket, std::fs::Permissions::from_mode(0o660));
    if let Some(g) = &args.socket_group {
        if let Err(e) = chgrp(&args.socket, g) {
            tracing::warn!("cannot give the socket to group {g}: {e}");
        }
    }
    (listener, lock)
}

/// The metrics endpoint (`--metrics-listen`, unless `off`), served by its own accept loop.
async fn serve_metrics(args: &Args, d: &Arc<daemon::Daemon>) {
    if args.metrics_listen == "off" {
        return;
    }
    match tokio::net::TcpListener::bind(&args.metrics_listen).await {
        Ok(l) => serve_tcp(l, daemon::http::metrics_api(d.clone()), "the metrics endpoint"),
        Err(e) => tracing::warn!("metrics endpoint {} not available: {e}", args.metrics_listen),
    }
}

/// The FleetLock endpoint (`[maintenance] fleetlock_listen`, as the config says at pdctld's
/// start), served by its own accept loop.
async fn serve_fleetlock(d: &Arc<daemon::Daemon>) {
    let Some(addr) = daemon::config(d).ok().and_then(|s| s.maintenance).and_then(|m| m.fleetlock_listen) else { return };
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => {
            tracing::info!("FleetLock endpoint on http://{addr}");
            // Each caller known by its account (loopback only: the config refuses any other
            // address), read off the kernel's socket table while the connection is open.
            let l = Arc::new(l);
            let accept = move || {
                let l = l.clone();
                async move {
                    let (s, peer) = l.accept().await?;
                    let local = s.local_addr()?;
                    let uid = tokio::task::spawn_blocking(move || peer::loopback_peer_uid(peer, local)).await.ok().flatten();
                    Ok((s, uid, Caller::of(uid, Some(peer.ip()))))
                }
            };
            let app = daemon::maintenance::fleetlock_api(d.clone());
            let each = Some(serve::PER_CALLER);
            tokio::spawn(async move { serve(accept, app, METRICS_CONNECTIONS, each, "the FleetLock endpoint").await });
        }
        Err(e) => tracing::error!("the FleetLock endpoint cannot listen on {addr} ({e}): update agents asking it will not reboot this host"),
    }
}

/// Serve `app` on a TCP listener in a task of its own ([`serve`], at most
/// [`METRICS_CONNECTIONS`] at once — a scraper, a dashboard — and [`serve::PER_CALLER`] of one
/// caller: a local account as the kernel tells it, else an address).
fn serve_tcp(l: tokio::net::TcpListener, app: axum::Router, what: &'static str) {
    let l = Arc::new(l);
    let accept = move || {
        let l = l.clone();
        async move {
            let (s, peer) = l.accept().await?;
            let local = s.local_addr()?;
            let uid = tokio::task::spawn_blocking(move || peer::loopback_peer_uid(peer, local)).await.ok().flatten();
            // The uid is the cap's key only: the metrics API asks nobody's.
            Ok((s, None, Caller::of(uid, Some(peer.ip()))))
        }
    };
    tokio::spawn(async move { serve(accept, app, METRICS_CONNECTIONS, Some(serve::PER_CALLER), what).await });
}

/// pdctld's tasks beside the API: the watchdog, the retry of unsaved records, the reconcile of
/// what a previous process left (before any rollout starts: the API answers meanwhile, status
/// says "reconciling", a new rollout is refused with exit 4), the fleet's parts, the storm watch.
fn spawn_background(d: &Arc<daemon::Daemon>, args: &Args) {
    if let Some(every) = sd_notify::watchdog_enabled() {
        tokio::spawn(watchdog(d.clone(), args.socket.clone(), every / 2));
    }
    // Records whose write failed are retried until they are on disk.
    let retry = d.clone();
    tokio::spawn(async move {
        let mut t = tokio::time::interval(Duration::from_secs(5));
        loop {
            t.tick().await;
            retry.retry_unsaved();
        }
    });
    tokio::spawn(d.clone().reconcile_at_start());
    tokio::spawn(d.clone().reconcile_idle());
    tokio::spawn(d.clone().fleet_liveness());
    tokio::spawn(d.clone().fleet_rollouts());
    tokio::spawn(d.clone().fleet_retention());
    tokio::spawn(d.clone().storm_watch());
    tokio::spawn(d.clone().balance_roles());
}

/// Feed systemd's watchdog only while the control socket accepts and answers (`GET /v1/ping`
/// through the socket itself, as a client would: a pdctld that cannot accept — its descriptors
/// exhausted — or whose handlers are stuck is not alive) and a running rollout's engine makes
/// progress within its current step's limit. Otherwise systemd restarts pdctld, whose start then
/// undoes any drain it left.
async fn watchdog(d: Arc<daemon::Daemon>, socket: PathBuf, every: Duration) {
    let mut t = tokio::time::interval(every);
    loop {
        t.tick().await;
        let answers = matches!(tokio::time::timeout(Duration::from_secs(5), ping(&socket)).await, Ok(Ok(true)));
        match (answers, d.engine_stuck()) {
            (true, None) => {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            }
            (false, _) => tracing::error!("the control socket did not answer /v1/ping within 5s; not feeding the watchdog"),
            (true, Some(why)) => tracing::error!("{why}; the engine looks hung: not feeding the watchdog"),
        }
    }
}

/// One `GET /v1/ping` through the control socket: whether it answered 200.
async fn ping(socket: &std::path::Path) -> std::io::Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(socket).await?;
    s.write_all(b"GET /v1/ping HTTP/1.1\r\nhost: pdctld\r\nconnection: close\r\n\r\n").await?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await?;
    Ok(head.starts_with(b"HTTP/1.1 200"))
}
