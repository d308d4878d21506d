//! The 1P1D stack of the design, placed in a sandbox: a prefill and a decode `sglang-sim` as
//! systemd units (`CUDA_VISIBLE_DEVICES` 0-3 / 4-7) and the real SGLang router in PD mode as a
//! third unit.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::journal::field;

use crate::{free_port, router_bin, workspace_bin, Gateway, RealSglang, Result, Sandbox, SandboxError};

/// SGLang's ready line.
pub const READY_LINE: &str = "The server is fired up and ready to roll!";

/// Which SGLang server the worker units run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `sglang-sim` (fast; every scenario and fault).
    Sim,
    /// The released `sglang==0.5.23` on this CPU ([`RealSglang`]): a tiny model, PD over
    /// mooncake's TCP transport, ~3 GB of memory and 15-30 s to its ready line per server.
    Real,
}

/// What to vary in the stack.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Which server the workers run (`Sim` unless a test asks for the real one).
    pub server: Server,
    /// `KillMode=` of the worker units: `mixed` (SIGTERM to the main process only: SGLang
    /// drains), or systemd's default `control-group` to show what that does.
    pub kill_mode: &'static str,
    /// `TimeoutStopSec=` of the simulated worker units (10 s by default).
    pub timeout_stop_secs: u32,
    /// A `config.json` for the simulated model directory (e.g. a DeepSeek-V4 architecture,
    /// whose page size SGLang 0.5.23 resolves to 256 whatever `--page-size` says).
    pub model_config: Option<String>,
    /// Files written into the model directory before the servers start (name, contents): a
    /// tokenizer's files, for a test of which tokenizer a path resolves to.
    pub model_files: Vec<(String, String)>,
    /// Extra `sglang-sim` flags for the prefill unit (e.g. `--sim-version 0.5.6`).
    pub prefill_args: Vec<String>,
    /// Extra `sglang-sim` flags for the decode unit.
    pub decode_args: Vec<String>,
    /// Simulated load time (port closed) in seconds.
    pub load_secs: f64,
    /// Simulated warmup time (`/health` 503) in seconds.
    pub warmup_secs: f64,
    /// Start the real router as a unit too.
    pub router: bool,
    /// Which generation of the gateway.
    pub gateway: Gateway,
    /// The router's `--health-check-interval-secs`.
    pub router_health_interval_secs: u32,
    /// The router's `--worker-startup-timeout-secs`: how long it retries a worker that is down
    /// when it starts (after that, sglang-router 0.3.2 never contacts it again).
    pub router_startup_timeout_secs: u32,
    /// `Restart=` of the worker units.
    pub restart: String,
    /// Launch the decode worker with `--enable-metrics`.
    pub decode_metrics: bool,
    /// Extra flags for the gateway's `smg launch`.
    pub router_args: Vec<String>,
    /// `SGLANG_DISAGGREGATION_WAITING_TIMEOUT` of the workers (upstream default 300 s): how long
    /// a decode waits for a room's KV before failing the request.
    pub waiting_timeout_secs: f64,
    /// `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT` of the workers (upstream default 300 s): how
    /// long a prefill holds a room's KV for a decode that does not fetch it.
    pub bootstrap_timeout_secs: f64,
    /// Gateway replicas in front of the same workers (1, or 2: `sglang-router-2.service`).
    pub routers: usize,
    /// Prefill/decode pairs: 1 (the 8-GPU 1P1D layout, GPUs 0-3 / 4-7) or 2 (2P2D: 0-1, 2-3 /
    /// 4-5, 6-7; the second pair's units are `…-prefill-2.service`, `…-decode-2.service`).
    pub pairs: usize,
    /// Every worker runs with SGLang's `--api-key KEY`, and the gateway with smg's `--api-key
    /// KEY` (its worker key, which also guards the gateway itself); pdctl's config names a key
    /// file holding it ([`Stack::key_file`]) for each worker and the gateway.
    pub api_key: Option<String>,
    /// Every worker also runs with SGLang's `--admin-api-key KEY` (its admin routes — pause,
    /// continue, weight updates, flush, abort — take it instead of the API key); pdctl's config
    /// names a file holding it ([`Stack::admin_key_file`]).
    pub admin_api_key: Option<String>,
    /// More `KEY=value` environment of the decode units (e.g. SGLang's heartbeat settings).
    pub decode_env: Vec<String>,
    /// More `KEY=value` environment of every worker unit (e.g. `SGLANG_HEALTH_CHECK_TIMEOUT`).
    pub worker_env: Vec<String>,
    /// Each worker keeps its flags in a YAML file (`<sandbox>/sglang/<unit>.yaml`) and its
    /// ExecStart is the program with `--config FILE` and its `--port` ([`Stack::config_yaml`]).
    pub flags_in_config: bool,
    /// Every worker runs with `--enable-pd-role-switch` (and `--disable-cuda-graph`: a flip to
    /// decode then captures no graphs), a decode with its own `--disaggregation-bootstrap-port`
    /// (with the flag every PD server runs its bootstrap server): `pdctl role set` can switch any
    /// of them at run time.
    pub role_switch: bool,
    /// With `role_switch`: the servers capture CUDA graphs (no `--disable-cuda-graph`), so a flip
    /// to decode needs their footprint, measured on a serving decode.
    pub cuda_graphs: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            server: Server::Sim,
            kill_mode: "mixed",
            timeout_stop_secs: 10,
            model_config: None,
            model_files: Vec::new(),
            prefill_args: Vec::new(),
            decode_args: Vec::new(),
            load_secs: 1.5,
            warmup_secs: 0.5,
            router: true,
            gateway: Gateway::from_env(),
            router_health_interval_secs: 1,
            router_startup_timeout_secs: 300,
            restart: "no".into(),
            decode_metrics: true,
            pairs: 1,
            router_args: Vec::new(),
            routers: 1,
            waiting_timeout_secs: 3.0,
            bootstrap_timeout_secs: 8.0,
            api_key: None,
            admin_api_key: None,
            decode_env: Vec::new(),
            flags_in_config: false,
            role_switch: false,
            cuda_graphs: false,
            worker_env: Vec::new(),
        }
    }
}

/// One simulated SGLang worker unit.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Unit name, e.g. `sglang-dsv4-prefill.service`.
    pub unit: String,
    /// `prefill` or `decode`.
    pub role: &'static str,
    /// HTTP port.
    pub port: u16,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Bootstrap port (prefill only).
    pub bootstrap_port: Option<u16>,
    /// `CUDA_VISIBLE_DEVICES` of the unit.
    pub gpus: &'static str,
}

/// The router unit.
#[derive(Debug, Clone)]
pub struct RouterUnit {
    /// Unit name.
    pub unit: String,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `http://127.0.0.1:PORT/metrics` (its Prometheus endpoint).
    pub metrics_url: String,
}

/// pdctld running as a unit of the sandbox.
#[derive(Debug, Clone)]
pub struct Pdctld {
    /// `pdctld.service`.
    pub unit: String,
    /// Its control socket (a host path).
    pub socket: PathBuf,
    /// Its state directory.
    pub state: PathBuf,
    /// The config it reads (the inside view); fragments in `config.d/` next to it are shared
    /// with [`Stack::write_pdctl_config`]'s file.
    pub config: PathBuf,
    /// Its metrics endpoint.
    pub metrics_url: String,
}

/// A sandbox with the 1P1D stack's units written and started.
#[derive(Debug)]
pub struct Stack {
    /// The sandbox (dropping the stack tears it down).
    pub sandbox: Sandbox,
    /// The prefill worker.
    pub prefill: Worker,
    /// The decode worker.
    pub decode: Worker,
    /// The second pair's workers (2P2D), prefill first.
    pub extra: Vec<Worker>,
    /// The router, if started.
    pub router: Option<RouterUnit>,
    /// More gateway replicas (`StackOptions::routers` > 1).
    pub extra_routers: Vec<RouterUnit>,
    /// The simulator binary the units run.
    pub sim_bin: PathBuf,
    /// The API key of the workers and the gateway ([`StackOptions::api_key`]).
    pub api_key: Option<String>,
    /// The workers' admin key ([`StackOptions::admin_api_key`]).
    pub admin_api_key: Option<String>,
    /// The real SGLang server the workers run (`None`: `sglang-sim`).
    pub real: Option<RealSglang>,
}

impl Stack {
    /// Boot a sandbox, write the units and start them (without waiting for readiness).
    pub fn boot(opts: &StackOptions) -> Result<Stack> {
        let sim_bin = workspace_bin("sglang-sim", "PDCTL_SIM_BIN")?;
        let smg = if opts.router { Some(router_bin(opts.gateway)?) } else { None };
        let real = match opts.server {
            Server::Real => Some(RealSglang::find()?),
            Server::Sim => None,
        };
        let sandbox = Sandbox::start()?;
        let model_dir = sandbox.dir().join("models/dsv4");
        std::fs::create_dir_all(&model_dir).map_err(|e| SandboxError::Io { what: "create the model directory".into(), source: e })?;
        for (name, contents) in &opts.model_files {
            std::fs::write(model_dir.join(name), contents).map_err(|e| SandboxError::Io { what: format!("write the model's {name}"), source: e })?;
        }
        if let Some(c) = &opts.model_config {
            std::fs::write(model_dir.join("config.json"), c).map_err(|e| SandboxError::Io { what: "write the model's config.json".into(), source: e })?;
        }
        let two = opts.pairs >= 2;
        let worker = |unit: &str, role: &'static str, gpus: &'static str| -> Result<Worker> {
            let port = free_port()?;
            let bootstrap_port = if role == "prefill" { Some(free_port()?) } else { None };
            Ok(Worker { unit: unit.into(), role, port, url: format!("http://127.0.0.1:{port}"), bootstrap_port, gpus })
        };
        let prefill = worker("sglang-dsv4-prefill.service", "prefill", if two { "0-1" } else { "0-3" })?;
        let decode = worker("sglang-dsv4-decode.service", "decode", if two { "4-5" } else { "4-7" })?;
        let extra = if two {
            vec![worker("sglang-dsv4-prefill-2.service", "prefill", "2-3")?, worker("sglang-dsv4-decode-2.service", "decode", "6-7")?]
        } else {
            vec![]
        };
        let mut stack = Stack {
            sandbox,
            prefill,
            decode,
            extra,
            router: None,
            extra_routers: Vec::new(),
            sim_bin,
            api_key: opts.api_key.clone(),
            admin_api_key: opts.admin_api_key.clone(),
            real,
        };
        let mut units = Vec::new();
        for w in stack.workers() {
            let mut args = if w.role == "prefill" { opts.prefill_args.clone() } else { opts.decode_args.clone() };
            if opts.role_switch {
                args.push("--enable-pd-role-switch".to_string());
                if !opts.cuda_graphs {
                    args.push("--disable-cuda-graph".to_string());
                }
                if w.bootstrap_port.is_none() {
                    args.extend(["--disaggregation-bootstrap-port".to_string(), free_port()?.to_string()]);
                }
            }
            stack.sandbox.write_unit(&w.unit, &stack.worker_unit(w, opts, &args))?;
            units.push(w.unit.clone());
        }
        if let Some(smg) = smg {
            for i in 0..opts.routers.max(1) {
                units.push(stack.write_router_unit(i, &smg, opts)?);
            }
        }
        stack.sandbox.daemon_reload()?;
        let mut args = vec!["start", "--no-block"];
        args.extend(units.iter().map(String::as_str));
        stack.sandbox.systemctl(&args)?;
        Ok(stack)
    }

    /// A pdctl config for this stack as seen from outside the sandbox (its bus, journal and
    /// procfs through `/proc/PID/root`; the router; both workers; short timeouts fit for tests and
    /// the demo).
    pub fn pdctl_config(&self) -> String {
        self.config_text(false)
    }

    pub(crate) fn config_text(&self, inside: bool) -> String {
        let sb = &self.sandbox;
        let mut t = if inside {
            "# pdctl config for pdctld running inside the sandbox (written by pdctl-sandbox)\n[systemd]\nbus = \"user\"\n\n".to_string()
        } else {
            format!(
                "# pdctl config for a sandboxed 1P1D stack (written by pdctl-sandbox)\n\
             [systemd]\naddress = \"{}\"\n\n[journal]\ndirectory = \"{}\"\nprocfs = \"{}\"\n\n",
                sb.bus_address(),
                sb.journal_dir().display(),
                sb.root().join("proc").display()
            )
        };
        if let Some(r) = &self.router {
            if self.extra_routers.is_empty() {
                t.push_str(&format!("[router]\nurl = \"{}\"\nmetrics_url = \"{}\"\n", r.url, r.metrics_url));
                if self.api_key.is_some() {
                    t.push_str(&format!("api_key_file = \"{}\"\n", self.key_file().display()));
                }
                t.push('\n');
            } else {
                let all: Vec<&RouterUnit> = std::iter::once(r).chain(&self.extra_routers).collect();
                let list = |f: &dyn Fn(&RouterUnit) -> String| all.iter().map(|x| format!("\"{}\"", f(x))).collect::<Vec<_>>().join(", ");
                t.push_str(&format!("[router]\nurl = [{}]\nmetrics_url = [{}]\n\n", list(&|x| x.url.clone()), list(&|x| x.metrics_url.clone())));
            }
        }
        for w in self.workers() {
            t.push_str(&format!("[[worker]]\nunit = \"{}\"\nrole = \"{}\"\nurl = \"{}\"\n", w.unit, w.role, w.url));
            if let Some(b) = w.bootstrap_port {
                t.push_str(&format!("bootstrap_port = {b}\n"));
            }
            if self.api_key.is_some() {
                t.push_str(&format!("api_key_file = \"{}\"\n", self.key_file().display()));
            }
            if self.admin_api_key.is_some() {
                t.push_str(&format!("admin_api_key_file = \"{}\"\n", self.admin_key_file().display()));
            }
            t.push_str(&format!("gpus = \"{}\"\n\n", w.gpus));
        }
        // The real server on this CPU: 15-30 s to its ready line (imports), longer under load.
        let ready_timeout = if self.real.is_some() { "240s" } else { "60s" };
        t.push_str(&format!("[rollout]\nready_timeout = \"{ready_timeout}\"\n"));
        t.push_str(
            "order = [\"prefill\", \"decode\"]\nhealth_timeout = \"30s\"\n\
             router_timeout = \"30s\"\nmetrics_timeout = \"40s\"\nmin_healthy = \"3s\"\ndrain_timeout = \"10s\"\n\
             # 1P1D: each restart interrupts serving (no other worker of its role); accepted here\n\
             allow_outage = true\n\n\
             [verify]\nmetrics = \"required\"\nsmoke_request = true\n",
        );
        t
    }

    /// Where pdctl's config says the API key is (`<sandbox>/pdctl/api.key`, written with mode
    /// 0600 by [`Stack::write_pdctl_config`] when the stack has a key).
    pub fn key_file(&self) -> PathBuf {
        self.sandbox.dir().join("pdctl/api.key")
    }

    /// Where pdctl's config says the admin key is (`<sandbox>/pdctl/admin.key`, mode 0600).
    pub fn admin_key_file(&self) -> PathBuf {
        self.sandbox.dir().join("pdctl/admin.key")
    }

    /// Write [`Stack::pdctl_config`] to `<sandbox>/pdctl/pdctl.toml` (fragments may go in
    /// `<sandbox>/pdctl/config.d/`) and return its path.
    pub fn write_pdctl_config(&self) -> Result<PathBuf> {
        let dir = self.sandbox.dir().join("pdctl");
        let io = |e| SandboxError::Io { what: format!("write {}", dir.display()), source: e };
        std::fs::create_dir_all(dir.join("config.d")).map_err(io)?;
        for (key, file) in [(&self.api_key, self.key_file()), (&self.admin_api_key, self.admin_key_file())] {
            if let Some(k) = key {
                use std::os::unix::fs::OpenOptionsExt as _;
                let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(file).map_err(io)?;
                std::io::Write::write_all(&mut f, format!("{k}\n").as_bytes()).map_err(io)?;
            }
        }
        let p = dir.join("pdctl.toml");
        std::fs::write(&p, self.pdctl_config()).map_err(io)?;
        Ok(p)
    }

    /// Add a drop-in `<unit>.d/<name>.conf` and daemon-reload. (Measured on systemd 252: a new
    /// drop-in does not set `NeedDaemonReload`, so nothing would notice it otherwise.)
    pub fn drop_in(&self, unit: &str, name: &str, contents: &str) -> Result<PathBuf> {
        let dir = self.sandbox.unit_dir().join(format!("{unit}.d"));
        let io = |e| SandboxError::Io { what: format!("write a drop-in in {}", dir.display()), source: e };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let p = dir.join(format!("{name}.conf"));
        std::fs::write(&p, contents).map_err(io)?;
        self.sandbox.daemon_reload()?;
        Ok(p)
    }

    /// Append lines to the `[Service]` section of a unit file (the last section), without
    /// reloading: the manager then reports `NeedDaemonReload`.
    pub fn append_to_unit(&self, unit: &str, lines: &str) -> Result<()> {
        let p = self.sandbox.unit_dir().join(unit);
        let io = |e| SandboxError::Io { what: format!("edit {}", p.display()), source: e };
        let mut text = std::fs::read_to_string(&p).map_err(io)?;
        text.push_str(lines);
        std::fs::write(&p, text).map_err(io)
    }

    /// A unit property (`systemctl --user show -p NAME --value UNIT`).
    pub fn show(&self, unit: &str, prop: &str) -> Result<String> {
        let out = self.sandbox.systemctl(&["show", "-p", prop, "--value", unit])?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Every worker: the prefills, then the decodes (the order of a rollout).
    pub fn workers(&self) -> Vec<&Worker> {
        let mut out = vec![&self.prefill];
        out.extend(self.extra.iter().filter(|w| w.role == "prefill"));
        out.push(&self.decode);
        out.extend(self.extra.iter().filter(|w| w.role == "decode"));
        out
    }

    /// Wait until the router lists `n` workers as healthy (`GET /workers`, `is_healthy`), at most
    /// `deadline`; returns how many it listed healthy at the end. The router admits workers in the
    /// background after they start, so tests and the demo wait for this before acting.
    pub fn wait_router_healthy(&self, n: usize, deadline: Duration) -> Result<usize> {
        let Some(r) = &self.router else {
            return Ok(0);
        };
        let end = Instant::now() + deadline;
        let mut healthy = 0;
        while Instant::now() < end {
            healthy = http_get_with(&format!("{}/workers", r.url), self.api_key.as_deref())
                .ok()
                .filter(|(status, _)| *status == 200)
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                .and_then(|v| {
                    v["workers"].as_array().map(|l| l.iter().filter(|w| w["is_healthy"] == true && (w["status"].is_null() || w["status"] == "ready")).count())
                })
                .unwrap_or(0);
            if healthy >= n {
                return Ok(healthy);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(SandboxError::Boot(format!("the router listed {healthy} of {n} workers healthy within {deadline:?}")))
    }

    /// Wait until journald has both workers' ready lines (from their current processes), at most
    /// `deadline`. Returns the two entries, prefill first.
    pub fn wait_ready(&self, deadline: Duration) -> Result<Vec<serde_json::Value>> {
        let mut out = Vec::new();
        for w in self.workers() {
            let mut f = self.sandbox.follow_journal(&[&format!("_SYSTEMD_UNIT={}", w.unit)])?;
            let entry = f
                .wait_for(deadline, |e| field(e, "MESSAGE").is_some_and(|m| m.contains(READY_LINE)))
                .ok_or_else(|| SandboxError::Boot(format!("{} logged no ready line within {deadline:?}", w.unit)))?;
            out.push(entry);
        }
        Ok(out)
    }
}

/// A blocking `GET` of a loopback `http://HOST:PORT/path` URL (HTTP/1.0, 5 s timeouts): status and
/// body. For the harness's own checks of the router, without an async client.
pub fn http_get(url: &str) -> Result<(u16, String)> {
    http_get_with(url, None)
}

/// [`http_get`] with `Authorization: Bearer KEY` when a key is given.
pub fn http_get_with(url: &str, key: Option<&str>) -> Result<(u16, String)> {
    let fail = |detail: String| SandboxError::Command { cmd: format!("GET {url}"), detail };
    let rest = url.strip_prefix("http://").ok_or_else(|| fail("only http:// URLs".into()))?;
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let addr = host.parse::<std::net::SocketAddr>().map_err(|e| fail(format!("{host} is not an address: {e}")))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| fail(e.to_string()))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| fail(e.to_string()))?;
    s.set_write_timeout(Some(Duration::from_secs(5))).map_err(|e| fail(e.to_string()))?;
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n").as_bytes()).map_err(|e| fail(e.to_string()))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| fail("no HTTP header".into()))?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| fail(format!("bad status line {:?}", head.lines().next())))?;
    Ok((status, body.to_string()))
}
