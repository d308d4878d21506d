//! The simulator held to the real server by behaviour: one scripted session runs against
//! `sglang-sim` and against the released `sglang==0.5.23` (on this CPU, the tiny model
//! scripts/setup makes), each started with the same flags as a plain process, and the test fails
//! naming every difference in a status code, a key or a type. When they disagree the real server
//! is right: the simulator's 0.5.23 profile is what gets fixed.
//!
//! The session: the start (`/health` and `/ready` while starting), requests with and without the
//! API key, `/v1/loads` (keys and types), `/server_info` (what pdctl reads; `launch_command`),
//! `/model_info` (every field), a pause and continue, `/pd_role_switch` on a server without its flag, a weight update with a request in flight
//! (not paused, then paused), SIGTERM with a request in flight (the status codes during the
//! drain, whether the request finished, when the process exited), and the metric families after
//! a batch. Timing is compared only where pdctl relies on it, coarsely.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pdctl_tests::pdctl_sandbox::{free_port, workspace_bin, RealSglang};
use serde_json::{json, Value};

const KEY: &str = "diff-s3cret";
/// The servers' `--admin-api-key`: SGLang's admin routes take it instead of [`KEY`].
const ADMIN_KEY: &str = "diff-adm1n";
/// The admin routes the session calls (0.5.23 `@auth_level(AuthLevel.ADMIN_OPTIONAL)`).
const ADMIN: &[&str] = &["/pause_generation", "/continue_generation", "/update_weights_from_disk", "/flush_cache", "/abort_request", "/pd_role_switch"];

/// What one session saw: a name per observation, its value.
type Seen = BTreeMap<String, Value>;

/// Which server a session runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Sim,
    Real,
}

/// The flags both servers get: the real server's CPU flags (the simulator accepts and ignores
/// those it has no use for), the port, metrics and the API key.
fn flags(real: &RealSglang, port: u16) -> Vec<String> {
    let mut f = real.cpu_flags();
    f.extend([
        "--port".to_string(),
        port.to_string(),
        "--enable-metrics".to_string(),
        "--api-key".to_string(),
        KEY.to_string(),
        "--admin-api-key".to_string(),
        ADMIN_KEY.to_string(),
    ]);
    f
}

struct Server {
    child: Child,
    url: String,
    args: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(which: Which, real: &RealSglang) -> Server {
    let port = free_port().expect("port");
    let args = flags(real, port);
    let mut cmd = match which {
        Which::Real => {
            let mut c = Command::new(&real.python);
            c.args(["-m", "sglang.launch_server"]).args(&args);
            c.envs(real.env());
            c
        }
        Which::Sim => {
            let mut c = Command::new(workspace_bin("sglang-sim", "PDCTL_SIM_BIN").expect("sglang-sim built"));
            c.args(&args);
            c
        }
    };
    let log = std::env::temp_dir().join(format!("pdctl-differential-{which:?}-{port}.log"));
    let out = std::fs::File::create(&log).expect("log file");
    let err = out.try_clone().expect("log file");
    let child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn().expect("start the server");
    eprintln!("{which:?} server on port {port}, its output in {}", log.display());
    Server { child, url: format!("http://127.0.0.1:{port}"), args }
}

/// A JSON value's type, as the comparison names it.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `{key: type}` of an object's keys (`None`: not an object).
fn shape(v: &Value) -> Value {
    match v.as_object() {
        Some(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), json!(type_of(x)))).collect()),
        None => json!(type_of(v)),
    }
}

struct Session {
    which: Which,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
    seen: Seen,
}

impl Session {
    fn new(which: Which) -> Session {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        Session { which, http: reqwest::Client::builder().timeout(Duration::from_secs(120)).build().expect("client"), rt, seen: Seen::new() }
    }

    fn note(&mut self, name: &str, v: Value) {
        self.seen.insert(name.to_string(), v);
    }

    /// One call: its status (0: no answer) and its body as JSON (a string when it is not JSON).
    fn call(&self, method: &str, url: &str, body: Option<Value>, key: bool) -> (u16, Value) {
        let mut r = match method {
            "POST" => self.http.post(url).json(&body.unwrap_or(json!({}))),
            _ => self.http.get(url),
        };
        if key {
            let path = url.split("://").nth(1).and_then(|x| x.find('/').map(|i| &x[i..])).unwrap_or("");
            r = r.bearer_auth(if ADMIN.contains(&path.split('?').next().unwrap_or(path)) { ADMIN_KEY } else { KEY });
        }
        self.rt.block_on(async {
            match r.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
                }
                Err(_) => (0, Value::Null),
            }
        })
    }

    /// A long generate in the background (the key sent): its status and completed tokens.
    fn long_request(&self, url: &str, tokens: u32) -> tokio::task::JoinHandle<(u16, u64)> {
        let (http, url) = (self.http.clone(), format!("{url}/generate"));
        self.rt.spawn(async move {
            let body = json!({"text": "tell a long story", "sampling_params": {"max_new_tokens": tokens, "min_new_tokens": tokens, "ignore_eos": true}});
            match http.post(&url).bearer_auth(KEY).json(&body).send().await {
                Ok(r) => {
                    let s = r.status().as_u16();
                    let v: Value = r.json().await.unwrap_or(Value::Null);
                    (s, v["meta_info"]["completion_tokens"].as_u64().unwrap_or(0))
                }
                Err(_) => (0, 0),
            }
        })
    }

    /// Requests running or waiting (`/v1/loads`).
    fn in_flight(&self, url: &str) -> u64 {
        let (_, v) = self.call("GET", &format!("{url}/v1/loads"), None, true);
        v["loads"]
            .as_array()
            .map(|l| l.iter().map(|x| x["num_running_reqs"].as_u64().unwrap_or(0) + x["num_waiting_reqs"].as_u64().unwrap_or(0)).sum())
            .unwrap_or(0)
    }

    fn wait_running(&self, url: &str) {
        let end = Instant::now() + Duration::from_secs(60);
        while self.in_flight(url) == 0 {
            assert!(Instant::now() < end, "{:?}: the long request never ran", self.which);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The whole script, in order; what was seen.
    fn run(mut self, real: &RealSglang) -> Seen {
        let mut server = spawn(self.which, real);
        let url = server.url.clone();
        self.start(&mut server);
        self.auth(&url);
        self.reads(&url, &server);
        self.pause(&url);
        self.role_switch(&url);
        self.weights(&url, real);
        self.metrics(&url);
        self.sigterm(&mut server);
        self.seen
    }

    /// The start: what /health and /ready answer before /ready says 200.
    fn start(&mut self, server: &mut Server) {
        let url = server.url.clone();
        let (mut health, mut ready) = (BTreeSet::new(), BTreeSet::new());
        let end = Instant::now() + Duration::from_secs(300);
        loop {
            assert!(Instant::now() < end, "{:?}: not ready within 300 s", self.which);
            let (h, _) = self.call("GET", &format!("{url}/health"), None, false);
            let (r, _) = self.call("GET", &format!("{url}/ready"), None, false);
            if r == 200 {
                break;
            }
            // Before ready only (a /health that turned 200 in the same moment is not counted).
            if h != 0 {
                health.insert(h);
            }
            if r != 0 {
                ready.insert(r);
            }
            assert!(server.child.try_wait().ok().flatten().is_none(), "{:?}: the server exited while starting", self.which);
            std::thread::sleep(Duration::from_millis(50));
        }
        self.note("start: /health statuses before ready", json!(health));
        self.note("start: /ready statuses before ready", json!(ready));
    }

    /// The API key: which paths need it.
    fn auth(&mut self, url: &str) {
        for (method, path) in [
            ("GET", "/health"),
            ("GET", "/ready"),
            ("GET", "/metrics"),
            ("GET", "/v1/loads"),
            ("GET", "/server_info"),
            ("GET", "/model_info"),
            ("GET", "/v1/models"),
            ("POST", "/generate"),
        ] {
            let body = (method == "POST").then(|| json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}}));
            let (without, _) = self.call(method, &format!("{url}{path}"), body.clone(), false);
            let (with, _) = self.call(method, &format!("{url}{path}"), body, true);
            self.note(&format!("auth: {method} {path} without the key, with it"), json!([without, with]));
        }
        // An admin route refuses the API key when the server has an admin key; the admin key is
        // not the API key elsewhere. (A flush when idle: no side effect worth undoing.)
        let status = |rq: reqwest::RequestBuilder| self.rt.block_on(async move { rq.send().await.map(|r| r.status().as_u16()).unwrap_or(0) });
        let with_api_key = status(self.rt.block_on(async { self.http.post(format!("{url}/flush_cache")).bearer_auth(KEY) }));
        let admin_elsewhere = status(self.rt.block_on(async { self.http.get(format!("{url}/model_info")).bearer_auth(ADMIN_KEY) }));
        let (with_admin, _) = self.call("POST", &format!("{url}/flush_cache"), None, true);
        self.note(
            "auth: POST /flush_cache with the API key, with the admin key; GET /model_info with the admin key",
            json!([with_api_key, with_admin, admin_elsewhere]),
        );
    }

    /// `/v1/loads`, `/server_info` and `/model_info` as pdctl reads them.
    fn reads(&mut self, url: &str, server: &Server) {
        let (s, v) = self.call("GET", &format!("{url}/v1/loads?include=core,disagg"), None, true);
        self.note("/v1/loads?include=core,disagg: status", json!(s));
        self.note("/v1/loads: keys", shape(&v));
        self.note("/v1/loads: loads[0] keys", shape(&v["loads"][0]));

        // /server_info: what pdctl reads, and what was asked.
        let (_, info) = self.call("GET", &format!("{url}/server_info"), None, true);
        for k in [
            "model_path",
            "tokenizer_path",
            "served_model_name",
            "page_size",
            "kv_cache_dtype",
            "dtype",
            "quantization",
            "load_format",
            "revision",
            "weight_version",
            "disaggregation_mode",
            "disaggregation_transfer_backend",
            "disaggregation_bootstrap_port",
            "dp_size",
            "enable_dp_attention",
            "attention_backend",
            "launch_command",
            "version",
        ] {
            self.note(&format!("/server_info: {k} type"), json!(type_of(&info[k])));
        }
        self.note("/server_info: launch_command is the flags given", json!(info["launch_command"].as_str() == Some(server.args.join(" ").as_str())));
        self.note("/server_info: page_size", info["page_size"].clone());
        self.note("/server_info: disaggregation_transfer_backend", info["disaggregation_transfer_backend"].clone());
        // Resolved: whether a run-time flip to decode is safe is decided on these two.
        self.note(
            "/server_info: disable_radix_cache, disaggregation_decode_enable_radix_cache",
            json!([info["disable_radix_cache"], info["disaggregation_decode_enable_radix_cache"]]),
        );

        // /model_info: every field.
        let (_, mi) = self.call("GET", &format!("{url}/model_info"), None, true);
        self.note("/model_info: keys", shape(&mi));
    }

    /// A pause and a continue.
    /// `POST /pd_role_switch` on a server started without `--enable-pd-role-switch` (this
    /// session's servers run no PD role): the answer (status, success, message,
    /// `safe_to_restore`), and a body of the wrong type. A PD pair switching both ways on the real
    /// server is `tests/real_2p2d.rs`'s.
    fn role_switch(&mut self, url: &str) {
        let u = format!("{url}/pd_role_switch");
        let (s, v) = self.call("POST", &u, Some(json!({"new_role": "decode", "prepare_only": true})), true);
        self.note("pd_role_switch without the flag: status, success, message, safe_to_restore", json!([s, v["success"], v["message"], v["safe_to_restore"]]));
        let (s, v) = self.call("POST", &u, Some(json!({"new_role": 5})), true);
        self.note("pd_role_switch with a role of the wrong type: status, body type", json!([s, type_of(&v)]));
    }

    fn pause(&mut self, url: &str) {
        let (p, _) = self.call("POST", &format!("{url}/pause_generation"), Some(json!({"mode": "retract"})), true);
        let (r_paused, _) = self.call("GET", &format!("{url}/ready"), None, false);
        let (c, _) = self.call("POST", &format!("{url}/continue_generation"), Some(json!({})), true);
        let (r_after, _) = self.call("GET", &format!("{url}/ready"), None, false);
        self.note("pause retract, /ready paused, continue, /ready after", json!([p, r_paused, c, r_after]));
    }

    /// Weight updates with a request in flight: not paused (the update waits for it), paused
    /// with `retract` (the flush after the load ignores retracted requests), paused `in_place`
    /// (the flush is refused after the load: the weights changed, `/model_info` did not); then a
    /// flush when idle.
    fn weights(&mut self, url: &str, real: &RealSglang) {
        let url = url.to_string();
        let v1 = real.model.display().to_string();
        let v2 = real.model_v2.display().to_string();
        let long = self.long_request(&url, 600);
        self.wait_running(&url);
        let (s, v) = self.call("POST", &format!("{url}/update_weights_from_disk"), Some(json!({"model_path": v2})), true);
        let (done, _) = self.rt.block_on(long).unwrap_or((0, 0));
        let moved = self.model_path(&url) == v2;
        self.note("weights, not paused, a request in flight: status, success, the request, /model_info moved", json!([s, v["success"], done, moved]));
        for (mode, to) in [("retract", &v1), ("in_place", &v2)] {
            let long = self.long_request(&url, 600);
            self.wait_running(&url);
            let (p, _) = self.call("POST", &format!("{url}/pause_generation"), Some(json!({"mode": mode})), true);
            let (s, v) = self.call("POST", &format!("{url}/update_weights_from_disk"), Some(json!({"model_path": to})), true);
            let moved = self.model_path(&url) == *to;
            let (c, _) = self.call("POST", &format!("{url}/continue_generation"), Some(json!({})), true);
            let (done, _) = self.rt.block_on(long).unwrap_or((0, 0));
            self.note(
                &format!("weights, paused ({mode}), a request in flight: pause, status, success, /model_info moved, continue, the request"),
                json!([p, s, v["success"], moved, c, done]),
            );
        }
        let (s, v) = self.call("POST", &format!("{url}/flush_cache"), None, true);
        self.note("flush_cache when idle: status, body type", json!([s, type_of(&v)]));
    }

    /// `/model_info`'s `model_path`.
    fn model_path(&mut self, url: &str) -> String {
        let (_, mi) = self.call("GET", &format!("{url}/model_info"), None, true);
        mi["model_path"].as_str().unwrap_or_default().to_string()
    }

    /// The metric families after a batch.
    fn metrics(&mut self, url: &str) {
        let (_, text) = self.call("GET", &format!("{url}/metrics"), None, false);
        let families: BTreeMap<String, String> = text
            .as_str()
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .filter(|(n, _)| n.starts_with("sglang:"))
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect();
        self.note("metrics: families", json!(families));
        // The label names of each family's samples (`le` aside): pdctl tells a server's ranks
        // apart by them (`tp_rank`, `dp_rank`...), so a label the simulator writes and the real
        // server does not, or the other way round, is a difference.
        let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for l in text.as_str().unwrap_or("").lines().filter(|l| l.starts_with("sglang:")) {
            let Some((name, rest)) = l.split_once('{') else { continue };
            let family = ["_bucket", "_count", "_sum", "_total", "_created"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|f| families.contains_key(*f))
                .unwrap_or(name);
            let names = rest.split("\",").filter_map(|kv| kv.split_once("=\"")).map(|(k, _)| k.trim_start_matches(',').to_string()).filter(|k| k != "le");
            labels.entry(family.to_string()).or_default().extend(names);
        }
        let labels: BTreeMap<String, String> = labels.into_iter().map(|(f, n)| (f, n.into_iter().collect::<Vec<_>>().join(","))).collect();
        self.note("metrics: label names", json!(labels));
    }

    /// SIGTERM with a request in flight: the drain, as seen from outside.
    fn sigterm(&mut self, server: &mut Server) {
        let url = server.url.clone();
        let long = self.long_request(&url, 1500);
        self.wait_running(&url);
        let t0 = Instant::now();
        // SAFETY: kill(2) of our own child's pid (the main process only, as KillMode=mixed does).
        unsafe {
            libc_kill(server.child.id() as i32, 15);
        }
        std::thread::sleep(Duration::from_millis(500));
        let (h, _) = self.call("GET", &format!("{url}/health"), None, false);
        let (r, _) = self.call("GET", &format!("{url}/ready"), None, false);
        let (g, _) = self.call("POST", &format!("{url}/generate"), Some(json!({"text": "new", "sampling_params": {"max_new_tokens": 2}})), true);
        self.note("SIGTERM: /health, /ready, a new /generate during the drain", json!([h, r, g]));
        let (s, tokens) = self.rt.block_on(long).unwrap_or((0, 0));
        let finished = t0.elapsed();
        self.note("SIGTERM: the request in flight (status, all its tokens)", json!([s, tokens == 1500]));
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = server.child.try_wait().ok().flatten() {
                break Some(st);
            }
            if Instant::now() > end {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let after = t0.elapsed().saturating_sub(finished);
        // The real server exits at the watchdog's next 5 s tick, then joins its schedulers
        // (6.1 s measured here after the request's end); compared coarsely.
        self.note("SIGTERM: exited within 12 s of the request's end", json!(status.is_some() && after <= Duration::from_secs(12)));
        eprintln!("{:?}: exited {:.1} s after the request in flight finished ({status:?})", self.which, after.as_secs_f64());
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Every difference between the simulator's session and the real server's, one sentence each.
/// Metric families: every family the simulator exposes must exist in the real server with the
/// same type (the real server has many more; pdctl's own families are held by the conformance
/// test).
fn differences(sim: &Seen, real: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    let keys: BTreeSet<&String> = sim.keys().chain(real.keys()).collect();
    for k in keys {
        let (s, r) = (sim.get(k).unwrap_or(&Value::Null), real.get(k).unwrap_or(&Value::Null));
        if k == "metrics: families" || k == "metrics: label names" {
            for (name, kind) in s.as_object().into_iter().flatten() {
                match r.get(name) {
                    None => out.push(format!("{k}: the simulator exposes {name}, the real server does not")),
                    Some(rk) if rk != kind && k == "metrics: families" => out.push(format!(
                        "{k}: {name} is a {} in the simulator, a {} in the real server",
                        kind.as_str().unwrap_or("?"),
                        rk.as_str().unwrap_or("?")
                    )),
                    Some(rk) if rk != kind => out.push(format!(
                        "{k}: {name} has labels {} in the simulator, {} in the real server",
                        kind.as_str().unwrap_or("?"),
                        rk.as_str().unwrap_or("?")
                    )),
                    _ => {}
                }
            }
            continue;
        }
        if let (Some(so), Some(ro)) = (s.as_object(), r.as_object()) {
            for (key, rv) in ro {
                match so.get(key) {
                    None => out.push(format!("{k}: the real server has {key} ({rv}), the simulator does not")),
                    Some(sv) if sv != rv => out.push(format!("{k}: {key} is {sv} in the simulator, {rv} in the real server")),
                    _ => {}
                }
            }
            for key in so.keys().filter(|key| !ro.contains_key(*key)) {
                out.push(format!("{k}: the simulator has {key}, the real server does not"));
            }
        } else if s != r {
            out.push(format!("{k}: the simulator {s}, the real server {r}"));
        }
    }
    out
}

#[test]
fn the_simulator_behaves_as_the_real_server_in_one_scripted_session() {
    let real = RealSglang::find().expect("the real server (scripts/setup installs it)");
    let real_seen = Session::new(Which::Real).run(&real);
    let sim_seen = Session::new(Which::Sim).run(&real);
    // What was compared, so that a pass is not a pass over nothing.
    assert!(real_seen.len() >= 30, "{real_seen:#?}");
    assert_eq!(real_seen["auth: POST /generate without the key, with it"], json!([401, 200]), "the real session ran: {real_seen:#?}");
    let mut d = differences(&sim_seen, &real_seen);
    // Differences of this machine, not of the server: a CPU has no accelerator to name.
    d.retain(|l| !l.starts_with("/v1/loads: keys: accelerator is \"string\" in the simulator, \"null\" in the real server"));
    assert!(d.is_empty(), "{} difference(s) between sglang-sim and the real sglang 0.5.23:\n  {}", d.len(), d.join("\n  "));
}

#[test]
fn a_changed_behaviour_is_named() {
    let real: Seen = [
        ("auth: POST /generate without the key, with it".to_string(), json!([401, 200])),
        ("/v1/loads: keys".to_string(), json!({"timestamp": "string", "loads": "array"})),
        ("metrics: families".to_string(), json!({"sglang:num_running_reqs": "gauge", "sglang:x": "counter"})),
        ("metrics: label names".to_string(), json!({"sglang:num_running_reqs": "engine_type,model_name,pp_rank,tp_rank"})),
    ]
    .into_iter()
    .collect();
    assert!(differences(&real, &real).is_empty());
    let mut sim = real.clone();
    sim.insert("auth: POST /generate without the key, with it".into(), json!([200, 200]));
    sim.insert("/v1/loads: keys".into(), json!({"timestamp": "number", "loads": "array", "extra": "bool"}));
    sim.insert("metrics: families".into(), json!({"sglang:num_running_reqs": "counter", "sglang:sim_only": "gauge"}));
    sim.insert("metrics: label names".into(), json!({"sglang:num_running_reqs": "engine_type,model_name,tp_rank"}));
    let d = differences(&sim, &real);
    for named in [
        "metrics: label names: sglang:num_running_reqs has labels engine_type,model_name,tp_rank in the simulator, engine_type,model_name,pp_rank,tp_rank in the real server",
        "auth: POST /generate without the key, with it: the simulator [200,200], the real server [401,200]",
        "/v1/loads: keys: timestamp is \"number\" in the simulator, \"string\" in the real server",
        "/v1/loads: keys: the simulator has extra",
        "metrics: families: sglang:num_running_reqs is a counter",
        "metrics: families: the simulator exposes sglang:sim_only",
    ] {
        assert!(d.iter().any(|l| l.contains(named)), "expected {named:?} in {d:#?}");
    }
    assert_eq!(d.len(), 6, "{d:#?}");
}
