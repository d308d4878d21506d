//! In-memory fakes of systemd, the journal and the probes for the engine's tests, and the
//! settings they run with. Shared by several test files, each of which uses only some of it.
#![allow(dead_code)]
// What the tests need comes with `use fakes::*`.

mod probes;
pub use probes::FakeProbes;

pub use std::collections::{BTreeMap, HashMap};
pub use std::path::PathBuf;
pub use std::sync::{Arc, Mutex};
pub use std::time::{Duration, SystemTime};

pub use pdctl_core::config::{load_texts, Settings};
pub use pdctl_core::engine::Engine;
pub use pdctl_core::events::{Event, Outcome, Status, Step};
pub use pdctl_core::plan::Plan;
pub use pdctl_core::ports::{
    Follow, Health, HttpFailure, JobOutcome, KvReport, LogEntry, LogError, Logs, MetricsError, PairTarget, Probes, RouterWorker, UnitConfig, UnitState, Units,
    UnitsError, Watch,
};
pub use pdctl_core::sglang::pairing::{Half, PairProbe, PdQueues};
pub use pdctl_parse::quantile::Histogram;
pub use pdctl_parse::service::ServiceScrape;

#[derive(Default)]
pub struct World {
    pub states: HashMap<String, UnitState>,
    pub restarted: Vec<String>,
    /// Units stopped (host maintenance), in order.
    pub stopped: Vec<String>,
    /// Units started, in order.
    pub started: Vec<String>,
    pub unhealthy: Vec<String>,
    pub env: HashMap<String, Vec<String>>,
    pub next_pid: u32,
    /// Decodes keep a prefill's bootstrap info across its restarts (SGLang before PR 36029).
    pub stale_cache: bool,
    /// Pair probes sent: (prefill URL, decode URL).
    pub pairs: Vec<(String, String)>,
    /// Units whose unit file changed on disk (NeedDaemonReload until a reload).
    pub need_reload: Vec<String>,
    /// Reloads asked of the manager.
    pub reloads: u32,
    /// A gateway in front of the workers (`None`: no router).
    pub router: Option<FakeRouter>,
    /// Requests each worker runs (by URL) until an `/abort_request` ends them.
    pub in_flight: HashMap<String, u64>,
    /// Workers whose requests were aborted, in order.
    pub aborted: Vec<String>,
    /// What each read of a prefill's PD queues answers, in order (then nothing held).
    pub held: Vec<PdQueues>,
    /// What each read of a worker's service figures answers, in order (the last one repeats;
    /// none: `/metrics` unreadable).
    pub served: HashMap<String, Vec<ServiceScrape>>,
    /// Each worker's weights (URL → model path, weight version; absent: `m`, `default`).
    pub weights: HashMap<String, (String, String)>,
    /// Workers whose weight load fails.
    pub weights_fail: Vec<String>,
    /// Weight calls, in order: `pause URL`, `load URL PATH`, `continue URL`.
    pub weight_log: Vec<String>,
    /// Workers serve `/ready` (SGLang 0.5.23; by default they do not, as before 0.5.23).
    pub ready_served: bool,
    /// `/health` calls, by URL, in order.
    pub health_asked: Vec<String>,
    /// Units' `TimeoutStopSec=` (absent: infinity).
    pub timeout_stop: HashMap<String, Duration>,
    /// A restart job takes this long, its old process gone at once (`None`: it ends at once).
    pub restart_takes: Option<Duration>,
    /// With `restart_takes`: the old process keeps running through the job (a long stop)
    /// instead of being gone at once.
    pub old_process_stays: bool,
    /// Requests each worker (by URL) runs from the moment a restart job begins (its stop's
    /// drain, while the gateway still sends it work).
    pub in_flight_in_stop: HashMap<String, u64>,
    /// A unit's old process logs SGLang's first drain check this long after its journal is
    /// first followed (its restart's) and counts this many requests.
    pub drain_check: HashMap<String, (Duration, u64)>,
    /// Workers started with an API key pdctl was not given (a call without it: 401).
    pub keyed: Vec<String>,
    /// The role each worker runs (by URL; absent: not reported).
    pub roles: HashMap<String, pdctl_core::config::Role>,
    /// `/pd_role_switch` calls, in order: `switch URL ROLE` (`prepare URL ROLE` with
    /// `prepare_only`).
    pub switch_log: Vec<String>,
    /// What the next `/pd_role_switch` calls answer, in order (then: success, the role flipped).
    pub switch_answers: Vec<pdctl_core::sglang::role_switch::Answer>,
}

/// A fleet store with nothing in it (no other host has written its liveness or workers).
pub struct EmptyStore;

impl pdctl_core::ports::Coordinator for EmptyStore {
    fn get<'a>(&'a self, _key: &'a str) -> pdctl_core::ports::BoxFut<'a, Result<Option<pdctl_core::ports::KvEntry>, pdctl_core::ports::FleetFailure>> {
        Box::pin(async { Ok(None) })
    }
    fn get_prefix<'a>(&'a self, _prefix: &'a str) -> pdctl_core::ports::BoxFut<'a, Result<Vec<pdctl_core::ports::KvEntry>, pdctl_core::ports::FleetFailure>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn cas(&self, _changes: Vec<pdctl_core::ports::CasChange>) -> pdctl_core::ports::BoxFut<'_, Result<bool, pdctl_core::ports::FleetFailure>> {
        Box::pin(async { Ok(true) })
    }
}

/// A gateway as smg 1.x lists workers: each registration takes the next status of `statuses`
/// (then `ready`); removal is immediate.
#[derive(Default)]
pub struct FakeRouter {
    pub workers: Vec<RouterWorker>,
    pub statuses: Vec<String>,
    pub next_id: u32,
    /// `register URL` / `deregister ID`, in order.
    pub log: Vec<String>,
    pub smoke_fails: bool,
    /// `(url, unit)`: registering `url` makes `unit` fail (its server died after its gates).
    pub crash_on_register: Option<(String, String)>,
}

impl FakeRouter {
    pub fn add(&mut self, url: &str, worker_type: &str) -> String {
        self.next_id += 1;
        let status = if self.statuses.is_empty() { "ready".to_string() } else { self.statuses.remove(0) };
        let id = format!("w{}", self.next_id);
        self.workers.push(RouterWorker {
            id: id.clone(),
            url: url.into(),
            worker_type: worker_type.into(),
            is_healthy: status == "ready",
            load: 0,
            status: Some(status),
            bootstrap_port: None,
        });
        id
    }
}

pub type W = Arc<Mutex<World>>;

pub fn state(inv: &str, pid: u32) -> UnitState {
    UnitState {
        load_state: "loaded".into(),
        active_state: "active".into(),
        sub_state: "running".into(),
        invocation_id: inv.into(),
        main_pid: pid,
        exec_main_pid: pid,
        n_restarts: 0,
        result: "success".into(),
        exec_main_code: 0,
        exec_main_status: 0,
        active_enter_us: 1,
        // Later starts have larger pids here.
        exec_main_start_us: u64::from(pid),
        active_exit_us: 0,
        inactive_enter_us: 0,
    }
}

pub struct FakeUnits(pub W);
pub struct NoWatch;
impl Watch for NoWatch {
    async fn changed(&mut self) -> Option<()> {
        std::future::pending().await
    }
}

impl Units for FakeUnits {
    type W = NoWatch;
    async fn state(&self, unit: &str) -> Result<UnitState, UnitsError> {
        self.0.lock().unwrap().states.get(unit).cloned().ok_or(UnitsError::NoSuchUnit(format!("unit {unit} does not exist")))
    }
    async fn config(&self, unit: &str) -> Result<UnitConfig, UnitsError> {
        let w = self.0.lock().unwrap();
        let environment = w.env.get(unit).cloned().unwrap_or_default();
        let need_daemon_reload = w.need_reload.iter().any(|u| u == unit);
        let timeout_stop = w.timeout_stop.get(unit).copied();
        Ok(UnitConfig {
            exec_start: vec![vec!["sglang".into(), "--enable-metrics".into()]],
            environment,
            need_daemon_reload,
            timeout_stop,
            ..Default::default()
        })
    }
    async fn reload(&self) -> Result<(), UnitsError> {
        let mut w = self.0.lock().unwrap();
        w.reloads += 1;
        w.need_reload.clear();
        Ok(())
    }
    async fn reset_failed(&self, _unit: &str) -> Result<(), UnitsError> {
        Ok(())
    }
    async fn watch(&self, _unit: &str) -> Result<NoWatch, UnitsError> {
        Ok(NoWatch)
    }
    async fn restart(&self, unit: &str, _t: Duration) -> Result<JobOutcome, UnitsError> {
        let (takes, stays) = {
            let mut w = self.0.lock().unwrap();
            let in_stop = std::mem::take(&mut w.in_flight_in_stop);
            w.in_flight.extend(in_stop);
            (w.restart_takes, w.old_process_stays)
        };
        if let Some(t) = takes {
            if let Some(st) = self.0.lock().unwrap().states.get_mut(unit).filter(|_| !stays) {
                (st.main_pid, st.active_state, st.sub_state) = (0, "activating".into(), "start-pre".into());
            }
            tokio::time::sleep(t).await;
        }
        let mut w = self.0.lock().unwrap();
        w.next_pid += 1;
        let st = state(&format!("inv{}", w.next_pid), w.next_pid);
        w.states.insert(unit.into(), st.clone());
        w.restarted.push(unit.into());
        Ok(JobOutcome { job_result: "done".into(), job_time: Duration::from_millis(1), state: st })
    }
    async fn stop(&self, unit: &str, _t: Duration) -> Result<JobOutcome, UnitsError> {
        let mut w = self.0.lock().unwrap();
        let st = w.states.get_mut(unit).ok_or(UnitsError::NoSuchUnit(format!("unit {unit} does not exist")))?;
        (st.main_pid, st.active_state, st.sub_state) = (0, "inactive".into(), "dead".into());
        let st = st.clone();
        w.stopped.push(unit.into());
        Ok(JobOutcome { job_result: "done".into(), job_time: Duration::from_millis(1), state: st })
    }
    async fn start(&self, unit: &str, _t: Duration) -> Result<JobOutcome, UnitsError> {
        let mut w = self.0.lock().unwrap();
        w.next_pid += 1;
        let st = state(&format!("inv{}", w.next_pid), w.next_pid);
        w.states.insert(unit.into(), st.clone());
        w.started.push(unit.into());
        Ok(JobOutcome { job_result: "done".into(), job_time: Duration::from_millis(1), state: st })
    }
}

pub fn entry(msg: &str, pid: u32) -> LogEntry {
    let fields: BTreeMap<String, String> = [("MESSAGE".to_string(), msg.to_string()), ("_PID".to_string(), pid.to_string())].into();
    LogEntry { realtime_us: 0, read_at: SystemTime::now(), fields }
}

pub struct FakeFollow(Vec<LogEntry>, Option<(tokio::time::Instant, LogEntry)>);
impl Follow for FakeFollow {
    async fn next(&mut self) -> Option<Result<LogEntry, LogError>> {
        if let Some((at, e)) = self.1.take() {
            tokio::time::sleep_until(at).await;
            return Some(Ok(e));
        }
        if self.0.is_empty() {
            std::future::pending::<()>().await;
        }
        Some(Ok(self.0.remove(0)))
    }
}

pub struct FakeLogs(pub W);
impl Logs for FakeLogs {
    type F = FakeFollow;
    async fn tail_cursor(&self) -> Result<Option<String>, LogError> {
        Ok(Some("c".into()))
    }
    async fn boot_head_cursor(&self, boot_id: &str) -> Result<Option<String>, LogError> {
        Ok(Some(format!("head of boot {boot_id}")))
    }
    fn follow(&self, _cursor: Option<String>, unit: &str) -> FakeFollow {
        let mut w = self.0.lock().unwrap();
        let pid = w.states.get(unit).map(|s| s.main_pid).unwrap_or(0);
        let check = w.drain_check.remove(unit).map(|(after, n)| {
            let line = format!("Gracefully exiting... Remaining number of requests {n}. Remaining requests remaining_rids=[].");
            (tokio::time::Instant::now() + after, entry(&line, pid))
        });
        // The old process flushes its ready line first; then the new run's.
        FakeFollow(vec![entry("The server is fired up and ready to roll!", 1), entry("[t] The server is fired up and ready to roll!", pid)], check)
    }
    async fn last_lines(&self, _unit: &str, _n: usize) -> Result<Vec<String>, LogError> {
        Ok(vec!["last line".into()])
    }
}

pub fn settings() -> Settings {
    let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n";
    load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap()
}

/// A rollout of `plan` for `Engine::execute` (id `r1`), without revisions or a drain ledger.
pub fn rollout_of<'a>(plan: &'a Plan, abort: &'a std::sync::atomic::AtomicBool, allow_outage: bool, load_changes: bool) -> pdctl_core::engine::RolloutRun<'a> {
    pdctl_core::engine::RolloutRun {
        plan,
        work: pdctl_core::engine::Work::Restart { resume: 0, role: false },
        abort,
        revisions: None,
        ledger: None,
        id: "r1",
        allow_outage,
        load_changes,
        fleet_rollout: None,
    }
}

pub fn world() -> W {
    let w = World { next_pid: 100, ..Default::default() };
    let w = Arc::new(Mutex::new(w));
    for (u, pid, gpus) in [("p.service", 10, "0,1,2,3"), ("d.service", 20, "4,5,6,7")] {
        w.lock().unwrap().states.insert(u.into(), state("old", pid));
        w.lock().unwrap().env.insert(u.into(), vec![format!("CUDA_VISIBLE_DEVICES={gpus}")]);
    }
    w
}

pub async fn run(w: &W, s: Settings) -> (pdctl_core::events::Summary, Vec<Event>) {
    run_only(w, s, &[]).await
}

pub async fn run_only(w: &W, s: Settings, only: &[String]) -> (pdctl_core::events::Summary, Vec<Event>) {
    let plan = Plan::new(&s, only).unwrap();
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let summary = engine.rolling_restart(&plan, &tx).await;
    drop(tx);
    (summary, events_of(rx).await)
}

/// `pdctl check` of every worker over the fakes: its summary and events.
pub async fn check(w: &W, s: Settings) -> (pdctl_core::events::Summary, Vec<Event>) {
    let plan = Plan::new(&s, &[]).unwrap();
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let summary = engine.check(&plan, &tx).await;
    drop(tx);
    (summary, events_of(rx).await)
}

/// Every event a run sent, once it dropped its sender.
async fn events_of(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Vec<Event> {
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    events
}

pub fn with(extra: &str) -> Settings {
    let text = format!(
        "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n{extra}"
    );
    load_texts(&[(PathBuf::from("t.toml"), text)]).unwrap()
}

/// [`settings`] with a gateway, the smoke request on, and both workers admitted by it.
pub fn with_router(w: &W, decode_listed: bool) -> Settings {
    let mut r = FakeRouter::default();
    r.add("http://p", "prefill");
    if decode_listed {
        r.add("http://d", "decode");
    }
    w.lock().unwrap().router = Some(r);
    let text = "[router]\nurl = \"http://r:1\"\n\
         [[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\nrouter_timeout = \"60s\"\nallow_outage = true\n\
         [verify]\nmetrics = \"off\"\navailability_probe = \"off\"\n";
    load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap()
}

/// Service figures of `n` finished requests whose end-to-end latencies all lie in (lo, hi].
pub fn served(n: f64, lo: f64, hi: f64) -> ServiceScrape {
    let e2e = Histogram { buckets: vec![(lo, 0.0), (hi, n), (f64::INFINITY, n)], count: n, sum: 0.0 };
    ServiceScrape { e2e: Some(e2e), requests: n, ..ServiceScrape::default() }
}

pub fn with_slo(extra: &str) -> Settings {
    let text = format!(
        "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n[verify]\nmetrics = \"off\"\n[verify.slo]\n{extra}"
    );
    load_texts(&[(PathBuf::from("t.toml"), text)]).unwrap()
}

/// `unit`'s first `step` event with `status` in `events`; a missing one fails the test naming
/// every event there was, so that the failure says what the rollout did instead.
pub fn event<'a>(events: &'a [Event], unit: &str, step: Step, status: Status) -> &'a Event {
    match events.iter().find(|e| e.unit == unit && e.step == step && e.status == status) {
        Some(e) => e,
        None => {
            let seen: Vec<String> = events.iter().map(|e| format!("{} {:?} {:?}", e.unit, e.step, e.status)).collect();
            panic!("no {unit} {step:?} {status:?} event; the events were: {seen:#?}")
        }
    }
}
