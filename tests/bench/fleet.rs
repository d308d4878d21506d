//! Benchmark (prints figures; asserts only the safety property): a fleet rollout simulated on the
//! production slot code (`pdctl_core::fleet`) against a real etcd — hundreds of hosts as tasks,
//! systemd and the servers faked (a restart is 20 ms), one transaction answer in 7 lost, etcd
//! restarted a third of the way in. Prints slot waits, total time against max_unavailable, and the
//! most workers of each role ever down, read from etcd's revision history (never above the limit).
//!
//! Then what the fleet asks of etcd (messages etcd received per second, from its own /metrics)
//! at 500 and 1,000 simulated hosts, idle and during a rollout, as pdctl polled before the
//! watches (the baseline, measured in the same run) and as it waits now, with the ratio.
//!
//!     scripts/bench-fleet [HOSTS ...]        (default: 10 100 500)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdctl_sandbox::etcd::Etcd;
use pdctl_tests::fleet_sim::{etcd_messages, idle, percentile, run, SimSpec};

fn main() {
    let hosts: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let hosts = if hosts.is_empty() { vec![10, 100, 500] } else { hosts };
    let etcd = Arc::new(Mutex::new(Etcd::start().expect("etcd (scripts/setup installs etcd-server)")));
    let url = etcd.lock().map(|e| e.url()).unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    println!("| hosts | max_unavailable | total | ideal | slot wait p50 | p99 | max | most prefill down | most decode down | answers lost | calls failed (etcd restart) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &n in &hosts {
        for max in [1u32, 2] {
            let restart = Duration::from_millis(20);
            let ideal = restart * (n as u32).div_ceil(max);
            let spec = SimSpec { hosts: n, max_unavailable: max, restart, lose_every: 7, etcd_restart_after: Some(ideal / 3), poll: None };
            let e = etcd.clone();
            let r = rt.block_on(run(&spec, &url, move || {
                if let Ok(mut e) = e.lock() {
                    e.stop();
                    let _ = e.resume();
                }
            }));
            let down = |role: &str| r.max_down.get(role).copied().unwrap_or(0);
            println!(
                "| {n} | {max} | {:.2}s | {:.2}s | {:.0}ms | {:.0}ms | {:.0}ms | {} | {} | {} | {} |",
                r.total.as_secs_f64(),
                ideal.as_secs_f64(),
                percentile(&r.waits, 0.5).as_secs_f64() * 1000.0,
                percentile(&r.waits, 0.99).as_secs_f64() * 1000.0,
                percentile(&r.waits, 1.0).as_secs_f64() * 1000.0,
                down("prefill"),
                down("decode"),
                r.lost,
                r.failed_calls
            );
            assert!(down("prefill") <= max as usize && down("decode") <= max as usize, "the limit was exceeded: {:?}", r.max_down);
        }
    }
    requests_per_second(&rt, &url);
}

/// etcd messages received per second at 500 and 1,000 hosts: idle (each host's liveness lease,
/// rollout-request wait and storm check; 20 s window) and during a rollout (every host waiting
/// for its slots, 10 % of each role at a time, a restart of 1 s; the whole rollout), before the
/// watches and now, with the ratio.
fn requests_per_second(rt: &tokio::runtime::Runtime, url: &str) {
    println!();
    println!("| hosts | phase | before (poll), msgs/s | now (watch), msgs/s | reduction | now: sent msgs/s | detail |");
    println!("|---|---|---|---|---|---|---|");
    for n in [500usize, 1000] {
        let window = Duration::from_secs(20);
        let before = rt.block_on(idle(n, url, true, window));
        let now = rt.block_on(idle(n, url, false, window));
        println!(
            "| {n} | idle | {:.1} | {:.1} | {:.1}× | {:.1} | per host {:.3} → {:.3} msgs/s |",
            before.received_per_s,
            now.received_per_s,
            before.received_per_s / now.received_per_s.max(1e-9),
            now.sent_per_s,
            before.received_per_s / n as f64,
            now.received_per_s / n as f64
        );
        let spec =
            |poll| SimSpec { hosts: n, max_unavailable: (n / 10) as u32, restart: Duration::from_secs(1), lose_every: 0, etcd_restart_after: None, poll };
        let mut rates = Vec::new();
        for poll in [Some(Duration::from_secs(1)), None] {
            let (r0, s0) = rt.block_on(etcd_messages(url));
            let r = rt.block_on(run(&spec(poll), url, || {}));
            let (r1, s1) = rt.block_on(etcd_messages(url));
            let secs = r.total.as_secs_f64();
            rates.push(((r1 - r0) / secs, (s1 - s0) / secs, r));
        }
        let (b, _, rb) = &rates[0];
        let (w, ws, rw) = &rates[1];
        println!(
            "| {n} | rollout | {b:.1} | {w:.1} | {:.1}× | {ws:.1} | total {:.1} s → {:.1} s, slot wait p99 {:.0} → {:.0} ms, waits ended by the fallback: {} |",
            b / w.max(1e-9),
            rb.total.as_secs_f64(),
            rw.total.as_secs_f64(),
            percentile(&rb.waits, 0.99).as_secs_f64() * 1000.0,
            percentile(&rw.waits, 0.99).as_secs_f64() * 1000.0,
            rw.fallbacks
        );
    }
}
