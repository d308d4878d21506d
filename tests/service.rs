//! The service gate (`[verify.slo]`) on the sandbox with the real gateway (smg 1.13) and client
//! traffic through it: a change that starts fine and serves badly — slower, or failing a share
//! of its requests, set by a drop-in as a real bad change is — halts at the soak naming the
//! figure; a good change passes with its figures in the record; too little traffic is "not
//! judged", never a pass.

use std::path::Path;
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_tests::pdctl_sandbox::Gateway;
use pdctl_tests::{assert_recorded, pdctl_daemon, poll_until, record, served_requests, stack_with_pdctld_opts, JsonRun, Load, RouterWatch};

const LIMIT: Duration = Duration::from_secs(300);

/// Every prefill takes 0.3 s (SGLang's latency buckets start at 0.1 s: a faster simulated
/// prefill would put every request in the first bucket, where no slowdown shows).
fn opts(pairs: usize) -> StackOptions {
    StackOptions { pairs, prefill_args: vec!["--sim-prefill-secs".into(), "0.3".into()], ..Default::default() }
}

fn fragment(config: &Path, name: &str, text: &str) {
    std::fs::write(config.parent().unwrap().join("config.d").join(name), text).unwrap();
}

fn router(stack: &Stack) -> String {
    stack.router.as_ref().unwrap().url.clone()
}

fn inv(stack: &Stack, unit: &str) -> String {
    stack.show(unit, "InvocationID").unwrap()
}

fn rollout(d: &pdctl_tests::pdctl_sandbox::stack::Pdctld, config: &Path) -> JsonRun {
    pdctl_daemon(d, config, &["restart", "--rolling", "--load-changes", "--json"], LIMIT)
}

fn soak_of<'a>(run: &'a JsonRun, unit: &str, status: &str) -> &'a serde_json::Value {
    &run.event(unit, "soak", status)["detail"]
}

/// 2P2D: a drop-in that makes the first prefill 3× slower. It starts fine (every earlier gate
/// passes), then its soak compares it with the other prefill over the same window: halted naming
/// its latency, and rolled back to what it ran (serving restored); nothing else is touched.
#[test]
fn a_slower_prefill_halts_at_the_soak_naming_its_latency_and_is_rolled_back() {
    let (stack, config, d) = stack_with_pdctld_opts(&opts(2));
    fragment(
        &config,
        "40-slo.toml",
        "[rollout]\nmin_healthy = \"5s\"\nallow_outage = false\non_failure = \"rollback\"\n[verify.slo]\nmin_requests = 20\nmax_wait = \"60s\"\n",
    );
    assert_eq!(stack.wait_router_healthy(4, Duration::from_secs(60)).unwrap(), 4);
    let workers: Vec<_> = stack.workers().into_iter().cloned().collect();
    let (p, p2) = (&workers[0], &workers[1]);
    let others: Vec<(String, String)> = workers[1..].iter().map(|w| (w.unit.clone(), inv(&stack, &w.unit))).collect();
    let slow = stack.drop_in(&p.unit, "50-slow", "[Service]\nEnvironment=SGLANG_SIM_SLOWDOWN=3\n").unwrap();
    let load = Load::start(&router(&stack), 16.0, 4);
    let watch = RouterWatch::start(&stack);
    let run = rollout(&d, &config);
    let seen = watch.finish();
    let (sent, failed) = load.stop();
    eprintln!("clients: {sent} sent, {failed} failed; summary: {}", run.summary);
    assert_recorded(&d.socket, &run);
    seen.assert_down(1, 0);
    for e in run.events.iter().filter(|e| e["step"] == "soak" && e["status"] != "started") {
        eprintln!("{} soak: {}", e["unit"], e["detail"]);
    }
    assert_eq!(run.summary["result"], "rolled_back", "{:#?} {}", run.summary, run.stderr);
    let f = &run.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(p.unit.as_str()), Some("soak"), Some("slo_regression")), "{f:#}");
    let cause = f["cause"].as_str().unwrap();
    assert!(cause.contains("end-to-end latency p50") && cause.contains(&format!("its peer {}", p2.unit)) && cause.contains("requests"), "{cause}");
    // The figures of both sides and the sample sizes, in the failed soak's detail.
    let slo = &run.events.iter().find(|e| e["unit"] == p.unit.as_str() && e["step"] == "soak" && e["status"] == "failed").unwrap()["detail"]["slo"];
    let fig = &slo["verdict"];
    assert_eq!(fig, "breach", "{slo:#}");
    let e2e = slo["figures"].as_array().unwrap().iter().find(|x| x["name"] == "e2e_p50").unwrap();
    let (mine, theirs) = (e2e["value"].as_f64().unwrap(), e2e["baseline"].as_f64().unwrap());
    assert!(mine > 1.5 * theirs && theirs > 0.2, "3× slower against its peer: {mine} vs {theirs}");
    assert!(slo["requests"].as_u64().unwrap() >= 20 && slo["baseline_requests"].as_u64().unwrap() >= 20, "{slo:#}");
    // No second unit after a failed gate; the slow prefill runs its last good revision again.
    for (unit, before) in &others {
        assert!(!run.touched(unit), "{unit} was touched: {:#?}", run.events);
        assert_eq!(&inv(&stack, unit), before, "{unit} kept its run");
    }
    assert!(!slow.exists(), "the slowing drop-in was moved aside by the rollback");
    assert!(!stack.show(&p.unit, "Environment").unwrap().contains("SGLANG_SIM_SLOWDOWN"), "serving on its old environment");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = format!("{}/workers", router(&stack));
    let back = rt.block_on(poll_until(Duration::from_secs(30), Duration::from_millis(200), || async {
        let v: serde_json::Value = pdctl_tests::http().get(&url).send().await.ok()?.json().await.ok()?;
        let listed = v["workers"].as_array()?.iter().any(|w| w["url"] == p.url.as_str() && w["is_healthy"] == true);
        listed.then_some(())
    }));
    assert!(back.is_some(), "the restored prefill is back in the gateway");
}

/// 2P2D: the prefills' change is good (they pass the service gate, their figures in the record);
/// the first decode's change fails a tenth of its requests after a good start: halted at its soak
/// on its error rate (the gateway's failed attempts to it), the other decode untouched.
#[test]
fn a_good_change_passes_with_its_figures_and_a_decode_failing_a_tenth_halts_on_errors() {
    let (stack, config, d) = stack_with_pdctld_opts(&opts(2));
    // 150 requests (10 a second reach each decode): the decode's fault sets in 6 s after its
    // ready line — after its gates, a change that started fine (its two pair probes would
    // otherwise fail one time in five: CI saw the pair gate halt it) — so ~120 of them fall in
    // the faulty part; the chance that a tenth failing shows at most 1 % (one failure or none)
    // is about 5 in 100,000.
    fragment(&config, "40-slo.toml", "[rollout]\nmin_healthy = \"5s\"\nallow_outage = false\n[verify.slo]\nmin_requests = 150\nmax_wait = \"90s\"\n");
    assert_eq!(stack.wait_router_healthy(4, Duration::from_secs(60)).unwrap(), 4);
    let workers: Vec<_> = stack.workers().into_iter().cloned().collect();
    let prefills: Vec<_> = workers.iter().filter(|w| w.role == "prefill").collect();
    let decodes: Vec<_> = workers.iter().filter(|w| w.role == "decode").collect();
    for p in &prefills {
        stack.drop_in(&p.unit, "50-good", "[Service]\nEnvironment=SGLANG_SIM_TOKENS_PER_SEC=200\n").unwrap();
    }
    stack.drop_in(&decodes[0].unit, "50-failing", "[Service]\nEnvironment=SGLANG_SIM_FAIL_FRACTION=0.1 SGLANG_SIM_FAULTS_AFTER=6\n").unwrap();
    let d2 = inv(&stack, &decodes[1].unit);
    let load = Load::start(&router(&stack), 20.0, 4);
    let run = rollout(&d, &config);
    let (sent, failed) = load.stop();
    eprintln!("clients: {sent} sent, {failed} failed; summary: {}", run.summary);
    for e in run.events.iter().filter(|e| e["step"] == "soak" && e["status"] != "started") {
        eprintln!("{} soak: {}", e["unit"], e["detail"]);
    }
    for p in &prefills {
        let slo = &soak_of(&run, &p.unit, "passed")["slo"];
        assert_eq!(slo["verdict"], "pass", "{}: {slo:#}", p.unit);
        assert!(slo["requests"].as_u64().unwrap() >= 150, "{slo:#}");
        assert_eq!(slo["baseline"]["kind"], "peers", "{slo:#}");
        assert!(slo["figures"].as_array().unwrap().iter().any(|x| x["name"] == "e2e_p50"), "{slo:#}");
    }
    assert_eq!(run.code, 1, "{:#?} {}", run.summary, run.stderr);
    let f = &run.summary["failed"];
    assert_eq!(
        (f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()),
        (Some(decodes[0].unit.as_str()), Some("soak"), Some("slo_regression")),
        "{f:#}"
    );
    assert!(f["cause"].as_str().unwrap().contains("error rate"), "{f:#}");
    assert!(!run.touched(&decodes[1].unit));
    assert_eq!(inv(&stack, &decodes[1].unit), d2);
}

/// 1P1D: the prefill is the only one of its role, so its soak is judged against its own figures
/// from before its drain (its old process served the same traffic).
#[test]
fn alone_in_its_role_a_slower_prefill_is_judged_against_its_own_figures_from_before_its_drain() {
    alone_in_its_role(Gateway::Smg113, true);
}

/// The same behind sglang-router 0.3.2 (which exports the same per-worker outcomes,
/// `smg_worker_cb_outcomes_total`: measured here, the error rate is read from it too).
#[test]
fn alone_in_its_role_a_slower_prefill_is_judged_the_same_behind_sglang_router_0_3_2() {
    alone_in_its_role(Gateway::SglangRouter032, false);
}

/// `rollback`: with `on_failure = "rollback"` (the restored revision's soak is judged against the
/// same figures from before the rollout, not against the slow run it replaces).
fn alone_in_its_role(gateway: Gateway, rollback: bool) {
    let (stack, config, d) = stack_with_pdctld_opts(&StackOptions { gateway, ..opts(1) });
    let on_failure = if rollback { "on_failure = \"rollback\"\n" } else { "" };
    fragment(&config, "40-slo.toml", &format!("[rollout]\nmin_healthy = \"3s\"\n{on_failure}[verify.slo]\nmin_requests = 20\nmax_wait = \"60s\"\n"));
    assert_eq!(stack.wait_router_healthy(2, Duration::from_secs(60)).unwrap(), 2);
    let d0 = inv(&stack, &stack.decode.unit);
    let load = Load::start(&router(&stack), 10.0, 4);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = stack.prefill.url.clone();
    let warmed = rt.block_on(poll_until(Duration::from_secs(60), Duration::from_millis(250), || async { (served_requests(&url).await >= 30.0).then_some(()) }));
    assert!(warmed.is_some(), "the old prefill served 30 requests before the rollout");
    stack.drop_in(&stack.prefill.unit, "50-slow", "[Service]\nEnvironment=SGLANG_SIM_SLOWDOWN=3\n").unwrap();
    let run = rollout(&d, &config);
    load.stop();
    assert_eq!(run.code, 1, "{:#?} {}", run.summary, run.stderr);
    assert_recorded(&d.socket, &run);
    let f = &run.summary["failed"];
    assert_eq!((f["step"].as_str(), f["cause_code"].as_str()), (Some("soak"), Some("slo_regression")), "{f:#}");
    assert!(f["cause"].as_str().unwrap().contains("its own figures from before its drain"), "{f:#}");
    let slo = &run.events.iter().find(|e| e["step"] == "soak" && e["status"] == "failed").unwrap()["detail"]["slo"];
    assert_eq!(slo["errors_from"], "the gateway's failed attempts", "{}: {slo:#}", gateway.name());
    assert!(!run.touched(&stack.decode.unit));
    assert_eq!(inv(&stack, &stack.decode.unit), d0);
    if rollback {
        assert_eq!(run.summary["result"], "rolled_back", "{:#?}", run.summary);
        let again = &run.events.iter().rfind(|e| e["step"] == "soak" && e["status"] == "passed").expect("the restored revision's soak")["detail"]["slo"];
        let baseline = |s: &serde_json::Value| {
            s["figures"].as_array().and_then(|f| f.iter().find(|x| x["name"] == "e2e_p50")).map(|x| x["baseline"].clone()).unwrap_or_default()
        };
        assert!(baseline(slo).is_number(), "{slo:#}");
        assert_eq!(baseline(again), baseline(slo), "the same baseline, from before the rollout: {again:#}");
        assert_eq!(again["baseline_requests"], slo["baseline_requests"], "{again:#}");
    }
}

/// Too little traffic to judge (only pdctl's own probe, far below `min_requests`), with
/// `unjudged = "pass"`: the rollout succeeds, and both the soak and the record say "not judged"
/// — never a pass in disguise.
#[test]
fn too_little_traffic_is_said_not_judged() {
    let (stack, config, d) = stack_with_pdctld_opts(&opts(1));
    fragment(&config, "40-slo.toml", "[verify.slo]\nmin_requests = 1000\nmax_wait = \"1s\"\nunjudged = \"pass\"\n");
    assert_eq!(stack.wait_router_healthy(2, Duration::from_secs(60)).unwrap(), 2);
    let run = rollout(&d, &config);
    assert_eq!(run.code, 0, "{:#?} {}", run.summary, run.stderr);
    let soak = soak_of(&run, &stack.prefill.unit, "passed");
    assert_eq!(soak["slo"]["verdict"], "not_judged", "{soak:#}");
    let note = soak["note"].as_str().unwrap();
    assert!(note.contains("not judged") && note.contains("fewer than min_requests = 1000"), "{note}");
    assert_eq!(soak["slo"]["judged_by"], "not_judged_passed", "{soak:#}");
    let rec = record(&d.socket, run.summary["id"].as_str().unwrap());
    assert!(rec["notes"].to_string().contains("was not judged"), "the record's notes say so: {}", rec["notes"]);
    // With `unjudged = "fail"` the same is a failed soak, and nothing after it restarts.
    fragment(&config, "41-fail.toml", "[verify.slo]\nunjudged = \"fail\"\n");
    let d0 = inv(&stack, &stack.decode.unit);
    let run = rollout(&d, &config);
    assert_eq!(run.code, 1, "{:#?} {}", run.summary, run.stderr);
    let f = &run.summary["failed"];
    assert_eq!(
        (f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()),
        (Some(stack.prefill.unit.as_str()), Some("soak"), Some("slo_not_judged")),
        "{f:#}"
    );
    assert!(!run.touched(&stack.decode.unit));
    assert_eq!(inv(&stack, &stack.decode.unit), d0);
}

/// 2P2D, the gateway's traffic too thin to judge (no client; `min_requests` out of its reach in
/// `max_wait`), a drop-in that makes the first prefill 3× slower: with the default `unjudged =
/// "probe"` pdctl judges with its own sample — PD pairs sent straight to the restarted prefill
/// and to its peer, with the same decode — and halts on its end-to-end latency; nothing else is
/// restarted. A canary that saw no traffic is no pass.
#[test]
fn thin_traffic_is_judged_by_pdctls_own_sample_and_a_slow_prefill_halts() {
    let (stack, config, d) = stack_with_pdctld_opts(&opts(2));
    fragment(&config, "40-slo.toml", "[rollout]\nmin_healthy = \"3s\"\nallow_outage = false\n[verify.slo]\nmin_requests = 10\nmax_wait = \"2s\"\n");
    assert_eq!(stack.wait_router_healthy(4, Duration::from_secs(60)).unwrap(), 4);
    let workers: Vec<_> = stack.workers().into_iter().cloned().collect();
    let (p, p2) = (&workers[0], &workers[1]);
    let others: Vec<(String, String)> = workers[1..].iter().map(|w| (w.unit.clone(), inv(&stack, &w.unit))).collect();
    stack.drop_in(&p.unit, "50-slow", "[Service]\nEnvironment=SGLANG_SIM_SLOWDOWN=3\n").unwrap();
    let run = rollout(&d, &config);
    assert_eq!(run.code, 1, "{:#?} {}", run.summary, run.stderr);
    let f = &run.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(p.unit.as_str()), Some("soak"), Some("slo_regression")), "{f:#}");
    let cause = f["cause"].as_str().unwrap();
    assert!(cause.contains("pdctl's own sample") && cause.contains(&format!("its peer {}", p2.unit)), "{cause}");
    // Its next names this rollout, runnable as printed.
    let id = run.summary["id"].as_str().unwrap();
    assert!(f["next"].as_str().unwrap().contains(&format!("`pdctl rollout show {id}`")), "{f:#}");
    let slo = &run.events.iter().find(|e| e["unit"] == p.unit.as_str() && e["step"] == "soak" && e["status"] == "failed").unwrap()["detail"]["slo"];
    assert_eq!(slo["judged_by"], "pdctl_sample", "{slo:#}");
    assert_eq!(slo["requests"], 10, "{slo:#}");
    for (unit, before) in &others {
        assert!(!run.touched(unit), "{unit} was touched");
        assert_eq!(&inv(&stack, unit), before, "{unit} kept its run");
    }
}
