//! `sglang-sim` against SGLang's observable behaviour (docs/sglang-sim.md): flags and argparse errors, lifecycle lines and the
//! port/health timeline, `/metrics` by version (checked by the Python `prometheus_client` parser),
//! lazy gauges, KV accounting with in-flight requests, and every fault knob.

use std::collections::BTreeSet;
use std::time::Duration;

use pdctl_tests::{http, poll_until, python_parse, SimProc};
use serde_json::{json, Value};

#[path = "sim/pd.rs"]
mod pd;
#[path = "sim/role_switch.rs"]
mod role_switch;

const T: Duration = Duration::from_secs(15);

async fn status(url: &str) -> Option<u16> {
    http().get(url).send().await.ok().map(|r| r.status().as_u16())
}

async fn metrics(sim: &SimProc, accept: Option<&str>) -> reqwest::Response {
    let mut rq = http().get(format!("{}/metrics", sim.url()));
    if let Some(a) = accept {
        rq = rq.header("accept", a);
    }
    rq.send().await.expect("/metrics answers")
}

async fn generate(sim: &SimProc, max_new: u64) -> Value {
    let r = http()
        .post(format!("{}/generate", sim.url()))
        // SGLang's fake bootstrap host: a PD server serves it without a peer (as its own warmup).
        .json(&json!({"text": "Hello there", "sampling_params": {"max_new_tokens": max_new}, "bootstrap_host": "2.2.2.2", "bootstrap_port": 8998, "bootstrap_room": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn names(samples: &[Value]) -> BTreeSet<String> {
    samples.iter().map(|s| s["name"].as_str().unwrap().to_string()).collect()
}

#[test]
fn unknown_flag_exits_2_like_argparse() {
    let mut sim = SimProc::spawn(&["--collect-tokens-histogram"]);
    let st = sim.wait_exit(T).expect("exits");
    assert_eq!(st.code(), Some(2));
    assert!(sim.seen.iter().any(|l| l == "launch_server.py: error: unrecognized arguments: --collect-tokens-histogram"), "{:?}", sim.seen);
}

#[test]
fn exit_code_fault_exits_before_ready() {
    let mut sim = SimProc::spawn(&["--sim-exit-code", "7"]);
    let st = sim.wait_exit(T).expect("exits");
    assert_eq!(st.code(), Some(7));
    assert!(sim.seen.iter().any(|l| l.contains("Initialization failed.")));
    assert!(!sim.seen.iter().any(|l| l.contains("fired up")));
}

#[tokio::test]
async fn lifecycle_port_closed_then_503_during_warmup_then_ready() {
    let mut sim = SimProc::spawn(&["--sim-warmup-secs", "1.5"]);
    sim.wait_line("server_args=ServerArgs(", T).expect("server_args line");
    assert_eq!(status(&format!("{}/health", sim.url())).await, None, "port closed while loading");
    let kv = sim.wait_line("KV Cache is allocated.", T).expect("KV line");
    assert!(kv.contains("#tokens: 524288"), "{kv}");
    sim.wait_line("max_total_num_tokens=524288, ", T).expect("scheduler line");
    let up = sim.wait_line("Uvicorn running on", T).expect("uvicorn line");
    assert!(up.contains(&format!("INFO:     Uvicorn running on http://127.0.0.1:{} (Press CTRL+C to quit)", sim.port)), "{up}");
    assert_eq!(status(&format!("{}/health", sim.url())).await, Some(503), "warming up");
    assert_eq!(status(&format!("{}/ready", sim.url())).await, Some(503), "not ready while warming up (0.5.23)");
    let ready = sim.wait_line("The server is fired up and ready to roll!", T).expect("ready line");
    assert!(ready.starts_with('[') && ready.as_bytes()[20] == b']', "SGLang's [YYYY-MM-DD HH:MM:SS] prefix: {ready}");
    assert_eq!(status(&format!("{}/health", sim.url())).await, Some(200));
    assert_eq!(status(&format!("{}/health_generate", sim.url())).await, Some(200));
    assert_eq!(status(&format!("{}/metrics", sim.url())).await, Some(404), "no --enable-metrics, no /metrics");
    for p in ["/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models", "/v1/loads", "/ready", "/flush_cache"] {
        assert_eq!(status(&format!("{}{p}", sim.url())).await, Some(200), "{p}");
    }
    assert_eq!(status(&format!("{}/get_load", sim.url())).await, Some(404), "0.5.23 has no /get_load");
}

/// One SGLang version's `/metrics`: names present and absent, the label set, the engine type.
struct Case {
    version: &'static str,
    mode: &'static str,
    present: &'static [&'static str],
    absent: &'static [&'static str],
    labels: &'static [&'static str],
    engine_type: &'static str,
}

#[tokio::test]
async fn metrics_by_version_parse_with_prometheus_client() {
    let cases = [
        Case {
            version: "0.4.6",
            mode: "prefill",
            present: &["sglang:token_usage", "sglang:num_used_tokens", "sglang:num_prefill_infight_queue_reqs", "sglang:num_prefill_prealloc_queue_reqs"],
            absent: &["sglang:max_total_num_tokens", "sglang:kv_used_tokens", "sglang:full_token_usage"],
            labels: &["engine_type", "model_name"],
            engine_type: "unified",
        },
        Case {
            version: "0.5.6",
            mode: "decode",
            present: &["sglang:max_total_num_tokens", "sglang:pending_prealloc_token_usage", "sglang:num_prefill_inflight_queue_reqs"],
            absent: &["sglang:kv_used_tokens", "sglang:full_token_usage"],
            labels: &["engine_type", "model_name", "pp_rank", "tp_rank"],
            engine_type: "unified",
        },
        Case {
            version: "0.5.10",
            mode: "decode",
            present: &["sglang:full_token_usage", "sglang:num_prefill_prealloc_queue_reqs"],
            absent: &["sglang:kv_used_tokens", "sglang:num_prefill_bootstrap_queue_reqs"],
            labels: &["engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"],
            engine_type: "decode",
        },
        Case {
            version: "0.5.23",
            mode: "prefill",
            present: &[
                "sglang:kv_used_tokens",
                "sglang:kv_available_tokens",
                "sglang:kv_evictable_tokens",
                "sglang:num_prefill_bootstrap_queue_reqs",
                "sglang:context_len",
            ],
            absent: &["sglang:num_prefill_prealloc_queue_reqs"],
            labels: &["engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"],
            engine_type: "prefill",
        },
    ];
    for c in &cases {
        exposition_as(c).await;
    }
}

/// A simulator of `c`'s version and mode, after a prefill batch and 40 decode iterations: its
/// `/metrics` as `c` says, parsed by `prometheus_client`, in both formats.
async fn exposition_as(c: &Case) {
    let mut sim = SimProc::spawn(&[
        "--enable-metrics",
        "--sim-version",
        c.version,
        "--disaggregation-mode",
        c.mode,
        "--disaggregation-bootstrap-port",
        &pdctl_tests::pdctl_sandbox::free_port().unwrap().to_string(),
    ]);
    sim.wait_line("fired up", T).expect("ready");
    generate(&sim, 45).await; // a prefill batch and > 40 decode iterations: both roles publish
    let r = metrics(&sim, None).await;
    assert_eq!(r.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let text = r.text().await.unwrap();
    let samples = python_parse(&text, false);
    let got = names(&samples);
    for n in c.present.iter().chain(&["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:cache_hit_rate", "sglang:gen_throughput"]) {
        assert!(got.contains(*n), "{}: {n} missing from {got:?}", c.version);
    }
    for n in c.absent {
        assert!(!got.contains(*n), "{}: {n} must not exist", c.version);
    }
    let usage = samples.iter().find(|s| s["name"] == "sglang:token_usage").unwrap();
    let keys: Vec<&str> = usage["labels"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, c.labels, "{}: label set", c.version);
    assert_eq!(usage["labels"]["engine_type"], c.engine_type, "{}", c.version);
    assert!(text.lines().filter(|l| !l.starts_with('#')).all(|l| l.contains('{')), "every sample has labels");

    // OpenMetrics: underscore names and # EOF, still parseable.
    let om = metrics(&sim, Some("application/openmetrics-text; version=1.0.0")).await.text().await.unwrap();
    assert!(om.ends_with("# EOF\n"));
    let om_samples = python_parse(&om, true);
    assert!(names(&om_samples).contains("sglang_token_usage"), "{}", c.version);
    assert!(!om.contains("sglang:"));
}

#[tokio::test]
async fn gauges_are_lazy_and_kv_accounting_holds_with_requests_in_flight() {
    // Skip warmup: no prefill batch yet, so only the ≥0.5.11 constants exist.
    let mut sim = SimProc::spawn(&["--enable-metrics", "--skip-server-warmup", "--sim-tokens-per-sec", "50", "--sim-max-total-tokens", "10000"]);
    sim.wait_line("fired up", T).expect("ready");
    let text = metrics(&sim, None).await.text().await.unwrap();
    let got = names(&python_parse(&text, false));
    assert!(got.contains("sglang:max_total_num_tokens"));
    assert!(!got.contains("sglang:token_usage"), "usage gauges appear only after the first batch: {got:?}");

    // A long request is in flight: /v1/loads sees it and the prefill publish shows it running.
    let url = sim.url();
    let long = tokio::spawn(async move {
        http()
            .post(format!("{url}/generate"))
            .json(&json!({"text": "x".repeat(400), "sampling_params": {"max_new_tokens": 100}}))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    let load = poll_until(T, Duration::from_millis(20), || async {
        let v: Value = http().get(format!("{}/v1/loads", sim.url())).send().await.ok()?.json().await.ok()?;
        (v["loads"][0]["num_running_reqs"] == 1).then_some(v)
    })
    .await
    .expect("request in flight");
    assert!(load["loads"][0]["num_used_tokens"].as_u64().unwrap() >= 100, "{load}");
    let samples = python_parse(&metrics(&sim, None).await.text().await.unwrap(), false);
    let val = |n: &str| samples.iter().find(|s| s["name"] == n).and_then(|s| s["value"].as_f64()).unwrap();
    assert_eq!(val("sglang:num_running_reqs"), 1.0);
    assert_eq!(val("sglang:kv_used_tokens"), 100.0);
    assert_eq!(val("sglang:kv_used_tokens") + val("sglang:kv_available_tokens") + val("sglang:kv_evictable_tokens"), 10000.0);
    assert_eq!(long.await.unwrap(), 200);

    // Finished: tokens moved to evictable, the totals still add up (after the next publish).
    generate(&sim, 40).await;
    let samples = python_parse(&metrics(&sim, None).await.text().await.unwrap(), false);
    let val = |n: &str| samples.iter().find(|s| s["name"] == n).and_then(|s| s["value"].as_f64()).unwrap();
    assert!(val("sglang:kv_evictable_tokens") >= 200.0);
    assert_eq!(val("sglang:kv_used_tokens") + val("sglang:kv_available_tokens") + val("sglang:kv_evictable_tokens"), 10000.0);
}

/// A request whose client goes away midway leaves the running batch (SGLang aborts a disconnected
/// request), instead of being counted in `/v1/loads` until the server stops: a drain that reads
/// the load would otherwise wait for a request nobody waits for.
#[tokio::test]
async fn a_request_whose_client_went_away_is_no_longer_counted_in_flight() {
    let mut sim = SimProc::spawn(&["--skip-server-warmup", "--sim-tokens-per-sec", "50"]);
    sim.wait_line("fired up", T).expect("ready");
    let url = sim.url();
    let running = || async {
        let v: Value = http().get(format!("{}/v1/loads", sim.url())).send().await.ok()?.json().await.ok()?;
        v["loads"][0]["num_running_reqs"].as_u64()
    };
    // 1,000 tokens at 50/s: 20 s; the client gives up after it has started.
    let client = reqwest::Client::builder().timeout(Duration::from_millis(1500)).build().expect("client");
    let gone = client.post(format!("{url}/generate")).json(&json!({"text": "hi", "sampling_params": {"max_new_tokens": 1000}})).send().await;
    assert!(gone.is_err(), "the client timed out: {gone:?}");
    let left = poll_until(T, Duration::from_millis(50), || async { running().await.filter(|n| *n == 0) }).await;
    assert_eq!(left, Some(0), "the abandoned request left the running batch");
}

#[tokio::test]
async fn decode_publishes_on_the_idle_path() {
    let mut sim = SimProc::spawn(&["--enable-metrics", "--disaggregation-mode", "decode", "--sim-idle-publish-secs", "1"]);
    sim.wait_line("fired up", T).expect("ready");
    let appeared = poll_until(T, Duration::from_millis(100), || async {
        let t = metrics(&sim, None).await.text().await.ok()?;
        t.contains("sglang:token_usage{").then_some(())
    })
    .await;
    assert!(appeared.is_some(), "idle publish after the idle period");
}

#[tokio::test]
async fn streaming_generate_and_openai_endpoints() {
    let mut sim = SimProc::spawn(&[]);
    sim.wait_line("fired up", T).expect("ready");
    let body = http()
        .post(format!("{}/generate", sim.url()))
        .json(&json!({"text": "hi", "stream": true, "sampling_params": {"max_new_tokens": 3}}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "{body}");
    assert_eq!(events[3], "data: [DONE]");
    let chat: Value = http()
        .post(format!("{}/v1/chat/completions", sim.url()))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["usage"]["completion_tokens"], 2);
    let comp: Value = http()
        .post(format!("{}/v1/completions", sim.url()))
        .json(&json!({"model": "m", "prompt": "hi", "max_tokens": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(comp["object"], "text_completion");
    let bad = http().post(format!("{}/generate", sim.url())).body("{not json").send().await.unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn fault_never_ready_keeps_health_503_and_logs_no_ready_line() {
    let mut sim = SimProc::spawn(&["--sim-never-ready"]);
    sim.wait_line("Uvicorn running on", T).expect("port opens");
    assert!(sim.wait_line("fired up", Duration::from_secs(2)).is_none(), "no ready line");
    assert_eq!(status(&format!("{}/health", sim.url())).await, Some(503));
}

#[tokio::test]
async fn fault_crash_after_ready() {
    let mut sim = SimProc::spawn(&["--sim-crash-after-ready", "0.5"]);
    sim.wait_line("fired up", T).expect("ready");
    let st = sim.wait_exit(T).expect("crashes");
    assert!(!st.success());
    assert!(sim.seen.iter().any(|l| l.contains("Received sigquit from a child process")));
}

#[tokio::test]
async fn fault_health_fails_after_ready() {
    let mut sim = SimProc::spawn(&["--sim-health-fail-after-ready", "0.3"]);
    sim.wait_line("fired up", T).expect("ready");
    let failed = poll_until(T, Duration::from_millis(50), || async { (status(&format!("{}/health", sim.url())).await == Some(503)).then_some(()) }).await;
    assert!(failed.is_some());
}

#[tokio::test]
async fn fault_metrics_never_published_and_metrics_hang() {
    let mut sim = SimProc::spawn(&["--enable-metrics", "--sim-no-metrics-publish"]);
    sim.wait_line("fired up", T).expect("ready");
    generate(&sim, 41).await;
    let text = metrics(&sim, None).await.text().await.unwrap();
    assert!(text.contains("sglang:max_total_num_tokens{"), "constants still written at init");
    assert!(!text.contains("sglang:token_usage"), "{text}");

    let mut hang = SimProc::spawn(&["--enable-metrics", "--sim-metrics-hang"]);
    hang.wait_line("fired up", T).expect("ready");
    let r = reqwest::Client::new().get(format!("{}/metrics", hang.url())).timeout(Duration::from_millis(500)).send().await;
    assert!(r.is_err_and(|e| e.is_timeout()), "/metrics hangs");
}

#[test]
fn fault_ready_line_flushed_again_on_stop() {
    let mut sim = SimProc::spawn(&["--sim-flush-ready-on-stop"]);
    sim.wait_line("fired up", T).expect("ready");
    sim.terminate();
    sim.wait_line("Shutting down", T).expect("graceful stop");
    sim.wait_line("fired up", T).expect("the ready line again while stopping");
    assert_eq!(sim.wait_exit(T).and_then(|s| s.code()), Some(0));
}

#[test]
fn sigterm_without_fault_does_not_repeat_the_ready_line() {
    let mut sim = SimProc::spawn(&[]);
    sim.wait_line("fired up", T).expect("ready");
    sim.terminate();
    assert_eq!(sim.wait_exit(T).and_then(|s| s.code()), Some(0));
    assert_eq!(sim.seen.iter().filter(|l| l.contains("fired up")).count(), 1);
}

/// Weights without a restart, as 0.5.23: a pause makes `/ready` 503 and holds new requests at
/// their admission until the continue; a load sets the model path, the served model name (to
/// the path, as `_update_model_path_info` does) and the weight version; a failed load keeps the
/// old weights and says why with 400 `success: false`.
#[tokio::test]
async fn weights_pause_continue_and_load_as_0_5_23() {
    let mut sim = SimProc::spawn(&["--weight-version", "v1", "--sim-weights-load-secs", "0.3"]);
    sim.wait_line("The server is fired up and ready to roll!", T).expect("ready line");
    let info = |sim: &SimProc| {
        let url = format!("{}/model_info", sim.url());
        async move { http().get(url).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert_eq!(info(&sim).await["weight_version"], "v1");
    let post = |path: &str, body: Value| {
        let url = format!("{}{path}", sim.url());
        async move { http().post(url).json(&body).send().await.unwrap() }
    };
    assert_eq!(post("/pause_generation", json!({"mode": "retract"})).await.status(), 200);
    assert_eq!(status(&format!("{}/ready", sim.url())).await, Some(503), "not ready while paused");
    let held = tokio::spawn({
        let s = sim.url();
        async move {
            let t = std::time::Instant::now();
            let r = http().post(format!("{s}/generate")).json(&json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}})).send().await.unwrap();
            (r.status().as_u16(), t.elapsed())
        }
    });
    let r: Value = post("/update_weights_from_disk", json!({"model_path": "/models/v2", "weight_version": "v2"})).await.json().await.unwrap();
    assert_eq!(r, json!({"success": true, "message": "Succeeded to update model weights. Weight version updated to v2.", "num_paused_requests": 0}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "a request waits while paused");
    assert_eq!(post("/continue_generation", json!({})).await.status(), 200);
    let (code, waited) = held.await.unwrap();
    assert_eq!(code, 200, "it is served after the continue");
    assert!(waited >= Duration::from_millis(600), "{waited:?}");
    let m = info(&sim).await;
    assert_eq!((m["model_path"].as_str(), m["served_model_name"].as_str(), m["weight_version"].as_str()), (Some("/models/v2"), Some("/models/v2"), Some("v2")));
    assert_eq!(status(&format!("{}/ready", sim.url())).await, Some(200));
    // A missing model_path is FastAPI's 422; a failing load keeps the old weights.
    assert_eq!(post("/update_weights_from_disk", json!({})).await.status(), 422);
    let mut failing = SimProc::spawn(&["--sim-weights-fail", "--sim-weights-load-secs", "0.1"]);
    failing.wait_line("The server is fired up and ready to roll!", T).expect("ready line");
    let r = http().post(format!("{}/update_weights_from_disk", failing.url())).json(&json!({"model_path": "/models/v2"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["success"], false);
    assert!(v["message"].as_str().unwrap_or("").starts_with("Failed to get weights iterator"), "{v}");
    assert_eq!(info(&failing).await["weight_version"], "default");
}
