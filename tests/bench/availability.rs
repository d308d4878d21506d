//! Benchmark (prints figures; asserts nothing on time): what clients see during a rollout.
//! Under a steady load through the real router (its own client, independent of pdctl's probe),
//! the failed requests and the longest error window for:
//! - 1P1D: pdctl sequential, pdctl `single_pair = "together"`, the seed's procedure (restart both
//!   units at once, then poll `journalctl --since "2 min ago"` every 20 s for the ready lines);
//! - 2P2D: pdctl (sequential) and the seed's procedure;
//!
//! each behind both gateway generations (smg 1.13.0, sglang-router 0.3.2), on the simulator and
//! then on the real sglang 0.5.23 (when `scripts/setup` installed it), ending with one table of
//! every server and gateway: the seed's window, `together` and sequential against it.
//!
//!     scripts/bench-availability [RATE_PER_S] [ONLY] [RUNS]
//!         (default 10 on the simulator; the real server gets REAL_RATE, default 2, what two real
//!         servers and a gateway on this 2-core CPU answer without queueing; ONLY: run only the
//!         cases whose "server gateway layout procedure" contains it, e.g. "sim smg 1.13.0 1P1D"
//!         or "1P1D together"; RUNS: each case that many times, the cases taking
//!         turns so that a slow spell of the machine falls on all of them, and the ratios use
//!         each case's median — the seed's window alone varies 4.6-8.1 s run to run;
//!         LOAD_SECS: the simulated servers' weight load, 1.5 s by default — past 10 s a restarted
//!         prefill is gone long enough for a decode's heartbeat, 2 missed checks 5 s apart, to drop
//!         its cached entry, as with a real 60-80 s start;
//!         the real server's start takes 15-30 s, so LOAD_SECS does not apply to it;
//!         REAL=1: the real server alone, REAL=0: the simulator alone — docs/real-sglang.md)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pdctl_sandbox::stack::{Server, Stack, StackOptions, READY_LINE};
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

fn run(server: Server, gateway: Gateway, pairs: usize, how: Procedure, rate: f64, load_secs: Option<f64>) -> (String, (f64, f64)) {
    let defaults = StackOptions::default();
    let real = server == Server::Real;
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
    // The load settles for 2 s; then a wait of 0-5 s, different each run, so that the procedure
    // starts at a random moment of the servers' 5 s drain-check cycle (SGLang's SIGTERM watchdog
    // runs every 5 s from a server's first request), as real restarts do: started at a fixed
    // offset from the boot, every run met that cycle at the same moment, and a median of three
    // runs measured that moment rather than the procedure.
    let phase_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| u64::from(d.subsec_micros()) % 5000).unwrap_or(0);
    std::thread::sleep(Duration::from_secs(2) + Duration::from_millis(phase_ms));
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
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            let last = stdout.lines().last().unwrap_or_default().to_string();
            // What took each deferred worker out of the gateway during its stop, and what the pair gate waited for.
            let mut said = String::new();
            for e in stdout.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
                let (unit, step, status) = (e["unit"].as_str().unwrap_or(""), e["step"].as_str().unwrap_or(""), e["status"].as_str().unwrap_or(""));
                match (step, status) {
                    ("restart", "passed") if e["detail"]["taken_out"].is_object() => said.push_str(&format!(
                        "\n    taken out {unit}: {} ms after SIGTERM, {}",
                        e["detail"]["taken_out"]["after_ms"], e["detail"]["taken_out"]["when"]
                    )),
                    ("pair", "passed") if e["elapsed_ms"].as_u64().is_some_and(|ms| ms >= 500) => {
                        let pairs = e["detail"]["pairs"].as_array().cloned().unwrap_or_default();
                        let each: Vec<String> = pairs
                            .iter()
                            .map(|p| {
                                let took: Vec<String> =
                                    p["probes"].as_array().map(|v| v.iter().map(|x| format!("{} ms", x["took"])).collect()).unwrap_or_default();
                                format!("{} with {}: {} (probes took {})", p["prefill"], p["decode"], p["result"], took.join(", "))
                            })
                            .collect();
                        said.push_str(&format!("\n    pair {unit}: {} ms: {}", e["elapsed_ms"], each.join("; ")))
                    }
                    _ => {}
                }
            }
            let v: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
            probe = format!("result {}; pdctl's probe: {}{said}", v["result"], v["availability"]);
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
        "{:<4} {:<20} {}P{}D {:<11} clients: {:>4} failed of {:>4} requests; longest error window {:>6.1} s; total {:>5.1} s  {probe}",
        server_name(server),
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

fn server_name(s: Server) -> &'static str {
    match s {
        Server::Sim => "sim",
        Server::Real => "real",
    }
}

/// One server and gateway's medians (longest error window, seconds of errors) by case.
type Medians = std::collections::BTreeMap<(usize, String), (f64, f64)>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every case of one server behind one gateway, `runs` times in turn; the medians.
fn cases(server: Server, gateway: Gateway, only: &str, runs: usize, rate: f64, load_secs: Option<f64>) -> Medians {
    let name = format!("{:<4} {:<20}", server_name(server), gateway.name());
    let mut all: std::collections::BTreeMap<(usize, String), Vec<(f64, f64)>> = std::collections::BTreeMap::new();
    for _ in 0..runs {
        for (pairs, how) in [(1, Procedure::Sequential), (1, Procedure::Together), (1, Procedure::Seed), (2, Procedure::Sequential), (2, Procedure::Seed)] {
            let procedure = format!("{how:?}").to_lowercase();
            if !format!("{} {} {pairs}P{pairs}D {procedure}", server_name(server), gateway.name()).contains(only) {
                continue;
            }
            let (line, figures) = run(server, gateway, pairs, how, rate, load_secs);
            println!("{line}");
            all.entry((pairs, procedure)).or_default().push(figures);
        }
    }
    all.into_iter()
        .map(|(k, v)| {
            let longest = median(v.iter().map(|x| x.0).collect());
            let errors = median(v.iter().map(|x| x.1).collect());
            if runs > 1 {
                let each: Vec<String> = v.iter().map(|x| format!("{:.1}", x.0)).collect();
                println!("{name} {}P{}D {:<11} longest error window, median of {runs}: {longest:.1} s (each: {} s)", k.0, k.0, k.1, each.join(", "));
            }
            (k, (longest, errors))
        })
        .collect()
}

/// The table's row: against the seed's own window in the same run (medians; the bar: together ≤
/// seed, sequential ≤ 2 × seed, in 1P1D). Sequential has two windows: its longest, and its errors
/// in all (failed requests over the rate: seconds of errors) against twice the seed's window. A
/// case the filter left out is "-", never a zero.
fn row(name: &str, m: &Medians) -> String {
    let got = |p: usize, h: &str| m.get(&(p, h.to_string())).copied();
    let secs = |x: Option<(f64, f64)>| x.map(|x| format!("{:.1} s", x.0)).unwrap_or_else(|| "-".into());
    let seed = got(1, "seed").map(|x| x.0);
    let ratio = |x: Option<f64>| match (x, seed) {
        (Some(x), Some(s)) if s > 0.0 => format!(" ({:.2}×)", x / s),
        _ => String::new(),
    };
    let together = got(1, "together");
    let sequential = got(1, "sequential");
    let errors = sequential.map(|x| match seed {
        Some(s) if s > 0.0 => format!("{:.1} s ({:.2}× 2×seed)", x.1, x.1 / (2.0 * s)),
        _ => format!("{:.1} s", x.1),
    });
    format!(
        "| {name} | {} | {}{} | {}{} | {} | {} / {} |",
        secs(got(1, "seed")),
        secs(together),
        ratio(together.map(|x| x.0)),
        secs(sequential),
        ratio(sequential.map(|x| x.0)),
        errors.unwrap_or_else(|| "-".into()),
        secs(got(2, "sequential")),
        secs(got(2, "seed")),
    )
}

fn main() {
    let rate: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10.0);
    let only = std::env::args().nth(2).unwrap_or_default();
    let runs: usize = std::env::args().nth(3).and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let load_secs: Option<f64> = std::env::args().nth(4).and_then(|a| a.parse().ok());
    let real_rate: f64 = std::env::var("REAL_RATE").ok().and_then(|a| a.parse().ok()).unwrap_or(2.0);
    let mut servers = match std::env::var("REAL").as_deref() {
        Ok("1") => vec![Server::Real],
        Ok("0") => vec![Server::Sim],
        _ => vec![Server::Sim, Server::Real],
    };
    if servers.contains(&Server::Real) {
        if let Err(e) = pdctl_sandbox::RealSglang::find() {
            println!("the real server is left out: {e} (scripts/setup installs it)");
            servers.retain(|s| *s == Server::Sim);
        }
    }
    println!(
        "pdctl availability benchmark: a steady load through the real router, its own client ({rate} requests/s on the simulator, {real_rate} on the real server); {runs} run(s) of each case; the simulated weight load {}",
        load_secs.map(|s| format!("{s} s")).unwrap_or_else(|| format!("{} s (the sandbox's)", StackOptions::default().load_secs))
    );
    let mut table = Vec::new();
    for server in servers {
        let r = if server == Server::Real { real_rate } else { rate };
        for gateway in [Gateway::Smg113, Gateway::SglangRouter032] {
            let m = cases(server, gateway, &only, runs, r, load_secs);
            if !m.is_empty() {
                table.push(row(&format!("{} {r}/s | {}", server_name(server), gateway.name()), &m));
            }
        }
    }
    println!();
    println!("longest error window clients saw, median of {runs} (ratio: against the seed's window in the same run)");
    println!("| server | gateway | 1P1D seed | 1P1D together | 1P1D sequential | sequential errors in all | 2P2D sequential / seed |");
    println!("|---|---|---|---|---|---|---|");
    for l in table {
        println!("{l}");
    }
}
