//! The health gate: `/health` (and `/ready` where served) answers 200 for the same run — or, for a
//! PD worker whose pair gate follows, `/ready` alone where it is served — and a PD worker runs the
//! role its configuration says.

use std::time::Instant;

use crate::cause::{Cause, Phase};
use crate::config::{Role, Worker};
use crate::engine::machine::Engine;
use crate::engine::step_run::{within, Fail, Verdict, POLL};
use crate::ports::{Health, Probes, UnitState, Units};
use crate::sglang::judge::crashed_since;

/// `pair_follows`: the pair gate runs next (a restart, a re-verification); `check` has none.
pub(in crate::engine) async fn health<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    after: Option<&UnitState>,
    pair_follows: bool,
) -> Result<Verdict<HealthDetail>, Fail> {
    let answered = answers(eng, w, after, pair_follows).await?;
    runs_its_role(eng, w).await?;
    Ok(answered)
}

/// A PD worker runs the role its configuration says. SGLang 0.5.23 switches a server started with
/// `--enable-pd-role-switch` at run time (`POST /pd_role_switch`); `/model_info`'s
/// `disaggregation_mode` follows the switch while `/server_info` keeps the startup role (read in
/// the wheel and measured on the real server). A role not reported (an older server, no answer)
/// is not judged here: the router and pair gates see a wrong role by its effects.
pub(in crate::engine) async fn runs_its_role<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker) -> Result<(), Fail> {
    if w.role == Role::Regular {
        return Ok(());
    }
    match eng.probes.running_role(&w.url).await {
        Ok(Some(runs)) if runs != w.role => {
            Err(Cause::RoleMismatch { unit: w.unit.clone(), url: w.url.clone(), runs: runs.as_str().into(), configured: w.role.as_str().into() }.into())
        }
        _ => Ok(()),
    }
}

/// `/health` (and `/ready`) answer 200, or `/ready` alone before a pair gate.
async fn answers<U: Units, L, P: Probes>(
    eng: &Engine<U, L, P>,
    w: &Worker,
    after: Option<&UnitState>,
    pair_follows: bool,
) -> Result<Verdict<HealthDetail>, Fail> {
    let t0 = Instant::now();
    let limit = eng.settings.rollout.health_timeout;
    let mut attempts = 0u32;
    // A PD worker's pair gate sends it a real PD request next, which proves generation: its
    // `/ready` (an instant answer) is enough here. SGLang 0.5.23's `/health` runs a generate
    // and sleeps 1 s before it looks (`entrypoints/http_server.py:722-800`): a second of
    // every PD restart's outage, measured. A server without `/ready` is asked `/health`.
    let mut ready_served = pair_follows && w.role != Role::Regular && eng.settings.verify.pair;
    loop {
        attempts += 1;
        if ready_served {
            let last = match within(t0, limit, eng.probes.ready(&w.url)).await {
                Some(Some(Health::Up)) => return Ok(Verdict::passed(HealthDetail::of(attempts, &["/ready"], Some("the pair gate's PD request")))),
                Some(None) => {
                    ready_served = false;
                    continue;
                }
                Some(Some(Health::Unavailable(s) | Health::Down(s))) => format!("/ready: {s}"),
                None => "/ready did not answer".into(),
            };
            health_wait(eng, w, after, t0, &last).await?;
            continue;
        }
        let last = match within(t0, limit, eng.probes.health(&w.url)).await {
            // Where the server serves `/ready` (0.5.23), it must say ready too: `/health` can
            // answer 200 again after a failed PD warm-up, and a paused server is not serving.
            Some(Health::Up) => match within(t0, limit, eng.probes.ready(&w.url)).await {
                Some(None) => return Ok(Verdict::passed(HealthDetail::of(attempts, &["/health"], None))),
                Some(Some(Health::Up)) => return Ok(Verdict::passed(HealthDetail::of(attempts, &["/health", "/ready"], None))),
                Some(Some(Health::Unavailable(s) | Health::Down(s))) => format!("/health 200, but {s}"),
                None => "/health 200, /ready did not answer".into(),
            },
            Some(Health::Unavailable(s)) => format!("{s} (warming up or unhealthy)"),
            Some(Health::Down(s)) => s,
            None => "no answer".into(),
        };
        health_wait(eng, w, after, t0, &last).await?;
    }
}

/// Between two attempts: `Err` when the unit crashed since `after` or the gate's time is
/// up (`last`: what the last attempt saw), else a pause.
async fn health_wait<U: Units, L, P>(eng: &Engine<U, L, P>, w: &Worker, after: Option<&UnitState>, t0: Instant, last: &str) -> Result<(), Fail> {
    if let Some(after) = after {
        let st = eng.units.state(&w.unit).await?;
        if let Some(why) = crashed_since(&st, after) {
            return Err(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Health, why }.into());
        }
    }
    let limit = eng.settings.rollout.health_timeout;
    if t0.elapsed() >= limit {
        return Err(Cause::HealthTimeout { url: w.url.clone(), after: limit, last: last.to_string() }.into());
    }
    tokio::time::sleep(POLL).await;
    Ok(())
}

/// The health step's detail (the JSON in docs/cli.md): how many looks, which endpoints answered,
/// and what proves `/generate` when `/ready` alone was asked.
#[derive(Debug, serde::Serialize)]
pub(in crate::engine) struct HealthDetail {
    /// Looks until it answered.
    attempts: u32,
    /// The endpoints that answered 200.
    checked: Vec<&'static str>,
    /// What proves that it serves `/generate` (the pair gate that follows).
    #[serde(skip_serializing_if = "Option::is_none")]
    generate_proved_by: Option<&'static str>,
}

impl HealthDetail {
    /// As the step's detail.
    fn of(attempts: u32, checked: &[&'static str], generate_proved_by: Option<&'static str>) -> HealthDetail {
        HealthDetail { attempts, checked: checked.to_vec(), generate_proved_by }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::step_run::detail_of;
    use serde_json::json;

    /// The gate on its own, over an engine of fakes: a worker that never answers fails with
    /// `health_timeout` naming what it last said; one that answers passes at once. Its bounds
    /// say what it reaches: systemd and HTTP, no journal — the engine here has none (`()`).
    #[tokio::test]
    async fn the_health_gate_waits_for_an_answer_and_names_the_last_one() {
        use crate::fakes::{world, FakeProbes, FakeUnits};
        let w = world();
        let s = crate::fakes::with("");
        let worker = s.workers[0].clone();
        let eng = Engine { units: FakeUnits(w.clone()), logs: (), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        let passed = health(&eng, &worker, None, false).await.expect("a serving worker passes");
        assert_eq!(passed.json()["checked"], json!(["/health"]));
        w.lock().expect("world").unhealthy.push(worker.url.clone());
        let failed = health(&eng, &worker, None, false).await.expect_err("a worker that never answers fails");
        assert_eq!(failed.cause.code(), "health_timeout", "{:?}", failed.cause);
    }

    /// A PD worker switched to the other role at run time fails the gate, naming both roles; one
    /// whose role is not reported passes.
    #[tokio::test]
    async fn a_worker_running_the_other_role_fails_the_health_gate() {
        use crate::fakes::{world, FakeProbes, FakeUnits};
        let w = world();
        let s = crate::fakes::with("");
        let worker = s.workers.iter().find(|x| x.role == Role::Prefill).expect("a prefill").clone();
        let eng = Engine { units: FakeUnits(w.clone()), logs: (), probes: FakeProbes(w.clone()), settings: s, coordinator: None };
        health(&eng, &worker, None, false).await.expect("not reported: passes");
        w.lock().expect("world").roles.insert(worker.url.clone(), Role::Prefill);
        health(&eng, &worker, None, false).await.expect("its own role: passes");
        w.lock().expect("world").roles.insert(worker.url.clone(), Role::Decode);
        let failed = health(&eng, &worker, None, false).await.expect_err("the other role fails");
        assert_eq!(failed.cause.code(), "role_mismatch");
        assert!(failed.cause.sentence().contains("runs as decode"), "{}", failed.cause.sentence());
    }

    #[test]
    fn the_health_detail_has_the_keys_of_the_contract() {
        assert_eq!(detail_of(&HealthDetail::of(2, &["/health", "/ready"], None)), json!({"attempts": 2, "checked": ["/health", "/ready"]}));
        assert_eq!(detail_of(&HealthDetail::of(1, &["/ready"], Some("x"))), json!({"attempts": 1, "checked": ["/ready"], "generate_proved_by": "x"}));
    }
}

/// The health gate inside a rollout over fakes: what it asks of a PD worker and of its peer.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

    /// Where the servers serve `/ready` (0.5.23), a PD worker's health gate and its pair gate's
    /// check of the peer ask `/ready` alone: 0.5.23's `/health` sleeps 1 s in its generate, and the
    /// pair gate's PD request proves generation. Without `/ready` both ask `/health`, as before.
    #[tokio::test]
    async fn pd_health_and_the_pair_peer_check_ask_ready_where_it_is_served() {
        let w = world();
        w.lock().unwrap().ready_served = true;
        let (summary, events) = run_only(&w, settings(), &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let health = event(&events, "p.service", Step::Health, Status::Passed);
        assert_eq!(health.detail["checked"], serde_json::json!(["/ready"]), "{}", health.detail);
        assert!(w.lock().unwrap().pairs.iter().any(|(p, d)| p == "http://p" && d == "http://d"), "the pair was probed");
        assert_eq!(w.lock().unwrap().health_asked, Vec::<String>::new(), "no /health: neither the worker's nor its peer's");

        let w = world();
        let (summary, _) = run_only(&w, settings(), &["p.service".into()]).await;
        assert_eq!(summary.result, Outcome::Succeeded, "{summary:?}");
        let asked = w.lock().unwrap().health_asked.clone();
        assert!(asked.iter().any(|u| u == "http://p") && asked.iter().any(|u| u == "http://d"), "without /ready: /health of both: {asked:?}");
    }
}
