//! docs/grafana-dashboard.json is checked against what is really exposed: every metric name its
//! queries use exists in the simulator's `/metrics` (both `sglang:` in text format and `sglang_`
//! in OpenMetrics), the real gateway's, or pdctld's — on the sandbox, after traffic.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

/// The metric names a PromQL expression uses: each alternative of `{__name__=~"a|b"}`, and bare
/// `smg_…`/`pdctl_…` identifiers.
fn names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("__name__=~\"") {
        let after = &rest[i + 11..];
        let end = after.find('"').unwrap_or(after.len());
        out.extend(after[..end].split('|').map(String::from));
        rest = &after[end..];
    }
    for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        if word.starts_with("smg_") || word.starts_with("pdctl_") {
            out.insert(word.to_string());
        }
    }
    out
}

/// `name` is in `text` as a sample or family name (a counter's family drops `_total`).
fn exposed(text: &str, name: &str) -> bool {
    let base = name.strip_suffix("_total").unwrap_or(name);
    text.lines().any(|l| {
        let l = l.strip_prefix("# TYPE ").or_else(|| l.strip_prefix("# HELP ")).unwrap_or(l);
        let id: String = l.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
        id == name || id == base || id.strip_suffix("_total") == Some(base)
    })
}

#[test]
fn every_metric_name_in_the_dashboard_is_exposed_by_the_simulator_the_gateway_or_pdctld() {
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(pdctl_tests::pdctl_sandbox::repo_root().join("docs/grafana-dashboard.json")).expect("dashboard"))
            .expect("JSON");
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    let (stack, config, d) = pdctl_tests::stack_with_pdctld();
    // A rollout and traffic: every series the dashboard shows is touched.
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], Duration::from_secs(150));
    assert_eq!(r.code, 0, "{:#}", r.summary);
    // And a failed gate (the decode exits at start), for the failure counters.
    stack.drop_in("sglang-dsv4-decode.service", "50-exit", "[Service]\nEnvironment=SGLANG_SIM_EXIT_CODE=3\n").expect("drop-in");
    let f = pdctl_tests::pdctl_daemon(
        &d,
        &config,
        &["restart", "--rolling", "--load-changes", "--unit", "sglang-dsv4-decode.service", "--json"],
        Duration::from_secs(150),
    );
    assert_eq!(f.code, 1, "{:#}", f.summary);
    let router = stack.router.as_ref().expect("router");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let get = |url: String, accept: &'static str| {
        rt.block_on(async { pdctl_tests::http().get(url).header("accept", accept).send().await.expect("GET").text().await.expect("body") })
    };
    rt.block_on(async {
        // Traffic straight to the prefill (the decode is down now): its gauges are published.
        let body = serde_json::json!({"text": "hello", "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "2.2.2.2", "bootstrap_port": 1, "bootstrap_room": 1});
        let r = pdctl_tests::http().post(format!("{}/generate", stack.prefill.url)).json(&body).send().await.expect("request");
        assert_eq!(r.status(), 200);
    });
    let text = get(format!("{}/metrics", stack.prefill.url), "text/plain");
    let om = get(format!("{}/metrics", stack.prefill.url), "application/openmetrics-text");
    let gateway = get(router.metrics_url.clone(), "text/plain");
    let pdctld = get(d.metrics_url.clone(), "text/plain");
    let mut missing = Vec::new();
    for e in &exprs {
        for n in names(e) {
            let found = if n.starts_with("sglang:") {
                exposed(&text, &n)
            } else if n.starts_with("sglang_") {
                exposed(&om, &n)
            } else if n.starts_with("smg_") {
                exposed(&gateway, &n)
            } else {
                exposed(&pdctld, &n)
            };
            if !found {
                missing.push(n);
            }
        }
    }
    assert!(missing.is_empty(), "the dashboard queries names nothing exposes: {missing:?}");
}
