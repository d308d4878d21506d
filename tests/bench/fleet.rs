//! Benchmark (prints figures; asserts only the safety property): a fleet rollout simulated on the
//! production slot code (`pdctl_core::fleet`) against a real etcd — hundreds of hosts as tasks,
//! systemd and the servers faked (a restart is 20 ms), one transaction answer in 7 lost, etcd
//! restarted a third of the way in. Prints slot waits, total time against max_unavailable, and the
//! most workers of each role ever down, read from etcd's revision history (never above the limit).
//!
//!     scripts/bench-fleet [HOSTS ...]        (default: 10 100 500)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdctl_sandbox::etcd::Etcd;
use pdctl_tests::fleet_sim::{percentile, run, SimSpec};

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
            let spec = SimSpec { hosts: n, max_unavailable: max, restart, lose_every: 7, etcd_restart_after: Some(ideal / 3) };
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
}
