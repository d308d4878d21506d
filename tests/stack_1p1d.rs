//! The foundation end to end: a prefill and a decode `sglang-sim` as systemd units of a real
//! (sandboxed) manager, the real SGLang router 0.3.2 in PD mode as a third unit, journald, and a
//! request through the router that both workers serve with the same bootstrap room.

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::journal::field;
use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions, READY_LINE};
use pdctl_tests::{http, poll_until, python_parse};
use serde_json::{json, Value};

fn show(stack: &Stack, unit: &str, prop: &str) -> String {
    let out = stack.sandbox.systemctl(&["show", "-p", prop, "--value", unit]).expect("systemctl show");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn bootstrap_room(msg: &str) -> Option<String> {
    let rest = msg.split("bootstrap_room=").nth(1)?;
    let room: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (!room.is_empty()).then_some(room)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_prefill_one_decode_behind_the_real_router() {
    let stack = Stack::boot(&StackOptions::default()).expect("stack boots");
    let router = stack.router.clone().expect("router unit");

    // Both ready lines are in journald, attributed to their units, from their current processes.
    let ready = stack.wait_ready(Duration::from_secs(60)).expect("both workers ready");
    for (w, entry) in stack.workers().iter().zip(&ready) {
        assert_eq!(field(entry, "_SYSTEMD_UNIT"), Some(w.unit.as_str()));
        assert!(field(entry, "MESSAGE").unwrap().ends_with(READY_LINE));
        assert_eq!(show(&stack, &w.unit, "ActiveState"), "active");
        let main_pid = show(&stack, &w.unit, "MainPID");
        assert_eq!(field(entry, "_PID"), Some(main_pid.as_str()), "ready line from the unit's main process");
    }
    assert_eq!(
        show(&stack, &stack.prefill.unit, "Environment"),
        "CUDA_VISIBLE_DEVICES=0,1,2,3 SGLANG_SIM_LOAD_SECS=1.5 SGLANG_SIM_WARMUP_SECS=0.5 SGLANG_DISAGGREGATION_WAITING_TIMEOUT=3 SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=8"
    );
    assert!(show(&stack, &stack.decode.unit, "Environment").contains("CUDA_VISIBLE_DEVICES=4,5,6,7"));
    assert_eq!(show(&stack, &router.unit, "ActiveState"), "active");

    // The router admits both workers with the right type and health.
    let client = http();
    let workers_url = format!("{}/workers", router.url);
    let workers = poll_until(Duration::from_secs(60), Duration::from_millis(200), || async {
        let v: Value = client.get(&workers_url).send().await.ok()?.json().await.ok()?;
        let list = v.get("workers")?.as_array()?.clone();
        let healthy = |url: &str, ty: &str| list.iter().any(|w| w["url"] == url && w["worker_type"] == ty && w["is_healthy"] == true);
        (healthy(&stack.prefill.url, "prefill") && healthy(&stack.decode.url, "decode")).then_some(v)
    })
    .await
    .expect("router shows both workers healthy");
    assert_eq!(workers["stats"]["prefill_count"], 1);
    assert_eq!(workers["stats"]["decode_count"], 1);
    let prefill_entry = workers["workers"].as_array().unwrap().iter().find(|w| w["worker_type"] == "prefill").unwrap();
    assert_eq!(prefill_entry["bootstrap_port"], json!(stack.prefill.bootstrap_port.unwrap()));

    // Before any traffic the decode server has published no usage gauges (PD decode runs no
    // prefill batch; it publishes every 40 decode iterations or after 30 s idle).
    let decode_metrics = client.get(format!("{}/metrics", stack.decode.url)).send().await.unwrap().text().await.unwrap();
    assert!(!decode_metrics.contains("sglang:kv_used_tokens"), "decode gauges are lazy:\n{decode_metrics}");

    // One request through the router: both workers serve it with the same bootstrap room.
    let mut prefill_log = stack.sandbox.follow_journal(&[&format!("_SYSTEMD_UNIT={}", stack.prefill.unit)]).unwrap();
    let mut decode_log = stack.sandbox.follow_journal(&[&format!("_SYSTEMD_UNIT={}", stack.decode.unit)]).unwrap();
    let resp = client
        .post(format!("{}/generate", router.url))
        .json(&json!({"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 48, "temperature": 0}}))
        .send()
        .await
        .expect("router answers");
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["meta_info"]["completion_tokens"], 48, "{body}");
    let room = |e: &Value| field(e, "MESSAGE").and_then(bootstrap_room);
    let p = prefill_log.wait_for(Duration::from_secs(10), |e| room(e).is_some()).expect("prefill saw the request");
    let d = decode_log.wait_for(Duration::from_secs(10), |e| room(e).is_some()).expect("decode saw the request");
    assert_eq!(room(&p), room(&d), "prefill and decode paired on one bootstrap room");

    // After it, both workers' /metrics carry the KV gauges, and a real parser reads them.
    for w in stack.workers() {
        let text = client.get(format!("{}/metrics", w.url)).send().await.unwrap().text().await.unwrap();
        let samples = python_parse(&text, false);
        let get = |name: &str| -> f64 {
            samples.iter().find(|s| s["name"] == name).and_then(|s| s["value"].as_f64()).unwrap_or_else(|| panic!("{} has no {name}:\n{text}", w.unit))
        };
        let (used, avail, evict, max) =
            (get("sglang:kv_used_tokens"), get("sglang:kv_available_tokens"), get("sglang:kv_evictable_tokens"), get("sglang:max_total_num_tokens"));
        assert!(max > 0.0);
        assert_eq!(used + avail + evict, max, "{}: KV accounting adds up", w.unit);
        let engine_type = samples.iter().find(|s| s["name"] == "sglang:token_usage").unwrap()["labels"]["engine_type"].clone();
        assert_eq!(engine_type, json!(w.role));
    }
}
