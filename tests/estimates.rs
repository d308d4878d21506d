//! An outage estimate says what it is based on and matches what was measured: after a 1P1D pair
//! restarted together (`single_pair = "together"`), the next run's two warnings say one and the
//! same interruption — the pair's, from the first take-out to the last re-admission, as the
//! record's events have it — not each worker's own window (they said "about 9 s" and "about 6 s"
//! for one interruption that measured 13.5 s). On the sandbox behind the real gateway, with pdctld.

use std::time::{Duration, SystemTime};

use pdctl_tests::{pdctl_daemon, JsonRun};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn at(r: &JsonRun, unit: &str, step: &str, status: &str) -> SystemTime {
    humantime::parse_rfc3339(r.event(unit, step, status)["at"].as_str().expect("at")).expect("RFC 3339")
}

/// When `unit` left the gateway: its drain, or — the only worker of its role, kept through its
/// stop's drain — when its restart took it out.
fn out_since(r: &JsonRun, unit: &str) -> SystemTime {
    let restart = r.events.iter().find(|e| e["unit"] == unit && e["step"] == "restart" && e["status"] != "started");
    match restart.and_then(|e| e["detail"]["taken_out"]["after_ms"].as_u64()) {
        Some(ms) => at(r, unit, "restart", "started") + Duration::from_millis(ms),
        None => at(r, unit, "drain", "started"),
    }
}

/// "about 14s (…)" → 14.
fn about(said: &str) -> u64 {
    said.split("about ").nth(1).and_then(|r| r.split('s').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no estimate in {said}"))
}

#[test]
fn restarted_together_both_warnings_say_the_pairs_last_interruption_as_measured() {
    let (_stack, config, d) = pdctl_tests::stack_with_pdctld();
    std::fs::write(config.parent().expect("dir").join("config.d/50-together.toml"), "[rollout]\nsingle_pair = \"together\"\n").expect("fragment");
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#} {}", r.summary, r.stderr);
    let first_out = out_since(&r, P).min(out_since(&r, D));
    let last_in = at(&r, P, "router", "passed").max(at(&r, D, "router", "passed"));
    let span = last_in.duration_since(first_out).expect("in order").as_millis() as u64;
    // The dry run asks pdctld what it measured.
    let dry = pdctl_daemon(&d, &config, &["restart", "--rolling", "--dry-run", "--json"], LIMIT);
    assert_eq!(dry.code, 0, "{:#} {}", dry.summary, dry.stderr);
    let said: Vec<String> = [P, D].iter().map(|u| dry.event(u, "preflight", "passed")["detail"]["outage"].as_str().unwrap_or_default().to_string()).collect();
    for s in &said {
        assert!(s.contains("the pair's last measured interruption, restarted together with") && s.contains(" ago)"), "says what it is based on and when: {s}");
    }
    assert_eq!(about(&said[0]), about(&said[1]), "one interruption, one figure: {said:#?}");
    let secs = about(&said[0]);
    assert!(secs * 1000 + 1000 >= span && secs * 1000 <= span + 1000, "{secs} s said vs {span} ms from the first take-out to the last re-admission: {said:#?}");
}
