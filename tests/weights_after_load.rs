//! What a load of new weights in place leaves behind, on the sandbox behind the real gateway: a
//! prefix cache of the old weights that cannot be flushed (the rollout fails naming the worker,
//! the new weights kept), and a pause as long as SGLang's `/health` timeout (the servers marked
//! UnHealthy set Up again, said after the pause and before the next one).

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_tests::{human, model_info, ready};

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn runs(stack: &Stack) -> (String, String) {
    (stack.show(P, "InvocationID").expect("p"), stack.show(D, "InvocationID").expect("d"))
}

/// A worker whose cache cannot be flushed after the load (its scheduler never idle, as a prefill
/// under sustained load): the rollout does not end `succeeded` — it fails at that worker's
/// weights step naming it and what to do; the new weights stay on every worker (putting the old
/// ones back would leave KV of the new ones cached instead), every worker continued, nothing
/// restarted, and the last line says what is true.
#[test]
fn a_cache_that_cannot_be_flushed_after_the_load_fails_the_rollout_naming_the_worker() {
    let opts = pdctl_tests::pdctl_sandbox::stack::StackOptions { prefill_args: vec!["--sim-cache-never-idle".into()], ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    std::fs::write(config.parent().expect("dir").join("config.d").join("20-health.toml"), "[rollout]\nhealth_timeout = \"3s\"\n").expect("fragment");
    let before = runs(&stack);
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127", "--json"], LIMIT);
    assert_eq!(r.code, 1, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(P), Some("weights"), Some("weights_failed")), "{f:#}");
    let cause = f["cause"].as_str().unwrap_or("");
    assert!(
        cause.contains("prefix cache was not flushed") && cause.contains("/flush_cache") && cause.contains(&format!("pdctl restart --rolling --unit {P}")),
        "{cause}"
    );
    let step = r.events.iter().find(|e| e["unit"] == P && e["step"] == "weights" && e["status"] == "failed").expect("the prefill's weights step failed");
    assert!(step["detail"]["cache_flushed"].as_str().is_some_and(|c| c.starts_with("not flushed")), "{step:#}");
    let dstep = r.events.iter().find(|e| e["unit"] == D && e["step"] == "weights" && e["status"] == "passed").expect("the decode's weights step passed");
    assert!(dstep["detail"]["cache_flushed"].as_str().is_some_and(|c| !c.starts_with("not flushed")), "{dstep:#}");
    for url in [&stack.prefill.url, &stack.decode.url] {
        assert_eq!(model_info(url)["model_path"], "/models/dsv4-ft-1127", "the new weights stay");
        assert_eq!(ready(url), 200, "continued");
    }
    assert_eq!(runs(&stack), before, "nothing was restarted");
    let (code, out) = human(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1201"]);
    assert_eq!(code, 1, "{out}");
    let last = out.lines().last().unwrap_or("");
    assert!(last.contains("every worker serves the new weights, but") && last.contains(P) && last.contains("next:"), "{out}");
}

/// A load longer than SGLang's `/health` timeout (here `SGLANG_HEALTH_CHECK_TIMEOUT=2`, 20 s by
/// default): a `/health` sent during the pause — the gateway's health check — fails and marks the
/// server UnHealthy (`/ready` 503, and a SIGTERM would force-exit without draining). pdctl's own
/// `/health` after the continue sets it Up again at once, and the record says what happened and
/// that it was undone (before, the note claimed requests waited the pause "at most" and said
/// nothing of the failed health check; the server was left to the next `/health` to recover).
#[test]
fn a_pause_longer_than_the_health_timeout_leaves_no_worker_unhealthy() {
    let slow = vec!["--sim-weights-load-secs".to_string(), "5".to_string()];
    let opts = StackOptions { prefill_args: slow.clone(), decode_args: slow, worker_env: vec!["SGLANG_HEALTH_CHECK_TIMEOUT=2".into()], ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let mut c = pdctl_tests::live_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127", "--json"]);
    assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(100), || ready(&stack.decode.url) == 503), "the decode is paused");
    // The gateway's health check during the pause: it waits 2 s, then fails.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let during = rt.block_on(async { pdctl_tests::http().get(format!("{}/health", stack.decode.url)).send().await.map(|r| r.status().as_u16()).unwrap_or(0) });
    assert_eq!(during, 503, "a /health during the pause fails after SGLANG_HEALTH_CHECK_TIMEOUT");
    let end = c.wait_line(LIMIT, |e| e.get("result").is_some()).expect("the rollout ends");
    assert_eq!(c.finish(LIMIT), Some(0), "{end:#}");
    assert_eq!(end["result"], "succeeded", "{end:#}");
    assert_eq!(ready(&stack.decode.url), 200, "the decode is Up again, not left UnHealthy");
    let id = end["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    let notes = rec["notes"].to_string();
    assert!(notes.contains("as long as SGLang's /health timeout") && notes.contains(&format!("{D} (Up again)")), "{notes}");
    // The next load is said beforehand: the last one took as long as the health timeout.
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1201", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    let notes = rec["notes"].to_string();
    assert!(notes.contains(&format!("{D}: its last load of new weights took 5")), "{notes}");
}
