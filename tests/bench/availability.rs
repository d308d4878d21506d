//! Benchmark (prints figures; asserts nothing on time): what clients see during a rollout.
//! Under a steady load through the real router (its own client, independent of pdctl's probe),
//! the failed requests and the longest error window for:
//! - 1P1D: pdctl sequential, pdctl `single_pair = "together"`, the seed's procedure (restart both
//!   units at once, then poll `journalctl --since "2 min ago"` every 20 s for the ready lines);
//! - 2P2D: pdctl (sequential) and the seed's procedure;
//!
//! each behind both gateway generations (smg 1.13.0, sglang-router 0.3.2).
//!
//!     scripts/bench-availability [RATE_PER_S] [ONLY] [RUNS]
//!         (default 10; ONLY: run only the cases whose "gateway layout procedure" contains it,
//!         e.g. "smg 1.13.0 1P1D together"; RUNS: each case that many times, the cases taking
//!         turns so that a slow spell of the machine falls on all of them, and the ratios use
//!         each case's median — the seed's window alone varies 4.6-8.1 s run to run;
//!         LOAD_SECS: the simulated servers' weight load, 1.5 s by default — past 10 s a restarted
//!         prefill is gone long enough for a decode's heartbeat, 2 missed checks 5 s apart, to drop
//!         its cached entry, as with a real 60-80 s start;
//!         REAL=1: the workers are the real sglang 0.5.23 on this CPU instead of the simulator —
//!         docs/real-sglang.md; its start takes 15-30 s, so LOAD_SECS does not apply)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pdctl_sandbox::stack::{Stack, StackOptions, READY_LINE};
use pdctl_sandbox::Gateway;

#[derive(Default)]
struct Load {
    sent: u64,
    failed: u64,
    longest: Duration,
    bad_since: Option<Instant>,
}

/// Send `rate` requests per second through the router until `stop`; count what clients saw.
fn load(url: String, rate: f64, stop: Arc<AtomicBool>, out: Arc<Mutex<Load>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let c = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let at = Instant::now();
                let ok = c
                    .post(&url)
                    .json(&serde_json::json!({"text": "bench", "sampling_params": {"max_new_tokens": 4}}))
                    .send()
                    .await
                    .map(|r| r.status() == 200)
                    .unwrap_or(false);
                let mut l = out.lock().unwrap_or_else(|p| p.into_inner());
                l.sent += 1;
                match (ok, l.bad_since) {
                    (false, None) => {
                        l.failed += 1;
                        l.bad_since = Some(at);
                    }
                    (false, Some(_)) => l.failed += 1,
                    (true, Some(t)) => {
                        l.longest = l.longest.max(at.duration_since(t));
                        l.bad_since = None;
                    }
                    (true, None) => {}
                }
            }
        });
    })
}

#[derive(Clone, Copy, Debug)]
enum Procedure {
    Sequential,
    Together,
    Seed,
}

/// The seed's procedure: every unit restarted at once, then every 20 s `journalctl --since "2 min
/// ago" | grep ready` until each unit shows one (at most 180 s).
fn seed_procedure(stack: &Stack) {
    let units: Vec<String> = stack.workers().iter().map(|w| w.unit.clone()).collect();
    let mut args = vec!["restart".to_string()];
    args.extend(units.iter().cloned());
    stack.sandbox.systemctl(&args.iter().map(String::as_str).collect::<Vec<_>>()).expect("restart all");
    let restarted = std::time::SystemTime::now();
    loop {
        std::thread::sleep(Duration::from_secs(20));
        let out = stack.sandbox.journalctl(&["--since", "2 min ago", "-o", "cat"]).expect("journalctl");
        let text = String::from_utf8_lossy(&out.stdout);
        if text.matches(READY_LINE).count() >= 2 * units.len() || restarted.elapsed().unwrap_or_default() > Duration::from_secs(180) {
            break;
        }
    }
}

fn run(gateway: Gateway, pairs: usize, how: Procedure, rate: f64, load_secs: Option<f64>) -> (String, (f64, f64)) {
    let defaults = StackOptions::default();
    let real = std::env::var("REAL").is_ok_and(|v| v == "1");
    let server = if real { pdctl_sandbox::stack::Server::Real } else { pdctl_sandbox::stack::Server::Sim };
    let opts = StackOptions { gateway, pairs, server, load_secs: load_secs.unwrap_or(defaults.load_secs), ..defaults };
    let stack = Stack::boot(&opts).expect("stack");
    stack.wait_ready(Duration::from_secs(if real { 300 } else { 60 })).expect("ready");
    stack.wait_router_healthy(stack.workers().len(), Duration::from_secs(60)).expect("router admits all");
    let config = stack.write_pdctl_config().expect("config");
    let dir = config.parent().expect("dir").join("config.d");
    std::fs::write(
        dir.join("90-bench.toml"),
        format!("[rollout]\nmin_healthy = \"2s\"\nsingle_pair = \"{}\"\n", if matches!(how, Procedure::Together) { "together" } else { "sequential" }),
    )
    .expect("fragment");
    let daemon = stack.start_pdctld().expect("pdctld");
    let url = format!("{}/generate", stack.router.as_ref().expect("router").url);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Load::default()));
    let t0 = Instant::now();
    let h = load(url, rate, stop.clone(), seen.clone());
    std::thread::sleep(Duration::from_secs(2));
    let mut probe = String::new();
    match how {
        Procedure::Sequential | Procedure::Together => {
            let pdctl = pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl");
            let out = std::process::Command::new(&pdctl)
                .args(["restart", "--rolling", "--json", "--config"])
                .arg(&config)
                .arg("--socket")
                .arg(&daemon.socket)
                .output()
                .expect("pdctl");
            let last = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
            let v: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
            probe = format!("result {}; pdctl's probe: {}", v["result"], v["availability"]);
            // Where each unit's time out of the router went (the record's `windows`).
            if let Some(id) = v["id"].as_str() {
                let shown =
                    std::process::Command::new(&pdctl).args(["rollout", "show", id, "--socket"]).arg(&daemon.socket).output().expect("pdctl rollout show");
                for l in String::from_utf8_lossy(&shown.stdout).lines().filter(|l| l.trim_start().starts_with("window")) {
                    probe.push_str(&format!("\n    {}", l.trim()));
                }
            }
        }
        Procedure::Seed => seed_procedure(&stack),
    }
    // Let the load see the end state for a few seconds.
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    let _ = h.join();
    let l = seen.lock().unwrap_or_else(|p| p.into_inner());
    let longest = l.bad_since.map(|t| l.longest.max(t.elapsed())).unwrap_or(l.longest);
    let line = format!(
        "{:<20} {}P{}D {:<11} clients: {:>4} failed of {:>4} requests; longest error window {:>6.1} s; total {:>5.1} s  {probe}",
        gateway.name(),
        pairs,
        pairs,
        format!("{how:?}").to_lowercase(),
        l.failed,
        l.sent,
        longest.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    (line, (longest.as_secs_f64(), l.failed as f64 / rate))
}

fn main() {
    let rate: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10.0);
    let only = std::env::args().nth(2).unwrap_or_default();
    let runs: usize = std::env::args().nth(3).and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let load_secs: Option<f64> = std::env::args().nth(4).and_then(|a| a.parse().ok());
    println!(
        "pdctl availability benchmark: a steady load of {rate} requests/s through the real router, its own client; {runs} run(s) of each case; the simulated weight load {}",
        load_secs.map(|s| format!("{s} s")).unwrap_or_else(|| format!("{} s (the sandbox's)", StackOptions::default().load_secs))
    );
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for gateway in [Gateway::Smg113, Gateway::SglangRouter032] {
        let mut all: std::collections::BTreeMap<(usize, String), Vec<(f64, f64)>> = std::collections::BTreeMap::new();
        for _ in 0..runs {
            for (pairs, how) in [(1, Procedure::Sequential), (1, Procedure::Together), (1, Procedure::Seed), (2, Procedure::Sequential), (2, Procedure::Seed)] {
                let procedure = format!("{how:?}").to_lowercase();
                if !format!("{} {pairs}P{pairs}D {procedure}", gateway.name()).contains(&only) {
                    continue;
                }
                let (line, figures) = run(gateway, pairs, how, rate, load_secs);
                println!("{line}");
                all.entry((pairs, procedure)).or_default().push(figures);
            }
        }
        if all.is_empty() {
            continue;
        }
        let windows: std::collections::BTreeMap<(usize, String), (f64, f64)> = all
            .into_iter()
            .map(|(k, v)| {
                let longest = median(v.iter().map(|x| x.0).collect());
                let errors = median(v.iter().map(|x| x.1).collect());
                if runs > 1 {
                    let each: Vec<String> = v.iter().map(|x| format!("{:.1}", x.0)).collect();
                    println!(
                        "{:<20} {}P{}D {:<11} longest error window, median of {runs}: {longest:.1} s (each: {} s)",
                        gateway.name(),
                        k.0,
                        k.0,
                        k.1,
                        each.join(", ")
                    );
                }
                (k, (longest, errors))
            })
            .collect();
        // Against the seed's own window in the same run (medians; the bar: together ≤ seed,
        // sequential ≤ 2 × seed, in 1P1D). Sequential has two windows: its longest, and its
        // errors in all (failed requests over the rate: seconds of errors) against twice the
        // seed's window. A figure of a case the filter left out is not printed.
        let got = |p: usize, h: &str| windows.get(&(p, h.to_string())).copied();
        let mut said = Vec::new();
        if let Some((seed, _)) = got(1, "seed") {
            if let Some((t, _)) = got(1, "together") {
                said.push(format!("together {:.2}×", t / seed));
            }
            if let Some((longest, errors)) = got(1, "sequential") {
                said.push(format!(
                    "sequential: longest window {:.2}×, errors in all {errors:.1} s = {:.2}× twice the seed's window",
                    longest / seed,
                    errors / (2.0 * seed)
                ));
            }
            println!("{:<20} 1P1D against the seed's window ({seed:.1} s): {}", gateway.name(), said.join("; "));
        }
        if let (Some((s2, _)), Some((q2, _))) = (got(2, "sequential"), got(2, "seed")) {
            println!("{:<20} 2P2D: sequential's longest window {s2:.1} s vs the seed's {q2:.1} s", gateway.name());
        }
    }
}
