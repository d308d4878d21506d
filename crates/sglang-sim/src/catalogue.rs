//! The simulator's catalogue of SGLang facts for one version profile: the routes it serves (with
//! their methods), the Prometheus families it exposes (with their types), its ready and shutdown
//! lines, the paths exempt from `--api-key`, the disaggregation environment defaults and the
//! server-argument defaults it follows.
//!
//! Every entry is read from what the simulator does — the route table the router is built from
//! ([`crate::server::served_routes`]), a rendered `/metrics` after traffic, the constants its log
//! lines and argument parser use — so that a change to the simulator changes its catalogue. The
//! conformance test (`tests/conformance.rs`) compares the catalogue of the pinned release with the
//! facts read from that release's wheel (`tests/conformance/sglang_facts.py`) and names every
//! difference.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::args::{parse, DEFERRED_RELEASE_ENV, DISAGG_ENV};
use crate::engine::Engine;
use crate::server::{served_routes, API_KEY_EXEMPT, DRAINING_LINE, READY_LINE, SERVES_WHILE_DRAINING, SIGTERM_LINE, WATCHDOG_PERIOD};
use crate::version::Version;

/// The catalogue of `version` as JSON, in the shape `sglang_facts.py` prints:
/// `{version, routes: {path: [methods]}, metrics: {family: type}, series: {family: {labels,
/// buckets}}, lines: {ready, sigterm,
/// draining}, api_key_exempt: [prefix], env: {name: default}, server_args: {name: default},
/// shutdown: {serves_while_draining, watchdog_secs, health_generate_poll_secs}}`.
pub fn of(version: Version) -> Value {
    let flags = |extra: &[&str]| -> Vec<String> {
        ["--model-path", "m", "--enable-metrics", "--sim-version", &version.to_string()].iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let none = |_: &str| None;
    // Parsing these fixed flags cannot fail; an empty catalogue would fail the comparison loudly.
    let Ok(cfg) = parse(&flags(&[]), &none) else {
        return json!({"version": version.to_string(), "error": "the simulator rejected its own flags"});
    };
    let routes: BTreeMap<&str, Vec<&str>> = served_routes(&cfg).into_iter().map(|(p, m)| (p, m.to_vec())).collect();

    // Every family a server of this profile exposes once it has served a request (a regular
    // server publishes at its prefill batch; the PD queue gauges are published by both roles),
    // with the label names and buckets of the histograms.
    let mut metrics: BTreeMap<String, String> = BTreeMap::new();
    let engine = Engine::new(Arc::new(cfg.clone()));
    let t = engine.admit(8);
    engine.finish(t);
    engine.count_abort();
    engine.observe_first_token(false, 0.05);
    engine.observe_later_tokens(0.005, 1);
    engine.observe_finished(false, 0.06, 7, 2);
    let mut series: BTreeMap<String, Value> = BTreeMap::new();
    let mut family = String::new();
    for line in engine.render_metrics(false).lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                // prometheus_client's text format names a counter's family with its `_total`.
                let name = if kind == "counter" { name.strip_suffix("_total").unwrap_or(name) } else { name };
                metrics.insert(name.to_string(), kind.to_string());
                family = name.to_string();
            }
        } else if !line.starts_with('#') {
            note_series(series.entry(family.clone()).or_insert_with(|| json!({"labels": []})), line);
        }
    }

    let mut env: BTreeMap<&str, Value> = DISAGG_ENV.iter().map(|(n, v)| (*n, number(*v))).collect();
    env.insert(DEFERRED_RELEASE_ENV, json!(cfg.deferred_release.is_some()));
    let server_args = Some(&cfg).map(|d| {
        json!({
            "disaggregation_bootstrap_port": d.bootstrap_port,
            "page_size": d.page_size_flag,
            "kv_cache_dtype": d.kv_cache_dtype,
            "dtype": d.dtype,
            "api_key": d.api_key,
        })
    });
    json!({
        "version": version.to_string(),
        "routes": routes,
        "metrics": metrics,
        "series": series,
        "lines": lines(),
        "api_key_exempt": API_KEY_EXEMPT,
        "env": env,
        "server_args": server_args,
        "shutdown": {
            "serves_while_draining": SERVES_WHILE_DRAINING,
            "watchdog_secs": WATCHDOG_PERIOD.as_secs(),
            "health_generate_poll_secs": cfg.sim.health_generate.as_secs_f64(),
        },
    })
}

/// The log lines and the role switch's answers, by key.
fn lines() -> Value {
    let mut l: BTreeMap<&str, &str> = [("ready", READY_LINE), ("sigterm", SIGTERM_LINE), ("draining", DRAINING_LINE)].into_iter().collect();
    l.extend(crate::server::role_switch::MESSAGES.iter().copied());
    json!(l)
}

/// The label names every series of a family has (`labels`: those beyond the collector's own,
/// the ones `labelnames=[*labels.keys(), ...]` adds) and a histogram's finite bounds
/// (`buckets`), from one sample line of the rendered text.
fn note_series(entry: &mut Value, line: &str) {
    const OWN: &[&str] = &["engine_type", "model_name", "moe_ep_rank", "pid", "pp_rank", "tp_rank", "le"];
    let Some((_, rest)) = line.split_once('{') else { return };
    let Some((labels, _)) = rest.rsplit_once('}') else { return };
    for pair in labels.split(',') {
        let Some((k, v)) = pair.split_once('=') else { continue };
        let v = v.trim_matches('"');
        if k == "le" {
            if let Ok(b) = v.parse::<f64>() {
                let list = entry.as_object_mut().map(|o| o.entry("buckets").or_insert_with(|| json!([])));
                if let Some(Value::Array(a)) = list {
                    if !a.iter().any(|x| x.as_f64() == Some(b)) && b.is_finite() {
                        a.push(json!(b));
                    }
                }
            }
        } else if !OWN.contains(&k) {
            if let Some(Value::Array(a)) = entry.get_mut("labels") {
                if !a.iter().any(|x| x == k) {
                    a.push(json!(k));
                }
            }
        }
    }
}

/// An integer where the value is one (`300`, not `300.0`), as Python's `EnvInt` default prints.
fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        json!(v as i64)
    } else {
        json!(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_follows_the_profile() {
        let new = of(Version::LATEST);
        assert!(new["routes"].get("/v1/loads").is_some() && new["routes"].get("/get_load").is_none(), "{new:#}");
        assert_eq!(new["routes"]["/generate"], json!(["POST", "PUT"]));
        assert_eq!(new["metrics"]["sglang:num_requests"], "counter");
        assert_eq!(new["env"]["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"], 300);
        let old = of(Version(0, 4, 6));
        assert!(old["routes"].get("/get_load").is_some() && old["routes"].get("/ready").is_none(), "{old:#}");
        assert!(old["metrics"].get("sglang:num_prefill_infight_queue_reqs").is_some());
    }
}
