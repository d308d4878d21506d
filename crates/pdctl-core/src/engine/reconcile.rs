//! Drains and slots reconciled: a drain pdctl made is undone once the worker serves (after a
//! failed gate, or when pdctld starts, idles or stops with drains in its ledger), a coherent
//! switch's held drains kept out ([`held_out`]), and a worker's run taken as settled only once
//! it stayed up for `min_healthy`.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cause::Cause;
use crate::config::Worker;
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, within, Fail, StepRun, POLL};
use crate::events::{Sink, Step};
use crate::ports::{ActiveState, Health, Logs, Probes, SubState, UnitState, Units};
use crate::state::drain_ledger::{Drain, Hold, Ledger};

/// The reconcile's detail: the drain undone and the gateway's admission.
#[derive(Serialize)]
struct Reconciled<'a> {
    /// The worker still runs the run that was drained.
    same_run: bool,
    /// The rollout that drained it.
    drained_by: &'a str,
    /// When (seconds since the epoch).
    drained_at: u64,
    /// The router gate's detail.
    router: crate::engine::gates::router::RouterDetail,
    /// How long the reconcile took.
    waited_ms: u64,
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// Undo a drain pdctl made (step `reconcile`): the worker is re-admitted to the router only
    /// when it serves. Still on the run that was drained and healthy: re-registered at once (that
    /// process passed the gates). On a new run: only after `/health` and the router gate pass,
    /// waiting up to `budget` for it to come up while systemd is still starting it (a 0.3.2 router
    /// loses for good a worker registered while it is still starting). Anything else stays in
    /// the ledger and is reported. Returns a note for the record.
    pub async fn reconcile(&self, d: &Drain, ledger: &Ledger, budget: Duration, sink: &Sink) -> Result<String, Cause> {
        self.reconcile_as(d, ledger, budget, sink, false).await
    }

    /// Wait (up to `budget`, from `t0`) until the drained worker `w` answers `/health`; a unit
    /// that failed, crash-loops or stays stopped is not coming up.
    async fn serving_again(&self, d: &Drain, w: &Worker, t0: Instant, budget: Duration) -> Result<(), Fail> {
        let mut last;
        let mut stopped_since: Option<Instant> = None;
        loop {
            last = match within(t0, budget.max(Duration::from_secs(30)), self.probes.health(&w.url)).await {
                Some(Health::Up) => break,
                Some(Health::Unavailable(x)) | Some(Health::Down(x)) => x,
                None => "no answer".into(),
            };
            let st = self.units.state(&d.unit).await?;
            // A restart passes through deactivating and, briefly, inactive: only a failed unit,
            // or one that stays inactive, is not coming up.
            stopped_since = match st.active_state {
                ActiveState::Inactive => stopped_since.or(Some(Instant::now())),
                _ => None,
            };
            // A crash loop (`auto-restart`) is not coming up either: waiting for it would hold
            // the rollout lock for the whole budget.
            let gone = st.active_state == ActiveState::Failed
                || st.sub_state == SubState::AutoRestart
                || stopped_since.is_some_and(|t| t.elapsed() > Duration::from_secs(10));
            if gone || t0.elapsed() >= budget {
                return Err(Fail::from(Cause::DrainNotRestored {
                    unit: d.unit.clone(),
                    why: format!("{}/{}, /health: {last}", st.active_state, st.sub_state),
                }));
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// [`Engine::reconcile`]; `rollback_follows`: the failed unit's rollback comes next, so a
    /// worker that is not serving is said to wait for it (step `skipped`), not to have failed —
    /// its drain stays on record either way until a gate re-admits it.
    pub(in crate::engine) async fn reconcile_as(
        &self,
        d: &Drain,
        ledger: &Ledger,
        budget: Duration,
        sink: &Sink,
        rollback_follows: bool,
    ) -> Result<String, Cause> {
        let s = StepRun::start(sink, &d.unit, Step::Reconcile);
        if let Some(why) = held_out(d, &ledger.all().0) {
            s.skip(&why);
            return Ok(format!("{} stays out of the router: {why}", d.unit));
        }
        let t0 = Instant::now();
        let w = self.settings.workers.iter().find(|w| w.unit == d.unit).cloned().unwrap_or_else(|| Worker {
            unit: d.unit.clone(),
            role: d.role,
            url: d.url.clone(),
            bootstrap_port: d.bootstrap_port,
            gpus: None,
            watch_files: Vec::new(),
            api_key: None,
            admin_api_key: None,
        });
        let r = async {
            let st = self.units.state(&d.unit).await?;
            let same_run = !d.invocation_id.is_empty() && st.invocation_id == d.invocation_id;
            self.serving_again(d, &w, t0, budget).await?;
            // Not re-admitted as a role it does not run (cut short mid `pdctl role set`: its unit
            // says the new role, its server may still run the old one): it stays out, said.
            gates::health::runs_its_role(self, &w).await?;
            let admitted = gates::router::router(self, &w, true, false).await?;
            ledger.clear(&d.unit).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))?;
            Ok::<_, Fail>(detail_of(&Reconciled {
                same_run,
                drained_by: &d.rollout_id,
                drained_at: d.drained_at,
                router: admitted,
                waited_ms: t0.elapsed().as_millis() as u64,
            }))
        }
        .await;
        match r {
            Ok(detail) => {
                s.pass(detail);
                let slot = self.reconcile_slots(ledger, Some(&d.unit)).await.join("; ");
                Ok(format!(
                    "{} was drained by {} and is back in the router{}",
                    d.unit,
                    d.rollout_id,
                    if slot.is_empty() { String::new() } else { format!("; {slot}") }
                ))
            }
            Err(f) if rollback_follows && matches!(f.cause, Cause::DrainNotRestored { .. }) => {
                s.skip(&format!(
                    "{}; on_failure = \"rollback\": the rollback that follows puts its last good revision back and re-admits it through every gate",
                    f.cause.sentence()
                ));
                Err(f.cause)
            }
            Err(f) => {
                s.fail(&f);
                Err(f.cause)
            }
        }
    }

    /// Fleet slots this host still has on record (only `unit`'s when given): each whose worker
    /// has no open drain and serves (`/health` 200) is given back; one etcd no longer lists is
    /// crossed off. A worker still down keeps its slot (it really is down). Returns one sentence
    /// per slot given back.
    pub async fn reconcile_slots(&self, ledger: &Ledger, unit: Option<&str>) -> Vec<String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        // A host in maintenance keeps its slots until its resume passed every gate (its workers
        // serving again after the reboot is not enough); an unreadable record keeps them all.
        let maintenance = match ledger.maintenance() {
            Ok(m) => m.map(|m| crate::engine::host::maintenance_hold(&m.id)),
            Err(_) => return out,
        };
        for (name, recs) in ledger.slots() {
            if unit.is_some_and(|u| u.replace('/', "_") != name) || ledger.get(&name).is_some() {
                continue;
            }
            if recs.iter().any(|r| maintenance.as_deref() == Some(r.hold.rollout.as_str())) {
                continue;
            }
            let mut serving = true;
            for r in &recs {
                serving &= self.probes.health(&r.hold.url).await == Health::Up;
            }
            if !serving {
                continue;
            }
            let mut done = true;
            for r in &recs {
                match crate::fleet::release(c.as_ref(), &f.name, &r.role, &r.hold.holder, &r.hold.token).await {
                    Ok(true) => out.push(format!("gave back {}'s {} slot (held since {})", r.hold.holder, r.role, crate::fleet::clock(r.hold.since))),
                    Ok(false) => {}
                    Err(_) => done = false,
                }
            }
            if done {
                let _ = ledger.clear_slot(&name);
            }
        }
        out
    }

    /// `st` if the unit's run is settled: active and running, up for `min_healthy` (waiting
    /// out the rest, at most `min_healthy`) on the same run without an auto-restart; else `None`.
    pub(in crate::engine) async fn settled(&self, unit: &str, st: UnitState) -> Option<UnitState> {
        if st.active_state != ActiveState::Active || st.sub_state != SubState::Running {
            return None;
        }
        let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let up = Duration::from_micros(now_us.saturating_sub(st.exec_main_start_us));
        let need = self.settings.rollout.min_healthy;
        if up < need {
            tokio::time::sleep(need - up).await;
            let again = self.units.state(unit).await.ok()?;
            if again.invocation_id != st.invocation_id
                || again.n_restarts != st.n_restarts
                || again.main_pid != st.main_pid
                || again.active_state != ActiveState::Active
            {
                return None;
            }
            return Some(again);
        }
        Some(st)
    }
}

/// Why a drain a coherent switch made must stay out ([`Hold`]; `None`: it may be undone). Only
/// the verified new group comes back by itself, and only once the switch had begun (the old
/// group is out): anything else back in could pair two models behind the gateway.
pub(in crate::engine) fn held_out(d: &Drain, ledger: &[Drain]) -> Option<String> {
    let switched = ledger.iter().any(|o| o.rollout_id == d.rollout_id && o.hold == Some(Hold::Old));
    let next = "`pdctl rollout apply` restarts what still runs the old model";
    match d.hold? {
        Hold::Verified if switched => None,
        Hold::New | Hold::Verified => {
            Some(format!("it runs the new model while the old group serves (the coherent switch of {} stopped before the switch); {next}", d.rollout_id))
        }
        Hold::Old => {
            Some(format!("it still runs the old model and the new group serves (the coherent switch of {} stopped after the switch); {next}", d.rollout_id))
        }
    }
}

#[cfg(test)]
mod held_tests {
    use super::*;

    fn drain(unit: &str, hold: Option<Hold>) -> Drain {
        Drain {
            unit: unit.into(),
            url: format!("http://{unit}"),
            role: crate::config::Role::Prefill,
            bootstrap_port: None,
            invocation_id: "i".into(),
            router_id: "r".into(),
            rollout_id: "r1".into(),
            drained_at: 0,
            hold,
        }
    }

    #[test]
    fn only_a_verified_new_group_comes_back_and_only_after_the_old_one_went_out() {
        let plain = drain("a", None);
        assert_eq!(held_out(&plain, std::slice::from_ref(&plain)), None, "a plain drain is undone");
        let new = drain("p0", Some(Hold::Verified));
        let old = drain("p1", Some(Hold::Old));
        // Before the switch: the old group serves, the new one stays out.
        assert!(held_out(&new, std::slice::from_ref(&new)).is_some_and(|w| w.contains("before the switch")));
        assert!(held_out(&drain("p0", Some(Hold::New)), std::slice::from_ref(&old)).is_some(), "an unverified new worker never comes back by itself");
        // During the switch: the verified new group comes back, the old group stays out.
        assert_eq!(held_out(&new, &[new.clone(), old.clone()]), None);
        assert!(held_out(&old, &[new.clone(), old.clone()]).is_some_and(|w| w.contains("old model")));
        // Another rollout's old group does not count.
        let other = Drain { rollout_id: "r2".into(), ..old };
        assert!(held_out(&new, &[new.clone(), other]).is_some());
    }
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use crate::engine::gates::router::{Admitted, RouterDetail};
    use serde_json::json;

    #[test]
    fn the_reconcile_detail_has_the_keys_of_the_contract() {
        assert_eq!(
            detail_of(&Reconciled { same_run: true, drained_by: "r1", drained_at: 2, router: RouterDetail::One(Admitted::example()), waited_ms: 3 }),
            json!({"same_run": true, "drained_by": "r1", "drained_at": 2, "router": detail_of(&Admitted::example()), "waited_ms": 3})
        );
    }
}

/// The reconcile of a drain over fakes: a crash-looping worker is reported, not waited for.
#[cfg(test)]
mod over_fakes {
    use crate::fakes::*;

    #[tokio::test]
    async fn a_drain_of_a_crash_looping_worker_is_reported_not_waited_for() {
        use pdctl_core::state::drain_ledger::{Drain, Ledger};
        let w = world();
        w.lock().unwrap().unhealthy.push("http://p".into());
        if let Some(st) = w.lock().unwrap().states.get_mut("p.service") {
            st.active_state = "activating".into();
            st.sub_state = "auto-restart".into();
        }
        let dir = std::env::temp_dir().join(format!("pdctl-fake-ledger-{}", std::process::id()));
        let ledger = Ledger::open(&dir).unwrap();
        let d = Drain {
            unit: "p.service".into(),
            url: "http://p".into(),
            role: pdctl_core::config::Role::Prefill,
            bootstrap_port: None,
            invocation_id: "old".into(),
            router_id: "w1".into(),
            rollout_id: "r1".into(),
            drained_at: 0,
            hold: None,
        };
        ledger.record(&d).unwrap();
        let engine = Engine { units: FakeUnits(w.clone()), logs: FakeLogs(w.clone()), probes: FakeProbes(w.clone()), settings: settings(), coordinator: None };
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        // A budget of 5 minutes: a crash loop is not coming up, so it must not be waited out (the
        // rollout lock is held meanwhile). The bound only keeps a regression from hanging the suite.
        let r = tokio::time::timeout(Duration::from_secs(60), engine.reconcile(&d, &ledger, Duration::from_secs(300), &tx)).await.expect("not waited out");
        let cause = r.unwrap_err();
        assert_eq!(cause.code(), "drain_not_restored");
        assert!(cause.sentence().contains("auto-restart"), "{}", cause.sentence());
        assert!(ledger.get("p.service").is_some(), "the drain stays on record");
        let _ = std::fs::remove_dir_all(dir);
    }
}
