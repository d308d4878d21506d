//! The service gate (`[verify.slo]`), part of the soak: the restarted worker's latency and error
//! figures over the soak window against its role's other workers over the same window — or,
//! when it is the only worker of its role, against its own figures from before its drain. The
//! judgement itself is [`crate::service::slo::judge`]; this file takes the scrapes and waits (bounded) for
//! enough traffic.

use std::time::{Duration, Instant};

use pdctl_parse::service::ServiceScrape;

use crate::cause::Cause;
use crate::config::{Role, Slo, Unjudged, Worker};
use crate::engine::context::Ctx;
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{lock, Fail};
use crate::ports::Probes;
use crate::service::slo::{judge, judge_sample, Baseline, Report, Verdict, Window};

/// One worker's figures at the start of the window.
#[derive(Debug, Clone)]
pub(in crate::engine) struct Mark {
    unit: String,
    url: String,
    service: ServiceScrape,
    gateway: Option<(f64, f64)>,
}

/// The scrapes the window starts from (taken when the soak starts).
#[derive(Debug, Clone)]
pub(in crate::engine) struct SloStart {
    own: Result<Mark, String>,
    peers: Vec<Mark>,
    /// Peers whose figures could not be read (named in the report).
    unread: Vec<String>,
}

/// How often the gate looks again while it waits for `min_requests`.
const POLL: Duration = Duration::from_secs(1);

/// The same role's other workers of this host: the service gate's peers.
pub(in crate::engine) fn same_role<'e, U, L, P>(eng: &'e Engine<U, L, P>, w: &Worker) -> Vec<&'e Worker> {
    eng.settings.workers.iter().filter(|o| o.role == w.role && o.unit != w.unit).collect()
}

/// The worker's figures before its drain, when the service gate will need them (it is the
/// only worker of its role) or a fleet bake may (with `[fleet]`: every worker's, since the
/// host that asks for the fleet rollout decides whether it bakes); `None` otherwise or when
/// they cannot be read.
pub(in crate::engine) async fn slo_before<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker) -> Option<ServiceScrape> {
    if eng.settings.verify.slo.is_none() || (eng.settings.fleet.is_none() && !same_role(eng, w).is_empty()) {
        return None;
    }
    tokio::time::timeout(eng.settings.rollout.metrics_timeout, eng.probes.service(&w.url)).await.ok()?.ok()
}

/// The service gate's baseline when it is alone in its role: its figures before the drain —
/// before this rollout first touched it. A worker restarted again in the same rollout (a
/// rollback onto its last good revision) is judged against those, not against the run that
/// just failed.
pub(in crate::engine) async fn before_drain<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, ctx: Ctx<'_>) -> Option<ServiceScrape> {
    let measured = slo_before(eng, w).await;
    let Some(keep) = ctx.writes.before else { return measured };
    let mut kept = lock(keep);
    match kept.get(&w.unit) {
        Some(first) => Some(first.clone()),
        None => {
            if let Some(b) = &measured {
                kept.insert(w.unit.clone(), b.clone());
            }
            measured
        }
    }
}

pub(in crate::engine) async fn mark<U, L, P: Probes>(eng: &Engine<U, L, P>, unit: &str, url: &str) -> Result<Mark, String> {
    let limit = eng.settings.rollout.metrics_timeout;
    let service = match tokio::time::timeout(limit, eng.probes.service(url)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("its /metrics did not answer within {}", humantime::format_duration(limit))),
    };
    let gateway = tokio::time::timeout(limit, eng.probes.gateway_outcomes(url)).await.ok().flatten();
    Ok(Mark { unit: unit.to_string(), url: url.to_string(), service, gateway })
}

/// In a fleet, the same role's workers of the other live hosts (`host/unit`, URL), from
/// their liveness keys: the canary host's soak is judged against the hosts that have not
/// changed yet. Nothing when the fleet cannot be read (the local peers still count).
async fn fleet_peers<U, L, P>(eng: &Engine<U, L, P>, w: &Worker) -> Vec<(String, String)> {
    let (Some(c), Some(f)) = (&eng.coordinator, &eng.settings.fleet) else {
        return Vec::new();
    };
    let Ok(hosts) = crate::fleet::hosts(c.as_ref(), &f.name).await else {
        return Vec::new();
    };
    hosts
        .iter()
        .filter(|h| h.host != f.host)
        .flat_map(|h| {
            h.workers.iter().filter(|x| x.role == w.role.as_str() && !x.url.is_empty()).map(move |x| (format!("{}/{}", h.host, x.unit), x.url.clone()))
        })
        .collect()
}

/// The window's first scrapes (the soak's start), all within `metrics_timeout`.
pub(in crate::engine) async fn slo_start<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker) -> SloStart {
    let limit = eng.settings.rollout.metrics_timeout;
    let all = async {
        let own = mark(eng, &w.unit, &w.url).await;
        let (mut peers, mut unread) = (Vec::new(), Vec::new());
        let local = same_role(eng, w).into_iter().map(|p| (p.unit.clone(), p.url.clone()));
        for (unit, url) in local.chain(fleet_peers(eng, w).await) {
            match mark(eng, &unit, &url).await {
                Ok(m) => peers.push(m),
                Err(why) => unread.push(format!("{unit}: {why}")),
            }
        }
        SloStart { own, peers, unread }
    };
    match tokio::time::timeout(limit, all).await {
        Ok(s) => s,
        Err(_) => {
            SloStart { own: Err(format!("the figures were not all read within {}", humantime::format_duration(limit))), peers: Vec::new(), unread: Vec::new() }
        }
    }
}

/// The restarted worker's window and its baseline's now (all within `metrics_timeout`).
async fn windows<U, L, P: Probes>(eng: &Engine<U, L, P>, own: &Mark, peers: &[Mark], before: Option<&ServiceScrape>) -> Result<(Window, Window), String> {
    let mine = window_since(eng, own).await?;
    let base = match before {
        Some(b) => Window { service: b.clone(), gateway: None },
        None => {
            let mut sum = Window::default();
            for p in peers {
                if let Ok(x) = window_since(eng, p).await {
                    sum.service = sum.service.plus(&x.service);
                    sum.gateway = match (sum.gateway, x.gateway) {
                        (Some(a), Some(b)) => Some((a.0 + b.0, a.1 + b.1)),
                        (a, b) => a.or(b),
                    };
                }
            }
            sum
        }
    };
    Ok((mine, base))
}

/// The window from `m` to now; `Err` when it cannot be read or the worker restarted.
pub(in crate::engine) async fn window_since<U, L, P: Probes>(eng: &Engine<U, L, P>, m: &Mark) -> Result<Window, String> {
    let now = mark(eng, &m.unit, &m.url).await?;
    let service = now.service.since(&m.service).ok_or_else(|| format!("{}'s counters went down: it restarted during the window", m.unit))?;
    let gateway = match (now.gateway, m.gateway) {
        (Some((ok, failed)), Some((ok0, failed0))) if ok >= ok0 && failed >= failed0 => Some((ok - ok0, failed - failed0)),
        (Some(g), None) => Some(g),
        _ => None,
    };
    Ok(Window { service, gateway })
}

/// Judge the window from `start` once the restarted worker (and its baseline) served
/// `min_requests`, or at `max_wait` with what there is. A breach is a failure naming the
/// figure; too little traffic is a report saying "not judged".
pub(in crate::engine) async fn slo_judge<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    slo: &Slo,
    start: SloStart,
    before: Option<ServiceScrape>,
) -> Result<Report, Fail> {
    let not_judged = |why: String, against: Baseline| Report {
        verdict: Verdict::NotJudged { why },
        baseline: against,
        requests: 0,
        baseline_requests: 0,
        figures: Vec::new(),
        errors_from: None,
        judged_by: None,
    };
    let own = match &start.own {
        Ok(m) => m.clone(),
        Err(why) => return Ok(not_judged(format!("its figures could not be read at the soak's start: {why}"), Baseline::OwnBeforeDrain)),
    };
    let against = if start.peers.is_empty() && start.unread.is_empty() {
        Baseline::OwnBeforeDrain
    } else {
        Baseline::Peers { units: start.peers.iter().map(|p| p.unit.clone()).collect() }
    };
    if against == Baseline::OwnBeforeDrain && before.is_none() {
        return Ok(not_judged("it is the only worker of its role and its figures from before its drain could not be read".into(), against));
    }
    if let Baseline::Peers { units } = &against {
        if units.is_empty() {
            return Ok(not_judged(format!("no peer's figures could be read ({})", start.unread.join("; ")), against));
        }
    }
    let deadline = Instant::now() + slo.max_wait;
    let limit = eng.settings.rollout.metrics_timeout;
    let own_before = before.as_ref().filter(|_| against == Baseline::OwnBeforeDrain);
    loop {
        let (mine, base) = match tokio::time::timeout(limit, windows(eng, &own, &start.peers, own_before)).await {
            Ok(Ok(x)) => x,
            Ok(Err(why)) => return Ok(not_judged(why, against)),
            Err(_) => return Ok(not_judged(format!("the figures were not all read within {}", humantime::format_duration(limit)), against)),
        };
        let report = judge(slo, &mine, &base, against.clone());
        let enough = mine.requests() >= slo.min_requests && base.requests() >= slo.min_requests;
        if enough || Instant::now() >= deadline {
            if let Verdict::Breach { figure } = &report.verdict {
                let cause = Cause::SloRegression {
                    unit: w.unit.clone(),
                    figure: figure.sentence(),
                    against: against.to_string(),
                    requests: report.requests,
                    baseline_requests: report.baseline_requests,
                };
                return Err(Fail { cause, detail: crate::engine::step_run::detail_of(&Judged { slo: &report }), unit: None, last_lines: Vec::new() });
            }
            return Ok(report);
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// Too little traffic to judge (`report` is not judged): `[verify.slo] unjudged` decides —
/// `pass` keeps the report, `fail` fails the soak (`slo_not_judged`), `probe` judges with
/// pdctl's own sample ([`Engine::slo_sample`]) and fails when it cannot send one.
pub(in crate::engine) async fn slo_when_unjudged<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, slo: &Slo, report: Report) -> Result<Report, Fail> {
    let Verdict::NotJudged { why } = &report.verdict else { return Ok(report) };
    let why = why.clone();
    let not_judged = |why: String| Fail::from(Cause::SloNotJudged { unit: w.unit.clone(), why });
    match slo.unjudged {
        Unjudged::Pass => Ok(Report { judged_by: Some("not_judged_passed"), ..report }),
        Unjudged::Fail => Err(not_judged(why)),
        Unjudged::Probe => {
            let sample = slo_sample(eng, w, slo).await.map_err(|e| not_judged(format!("{why}; pdctl's own sample could not be sent: {e}")))?;
            match &sample.verdict {
                Verdict::Breach { figure } => Err(Fail {
                    cause: Cause::SloRegression {
                        unit: w.unit.clone(),
                        figure: format!("{} (pdctl's own sample: {why})", figure.sentence()),
                        against: sample.baseline.to_string(),
                        requests: sample.requests,
                        baseline_requests: sample.baseline_requests,
                    },
                    detail: crate::engine::step_run::detail_of(&Judged { slo: &sample }),
                    unit: None,
                    last_lines: Vec::new(),
                }),
                Verdict::NotJudged { why: w2 } => Err(not_judged(format!("{why}; and pdctl's own sample: {w2}"))),
                Verdict::Pass => Ok(sample),
            }
        }
    }
}

/// pdctl's own sample for the service gate: `min_requests` (at most 50) PD request pairs of
/// 16 tokens, each sent straight to the restarted worker with a serving worker of the other
/// role, alternating with the same sent to a serving peer of its role with that same worker
/// — both sides under the same load at the same time. `Err`: no such sample can be sent.
pub(in crate::engine) async fn slo_sample<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker, slo: &Slo) -> Result<Report, String> {
    if w.role == Role::Regular {
        return Err("a regular worker: the sample is sent through a PD pair".into());
    }
    let mut peer = None;
    for p in same_role(eng, w) {
        if gates::pair::peer_serves(eng, p, false).await.is_ok() {
            peer = Some(p);
            break;
        }
    }
    let peer = peer.ok_or_else(|| format!("no other {} worker serves to compare with", w.role.as_str()))?;
    let mut partner = None;
    for p in gates::pair::peers(eng, w) {
        if gates::pair::peer_serves(eng, p, false).await.is_ok() {
            partner = Some(p);
            break;
        }
    }
    let partner = partner.ok_or_else(|| "no worker of the other role serves".to_string())?;
    let n = slo.min_requests.min(50);
    let (mut mine, mut base) = (Vec::new(), Vec::new());
    for _ in 0..n {
        mine.push(sample_one(eng, w, partner).await);
        base.push(sample_one(eng, peer, partner).await);
    }
    Ok(judge_sample(slo, &mine, &base, Baseline::Peers { units: vec![peer.unit.clone()] }))
}

/// One request of the sample: a 16-token PD pair of `x` and `partner` (the other role),
/// straight to both; its end-to-end seconds, `None` when it failed.
async fn sample_one<U, L, P: Probes>(eng: &Engine<U, L, P>, x: &Worker, partner: &Worker) -> Option<f64> {
    let probe = gates::pair::pair_request(eng, x, partner, 16).await;
    probe.answered().then_some(probe.took.as_secs_f64())
}

/// A soak failed by the service gate: its report.
#[derive(serde::Serialize)]
struct Judged<'a> {
    /// What was compared with what, and the verdict.
    slo: &'a Report,
}
