//! What a rollout writes — its events and its summary, as JSON — held byte for byte against
//! `golden/rollout_stream.json`, over fakes of systemd, the journal and the gateway. Only what
//! chance decides is masked (times, durations, the looks a timed look took, a probe's random
//! room; where two units restart at once, the ids handed out in the order they get there). The file was written by the engine before its
//! orchestration was layered (`PDCTL_WRITE_GOLDEN=1` writes it anew): a change of the engine's
//! structure that changes a key, a value, a step or the order of a unit's steps fails here.

#[allow(unused_imports)] // the fakes re-export for every test file; this one uses some
mod fakes;

use fakes::*;
use serde_json::{json, Map, Value};

/// What chance decides masked: durations and times (keys ending `_ms`, `_us`, and `at`), how
/// many looks a timed look took (`looks`, `busy_looks`), a pair probe's random room, and (`ids`) the ids the fakes hand out in the order calls reach them.
fn masked(v: &Value, ids: bool) -> Value {
    const IDS: [&str; 6] = ["invocation_id", "old_invocation_id", "main_pid", "pid", "router_id", "removed_router_id"];
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| {
                    let chance = k.ends_with("_ms")
                        || k.ends_with("_us")
                        || k == "at"
                        || k == "room"
                        || k == "looks"
                        || k == "busy_looks"
                        || (ids && IDS.contains(&k.as_str()));
                    (k.clone(), if chance && !x.is_null() && !x.is_object() && !x.is_array() { json!(0) } else { masked(x, ids) })
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| masked(x, ids)).collect()),
        x => x.clone(),
    }
}

/// A run's JSON: its summary, and each unit's events in the order that unit saw them (units
/// restarted at once interleave as the scheduler lets them; each one's own order is fixed, and
/// `ids` masks the ids the fakes hand out in the order of that interleaving).
fn written(summary: &pdctl_core::events::Summary, events: &[Event], ids: bool) -> Value {
    let mut by_unit = Map::new();
    for e in events {
        let v = masked(&serde_json::to_value(e).expect("an event serializes"), ids);
        if let Some(list) = by_unit.entry(e.unit.clone()).or_insert_with(|| json!([])).as_array_mut() {
            list.push(v);
        }
    }
    json!({"summary": masked(&serde_json::to_value(summary).expect("the summary serializes"), ids), "events": by_unit})
}

async fn scenarios() -> Value {
    let mut out = Map::new();
    // A rolling restart behind the gateway: every gate passes.
    let w = world();
    let s = with_router(&w, true);
    let (summary, events) = run(&w, s).await;
    out.insert("rolling_restart_behind_the_gateway".into(), written(&summary, &events, false));
    // A gate that fails: the rollout halts there.
    let w = world();
    w.lock().unwrap().unhealthy.push("http://p".into());
    let (summary, events) = run(&w, settings()).await;
    out.insert("a_failed_health_gate_halts".into(), written(&summary, &events, false));
    // A 1P1D pair restarted together.
    let w = world();
    let mut s = with_router(&w, true);
    s.rollout.single_pair = pdctl_core::config::SinglePair::Together;
    let (summary, events) = run(&w, s).await;
    out.insert("a_pair_restarted_together".into(), written(&summary, &events, true));
    // A check: every gate but restart and soak, nothing changed.
    let w = world();
    let s = with_router(&w, true);
    let (summary, events) = check(&w, s).await;
    out.insert("a_check".into(), written(&summary, &events, false));
    Value::Object(out)
}

#[tokio::test]
async fn the_events_and_summary_a_rollout_writes_are_those_on_record() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/rollout_stream.json");
    let now = scenarios().await;
    if std::env::var_os("PDCTL_WRITE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("the golden folder");
        std::fs::write(&path, serde_json::to_string_pretty(&now).expect("JSON") + "\n").expect("write the golden file");
        return;
    }
    let text = std::fs::read_to_string(&path).expect("tests/golden/rollout_stream.json (PDCTL_WRITE_GOLDEN=1 writes it)");
    let was: Value = serde_json::from_str(&text).expect("the golden file reads");
    if let Some(out) = std::env::var_os("PDCTL_DUMP_STREAM") {
        let _ = std::fs::write(out, serde_json::to_string_pretty(&now).unwrap_or_default() + "\n");
    }
    for (name, want) in was.as_object().expect("scenarios") {
        let got = &now[name];
        assert_eq!(
            serde_json::to_string_pretty(got).expect("JSON"),
            serde_json::to_string_pretty(want).expect("JSON"),
            "scenario {name}: what the rollout writes changed"
        );
    }
    assert_eq!(now.as_object().map(|o| o.len()), was.as_object().map(|o| o.len()), "every scenario is on record");
}
