//! The router gate: the worker registered with the right type (re-added when the gateway dropped it
//! or lists it failed), healthy, its breaker not open, and a request through the gateway answers.

use std::time::{Duration, Instant};

use crate::cause::{Cause, RouterSeen};
use crate::config::{Role, Worker};
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, within, Fail, POLL};
use crate::ports::{Probes, RouterWorker, Units};
use crate::state::drain_ledger::Ledger;

/// How long a worker pdctl has seen serve may stay `not_ready` in the gateway (smg 1.x) before
/// pdctl removes and re-adds it: a few of the gateway's health-check rounds.
const STUCK_NOT_READY: Duration = Duration::from_secs(10);

/// The router gate on every replica (each must admit the worker); one replica's detail as
/// is, several under `replicas`.
pub(in crate::engine) async fn router<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    may_register: bool,
    peers_drained: bool,
) -> Result<RouterDetail, Fail> {
    router_recorded(eng, w, may_register, peers_drained, None).await
}

/// [`Engine::router`], writing to `ledger` (with the rollout's id) before it removes an entry
/// the gateway lists `failed`, so that a crash before the re-add is reconciled like a drain.
pub(in crate::engine) async fn router_recorded<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    may_register: bool,
    peers_drained: bool,
    ledger: Option<(&Ledger, &str)>,
) -> Result<RouterDetail, Fail> {
    let t0 = Instant::now();
    let n = eng.probes.replicas();
    let mut details = Vec::new();
    for r in 0..n {
        details.push(router_on(eng, r, w, may_register, peers_drained, t0, ledger).await?);
    }
    Ok(match <[Admitted; 1]>::try_from(details) {
        Ok([one]) => RouterDetail::One(one),
        Err(replicas) => RouterDetail::OnReplicas { replicas, waited_ms: t0.elapsed().as_millis() as u64 },
    })
}

/// The router gate on one replica: wait (bounded) until the gateway lists the worker with
/// its role, healthy, its breaker not open, and a request through the gateway answers.
pub(in crate::engine) async fn router_on<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    replica: usize,
    w: &Worker,
    may_register: bool,
    peers_drained: bool,
    t0: Instant,
    ledger: Option<(&Ledger, &str)>,
) -> Result<Admitted, Fail> {
    let limit = eng.settings.rollout.router_timeout;
    let role = w.role.as_str();
    let mut a = Admission { t0, peers_drained, registered: None, re_added: None, peer_down: false };
    let mut seen;
    loop {
        match within(t0, limit, eng.probes.router_workers(replica)).await {
            None => seen = RouterSeen::Down(format!("router /workers did not answer within {limit:?}")),
            Some(Err(e)) => seen = RouterSeen::Down(e.to_string()),
            Some(Ok(list)) => match list.iter().filter(|x| crate::config::same_url(&x.url, &w.url)).min_by_key(|x| x.draining()) {
                None if may_register && a.registered.is_none() => {
                    let bp = if w.role == Role::Prefill { w.bootstrap_port } else { None };
                    match eng.probes.register(replica, &w.url, role, bp).await {
                        Ok(id) => a.registered = Some(id),
                        Err(e) => return Err(Cause::RegisterRefused { url: w.url.clone(), error: e.to_string() }.into()),
                    }
                    seen = RouterSeen::RegistrationPending;
                }
                None => seen = if a.registered.is_some() { RouterSeen::RegistrationPending } else { RouterSeen::NotListed },
                Some(x) if x.draining() => seen = RouterSeen::Unhealthy("listed as draining: the gateway is still removing an old entry".into()),
                Some(x) if x.worker_type != role => {
                    return Err(Cause::WrongWorkerType { url: w.url.clone(), listed: x.worker_type.clone(), role: role.to_string() }.into())
                }
                Some(x) if !x.admitted() => {
                    let status = x.status.as_deref().unwrap_or("-").to_string();
                    // smg 1.x gives up on a worker it lists `failed`; `not_ready` flips back once
                    // its health checks pass, so only one stuck past STUCK_NOT_READY (after the
                    // health gate saw the worker serve) is re-added too. Once.
                    let stuck = x.given_up() || (x.not_ready() && t0.elapsed() >= STUCK_NOT_READY);
                    if may_register && a.re_added.is_none() && stuck {
                        remove_stuck_entry(eng, replica, w, x, &status, ledger).await?;
                        a.re_added = Some(status.clone());
                        a.registered = None;
                    }
                    seen = RouterSeen::Unhealthy(format!("is_healthy: {}, status: {status}", x.is_healthy))
                }
                Some(x) => match serves_through_gateway(eng, replica, w, x, &list, &mut a).await? {
                    Through::Admitted(detail) => return Ok(detail),
                    Through::NotYet(s) => seen = s,
                },
            },
        }
        if t0.elapsed() >= limit || (!may_register && t0.elapsed() >= Duration::from_secs(5)) {
            return Err(never_admitted(w, seen, a.peer_down, t0.elapsed()).into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Remove an entry the gateway lists `failed` (or stuck `not_ready`) so that the next round
/// re-adds it; written to the ledger first, as a drain is, so that a crash before the re-add
/// is reconciled.
async fn remove_stuck_entry<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    replica: usize,
    w: &Worker,
    x: &RouterWorker,
    status: &str,
    ledger: Option<(&Ledger, &str)>,
) -> Result<(), Fail> {
    tracing::warn!(pdctl_unit = %w.unit, "the gateway lists {} as {status}: removing and re-adding it", w.url);
    if let Some((l, id)) = ledger.filter(|(l, _)| l.get(&w.unit).is_none()) {
        gates::drain::record_drain(eng, l, w, &x.id, id, None).await?;
    }
    eng.probes
        .deregister(replica, &x.id)
        .await
        .map_err(|e| Fail::from(Cause::RegisterRefused { url: w.url.clone(), error: format!("removing the {status} entry failed: {e}") }))
}

/// The worker is listed and healthy: its breaker is not open and one request through the
/// gateway answers. `Err`: it never can be while this gate waits (no worker of the other PD
/// role is even listed).
async fn serves_through_gateway<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    replica: usize,
    w: &Worker,
    x: &RouterWorker,
    list: &[RouterWorker],
    a: &mut Admission,
) -> Result<Through, Fail> {
    let (role, t0, peers_drained) = (w.role.as_str(), a.t0, a.peers_drained);
    let cb = eng.probes.cb_state(replica, &w.url).await;
    if let Ok(Some(1.0)) = cb {
        return Ok(Through::NotYet(RouterSeen::BreakerOpen));
    }
    let other_admitted = list.iter().any(|o| o.admitted() && o.worker_type != role && o.worker_type != "regular");
    let smoke = if !eng.settings.verify.smoke_request || (peers_drained && !other_admitted) { None } else { Some(eng.probes.smoke(replica, 1).await) };
    let Some(Err(e)) = smoke else {
        let admitted = Admitted {
            router_id: x.id.clone(),
            worker_type: x.worker_type.clone(),
            re_registered: a.registered.is_some(),
            re_added_after: a.re_added.clone(),
            cb_state: cb.ok().flatten(),
            smoke_request: smoke.map(|_| "200").or((peers_drained && !other_admitted)
                .then_some("not sent: every worker of the other role is drained by this rollout (the pair gate proved the pair)")),
            waited_ms: t0.elapsed().as_millis() as u64,
        };
        return Ok(Through::Admitted(admitted));
    };
    a.peer_down = w.role != Role::Regular && !other_admitted;
    // No worker of the other role is even listed: none can be admitted while this gate waits,
    // so it ends now (the worker itself is admitted) instead of at router_timeout.
    let other_role = other_role(w.role);
    let other_listed = list.iter().any(|o| o.worker_type == other_role && !o.draining());
    if a.peer_down && !other_listed {
        let cause = Cause::PeerRoleDown { url: w.url.clone(), role: other_role.into(), error: e.to_string() };
        let detail = detail_of(&EndedEarly {
            router_id: &x.id,
            re_registered: a.registered.is_some(),
            re_added_after: a.re_added.as_deref(),
            ended_early: format!("the gateway lists no {other_role} worker: none can be admitted while this gate waits"),
            waited_ms: t0.elapsed().as_millis() as u64,
        });
        return Err(Fail { cause, detail, unit: None, last_lines: Vec::new() });
    }
    Ok(Through::NotYet(RouterSeen::SmokeFailed(e.to_string())))
}

/// The router step's detail: one replica's [`Admitted`] as is; on a gateway of several
/// replicas, each one's.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub(in crate::engine) enum RouterDetail {
    /// The gateway has one replica.
    One(Admitted),
    /// Several replicas.
    OnReplicas {
        /// Each replica's detail, in config order.
        replicas: Vec<Admitted>,
        /// How long the step took.
        waited_ms: u64,
    },
}

/// The router step's detail when no worker of the other role is listed: it ends at once.
#[derive(serde::Serialize)]
struct EndedEarly<'a> {
    /// The gateway's id of the worker.
    router_id: &'a str,
    /// pdctl registered it again.
    re_registered: bool,
    /// The status it was listed with when pdctl re-added it.
    re_added_after: Option<&'a str>,
    /// Why it ended before router_timeout.
    ended_early: String,
    /// How long the step took.
    waited_ms: u64,
}

/// The router step's detail on one replica (the JSON in docs/cli.md): the gateway's entry, what
/// pdctl did to it, its breaker and the request that went through.
#[derive(serde::Serialize)]
pub(in crate::engine) struct Admitted {
    /// The gateway's id of the worker.
    router_id: String,
    /// The type the gateway lists it with.
    worker_type: String,
    /// pdctl registered it again (the gateway had lost it).
    re_registered: bool,
    /// The status it was listed with when pdctl removed and re-added it (`null`: not done).
    re_added_after: Option<String>,
    /// Its circuit breaker's state gauge (`null`: not exported).
    cb_state: Option<f64>,
    /// The request through the gateway: `"200"`, or why none was sent (`null`: off).
    smoke_request: Option<&'static str>,
    /// How long the gate waited.
    waited_ms: u64,
}

/// One look at a listed, healthy worker through the gateway.
enum Through {
    /// Admitted: the router step's detail on this replica.
    Admitted(Admitted),
    /// Not yet, and what was seen.
    NotYet(RouterSeen),
}

/// What one router gate has done so far.
struct Admission {
    /// When the gate began.
    t0: Instant,
    /// Every worker of the other role is drained by this rollout: no smoke request is sent.
    peers_drained: bool,
    /// pdctl registered the worker (the gateway's id for it).
    registered: Option<String>,
    /// The gateway listed the worker `failed` (or stuck `not_ready`) and pdctl removed and
    /// re-added it (once): that status.
    re_added: Option<String>,
    /// The smoke request failed while no worker of the other PD role was admitted.
    peer_down: bool,
}

/// The other PD role's name (`""` for a regular worker).
fn other_role(role: Role) -> &'static str {
    match role {
        Role::Prefill => "decode",
        Role::Decode => "prefill",
        Role::Regular => "",
    }
}

/// The cause of a worker the gateway did not admit in time, from what was seen last.
fn never_admitted(w: &Worker, seen: RouterSeen, peer_down: bool, after: Duration) -> Cause {
    let url = w.url.clone();
    match seen {
        RouterSeen::BreakerOpen => Cause::CircuitOpen { url, after },
        RouterSeen::SmokeFailed(error) if peer_down => Cause::PeerRoleDown { url, role: other_role(w.role).into(), error },
        RouterSeen::SmokeFailed(error) => Cause::SmokeFailed { url, after, error },
        other => Cause::RouterNeverAdmits { url, after, last: other.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_router_detail_has_the_keys_of_the_contract() {
        let want = json!({"router_id": "i", "worker_type": "decode", "re_registered": false, "re_added_after": null, "cb_state": 0.0, "smoke_request": "200", "waited_ms": 3});
        assert_eq!(serde_json::to_value(Admitted::example()).unwrap_or_default(), want);
        // One replica's detail as is; several under `replicas`.
        assert_eq!(serde_json::to_value(RouterDetail::One(Admitted::example())).unwrap_or_default(), want);
        let both = RouterDetail::OnReplicas { replicas: vec![Admitted::example(), Admitted::example()], waited_ms: 5 };
        assert_eq!(serde_json::to_value(both).unwrap_or_default(), json!({"replicas": [want.clone(), want], "waited_ms": 5}));
    }
}

#[cfg(test)]
impl Admitted {
    /// A decode admitted after 3 ms, its breaker closed, the request through the gateway answered.
    pub(in crate::engine) fn example() -> Admitted {
        Admitted {
            router_id: "i".into(),
            worker_type: "decode".into(),
            re_registered: false,
            re_added_after: None,
            cb_state: Some(0.0),
            smoke_request: Some("200"),
            waited_ms: 3,
        }
    }
}

/// The router gate inside a rollout over fakes of the gateway: a failed entry removed and added
/// again; a prefill re-admitted while no decode is listed ends at once; a worker that died after
/// its gates fails as the crash it is.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

    #[tokio::test]
    async fn a_worker_whose_server_dies_before_the_gateway_admits_it_fails_as_a_crash() {
        let w = world();
        let mut s = with_router(&w, true);
        s.rollout.router_timeout = std::time::Duration::from_secs(1);
        {
            let mut g = w.lock().unwrap();
            let r = g.router.as_mut().unwrap();
            r.statuses = vec!["failed".into(), "failed".into()];
            r.crash_on_register = Some(("http://p".into(), "p.service".into()));
        }
        let (summary, _) = run_only(&w, s, &["p.service".into()]).await;
        let f = summary.failed.expect("failed");
        assert_eq!((f.unit.as_str(), f.step, f.cause_code.as_str()), ("p.service", Step::Router, "crashed"), "{}", f.cause);
        assert!(f.cause.contains("before the gateway admitted it") && f.cause.contains("the unit failed"), "{}", f.cause);
    }

    #[tokio::test]
    async fn a_worker_the_gateway_lists_failed_is_removed_and_re_added() {
        let w = world();
        let s = with_router(&w, true);
        // The prefill's re-registration comes up `failed` (smg gives up on it); the next one is fine.
        w.lock().unwrap().router.as_mut().unwrap().statuses = vec!["failed".into()];
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let router = event(&events, "p.service", Step::Router, Status::Passed);
        assert_eq!(router.detail["re_added_after"], "failed", "{}", router.detail);
        let log = w.lock().unwrap().router.as_ref().unwrap().log.clone();
        assert_eq!(log.iter().filter(|l| l.starts_with("register http://p")).count(), 2, "registered, removed, registered again: {log:?}");
        assert!(log.iter().any(|l| l.starts_with("deregister w3")), "the failed entry was removed: {log:?}");
    }

    #[tokio::test]
    async fn re_admitting_a_prefill_while_the_gateway_lists_no_decode_ends_at_once() {
        let w = world();
        let s = with_router(&w, false);
        w.lock().unwrap().router.as_mut().unwrap().smoke_fails = true;
        let (summary, events) = run_only(&w, s, &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Failed, "{summary:?}");
        let f = summary.failed.as_ref().expect("a failure");
        assert_eq!((f.step, f.cause_code.as_str()), (Step::Router, "peer_role_down"), "{f:?}");
        let failed = event(&events, "p.service", Step::Router, Status::Failed);
        assert!(failed.detail["ended_early"].as_str().unwrap_or("").contains("lists no decode worker"), "{}", failed.detail);
        assert!(
            w.lock().unwrap().router.as_ref().unwrap().workers.iter().any(|x| x.url == "http://p" && x.status.as_deref() == Some("ready")),
            "the prefill is left admitted"
        );
    }
}
