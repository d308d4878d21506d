//! `POST /pd_role_switch` as 0.5.23 answers it: refused without the flag, while not idle, without
//! the decode graphs' footprint or its headroom, on a plain server or a backend that cannot;
//! `prepare_only` checks without switching; a switch flips what `/model_info` and pairing say while
//! `/server_info` keeps the startup role; a failed rebuild leaves the instance unhealthy.

use super::*;

/// `POST /pd_role_switch BODY`: the status and the answer.
async fn switch(sim: &SimProc, body: Value) -> (u16, Value) {
    let r = http().post(format!("{}/pd_role_switch", sim.url())).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn role(sim: &SimProc) -> (String, String) {
    let m: Value = http().get(format!("{}/model_info", sim.url())).send().await.unwrap().json().await.unwrap();
    let s: Value = http().get(format!("{}/server_info", sim.url())).send().await.unwrap().json().await.unwrap();
    (m["disaggregation_mode"].as_str().unwrap_or("?").into(), s["disaggregation_mode"].as_str().unwrap_or("?").into())
}

fn switchable(role: &str, bootstrap: u16, extra: &[&str]) -> SimProc {
    let b = bootstrap.to_string();
    let mut args = vec![
        "--enable-metrics",
        "--enable-pd-role-switch",
        "--disaggregation-mode",
        role,
        "--disaggregation-bootstrap-port",
        &b,
        "--sim-role-switch-secs",
        "0.2",
    ];
    args.extend_from_slice(extra);
    let mut p = SimProc::spawn_with(None, &args, &[("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "30")]);
    p.wait_line("fired up", T).expect("ready");
    p
}

/// Both halves of a PD request: the decode's status.
async fn pair(prefill: &SimProc, bootstrap: u16, decode: &SimProc, room: u64) -> u16 {
    let body = json!({"text": "Hello there", "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap, "bootstrap_room": room});
    let p = http().post(format!("{}/generate", prefill.url())).json(&body).send();
    let d = http().post(format!("{}/generate", decode.url())).json(&body).send();
    let (_, d) = tokio::join!(p, d);
    d.unwrap().status().as_u16()
}

#[tokio::test]
async fn a_pair_swaps_roles_at_run_time_and_each_refusal_says_why() {
    let (pb, db) = (pdctl_tests::pdctl_sandbox::free_port().unwrap(), pdctl_tests::pdctl_sandbox::free_port().unwrap());
    let mut prefill = switchable("prefill", pb, &[]);
    let decode = switchable("decode", db, &[]);
    // Every PD instance runs a bootstrap server with the flag, the decode too.
    assert_eq!(status(&format!("http://127.0.0.1:{db}/health")).await, Some(200), "the decode's bootstrap server");
    assert_eq!(pair(&prefill, pb, &decode, 1).await, 200);
    // One metrics series across flips: engine_type is "dynamic".
    let t = metrics(&prefill, None).await.text().await.unwrap();
    assert!(t.contains("engine_type=\"dynamic\""), "{t}");

    // Not idle: a room held for a decode that never fetches it.
    let held = {
        let url = prefill.url();
        tokio::spawn(async move {
            let body = json!({"text": "held", "rid": "held-1", "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1", "bootstrap_port": pb, "bootstrap_room": 99});
            http().post(format!("{url}/generate")).json(&body).send().await.unwrap().status().as_u16()
        })
    };
    poll_until(T, Duration::from_millis(50), || async {
        let t = metrics(&prefill, None).await.text().await.unwrap();
        t.lines().any(|l| l.starts_with("sglang:num_prefill_bootstrap_queue_reqs{") && l.ends_with(" 1.0")).then_some(())
    })
    .await
    .expect("the room is held");
    let (code, a) = switch(&prefill, json!({"new_role": "decode", "decode_cuda_graph_memory_gb": 0})).await;
    assert_eq!(
        (code, a["message"].as_str(), a["safe_to_restore"].as_bool()),
        (400, Some("instance is not idle; drain all requests before switching"), Some(true)),
        "{a}"
    );
    assert_eq!(http().post(format!("{}/abort_request", prefill.url())).json(&json!({"rid": "held-1"})).send().await.unwrap().status(), 200);
    assert_eq!(held.await.unwrap(), 500, "the held request was aborted");

    // A flip to decode needs the graphs' footprint, and that much free memory.
    let (code, a) = switch(&prefill, json!({"new_role": "decode"})).await;
    assert_eq!((code, a["message"].as_str()), (400, Some("decode_cuda_graph_memory_gb is required before capturing decode graphs")), "{a}");
    let (code, a) = switch(&prefill, json!({"new_role": "decode", "decode_cuda_graph_memory_gb": 100.0})).await;
    assert_eq!(code, 400);
    assert_eq!(a["message"], "insufficient decode CUDA graph headroom: required=100.000 GB, available=12.400 GB", "{a}");
    // prepare_only checks without switching.
    let (code, a) = switch(&prefill, json!({"new_role": "decode", "decode_cuda_graph_memory_gb": 0, "prepare_only": true})).await;
    assert_eq!((code, a["message"].as_str(), a["safe_to_restore"].as_bool()), (200, Some("ready"), Some(true)), "{a}");
    assert_eq!(role(&prefill).await, ("prefill".into(), "prefill".into()));
    // A role that is not one is refused (an empty one by the handler, another by the decoder).
    assert_eq!(switch(&prefill, json!({"new_role": ""})).await.1["message"], "invalid new_role=''");
    assert_eq!(switch(&prefill, json!({"new_role": "both"})).await.0, 400);

    // The swap: the prefill becomes a decode and the decode a prefill.
    let (code, a) = switch(&prefill, json!({"new_role": "decode", "decode_cuda_graph_memory_gb": 0})).await;
    assert_eq!(a, json!({"success": true, "message": "ok", "old_role": "prefill", "new_role": "decode", "safe_to_restore": false}), "{code}");
    assert!(prefill.wait_line("PD role switch succeeded: prefill -> decode", T).is_some());
    let (code, a) = switch(&decode, json!({"new_role": "prefill"})).await;
    assert_eq!((code, a["message"].as_str()), (200, Some("ok")), "{a}");
    // `/model_info` follows the switch; `/server_info` keeps the startup role.
    assert_eq!(role(&prefill).await, ("decode".into(), "prefill".into()));
    assert_eq!(role(&decode).await, ("prefill".into(), "decode".into()));
    assert_eq!(pair(&decode, db, &prefill, 2).await, 200, "the new pair serves, through the new prefill's bootstrap port");
    assert_eq!(switch(&decode, json!({"new_role": "prefill"})).await.1["message"], "already in target role");
    // The old prefill captured its decode graphs: flipping back and forth needs no footprint now.
    assert_eq!(switch(&prefill, json!({"new_role": "prefill"})).await.0, 200);
    assert_eq!(switch(&prefill, json!({"new_role": "decode"})).await.0, 200);
}

#[tokio::test]
async fn without_the_flag_on_a_plain_server_or_another_backend_nothing_switches() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    let b = boot.to_string();
    let mut plain = SimProc::spawn(&["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", &b]);
    plain.wait_line("fired up", T).expect("ready");
    let (code, a) = switch(&plain, json!({"new_role": "decode"})).await;
    assert_eq!(
        a,
        json!({"success": false, "message": "--enable-pd-role-switch is not set on this server", "old_role": "prefill", "new_role": "decode", "safe_to_restore": true}),
        "{code}"
    );
    assert_eq!(code, 400);
    let mut null = SimProc::spawn(&["--enable-pd-role-switch"]);
    null.wait_line("fired up", T).expect("ready");
    assert_eq!(switch(&null, json!({"new_role": "decode"})).await.1["message"], "instance is not running in PD disaggregation mode");
    let nixl = switchable("decode", pdctl_tests::pdctl_sandbox::free_port().unwrap(), &["--disaggregation-transfer-backend", "nixl"]);
    assert_eq!(switch(&nixl, json!({"new_role": "prefill"})).await.1["message"], "transfer backend 'nixl' does not support runtime role switch");
}

#[tokio::test]
async fn a_failed_rebuild_leaves_the_instance_unhealthy_until_restarted() {
    let boot = pdctl_tests::pdctl_sandbox::free_port().unwrap();
    let sim = switchable("decode", boot, &["--sim-role-switch-fail"]);
    let (code, a) = switch(&sim, json!({"new_role": "prefill"})).await;
    assert_eq!((code, a["success"].as_bool(), a["safe_to_restore"].as_bool()), (400, Some(false), Some(false)), "{a}");
    assert!(a["message"].as_str().unwrap_or("").starts_with("role switch failed; instance unhealthy, restart required: "), "{a}");
    assert_eq!(status(&format!("{}/health", sim.url())).await, Some(503));
    let (_, a) = switch(&sim, json!({"new_role": "prefill"})).await;
    assert_eq!(a["message"], "instance is unhealthy after a failed role switch; restart required");
}
