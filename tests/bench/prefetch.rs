//! Benchmark (prints figures; asserts nothing on time): new weights read before anyone stops.
//! On the real sglang 0.5.23 on this CPU, 1P1D behind smg 1.13, with a model of several GB
//! (`scripts/real-sglang/make_model.py DIR SEED GIB`: two checkpoints of the same model, A and
//! B, in 1 GiB shards), each case with the new checkpoint's files dropped from the page cache
//! first (`dd iflag=nocache count=0`, POSIX_FADV_DONTNEED, per file), cold (`[rollout]
//! prefetch_weights = false`) against read ahead (the default), taking turns:
//! - a restart onto the other checkpoint (`single_pair = "together"`): each worker's start, from
//!   its restart to its ready line (the `ready` step's `since_restart_ms`), and the read itself
//!   (the `prefetch` step, before anyone stopped);
//! - the other checkpoint loaded in place (`pdctl rollout weights`): the pause (`paused_ms`,
//!   every request waits through it) and the load (`load_ms`).
//!
//! `scripts/bench-prefetch [GIB] [RUNS]`: default 3 GiB, 3 runs; the checkpoints are kept in
//! `/var/tmp/pdctl-bench-models/GIB` and made once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pdctl_sandbox::stack::{Server, Stack, StackOptions};
use pdctl_sandbox::{Gateway, RealSglang};
use serde_json::Value;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";

/// The checkpoint `seed` of about `gib` GiB, made once.
fn checkpoint(r: &RealSglang, gib: f64, seed: u32) -> PathBuf {
    let dir = PathBuf::from(format!("/var/tmp/pdctl-bench-models/{gib}/{}", if seed == 0 { "a" } else { "b" }));
    if !dir.join("model.safetensors.index.json").exists() {
        println!("making {} ({gib} GiB of random weights)", dir.display());
        let script = pdctl_sandbox::repo_root().join("scripts/real-sglang/make_model.py");
        let st = std::process::Command::new(&r.python).arg(script).arg(&dir).arg(seed.to_string()).arg(gib.to_string()).status().expect("python");
        assert!(st.success(), "make_model.py failed");
    }
    dir
}

/// Drop `dir`'s files from the page cache.
fn evict(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("list").flatten() {
        let st =
            std::process::Command::new("dd").arg(format!("if={}", e.path().display())).args(["iflag=nocache", "count=0", "status=none"]).status().expect("dd");
        assert!(st.success(), "dd iflag=nocache {}", e.path().display());
    }
}

/// `pdctl ARGS --json` against the stack's pdctld: its events and last line; on a failure, the
/// units' and the gateway's last journal lines are printed before the panic.
fn pdctl(stack: &Stack, config: &Path, socket: &Path, args: &[&str]) -> (Vec<Value>, Value) {
    let bin = pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl");
    let out = std::process::Command::new(bin).args(args).arg("--json").arg("--config").arg(config).arg("--socket").arg(socket).output().expect("pdctl");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let last = lines.last().cloned().unwrap_or_default();
    if last["result"] != "succeeded" {
        for args in [&["-u", D, "-n", "80"][..], &["-u", P, "-n", "40"][..], &["-p", "warning", "-n", "40"][..]] {
            if let Ok(j) = stack.sandbox.journalctl(&[&["--no-pager", "-o", "short-precise"][..], args].concat()) {
                println!("{}", String::from_utf8_lossy(&j.stdout));
            }
        }
    }
    assert_eq!(last["result"], "succeeded", "{last:#}\n{}", String::from_utf8_lossy(&out.stderr));
    (lines, last)
}

fn passed<'a>(events: &'a [Value], unit: &str, step: &str) -> Option<&'a Value> {
    events.iter().find(|e| e["unit"] == unit && e["step"] == step && e["status"] == "passed")
}

fn secs(ms: Option<u64>) -> String {
    ms.map(|m| format!("{:.1} s", m as f64 / 1000.0)).unwrap_or_else(|| "-".into())
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// The 1P1D stack on checkpoint `model`, both workers admitted by the gateway.
fn boot(model: &str, fraction: &[String]) -> (Stack, StackOptions) {
    // The stack's `--mem-fraction-static 0.05` suits the tiny model; SGLang refuses to start when
    // the loaded weights leave nothing of that fraction for the KV cache ("Raise
    // --mem-fraction-static above 0.334" for 3 GiB here, more for the second server, which
    // measures what the first left). The pool stays capped by `--max-total-tokens`.
    let model_args: Vec<String> = ["--model-path".to_string(), model.to_string()].into_iter().chain(fraction.iter().cloned()).collect();
    // The sandbox's 3 s / 8 s PD timeouts suit the tiny model; this one's prefill and KV
    // hand-off take longer on this CPU (measured: every decode gave up after 3.0 s "in
    // KVPoll"), so SGLang's own order of magnitude.
    let opts = StackOptions {
        server: Server::Real,
        gateway: Gateway::Smg113,
        prefill_args: model_args.clone(),
        decode_args: model_args,
        waiting_timeout_secs: 120.0,
        bootstrap_timeout_secs: 120.0,
        ..StackOptions::default()
    };
    let stack = Stack::boot(&opts).expect("stack");
    stack.wait_ready(Duration::from_secs(600)).expect("ready");
    stack.wait_router_healthy(2, Duration::from_secs(120)).expect("router admits both");
    (stack, opts)
}

fn main() {
    let gib: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let runs: usize = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    let real = RealSglang::find().expect("the real server: scripts/setup installs it");
    let models = [checkpoint(&real, gib, 0), checkpoint(&real, gib, 1)];
    let size: u64 = std::fs::read_dir(&models[0]).expect("list").flatten().map(|e| e.metadata().map(|m| m.len()).unwrap_or(0)).sum();
    println!(
        "pdctl prefetch benchmark: the real sglang 0.5.23, 1P1D behind smg 1.13, a checkpoint of {:.2} GiB, {runs} run(s) of each case",
        size as f64 / (1u64 << 30) as f64
    );
    let path = |i: usize| models[i % 2].display().to_string();
    let fraction = ["--mem-fraction-static".to_string(), "0.7".to_string()];
    let (stack, opts) = boot(&path(0), &fraction);
    let config = stack.write_pdctl_config().expect("config");
    let dir = config.parent().expect("dir").join("config.d");
    std::fs::write(
        dir.join("90-bench.toml"),
        "[rollout]\nsingle_pair = \"together\"\nallow_outage = true\nmin_healthy = \"2s\"\nready_timeout = \"10m\"\n[verify]\nmetrics = \"off\"\n",
    )
    .expect("fragment");
    // The servers run checkpoint `at` (0: A, 1: B).
    let mut at = 0usize;
    let mut figures: std::collections::BTreeMap<(&str, &str), Vec<u64>> = std::collections::BTreeMap::new();
    for run in 1..=runs {
        for (mode, on) in [("cold", false), ("read ahead", true)] {
            std::fs::write(dir.join("95-prefetch.toml"), format!("[rollout]\nprefetch_weights = {on}\n")).expect("fragment");
            // pdctld runs with one config: started again with the mode (not there the first time).
            let _ = stack.sandbox.systemctl(&["stop", "pdctld.service"]);
            let daemon = stack.start_pdctld().expect("pdctld, with the mode");
            // A restart onto the other checkpoint.
            let to = path(at + 1);
            evict(Path::new(&to));
            for (unit, w) in [(P, &stack.prefill), (D, &stack.decode)] {
                let args: Vec<String> = ["--model-path".to_string(), to.clone()].into_iter().chain(fraction.clone()).collect();
                let exec = stack.worker_unit(w, &opts, &args);
                let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
                stack.drop_in(unit, "50-bench-model", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
            }
            let (ev, _) = pdctl(&stack, &config, &daemon.socket, &["restart", "--rolling", "--load-changes"]);
            at += 1;
            let start = |u: &str| passed(&ev, u, "ready").and_then(|e| e["detail"]["since_restart_ms"].as_u64());
            let read = ev.iter().find(|e| e["step"] == "prefetch" && e["status"] == "passed").and_then(|e| e["elapsed_ms"].as_u64());
            println!(
                "run {run} {mode:<10} restart onto {to}: start to the ready line: prefill {}, decode {}; read ahead before anyone stopped: {}",
                secs(start(P)),
                secs(start(D)),
                secs(read)
            );
            for (k, v) in [("restart: prefill's start", start(P)), ("restart: decode's start", start(D)), ("restart: the read ahead", read)] {
                figures.entry((mode, k)).or_default().extend(v);
            }
            // The other checkpoint loaded in place.
            let to = path(at + 1);
            evict(Path::new(&to));
            let (ev, _) = pdctl(&stack, &config, &daemon.socket, &["rollout", "weights", "--model-path", &to, "--version", &format!("v{at}")]);
            at += 1;
            let w = ev.iter().find(|e| e["step"] == "weights" && e["status"] == "passed").map(|e| e["detail"].clone()).unwrap_or_default();
            let read = ev.iter().find(|e| e["step"] == "prefetch" && e["status"] == "passed").and_then(|e| e["elapsed_ms"].as_u64());
            println!(
                "run {run} {mode:<10} in place onto {to}: pause {}, load {}; read ahead before the pause: {}",
                secs(w["paused_ms"].as_u64()),
                secs(w["load_ms"].as_u64()),
                secs(read)
            );
            for (k, v) in [("in place: the pause", w["paused_ms"].as_u64()), ("in place: the load", w["load_ms"].as_u64()), ("in place: the read ahead", read)]
            {
                figures.entry((mode, k)).or_default().extend(v);
            }
        }
    }
    print_table(&figures, runs);
}

/// The medians, cold against read ahead, as one markdown table.
fn print_table(figures: &std::collections::BTreeMap<(&str, &str), Vec<u64>>, runs: usize) {
    println!();
    println!("median of {runs} (cold: prefetch_weights = false; both with the checkpoint out of the page cache first)");
    println!("| figure | cold | read ahead | read ahead / cold |");
    println!("|---|---|---|---|");
    for k in [
        "restart: prefill's start",
        "restart: decode's start",
        "restart: the read ahead",
        "in place: the pause",
        "in place: the load",
        "in place: the read ahead",
    ] {
        let cold = figures.get(&("cold", k)).cloned().and_then(median);
        let ahead = figures.get(&("read ahead", k)).cloned().and_then(median);
        let ratio = match (cold, ahead) {
            (Some(c), Some(a)) if c > 0 => format!("{:.2}×", a as f64 / c as f64),
            _ => "-".into(),
        };
        println!("| {k} | {} | {} | {ratio} |", secs(cold), secs(ahead));
    }
}
