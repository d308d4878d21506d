//! `pdctl rollout revert ID` on the sandbox (real systemd, journald, D-Bus) behind the real
//! gateway, with pdctld.

use std::path::Path;
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::Pdctld;
use pdctl_tests::JsonRun;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn cli(d: &Pdctld, config: &Path, args: &[&str]) -> JsonRun {
    pdctl_tests::pdctl_daemon(d, config, args, LIMIT)
}

/// `pdctl rollout revert ID`: a rollout that loaded a drop-in on the decode is put back — the
/// drop-in moved aside (never deleted), the decode restarted through every gate on its files from
/// before, the prefill (restarted by that rollout, but unchanged) left alone; the record's kind is
/// `revert`. A rollout that changed no file has nothing to put back: exit 0 and no record; nor
/// has one already reverted (the answer names the revert). A revert accepts an outage only when
/// asked (`--allow-outage`, or the host's config), never because the reverted rollout did.
#[test]
fn rollout_revert_puts_back_only_what_the_rollout_changed_through_every_gate() {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld();
    let plain = cli(&d, &config, &["restart", "--rolling", "--json"]);
    assert_eq!(plain.code, 0, "{:#}", plain.summary);
    let plain_id = plain.summary["id"].as_str().expect("id").to_string();
    let dropin = stack.drop_in(D, "50-flag", "[Service]\nEnvironment=SGLANG_SIM_TOKENS_PER_SEC=150\n").expect("drop-in");
    // This host does not accept outages; the change was rolled with `--allow-outage`.
    std::fs::write(config.parent().expect("dir").join("config.d/41-no-outage.toml"), "[rollout]\nallow_outage = false\n").expect("fragment");
    let change = cli(&d, &config, &["restart", "--rolling", "--load-changes", "--allow-outage", "--json"]);
    assert_eq!(change.code, 0, "{:#}", change.summary);
    let change_id = change.summary["id"].as_str().expect("id").to_string();
    let (p0, d0) = (stack.show(P, "InvocationID").expect("p"), stack.show(D, "InvocationID").expect("d"));
    // Its revert does not take that acceptance unasked: refused, nothing touched; asked, it runs.
    let refused = cli(&d, &config, &["rollout", "revert", &change_id, "--json"]);
    assert_eq!((refused.code, refused.summary["failed"]["cause_code"].as_str()), (2, Some("only_worker_of_role")), "{:#}\n{}", refused.summary, refused.stderr);
    assert!(dropin.exists(), "a refusal moves no file");
    assert_eq!(stack.show(D, "InvocationID").expect("d"), d0, "a refusal restarts nothing");
    let r = cli(&d, &config, &["rollout", "revert", &change_id, "--allow-outage", "--reason", "tokens/s fell", "--json"]);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(r.summary["units"], serde_json::json!([D]), "{:#}", r.summary);
    let restored = r.events.iter().find(|e| e["unit"] == D && e["step"] == "rollback" && e["status"] == "passed").expect("the decode's files put back");
    assert!(restored["detail"]["restored"][0].as_str().unwrap_or("").starts_with(&format!("moved {} aside", dropin.display())), "{restored:#}");
    assert!(!dropin.exists());
    assert!(!stack.show(D, "Environment").expect("env").contains("SGLANG_SIM_TOKENS_PER_SEC"), "the decode runs without the change");
    assert_ne!(stack.show(D, "InvocationID").expect("d"), d0, "the decode was restarted on its files from before");
    assert_eq!(stack.show(P, "InvocationID").expect("p"), p0, "the unchanged prefill was not touched");
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("revert"), Some("succeeded")), "{rec:#}");
    assert_eq!(rec["started_by"]["reason"], "tokens/s fell");
    assert!(rec["reasons"][D][0].as_str().unwrap_or("").starts_with(&format!("revert of rollout {change_id}")), "{rec:#}");
    // The plain restart changed no file: nothing to put back.
    let (_, before) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    let none = cli(&d, &config, &["rollout", "revert", &plain_id, "--json"]);
    assert_eq!(none.code, 0, "{}", none.stderr);
    assert!(
        none.summary["message"].as_str().unwrap_or("").starts_with(&format!("nothing to revert: rollout {plain_id} changed no worker's files")),
        "{:#}",
        none.summary
    );
    let (_, after) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    assert_eq!(before["rollouts"].as_array().map(Vec::len), after["rollouts"].as_array().map(Vec::len), "no record for nothing");
    // The change reverted again: the decode already runs the files from before — nothing
    // restarted, no record, and the answer names the revert that did it.
    let d1 = stack.show(D, "InvocationID").expect("d");
    let again = cli(&d, &config, &["rollout", "revert", &change_id, "--json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let message = again.summary["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with(&format!("nothing to revert: {D} already running the files")) && message.contains(&format!("rollout {id} reverted it")),
        "{:#}",
        again.summary
    );
    assert_eq!(stack.show(D, "InvocationID").expect("d"), d1, "the decode was not restarted again");
    let (_, last) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    assert_eq!(after["rollouts"].as_array().map(Vec::len), last["rollouts"].as_array().map(Vec::len), "no record for nothing");
}
