//! The shapes real deployments use, on the sandbox (real systemd, journald, D-Bus) with the real
//! gateway: a decode with attention data parallelism (one KV pool and one metrics series per DP
//! group), units that keep their flags in `--config` YAML files, a change of DP width.

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::StackOptions;
use pdctl_tests::{pdctl_daemon, stack_with_pdctld_opts, Load};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(180);

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// A decode with `--attn-dp-size 2` restarted under load through every gate: its metrics gate
/// reads each DP group's series on its own (the maxima of each gauge taken across the groups, as
/// pdctl read them before, break used + available + evictable = max as soon as the groups' pools
/// differ, and the gate failed `metrics_insane`).
#[test]
fn an_attention_dp_decode_restarts_through_every_gate_with_each_rank_read_apart() {
    let opts = StackOptions { decode_args: args("--tp-size 2 --attn-dp-size 2"), ..Default::default() };
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    let load = Load::start(&stack.router.as_ref().expect("router").url, 6.0, 24);
    let run = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", D, "--json"], LIMIT);
    let (sent, failed) = load.stop();
    assert_eq!(run.code, 0, "{:#?}\n{}", run.summary, run.stderr);
    assert!(sent > 10, "the load ran: {sent} sent");
    for step in ["preflight", "drain", "restart", "ready", "health", "pair", "router", "metrics", "soak"] {
        run.event(D, step, "passed");
    }
    let m = &run.event(D, "metrics", "passed")["detail"];
    let ranks = m["ranks"].as_array().expect("the report per rank");
    let names: Vec<&str> = ranks.iter().filter_map(|r| r["rank"].as_str()).collect();
    assert_eq!(names, ["dp_rank=0,pp_rank=0,tp_rank=0,moe_ep_rank=0", "dp_rank=1,pp_rank=0,tp_rank=1,moe_ep_rank=0"], "{m:#}");
    let pool = |r: &serde_json::Value| (r["used_tokens"].as_f64(), r["available_tokens"].as_f64(), r["evictable_tokens"].as_f64());
    // The condition that failed the gate before: the two pools differ.
    assert_ne!(pool(&ranks[0]), pool(&ranks[1]), "the groups' pools were even at the gate; the test did not observe uneven load: {m:#}");
    let each_max = ranks[0]["max_total_tokens"].as_f64().expect("max");
    assert_eq!(m["max_total_tokens"].as_f64(), Some(2.0 * each_max), "the server's pool is both groups' pools: {m:#}");
    let used: f64 = ranks.iter().filter_map(|r| r["used_tokens"].as_f64()).sum();
    assert_eq!(m["used_tokens"].as_f64(), Some(used));
    eprintln!("load through the rollout: {sent} sent, {failed} failed");
    assert!(!run.touched(P), "only the decode was asked for");
}

/// Workers that keep their flags in `--config` YAML files, as many deployments do: SGLang merges
/// the file into its argv before it records `launch_command`, so pdctl compares what the server
/// runs with, not the ExecStart words (which name no `--model-path`: every rolling restart was
/// refused `mixed_versions`, "--model-path … → (unset)"). A change inside the file is a change of
/// the unit; one the decode cannot pair with is refused before anything restarts.
#[test]
fn config_file_units_restart_and_a_change_in_the_file_the_decode_cannot_pair_with_is_refused() {
    let opts = StackOptions { flags_in_config: true, ..Default::default() };
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    let exec = stack.show(P, "ExecStart").expect("ExecStart");
    assert!(exec.contains("--config") && !exec.contains("--model-path"), "the flags live in the file: {exec}");
    let run = pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], LIMIT);
    assert_eq!(run.code, 0, "an unchanged --config unit restarts: {:#?}\n{}", run.summary, run.stderr);
    for u in [P, D] {
        run.event(u, "soak", "passed");
    }
    let (p0, d0) = (stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap());
    // Nothing changed: nothing to roll.
    let idle = pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    assert_eq!(idle.code, 0, "{:#?}\n{}", idle.summary, idle.stderr);
    // The prefill's file asks for another page size; its unit file and ExecStart do not change.
    let yaml = stack.config_yaml(P);
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(&yaml, format!("{text}page-size: \"16\"\n")).unwrap();
    let (status, diff) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/diff", "");
    assert_eq!(status, 200, "{diff:#}");
    let said = diff.to_string();
    assert!(said.contains(&yaml.display().to_string()), "the file's change is the unit's: {said}");
    let r = pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    assert_eq!(r.code, 1, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("preflight"), Some("incompatible_change")), "{f:#}");
    let cause = f["cause"].as_str().unwrap_or("");
    assert!(cause.contains(&format!("page_size 16 ({P} new) vs 1 ({D} running)")), "{cause}");
    assert!(!r.touched(P) && !r.touched(D), "nothing restarted");
    assert_eq!((stack.show(P, "InvocationID").unwrap(), stack.show(D, "InvocationID").unwrap()), (p0, d0));
}

/// A file SGLang would refuse (not a mapping) is refused in preflight, naming the file.
#[test]
fn a_config_file_sglang_would_refuse_is_refused_in_preflight_naming_it() {
    let opts = StackOptions { flags_in_config: true, ..Default::default() };
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    let yaml = stack.config_yaml(D);
    std::fs::write(&yaml, "- not\n- a mapping\n").unwrap();
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", D, "--load-changes", "--json"], LIMIT);
    assert_eq!(r.code, 2, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["step"].as_str(), f["cause_code"].as_str()), (Some("preflight"), Some("config_invalid")), "{f:#}");
    let cause = f["cause"].as_str().unwrap_or("");
    assert!(cause.contains(&yaml.display().to_string()) && cause.contains("not a mapping"), "{cause}");
    assert!(!r.touched(D));
}

/// The attention-DP width is read as 0.5.23 resolves it: a decode that changes to a width its
/// prefill does not have still pairs (the decode reads the prefill's width from its bootstrap
/// server) and restarts through every gate; a width SGLang refuses to start with is refused in
/// preflight naming the flags, before anything stops.
#[test]
fn a_change_of_attention_dp_width_pairs_and_a_width_sglang_refuses_is_refused_first() {
    let opts = StackOptions::default();
    let (stack, config, d) = stack_with_pdctld_opts(&opts);
    let d0 = stack.show(D, "InvocationID").unwrap();
    let bad = stack.worker_unit(&stack.decode, &opts, &args("--attn-dp-size 3"));
    let exec = bad.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart");
    stack.drop_in(D, "50-dp", &format!("[Service]\nExecStart=\n{exec}\n")).expect("drop-in");
    let r = pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    assert_eq!(r.code, 2, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(D), Some("preflight"), Some("config_invalid")), "{f:#}");
    assert!(f["cause"].as_str().unwrap_or("").contains("--attn-dp-size 3 does not divide --tp-size 4"), "{f:#}");
    assert!(!r.touched(D));
    assert_eq!(stack.show(D, "InvocationID").unwrap(), d0, "nothing stopped");
    // A width that divides: rolled out, paired with the prefill (no attention DP) on the way.
    let good = stack.worker_unit(&stack.decode, &opts, &args("--attn-dp-size 2"));
    let exec = good.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart");
    stack.drop_in(D, "50-dp", &format!("[Service]\nExecStart=\n{exec}\n")).expect("drop-in");
    let r = pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(r.event(D, "preflight", "passed")["detail"]["pairing"][0]["settings"]["attn_dp_size"], "2", "{:#}", r.event(D, "preflight", "passed"));
    r.event(D, "pair", "passed");
    assert_eq!(r.event(D, "metrics", "passed")["detail"]["ranks"].as_array().map(Vec::len), Some(2));
}
