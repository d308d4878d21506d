//! PD pairing as SGLang does it: a request's two halves, a prefill holding a room's KV until
//! its decode fetches it (or its bootstrap timeout), a restarted prefill breaking only the old
//! cache profile, a mismatched decode dying; the drain at SIGTERM, `/abort_request`, the API key,
//! and `/v1/loads`.

use super::*;

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
