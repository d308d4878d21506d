//! The metrics gate: the KV gauges are exposed and sane (one warm-up request, or a PD pair, when
//! SGLang has not published them yet).

use std::time::Instant;

use crate::cause::{Cause, MetricsDiagnosis};
use crate::config::{Role, Worker};
use crate::engine::context::Ctx;
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{within, Fail, Verdict, POLL};
use crate::engine::steps::rule;
use crate::events::Step;
use crate::ports::{Health, Probes};

/// The metrics step's detail (the JSON in docs/cli.md): the KV report, beside the warm-up request
/// sent to publish the gauges (`null`: none) and the wait.
#[derive(serde::Serialize)]
pub(in crate::engine) struct MetricsDetail {
    /// The worker's KV gauges.
    #[serde(flatten)]
    report: crate::ports::KvReport,
    /// The warm-up request sent (its answer, or why it failed).
    warm_up_request: Option<String>,
    /// How long the step waited.
    waited_ms: u64,
}

/// The metrics step: the worker's KV gauges published (warmed with a request when allowed and
/// needed), skipped when the step is off; under `warn`, a failure passes with its warning.
pub(in crate::engine) async fn metrics<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    may_warm: bool,
    ctx: Ctx<'_>,
) -> Result<Verdict<Option<MetricsDetail>>, Fail> {
    let rule = rule(Step::Metrics, &eng.settings);
    if let Some(why) = rule.off_because {
        return Ok(Verdict::Skipped(why.to_string()));
    }
    match published(eng, w, may_warm, ctx).await {
        Ok(d) => Ok(Verdict::passed(Some(d))),
        Err(f) => Verdict::warned_under(rule.mode, &f.cause, None).ok_or(f),
    }
}

/// The worker's KV gauges, waited for (bounded by `metrics_timeout`).
async fn published<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, may_warm: bool, ctx: Ctx<'_>) -> Result<MetricsDetail, Fail> {
    let t0 = Instant::now();
    let limit = eng.settings.rollout.metrics_timeout;
    let mut warmed: Option<String> = None;
    // Warm-ups sent, and how many may be: one, or with attention DP two for each rank still
    // unpublished (a decode's DP controller sends each request to the next rank; a prefill's
    // follows the room, which is random), at most 16.
    let (mut sent_count, mut may_send) = (0usize, 1usize);
    loop {
        let problem = match within(t0, limit, eng.probes.kv(&w.url)).await {
            Some(Ok(r)) => {
                return Ok(MetricsDetail { report: r, warm_up_request: warmed, waited_ms: t0.elapsed().as_millis() as u64 });
            }
            Some(Err(p)) => p,
            None => crate::ports::MetricsError {
                diagnosis: MetricsDiagnosis::Unreachable,
                message: format!("{}/metrics did not answer within {limit:?}", w.url),
                pending_ranks: 0,
            },
        };
        if !problem.may_resolve() {
            return Err(Cause::MetricsMissing { unit: w.unit.clone(), diagnosis: problem.diagnosis, detail: problem.message, waited: None }.into());
        }
        may_send = may_send.max((1 + 2 * problem.pending_ranks).min(16));
        if may_warm && sent_count < may_send && eng.settings.verify.warmup_request && problem.diagnosis == MetricsDiagnosis::NotPublished {
            // Gauges appear on the first batch; a PD decode server also needs 40 decode steps.
            // A PD worker is warmed with a pair sent straight to it and a serving peer (it may
            // be the only one of its role in the router, or its peers may be out of it).
            let direct = if w.role == Role::Regular { None } else { warm_pair(eng, w, ctx).await };
            let sent = match (direct, eng.settings.verify.router, w.role) {
                (Some(r), _, _) => r,
                (None, true, _) => eng.probes.smoke(0, 48).await.map(|_| "sent through the router".to_string()),
                (None, false, Role::Regular) => eng.probes.warm_worker(&w.url).await.map(|_| "sent to the worker".to_string()),
                (None, false, _) => Ok("not sent: no peer of the other PD role serves".to_string()),
            };
            sent_count += 1;
            let said = sent.unwrap_or_else(|e| format!("failed: {e}"));
            warmed = Some(if sent_count == 1 {
                said
            } else {
                format!("{said} ({sent_count} requests: each attention-DP rank publishes its gauges at its own first batch)")
            });
            continue; // the request has finished: the gauges may be there now
        }
        if t0.elapsed() >= limit {
            return Err(Cause::MetricsMissing { unit: w.unit.clone(), diagnosis: problem.diagnosis, detail: problem.message, waited: Some(limit) }.into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A 48-token PD request sent straight to `w` and the first serving peer of its model (`None`:
/// no peer serves; a coherent switch's other group is not one).
pub(in crate::engine) async fn warm_pair<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    ctx: Ctx<'_>,
) -> Option<Result<String, crate::ports::HttpFailure>> {
    for peer in gates::pair::peers(eng, w) {
        if gates::pair::other_model(peer, ctx).is_some() || eng.probes.health(&peer.url).await != Health::Up {
            continue;
        }
        let (p, d) = if w.role == Role::Prefill { (w, peer) } else { (peer, w) };
        let probe = gates::pair::pair_request(eng, w, peer, 48).await;
        return Some(match probe.decode {
            crate::sglang::pairing::Half::Answered { status: 200, .. } => Ok(format!("sent straight to the pair {} + {}", p.unit, d.unit)),
            other => Err(crate::ports::HttpFailure(format!("the pair {} + {} answered: {}", p.unit, d.unit, other.describe()))),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_metrics_detail_is_the_report_beside_the_warm_up_and_the_wait() {
        let report = crate::ports::KvReport {
            max_total_tokens: Some(8.0),
            token_usage: 0.5,
            used_tokens: 4.0,
            available_tokens: None,
            evictable_tokens: None,
            running_reqs: Some(0.0),
            queue_reqs: None,
            names: vec!["sglang:token_usage".into()],
            ranks: Vec::new(),
            unpublished: Vec::new(),
        };
        let mut want = serde_json::to_value(&report).unwrap_or_default();
        want["warm_up_request"] = json!(null);
        want["waited_ms"] = json!(7);
        let d = MetricsDetail { report, warm_up_request: None, waited_ms: 7 };
        assert_eq!(serde_json::to_value(&d).unwrap_or_default(), want);
    }
}
