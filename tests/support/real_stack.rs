//! The real-server tier's shared helpers: the real stack's options, a config fragment, and what
//! a failure report prints (each unit's and the gateway's last lines, the gateway's failed
//! requests).

use crate::pdctl_sandbox::stack::{Server, Stack, StackOptions};
use crate::JsonRun;

/// The real 1P1D stack. The decode waits 30 s for a room's KV and the prefill holds a room 30 s
/// (SGLang's defaults are 300 s each): a failed transfer shows within a test's time.
pub fn real_opts() -> StackOptions {
    StackOptions { server: Server::Real, waiting_timeout_secs: 30.0, bootstrap_timeout_secs: 30.0, ..Default::default() }
}

/// Write a config fragment `name` beside the stack's pdctl config (read by the next `pdctl`).
pub fn fragment(config: &std::path::Path, name: &str, text: &str) {
    let dir = config.parent().expect("config dir").join("config.d");
    std::fs::write(dir.join(format!("{name}.toml")), text).expect("fragment");
}

/// The last lines of each unit and of the gateway, for a failure report.
pub fn logs(stack: &Stack) -> String {
    let mut units: Vec<String> = stack.workers().iter().map(|w| w.unit.clone()).collect();
    units.extend(stack.router.iter().map(|r| r.unit.clone()));
    units
        .iter()
        .map(|u| {
            let out = stack.sandbox.journalctl(&["-u", u, "-n", "60", "--no-pager", "-o", "short-precise"]);
            format!("--- {u}:\n{}\n", out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_else(|e| e.to_string()))
        })
        .collect()
}

/// What failed, by gate, with the servers' last lines.
pub fn explain(stack: &Stack, r: &JsonRun) -> String {
    let f = &r.summary["failed"];
    format!(
        "exit {}: {} failed at {} ({}): {}\nsummary: {:#}\nstderr: {}\n{}",
        r.code,
        f["unit"],
        f["step"],
        f["cause_code"],
        f["cause"],
        r.summary,
        r.stderr,
        logs(stack)
    )
}

/// What the gateway logged of the requests it failed (the first 20 distinct lines), with the
/// pdctl steps' times beside them in the caller's output: why a client request failed.
pub fn gateway_errors(stack: &Stack) -> String {
    let Some(r) = &stack.router else { return String::new() };
    let out = stack
        .sandbox
        .journalctl(&["-u", &r.unit, "--no-pager", "-o", "short-precise"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let mut lines = Vec::new();
    for l in out.lines().filter(|l| {
        (l.contains("ERROR") || l.contains("No available") || l.contains("Circuit breaker state") || l.contains("status_code=5"))
            && !l.contains("detect_connection_mode")
    }) {
        let key: String = l.chars().skip(60).take(120).collect();
        if seen.insert(key) && lines.len() < 20 {
            lines.push(l.chars().take(700).collect::<String>());
        }
    }
    format!("--- what {} logged of the requests it failed:\n{}\n{}", r.unit, lines.join("\n"), logs(stack))
}
