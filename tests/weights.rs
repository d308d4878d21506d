//! New weights without a restart (`pdctl rollout weights`) on the sandbox behind the real
//! gateway, under load through it: every request answered (they wait for the load), no PD
//! request decoded from KV of another weight version (the simulator's own counter, which the
//! hazard test shows does count), nothing restarted; a load that fails on the decode puts the
//! prefill back on its previous weights.

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_tests::{human, model_info, ready};
use serde_json::Value;

#[path = "weights/paused.rs"]
mod paused;
#[path = "weights/prefetch.rs"]
mod prefetch;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

/// `sglang_sim_pd_*_requests_total` on the decode: `(decoded, mixed)`.
fn pd_counts(stack: &Stack) -> (f64, f64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let text = rt.block_on(async { pdctl_tests::http().get(format!("{}/metrics", stack.decode.url)).send().await.expect("GET").text().await.expect("body") });
    let value = |name: &str| {
        text.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN)
    };
    (value("sglang_sim_pd_decoded_requests_total"), value("sglang_sim_pd_mixed_version_requests_total"))
}

fn runs(stack: &Stack) -> (String, String) {
    (stack.show(P, "InvocationID").expect("p"), stack.show(D, "InvocationID").expect("d"))
}

#[test]
fn new_weights_go_in_without_a_restart_with_no_failed_request_and_no_mixed_pair() {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld();
    let before = runs(&stack);
    let load = pdctl_tests::Load::start(&stack.router.as_ref().expect("router").url, 10.0, 8);
    // Traffic before the change: the counter below is a measurement, not a silence.
    assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pd_counts(&stack).0 >= 10.0), "PD traffic flows");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127", "--version", "ft-1127", "--json"], LIMIT);
    let (sent, failed) = load.stop();
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(failed, 0, "every request was answered ({sent} sent): they waited for the load");
    assert!(sent >= 30, "{sent}");
    for url in [&stack.prefill.url, &stack.decode.url] {
        let m = model_info(url);
        assert_eq!((m["model_path"].as_str(), m["weight_version"].as_str()), (Some("/models/dsv4-ft-1127"), Some("ft-1127")), "{m:#}");
    }
    assert_eq!(runs(&stack), before, "nothing was restarted");
    let (decoded, mixed) = pd_counts(&stack);
    assert_eq!(mixed, 0.0, "no PD request was decoded from KV of another version ({decoded} decoded)");
    let step = r.events.iter().find(|e| e["unit"] == P && e["step"] == "weights" && e["status"] == "passed").expect("the prefill's weights step");
    assert_eq!((step["detail"]["from"]["weight_version"].as_str(), step["detail"]["to"]["weight_version"].as_str()), (Some("default"), Some("ft-1127")));
    // Under 10 requests a second each worker's cache was flushed after the load, and the record
    // says how (while paused, after the continue, or in a quiet window).
    for u in [P, D] {
        let s = r.events.iter().find(|e| e["unit"] == u && e["step"] == "weights" && e["status"] == "passed").expect("weights step");
        let how = s["detail"]["cache_flushed"].as_str().unwrap_or("never");
        assert!(!how.starts_with("not flushed") && how != "never", "{u}: {how}");
        println!("{u}: cache flushed {how}");
    }
    let waited = step["detail"]["paused_ms"].as_u64().expect("paused_ms");
    assert!(waited >= 2000, "the pause covers the load (2 s in the simulator): {waited} ms");
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("weights"), Some("succeeded")), "{rec:#}");
    assert!(rec["notes"].as_array().is_some_and(|n| n.iter().any(|x| x.as_str().unwrap_or("").starts_with("every worker was paused for"))), "{rec:#}");
    // What an operator reads: the dry run touches nothing, the last line says what happened.
    // A checkpoint that is not on the host, or a path with `..`: refused, as the dry run says
    // (it used to say "✓ dry run" for a missing one).
    let (code, out) = human(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1201", "--dry-run"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.lines().last().is_some_and(|l| l.contains("does not exist on this host") && l.contains("nothing was touched")), "{out}");
    let (code, out) = human(&d, &config, &["rollout", "weights", "--model-path", "/models/../etc", "--dry-run"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("`..`"), "{out}");
    let ft1201 = stack.sandbox.dir().join("models/dsv4-ft-1201").display().to_string();
    std::fs::create_dir_all(&ft1201).expect("the checkpoint's directory");
    let (code, out) = human(&d, &config, &["rollout", "weights", "--model-path", &ft1201, "--dry-run"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("serves /models/dsv4-ft-1127 (weight_version ft-1127)")
            && out.lines().last().unwrap_or("").starts_with("pdctl: ✓ dry run: nothing was touched"),
        "{out}"
    );
    assert_eq!(model_info(&stack.decode.url)["weight_version"], "ft-1127", "the dry run loaded nothing");
    let (code, out) = human(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1201", "--version", "ft-1201"]);
    assert_eq!(code, 0, "{out}");
    let last = out.lines().last().unwrap_or("");
    assert!(last.starts_with("pdctl: ✓ succeeded (rollout ") && last.contains("all 2 worker(s) serve the new weights, verified, without a restart"), "{out}");
    assert!(
        out.contains("pdctl: weights rollout, every worker at once, without a restart (run by pdctld)") && !out.contains("rolling restart"),
        "the header says what runs: {out}"
    );
    assert_eq!(runs(&stack), before, "still nothing restarted");
}

/// The hazard is real in the simulator: loading the prefill alone (no pause, the decode left on
/// its old weights) makes PD requests decode KV of another version, and the counter says so.
#[test]
fn loading_one_role_alone_pairs_versions_and_the_simulator_counts_them() {
    let (stack, _config) = pdctl_tests::stack_with_config(&StackOptions::default());
    let load = pdctl_tests::Load::start(&stack.router.as_ref().expect("router").url, 10.0, 8);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let r = rt.block_on(async {
        let body = serde_json::json!({"model_path": "/models/dsv4-ft-1127", "weight_version": "ft-1127"});
        pdctl_tests::http()
            .post(format!("{}/update_weights_from_disk", stack.prefill.url))
            .json(&body)
            .send()
            .await
            .expect("POST")
            .json::<Value>()
            .await
            .expect("JSON")
    });
    assert_eq!(r["success"], true, "{r:#}");
    assert!(
        pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pd_counts(&stack).1 >= 5.0),
        "mixed pairs counted: {:?}",
        pd_counts(&stack)
    );
    let _ = load.stop();
}

#[test]
fn a_weights_load_that_fails_on_the_decode_puts_the_prefill_back_and_every_worker_continues() {
    let opts = StackOptions { decode_args: vec!["--sim-weights-fail".into()], ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let load = pdctl_tests::Load::start(&stack.router.as_ref().expect("router").url, 10.0, 8);
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127", "--version", "ft-1127", "--json"], LIMIT);
    let (sent, failed) = load.stop();
    assert_eq!(r.code, 1, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["step"].as_str(), f["cause_code"].as_str()), (Some(D), Some("weights"), Some("weights_failed")), "{f:#}");
    assert!(f["cause"].as_str().unwrap_or("").contains("simulated: --sim-weights-fail"), "SGLang's message: {f:#}");
    for url in [&stack.prefill.url, &stack.decode.url] {
        let m = model_info(url);
        assert_eq!(m["weight_version"], "default", "back on its previous weights: {m:#}");
    }
    assert!(r.events.iter().any(|e| e["unit"] == P && e["step"] == "rollback" && e["status"] == "passed"), "the prefill's previous weights loaded again");
    assert_eq!(failed, 0, "every request was answered ({sent} sent)");
    let (_, mixed) = pd_counts(&stack);
    assert_eq!(mixed, 0.0);
    // Serving after it: a request through the gateway.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let ok = rt.block_on(async {
        let body = serde_json::json!({"text": "hello", "sampling_params": {"max_new_tokens": 4}});
        pdctl_tests::http()
            .post(format!("{}/generate", stack.router.as_ref().expect("router").url))
            .json(&body)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    });
    assert!(ok, "the stack serves after the failed load");
}

/// A restart that changes the decode's model path while the prefill serves the old one would pair
/// versions: refused in preflight (`mixed_versions`, exit 2), nothing restarted. Restarted
/// together with its prefill (`single_pair = "together"`, 1P1D) it passes: no old worker serves
/// while a new one does.
#[test]
fn a_model_change_that_would_pair_versions_is_refused_and_passes_restarted_together() {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld();
    let opts = StackOptions::default();
    for (unit, w) in [(P, &stack.prefill), (D, &stack.decode)] {
        let exec = stack.worker_unit(w, &opts, &["--model-path".into(), "/models/dsv4-ft-1127".into()]);
        let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
        stack.drop_in(unit, "50-new-model", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
    }
    let before = runs(&stack);
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--load-changes", "--json"], LIMIT);
    assert_eq!(r.code, 2, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["step"].as_str(), f["cause_code"].as_str()), (Some("preflight"), Some("mixed_versions")), "{f:#}");
    assert!(f["cause"].as_str().unwrap_or("").contains("→ /models/dsv4-ft-1127"), "{f:#}");
    assert_eq!(runs(&stack), before, "nothing was restarted");
    std::fs::write(config.parent().expect("dir").join("config.d/40-together.toml"), "[rollout]\nsingle_pair = \"together\"\nallow_outage = true\n")
        .expect("together");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--load-changes", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    for url in [&stack.prefill.url, &stack.decode.url] {
        assert_eq!(model_info(url)["model_path"], "/models/dsv4-ft-1127");
    }
    let pre = r.events.iter().find(|e| e["unit"] == D && e["step"] == "preflight" && e["status"] == "passed").expect("the decode's preflight");
    assert!(pre["detail"]["warnings"].as_array().is_some_and(|w| w.iter().any(|x| x.as_str().unwrap_or("").contains("restarted together"))), "{pre:#}");
}

/// The hazard of a plain rolling restart of a model change, proven in the simulator: with
/// `coherent = "never"` (the warning instead of the refusal) the prefill restarts onto the new
/// model first while the decode still runs the old one, and under load PD requests decode KV of
/// the other model meanwhile — the counter says so.
#[test]
fn a_plain_rolling_restart_of_a_model_change_pairs_versions_as_coherent_never_warns() {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld();
    std::fs::write(config.parent().expect("dir").join("config.d/40-never.toml"), "[rollout]\ncoherent = \"never\"\n").expect("never");
    let opts = StackOptions::default();
    for (unit, w) in [(P, &stack.prefill), (D, &stack.decode)] {
        let exec = stack.worker_unit(w, &opts, &["--model-path".into(), "/models/dsv4-ft-1127".into()]);
        let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
        stack.drop_in(unit, "50-new-model", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
    }
    // The old decode's counter dies with its process: watched while the rollout runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, url) = (stop.clone(), stack.decode.url.clone());
        std::thread::spawn(move || {
            let mut most = 0.0f64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(mixed_at(&url));
                std::thread::sleep(Duration::from_millis(200));
            }
            most
        })
    };
    let load = pdctl_tests::Load::start(&stack.router.as_ref().expect("router").url, 10.0, 8);
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--load-changes", "--json"], LIMIT);
    let _ = load.stop();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let most = watcher.join().expect("watcher");

    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let pre = r.events.iter().find(|e| e["unit"] == P && e["step"] == "preflight" && e["status"] == "passed").expect("the prefill's preflight");
    assert!(
        pre["detail"]["warnings"].as_array().is_some_and(|w| w.iter().any(|x| x.as_str().unwrap_or("").starts_with("mixed versions (coherent = \"never\")"))),
        "{pre:#}"
    );
    assert!(most >= 1.0, "PD requests decoded KV of the other model while the decode still ran the old one: {most} counted");
}

/// The decode's mixed-version counter now (0 when it cannot be read: it is restarting).
fn mixed_at(url: &str) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let text = rt.block_on(async { pdctl_tests::http().get(format!("{url}/metrics")).send().await.ok()?.text().await.ok() }).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("sglang_sim_pd_mixed_version_requests_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The decodes' `(decoded, mixed)` counters summed (a 2P2D stack has two).
fn pd_counts_of(urls: &[String]) -> (f64, f64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut sum = (0.0, 0.0);
    for url in urls {
        let text = rt.block_on(async { pdctl_tests::http().get(format!("{url}/metrics")).send().await.ok()?.text().await.ok() }).unwrap_or_default();
        let value = |name: &str| {
            text.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        };
        sum.0 += value("sglang_sim_pd_decoded_requests_total");
        sum.1 += value("sglang_sim_pd_mixed_version_requests_total");
    }
    sum
}

/// 2P2D behind the real gateway, under load through it: a model-path change written to every
/// worker's files is rolled out by `pdctl rollout apply` in place (the change is new weights
/// only, the tokenizer pinned): 0 failed requests, 0 PD requests decoded from KV of the other
/// version, nothing restarted, every worker on the new model, the files on record (nothing stale
/// after), and a later restart is not refused (the coherence check reads `/model_info`, where
/// 0.5.23 reports a weight update; `/server_info` keeps the startup values). Then the same kind
/// of change rolled out the old way (`in_place = "never"`, `coherent = "never"`: a plain rolling
/// restart) pairs versions: the hazard is real in the simulator.
#[test]
fn a_config_rollout_of_a_new_model_path_in_2p2d_loads_it_in_place_under_load_with_no_mixed_pair() {
    let pin = vec!["--tokenizer-path".to_string(), "/models/dsv4-tokenizer".to_string()];
    let opts = StackOptions { pairs: 2, prefill_args: pin.clone(), decode_args: pin.clone(), ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let workers: Vec<(String, String)> = stack.workers().iter().map(|w| (w.unit.clone(), w.url.clone())).collect();
    let decodes: Vec<String> = stack.workers().iter().filter(|w| w.role == "decode").map(|w| w.url.clone()).collect();
    assert_eq!((workers.len(), decodes.len()), (4, 2));
    let invocations = || workers.iter().map(|(u, _)| stack.show(u, "InvocationID").expect("show")).collect::<Vec<_>>();
    let change = |model: &str| {
        for w in stack.workers() {
            let mut extra = pin.clone();
            extra.extend(["--model-path".to_string(), model.to_string()]);
            let exec = stack.worker_unit(w, &opts, &extra);
            let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
            stack.drop_in(&w.unit, "50-new-model", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
        }
    };
    let before = invocations();
    let router = stack.router.as_ref().expect("router").url.clone();
    let load = pdctl_tests::Load::start(&router, 10.0, 8);
    assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pd_counts_of(&decodes).0 >= 10.0), "PD traffic flows");
    change("/models/dsv4-ft-1201");
    // The plan before anything starts: in place, every worker paused for the load.
    let (code, out) = human(&d, &config, &["rollout", "diff"]);
    assert!(code == 0 && out.contains("rollout apply loads /models/dsv4-ft-1201 in place into all 4 workers at once"), "{code}: {out}");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    let (sent, failed) = load.stop();
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(failed, 0, "every request was answered ({sent} sent)");
    assert!(sent >= 30, "{sent}");
    let (decoded, mixed) = pd_counts_of(&decodes);
    assert_eq!(mixed, 0.0, "no PD request decoded KV of the other model ({decoded} decoded)");
    assert_eq!(invocations(), before, "nothing was restarted");
    for (unit, url) in &workers {
        assert_eq!(model_info(url)["model_path"], "/models/dsv4-ft-1201", "{unit}");
        assert!(r.events.iter().any(|e| e["unit"] == unit.as_str() && e["step"] == "weights" && e["status"] == "passed"), "{unit} loaded in place");
    }
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert_eq!(
        (rec["kind"].as_str(), rec["in_place"].as_bool(), rec["lifecycle"]["state"].as_str()),
        (Some("apply"), Some(true), Some("succeeded")),
        "{rec:#}"
    );
    // On record: nothing is stale now, and restarting a prefill is no model change.
    let (code, out) = human(&d, &config, &["rollout", "apply"]);
    assert!(code == 0 && out.contains("no worker is stale"), "{code}: {out}");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", &workers[0].0, "--json"], LIMIT);
    assert_eq!(r.code, 0, "a restart after the load is not a model change: {:#}\n{}", r.summary, r.stderr);
    assert_eq!(model_info(&workers[0].1)["model_path"], "/models/dsv4-ft-1201", "restarted from the new files");

    // The old way: every worker restarted in turn while the others serve the other model.
    std::fs::write(config.parent().expect("dir").join("config.d/40-old-way.toml"), "[rollout]\nin_place = \"never\"\ncoherent = \"never\"\n").expect("old way");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, urls) = (stop.clone(), decodes.clone());
        std::thread::spawn(move || {
            let mut most = [0.0f64; 2];
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for (i, u) in urls.iter().enumerate() {
                    most[i] = most[i].max(mixed_at(u));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            most[0] + most[1]
        })
    };
    let load = pdctl_tests::Load::start(&router, 10.0, 8);
    change("/models/dsv4-ft-1202");
    let (_, out) = human(&d, &config, &["rollout", "diff"]);
    assert!(out.contains("one at a time through every gate (not loadable in place: [rollout] in_place = \"never\")"), "{out}");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    let _ = load.stop();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let most = watcher.join().expect("watcher");
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert!(!r.events.iter().any(|e| e["step"] == "weights"), "restarted, not loaded in place");
    assert!(most >= 1.0, "a plain rolling restart pairs versions: {most} mixed PD requests counted");
}

/// 2P2D behind the real gateway, under load through it: a change that cannot be loaded in place
/// (a quantization, in every worker's files) is rolled out as a coherent switch — the dry run
/// states the plan and its capacity first; then one prefill and one decode restart onto the new
/// model out of the gateway while the other two serve, the gateway switches from the old pair to
/// the new one (the window without a routable pair measured and reported), and the old pair
/// restarts and rejoins. No PD request decodes KV of the other model (each decode's counter,
/// watched over the whole rollout: a restarted decode starts a new count), every worker runs the
/// new quantization, and each was restarted once.
#[test]
fn a_quantization_change_in_2p2d_is_rolled_as_a_coherent_switch_with_no_mixed_pair() {
    let opts = StackOptions { pairs: 2, ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let workers: Vec<(String, String)> = stack.workers().iter().map(|w| (w.unit.clone(), w.url.clone())).collect();
    let decodes: Vec<String> = stack.workers().iter().filter(|w| w.role == "decode").map(|w| w.url.clone()).collect();
    assert_eq!((workers.len(), decodes.len()), (4, 2));
    let invocations = || workers.iter().map(|(u, _)| stack.show(u, "InvocationID").expect("show")).collect::<Vec<_>>();
    let before = invocations();
    for w in stack.workers() {
        let exec = stack.worker_unit(w, &opts, &["--quantization".into(), "fp8".into()]);
        let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
        stack.drop_in(&w.unit, "50-fp8", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
    }
    // The plan before anything starts: which group goes first, what serves meanwhile.
    let (code, out) = human(&d, &config, &["restart", "--rolling", "--load-changes", "--dry-run"]);
    assert!(code == 0 && out.contains("coherent switch:") && out.contains("(1 of 2 prefills, 1 of 2 decodes)"), "{code}: {out}");
    let watch = pdctl_tests::MixedWatch::start(decodes.clone());
    let router = stack.router.as_ref().expect("router").url.clone();
    let load = pdctl_tests::Load::start(&router, 10.0, 8);
    assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pd_counts_of(&decodes).0 >= 10.0), "PD traffic flows");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], Duration::from_secs(300));
    let (sent, failed) = load.stop();
    let mixed = watch.stop();
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let (decoded, mixed_now) = pd_counts_of(&decodes);
    assert_eq!((mixed, mixed_now), (0.0, 0.0), "no PD request decoded KV of the other model ({decoded} decoded since the last restarts)");
    assert!(decoded >= 1.0, "the new pairs decoded PD requests: {decoded}");
    let after = invocations();
    for (i, (unit, url)) in workers.iter().enumerate() {
        assert_ne!(after[i], before[i], "{unit} was restarted");
        let restarts = r.events.iter().filter(|e| e["unit"] == unit.as_str() && e["step"] == "restart" && e["status"] == "passed").count();
        assert_eq!(restarts, 1, "{unit} restarted once");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let info: Value = rt.block_on(async { pdctl_tests::http().get(format!("{url}/server_info")).send().await.expect("GET").json().await.expect("JSON") });
        assert_eq!(info["quantization"], "fp8", "{unit}");
    }
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    let notes: Vec<&str> = rec["notes"].as_array().expect("notes").iter().filter_map(Value::as_str).collect();
    let switched = notes.iter().find(|n| n.starts_with("switched the gateway from")).unwrap_or_else(|| panic!("the switch is on record: {notes:#?}"));
    let window: u64 = switched.split("for ").nth(1).and_then(|t| t.split(" ms").next()).and_then(|n| n.parse().ok()).expect("the window in ms");
    // The new group's router gates run at the switch, after every restart of the new group and
    // before any restart of the old one.
    let at = |unit: &str, step: &str| r.events.iter().position(|e| e["unit"] == unit && e["step"] == step && e["status"] == "passed").expect("event");
    let (p0, p1, d0, d1) = (&workers[0].0, &workers[1].0, &workers[2].0, &workers[3].0);
    let roles: Vec<&str> = stack.workers().iter().map(|w| w.role).collect();
    assert_eq!(roles, ["prefill", "prefill", "decode", "decode"], "the stack's order");
    assert!(at(p0, "restart") < at(d0, "restart") && at(d0, "restart") < at(p0, "router"), "the new group restarts before it is admitted");
    assert!(at(p0, "router") < at(d1, "restart") && at(d1, "restart") < at(p1, "restart"), "the old group restarts after the switch, its decode first");
    // Its router detail is the gate's (the gateway's entry) and when it was admitted at the switch.
    let admitted = &r.events[at(p0, "router")]["detail"];
    assert!(admitted["router_id"].is_string() && admitted["switch"]["admitted_after_ms"].is_u64(), "{admitted:#}");
    println!("coherent switch: no PD pair routable for {window} ms; {failed} of {sent} requests failed through the gateway over the rollout");
}
