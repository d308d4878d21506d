//! Host maintenance as the tests see it: the host's maintenance (`GET /v1/host`), the newest
//! rollout record, and a "reboot" of a sandboxed host — pdctld stopped, every worker unit started
//! again by its manager as a boot starts enabled units, pdctld started again.

use std::time::Duration;

use pdctl_sandbox::stack::{Pdctld, Stack};
use serde_json::Value;

use crate::raw_api;

/// What `GET /v1/host` answers (it must answer 200).
pub fn host_status(d: &Pdctld) -> Value {
    let (code, v) = raw_api(&d.socket, "GET", "/v1/host", "");
    assert_eq!(code, 200, "{v:#}");
    v
}

/// The newest rollout record of this pdctld, once it has ended (its record is concluded just
/// after the maintenance record is crossed off), or as it is after 30 s.
pub fn newest(d: &Pdctld) -> Value {
    let mut rec = Value::Null;
    crate::until(Duration::from_secs(30), Duration::from_millis(250), || {
        rec = newest_now(d);
        rec["lifecycle"]["state"] != "running"
    });
    rec
}

/// The newest rollout record of this pdctld, as it is now.
pub fn newest_now(d: &Pdctld) -> Value {
    let (_, list) = raw_api(&d.socket, "GET", "/v1/rollouts", "");
    let id = list["rollouts"]
        .as_array()
        .and_then(|a| a.iter().max_by_key(|r| r["created_at"].as_u64()))
        .and_then(|r| r["id"].as_str())
        .unwrap_or_default()
        .to_string();
    raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "").1
}

/// Whether the record has `unit`'s `step` passed.
pub fn passed(rec: &Value, unit: &str, step: &str) -> bool {
    rec["events"].as_array().is_some_and(|es| es.iter().any(|e| e["unit"] == unit && e["step"] == step && e["status"] == "passed"))
}

/// A "reboot" of the sandboxed host `s`: pdctld stopped, every worker unit started again by the
/// manager (without waiting, as the boot starts them), pdctld started again.
pub fn reboot(s: &Stack, d: &Pdctld) {
    s.sandbox.systemctl(&["stop", &d.unit]).expect("stop pdctld");
    for w in s.workers() {
        s.sandbox.systemctl(&["start", "--no-block", &w.unit]).expect("start unit");
    }
    s.sandbox.systemctl(&["start", &d.unit]).expect("start pdctld");
}
