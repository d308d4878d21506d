//! The unit files a stack writes: each worker's (the simulator, or the real SGLang server with
//! its flags on the command line or in a `--config` file) and the gateway's.

use std::path::PathBuf;

use crate::stack::{Pdctld, RouterUnit, Stack, StackOptions, Worker};
use crate::{free_port, workspace_bin, Gateway, RealSglang, Result, SandboxError};

/// `0-3` → `0,1,2,3` (the form `CUDA_VISIBLE_DEVICES` takes).
fn cuda_list(range: &str) -> String {
    match range.split_once('-').map(|(a, b)| (a.parse::<u32>(), b.parse::<u32>())) {
        Some((Ok(a), Ok(b))) if a <= b => (a..=b).map(|i| i.to_string()).collect::<Vec<_>>().join(","),
        _ => range.to_string(),
    }
}

/// Quote one ExecStart argument for systemd.
fn q(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-:=,".contains(c)) {
        s.to_string()
    } else {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// `Environment=` lines of [`StackOptions::decode_env`] for a decode unit (none for others).
fn decode_env(w: &Worker, opts: &StackOptions) -> String {
    let every = if opts.worker_env.is_empty() { String::new() } else { format!("Environment={}\n", opts.worker_env.join(" ")) };
    if w.role != "decode" || opts.decode_env.is_empty() {
        return every;
    }
    format!("{every}Environment={}\n", opts.decode_env.join(" "))
}

/// The unit file of a real `sglang==0.5.23` worker on this CPU. Each flag and variable, and why:
/// - `SGLANG_USE_CPU_ENGINE=1`, `--device cpu --attention-backend torch_native
///   --disable-cuda-graph`: the CPU path that needs no CPU build of sglang-kernel (the default x86
///   backend, `intel_amx`, does); `--max-total-tokens 8192 --mem-fraction-static 0.05`: a small
///   KV pool; `OMP_NUM_THREADS=1`: two servers share two cores; `--sleep-on-idle`: an idle
///   scheduler otherwise busy-polls most of a core;
/// - `--load-format dummy` on the tiny model: random weights, the same in every process, nothing
///   downloaded;
/// - `--disaggregation-transfer-backend mooncake_tcp`: PD over mooncake's TCP transport (no RDMA
///   here); `--disable-overlap-schedule` and, on a decode, `--disaggregation-decode-retraction-backup
///   cpu_tensor`: 0.5.23's PD paths that otherwise call CUDA on a CPU-only machine;
/// - `LD_LIBRARY_PATH` (the stand-in `libcuda.so.1`) and `PYTHONPATH` (`sitecustomize.py`):
///   scripts/setup says why;
/// - `KillMode=mixed`: the stop's SIGTERM reaches the main process only, which drains;
///   `TimeoutStopSec=60`: above a drain (SGLang checks every 5 s; what a stop took here:
///   docs/benchmarks.md, "Figures the code's choices rest on").
pub fn real_worker_unit(r: &RealSglang, w: &Worker, opts: &StackOptions, extra: &[String], config_yaml: Option<&std::path::Path>) -> String {
    let mut args: Vec<String> = vec!["-m".into(), "sglang.launch_server".into()];
    args.extend(r.cpu_flags());
    args.extend(["--port".into(), w.port.to_string(), "--disaggregation-mode".into(), w.role.into()]);
    args.extend(["--disaggregation-transfer-backend".into(), "mooncake_tcp".into()]);
    if w.role != "decode" || opts.decode_metrics {
        args.push("--enable-metrics".into());
    }
    match w.bootstrap_port {
        Some(b) => args.extend(["--disaggregation-bootstrap-port".into(), b.to_string()]),
        None => args.extend(["--disaggregation-decode-retraction-backup".into(), "cpu_tensor".into()]),
    }
    if let Some(k) = &opts.api_key {
        args.extend(["--api-key".into(), k.clone()]);
    }
    if let Some(k) = &opts.admin_api_key {
        args.extend(["--admin-api-key".into(), k.clone()]);
    }
    args.extend(extra.iter().cloned());
    let args = match config_yaml {
        Some(path) => crate::flags_file::flags_to_config(path, w.port, args),
        None => args,
    };
    let exec = std::iter::once(r.python.display().to_string()).chain(args).map(|a| q(&a)).collect::<Vec<_>>().join(" ");
    format!(
        "[Unit]\nDescription=SGLang {role} server (sglang 0.5.23 on the CPU) on GPUs {gpus}\nStartLimitIntervalSec=0\n\n\
         [Service]\nType=simple\nEnvironment=CUDA_VISIBLE_DEVICES={cuda}\n\
         Environment={env}\n\
         Environment=SGLANG_DISAGGREGATION_WAITING_TIMEOUT={waiting} SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT={bootstrap}\n\
         {decode_env}ExecStart={exec}\nRestart={restart}\nRestartSec=1\nTimeoutStartSec=300\nTimeoutStopSec=60\nKillMode={kill_mode}\n",
        decode_env = decode_env(w, opts),
        kill_mode = opts.kill_mode,
        role = w.role,
        gpus = w.gpus,
        cuda = cuda_list(w.gpus),
        env = r.env().iter().map(|(k, v)| q(&format!("{k}={v}"))).collect::<Vec<_>>().join(" "),
        waiting = opts.waiting_timeout_secs,
        bootstrap = opts.bootstrap_timeout_secs,
        restart = opts.restart,
    )
}

impl Stack {
    /// The unit file of a worker: simulated, or the real server ([`StackOptions::server`]).
    pub fn worker_unit(&self, w: &Worker, opts: &StackOptions, extra: &[String]) -> String {
        match &self.real {
            Some(r) => real_worker_unit(r, w, opts, extra, opts.flags_in_config.then(|| self.config_yaml(&w.unit)).as_deref()),
            None => self.sim_worker_unit(w, opts, extra),
        }
    }

    /// The `--config` YAML of a worker ([`StackOptions::flags_in_config`]).
    pub fn config_yaml(&self, unit: &str) -> PathBuf {
        self.sandbox.dir().join("sglang").join(format!("{unit}.yaml"))
    }

    /// The unit file of a simulated worker.
    fn sim_worker_unit(&self, w: &Worker, opts: &StackOptions, extra: &[String]) -> String {
        let model = self.sandbox.dir().join("models/dsv4");
        let mut args: Vec<String> = vec![
            "--model-path".into(),
            model.display().to_string(),
            "--served-model-name".into(),
            "dsv4".into(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            w.port.to_string(),
            "--tp-size".into(),
            "4".into(),
            "--disaggregation-mode".into(),
            w.role.into(),
            "--trust-remote-code".into(),
            "--mem-fraction-static".into(),
            "0.85".into(),
        ];
        if w.role != "decode" || opts.decode_metrics {
            args.push("--enable-metrics".into());
        }
        if let Some(b) = w.bootstrap_port {
            args.push("--disaggregation-bootstrap-port".into());
            args.push(b.to_string());
        }
        if let Some(k) = &opts.api_key {
            args.push("--api-key".into());
            args.push(k.clone());
        }
        if let Some(k) = &opts.admin_api_key {
            args.extend(["--admin-api-key".into(), k.clone()]);
        }
        args.extend(extra.iter().cloned());
        let args = if opts.flags_in_config { crate::flags_file::flags_to_config(&self.config_yaml(&w.unit), w.port, args) } else { args };
        let exec = std::iter::once(self.sim_bin.display().to_string()).chain(args).map(|a| q(&a)).collect::<Vec<_>>().join(" ");
        format!(
            "[Unit]\nDescription=SGLang {role} server (sglang-sim) on GPUs {gpus}\nStartLimitIntervalSec=0\n\n\
             [Service]\nType=simple\nEnvironment=CUDA_VISIBLE_DEVICES={cuda}\n\
             Environment=SGLANG_SIM_LOAD_SECS={load} SGLANG_SIM_WARMUP_SECS={warm}\n\
             Environment=SGLANG_DISAGGREGATION_WAITING_TIMEOUT={waiting} SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT={bootstrap}\n\
             {decode_env}ExecStart={exec}\nRestart={restart}\nRestartSec=1\nTimeoutStopSec={stop}\nKillMode={kill_mode}\n",
            stop = opts.timeout_stop_secs,
            decode_env = decode_env(w, opts),
            kill_mode = opts.kill_mode,
            role = w.role,
            gpus = w.gpus,
            cuda = cuda_list(w.gpus),
            load = opts.load_secs,
            warm = opts.warmup_secs,
            waiting = opts.waiting_timeout_secs,
            bootstrap = opts.bootstrap_timeout_secs,
            restart = opts.restart,
        )
    }

    /// Write gateway `i`'s unit (the first is `sglang-router.service`, then `sglang-router-2`, …)
    /// in front of every worker, and keep its addresses; returns the unit's name.
    pub(crate) fn write_router_unit(&mut self, i: usize, smg: &std::path::Path, opts: &StackOptions) -> Result<String> {
        let (port, mport) = (free_port()?, free_port()?);
        let workers: String = self
            .workers()
            .iter()
            .map(|w| match w.bootstrap_port {
                Some(b) => format!("--prefill {} {b}", w.url),
                None => format!("--decode {}", w.url),
            })
            .collect::<Vec<_>>()
            .join(" ");
        let exec = format!(
            "{} launch --host 127.0.0.1 --port {port} --pd-disaggregation {workers} \
             --prometheus-host 127.0.0.1 --prometheus-port {mport} --health-check-interval-secs {} \
             --worker-startup-timeout-secs {}",
            q(&smg.display().to_string()),
            opts.router_health_interval_secs,
            opts.router_startup_timeout_secs,
        );
        // smg 1.x checks a worker that is still starting only every 30 s by default
        // (`--worker-startup-check-interval`); 0.3.2 uses that flag for its load monitor.
        let exec = match opts.gateway {
            Gateway::Smg113 => format!("{exec} --worker-startup-check-interval 1"),
            Gateway::SglangRouter032 => exec,
        };
        let exec = opts.router_args.iter().fold(exec, |e, a| format!("{e} {}", q(a)));
        let exec = match &opts.api_key {
            Some(k) => format!("{exec} --api-key {}", q(k)),
            None => exec,
        };
        let unit = if i == 0 { "sglang-router.service".to_string() } else { format!("sglang-router-{}.service", i + 1) };
        self.sandbox.write_unit(
            &unit,
            &format!(
                "[Unit]\nDescription=SGLang gateway ({}) in PD mode\nStartLimitIntervalSec=0\n\n\
                 [Service]\nType=simple\nEnvironment=PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NO_COLOR=1\n\
                 ExecStart={exec}\nRestart=no\nTimeoutStopSec=10\n",
                opts.gateway.name()
            ),
        )?;
        let unit_name = unit.clone();
        let r = RouterUnit { unit, url: format!("http://127.0.0.1:{port}"), metrics_url: format!("http://127.0.0.1:{mport}/metrics") };
        if i == 0 {
            self.router = Some(r);
        } else {
            self.extra_routers.push(r);
        }
        Ok(unit_name)
    }
}
impl Stack {
    /// Run `pdctld` as a `Type=notify` unit (`pdctld.service`) of the sandbox's manager, with a
    /// config valid inside the sandbox, its socket and state under `<sandbox>/pdctl/`. Returns
    /// once systemd has the daemon's READY=1 (`systemctl start` waits for it).
    pub fn start_pdctld(&self) -> Result<Pdctld> {
        let bin = workspace_bin("pdctld", "PDCTLD_BIN")?;
        let dir = self.sandbox.dir().join("pdctl");
        let io = |e| SandboxError::Io { what: format!("write {}", dir.display()), source: e };
        std::fs::create_dir_all(dir.join("config.d")).map_err(io)?;
        let config = dir.join("inside.toml");
        std::fs::write(&config, self.config_text(true)).map_err(io)?;
        // Both configs live in <sandbox>/pdctl/, so fragments in its config.d/ apply to both.
        let socket = dir.join("pdctl.sock");
        let state = dir.join("state");
        let metrics_port = free_port()?;
        self.sandbox.write_unit(
            "pdctld.service",
            &format!(
                "[Unit]\nDescription=pdctl daemon (sandbox)\nStartLimitIntervalSec=0\n\n[Service]\nType=notify\nNotifyAccess=main\n\
                 Environment=DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/0/bus PDCTL_LOG=info\n\
                 ExecStart={} --config {} --socket {} --state-dir {} --metrics-listen 127.0.0.1:{metrics_port}\n\
                 WatchdogSec=30\nTimeoutStartSec=30\nRestart=no\n",
                q(&bin.display().to_string()),
                q(&config.display().to_string()),
                q(&socket.display().to_string()),
                q(&state.display().to_string()),
            ),
        )?;
        self.sandbox.daemon_reload()?;
        self.sandbox.systemctl(&["start", "pdctld.service"])?;
        Ok(Pdctld { unit: "pdctld.service".into(), socket, state, config, metrics_url: format!("http://127.0.0.1:{metrics_port}/metrics") })
    }
}
