//! Benchmark (prints figures; asserts nothing on time): what 2P2D of the real sglang 0.5.23 on
//! this CPU sustains through smg 1.13, with prompts sharing a long system prompt (the load the
//! real tier's 2P2D rollouts run under, `real_2p2d.rs::in_2p2d_under_load_the_ratio_changes_live_then_…`, at
//! 3 req/s). From 4 req/s doubled until a rate is not held, then once halfway back
//! ([`pdctl_tests::capacity::sustained`]); each step printed, the servers' backlog served between
//! steps. Moved out of that test: a measurement of the machine is not a test of pdctl, and it
//! took minutes of every CI run.
//!
//! `scripts/bench-capacity`.

use std::time::Duration;

use pdctl_sandbox::stack::http_get_with;
use pdctl_sandbox::stack::{Server, StackOptions};
use pdctl_tests::{stack_up, until};

fn main() {
    let opts = StackOptions { server: Server::Real, pairs: 2, waiting_timeout_secs: 30.0, bootstrap_timeout_secs: 30.0, ..Default::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let stack = rt.block_on(stack_up(&opts));
    let router = stack.router.as_ref().expect("router").url.clone();
    let system = "You are a careful assistant for an operations team; answer briefly and name your sources. ".repeat(8);
    // Each worker's running and waiting requests (`/v1/loads`).
    let loads = |url: &str| -> (u64, u64) {
        http_get_with(&format!("{url}/v1/loads"), stack.api_key.as_deref())
            .ok()
            .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
            .and_then(|v| {
                v["loads"].as_array().map(|l| {
                    let sum = |k: &str| l.iter().map(|x| x[k].as_u64().unwrap_or(0)).sum::<u64>();
                    (sum("num_running_reqs"), sum("num_waiting_reqs"))
                })
            })
            .unwrap_or((0, 0))
    };
    let queued = || stack.workers().iter().map(|w| loads(&w.url).1).sum::<u64>();
    let settled = || {
        let idle = until(Duration::from_secs(300), Duration::from_millis(500), || stack.workers().iter().all(|w| loads(&w.url) == (0, 0)));
        assert!(idle, "the servers served their backlog within 300 s");
    };
    let (most, steps) = pdctl_tests::capacity::sustained(&router, 4.0, 64.0, 15.0, &system, &queued, &settled);
    for s in &steps {
        println!("capacity of 2P2D, no rollout: {}", s.line());
    }
    match most {
        Some(m) => println!("this CPU sustains {m:.1} req/s through smg 1.13 to 2P2D of the real sglang 0.5.23"),
        None => println!("not even 4 req/s held"),
    }
}
