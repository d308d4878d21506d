//! The real-server tier for the shapes real deployments use: the released `sglang==0.5.23` on this
//! CPU behind the real smg 1.13, in the sandbox's real systemd, with units that keep their flags
//! in `--config` YAML files and a decode of two data-parallel ranks (two schedulers, two KV pools,
//! two metrics series). What ran and what did not on this CPU: docs/real-sglang.md, "Shapes".
//!
//! One real stack at a time (`.config/nextest.toml`).

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Server, StackOptions};
use pdctl_tests::{pdctl_daemon, stack_with_pdctld_opts, Load};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";

/// Both units keep their flags in YAML files (ExecStart: `python -m sglang.launch_server --config
/// FILE --port N`) and the decode runs `--dp-size 2` (on this CPU two ranks need their cores named:
/// `SGLANG_CPU_OMP_THREADS_BIND=0|1`). A rolling restart under load passes every gate — the
/// preflight compares what SGLang runs with (the file merged), the metrics gate reads each rank's
/// series apart — and then a page size changed inside the prefill's file alone is refused before
/// anything restarts.
#[test]
fn config_file_units_and_a_two_rank_decode_pass_every_gate_and_a_file_change_that_cannot_pair_is_refused() {
    let opts = StackOptions {
        server: Server::Real,
        waiting_timeout_secs: 30.0,
        bootstrap_timeout_secs: 30.0,
        flags_in_config: true,
        decode_args: vec!["--dp-size".into(), "2".into()],
        decode_env: vec!["SGLANG_CPU_OMP_THREADS_BIND=0|1".into()],
        ..Default::default()
    };
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    let exec = stack.show(D, "ExecStart").expect("ExecStart");
    assert!(exec.contains("--config") && !exec.contains("--model-path"), "the flags live in the file: {exec}");
    let router = stack.router.clone().expect("router");
    let load = Load::start(&router.url, 2.0, 16);
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], Duration::from_secs(900));
    let (sent, failed) = load.stop();
    println!("clients through smg during the rollout: {sent} sent, {failed} failed");
    // What the rollout did, for docs/real-sglang.md: on this CPU the prefill's restart left the
    // two-rank decode on the old prefill's ports (a stale pair), found by the pair gate and
    // repaired by restarting the decode within the same rollout; clients failed through it.
    for e in r.events.iter().filter(|e| e["status"] == "passed") {
        println!("{} {} passed in {} ms", e["unit"], e["step"], e["elapsed_ms"]);
    }
    assert_eq!(r.code, 0, "an unchanged --config stack restarts: {:#}\n{}", r.summary, r.stderr);
    for unit in [P, D] {
        for step in ["preflight", "drain", "restart", "ready", "health", "pair", "router", "metrics", "soak"] {
            r.event(unit, step, "passed");
        }
    }
    let m = &r.event(D, "metrics", "passed")["detail"];
    let ranks = m["ranks"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = ranks.iter().filter_map(|x| x["rank"].as_str()).collect();
    assert_eq!(names, ["dp_rank=0,pp_rank=0,tp_rank=0,moe_ep_rank=0", "dp_rank=1,pp_rank=0,tp_rank=0,moe_ep_rank=0"], "{m:#}");
    for x in &ranks {
        let sum = ["used_tokens", "available_tokens", "evictable_tokens"].iter().filter_map(|k| x[*k].as_f64()).sum::<f64>();
        assert_eq!(Some(sum), x["max_total_tokens"].as_f64(), "the identity holds per rank: {x:#}");
    }
    let pools: Vec<String> = ranks.iter().map(|x| format!("{}/{}/{}", x["used_tokens"], x["available_tokens"], x["evictable_tokens"])).collect();
    println!(
        "the decode's ranks at its metrics gate (used/available/evictable): {pools:?}{}",
        if pools.windows(2).any(|w| w[0] != w[1]) { " — uneven" } else { " — even this time" }
    );
    // The prefill's file asks for another page size; its ExecStart does not change.
    let yaml = stack.config_yaml(P);
    let text = std::fs::read_to_string(&yaml).expect("the prefill's file");
    std::fs::write(&yaml, format!("{text}page-size: \"16\"\n")).expect("write");
    let (p0, d0) = (stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap());
    let r = pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], Duration::from_secs(300));
    assert_eq!(r.code, 1, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("preflight"), Some("incompatible_change")), "{f:#}");
    assert!(f["cause"].as_str().unwrap_or("").contains("page_size 16"), "{f:#}");
    assert_eq!((stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap()), (p0, d0), "nothing restarted");
}

/// New weights in place while clients send 10 requests a second through smg, every prompt
/// beginning with the same long system prompt (what a prefix cache keeps): after the load no
/// worker may answer a cached prefix from KV the old weights computed. Either every worker's
/// cache was flushed after its load (the record says how: while paused, after the continue, or
/// in a short `retract` quiet window) or the rollout failed naming the worker whose cache was
/// not. Before, a flush that never found the scheduler idle ended `succeeded` with a note.
#[test]
fn new_weights_under_ten_requests_a_second_sharing_a_long_prefix_leave_no_cache_of_the_old_weights() {
    let opts = StackOptions { server: Server::Real, waiting_timeout_secs: 30.0, bootstrap_timeout_secs: 30.0, ..Default::default() };
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    let real = stack.real.clone().expect("the real server");
    let v2 = real.model_v2.display().to_string();
    let runs = || (stack.show(P, "InvocationID").expect("p"), stack.show(D, "InvocationID").expect("d"));
    let before = runs();
    let system = "You are a careful assistant for an operations team; answer briefly and name your sources. ".repeat(8);
    let load = Load::start_with(&stack.router.as_ref().expect("router").url, 10.0, 16, None, Some(system));
    // Traffic before the change, so that the caches hold the shared prefix: 20 answered.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let warm =
        pdctl_tests::until(Duration::from_secs(120), Duration::from_millis(250), || rt.block_on(pdctl_tests::served_requests(&stack.decode.url)) >= 20.0);
    assert!(warm, "the load flows through smg before the change");
    let r = pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", &v2, "--version", "v2", "--json"], Duration::from_secs(600));
    let (sent, failed) = load.stop();
    println!("clients through smg during the rollout: {sent} sent, {failed} failed");
    match r.code {
        0 => {
            for unit in [P, D] {
                let step = &r.event(unit, "weights", "passed")["detail"];
                let how = step["cache_flushed"].as_str().unwrap_or("");
                assert!(!how.is_empty() && !how.starts_with("not flushed"), "{unit}: succeeded only with its cache flushed: {step:#}");
                println!("{unit}: paused {} ms, cache flushed {how}", step["paused_ms"]);
            }
        }
        1 => {
            let f = &r.summary["failed"];
            assert_eq!(f["step"], "weights", "{:#}", r.summary);
            assert!(f["cause"].as_str().unwrap_or("").contains("prefix cache was not flushed"), "{:#}", r.summary);
            println!("failed, naming the worker whose cache holds old KV: {}", f["cause"]);
        }
        c => panic!("exit {c}: {:#}\n{}", r.summary, r.stderr),
    }
    assert_eq!(runs(), before, "nothing was restarted");
}
