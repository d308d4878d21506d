//! Benchmark (prints figures; not a test): ready-detection latency of pdctl's journal follower
//! and the orchestration overhead of a rolling restart, beside the seed's procedure
//! (`journalctl --since "2 min ago"` polled every 20 s) in the same run, on the sandbox.
//!
//! Then the ready line's way to the operator: `pdctl restart --rolling --json` against pdctld,
//! each ready event timed when the CLI's line arrives, against the ready line's
//! `__REALTIME_TIMESTAMP` (journald's receive time), split in its three hops: journald → the
//! follower's read (`detect_ms`), the read → the event stamped by the engine (its `at`), the stamp →
//! the CLI's line (pdctld's stream); and the five slowest events' hops, where the tail is spent.
//!
//!     scripts/bench [RESTARTS] [SEED_RESTARTS] [ROLLOUTS] [E2E_READY_EVENTS]   (defaults 20, 3, 3, 200)

use std::time::{Duration, Instant, SystemTime};

use pdctl_core::events::{Status, Step};
use pdctl_sandbox::stack::{Stack, StackOptions, READY_LINE};
use pdctl_systemd::{Bus, Systemd};

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[i.min(s.len() - 1)]
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, n_seed, n_roll) = (args.first().copied().unwrap_or(20), args.get(1).copied().unwrap_or(3), args.get(2).copied().unwrap_or(3));
    let n_e2e = args.get(3).copied().unwrap_or(200);
    let opts = StackOptions { load_secs: 0.3, warmup_secs: 0.1, ..Default::default() };
    let stack = tokio::task::block_in_place(|| Stack::boot(&opts)).expect("stack");
    tokio::task::block_in_place(|| stack.wait_ready(Duration::from_secs(60))).expect("ready");
    let unit = stack.decode.unit.clone();
    let sd = Systemd::connect(&Bus::Address(stack.sandbox.bus_address())).await.expect("bus");

    // 1. pdctl: the engine's own restart and ready gates (journal cursor → RestartUnit → follow →
    //    this run's ready line, with the MainPID fallback and the fatal patterns), timed from the
    //    ready event's detect_ms: the follower's read time minus journald's receive time.
    let config = stack.write_pdctl_config().expect("config");
    let lat = engine_ready(&config, &unit, n).await;

    let (seed, seed_false) = seed_procedure(&stack, &sd, &unit, n_seed).await;

    // 3. Orchestration overhead of `pdctl restart --rolling` (1P1D, router, metrics; health
    //    answers at once as with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false): per unit, wall
    //    time of drain..metrics minus the server's own start (ExecMainStartTimestamp → ready line).
    std::fs::write(config.parent().unwrap().join("config.d/90-bench.toml"), "[rollout]\nmin_healthy = \"1s\"\n").expect("fragment");
    for w in stack.workers() {
        stack.drop_in(&w.unit, "90-bench", "[Service]\nEnvironment=SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false\n").expect("drop-in");
        stack.sandbox.systemctl(&["restart", &w.unit]).expect("restart");
    }
    tokio::task::block_in_place(|| stack.wait_ready(Duration::from_secs(60))).expect("ready");
    // Let the router re-admit both before timing (bounded).
    tokio::task::block_in_place(|| stack.wait_router_healthy(2, Duration::from_secs(30))).expect("router re-admits both");
    let pdctl = pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl");
    let daemon = tokio::task::block_in_place(|| stack.start_pdctld()).expect("pdctld");
    let (overhead, own_time, per_step, walls) = overhead_per_unit(&stack, &config, &pdctl, &daemon.socket, n_roll);

    let hops = end_to_end(&config, &pdctl, &daemon.socket, n_e2e);

    let build = if cfg!(debug_assertions) { "debug build" } else { "release build" };
    println!("pdctl benchmark (sandbox: real systemd 252 + journald + D-Bus, sglang-sim, {}; {build})", opts.gateway.name());
    println!("ready detection = detection time − the ready line's __REALTIME_TIMESTAMP");
    println!(
        "  pdctl  (the engine's ready gate: libsystemd, sd_journal_wait 5 ms)  n={:<3} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms",
        lat.len(),
        pct(&lat, 50.0),
        pct(&lat, 99.0),
        pct(&lat, 100.0)
    );
    println!(
        "  seed   (journalctl --since \"2 min ago\" / 20 s)  n={:<3} p50 {:>8.0} ms  max {:>8.0} ms  old-run matches {seed_false}/{}",
        seed.len(),
        pct(&seed, 50.0),
        pct(&seed, 100.0),
        seed.len()
    );
    println!("  ratio seed/pdctl p50: {:.0}x", pct(&seed, 50.0) / pct(&lat, 50.0));
    println!("orchestration overhead per unit = (drain..metrics wall) − (server's start: ExecMainStart → ready line)");
    println!(
        "  n={:<3} p50 {:>8.1} ms  max {:>8.1} ms   (rollout wall times: {:?} s, soak 1 s per unit included there)",
        overhead.len(),
        pct(&overhead, 50.0),
        pct(&overhead, 100.0),
        walls.iter().map(|w| (w * 10.0).round() / 10.0).collect::<Vec<_>>()
    );
    println!("  per step p50 (ms): {}", per_step.iter().map(|(k, v)| format!("{k} {:.0}", pct(v, 50.0))).collect::<Vec<_>>().join(", "));
    println!("the gates' own time per unit = (drain..metrics wall) − the server's stop (SIGTERM → exit) − its start (ExecMainStart → ready line)");
    println!(
        "  n={:<3} p50 {:>8.1} ms  max {:>8.1} ms   ({:.2}× the goal of 1.0 s)",
        own_time.len(),
        pct(&own_time, 50.0),
        pct(&own_time, 100.0),
        pct(&own_time, 50.0) / 1000.0
    );
    print_end_to_end(&hops);
}

/// `n_roll` rollouts of `pdctl restart --rolling`: per unit, the orchestration's time (drain..metrics
/// wall minus the server's own start) and the gates' own (minus its stop too: `stop.stop_ms` of
/// the restart step), each step's time, and each rollout's wall.
#[allow(clippy::type_complexity)]
fn overhead_per_unit(
    stack: &Stack,
    config: &std::path::Path,
    pdctl: &std::path::Path,
    socket: &std::path::Path,
    n_roll: usize,
) -> (Vec<f64>, Vec<f64>, std::collections::BTreeMap<&'static str, Vec<f64>>, Vec<f64>) {
    let mut overhead = Vec::new();
    let mut own_time = Vec::new();
    let mut per_step: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut walls = Vec::new();
    for _ in 0..n_roll {
        let t0 = Instant::now();
        let out = std::process::Command::new(pdctl)
            .args(["restart", "--rolling", "--json", "--config"])
            .arg(config)
            .arg("--socket")
            .arg(socket)
            .output()
            .expect("pdctl");
        walls.push(t0.elapsed().as_secs_f64());
        assert!(out.status.success(), "rollout failed: {}", String::from_utf8_lossy(&out.stdout));
        let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        for w in stack.workers() {
            let ev =
                |step: &str| events.iter().find(|e| e["unit"] == w.unit.as_str() && e["step"] == step && e["status"] == "passed").cloned().unwrap_or_default();
            let steps = ["drain", "restart", "ready", "health", "router", "metrics"];
            for s in steps {
                per_step.entry(s).or_default().push(ev(s)["elapsed_ms"].as_f64().unwrap_or(0.0));
            }
            let total: u64 = steps.iter().map(|s| ev(s)["elapsed_ms"].as_u64().unwrap_or(0)).sum();
            let start_us = ev("restart")["detail"]["exec_main_start_us"].as_u64().unwrap_or(0);
            let ready_us = ev("ready")["detail"]["journal_realtime_us"].as_u64().unwrap_or(0);
            let server_ms = ready_us.saturating_sub(start_us) as f64 / 1000.0;
            overhead.push(total as f64 - server_ms);
            let stop_ms = ev("restart")["detail"]["stop"]["stop_ms"].as_f64().unwrap_or(0.0);
            own_time.push(total as f64 - server_ms - stop_ms);
        }
    }
    (overhead, own_time, per_step, walls)
}

/// Phase 2, the seed's procedure: every 20 s, `journalctl --since "2 min ago" -u UNIT | grep ready`:
/// each detection's latency (ms) and how many found an old run's line first.
async fn seed_procedure(stack: &Stack, sd: &Systemd, unit: &str, n_seed: usize) -> (Vec<f64>, usize) {
    let mut seed = Vec::new();
    let mut seed_false = 0;
    for _ in 0..n_seed {
        let restart_us = now_us();
        sd.restart(unit, Duration::from_secs(30)).await.expect("restart");
        loop {
            tokio::time::sleep(Duration::from_secs(20)).await;
            let out = stack.sandbox.journalctl(&["--since", "2 min ago", "-u", unit, "-o", "json", "--output-fields=MESSAGE"]).expect("journalctl");
            let hits: Vec<u64> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["MESSAGE"].as_str().is_some_and(|m| m.contains(READY_LINE)))
                .filter_map(|v| v["__REALTIME_TIMESTAMP"].as_str().and_then(|t| t.parse().ok()))
                .collect();
            if let Some(first) = hits.first() {
                // The seed takes the first match: with --since "2 min ago" it can be an old run's.
                if *first < restart_us {
                    seed_false += 1;
                }
                let newest = hits.iter().copied().filter(|t| *t >= restart_us).max().unwrap_or(*first);
                seed.push((now_us().saturating_sub(newest)) as f64 / 1000.0);
                break;
            }
        }
    }
    (seed, seed_false)
}

/// Phase 4, the ready line at the operator: only the gates that wait on the server (no router, metrics
/// or pair gates, 1 s soak), so that many restarts fit in a run: each ready line's arrival at the
/// CLI's reader and pdctl's own detect_ms (ms).
fn end_to_end(config: &std::path::Path, pdctl: &std::path::Path, socket: &std::path::Path, n_e2e: usize) -> Vec<Hops> {
    std::fs::write(
        config.parent().unwrap().join("config.d/95-e2e.toml"),
        "[rollout]\nmin_healthy = \"1s\"\ndrain = false\nallow_outage = true\n[verify]\nrouter = false\nmetrics = \"off\"\npair = false\nsmoke_request = false\n",
    )
    .expect("fragment");
    let mut hops = Vec::new();
    while hops.len() < n_e2e {
        let mut child = std::process::Command::new(pdctl)
            .args(["restart", "--rolling", "--json", "--config"])
            .arg(config)
            .arg("--socket")
            .arg(socket)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("pdctl");
        let out = child.stdout.take().expect("stdout");
        // Each line timed as it arrives (a thread blocked on the pipe, not the async runtime).
        let lines = std::thread::spawn(move || {
            use std::io::BufRead as _;
            std::io::BufReader::new(out).lines().map_while(Result::ok).map(|l| (now_us(), l)).collect::<Vec<_>>()
        });
        let got = lines.join().expect("reader");
        let status = child.wait().expect("pdctl exits");
        assert!(status.success(), "rollout failed: {:?}", got.last());
        for (at, l) in got {
            let Ok(e) = serde_json::from_str::<serde_json::Value>(&l) else { continue };
            if e["step"] == "ready" && e["status"] == "passed" {
                let journald = e["detail"]["journal_realtime_us"].as_u64().expect("journal_realtime_us");
                let stamped = e["at"].as_str().and_then(|t| humantime::parse_rfc3339(t).ok()).expect("the event's `at`");
                let stamped_us = stamped.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
                hops.push(Hops {
                    total: at.saturating_sub(journald) as f64 / 1000.0,
                    detect: e["detail"]["detect_ms"].as_f64().expect("detect_ms"),
                    stamped: stamped_us as f64 / 1000.0 - journald as f64 / 1000.0,
                });
            }
        }
    }
    hops
}

/// One ready event's way to the operator (ms after journald received the line): read by the
/// follower (`detect_ms`), stamped by the engine (the event's `at`, whole milliseconds), at the CLI's
/// reader (`total`).
struct Hops {
    total: f64,
    detect: f64,
    stamped: f64,
}

impl Hops {
    /// The read → the stamp (the engine's stamp has whole milliseconds: ±1 ms).
    fn engine(&self) -> f64 {
        (self.stamped - self.detect).max(0.0)
    }
    /// The stamp → the CLI's line (pdctld's stream; ±1 ms).
    fn delivery(&self) -> f64 {
        (self.total - self.stamped).max(0.0)
    }
}

/// Phase 1, pdctl: the engine's own restart and ready gates, `n` times; each ready event's
/// detect_ms.
async fn engine_ready(config: &std::path::Path, unit: &str, n: usize) -> Vec<f64> {
    let settings = pdctl_core::config::load(config).expect("settings");
    let worker = settings.workers.iter().find(|w| w.unit == unit).cloned().expect("decode worker");
    let engine = pdctl_real::connect(settings).await.expect("engine");
    let mut lat = Vec::new();
    for _ in 0..n {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        engine.restart_until_ready(&worker, &tx).await.expect("restart and ready gates pass");
        drop(tx);
        while let Some(e) = rx.recv().await {
            if e.step == Step::Ready && e.status == Status::Passed {
                lat.push(e.detail["detect_ms"].as_f64().expect("detect_ms"));
            }
        }
    }
    lat
}

/// Phase 4's lines of the report: the whole way, each hop's share, and the slowest events' hops
/// (where the tail is spent).
fn print_end_to_end(hops: &[Hops]) {
    let e2e: Vec<f64> = hops.iter().map(|h| h.total).collect();
    let own: Vec<f64> = hops.iter().map(|h| h.detect).collect();
    let engine: Vec<f64> = hops.iter().map(Hops::engine).collect();
    let delivery: Vec<f64> = hops.iter().map(Hops::delivery).collect();
    println!(
        "ready line → the CLI's printed event = the line's arrival at a reader of `pdctl restart --rolling --json` − the ready line's __REALTIME_TIMESTAMP"
    );
    println!(
        "  end to end  n={:<3} p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms   (target p99 ≤ 10 ms)",
        e2e.len(),
        pct(&e2e, 50.0),
        pct(&e2e, 99.0),
        pct(&e2e, 100.0)
    );
    for (name, v) in [
        ("journald → the follower's read (detect_ms)", &own),
        ("the read → the event stamped (the engine; ±1 ms)", &engine),
        ("the stamp → the CLI's line (pdctld → CLI; ±1 ms)", &delivery),
    ] {
        println!("  {name:<52} p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms", pct(v, 50.0), pct(v, 99.0), pct(v, 100.0));
    }
    let mut slow: Vec<&Hops> = hops.iter().collect();
    slow.sort_by(|a, b| b.total.total_cmp(&a.total));
    println!(
        "  the five slowest (total = detect + engine + delivery, ms): {}",
        slow.iter().take(5).map(|h| format!("{:.1} = {:.1} + {:.1} + {:.1}", h.total, h.detect, h.engine(), h.delivery())).collect::<Vec<_>>().join("; ")
    );
}
