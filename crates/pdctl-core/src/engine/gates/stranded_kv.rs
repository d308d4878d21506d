//! The stranded-KV gate (after a decode restart): the prefills release the KV they held for the old
//! decode process's rooms, read from `/v1/loads` (else the lagging queue gauges).

use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cause::Cause;
use crate::config::Worker;
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, Fail, Verdict};
use crate::engine::steps::rule;
use crate::events::Step;
use crate::ports::{Probes, Units};

/// After a decode restart: the prefills' queues of requests held for a decode drain to zero
/// within `stranded_kv_timeout` (rooms of requests the old decode process never fetched are
/// held until the prefill's bootstrap timeout). The prefill's queues — from its live
/// `/v1/loads?include=disagg` where served (0.5.23), else its queue gauges — not the KV level,
/// which moves with live load; they are per prefill, not per decode, so under steady traffic to other
/// decodes the gate waits for a moment they are all empty. A warning unless
/// `stranded_kv = "required"`.
/// The step runs on a decode with prefills (`gates::pair::peers`).
pub(in crate::engine) async fn stranded<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker) -> Result<Verdict<StrandedDetail>, Fail> {
    let prefills = gates::pair::peers(eng, w);
    let read = |p: &Worker| {
        let url = p.url.clone();
        async move { eng.probes.pd_queues(&url).await }
    };
    let mut start = BTreeMap::new();
    let mut watched = Vec::new();
    let mut unreadable = Vec::new();
    for p in &prefills {
        match read(p).await {
            Ok(q) if q.held_reqs > 0.0 => {
                start.insert(p.unit.clone(), HeldAt { held_reqs: q.held_reqs, used_tokens: q.used_tokens, source: q.source });
                watched.push(*p);
            }
            Ok(_) => {}
            Err(e) => unreadable.push(format!("{}: {e}", p.unit)),
        }
    }
    if watched.is_empty() {
        return Ok(Verdict::passed(StrandedDetail::Nothing(NothingHeld { held: BTreeMap::new(), unreadable })));
    }
    // Read from the gauges (a server without `/v1/loads`), a released room can show until the
    // next idle publish: the default limit covers that lag too.
    let from_gauges = start.values().any(|v| v.source != "/v1/loads");
    let limit = match eng.settings.verify.stranded_kv_timeout {
        Some(l) => l,
        None => {
            let mut longest = Duration::ZERO;
            for p in &watched {
                let env = eng.units.config(&p.unit).await.map(|c| c.environment).unwrap_or_default();
                longest = longest.max(crate::sglang::bootstrap_timeout(&env));
            }
            let lag = if from_gauges { crate::sglang::GAUGE_IDLE_PUBLISH } else { Duration::ZERO };
            longest + Duration::from_secs(10) + lag
        }
    };
    let t0 = Instant::now();
    let mut still: Vec<(String, f64, f64)>;
    loop {
        still = Vec::new();
        for p in &watched {
            if let Ok(q) = read(p).await {
                if q.held_reqs > 0.0 {
                    still.push((p.unit.clone(), q.held_reqs, q.used_tokens));
                }
            }
        }
        if still.is_empty() || t0.elapsed() >= limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut detail = Waited { held_at_start: start, limit_ms: limit.as_millis() as u64, waited_ms: t0.elapsed().as_millis() as u64, released: None };
    if still.is_empty() {
        detail.released = Some(true);
        return Ok(Verdict::passed(StrandedDetail::Waited(detail)));
    }
    let held = still.iter().map(|(u, r, t)| format!("{u} holds {r} request(s) ({t} tokens in use)")).collect::<Vec<_>>().join(", ");
    let cause = Cause::StrandedKv { decode: w.unit.clone(), held, after: limit };
    let mode = rule(Step::StrandedKv, &eng.settings).mode;
    let failed = detail_of(&detail);
    detail.released = Some(false);
    Verdict::warned_under(mode, &cause, StrandedDetail::Waited(detail)).ok_or(Fail { cause, detail: failed, unit: None, last_lines: Vec::new() })
}

/// The step's detail: nothing was held, or what was held and the wait for it.
#[derive(Serialize)]
#[serde(untagged)]
pub(in crate::engine) enum StrandedDetail {
    /// No prefill held anything.
    Nothing(NothingHeld),
    /// Some did: the wait.
    Waited(Waited),
}

/// What a prefill held for the decode's old rooms when the step began.
#[derive(Serialize)]
pub(in crate::engine) struct HeldAt {
    /// Requests it held.
    held_reqs: f64,
    /// KV tokens in use.
    used_tokens: f64,
    /// Where that was read (`/v1/loads`, or the queue gauges).
    source: &'static str,
}

/// The step's detail when no prefill held anything (the JSON in docs/cli.md).
#[derive(Serialize)]
pub(in crate::engine) struct NothingHeld {
    /// Always empty.
    held: BTreeMap<String, HeldAt>,
    /// Prefills whose queues could not be read.
    unreadable: Vec<String>,
}

/// The step's detail after its wait (the JSON in docs/cli.md).
#[derive(Serialize)]
pub(in crate::engine) struct Waited {
    /// What each prefill held at the start.
    held_at_start: BTreeMap<String, HeldAt>,
    /// How long it could wait.
    limit_ms: u64,
    /// How long it waited.
    waited_ms: u64,
    /// Whether everything was released (absent on a failed step: its cause says what is held).
    #[serde(skip_serializing_if = "Option::is_none")]
    released: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_stranded_kv_details_have_the_keys_of_the_contract() {
        let mut start = BTreeMap::new();
        start.insert("p.service".to_string(), HeldAt { held_reqs: 1.0, used_tokens: 8.0, source: "/v1/loads" });
        let w = Waited { held_at_start: start, limit_ms: 2, waited_ms: 3, released: Some(true) };
        let want = json!({"held_at_start": {"p.service": {"held_reqs": 1.0, "used_tokens": 8.0, "source": "/v1/loads"}}, "limit_ms": 2, "waited_ms": 3, "released": true});
        assert_eq!(detail_of(&w), want);
        assert_eq!(detail_of(&NothingHeld { held: BTreeMap::new(), unreadable: vec![] }), json!({"held": {}, "unreadable": []}));
    }
}

/// The stranded-KV gate inside a rollout over fakes: how long it waits, by where it read the rooms.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

    #[tokio::test]
    async fn the_stranded_kv_wait_covers_the_gauges_idle_publish_only_when_read_from_gauges() {
        // A prefill holds one room when the decode restarts; the next read finds it released.
        for (source, limit_ms) in [("/v1/loads", 310_000), ("/metrics", 340_000)] {
            let w = world();
            w.lock().unwrap().held = vec![PdQueues { held_reqs: 1.0, used_tokens: 9.0, source }];
            let (summary, events) = run(&w, settings()).await;
            assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
            let s = &events
                .iter()
                .find(|e| e.unit == "d.service" && e.step == Step::StrandedKv && e.status == Status::Passed)
                .expect("the stranded-KV gate ran")
                .detail;
            assert_eq!(s["held_at_start"]["p.service"]["source"], source, "{s}");
            assert_eq!(s["released"], true, "{s}");
            // The bootstrap timeout's default (300 s) + 10 s, + SGLang's 30 s idle publish when the
            // held rooms were read from the lagging gauges.
            assert_eq!(s["limit_ms"], limit_ms, "{s}");
        }
    }
}
