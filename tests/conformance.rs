//! Conformance of the simulator (and of pdctl's own SGLang facts) with the released SGLang.
//!
//! `scripts/setup` downloads the pinned wheel (`pip download --no-deps sglang==0.5.23`, never
//! installed nor imported: it needs GPUs and torch) into `.cache/sglang/`.
//! `tests/conformance/sglang_facts.py` reads its sources with Python's `ast` and prints the facts
//! pdctl and `sglang-sim` rely on; this test compares them with the simulator's catalogue of the
//! same version ([`sglang_sim::catalogue`]) and with the constants of `pdctl_core::sglang`, and
//! fails naming every difference. Bumping the pin (`SGLANG_VERSION` in scripts/setup) shows what
//! changed upstream.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sglang_sim::version::Version;

/// The routes pdctl or its operators call on a worker: each one the released server serves must
/// be served by the simulator too.
const RELIED_ROUTES: &[&str] = &[
    "/health",
    "/health_generate",
    "/ready",
    "/v1/loads",
    "/get_load",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/v1/models",
    "/generate",
    "/v1/completions",
    "/v1/chat/completions",
    "/abort_request",
    "/flush_cache",
    "/pause_generation",
    "/continue_generation",
    "/update_weights_from_disk",
    "/metrics",
];

/// The disaggregation settings pdctl's gates and the simulator's timing follow: each one the
/// released server defines must be in the simulator's catalogue, with the same default.
const RELIED_ENV: &[&str] = &[
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
    "SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
];

/// The Prometheus families pdctl reads (KV, queues, requests, the service gate's latencies): each one the released server
/// defines must be exposed by the simulator.
const RELIED_METRICS: &[&str] = &[
    "sglang:token_usage",
    "sglang:num_used_tokens",
    "sglang:max_total_num_tokens",
    "sglang:kv_used_tokens",
    "sglang:kv_available_tokens",
    "sglang:kv_evictable_tokens",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_decode_deferred_kv_release_reqs",
    "sglang:num_requests",
    "sglang:num_aborted_requests",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The pinned wheel (`PDCTL_SGLANG_WHEEL`, else the one scripts/setup downloaded).
fn wheel() -> PathBuf {
    if let Some(p) = std::env::var_os("PDCTL_SGLANG_WHEEL") {
        return PathBuf::from(p);
    }
    let dir = repo().join(".cache/sglang");
    let found = std::fs::read_dir(&dir).ok().and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "whl")));
    found.unwrap_or_else(|| panic!("no SGLang wheel in {}: run scripts/setup (it downloads the pinned release there)", dir.display()))
}

/// The facts `sglang_facts.py` reads from the wheel.
fn wheel_facts() -> Value {
    let script = repo().join("tests/conformance/sglang_facts.py");
    let out = std::process::Command::new("/usr/bin/python3").arg(&script).arg(wheel()).output().expect("run /usr/bin/python3 (scripts/setup installs it)");
    assert!(out.status.success(), "{} failed: {}", script.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("sglang_facts.py prints JSON")
}

fn methods(v: &Value) -> BTreeSet<String> {
    v.as_array().map(|a| a.iter().filter_map(|m| m.as_str().map(String::from)).collect()).unwrap_or_default()
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Every difference between the facts of the released wheel and a catalogue of the same shape
/// (`who` names it in the sentences); `relied`: the catalogue must also have every route and
/// family pdctl relies on that the wheel has (the simulator's; pdctl's own facts list no routes).
fn differences(wheel: &Value, sim: &Value, who: &str, relied: bool) -> Vec<String> {
    let v = wheel["version"].as_str().unwrap_or("?");
    let upstream = format!("SGLang {v}");
    let mut out = Vec::new();
    if sim["version"] != wheel["version"] {
        out.push(format!("version: the wheel is {v}, {who} is {}", sim["version"]));
    }
    let (wr, sr) = (&wheel["routes"], &sim["routes"]);
    let sim_paths: BTreeSet<&String> = sr.as_object().map(|o| o.keys().collect()).unwrap_or_default();
    for path in &sim_paths {
        match wr.get(path.as_str()) {
            None => out.push(format!("route {path}: {who} serves it, {upstream} does not")),
            Some(w) if methods(w) != methods(&sr[path.as_str()]) => {
                out.push(format!("route {path}: {who} answers {:?}, {upstream} {:?}", methods(&sr[path.as_str()]), methods(w)))
            }
            Some(_) => {}
        }
    }
    for path in RELIED_ROUTES.iter().filter(|_| relied) {
        if let Some(w) = wr.get(*path) {
            if sr.get(*path).is_none() {
                out.push(format!("route {path}: {upstream} serves {:?}, {who} does not", methods(w)));
            }
        }
    }
    let (wm, sm) = (&wheel["metrics"], &sim["metrics"]);
    for (name, kind) in sm.as_object().into_iter().flatten() {
        match wm.get(name) {
            None => out.push(format!("metric {name}: {who} exposes it, {upstream} has no such family")),
            Some(k) if k != kind => {
                out.push(format!("metric {name}: a {} in {who}, a {} in {upstream}", kind.as_str().unwrap_or("?"), k.as_str().unwrap_or("?")))
            }
            Some(_) => {}
        }
    }
    for name in RELIED_METRICS.iter().filter(|_| relied) {
        if wm.get(*name).is_some() && sm.get(*name).is_none() {
            out.push(format!("metric {name}: {upstream} defines it, {who} does not expose it"));
        }
    }
    // The families the service gate reads: their added labels and default buckets.
    if relied {
        series_differences(wheel, sim, who, &upstream, &mut out);
    }
    for (key, line) in sim["lines"].as_object().into_iter().flatten() {
        if wheel["lines"].get(key) != Some(line) {
            out.push(format!("{key} line: {who} logs {line}, {upstream} {}", wheel["lines"].get(key).unwrap_or(&Value::Null)));
        }
    }
    if sim["api_key_exempt"] != wheel["api_key_exempt"] {
        out.push(format!("paths exempt from --api-key: {who} {}, {upstream} {}", sim["api_key_exempt"], wheel["api_key_exempt"]));
    }
    for section in ["env", "server_args", "shutdown"] {
        for (name, value) in sim[section].as_object().into_iter().flatten() {
            match wheel[section].get(name) {
                Some(w) if same_value(w, value) => {}
                w => out.push(format!("{name}: {who} defaults to {value}, {upstream} to {}", w.unwrap_or(&Value::Null))),
            }
        }
    }
    // The other way: a fact the released server has that the catalogue lacks.
    if relied {
        for name in RELIED_ENV {
            if let (Some(w), None) = (wheel["env"].get(*name), sim["env"].get(*name)) {
                out.push(format!("{name}: {upstream} defaults to {w}, {who} does not follow it"));
            }
        }
        for section in ["server_args", "shutdown"] {
            for (name, w) in wheel[section].as_object().into_iter().flatten() {
                if sim[section].get(name).is_none() {
                    out.push(format!("{name}: {upstream} has {w}, {who} says nothing of it"));
                }
            }
        }
    }
    out
}

/// The differences in the families the service gate reads: their added labels and default
/// buckets (`upstream` names the wheel, `who` the catalogue).
fn series_differences(wheel: &Value, sim: &Value, who: &str, upstream: &str, out: &mut Vec<String>) {
    for (name, w) in wheel["series"].as_object().into_iter().flatten() {
        let Some(sim_series) = sim["series"].get(name) else {
            out.push(format!("metric {name}: {upstream} defines it, {who} exposes no series of it"));
            continue;
        };
        let labels = |v: &Value| -> BTreeSet<String> { methods(&v["labels"]) };
        if labels(w) != labels(sim_series) {
            out.push(format!("metric {name}: {who} adds the labels {:?}, {upstream} {:?}", labels(sim_series), labels(w)));
        }
        let bounds = |v: &Value| -> Vec<f64> { v["buckets"].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect()).unwrap_or_default() };
        if bounds(w) != bounds(sim_series) {
            out.push(format!("metric {name}: {who}'s buckets are {:?}, {upstream}'s {:?}", bounds(sim_series), bounds(w)));
        }
    }
}

/// pdctl's own SGLang facts (`pdctl_core::sglang`), in the catalogue's shape.
fn pdctl_facts(version: &Value) -> Value {
    use pdctl_core::sglang;
    json!({
        "version": version,
        "routes": {},
        "metrics": {},
        "lines": {
            "ready": sglang::READY_LINE,
            "role_switch_not_enabled": sglang::role_switch::NOT_ENABLED,
            "role_switch_unhealthy": sglang::role_switch::UNHEALTHY,
            "role_switch_in_progress": sglang::role_switch::IN_PROGRESS,
            "role_switch_not_idle": sglang::role_switch::NOT_IDLE,
            "role_switch_graph_memory_required": sglang::role_switch::GRAPH_MEMORY_REQUIRED,
            "role_switch_graph_headroom": sglang::role_switch::GRAPH_HEADROOM,
            "role_switch_rebuild_failed": sglang::role_switch::REBUILD_FAILED,
            "role_switch_not_pd": sglang::role_switch::NOT_PD,
            "role_switch_backend": sglang::role_switch::BACKEND,
        },
        "api_key_exempt": sglang::API_KEY_EXEMPT,
        "env": {
            sglang::BOOTSTRAP_TIMEOUT_ENV: sglang::BOOTSTRAP_TIMEOUT_DEFAULT.as_secs_f64(),
            sglang::WAITING_TIMEOUT_ENV: sglang::WAITING_TIMEOUT_DEFAULT.as_secs_f64(),
            sglang::HEARTBEAT_INTERVAL_ENV: sglang::HEARTBEAT_INTERVAL_DEFAULT.as_secs_f64(),
            sglang::HEARTBEAT_FAILURES_ENV: sglang::HEARTBEAT_FAILURES_DEFAULT,
        },
        "server_args": {"disaggregation_bootstrap_port": sglang::BOOTSTRAP_PORT_DEFAULT},
        "shutdown": {
            "serves_while_draining": pdctl_core::sglang::stop::SERVES_WHILE_DRAINING,
            "watchdog_secs": pdctl_core::sglang::stop::WATCHDOG_PERIOD.as_secs(),
        },
    })
}

#[test]
fn the_simulator_and_pdctl_agree_with_the_released_sglang() {
    let wheel = wheel_facts();
    let v = wheel["version"].as_str().expect("the wheel names its version");
    assert_eq!(Version::parse(v), Some(Version::LATEST), "the pinned wheel is {v}; the simulator's newest profile is {}", Version::LATEST);
    let sim = sglang_sim::catalogue::of(Version::LATEST);
    let mut diffs = differences(&wheel, &sim, &format!("sglang-sim's {} profile", Version::LATEST), true);
    diffs.extend(differences(&wheel, &pdctl_facts(&wheel["version"]), "pdctl", false));
    // What was compared, so that a pass is not a pass over nothing.
    assert!(sim["routes"].as_object().is_some_and(|o| o.len() >= 10), "{sim:#}");
    assert!(wheel["routes"].as_object().is_some_and(|o| o.len() >= 30), "the wheel's routes were read: {wheel:#}");
    assert!(wheel["metrics"].as_object().is_some_and(|o| o.len() >= 50), "the wheel's metrics were read");
    assert!(diffs.is_empty(), "{} difference(s) from the released wheel:\n  {}", diffs.len(), diffs.join("\n  "));
}

#[test]
fn a_changed_simulator_fact_is_named() {
    let wheel = wheel_facts();
    let sim = sglang_sim::catalogue::of(Version::LATEST);
    let changed = |f: &dyn Fn(&mut Value)| -> Vec<String> {
        let mut s = sim.clone();
        f(&mut s);
        differences(&wheel, &s, "the simulator", true)
    };
    type Change = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(Change, &str)> = vec![
        (Box::new(|s| s["routes"]["/get_load"] = json!(["GET"])), "route /get_load: the simulator serves it"),
        (Box::new(|s| drop(s["routes"].as_object_mut().map(|o| o.remove("/ready")))), "route /ready: SGLang 0.5.23 serves"),
        (Box::new(|s| s["routes"]["/generate"] = json!(["POST"])), "route /generate: the simulator answers"),
        (Box::new(|s| s["metrics"]["sglang:token_usage"] = json!("counter")), "metric sglang:token_usage: a counter"),
        (
            Box::new(|s| s["series"]["sglang:time_to_first_token_seconds"]["buckets"][0] = json!(0.05)),
            "metric sglang:time_to_first_token_seconds: the simulator's buckets",
        ),
        (Box::new(|s| s["series"]["sglang:num_requests"]["labels"] = json!([])), "metric sglang:num_requests: the simulator adds the labels"),
        (Box::new(|s| drop(s["metrics"].as_object_mut().map(|o| o.remove("sglang:kv_used_tokens")))), "metric sglang:kv_used_tokens"),
        (Box::new(|s| s["lines"]["sigterm"] = json!("SIGTERM received. Exiting.")), "sigterm line"),
        (Box::new(|s| s["api_key_exempt"] = json!(["/health"])), "paths exempt from --api-key"),
        (Box::new(|s| s["env"]["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] = json!(30)), "SGLANG_DISAGGREGATION_WAITING_TIMEOUT: the simulator defaults to 30"),
        (Box::new(|s| s["server_args"]["kv_cache_dtype"] = json!("bf16")), "kv_cache_dtype: the simulator defaults to \"bf16\""),
        (Box::new(|s| s["shutdown"]["serves_while_draining"] = json!(false)), "serves_while_draining: the simulator defaults to false"),
        (Box::new(|s| s["shutdown"]["watchdog_secs"] = json!(1)), "watchdog_secs: the simulator defaults to 1"),
        (
            Box::new(|s| drop(s["env"].as_object_mut().map(|o| o.remove("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE")))),
            "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE: SGLang 0.5.23 defaults to true, the simulator does not follow it",
        ),
        (Box::new(|s| drop(s["routes"].as_object_mut().map(|o| o.remove("/pause_generation")))), "route /pause_generation: SGLang 0.5.23 serves"),
        (Box::new(|s| drop(s["shutdown"].as_object_mut().map(|o| o.remove("health_generate_poll_secs")))), "health_generate_poll_secs: SGLang 0.5.23 has 1"),
    ];
    assert!(changed(&|_| {}).is_empty(), "unchanged, the catalogue agrees");
    for (change, named) in cases {
        let d = changed(&*change);
        assert!(d.iter().any(|l| l.contains(named)), "expected a difference naming {named:?}, got {d:#?}");
    }
}
