//! The rollout state machine against in-memory fakes of systemd, the journal and the probes:
//! ordering, halting, and what is never touched. (The same gates are proven against the real
//! parts in tests/rollout.rs.)

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use pdctl_core::config::{load_texts, Settings};
use pdctl_core::engine::Engine;
use pdctl_core::events::{Event, Outcome, Status, Step};
use pdctl_core::pairing::{Half, PairProbe, PdQueues};
use pdctl_core::plan::Plan;
use pdctl_core::ports::{
    Follow, Health, HttpFailure, JobOutcome, KvReport, LogEntry, LogError, Logs, MetricsError, PairTarget, Probes, RouterWorker, UnitConfig, UnitState, Units,
    UnitsError, Watch,
};
use pdctl_probe::quantile::Histogram;
use pdctl_probe::service::ServiceScrape;

#[derive(Default)]
struct World {
    states: HashMap<String, UnitState>,
    restarted: Vec<String>,
    unhealthy: Vec<String>,
    env: HashMap<String, Vec<String>>,
    next_pid: u32,
    /// Decodes keep a prefill's bootstrap info across its restarts (SGLang before PR 36029).
    stale_cache: bool,
    /// Pair probes sent: (prefill URL, decode URL).
    pairs: Vec<(String, String)>,
    /// Units whose unit file changed on disk (NeedDaemonReload until a reload).
    need_reload: Vec<String>,
    /// Reloads asked of the manager.
    reloads: u32,
    /// A gateway in front of the workers (`None`: no router).
    router: Option<FakeRouter>,
    /// Requests each worker runs (by URL) until an `/abort_request` ends them.
    in_flight: HashMap<String, u64>,
    /// Workers whose requests were aborted, in order.
    aborted: Vec<String>,
    /// What each read of a prefill's PD queues answers, in order (then nothing held).
    held: Vec<PdQueues>,
    /// What each read of a worker's service figures answers, in order (the last one repeats;
    /// none: `/metrics` unreadable).
    served: HashMap<String, Vec<ServiceScrape>>,
    /// Each worker's weights (URL → model path, weight version; absent: `m`, `default`).
    weights: HashMap<String, (String, String)>,
    /// Workers whose weight load fails.
    weights_fail: Vec<String>,
    /// Weight calls, in order: `pause URL`, `load URL PATH`, `continue URL`.
    weight_log: Vec<String>,
    /// Workers serve `/ready` (SGLang 0.5.23; by default they do not, as before 0.5.23).
    ready_served: bool,
    /// `/health` calls, by URL, in order.
    health_asked: Vec<String>,
    /// Units' `TimeoutStopSec=` (absent: infinity).
    timeout_stop: HashMap<String, Duration>,
    /// A restart job takes this long, its old process gone at once (`None`: it ends at once).
    restart_takes: Option<Duration>,
    /// With `restart_takes`: the old process keeps running through the job (a long stop)
    /// instead of being gone at once.
    old_process_stays: bool,
}

/// A gateway as smg 1.x lists workers: each registration takes the next status of `statuses`
/// (then `ready`); removal is immediate.
#[derive(Default)]
struct FakeRouter {
    workers: Vec<RouterWorker>,
    statuses: Vec<String>,
    next_id: u32,
    /// `register URL` / `deregister ID`, in order.
    log: Vec<String>,
    smoke_fails: bool,
}

impl FakeRouter {
    fn add(&mut self, url: &str, worker_type: &str) -> String {
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

type W = Arc<Mutex<World>>;

fn state(inv: &str, pid: u32) -> UnitState {
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

struct FakeUnits(W);
struct NoWatch;
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
            let w = self.0.lock().unwrap();
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
}

fn entry(msg: &str, pid: u32) -> LogEntry {
    let fields: BTreeMap<String, String> = [("MESSAGE".to_string(), msg.to_string()), ("_PID".to_string(), pid.to_string())].into();
    LogEntry { realtime_us: 0, read_at: SystemTime::now(), fields }
}

struct FakeFollow(Vec<LogEntry>);
impl Follow for FakeFollow {
    async fn next(&mut self) -> Option<Result<LogEntry, LogError>> {
        if self.0.is_empty() {
            std::future::pending::<()>().await;
        }
        Some(Ok(self.0.remove(0)))
    }
}

struct FakeLogs(W);
impl Logs for FakeLogs {
    type F = FakeFollow;
    async fn tail_cursor(&self) -> Result<Option<String>, LogError> {
        Ok(Some("c".into()))
    }
    fn follow(&self, _cursor: Option<String>, unit: &str) -> FakeFollow {
        let pid = self.0.lock().unwrap().states.get(unit).map(|s| s.main_pid).unwrap_or(0);
        // The old process flushes its ready line first; then the new run's.
        FakeFollow(vec![entry("The server is fired up and ready to roll!", 1), entry("[t] The server is fired up and ready to roll!", pid)])
    }
    async fn last_lines(&self, _unit: &str, _n: usize) -> Result<Vec<String>, LogError> {
        Ok(vec!["last line".into()])
    }
}

struct FakeProbes(W);
impl Probes for FakeProbes {
    async fn health(&self, url: &str) -> Health {
        let mut w = self.0.lock().unwrap();
        w.health_asked.push(url.to_string());
        if w.unhealthy.iter().any(|u| u == url) {
            Health::Unavailable("503".into())
        } else {
            Health::Up
        }
    }
    async fn ready(&self, url: &str) -> Option<Health> {
        let w = self.0.lock().unwrap();
        w.ready_served.then(|| if w.unhealthy.iter().any(|u| u == url) { Health::Unavailable("503".into()) } else { Health::Up })
    }
    async fn kv(&self, _url: &str) -> Result<KvReport, MetricsError> {
        Ok(KvReport {
            max_total_tokens: Some(10.0),
            token_usage: 0.0,
            used_tokens: 0.0,
            available_tokens: None,
            evictable_tokens: None,
            running_reqs: None,
            queue_reqs: None,
            names: vec![],
        })
    }
    async fn in_flight(&self, url: &str) -> Result<u64, HttpFailure> {
        Ok(self.0.lock().unwrap().in_flight.get(url).copied().unwrap_or(0))
    }
    async fn auth(&self, _url: &str) -> pdctl_core::ports::Auth {
        pdctl_core::ports::Auth::Accepted
    }
    async fn abort_all(&self, url: &str) -> Result<(), HttpFailure> {
        let mut w = self.0.lock().unwrap();
        w.in_flight.remove(url);
        w.aborted.push(url.into());
        Ok(())
    }
    async fn warm_worker(&self, _url: &str) -> Result<(), HttpFailure> {
        Ok(())
    }
    fn replicas(&self) -> usize {
        usize::from(self.0.lock().unwrap().router.is_some())
    }
    async fn router_workers(&self, _r: usize) -> Result<Vec<RouterWorker>, HttpFailure> {
        Ok(self.0.lock().unwrap().router.as_ref().map(|r| r.workers.clone()).unwrap_or_default())
    }
    async fn register(&self, _r: usize, u: &str, t: &str, _b: Option<u16>) -> Result<String, HttpFailure> {
        let mut w = self.0.lock().unwrap();
        let r = w.router.as_mut().ok_or_else(|| HttpFailure("no router".into()))?;
        r.log.push(format!("register {u}"));
        Ok(r.add(u, t))
    }
    async fn settle_now(&self, _r: usize, id: &str) -> Result<(), HttpFailure> {
        let mut w = self.0.lock().unwrap();
        let r = w.router.as_mut().ok_or_else(|| HttpFailure("no router".into()))?;
        r.log.push(format!("settle_now {id}"));
        Ok(())
    }
    async fn deregister(&self, _r: usize, id: &str) -> Result<(), HttpFailure> {
        let mut w = self.0.lock().unwrap();
        let restarts = w.restarted.len();
        let r = w.router.as_mut().ok_or_else(|| HttpFailure("no router".into()))?;
        r.log.push(format!("deregister {id} after {restarts} restart(s)"));
        r.workers.retain(|x| x.id != id);
        Ok(())
    }
    async fn cb_state(&self, _r: usize, _url: &str) -> Result<Option<f64>, MetricsError> {
        Ok(None)
    }
    async fn open_breakers(&self, _r: usize) -> Result<Vec<String>, MetricsError> {
        Ok(Vec::new())
    }
    async fn smoke(&self, _r: usize, _n: u32) -> Result<(), HttpFailure> {
        match self.0.lock().unwrap().router.as_ref() {
            Some(r) if r.smoke_fails => Err(HttpFailure("503 No available decode workers".into())),
            _ => Ok(()),
        }
    }
    async fn pair(&self, t: PairTarget<'_>, _limit: Duration) -> PairProbe {
        let mut w = self.0.lock().unwrap();
        w.pairs.push((t.prefill_url.into(), t.decode_url.into()));
        let start = |url: &str| w.states.get(&format!("{}.service", url.trim_start_matches("http://"))).map(|s| s.exec_main_start_us).unwrap_or(0);
        let stale = w.stale_cache && start(t.decode_url) < start(t.prefill_url);
        let decode = if stale {
            Half::Answered { status: 500, body: format!("Decode transfer failed for request rank=0 with exception KVTransferError(bootstrap_room={}): Request timed out after 3.0s in KVPoll.WaitingForInput", t.room) }
        } else {
            Half::Answered { status: 200, body: "{}".into() }
        };
        PairProbe {
            room: t.room,
            prefill: if stale { Half::NoAnswer } else { Half::Answered { status: 200, body: "{}".into() } },
            decode,
            took: Duration::from_millis(1),
        }
    }
    async fn server_info(&self, _url: &str) -> Result<serde_json::Value, HttpFailure> {
        Ok(serde_json::json!({"page_size": 1}))
    }
    async fn reach(&self, _url: &str) -> pdctl_core::ports::Reach {
        pdctl_core::ports::Reach::Open
    }
    async fn service(&self, url: &str) -> Result<ServiceScrape, MetricsError> {
        let mut w = self.0.lock().unwrap();
        match w.served.get_mut(url) {
            Some(q) if q.len() > 1 => Ok(q.remove(0)),
            Some(q) if q.len() == 1 => Ok(q[0].clone()),
            _ => Err(MetricsError { diagnosis: pdctl_core::cause::MetricsDiagnosis::Unreachable, message: "no figures".into() }),
        }
    }
    async fn gateway_outcomes(&self, _url: &str) -> Option<(f64, f64)> {
        None
    }
    async fn gateway_responses(&self) -> Option<(f64, f64)> {
        None
    }
    async fn model_info(&self, url: &str) -> Result<(String, String), HttpFailure> {
        Ok(self.0.lock().unwrap().weights.get(url).cloned().unwrap_or_else(|| ("m".into(), "default".into())))
    }
    async fn pause(&self, url: &str, mode: pdctl_core::ports::PauseMode, _limit: Duration) -> Result<(), HttpFailure> {
        let mode = if mode == pdctl_core::ports::PauseMode::Retract { String::new() } else { format!("{} ", mode.as_str()) };
        self.0.lock().unwrap().weight_log.push(format!("pause {mode}{url}"));
        Ok(())
    }
    async fn resume(&self, url: &str, _limit: Duration) -> Result<(), HttpFailure> {
        self.0.lock().unwrap().weight_log.push(format!("continue {url}"));
        Ok(())
    }
    async fn flush_cache(&self, url: &str, _limit: Duration) -> Result<bool, HttpFailure> {
        self.0.lock().unwrap().weight_log.push(format!("flush {url}"));
        Ok(true)
    }
    async fn update_weights(&self, url: &str, model_path: &str, version: Option<&str>, _limit: Duration) -> Result<String, HttpFailure> {
        let mut w = self.0.lock().unwrap();
        w.weight_log.push(format!("load {url} {model_path}"));
        if w.weights_fail.iter().any(|u| u == url) {
            return Err(HttpFailure("400 Failed to get weights iterator".into()));
        }
        let v = version.map(String::from).unwrap_or_else(|| w.weights.get(url).map(|x| x.1.clone()).unwrap_or_else(|| "default".into()));
        w.weights.insert(url.into(), (model_path.into(), v));
        Ok("Succeeded to update model weights.".into())
    }
    async fn pd_queues(&self, _url: &str) -> Result<PdQueues, MetricsError> {
        let mut w = self.0.lock().unwrap();
        Ok(if w.held.is_empty() { PdQueues { held_reqs: 0.0, used_tokens: 0.0, source: "/v1/loads" } } else { w.held.remove(0) })
    }
}

fn settings() -> Settings {
    let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n";
    load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap()
}

/// A rollout of `plan` for `Engine::execute` (id `r1`), without revisions or a drain ledger.
fn rollout_of<'a>(plan: &'a Plan, abort: &'a std::sync::atomic::AtomicBool, allow_outage: bool, load_changes: bool) -> pdctl_core::engine::RolloutRun<'a> {
    pdctl_core::engine::RolloutRun {
        plan,
        resume: 0,
        abort,
        revisions: None,
        ledger: None,
        id: "r1",
        allow_outage,
        load_changes,
        restore: None,
        weights: None,
        fleet_rollout: None,
    }
}

fn world() -> W {
    let w = World { next_pid: 100, ..Default::default() };
    let w = Arc::new(Mutex::new(w));
    for (u, pid, gpus) in [("p.service", 10, "0,1,2,3"), ("d.service", 20, "4,5,6,7")] {
        w.lock().unwrap().states.insert(u.into(), state("old", pid));
        w.lock().unwrap().env.insert(u.into(), vec![format!("CUDA_VISIBLE_DEVICES={gpus}")]);
    }
    w
}

async fn run(w: &W, s: Settings) -> (pdctl_core::events::Summary, Vec<Event>) {
    run_only(w, s, &[]).await
}

async fn run_only(w: &W, s: Settings, only: &[String]) -> (pdctl_core::events::Summary, Vec<Event>) {
    let plan = Plan::new(&s, only).unwrap();
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let summary = engine.rolling_restart(&plan, &tx).await;
    drop(tx);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    (summary, events)
}

#[tokio::test]
async fn restarts_in_role_order_one_at_a_time_and_skips_the_old_ready_line() {
    let w = world();
    let (summary, events) = run(&w, settings()).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service", "d.service"]);
    let pos = |u: &str, s: Step, st: Status| events.iter().position(|e| e.unit == u && e.step == s && e.status == st).unwrap();
    assert!(pos("p.service", Step::Soak, Status::Passed) < pos("d.service", Step::Restart, Status::Started));
    let ready = &events[pos("p.service", Step::Ready, Status::Passed)].detail;
    assert_eq!(ready["pid"], 101, "the new run's line, not the old process's flush");
    assert_eq!(ready["ignored_ready_lines_of_other_runs"], 1);
}

#[tokio::test]
async fn a_failed_gate_halts_and_the_next_unit_is_never_touched() {
    let w = world();
    w.lock().unwrap().unhealthy.push("http://p".into());
    let (summary, events) = run(&w, settings()).await;
    assert_eq!(summary.result, Outcome::Failed);
    let f = summary.failed.unwrap();
    assert_eq!((f.unit.as_str(), f.step), ("p.service", Step::Health));
    assert_eq!(f.cause_code, "health_timeout");
    assert_eq!(f.last_lines, vec!["last line"]);
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "decode never restarted");
    assert!(!events.iter().any(|e| e.unit == "d.service" && e.step != Step::Preflight));
}

#[tokio::test]
async fn overlapping_gpus_are_refused_before_anything_restarts() {
    let w = world();
    // The units' own CUDA_VISIBLE_DEVICES (config cannot see these; preflight reads them).
    w.lock().unwrap().env.insert("d.service".into(), vec!["CUDA_VISIBLE_DEVICES=3,4,5,6,7".into()]);
    let (summary, _) = run(&w, settings()).await;
    let f = summary.failed.unwrap();
    assert_eq!((f.unit.as_str(), f.step), ("d.service", Step::Preflight));
    assert!(f.cause.contains("overlap"), "{}", f.cause);
    assert_eq!(f.cause_code, "gpu_overlap");
    assert!(w.lock().unwrap().restarted.is_empty());
}

#[tokio::test]
async fn unknown_unit_is_a_config_failure() {
    let w = world();
    w.lock().unwrap().states.remove("d.service");
    let (summary, _) = run(&w, settings()).await;
    let f = summary.failed.unwrap();
    assert_eq!(f.kind, pdctl_core::events::FailureKind::Config);
    assert_eq!(f.cause_code, "unit_missing");
    assert!(w.lock().unwrap().restarted.is_empty());
}

#[tokio::test]
async fn a_drain_of_a_crash_looping_worker_is_reported_not_waited_for() {
    use pdctl_core::drains::{Drain, Ledger};
    let w = world();
    w.lock().unwrap().unhealthy.push("http://p".into());
    if let Some(st) = w.lock().unwrap().states.get_mut("p.service") {
        st.active_state = "activating".into();
        st.sub_state = "auto-restart".into();
    }
    let dir = std::env::temp_dir().join(format!("pdctl-fake-ledger-{}", std::process::id()));
    let ledger = Ledger::open(&dir).unwrap();
    let d = Drain {
        unit: "p.service".into(),
        url: "http://p".into(),
        role: pdctl_core::config::Role::Prefill,
        bootstrap_port: None,
        invocation_id: "old".into(),
        router_id: "w1".into(),
        rollout_id: "r1".into(),
        drained_at: 0,
        hold: None,
    };
    ledger.record(&d).unwrap();
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: settings(), coordinator: None };
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    // A budget of 5 minutes: a crash loop is not coming up, so it must not be waited out (the
    // rollout lock is held meanwhile). The bound only keeps a regression from hanging the suite.
    let r = tokio::time::timeout(Duration::from_secs(60), engine.reconcile(&d, &ledger, Duration::from_secs(300), &tx)).await.expect("not waited out");
    let cause = r.unwrap_err();
    assert_eq!(cause.code(), "drain_not_restored");
    assert!(cause.sentence().contains("auto-restart"), "{}", cause.sentence());
    assert!(ledger.get("p.service").is_some(), "the drain stays on record");
    let _ = std::fs::remove_dir_all(dir);
}

fn with(extra: &str) -> Settings {
    let text = format!(
        "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n{extra}"
    );
    load_texts(&[(PathBuf::from("t.toml"), text)]).unwrap()
}

#[tokio::test]
async fn a_stale_decode_found_by_the_pair_gate_is_repaired_before_the_prefill_is_re_admitted() {
    let w = world();
    w.lock().unwrap().stale_cache = true;
    let (summary, events) = run_only(&w, settings(), &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service", "d.service"], "the decode restarted as a repair");
    assert_eq!(summary.units, vec!["d.service", "p.service"]);
    assert_eq!(summary.repairs.get("d.service").map(String::as_str), Some("p.service"));
    let pos = |u: &str, s: Step, st: Status| events.iter().position(|e| e.unit == u && e.step == s && e.status == st).unwrap();
    let pair = &events[pos("p.service", Step::Pair, Status::Passed)];
    assert_eq!(pair.detail["stale"][0], "d.service");
    // Two probes: a fixed decode would have answered the second.
    assert_eq!(pair.detail["pairs"][0]["probes"].as_array().unwrap().len(), 2);
    // The decode went through every gate (its own pair gate included) before the prefill's router gate.
    assert!(pos("d.service", Step::Soak, Status::Passed) < pos("p.service", Step::Router, Status::Started));
    assert!(pos("d.service", Step::Pair, Status::Passed) < pos("d.service", Step::Soak, Status::Passed));
    assert!(events.iter().filter(|e| e.unit == "d.service" && e.step != Step::Preflight).all(|e| e.repair_of.as_deref() == Some("p.service")));
    assert!(events.iter().filter(|e| e.unit == "p.service").all(|e| e.repair_of.is_none()));
}

#[tokio::test]
async fn on_stale_pair_halt_stops_naming_the_decode_and_restarts_nothing_else() {
    let w = world();
    w.lock().unwrap().stale_cache = true;
    let (summary, _) = run_only(&w, with("on_stale_pair = \"halt\"\n"), &["p.service".into()]).await;
    let f = summary.failed.expect("halted");
    assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Pair, "stale_pair"));
    assert!(f.cause.starts_with("d.service still uses the bootstrap info of p.service"), "{}", f.cause);
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"]);
}

#[tokio::test]
async fn a_fixed_decode_needs_no_repair_and_the_pair_gate_probes_only_the_restarted_workers_pairs() {
    let w = world();
    let (summary, events) = run_only(&w, settings(), &["d.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert!(summary.repairs.is_empty());
    assert_eq!(w.lock().unwrap().pairs, vec![("http://p".to_string(), "http://d".to_string())]);
    assert!(events.iter().any(|e| e.unit == "d.service" && e.step == Step::StrandedKv && e.status == Status::Passed));
}

#[tokio::test]
async fn a_stale_decode_that_is_the_only_one_is_not_repaired_without_allow_outage() {
    let w = world();
    w.lock().unwrap().stale_cache = true;
    w.lock().unwrap().states.insert("p2.service".into(), state("old2", 30));
    w.lock().unwrap().env.insert("p2.service".into(), vec!["CUDA_VISIBLE_DEVICES=8".into()]);
    let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"p2.service\"\nrole = \"prefill\"\nurl = \"http://p2\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n";
    let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
    let plan = Plan::new(&s, &["p.service".into()]).unwrap();
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let abort = std::sync::atomic::AtomicBool::new(false);
    let run = rollout_of(&plan, &abort, false, false);
    let f = engine.execute(run, &tx).await.summary.failed.expect("halted");
    assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Pair, "repair_blocked"));
    assert!(f.cause.contains("only decode worker") && f.cause.contains("--allow-outage"), "{}", f.cause);
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "the decode is not restarted");
}

/// A plain restart does not load a unit change systemd has not loaded yet: refused in preflight
/// (`changes_pending`, naming `--load-changes`), nothing reloaded or restarted; with
/// `load_changes` (a config rollout, or the flag) it reloads and restarts.
#[tokio::test]
async fn a_plain_restart_refuses_changes_it_would_load() {
    for load_changes in [false, true] {
        let w = world();
        w.lock().unwrap().need_reload.push("p.service".into());
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
             [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
             [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\nallow_outage = true\n\
             [verify]\nrouter = false\n";
        let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
        let plan = Plan::new(&s, &["p.service".into()]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = rollout_of(&plan, &abort, true, load_changes);
        let summary = engine.execute(run, &tx).await.summary;
        let world = w.lock().unwrap();
        if load_changes {
            assert!(summary.failed.is_none(), "{summary:?}");
            assert_eq!((world.reloads, world.restarted.clone()), (1, vec!["p.service".to_string()]));
        } else {
            let f = summary.failed.expect("refused");
            assert_eq!((f.step, f.cause_code.as_str()), (Step::Preflight, "changes_pending"));
            assert!(f.cause.contains("NeedDaemonReload") && f.next.contains("--load-changes"), "{f:?}");
            assert_eq!((world.reloads, world.restarted.len()), (0, 0), "nothing reloaded or restarted");
        }
    }
}

/// The first-day baseline (what a running process started with, the revision a rollback
/// restores) is taken only from a settled run: one that a crash loop replaces within
/// `min_healthy` is not recorded as good; a run that stays up is, after waiting out the rest.
#[tokio::test]
async fn a_crash_looping_run_is_never_recorded_as_the_good_revision() {
    for crash in [true, false] {
        let w = world();
        let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
        w.lock().unwrap().states.get_mut("p.service").unwrap().exec_main_start_us = now_us;
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n[rollout]\nmin_healthy = \"1s\"\n";
        let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let dir = std::env::temp_dir().join(format!("pdctl-baseline-{}-{crash}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        if crash {
            // systemd restarts it 300 ms later (Restart=on-failure): a new run.
            let w2 = w.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut w = w2.lock().unwrap();
                let st = w.states.get_mut("p.service").unwrap();
                st.invocation_id = "crashed-and-restarted".into();
                st.n_restarts = 1;
            });
        }
        engine.staleness(&dir).await.unwrap();
        assert_eq!(pdctl_core::revisions::load(&dir, "p.service").is_some(), !crash, "crash loop: {crash}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// [`settings`] with a gateway, the smoke request on, and both workers admitted by it.
fn with_router(w: &W, decode_listed: bool) -> Settings {
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

#[tokio::test]
async fn a_worker_the_gateway_lists_failed_is_removed_and_re_added() {
    let w = world();
    let s = with_router(&w, true);
    // The prefill's re-registration comes up `failed` (smg gives up on it); the next one is fine.
    w.lock().unwrap().router.as_mut().unwrap().statuses = vec!["failed".into()];
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let router = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Router && e.status == Status::Passed).expect("router gate passed");
    assert_eq!(router.detail["re_added_after"], "failed", "{}", router.detail);
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    assert_eq!(log.iter().filter(|l| l.starts_with("register http://p")).count(), 2, "registered, removed, registered again: {log:?}");
    assert!(log.iter().any(|l| l.starts_with("deregister w3")), "the failed entry was removed: {log:?}");
}

#[tokio::test]
async fn the_only_worker_of_its_role_is_taken_out_by_its_restart_not_before_it() {
    let w = world();
    let s = with_router(&w, true);
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let passed = |step: Step| events.iter().find(|e| e.unit == "p.service" && e.step == step && e.status == Status::Passed).expect("passed").detail.clone();
    let drain = passed(Step::Drain);
    assert!(drain["taken_out"].as_str().is_some_and(|t| t.starts_with("deferred")), "{drain}");
    let restart = passed(Step::Restart);
    assert!(restart["taken_out"]["when"].as_str().is_some_and(|t| t.contains("restart job ended")), "no drain check in these logs: {restart}");
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    let at = |prefix: &str| log.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {log:?}"));
    assert!(at("settle_now w1") < at("deregister w1 after 1 restart(s)"), "settle 0 set first, the removal during the restart: {log:?}");
    // The drain was written down before anything touched the gateway, and undone at re-admission.
    assert!(w.lock().unwrap().router.as_ref().unwrap().workers.iter().any(|x| x.url == "http://p"), "re-admitted");
}

/// A deferred worker whose old process is gone before any drain check was logged (killed,
/// crashed) serves nothing: it is taken out then, not when the restart job ends.
#[tokio::test]
async fn a_deferred_worker_whose_old_process_is_gone_is_taken_out_then() {
    let w = world();
    let s = with_router(&w, true);
    w.lock().unwrap().restart_takes = Some(Duration::from_secs(2));
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let restart =
        events.iter().find(|e| e.unit == "p.service" && e.step == Step::Restart && e.status == Status::Passed).expect("restart passed").detail.clone();
    assert!(restart["taken_out"]["when"].as_str().is_some_and(|t| t.contains("old process was gone")), "{restart}");
    assert!(restart["taken_out"]["after_ms"].as_u64().is_some_and(|ms| ms < 2000), "before the job ended: {restart}");
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    assert!(log.iter().any(|l| l.starts_with("deregister w1 after 0 restart(s)")), "out while the restart job ran: {log:?}");
}

/// A deferred worker whose stop logs no drain check (the fake's journal has none) and whose old
/// process keeps running is taken out at its deadline after SIGTERM — 5 s × (1 − the share of
/// looks that found it busy), 5 s for this idle one — not only when the restart job ends.
#[tokio::test]
async fn a_deferred_worker_is_taken_out_by_its_deadline_when_no_drain_check_comes() {
    let w = world();
    let s = with_router(&w, true);
    {
        let mut world = w.lock().unwrap();
        (world.restart_takes, world.old_process_stays) = (Some(Duration::from_secs(7)), true);
    }
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let passed = |step: Step| events.iter().find(|e| e.unit == "p.service" && e.step == step && e.status == Status::Passed).expect("passed").detail.clone();
    assert_eq!(passed(Step::Drain)["take_out_by_ms"], 5000, "idle in every look");
    let restart = passed(Step::Restart);
    let taken = &restart["taken_out"];
    assert!(taken["when"].as_str().is_some_and(|t| t.starts_with("5.0 s after its SIGTERM")), "{restart}");
    assert!(taken["after_ms"].as_u64().is_some_and(|ms| (5000..7000).contains(&ms)), "at its deadline, before the job ended: {restart}");
}

/// A stop that would SIGKILL the only worker of its role before SGLang's first drain check (5 s
/// after SIGTERM) would kill it while the gateway still routes to it: its drain takes it out
/// before the stop, as for any other worker, and says why it was not deferred.
#[tokio::test]
async fn the_only_worker_whose_stop_ends_before_the_first_drain_check_is_taken_out_before_it() {
    let w = world();
    let s = with_router(&w, true);
    w.lock().unwrap().timeout_stop.insert("p.service".into(), Duration::from_secs(1));
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let drain = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Drain && e.status == Status::Passed).expect("drain passed").detail.clone();
    assert!(drain["not_deferred"].as_str().is_some_and(|t| t.contains("TimeoutStopSec=1.0s")), "{drain}");
    let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
    let at = |prefix: &str| log.iter().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {log:?}"));
    assert!(at("deregister w1 after 0 restart(s)") < at("register http://p"), "out before its restart: {log:?}");
}

/// Where the servers serve `/ready` (0.5.23), a PD worker's health gate and its pair gate's
/// check of the peer ask `/ready` alone: 0.5.23's `/health` sleeps 1 s in its generate, and the
/// pair gate's PD request proves generation. Without `/ready` both ask `/health`, as before.
#[tokio::test]
async fn pd_health_and_the_pair_peer_check_ask_ready_where_it_is_served() {
    let w = world();
    w.lock().unwrap().ready_served = true;
    let (summary, events) = run_only(&w, settings(), &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let health = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Health && e.status == Status::Passed).expect("health passed");
    assert_eq!(health.detail["checked"], serde_json::json!(["/ready"]), "{}", health.detail);
    assert!(w.lock().unwrap().pairs.iter().any(|(p, d)| p == "http://p" && d == "http://d"), "the pair was probed");
    assert_eq!(w.lock().unwrap().health_asked, Vec::<String>::new(), "no /health: neither the worker's nor its peer's");

    let w = world();
    let (summary, _) = run_only(&w, settings(), &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let asked = w.lock().unwrap().health_asked.clone();
    assert!(asked.iter().any(|u| u == "http://p") && asked.iter().any(|u| u == "http://d"), "without /ready: /health of both: {asked:?}");
}

#[tokio::test]
async fn re_admitting_a_prefill_while_the_gateway_lists_no_decode_ends_at_once() {
    let w = world();
    let s = with_router(&w, false);
    w.lock().unwrap().router.as_mut().unwrap().smoke_fails = true;
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Failed, "{summary:?}");
    let f = summary.failed.as_ref().expect("a failure");
    assert_eq!((f.step, f.cause_code.as_str()), (Step::Router, "peer_role_down"), "{f:?}");
    let failed = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Router && e.status == Status::Failed).expect("router gate failed");
    assert!(failed.detail["ended_early"].as_str().unwrap_or("").contains("lists no decode worker"), "{}", failed.detail);
    assert!(
        w.lock().unwrap().router.as_ref().unwrap().workers.iter().any(|x| x.url == "http://p" && x.status.as_deref() == Some("ready")),
        "the prefill is left admitted"
    );
}

#[tokio::test]
async fn a_stale_decodes_requests_left_after_the_drain_are_aborted_before_its_repair() {
    let w = world();
    // The gateway (the settings below add drain_timeout = 1s to those of `with_router`).
    let _ = with_router(&w, true);
    // The decode's requests wait for KV from the restarted prefill's old process: they never end.
    w.lock().unwrap().stale_cache = true;
    w.lock().unwrap().in_flight.insert("http://d".into(), 2);
    let text = "[router]\nurl = \"http://r:1\"\n[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\ndrain_timeout = \"1s\"\nallow_outage = true\n\
         [verify]\nmetrics = \"off\"\navailability_probe = \"off\"\n";
    let s = load_texts(&[(PathBuf::from("t.toml"), text.to_string())]).unwrap();
    let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    assert_eq!(w.lock().unwrap().aborted, vec!["http://d"], "only the stale decode's requests were aborted");
    let drain = events.iter().find(|e| e.unit == "d.service" && e.step == Step::Drain && e.status == Status::Passed).expect("the repair drained the decode");
    assert_eq!(drain.detail["aborted"], 2, "{}", drain.detail);
    assert!(drain.detail["aborted_why"].as_str().unwrap_or("").contains("stale"), "{}", drain.detail);
    let p_drain = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Drain && e.status == Status::Passed).expect("the prefill's drain");
    assert_eq!(p_drain.detail["aborted"], serde_json::Value::Null, "nothing aborted outside a repair by default");
}

#[tokio::test]
async fn the_stranded_kv_wait_covers_the_gauges_idle_publish_only_when_read_from_gauges() {
    // A prefill holds one room when the decode restarts; the next read finds it released.
    for (source, limit_ms) in [("/v1/loads", 310_000), ("/metrics", 340_000)] {
        let w = world();
        w.lock().unwrap().held = vec![PdQueues { held_reqs: 1.0, used_tokens: 9.0, source }];
        let (summary, events) = run(&w, settings()).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let s = &events
            .iter()
            .find(|e| e.unit == "d.service" && e.step == Step::StrandedKv && e.status == Status::Passed)
            .expect("the stranded-KV gate ran")
            .detail;
        assert_eq!(s["held_at_start"]["p.service"]["source"], source, "{s}");
        assert_eq!(s["released"], true, "{s}");
        // The bootstrap timeout's default (300 s) + 10 s, + SGLang's 30 s idle publish when the
        // held rooms were read from the lagging gauges.
        assert_eq!(s["limit_ms"], limit_ms, "{s}");
    }
}

/// Service figures of `n` finished requests whose end-to-end latencies all lie in (lo, hi].
fn served(n: f64, lo: f64, hi: f64) -> ServiceScrape {
    let e2e = Histogram { buckets: vec![(lo, 0.0), (hi, n), (f64::INFINITY, n)], count: n, sum: 0.0 };
    ServiceScrape { e2e: Some(e2e), requests: n, ..ServiceScrape::default() }
}

fn with_slo(extra: &str) -> Settings {
    let text = format!(
        "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n\
         [[worker]]\nunit = \"d.service\"\nrole = \"decode\"\nurl = \"http://d\"\n\
         [rollout]\nmin_healthy = \"1s\"\nhealth_timeout = \"1s\"\nready_timeout = \"2s\"\n[verify]\nmetrics = \"off\"\n[verify.slo]\n{extra}"
    );
    load_texts(&[(PathBuf::from("t.toml"), text)]).unwrap()
}

#[tokio::test]
async fn alone_in_its_role_a_slower_worker_is_judged_against_its_own_figures_from_before_its_drain() {
    let w = world();
    // p's old process served 100 requests at 0.2-0.4 s; the new one starts at nothing and serves
    // 40 at 0.8-1.0 s (a change 3x slower). d is unchanged (its old process: 50 at 0.2-0.4 s).
    w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(40.0, 0.8, 1.0)]);
    let (summary, events) = run(&w, with_slo("min_requests = 20\n")).await;
    assert_eq!(summary.result, Outcome::Failed, "{summary:?}");
    let f = summary.failed.unwrap();
    assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Soak, "slo_regression"));
    assert!(
        f.cause.contains("its own figures from before its drain")
            && f.cause.contains("end-to-end latency p50 0.90 s vs 0.30 s (×3.0, limit ×1.5)")
            && f.cause.contains("over 40 and 100 requests"),
        "{}",
        f.cause
    );
    assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "no second unit after a failed gate");
    let failed = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Soak && e.status == Status::Failed).unwrap();
    assert_eq!(failed.detail["slo"]["verdict"], "breach");
    assert_eq!(failed.detail["slo"]["figures"][0]["name"], "e2e_p50");
}

/// Too little traffic, by each `[verify.slo] unjudged`: `pass` says "not judged" and passes;
/// `fail` fails the soak (`slo_not_judged`); `probe` (the default) on a 1P1D host has no peer of
/// the role to sample against and fails the same, saying why — never a pass.
#[tokio::test]
async fn too_little_traffic_is_said_not_judged_and_a_same_speed_worker_passes() {
    for unjudged in ["fail", "probe"] {
        let w = world();
        w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(3.0, 0.8, 1.0)]);
        let (summary, _) = run(&w, with_slo(&format!("min_requests = 20\nmax_wait = \"0s\"\nunjudged = \"{unjudged}\"\n"))).await;
        let f = summary.failed.unwrap_or_else(|| panic!("{unjudged}: not judged is no pass"));
        assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Soak, "slo_not_judged"), "{unjudged}");
        assert_eq!(f.cause.contains("pdctl's own sample could not be sent: no other prefill worker serves"), unjudged == "probe", "{}", f.cause);
        assert_eq!(w.lock().unwrap().restarted, vec!["p.service"], "no second unit after a failed gate");
    }
    let w = world();
    w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(3.0, 0.8, 1.0)]);
    w.lock().unwrap().served.insert("http://d".into(), vec![served(100.0, 0.2, 0.4), served(0.0, 0.2, 0.4), served(30.0, 0.2, 0.4)]);
    let (summary, events) = run(&w, with_slo("min_requests = 20\nmax_wait = \"0s\"\nunjudged = \"pass\"\n")).await;
    assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
    let soak = |u: &str| events.iter().find(|e| e.unit == u && e.step == Step::Soak && e.status == Status::Passed).unwrap().detail.clone();
    let p = soak("p.service");
    assert_eq!(p["slo"]["verdict"], "not_judged");
    assert_eq!(p["note"], "p.service's service was not judged: 3 requests on the restarted worker, fewer than min_requests = 20");
    let d = soak("d.service");
    assert_eq!((d["slo"]["verdict"].as_str(), d["slo"]["requests"].as_u64(), d["slo"]["baseline_requests"].as_u64()), (Some("pass"), Some(30), Some(100)));
    assert!(d.get("note").is_none());
}

/// The fleet bake's look (`Engine::bake_look`): each watched worker's window since the bake began
/// against its own figures from before its drain — a slower one is a breach naming the figure and
/// both sample sizes, one whose baseline was not kept is "not judged" (never a pass), and an
/// unchanged one passes.
#[tokio::test]
async fn the_bakes_look_judges_each_changed_worker_against_its_own_figures_from_before_its_drain() {
    let w = world();
    // p: 3x slower since the bake began (40 more requests, at 0.8-1.0 s); d: same speed.
    w.lock().unwrap().served.insert("http://p".into(), vec![served(100.0, 0.2, 0.4), served(100.0, 0.2, 0.4).plus(&served(40.0, 0.8, 1.0))]);
    w.lock().unwrap().served.insert("http://d".into(), vec![served(50.0, 0.2, 0.4), served(90.0, 0.2, 0.4)]);
    let s = with_slo("min_requests = 20\n");
    let slo = s.verify.slo.expect("slo");
    let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
    let start = engine.bake_start(&["p.service".into(), "d.service".into()]).await;
    let before: std::collections::BTreeMap<String, ServiceScrape> =
        [("p.service".to_string(), served(500.0, 0.2, 0.4)), ("d.service".to_string(), served(300.0, 0.2, 0.4))].into();
    let looks = engine.bake_look(&start, &before, &slo).await;
    let by = |u: &str| looks.iter().find(|l| l.unit == u).expect("a look").clone();
    let p = by("p.service");
    assert!(matches!(p.report.verdict, pdctl_core::slo::Verdict::Breach { .. }), "{p:?}");
    assert_eq!(p.sentence(), "p.service: end-to-end latency p50 0.90 s vs 0.30 s (×3.0, limit ×1.5) (40 requests vs 500 before its drain)");
    assert_eq!(by("d.service").sentence(), "d.service: passed (40 requests vs 300 before its drain)");
    // Without its figures from before the drain (pdctld restarted since): not judged, said why.
    let looks = engine.bake_look(&start, &std::collections::BTreeMap::new(), &slo).await;
    assert!(looks.iter().all(|l| l.sentence().contains("not judged: its figures from before its drain were not kept")), "{looks:?}");
}

/// `pdctl rollout weights` on fakes: every worker is paused before any loads and continues only
/// after every one serves the new weights (so no request runs while two versions exist), nothing
/// restarts; a decode whose load fails puts the prefill back on its previous weights, and every
/// worker continues.
#[tokio::test]
async fn new_weights_pause_every_worker_load_them_all_then_continue_and_a_failed_load_puts_all_back() {
    use pdctl_core::engine::{RolloutRun, WeightsTarget};
    for fail in [false, true] {
        let w = world();
        if fail {
            w.lock().unwrap().weights_fail.push("http://d".into());
        }
        let s = settings();
        let plan = Plan::new(&s, &[]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = RolloutRun {
            weights: Some(WeightsTarget { model_path: "/models/v2", version: Some("v2"), fleet_rollout: None, config: false }),
            ..rollout_of(&plan, &abort, true, false)
        };
        let summary = engine.execute(run, &tx).await.summary;
        drop(tx);
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        let log = w.lock().unwrap().weight_log.clone();
        let at = |p: &str| log.iter().position(|l| l.starts_with(p)).unwrap_or(usize::MAX);
        let last = |p: &str| log.iter().rposition(|l| l.starts_with(p)).unwrap_or(0);
        assert!(last("pause") < at("load"), "every worker paused before any loads: {log:?}");
        assert_eq!(at("pause http://d"), 0, "the decode first: {log:?}");
        assert!(w.lock().unwrap().restarted.is_empty(), "nothing restarted");
        let weights = w.lock().unwrap().weights.clone();
        if !fail {
            assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
            assert!(last("load") < at("continue"), "no worker continues before every one loaded: {log:?}");
            for u in ["http://p", "http://d"] {
                assert_eq!(weights.get(u), Some(&("/models/v2".to_string(), "v2".to_string())), "{u}");
            }
            let p = events.iter().find(|e| e.unit == "p.service" && e.step == Step::Weights && e.status == Status::Passed).expect("p's weights step");
            assert_eq!((p.detail["from"]["weight_version"].as_str(), p.detail["to"]["weight_version"].as_str()), (Some("default"), Some("v2")));
            assert!(events.iter().any(|e| e.unit == "p.service" && e.step == Step::Pair && e.status == Status::Passed), "the pair probed after the load");
        } else {
            let f = summary.failed.expect("failed");
            assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("d.service", Step::Weights, "weights_failed"));
            assert_eq!(weights.get("http://p"), Some(&("m".to_string(), "default".to_string())), "the prefill is back on its previous weights: {log:?}");
            assert!(log.iter().any(|l| l == "load http://p m"), "{log:?}");
            for u in ["http://p", "http://d"] {
                assert!(log.iter().any(|l| *l == format!("continue {u}")), "{u} continues: {log:?}");
            }
            assert!(events.iter().any(|e| e.unit == "p.service" && e.step == Step::Rollback && e.status == Status::Passed));
        }
    }
}

/// A config rollout's new weights that a worker does not take in place: with
/// `weights_fallback = "restart"` every worker first gets its previous weights back (and
/// continues), then the change is rolled out by restarting both through every gate; with the
/// default (`revert`) nothing restarts.
#[tokio::test]
async fn an_in_place_load_that_fails_falls_back_to_a_restart_only_when_configured() {
    use pdctl_core::config::WeightsFallback;
    use pdctl_core::engine::{RolloutRun, WeightsTarget};
    for fallback in [WeightsFallback::Revert, WeightsFallback::Restart] {
        let w = world();
        w.lock().unwrap().weights_fail.push("http://d".into());
        let mut s = settings();
        s.rollout.weights_fallback = fallback;
        let plan = Plan::new(&s, &[]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let dir = std::env::temp_dir().join(format!("pdctl-in-place-{}-{fallback:?}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let run = RolloutRun {
            weights: Some(WeightsTarget { model_path: "/models/v2", version: None, fleet_rollout: None, config: true }),
            revisions: Some(&dir),
            ..rollout_of(&plan, &abort, true, true)
        };
        let finished = engine.execute(run, &tx).await;
        let weights = w.lock().unwrap().weights.clone();
        assert_eq!(weights.get("http://p"), Some(&("m".to_string(), "default".to_string())), "the prefill's previous weights are back first");
        let restarted = w.lock().unwrap().restarted.clone();
        match fallback {
            WeightsFallback::Revert => {
                assert_eq!(finished.summary.failed.map(|f| f.cause_code), Some("weights_failed".to_string()));
                assert!(restarted.is_empty() && finished.in_place, "{restarted:?}");
            }
            WeightsFallback::Restart => {
                assert_eq!(finished.summary.result, Outcome::Succeeded, "{:?}", finished.summary);
                assert_eq!(restarted, ["p.service", "d.service"], "restarted instead, in plan order");
                assert!(!finished.in_place && finished.notes.iter().any(|n| n.contains("rolled out by restarting instead")), "{:?}", finished.notes);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A prefill with an API key: decodes are paused `in_place`, not `retract` (0.5.23's decode
/// re-fetches a retracted request's KV through the prefill's `/generate` without the key, and
/// each would fail with 401); prefills are still retracted, and the record says why.
#[tokio::test]
async fn with_a_key_on_a_prefill_decodes_are_paused_in_place_and_the_notes_say_why() {
    use pdctl_core::engine::{RolloutRun, WeightsTarget};
    for keyed in [false, true] {
        let w = world();
        let mut s = settings();
        if keyed {
            for x in s.workers.iter_mut().filter(|x| x.role == pdctl_core::config::Role::Prefill) {
                x.api_key = Some(pdctl_core::config::KeySource::File("/etc/pdctl/prefill.key".into()));
            }
        }
        let plan = Plan::new(&s, &[]).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let abort = std::sync::atomic::AtomicBool::new(false);
        let run = RolloutRun {
            weights: Some(WeightsTarget { model_path: "/models/v2", version: Some("v2"), fleet_rollout: None, config: false }),
            ..rollout_of(&plan, &abort, true, false)
        };
        let out = engine.execute(run, &tx).await;
        assert_eq!(out.summary.result, Outcome::Succeeded, "{:?}", out.summary);
        let log = w.lock().unwrap().weight_log.clone();
        let decode = if keyed { "pause in_place http://d" } else { "pause http://d" };
        assert!(log.iter().any(|l| l == decode), "{keyed}: {log:?}");
        assert!(log.iter().any(|l| l == "pause http://p"), "a prefill is retracted either way: {log:?}");
        assert_eq!(out.notes.iter().any(|n| n.contains("paused in_place")), keyed, "{:?}", out.notes);
    }
}
