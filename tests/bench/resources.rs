//! Benchmark (prints figures; asserts nothing on time): what pdctld costs and whether its journal
//! follower stays flat, on the sandbox (real systemd, journald, D-Bus, the real router), pdctld
//! running as a unit of the sandbox:
//! 1. pdctld idle: CPU time and RSS sampled from /proc over IDLE_SECS (default 600);
//! 2. ready detection (the ready line's journald timestamp → pdctld's follower accepting it) over
//!    ROLLOUTS decode rollouts on a small journal, then again after other units wrote ≥ 1 GiB of
//!    entries into it;
//! 3. a follow across rotations: ROLLOUTS more, each with the journal rotated and every archive
//!    vacuumed while the ready gate follows; pdctld's RSS and open descriptors after each.
//!
//!     scripts/bench-resources [IDLE_SECS] [ROLLOUTS] [JOURNAL_MIB]      (defaults 600, 10, 1100)

use std::path::Path;
use std::time::{Duration, Instant};

use pdctl_sandbox::stack::StackOptions;
use pdctl_tests::live_daemon;

const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    s[(((p / 100.0) * (s.len() - 1) as f64).round() as usize).min(s.len() - 1)]
}

/// (utime + stime in seconds, VmRSS in KiB, open descriptors) of a host PID.
fn proc_sample(pid: u32) -> (f64, u64, usize) {
    let tck = 100.0; // USER_HZ on Linux
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let cpu = rest.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0) + rest.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    (cpu / tck, rss, fds)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

/// Roll out the decode once through pdctld; its ready event's detection delay (ms). `during` runs
/// when the ready gate starts following.
fn rollout(d: &pdctl_sandbox::stack::Pdctld, config: &Path, mut during: impl FnMut()) -> f64 {
    let mut c = live_daemon(d, config, &["restart", "--rolling", "--unit", D, "--json"]);
    c.wait_line(LIMIT, |e| e["unit"] == D && e["step"] == "ready" && e["status"] == "started").expect("the ready gate started");
    during();
    let ready = c.wait_line(LIMIT, |e| e["unit"] == D && e["step"] == "ready" && e["status"] != "started").expect("the ready gate ended");
    assert_eq!(ready["status"], "passed", "{ready}");
    assert_eq!(c.finish(LIMIT), Some(0), "the rollout succeeded: {:#?}", c.seen.last());
    ready["detail"]["detect_ms"].as_f64().expect("detect_ms")
}

/// Four other units write unique lines (a duplicate would share its data object and add little)
/// until the journal holds `journal_mib` MiB; returns how long that took, in seconds.
fn fill_journal(stack: &pdctl_sandbox::stack::Stack, journal: &Path, journal_mib: u64) -> f64 {
    let script = stack.sandbox.dir().join("noise.sh");
    std::fs::write(&script, "pad=$(printf '%900s' '' | tr ' ' x)\nexec awk -v n=\"$1\" -v pad=\"$pad\" 'BEGIN { for (i = 0; ; i++) printf \"noise %s line %d %s\\n\", n, i, pad }'\n").expect("noise script");
    let t_fill = Instant::now();
    for i in 0..4 {
        let unit = format!("[Unit]\nDescription=noise {i}\n[Service]\nExecStart=/bin/sh {} {i}\n", script.display());
        stack.sandbox.write_unit(&format!("noise-{i}.service"), &unit).expect("noise unit");
    }
    stack.sandbox.daemon_reload().expect("reload");
    for i in 0..4 {
        stack.sandbox.systemctl(&["start", &format!("noise-{i}.service")]).expect("start noise");
    }
    while dir_bytes(journal) < journal_mib << 20 {
        assert!(t_fill.elapsed() < Duration::from_secs(1800), "the journal did not reach {journal_mib} MiB in 30 minutes");
        std::thread::sleep(Duration::from_secs(1));
    }
    for i in 0..4 {
        stack.sandbox.systemctl(&["stop", &format!("noise-{i}.service")]).expect("stop noise");
    }
    t_fill.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (idle_secs, n, journal_mib) = (args.first().copied().unwrap_or(600), args.get(1).copied().unwrap_or(10) as usize, args.get(2).copied().unwrap_or(1100));
    // The sandbox's journald may keep 4 GiB and keeps every line.
    std::env::set_var(pdctl_sandbox::init::JOURNAL_MAX_ENV, "4G");
    let opts = StackOptions { load_secs: 0.3, warmup_secs: 0.1, ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    std::fs::write(config.parent().expect("dir").join("config.d/90-bench.toml"), "[rollout]\nmin_healthy = \"1s\"\n").expect("fragment");
    let main_pid = stack.show(&d.unit, "MainPID").expect("pdctld's MainPID").parse().expect("a pid");
    let pid = stack.sandbox.host_pid(main_pid).expect("pdctld's host pid");
    let journal = stack.sandbox.journal_dir();

    // 1. Idle.
    let (cpu0, rss0, fds0) = proc_sample(pid);
    let t0 = Instant::now();
    let mut rss = vec![rss0];
    while t0.elapsed() < Duration::from_secs(idle_secs) {
        std::thread::sleep(Duration::from_secs(5).min(Duration::from_secs(idle_secs).saturating_sub(t0.elapsed())));
        rss.push(proc_sample(pid).1);
    }
    let (cpu1, rss1, fds1) = proc_sample(pid);
    let wall = t0.elapsed().as_secs_f64();
    println!("pdctld resource benchmark (sandbox: real systemd 252 + journald + D-Bus, sglang-sim, {}; debug build)", opts.gateway.name());
    println!("1. pdctld idle for {wall:.0} s (1P1D, router, no rollout; its timers, watchdog and metrics endpoint only)");
    println!(
        "   CPU {:.3} s = {:.4}% of one core; RSS {} KiB at start, {} KiB at the end, max {} KiB; open descriptors {fds0} → {fds1}",
        cpu1 - cpu0,
        100.0 * (cpu1 - cpu0) / wall,
        rss0,
        rss1,
        rss.iter().max().copied().unwrap_or(0)
    );

    // 2. Ready detection on a small journal, then on ≥ JOURNAL_MIB of other units' entries.
    let small_size = dir_bytes(&journal);
    let small: Vec<f64> = (0..n).map(|_| rollout(&d, &config, || {})).collect();
    let (_, rss_small, _) = proc_sample(pid);
    let fill_s = fill_journal(&stack, &journal, journal_mib);
    let big_size = dir_bytes(&journal);
    let entries = stack
        .sandbox
        .journalctl(&["--no-pager", "-q", "-o", "cat", "-t", "awk", "-t", "sh"])
        .map(|o| o.stdout.iter().filter(|b| **b == b'\n').count())
        .unwrap_or(0);
    let big: Vec<f64> = (0..n).map(|_| rollout(&d, &config, || {})).collect();
    let (_, rss_big, fds_big) = proc_sample(pid);
    println!("2. ready detection = pdctld's follower accepting the ready line − its __REALTIME_TIMESTAMP ({n} decode rollouts each)");
    let line = |what: &str, size: u64, v: &[f64]| {
        println!("   {what:<34} journal {:>6} MiB  p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms", size >> 20, pct(v, 50.0), pct(v, 99.0), pct(v, 100.0))
    };
    line("small journal", small_size, &small);
    line(&format!("+ {entries} entries of 4 other units"), big_size, &big);
    println!("   ratio p50 large/small: {:.2} (written in {fill_s:.0} s); pdctld RSS {rss_small} → {rss_big} KiB", pct(&big, 50.0) / pct(&small, 50.0));

    // 3. Rotation and vacuum while the ready gate follows.
    let mut series = Vec::new();
    let mut rot = Vec::new();
    for _ in 0..n {
        let ms = rollout(&d, &config, || {
            let o = stack.sandbox.command("journalctl").args(["--rotate", "--vacuum-size=1"]).output().expect("journalctl --rotate");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        });
        rot.push(ms);
        let (_, r, f) = proc_sample(pid);
        series.push(format!("{r}/{f}"));
    }
    println!("3. a follow across a rotation: the journal rotated and every archive vacuumed during each ready gate ({n} rollouts)");
    println!("   detection p50 {:.2} ms  max {:.2} ms; journal now {} MiB", pct(&rot, 50.0), pct(&rot, 100.0), dir_bytes(&journal) >> 20);
    println!("   pdctld RSS KiB / open descriptors before: {rss_big}/{fds_big}; after each: {}", series.join(" "));
}
