//! What every part of the daemon shares: the records, the one running slot, the config it runs
//! with, and the helpers each handler uses.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pdctl_contract::api::{ApiError, Interruption, Record, StreamLine, UnitSnapshot};
use pdctl_contract::cause::Cause;
use pdctl_contract::events::Step;
use pdctl_contract::lifecycle::{now, RolloutState};
use pdctl_core::ports::Units as _;
use pdctl_real::{RealEngine, SystemdUnits};
use tokio::sync::broadcast;

use crate::metrics::{Metrics, ResultLabel};
use crate::store::Store;

use super::storm;

pub(crate) struct Running {
    pub(crate) id: String,
    pub(crate) abort: Arc<AtomicBool>,
    pub(crate) tx: broadcast::Sender<StreamLine>,
    pub(crate) record: Arc<Mutex<Record>>,
    pub(crate) task: Mutex<Option<tokio::task::AbortHandle>>,
    /// When the engine last emitted an event, and the step it is in.
    pub(crate) progress: Mutex<(std::time::Instant, Step)>,
    /// Its settings' deadlines (for the watchdog's progress check).
    pub(crate) limits: Option<(pdctl_core::config::Rollout, pdctl_core::config::Verify)>,
}

/// Shared daemon state.
pub struct Daemon {
    /// Main config file.
    pub config: PathBuf,
    /// The state directory.
    pub store: Store,
    /// Own metrics.
    pub metrics: Metrics,
    pub(crate) running: Mutex<Option<Running>>,
    /// Drains (or pauses) from before this process are being undone: no rollout starts meanwhile.
    pub(crate) reconciling: AtomicBool,
    /// The workers a weights rollout of a previous process left paused (`paused.json` as this
    /// process found it before serving): continued by [`Daemon::reconcile_at_start`]. Read here,
    /// not later, so that the file a rollout of this process writes is never taken for one.
    pub(super) paused_at_start: Mutex<Vec<pdctl_core::engine::PausedWorker>>,
    /// Who may act (`--operate-group`: its name and gid): root and its members start, resume,
    /// revert and abort rollouts; anyone else who reaches the socket may only read. `None`: every
    /// client that reaches the socket may act.
    pub operate: Option<(String, u32)>,
    /// Retention: finished records kept (`--keep-records`); older ones are deleted with the
    /// revisions kept for their revert, at start and after each rollout.
    pub keep_records: usize,
    /// What this pdctld has to undo and could not yet (see `DaemonStatus::unresolved`), by what
    /// it is about (`paused`, `drains`): kept while pdctld retries, shown in `status`, counted in
    /// `pdctl_unresolved`.
    pub(super) unresolved: Mutex<BTreeMap<&'static str, String>>,
    /// Why the last record write failed, while some record is unsaved.
    pub(crate) record_error: Mutex<Option<String>>,
    /// Records whose latest state could not be written yet (retried; served from here).
    pub(crate) unsaved: Mutex<BTreeMap<String, Record>>,
    /// Restarts pdctl did not make ([`storm`]).
    pub(crate) storm: Mutex<storm::StormWatch>,
    /// What the role balance's last look saw ([`super::role_balance`]; `None`: off).
    pub(crate) role_balance: Mutex<Option<String>>,
    /// Rollouts begun by this process (the storm watch's "was it us?").
    pub(crate) rollouts_begun: std::sync::atomic::AtomicU64,
    /// Rollout id → its restarted workers' service figures from before their drains: the fleet
    /// bake's baseline ([`bake`]). In memory only: a pdctld that restarts cannot judge a bake.
    pub(crate) baselines: Mutex<BTreeMap<String, BTreeMap<String, pdctl_core::service::slo::ServiceScrape>>>,
    /// The fleet's etcd, one connection for the idle loops (by endpoints, user and TLS: a new
    /// one when the config changes them).
    pub(crate) etcd: Mutex<Option<(String, Arc<pdctl_real::EtcdCoordinator>)>>,
    /// Event streams open per account (its uid; `None`: one the socket could not tell): at most
    /// [`STREAMS_PER_ACCOUNT`] each, so no reader holds every connection of the control socket.
    pub(crate) streams: Mutex<BTreeMap<Option<u32>, usize>>,
}

/// Event streams one account may hold open at once.
pub const STREAMS_PER_ACCOUNT: usize = 16;

/// One open event stream of an account, given back when the stream ends (dropped with it).
pub(crate) struct StreamSlot {
    d: Arc<Daemon>,
    uid: Option<u32>,
}

impl StreamSlot {
    /// A slot for `uid`'s stream, or the refusal when it holds [`STREAMS_PER_ACCOUNT`] already.
    pub(crate) fn take(d: &Arc<Daemon>, uid: Option<u32>) -> Result<StreamSlot, Cause> {
        let mut open = lock(&d.streams);
        let n = open.entry(uid).or_insert(0);
        if *n >= STREAMS_PER_ACCOUNT {
            let who = uid.map(|u| format!("uid {u}")).unwrap_or_else(|| "an account the socket could not tell".into());
            return Err(Cause::TooManyStreams { who, limit: STREAMS_PER_ACCOUNT });
        }
        *n += 1;
        Ok(StreamSlot { d: d.clone(), uid })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = lock(&self.d.streams);
        if let Some(n) = open.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

/// The error response of `cause`: its HTTP status and the documented JSON body.
pub fn api_err(cause: &Cause) -> Response {
    let status = StatusCode::from_u16(cause.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(ApiError::of(cause))).into_response()
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn notify_status(s: &str) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(s)]);
}

pub(crate) fn config(daemon: &Daemon) -> Result<pdctl_core::config::Settings, Cause> {
    pdctl_core::config::load(&daemon.config).map_err(|e| Cause::ConfigInvalid { message: e.to_string() })
}

pub(crate) async fn engine(daemon: &Daemon) -> Result<RealEngine, Cause> {
    pdctl_real::connect(config(daemon)?).await.map_err(|e| e.cause())
}

/// Each unit's systemd state now (for an interruption).
pub(crate) async fn snapshot(sd: Option<&SystemdUnits>, units: &[String]) -> Vec<UnitSnapshot> {
    let mut out = Vec::new();
    for u in units {
        let none =
            |error: String| UnitSnapshot { unit: u.clone(), active_state: None, sub_state: None, invocation_id: None, n_restarts: None, error: Some(error) };
        out.push(match sd {
            Some(sd) => match sd.state(u).await {
                Ok(s) => UnitSnapshot {
                    unit: u.clone(),
                    active_state: Some(s.active_state.to_string()),
                    sub_state: Some(s.sub_state.to_string()),
                    invocation_id: Some(s.invocation_id),
                    n_restarts: Some(s.n_restarts),
                    error: None,
                },
                Err(e) => none(e.to_string()),
            },
            None => none("systemd not reachable".into()),
        });
    }
    out
}

/// Finished rollout records kept by default (each a few hundred kB at most).
pub const DEFAULT_KEEP_RECORDS: usize = 1000;

impl Daemon {
    /// A daemon over `store`; rollouts left running by a previous process are marked interrupted
    /// (with each unit's state now), and nothing resumes by itself. Drains left in the ledger are
    /// undone by [`Daemon::reconcile_at_start`]; until then no rollout starts.
    pub async fn new(config: PathBuf, store: Store) -> Daemon {
        let d = Daemon {
            config,
            store,
            metrics: Metrics::default(),
            running: Mutex::new(None),
            reconciling: AtomicBool::new(false),
            paused_at_start: Mutex::new(Vec::new()),
            operate: None,
            keep_records: DEFAULT_KEEP_RECORDS,
            unresolved: Mutex::new(BTreeMap::new()),
            record_error: Mutex::new(None),
            unsaved: Mutex::new(BTreeMap::new()),
            storm: Mutex::new(storm::StormWatch::default()),
            role_balance: Mutex::new(None),
            rollouts_begun: std::sync::atomic::AtomicU64::new(0),
            baselines: Mutex::new(BTreeMap::new()),
            etcd: Mutex::new(None),
            streams: Mutex::new(BTreeMap::new()),
        };
        let (records, corrupt) = d.store.all();
        for c in &corrupt {
            tracing::error!("rollout record {} does not read ({}); it is listed as corrupt in pdctl rollout history", c.file, c.error);
        }
        d.metrics.corrupt_records.set(corrupt.len() as i64);
        let stuck: Vec<Record> = records.iter().filter(|r| r.lifecycle.state() == RolloutState::Running).map(|r| Record::clone(r)).collect();
        if !stuck.is_empty() {
            let sd = match pdctl_core::config::load(&d.config) {
                Ok(s) => SystemdUnits::connect(&s).await.ok(),
                Err(_) => None,
            };
            for mut r in stuck {
                let units = snapshot(sd.as_ref(), &r.plan).await;
                d.interrupt(&mut r, units);
            }
        }
        let (drains, bad) = d.store.ledger().all();
        for b in &bad {
            tracing::error!("drain ledger file {} does not read ({}); check the router by hand", b.path.display(), b.error);
        }
        d.metrics.drained.set(drains.len() as i64);
        let paused = d.paused_on_record();
        d.reconciling.store(!drains.is_empty() || !paused.is_empty() || !lock(&d.unresolved).is_empty(), Ordering::SeqCst);
        notify_status(match (drains.is_empty(), paused.is_empty()) {
            (true, true) => "idle",
            (false, _) => "re-admitting drained workers",
            (true, false) => "continuing workers a weights rollout left paused",
        });
        *lock(&d.paused_at_start) = paused;
        d
    }

    /// Delete the records beyond retention (see [`Daemon::keep_records`]), saying so in the log.
    pub fn prune_records(&self) {
        let gone = self.store.prune(self.keep_records);
        if !gone.is_empty() {
            tracing::info!(
                "retention: deleted {} finished rollout record(s) beyond the newest {} ({} … {})",
                gone.len(),
                self.keep_records,
                gone[0],
                gone[gone.len() - 1]
            );
        }
    }

    /// Whether the client `uid` (the kernel's word) may act: with an operate group, root or a
    /// member of it (primary or supplementary group); `Err`: the refusal.
    pub(super) fn may_act(&self, uid: Option<u32>) -> Result<(), Cause> {
        let Some((group, gid)) = &self.operate else { return Ok(()) };
        match uid {
            Some(0) => Ok(()),
            Some(u) if in_group(u, *gid) => Ok(()),
            // A client whose uid the kernel did not give (not a UNIX socket) is not trusted.
            u => Err(Cause::NotAllowed { uid: u.unwrap_or(u32::MAX), group: group.clone() }),
        }
    }

    /// The workers a weights rollout recorded as paused (`paused.json`). A file that is there but
    /// does not read cannot say which: then every configured worker is taken as paused (a
    /// continue of a worker that is not paused changes nothing), and if the config cannot be
    /// read either, that is unresolved until it can.
    pub(super) fn paused_on_record(&self) -> Vec<pdctl_core::engine::PausedWorker> {
        let path = pdctl_core::engine::paused_path(&self.store.revisions_dir());
        let Ok(bytes) = std::fs::read(&path) else { return Vec::new() };
        match serde_json::from_slice::<Vec<pdctl_core::engine::PausedWorker>>(&bytes) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!("{} does not read ({e}): every configured worker is continued, as any may be paused", path.display());
                match pdctl_core::config::load(&self.config) {
                    Ok(s) => s.workers.iter().map(|w| pdctl_core::engine::PausedWorker { unit: w.unit.clone(), url: w.url.clone() }).collect(),
                    Err(c) => {
                        self.set_unresolved(
                            "paused",
                            Some(format!("{} does not read ({e}) and the config does not load ({c}): any worker may be paused; fix the config (pdctld continues them all then)", path.display())),
                        );
                        Vec::new()
                    }
                }
            }
        }
    }

    /// Record (or, with `None`, clear) what pdctld could not undo yet about `what`; the metric
    /// follows.
    pub(super) fn set_unresolved(&self, what: &'static str, why: Option<String>) {
        let mut u = lock(&self.unresolved);
        match why {
            Some(w) => {
                u.insert(what, w);
            }
            None => {
                u.remove(what);
            }
        }
        self.metrics.unresolved.set(u.len() as i64);
    }

    /// Mark a record interrupted where it stopped, with the units' state.
    pub(crate) fn interrupt(&self, r: &mut Record, units: Vec<UnitSnapshot>) {
        let pos = r.lifecycle.position().cloned();
        let (unit, step) = (pos.as_ref().map(|p| p.unit.clone()), pos.as_ref().map(|p| p.step));
        if r.lifecycle.interrupt().is_err() {
            return;
        }
        tracing::warn!(pdctl_rollout_id = %r.id, "rollout {} was interrupted at {} ({}): pdctld stopped while it ran; resume it with pdctl rollout resume {}", r.id, unit.as_deref().unwrap_or("its start"), step.map(|s| s.as_str()).unwrap_or("-"), r.id);
        r.interrupted = Some(Interruption { unit, step, detected_at: now(), units });
        r.finished_at = Some(now());
        self.metrics.rollouts.get_or_create(&ResultLabel { result: RolloutState::Interrupted.as_str().into() }).inc();
        self.save(r);
    }

    /// Why the running rollout's engine looks hung (it has sat in one step past that step's
    /// limit), if it does.
    pub fn engine_stuck(&self) -> Option<String> {
        let running = lock(&self.running);
        let r = running.as_ref()?;
        let limits = r.limits.as_ref()?;
        let (since, step) = *lock(&r.progress);
        let limit = pdctl_core::engine::steps::deadline(step, &limits.0, &limits.1);
        (since.elapsed() > limit).then(|| format!("rollout {} has been in step {} for {:?}, past its limit {limit:?}", r.id, step.as_str(), since.elapsed()))
    }

    /// The running rollout's id.
    pub fn running_id(&self) -> Option<String> {
        lock(&self.running).as_ref().map(|r| r.id.clone())
    }

    /// Persist `r` (retried by the store); on failure keep it in memory, report it (status,
    /// metrics, journal) and retry later ([`Daemon::retry_unsaved`]). Returns whether it is on disk.
    pub fn save(&self, r: &Record) -> bool {
        match self.store.save(r) {
            Ok(()) => {
                let mut unsaved = lock(&self.unsaved);
                unsaved.remove(&r.id);
                if unsaved.is_empty() && lock(&self.record_error).take().is_some() {
                    self.metrics.records_failing.set(0);
                    tracing::info!("rollout records are being saved again");
                }
                true
            }
            Err(e) => {
                lock(&self.unsaved).insert(r.id.clone(), r.clone());
                let msg = format!("cannot write {}: {e}", self.store.dir().join("rollouts").display());
                if lock(&self.record_error).replace(msg.clone()).is_none() {
                    tracing::error!(pdctl_rollout_id = %r.id, "{msg}; pdctld keeps the record in memory, retries, and starts no rollout until it is saved");
                }
                self.metrics.record_write_failures.inc();
                self.metrics.records_failing.set(1);
                false
            }
        }
    }

    /// Try again to write the records whose last write failed (called periodically).
    pub fn retry_unsaved(&self) {
        let pending: Vec<Record> = lock(&self.unsaved).values().cloned().collect();
        for r in pending {
            // The running rollout's newer state is saved by its own events.
            if self.running_id().as_deref() == Some(r.id.as_str()) {
                continue;
            }
            self.save(&r);
        }
    }

    /// A record by id: unsaved (newest) first, then the store.
    pub(crate) fn load(&self, id: &str) -> Option<Record> {
        lock(&self.unsaved).get(id).cloned().or_else(|| self.store.load(id))
    }
}

/// Whether user `uid` is in group `gid` (its primary group, or a supplementary one in the group
/// database).
pub(crate) fn in_group(uid: u32, gid: u32) -> bool {
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: the buffers and their lengths are valid for the call; `found` points into them.
    let r = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if r != 0 || found.is_null() {
        return false;
    }
    if pw.pw_gid == gid {
        return true;
    }
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: pw_name is the NUL-terminated name getpwuid_r filled; `groups` holds `n` entries.
    let r = unsafe { libc::getgrouplist(pw.pw_name, pw.pw_gid, groups.as_mut_ptr(), &mut n) };
    if r < 0 {
        return false;
    }
    groups.iter().take(n.max(0) as usize).any(|g| *g == gid)
}
