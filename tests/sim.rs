//! `sglang-sim` against SGLang's observable behaviour (docs/sglang-sim.md): flags and argparse errors, lifecycle lines and the
//! port/health timeline, `/metrics` by version (checked by the Python `prometheus_client` parser),
//! lazy gauges, KV accounting with in-flight requests, and every fault knob.

use std::collections::BTreeSet;
use std::time::Duration;

use pdctl_tests::{http, poll_until, python_parse, SimProc};
use serde_json::{json, Value};

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

#[tokio::test]
async fn metrics_by_version_parse_with_prometheus_client() {
    struct Case {
        version: &'static str,
        mode: &'static str,
        present: &'static [&'static str],
        absent: &'static [&'static str],
        labels: &'static [&'static str],
        engine_type: &'static str,
    }
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
    for c in cases {
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

/// Both halves of a PD request, as the router sends them: the same room to a prefill and a
/// decode. Returns the decode's status and body.
async fn pd_pair(prefill: &SimProc, bootstrap: u16, decode: &SimProc, room: u64) -> (u16, String) {
    let body = |_: ()| json!({"text": "Hello there", "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap, "bootstrap_room": room});
    let p = http().post(format!("{}/generate", prefill.url())).json(&body(())).send();
    let d = http().post(format!("{}/generate", decode.url())).json(&body(())).send();
    let (_, d) = tokio::join!(p, d);
    let d = d.unwrap();
    (d.status().as_u16(), d.text().await.unwrap())
}

fn gauge(text: &str, name: &str) -> f64 {
    python_parse(text, false).iter().find(|s| s["name"] == name).and_then(|s| s["value"].as_f64()).unwrap_or(-1.0)
}

fn pd_proc(port: Option<u16>, role: &str, bootstrap: u16, extra: &[&str]) -> SimProc {
    pd_proc_held(port, role, bootstrap, extra, "2")
}

/// [`pd_proc`] whose prefill holds an unfetched room for `bootstrap_timeout` seconds.
fn pd_proc_held(port: Option<u16>, role: &str, bootstrap: u16, extra: &[&str], bootstrap_timeout: &str) -> SimProc {
    let b = bootstrap.to_string();
    let mut args = vec!["--enable-metrics", "--disaggregation-mode", role, "--disaggregation-bootstrap-port", &b];
    args.extend_from_slice(extra);
    let env = [("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1"), ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", bootstrap_timeout)];
    let mut p = SimProc::spawn_with(port, &args, &env);
    p.wait_line("fired up", T).expect("ready");
    p
}

#[tokio::test]
async fn pd_requests_pair_and_a_restarted_prefill_breaks_only_the_old_cache_profile() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    let mut prefill = pd_proc(None, "prefill", boot, &[]);
    let stale = pd_proc(None, "decode", boot, &["--sim-pair-cache", "stale"]);
    let fixed = pd_proc(None, "decode", boot, &[]);
    // A decode cannot serve alone.
    let alone = http().post(format!("{}/generate", stale.url())).json(&json!({"text": "x"})).send().await.unwrap();
    assert_eq!(alone.status(), 400);
    assert_eq!(pd_pair(&prefill, boot, &stale, 11).await.0, 200);
    assert_eq!(pd_pair(&prefill, boot, &fixed, 12).await.0, 200);

    // The prefill restarts on the same address: new rank port, new identity.
    let port = prefill.port;
    prefill.terminate();
    prefill.wait_exit(T).expect("prefill exits");
    drop(prefill);
    let prefill = pd_proc(Some(port), "prefill", boot, &[]);
    // Before PR 36029: every request fails (after the waiting timeout), the entry is kept.
    for room in [21, 22] {
        let (status, body) = pd_pair(&prefill, boot, &stale, room).await;
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("KVPoll.WaitingForInput"), "{body}");
    }
    // After it: one request fails, the next refetches /route.
    assert_eq!(pd_pair(&prefill, boot, &fixed, 31).await.0, 500);
    assert_eq!(pd_pair(&prefill, boot, &fixed, 32).await.0, 200);
}

#[tokio::test]
async fn a_prefill_holds_a_rooms_kv_until_fetched_or_the_bootstrap_timeout_and_a_mismatched_decode_dies() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    // The room is held 6 s (its 500 still within the client's 10 s): the gauges and `/v1/loads`
    // are both read while it is, also on a loaded machine (with 2 s, one CI run read `/v1/loads`
    // after the room was gone and the gauges before their next publish).
    let prefill = pd_proc_held(None, "prefill", boot, &["--sim-idle-publish-secs", "3"], "6");
    // Only the prefill half arrives (its decode died before fetching): the KV stays held.
    let p = {
        let url = prefill.url();
        tokio::spawn(async move {
            let body = json!({"text": "a prompt of some length to hold", "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": 7});
            http().post(format!("{url}/generate")).json(&body).send().await.unwrap().status().as_u16()
        })
    };
    let held = poll_until(T, Duration::from_millis(50), || async {
        let t = metrics(&prefill, None).await.text().await.unwrap();
        (gauge(&t, "sglang:num_prefill_bootstrap_queue_reqs") == 1.0).then(|| gauge(&t, "sglang:kv_used_tokens"))
    })
    .await
    .expect("the room is held in the bootstrap queue");
    assert!(held > 0.0, "its KV is in use: {held}");
    // The held request left the running batch: `/v1/loads` counts it as waiting (0.5.23
    // `load_inquirer.py` adds the bootstrap queue to `num_waiting_reqs`).
    let l = loads(&prefill).await;
    assert_eq!((l["num_running_reqs"].as_u64(), l["num_waiting_reqs"].as_u64()), (Some(0), Some(1)), "{l}");
    assert_eq!(l["disaggregation"]["prefill_bootstrap_queue_reqs"], 1, "{l}");
    assert_eq!(p.await.unwrap(), 500, "the prefill half fails at the bootstrap timeout");
    // `/v1/loads` reads the scheduler's queues as they are: the room is gone at once …
    let l = loads(&prefill).await;
    assert_eq!((l["num_waiting_reqs"].as_u64(), l["disaggregation"]["prefill_bootstrap_queue_reqs"].as_u64()), (Some(0), Some(0)), "{l}");
    // … the gauges only at the next idle publish (here every 3 s; SGLang: 30 s).
    let gone = poll_until(T, Duration::from_millis(100), || async {
        let t = metrics(&prefill, None).await.text().await.unwrap();
        (gauge(&t, "sglang:num_prefill_bootstrap_queue_reqs") == 0.0).then(|| gauge(&t, "sglang:kv_used_tokens"))
    })
    .await;
    assert_eq!(gone, Some(0.0), "the idle publish shows the room and its KV released");

    // A decode with another page size: on first contact (the prefill's `/route`) its scheduler
    // raises and the server dies, as 0.5.23's `try_ensure_parallel_info` does.
    let mut decode = pd_proc(None, "decode", boot, &["--page-size", "16"]);
    let (p, _d) = tokio::join!(
        http()
            .post(format!("{}/generate", prefill.url()))
            .json(&json!({"text": "x", "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": 8}))
            .send(),
        http()
            .post(format!("{}/generate", decode.url()))
            .json(&json!({"text": "x", "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": 8}))
            .send(),
    );
    drop(p);
    let line = decode.wait_line("Page size mismatch", T).expect("the decode names the mismatch");
    assert!(line.contains("prefill server has page_size=1, but decode server has page_size=16"), "{line}");
    let status = decode.wait_exit(T).expect("the decode dies");
    assert!(!status.success(), "{status:?}");
}

#[tokio::test]
async fn a_kv_dtype_written_differently_but_resolving_the_same_pairs() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    let prefill = pd_proc(None, "prefill", boot, &["--kv-cache-dtype", "auto"]);
    let decode = pd_proc(None, "decode", boot, &["--kv-cache-dtype", "bf16"]);
    assert_eq!(pd_pair(&prefill, boot, &decode, 5).await.0, 200, "auto (the model's bfloat16) and bf16 are the same");
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_at_the_watchdogs_pace_and_health_answers_503() {
    let mut p = SimProc::spawn(&["--sim-tokens-per-sec", "1"]);
    p.wait_line("fired up", T).expect("ready");
    // One request in flight for ~6 s.
    let url = p.url();
    let req = tokio::spawn(async move {
        http().post(format!("{url}/generate")).json(&json!({"text": "x", "sampling_params": {"max_new_tokens": 6}})).send().await.map(|r| r.status().as_u16())
    });
    poll_until(T, Duration::from_millis(20), || async { (load_of(&p).await > 0).then_some(()) }).await.expect("the request is running");
    let sent = std::time::Instant::now();
    p.terminate();
    p.wait_line("Draining requests and shutting down", T).expect("the SIGTERM line");
    let h = http().get(format!("{}/health", p.url())).send().await.unwrap();
    assert_eq!(h.status(), 503, "health answers 503 once shutting down");
    assert_eq!(http().get(format!("{}/ready", p.url())).send().await.unwrap().status(), 503);
    let waiting = p.wait_line("Gracefully exiting... Remaining number of requests 1.", T).expect("the watchdog reports the request left");
    assert!(waiting.contains("remaining_rids=['"), "{waiting}");
    assert_eq!(req.await.unwrap().ok(), Some(200), "the request in flight finished");
    p.wait_line("Gracefully exiting... Remaining number of requests 0.", T).expect("then none");
    let status = p.wait_exit(T).expect("exits");
    assert!(status.success(), "{status:?}");
    assert!(sent.elapsed() >= Duration::from_secs(5), "the stop lasted as long as the request: {:?}", sent.elapsed());
}

#[tokio::test]
async fn abort_request_ends_every_request_in_flight() {
    let mut p = SimProc::spawn(&["--sim-tokens-per-sec", "1", "--enable-metrics"]);
    p.wait_line("fired up", T).expect("ready");
    let url = p.url();
    let req = tokio::spawn(async move {
        http().post(format!("{url}/generate")).json(&json!({"text": "x", "sampling_params": {"max_new_tokens": 100}})).send().await.map(|r| r.status().as_u16())
    });
    poll_until(T, Duration::from_millis(20), || async { (load_of(&p).await > 0).then_some(()) }).await.expect("running");
    let r = http().post(format!("{}/abort_request", p.url())).json(&json!({"abort_all": true})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(req.await.unwrap().ok(), Some(500), "the request ended with an abort");
    assert_eq!(load_of(&p).await, 0);
    let m = http().get(format!("{}/metrics", p.url())).send().await.unwrap().text().await.unwrap();
    assert!(m.lines().any(|l| l.starts_with("sglang:num_aborted_requests_total{") && l.ends_with(" 1.0")), "{m}");
}

#[tokio::test]
async fn the_api_key_guards_all_but_health_ready_and_metrics() {
    let mut p = SimProc::spawn(&["--api-key", "s3cret", "--enable-metrics"]);
    p.wait_line("fired up", T).expect("ready");
    let get = |path: &str, key: Option<&str>| {
        let mut r = http().get(format!("{}{path}", p.url()));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    for open in ["/health", "/ready", "/metrics"] {
        assert_eq!(get(open, None).await.unwrap().status(), 200, "{open} needs no key");
    }
    for guarded in ["/server_info", "/v1/loads", "/model_info"] {
        let r = get(guarded, None).await.unwrap();
        assert_eq!(r.status(), 401, "{guarded}");
        assert_eq!(r.text().await.unwrap(), r#"{"error":"Unauthorized"}"#);
        assert_eq!(get(guarded, Some("wrong")).await.unwrap().status(), 401);
        assert_eq!(get(guarded, Some("s3cret")).await.unwrap().status(), 200, "{guarded} with the key");
    }
}

#[tokio::test]
async fn a_pd_prefill_refuses_a_request_without_a_bootstrap_room() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    let prefill = pd_proc(None, "prefill", boot, &[]);
    let r = http().post(format!("{}/generate", prefill.url())).json(&json!({"text": "x"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("Disaggregated request received without bootstrap room id"));
}

#[tokio::test]
async fn a_prefills_bootstrap_server_answers_before_its_scheduler_registers() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    let b = boot.to_string();
    let mut p = SimProc::spawn_with(None, &["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", &b, "--sim-load-secs", "3"], &[]);
    let base = format!("http://127.0.0.1:{boot}");
    poll_until(T, Duration::from_millis(20), || async { http().get(format!("{base}/health")).send().await.ok().filter(|r| r.status() == 200).map(|_| ()) })
        .await
        .expect("the bootstrap server answers /health while the weights load");
    let early = http().get(format!("{base}/route")).send().await.unwrap();
    assert_eq!(early.status(), 503, "/route waits for the scheduler's registration");
    assert!(http().get(format!("{}/health", p.url())).send().await.is_err(), "the HTTP port is not open yet");
    p.wait_line("fired up", T).expect("ready");
    let v: Value = http().get(format!("{base}/route")).send().await.unwrap().json().await.unwrap();
    assert!(v["rank_port"].as_u64().is_some_and(|n| n > 0), "{v}");
}

#[tokio::test]
async fn v1_loads_answers_the_sections_asked_for() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    let prefill = pd_proc(None, "prefill", boot, &[]);
    let get = |q: &str| http().get(format!("{}/v1/loads{q}", prefill.url())).send();
    let all: Value = get("").await.unwrap().json().await.unwrap();
    assert_eq!(all["loads"][0]["disaggregation"]["mode"], "prefill", "{all}");
    assert!(all["loads"][0]["queues"].is_object(), "{all}");
    let core: Value = get("?include=core").await.unwrap().json().await.unwrap();
    assert!(core["loads"][0]["num_running_reqs"].is_u64() && core["loads"][0].get("disaggregation").is_none(), "{core}");
    let disagg: Value = get("?include=core,disagg").await.unwrap().json().await.unwrap();
    assert!(disagg["loads"][0]["disaggregation"].is_object() && disagg["loads"][0].get("queues").is_none(), "{disagg}");
    let bad = get("?include=bogus").await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("Invalid include sections"));
}

/// The first entry of `GET /v1/loads` (every section).
async fn loads(p: &SimProc) -> Value {
    let v: Value = http().get(format!("{}/v1/loads", p.url())).send().await.expect("/v1/loads answers").json().await.expect("JSON");
    v.pointer("/loads/0").cloned().unwrap_or(Value::Null)
}

async fn load_of(p: &SimProc) -> u64 {
    let v: Value = match http().get(format!("{}/v1/loads", p.url())).send().await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => return 0,
    };
    v.pointer("/loads/0/num_running_reqs").and_then(Value::as_u64).unwrap_or(0)
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
