//! The only worker of its role serves through its stop until its server's first drain check (on
//! smg 1.13, whose drain settle is patched to 0, and on sglang-router 0.3.2); a pair restarted
//! together stops neither half while the other drains, and a resumed one restarts nothing twice;
//! what clients saw, every window counted.

use super::*;

/// The journal's `__REALTIME_TIMESTAMP` (µs) of `unit`'s first line containing `mark`.
fn journal_time(stack: &Stack, unit: &str, mark: &str) -> Option<u64> {
    let out = stack.sandbox.journalctl(&["-u", unit, "-o", "json", "--no-pager"]).ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["MESSAGE"].as_str().is_some_and(|m| m.contains(mark)))
        .and_then(|e| e["__REALTIME_TIMESTAMP"].as_str().and_then(|t| t.parse().ok()))
}

/// Requests through the gateway's `url`, one every 50 ms until `stop`: each (sent, answered,
/// status) in wall-clock µs, to be compared with the journal's timestamps.
fn timed_requests(url: String, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<Vec<(u64, u64, u16)>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let c = pdctl_tests::http();
        let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
        let mut seen = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let sent = now();
            let status = rt.block_on(async {
                c.post(&url)
                    .json(&serde_json::json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            });
            seen.push((sent, now(), status));
            std::thread::sleep(Duration::from_millis(50));
        }
        seen
    })
}

/// The only decode (or prefill: 1P1D) serves through its stop's drain: its drain step writes the ledger and
/// leaves it in the gateway (on smg 1.13 with `drain_settle_secs` set to 0 by `PATCH`), the
/// restart takes it out at SGLang's first drain check, and requests through the gateway sent
/// after its SIGTERM and before that check are answered.
fn the_only_worker_serves_through_its_stop_until_its_drain_check(gateway: Gateway, unit: &str) {
    let (stack, config, d) = up(StackOptions { gateway, ..Default::default() });
    let role = if unit == P { "prefill" } else { "decode" };
    let url = format!("{}/generate", stack.router.as_ref().unwrap().url);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = timed_requests(url.clone(), stop.clone());
    let r = run(&d, &config, &["restart", "--rolling", "--unit", unit, "--json"]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = load.join().unwrap();
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let drain = &r.event(unit, "drain", "passed")["detail"];
    assert!(drain["taken_out"].as_str().is_some_and(|t| t.starts_with(&format!("deferred: the only {role} worker"))), "{drain}");
    if gateway == Gateway::Smg113 {
        assert_eq!(drain["drain_settle_secs"], 0, "smg took the PATCH: {drain}");
    }
    let restart = &r.event(unit, "restart", "passed")["detail"];
    let taken = &restart["taken_out"];
    // At the drain check when it counted none; 1 s before the next when it counted requests (the
    // worker serves on meanwhile); or earlier when the gateway's own health checks (1 s apart on
    // the sandbox) stopped routing to it first.
    assert_eq!(drain["take_out_by_ms"], 9000, "the latest: 4 s after a first check 5 s after SIGTERM: {drain}");
    assert!(
        taken["when"].as_str().is_some_and(|w| w.starts_with("at its server's first drain check")
            || w.starts_with("when the gateway's own health checks")
            // The server exits at that same check with nothing in flight: its state can reach
            // pdctl before journald delivers the check's line (a fresh-clone run, once).
            || w.starts_with("when its old process was gone before a drain check was logged")
            || (w.starts_with("4.0 s after its server's first drain check counted") && taken["after_ms"].as_u64().is_some_and(|ms| ms >= 4000))),
        "{restart:#}"
    );
    assert_eq!(taken["warning"], serde_json::Value::Null, "{restart:#}");
    // The record's window starts at the taking out: the drain step is not in it.
    let id = r.summary["id"].as_str().unwrap();
    let pdctl = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let shown = std::process::Command::new(pdctl).args(["rollout", "show", id, "--socket"]).arg(&d.socket).output().expect("pdctl rollout show");
    let shown = String::from_utf8_lossy(&shown.stdout).to_string();
    let line = shown.lines().find(|l| l.contains("out of the router:")).unwrap_or_else(|| panic!("a window line: {shown}")).to_string();
    assert!(!line.contains("drain") && line.contains("stop"), "{line}");
    // Served through its drain: every request sent after the SIGTERM line and answered before the
    // drain check went through the gateway to this worker — until the gateway's own health
    // checks see the 503 that SGLang's /health answers while it drains: 3 failed checks (both
    // gateways' default failure threshold) one `--health-check-interval-secs` apart, so not
    // before two intervals after the SIGTERM (in production, with smg's default 60 s interval,
    // minutes).
    let sigterm = journal_time(&stack, unit, "Draining requests and shutting down").expect("the worker logged its SIGTERM");
    let check = journal_time(&stack, unit, "Gracefully exiting... Remaining number of requests").expect("the worker logged its drain check");
    let interval_us = u64::from(StackOptions::default().router_health_interval_secs) * 1_000_000;
    let horizon = check.min(sigterm + 2 * interval_us);
    let during: Vec<_> = seen.iter().filter(|(sent, answered, _)| *sent > sigterm && *answered < horizon).collect();
    if during.is_empty() {
        eprintln!("could not observe serving during the stop: its drain check came {} ms after SIGTERM", (check - sigterm) / 1000);
    } else {
        assert!(during.iter().all(|(_, _, s)| *s == 200), "answered while the decode drained: {during:?}");
        let after = seen.iter().filter(|(sent, _, s)| *sent > sigterm && *s == 200).count();
        eprintln!(
            "{} request(s) answered in the {} ms from the {role}'s SIGTERM to {}; {after} in all after its SIGTERM",
            during.len(),
            (horizon - sigterm) / 1000,
            if horizon == check { "its drain check" } else { "the gateway's earliest health-check verdict" }
        );
    }
}

#[test]
fn the_only_decode_serves_through_its_stop_until_its_drain_check_on_smg_1_13() {
    the_only_worker_serves_through_its_stop_until_its_drain_check(Gateway::Smg113, D);
}

/// The prefill too: smg's `PATCH` rebuilds the entry, and PD requests during the drain still
/// reach the prefill's bootstrap port (it keeps it).
#[test]
fn the_only_prefill_serves_through_its_stop_until_its_drain_check_on_smg_1_13() {
    the_only_worker_serves_through_its_stop_until_its_drain_check(Gateway::Smg113, P);
}

#[test]
fn the_only_decode_serves_through_its_stop_until_its_drain_check_on_sglang_router_0_3_2() {
    the_only_worker_serves_through_its_stop_until_its_drain_check(Gateway::SglangRouter032, D);
}

/// smg 1.13 as installed (`HealthCheckUpdate` in its `crates/protocols/src/worker.rs`,
/// `update_worker_properties.rs`, `drain_workers.rs`): `PATCH /workers/{id}` `{"health":
/// {"drain_settle_secs": 0}}` is a job (`202`) run concurrently with others, so the `DELETE`
/// waits until the entry no longer lists it, as pdctl does (sent at once it drained at the old
/// settle once on a loaded machine). Then the prefill is removed at once, while the decode, at
/// the default 5 s and deleted right after it, is still `draining` when the prefill is gone.
#[test]
fn smg_1_13_removes_a_worker_patched_to_drain_settle_0_at_once() {
    let (stack, _config) = pdctl_tests::stack_with_config(&StackOptions { gateway: Gateway::Smg113, ..Default::default() });
    let r = stack.router.as_ref().unwrap().url.clone();
    let list = || -> Vec<serde_json::Value> {
        let (_, b) = pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{r}/workers")).expect("the gateway answers");
        serde_json::from_str::<serde_json::Value>(&b).ok().and_then(|v| v["workers"].as_array().cloned()).unwrap_or_default()
    };
    let entry = |url: &str| list().into_iter().find(|w| w["url"] == url);
    let id = |url: &str| entry(url).and_then(|w| w["id"].as_str().map(String::from)).expect("listed");
    let (pid, did) = (id(&stack.prefill.url), id(&stack.decode.url));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let c = pdctl_tests::http();
    let status = |req: reqwest::RequestBuilder| rt.block_on(async { req.send().await.map(|x| x.status().as_u16()).unwrap_or(0) });
    let patched = status(c.patch(format!("{r}/workers/{pid}")).json(&serde_json::json!({"health": {"drain_settle_secs": 0}})));
    assert_eq!(patched, 202, "smg queues the update as a job");
    let job = || {
        let (_, b) = pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{r}/workers/{pid}")).expect("the gateway answers");
        serde_json::from_str::<serde_json::Value>(&b).ok().map(|v| v["job_status"].clone()).unwrap_or_default()
    };
    assert!(
        pdctl_tests::until(Duration::from_secs(10), Duration::from_millis(20), || job()["job_type"] != "UpdateWorker"),
        "smg applied the update: {}",
        job()
    );
    assert_eq!((status(c.delete(format!("{r}/workers/{pid}"))), status(c.delete(format!("{r}/workers/{did}")))), (202, 202));
    let t0 = Instant::now();
    while entry(&stack.prefill.url).is_some() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the patched prefill is removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let decode = entry(&stack.decode.url);
    assert_eq!(
        decode.as_ref().and_then(|w| w["status"].as_str()),
        Some("draining"),
        "the decode, deleted after it at the default settle, still drains: {decode:?}"
    );
}

/// `single_pair = "together"`: pdctld killed once the decode's restart passed (both restart at
/// once). The resume re-verifies what this rollout already restarted — the decode's run is still
/// the one its restart started — and restarts nothing again.
#[test]
fn a_resumed_together_rollout_does_not_restart_what_it_already_restarted() {
    let (stack, config, d) = up(StackOptions::default());
    std::fs::write(config.parent().unwrap().join("config.d/50-together.toml"), "[rollout]\nsingle_pair = \"together\"\n").unwrap();
    let mut c = pdctl_tests::live_daemon(&d, &config, &["restart", "--rolling", "--json"]);
    c.wait_line(LIMIT, |e| e["unit"] == D && e["step"] == "restart" && e["status"] == "passed").expect("the decode restarted");
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    let _ = c.finish(Duration::from_secs(20));
    let d1 = stack.show(D, "InvocationID").unwrap();
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    let settled = || {
        let (_, st) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "");
        st["reconciling"] == false && st["drained"] == serde_json::json!([])
    };
    assert!(pdctl_tests::until(Duration::from_secs(120), Duration::from_millis(200), settled), "pdctld re-admitted what it had drained");
    let (_, h) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|r| r["id"].as_str()).expect("the rollout").to_string();
    let r = run(&d, &config, &["rollout", "resume", &id, "--json"]);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    assert!(!r.touched(D) || r.index(D, "restart", "started").is_none(), "the decode was not restarted again: {:#?}", r.events);
    assert_eq!(stack.show(D, "InvocationID").unwrap(), d1, "the decode runs the run its restart started");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{}", r.summary["id"].as_str().expect("id")), "");
    assert!(rec["notes"].to_string().contains(&format!("{D} passed its gates again without a restart")), "{rec:#}");
}

/// 1P1D behind smg 1.13 under client load: each restart leaves a role without a worker, so the
/// probe sends nothing then — that time is reported as not probed, every window is counted with
/// their total, and smg's own count of its 5xx answers to every client is beside the probe's
/// (at least the clients' own failures: they all went through it).
#[test]
fn availability_counts_every_window_the_unprobed_time_and_the_gateways_own_failures() {
    let (stack, config, d) = up(StackOptions::default());
    let load = pdctl_tests::Load::start(&stack.router.as_ref().unwrap().url, 5.0, 4);
    let r = run(&d, &config, &["restart", "--rolling", "--json"]);
    let (sent, failed) = load.stop();
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let a = &r.summary["availability"];
    eprintln!("clients: {sent} sent, {failed} failed; availability: {a}");
    assert!(a["unprobed_ms"].as_u64().unwrap() > 0, "the only prefill's and decode's windows were not probed: {a}");
    let windows = a["error_windows"].as_u64().unwrap();
    assert!(windows >= 2 && a["error_ms_total"].as_u64().unwrap() >= a["longest_error_ms"].as_u64().unwrap(), "{a}");
    let g = &a["gateway"];
    let (answered, gw_failed) = (g["answered"].as_u64().expect("smg 1.13 exports its answers"), g["failed"].as_u64().unwrap());
    assert!(
        answered >= sent && gw_failed >= failed && gw_failed > 0,
        "the gateway's own count covers every client's: {g} against {sent} sent, {failed} failed"
    );
}

/// `single_pair = "together"` under a load of long requests (2 s of decoding each, 4 per second:
/// the decode always busy, so its drain waits for its requests; the prefill, idle between
/// prefills, has its drain deferred to its stop). Neither half stops before the other's drain
/// ended: a prefill stopped while its decode still drains would cut the requests whose KV it
/// serves, and the decode's drain would count them until `drain_timeout`. Both restart, the
/// decode's drain ends with nothing left, in time.
#[test]
fn together_stops_neither_half_while_the_other_still_drains() {
    let (stack, config, d) = up(StackOptions::default());
    std::fs::write(config.parent().unwrap().join("config.d/50-together.toml"), "[rollout]\nsingle_pair = \"together\"\n").unwrap();
    let router = stack.router.as_ref().unwrap().url.clone();
    let load = pdctl_tests::Load::start(&router, 4.0, 400);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let running = || {
        rt.block_on(async {
            let v: serde_json::Value = pdctl_tests::http().get(format!("{}/v1/loads", stack.decode.url)).send().await.ok()?.json().await.ok()?;
            v["loads"][0]["num_running_reqs"].as_u64()
        })
    };
    assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(100), || running().is_some_and(|n| n >= 4)), "the decode runs the load");
    let r = run(&d, &config, &["restart", "--rolling", "--json"]);
    let _ = load.stop();
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let drain = r.events.iter().find(|e| e["unit"] == D && e["step"] == "drain" && e["status"] == "passed").expect("the decode's drain");
    assert!(
        drain["detail"]["in_flight_at_start"].as_u64().is_some_and(|n| n > 0),
        "the decode was drained before its stop, with requests to wait for (else this test observes nothing): {drain:#}"
    );
    assert_eq!((drain["detail"]["in_flight_left"].as_u64(), drain["detail"]["timed_out"].as_bool()), (Some(0), Some(false)), "{drain:#}");
    for (a, b) in [(P, D), (D, P)] {
        assert!(r.index(a, "restart", "started").unwrap() > r.index(b, "drain", "passed").unwrap(), "{a} stopped only after {b}'s drain ended");
    }
}
