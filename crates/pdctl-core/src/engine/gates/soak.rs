//! The soak: the same run (InvocationID, NRestarts) stays up for `min_healthy`; and the availability
//! probe that watches what clients see meanwhile.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::cause::{Cause, Phase};
use crate::engine::gates;
use pdctl_parse::service::ServiceScrape;

use crate::config::{Role, Worker};
use crate::engine::context::Clients;
use crate::engine::machine::Engine;
use crate::engine::step_run::{lock, Fail, Verdict};
use crate::ports::{Probes, UnitState, Units, Watch};
use crate::service::slo::Verdict as Slo;
use crate::sglang::judge::crashed_since;

/// The soak of a restarted worker: the same run for `min_healthy`, then (with `[verify.slo]`)
/// the service gate over the soak window; `before`: its figures from before its drain (the
/// service gate's baseline when it is the only worker of its role).
pub(in crate::engine) async fn soak<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    watch: &mut U::W,
    after: &UnitState,
    before: Option<ServiceScrape>,
) -> Result<Verdict<SoakDetail>, Fail> {
    let unit = w.unit.as_str();
    let limit = eng.settings.rollout.min_healthy;
    let slo_start = match &eng.settings.verify.slo {
        Some(_) => Some(gates::service_level::slo_start(eng, w).await),
        None => None,
    };
    let crashed = |why: String| Fail::from(Cause::Crashed { unit: unit.to_string(), phase: Phase::Soak, why });
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            c = watch.changed() => {
                if c.is_none() {
                    return Err(Cause::EventSourceClosed { what: "the D-Bus connection to systemd".into() }.into());
                }
                let st = eng.units.state(unit).await?;
                if let Some(why) = crashed_since(&st, after) {
                    return Err(crashed(why));
                }
            }
            _ = &mut deadline => break,
        }
    }
    let slo = match (&eng.settings.verify.slo, slo_start) {
        (Some(slo), Some(start)) => {
            let report = gates::service_level::slo_judge(eng, w, slo, start, before).await?;
            Some(gates::service_level::slo_when_unjudged(eng, w, slo, report).await?)
        }
        _ => None,
    };
    // Changes between signals are caught by comparing once more.
    let st = eng.units.state(unit).await?;
    if let Some(why) = crashed_since(&st, after) {
        return Err(crashed(why));
    }
    if st.active_state != crate::ports::ActiveState::Active {
        return Err(crashed(format!("it is {}/{} after the soak, not active", st.active_state, st.sub_state)));
    }
    let note = match slo.as_ref().map(|r| &r.verdict) {
        Some(Slo::NotJudged { why }) => Some(format!("{unit}'s service was not judged: {why}")),
        _ => None,
    };
    let d = SoakDetail { held_ms: limit.as_millis() as u64, invocation_id: st.invocation_id, n_restarts: st.n_restarts, slo };
    Ok(Verdict::Passed(d, crate::details::Said { note, ..Default::default() }))
}

/// The soak step's detail (the JSON in docs/cli.md): how long the same run held, and the service
/// gate's report when `[verify.slo]` is set.
#[derive(serde::Serialize)]
pub(in crate::engine) struct SoakDetail {
    /// How long it was held to the same run.
    held_ms: u64,
    /// The run it stayed.
    invocation_id: String,
    /// Its restarts so far (unchanged since the restart).
    n_restarts: u32,
    /// The service gate's report.
    #[serde(skip_serializing_if = "Option::is_none")]
    slo: Option<crate::service::slo::Report>,
}

/// The availability probe: every `1/rate` s, one 1-token request through the router — unless a
/// role has no worker the gateway admits (then nothing is sent, and the tick counts as an error
/// from the gateway's view) — until the rollout is over.
pub(in crate::engine) async fn watch_clients<U, L, P: Probes>(eng: &Engine<U, L, P>, rate: f64, c: &Clients) {
    use crate::service::availability::Sample;
    let mut roles: Vec<Role> = eng.settings.workers.iter().map(|w| w.role).collect();
    roles.sort();
    roles.dedup();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // One last sample after the rollout ended: a worker still out at the end (a halt)
        // keeps the error window open until then.
        let last = c.done.load(Ordering::SeqCst);
        let at = Instant::now();
        let unit = lock(&c.current).clone();
        let admitted = match tokio::time::timeout(Duration::from_secs(5), eng.probes.router_workers(0)).await {
            Ok(Ok(list)) => roles.iter().all(|r| list.iter().any(|x| x.worker_type == r.as_str() && x.admitted())),
            _ => false,
        };
        let sample = if admitted {
            let t = Instant::now();
            let ok = matches!(tokio::time::timeout(Duration::from_secs(5), eng.probes.smoke(0, 1)).await, Ok(Ok(())));
            if !ok {
                c.failed.fetch_add(1, Ordering::SeqCst);
            }
            Sample { at, sent: true, ok, latency: ok.then(|| t.elapsed()), unit }
        } else {
            Sample { at, sent: false, ok: false, latency: None, unit }
        };
        lock(&c.samples).push(sample);
        if last {
            break;
        }
    }
}
