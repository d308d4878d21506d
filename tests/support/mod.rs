//! Test support shared by the integration tests: a simulator process with its stderr as a stream
//! of lines, waits with deadlines, and small HTTP helpers. Nothing here sleeps to synchronise:
//! every wait is on an event (a log line, a journal entry) or on a condition polled with a deadline.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

pub use pdctl_sandbox;
pub mod capacity;
pub mod fleet_hosts;
pub mod fleet_sim;
pub mod host_maintenance;
pub mod load;
pub mod real_stack;
pub use load::{served_requests, Answer, Load, MixedWatch};
pub mod router_watch;
pub use router_watch::{Observed, RouterWatch, MAX_GAP};

/// Read `r` line by line on a thread of its own; each line (parsed by `parse`, skipped when it
/// returns `None`) arrives on the returned channel, which closes when `r` does.
pub fn line_reader<T: Send + 'static>(r: impl std::io::Read + Send + 'static, parse: impl Fn(String) -> Option<T> + Send + 'static) -> Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if let Some(v) = parse(l) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// A `sglang-sim` running as a plain child process (for simulator-level tests).
pub struct SimProc {
    /// The child.
    pub child: Child,
    /// Its port.
    pub port: u16,
    lines: Receiver<String>,
    /// Every stderr line seen so far.
    pub seen: Vec<String>,
}

impl SimProc {
    /// Start `sglang-sim --model-path m --port <free> ARGS` (fast load and warmup).
    pub fn spawn(args: &[&str]) -> SimProc {
        SimProc::spawn_with(None, args, &[])
    }

    /// [`SimProc::spawn`] on a given port (a restart on the same address) with extra
    /// environment variables.
    pub fn spawn_with(port: Option<u16>, args: &[&str], env: &[(&str, &str)]) -> SimProc {
        let port = port.unwrap_or_else(|| pdctl_sandbox::free_port().expect("free port"));
        let bin = pdctl_sandbox::workspace_bin("sglang-sim", "PDCTL_SIM_BIN").expect("sglang-sim built");
        let mut child = Command::new(bin)
            .args(["--model-path", "m", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .env("SGLANG_SIM_LOAD_SECS", "0.2")
            .env("SGLANG_SIM_WARMUP_SECS", "0.3")
            .env("SGLANG_SIM_HEALTH_GENERATE_MS", "20")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sglang-sim");
        let rx = line_reader(child.stderr.take().expect("stderr"), Some);
        SimProc { child, port, lines: rx, seen: Vec::new() }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Wait for a stderr line containing `needle`; `None` at the deadline or when stderr closes.
    pub fn wait_line(&mut self, needle: &str, deadline: Duration) -> Option<String> {
        let end = Instant::now() + deadline;
        loop {
            match self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(needle) {
                        return Some(l);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Wait for the process to exit, at most `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        drain_and_wait(&self.lines, &mut self.seen, &mut self.child, Instant::now() + deadline)
    }

    /// Send SIGTERM.
    pub fn terminate(&self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
    }
}

impl Drop for SimProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Collect a child's output lines into `seen` until the output closes, then its exit status; both
/// bounded by `end` (`None` past it).
fn drain_and_wait<T>(lines: &Receiver<T>, seen: &mut Vec<T>, child: &mut Child, end: Instant) -> Option<std::process::ExitStatus> {
    while let Ok(v) = lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
        seen.push(v);
    }
    // The output closed: the process is exiting; its status follows at once.
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Poll `f` until it returns `Some`, at most `deadline`, every `every`. For state that offers no
/// events (an HTTP API); the deadline makes a missing condition a failure, not a hang.
pub async fn poll_until<T, F, Fut>(deadline: Duration, every: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// [`poll_until`] for plain blocking checks: poll `f` every `every` until it holds, at most
/// `deadline`; whether it held.
pub fn until(deadline: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// An HTTP client with a timeout on every request.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client")
}

/// Parse a Prometheus/OpenMetrics exposition with the Python `prometheus_client` parser (the
/// library SGLang itself uses), installed in the repository's `.venv` by `scripts/setup`.
/// Returns `[{name, labels, value}]` for every sample.
pub fn python_parse(text: &str, openmetrics: bool) -> Vec<serde_json::Value> {
    let py = pdctl_sandbox::repo_root().join(".venv/bin/python");
    let script = r#"
import sys, json, math
om = sys.argv[1] == "om"
text = sys.stdin.read()
if om:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(text):
    for s in fam.samples:
        v = s.value
        out.append({"family": fam.name, "type": fam.type, "name": s.name, "labels": s.labels,
                    "value": None if math.isnan(v) else v})
print(json.dumps(out))
"#;
    let mut child = Command::new(&py)
        .args(["-c", script, if openmetrics { "om" } else { "text" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {} (scripts/setup installs it): {e}", py.display()));
    use std::io::Write as _;
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("python parser");
    assert!(out.status.success(), "prometheus_client rejected the exposition: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).expect("parser JSON")
}

/// What a `pdctl --json` run printed and returned.
#[derive(Debug)]
pub struct JsonRun {
    /// Exit code.
    pub code: i32,
    /// Event lines (objects with `step`).
    pub events: Vec<serde_json::Value>,
    /// The last line (the summary, with `result`), if any.
    pub summary: serde_json::Value,
    /// Everything on stderr.
    pub stderr: String,
}

impl JsonRun {
    /// Index of the first event matching unit/step/status.
    pub fn index(&self, unit: &str, step: &str, status: &str) -> Option<usize> {
        self.events.iter().position(|e| e["unit"] == unit && e["step"] == step && e["status"] == status)
    }
    /// The first event matching unit/step/status.
    pub fn event(&self, unit: &str, step: &str, status: &str) -> &serde_json::Value {
        let i = self.index(unit, step, status).unwrap_or_else(|| panic!("no {unit} {step} {status} event in {:#?}", self.events));
        &self.events[i]
    }
    /// Did any event touch (drain/restart) this unit?
    pub fn touched(&self, unit: &str) -> bool {
        self.events.iter().any(|e| e["unit"] == unit && (e["step"] == "restart" || e["step"] == "drain"))
    }
}

/// Run the `pdctl` binary with `args` (add `--json` yourself), calling `on_line` with each JSON
/// line as it arrives; bounded by `deadline` (the process is killed past it).
pub fn pdctl_run(args: &[&str], deadline: Duration, mut on_line: impl FnMut(&serde_json::Value)) -> JsonRun {
    let bin = pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let mut child = Command::new(bin).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run pdctl");
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut s);
        s
    });
    let rx = line_reader(out, Some);
    let end = Instant::now() + deadline;
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(l) => {
                let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("pdctl printed a non-JSON line {l:?}: {e}"));
                on_line(&v);
                lines.push(v);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("pdctl {args:?} did not finish within {deadline:?}; lines so far: {lines:#?}");
            }
        }
    }
    let status = child.wait().expect("wait pdctl");
    let stderr = err_thread.join().unwrap_or_default();
    let summary = lines.last().filter(|v| v.get("result").is_some()).cloned().unwrap_or(serde_json::Value::Null);
    let events = lines.into_iter().filter(|v| v.get("step").is_some()).collect();
    JsonRun { code: status.code().unwrap_or(-1), events, summary, stderr }
}

/// Boot the 1P1D stack, wait until both workers are ready (journald) and the router admits both.
pub async fn stack_up(opts: &pdctl_sandbox::stack::StackOptions) -> pdctl_sandbox::stack::Stack {
    let stack = pdctl_sandbox::stack::Stack::boot(opts).expect("stack boots");
    // The real server on this CPU takes 15-30 s alone, more with its peer starting beside it.
    let ready_within = if stack.real.is_some() { Duration::from_secs(300) } else { Duration::from_secs(60) };
    if let Err(e) = stack.wait_ready(ready_within) {
        // What the workers and their manager said, for the failure report.
        let logs: String = stack
            .workers()
            .iter()
            .map(|w| {
                let out = stack.sandbox.journalctl(&["-u", &w.unit, "-n", "40", "--no-pager"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
                format!("--- {}:\n{}\n", w.unit, out.unwrap_or_else(|e| e.to_string()))
            })
            .collect();
        panic!("workers ready: {e:?}\n{logs}");
    }
    if stack.router.is_some() {
        stack.wait_router_healthy(stack.workers().len(), Duration::from_secs(60)).expect("the router admitted every worker");
    }
    stack
}

/// A `pdctl` process whose stdout JSON lines are read live.
pub struct LivePdctl {
    /// The process.
    pub child: Child,
    lines: Receiver<serde_json::Value>,
    /// Lines seen so far.
    pub seen: Vec<serde_json::Value>,
}

impl LivePdctl {
    /// Start `pdctl ARGS`.
    pub fn spawn(args: &[&str]) -> LivePdctl {
        let bin = pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
        let mut child = Command::new(bin).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run pdctl");
        let rx = line_reader(child.stdout.take().expect("stdout"), |l| serde_json::from_str(&l).ok());
        LivePdctl { child, lines: rx, seen: Vec::new() }
    }

    /// Wait for a line satisfying `pred`, at most `deadline`.
    pub fn wait_line(&mut self, deadline: Duration, mut pred: impl FnMut(&serde_json::Value) -> bool) -> Option<serde_json::Value> {
        let end = Instant::now() + deadline;
        loop {
            match self.lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if pred(&v) {
                        return Some(v);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Wait for the process to end (draining its output), at most `deadline`; its exit code.
    pub fn finish(&mut self, deadline: Duration) -> Option<i32> {
        drain_and_wait(&self.lines, &mut self.seen, &mut self.child, Instant::now() + deadline).and_then(|s| s.code())
    }

    /// Send a signal (`INT`, `KILL`, …).
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").arg(format!("-{sig}")).arg(self.child.id().to_string()).status();
    }
}

impl Drop for LivePdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stack (`opts`) up and admitted, and its (outside) pdctl config with a short soak and ready
/// timeout.
pub fn stack_with_config(opts: &pdctl_sandbox::stack::StackOptions) -> (pdctl_sandbox::stack::Stack, std::path::PathBuf) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let stack = rt.block_on(stack_up(opts));
    let config = stack.write_pdctl_config().expect("config");
    let dir = config.parent().expect("config dir").join("config.d");
    let fast = if stack.real.is_some() { "[rollout]\nmin_healthy = \"2s\"\n" } else { "[rollout]\nmin_healthy = \"2s\"\nready_timeout = \"20s\"\n" };
    std::fs::write(dir.join("05-fast.toml"), fast).expect("fragment");
    (stack, config)
}

/// [`stack_with_config`] with pdctld as a unit of the sandbox.
pub fn stack_with_pdctld_opts(opts: &pdctl_sandbox::stack::StackOptions) -> (pdctl_sandbox::stack::Stack, std::path::PathBuf, pdctl_sandbox::stack::Pdctld) {
    let (stack, config) = stack_with_config(opts);
    let d = stack.start_pdctld().expect("pdctld starts: systemctl start waits for its READY=1");
    (stack, config, d)
}

/// The default 1P1D stack with pdctld ([`stack_with_pdctld_opts`]).
pub fn stack_with_pdctld() -> (pdctl_sandbox::stack::Stack, std::path::PathBuf, pdctl_sandbox::stack::Pdctld) {
    stack_with_pdctld_opts(&pdctl_sandbox::stack::StackOptions::default())
}

/// `args` plus `--config CONFIG --socket SOCKET` of this pdctld.
fn daemon_args(d: &pdctl_sandbox::stack::Pdctld, config: &std::path::Path, args: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(["--config".into(), config.display().to_string(), "--socket".into(), d.socket.display().to_string()]);
    all
}

/// [`pdctl_run`] against this pdctld.
pub fn pdctl_daemon(d: &pdctl_sandbox::stack::Pdctld, config: &std::path::Path, args: &[&str], deadline: Duration) -> JsonRun {
    let all = daemon_args(d, config, args);
    pdctl_run(&all.iter().map(String::as_str).collect::<Vec<_>>(), deadline, |_| {})
}

/// [`LivePdctl::spawn`] against this pdctld.
pub fn live_daemon(d: &pdctl_sandbox::stack::Pdctld, config: &std::path::Path, args: &[&str]) -> LivePdctl {
    let all = daemon_args(d, config, args);
    LivePdctl::spawn(&all.iter().map(String::as_str).collect::<Vec<_>>())
}

/// One raw HTTP/1.0 request on pdctld's socket: status and JSON body.
pub fn raw_api(socket: &std::path::Path, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    use std::io::{Read as _, Write as _};
    let mut c = std::os::unix::net::UnixStream::connect(socket).expect("connect to pdctld");
    c.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    write!(c, "{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).expect("write");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string())))
}

/// pdctld's record of a rollout (`GET /v1/rollouts/ID`, what `pdctl rollout show` prints).
pub fn record(socket: &std::path::Path, id: &str) -> serde_json::Value {
    let (status, rec) = raw_api(socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert_eq!(status, 200, "the record of {id}: {rec}");
    rec
}

/// The run's rollout has a record, and it says what the run said: the result and, for a
/// failure, the same unit, step and cause code.
#[track_caller]
pub fn assert_recorded(socket: &std::path::Path, run: &JsonRun) {
    let id = run.summary["id"].as_str().unwrap_or_else(|| panic!("the summary names no rollout id: {:#?}", run.summary));
    let rec = record(socket, id);
    let s = &rec["summary"];
    assert_eq!(s["result"], run.summary["result"], "the record's result: {rec:#}");
    for k in ["unit", "step", "cause_code"] {
        assert_eq!(s["failed"][k], run.summary["failed"][k], "the record's failed.{k}: {rec:#}");
    }
    assert!(!rec["events"].as_array().map(Vec::is_empty).unwrap_or(true), "the record keeps the events");
}

/// SIGKILL `unit` and wait (bounded) until systemd has seen its main process die: `systemctl
/// kill` returns once the signal is sent, and a `systemctl start` that arrives while the unit is
/// still active is a no-op (measured: the next start then never happened, 2 runs in 6).
pub fn kill_and_wait(stack: &pdctl_sandbox::stack::Stack, unit: &str) {
    stack.sandbox.systemctl(&["kill", "--signal=SIGKILL", unit]).expect("systemctl kill");
    let gone =
        until(Duration::from_secs(20), Duration::from_millis(20), || stack.show(unit, "ActiveState").is_ok_and(|s| s != "active" && s != "deactivating"));
    assert!(gone, "{unit} is no longer active 20 s after SIGKILL");
}

/// `pdctl restart --rolling --json` against `d`, posting to each of `faults` (simulator fault
/// URLs) when the event `unit`/`step`/`status` arrives.
pub fn rollout_with_fault(
    d: &pdctl_sandbox::stack::Pdctld,
    config: &std::path::Path,
    when: (&str, &str, &str),
    faults: Vec<String>,
    deadline: Duration,
) -> JsonRun {
    rollout_with_faults_timed(d, config, when, faults, deadline).0
}

/// [`rollout_with_fault`], and how long the injection took from the first request sent to the
/// last answer: faults of N seconds injected on several workers all hold together for at least
/// N seconds less that spread (on a loaded machine the spread is hundreds of milliseconds).
pub fn rollout_with_faults_timed(
    d: &pdctl_sandbox::stack::Pdctld,
    config: &std::path::Path,
    when: (&str, &str, &str),
    faults: Vec<String>,
    deadline: Duration,
) -> (JsonRun, Duration) {
    let mut spread = None;
    let args = ["restart", "--rolling", "--json", "--config", config.to_str().unwrap(), "--socket", d.socket.to_str().unwrap()];
    let r = pdctl_run(&args, deadline, |e| {
        if spread.is_none() && e["unit"] == when.0 && e["step"] == when.1 && e["status"] == when.2 {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let began = std::time::Instant::now();
            rt.block_on(async {
                // All at once, so the faults overlap as much as the machine allows.
                let sent: Vec<_> = faults.iter().map(|u| tokio::spawn(http().post(u).send())).collect();
                for s in sent {
                    s.await.expect("task").expect("the fault was accepted");
                }
            });
            spread = Some(began.elapsed());
        }
    });
    let spread = spread.unwrap_or_else(|| panic!("the fault was injected at {when:?}"));
    (r, spread)
}

/// When `unit` left the router in run `r`: at its drain's start, or — the only worker of its
/// role, its drain deferred to its stop — when its restart took it out.
pub fn out_of_router_since(r: &JsonRun, unit: &str) -> std::time::SystemTime {
    let at = |step: &str, status: &str| humantime::parse_rfc3339(r.event(unit, step, status)["at"].as_str().unwrap()).unwrap();
    let restart = r.events.iter().find(|e| e["unit"] == unit && e["step"] == "restart" && e["status"] != "started");
    match restart.and_then(|e| e["detail"]["taken_out"]["after_ms"].as_u64()) {
        Some(ms) => at("restart", "started") + Duration::from_millis(ms),
        None => at("drain", "started"),
    }
}

/// A worker's `/model_info`.
pub fn model_info(url: &str) -> serde_json::Value {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async { http().get(format!("{url}/model_info")).send().await.expect("GET").json::<serde_json::Value>().await.expect("JSON") })
}

/// `pdctl ARGS --config C --socket S`, as an operator runs it: exit code and stdout.
pub fn human(d: &pdctl_sandbox::stack::Pdctld, config: &std::path::Path, args: &[&str]) -> (i32, String) {
    let bin = pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let out = std::process::Command::new(bin).args(args).arg("--config").arg(config).arg("--socket").arg(&d.socket).output().expect("run pdctl");
    // Notes go to stderr, the progress and the last line to stdout: both, in that order.
    (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout)))
}

/// A `/ready` answer's status (0: none).
pub fn ready(url: &str) -> u16 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async { http().get(format!("{url}/ready")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) })
}
