//! A stale pair's repair: a decode that keeps a restarted prefill's old bootstrap info is restarted
//! through every gate (on this host, or through the fleet on its own host).

use std::time::{Duration, Instant};

use serde::Serialize;

/// The prefill's pair step while another host's pdctld repairs its decode: the fleet request.
#[derive(Serialize)]
struct FleetRepair<'a> {
    /// The fleet request asking for the repair.
    repair_through_fleet: &'a str,
    /// The decode's host.
    host: &'a str,
    /// The decode.
    unit: &'a str,
}

/// The pair step once another host's pdctld repaired the decode, and the probes that prove it.
#[derive(Serialize)]
struct FleetRepaired<'a> {
    /// The fleet request.
    repaired_through_fleet: &'a str,
    /// The decode's host.
    host: &'a str,
    /// The decode.
    unit: &'a str,
    /// That host's own rollout of the repair.
    local_id: Option<&'a str>,
    /// The pair probes after it.
    probes: &'a [crate::sglang::pairing::PairProbe],
}

/// A pair still stale after its repair: the probes.
#[derive(Serialize)]
struct Probed<'a> {
    /// The pair probes.
    probes: &'a [crate::sglang::pairing::PairProbe],
}

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::Ctx;
use crate::engine::gates;
use crate::engine::machine::Engine;
use crate::engine::runbook::{self, Sequence, WorkerRun};
use crate::engine::step_run::{detail_of, Fail, StepRun};
use crate::events::{Event, Sink, Status, Step};
use crate::ports::{Logs, Probes, Units};

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// Restart decode `d` through every gate to repair its stale pairing with prefill `p`, under
    /// the same rules as any restart; its events carry `repair_of`. Refused (the rollout halts)
    /// when its own files have pending changes or it is the only decode without
    /// `--allow-outage`.
    pub(in crate::engine) async fn repair(&self, d: &Worker, p: &Worker, sink: &Sink, ctx: Ctx<'_>) -> Result<(), (Step, Fail)> {
        let blocked = |why: String| -> (Step, Fail) {
            runbook::failed_before(sink, &p.unit, Step::Pair, Fail::from(Cause::RepairBlocked { decode: d.unit.clone(), prefill: p.unit.clone(), why }))
        };
        if let Some(dir) = ctx.writes.revisions {
            if let Ok(all) = self.staleness(dir).await {
                if let Some(st) = all.iter().find(|s| s.unit == d.unit && !s.reasons.is_empty()) {
                    return Err(blocked(format!(
                        "its own config has changes that were never verified ({}): restarting it as a repair would roll them out unchecked; roll it out with `pdctl rollout apply` (or revert them), then the pairing is renewed",
                        st.reasons.join("; ")
                    )));
                }
            }
        }
        let alone = self.settings.workers.iter().filter(|o| o.role == Role::Decode).count() == 1;
        if alone && !ctx.outage.accepted() {
            return Err(blocked(
                "it is the only decode worker: restarting it stops serving; pass --allow-outage (or set [rollout] allow_outage = true) to accept that".into(),
            ));
        }
        tracing::warn!(pdctl_unit = %d.unit, "{}: restarting it to repair its stale pairing with {}", d.unit, p.unit);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let forward = async {
            while let Some(mut e) = rx.recv().await {
                e.repair_of = Some(p.unit.clone());
                let _ = sink.send(e);
            }
        };
        let work = async move {
            let ctx = Ctx { scope: crate::engine::context::Scope { together_with: None, ..ctx.scope }, abort_in_flight: true, ..ctx };
            // A decode's own pair gate finds no stale decodes: nothing is repaired from a repair.
            // On the heap: a sequence inside a sequence (this repair runs inside the prefill's pair
            // step) overflowed a debug build's worker stack.
            let r = Box::pin(runbook::run_sequence(self, &WorkerRun::new(d, Sequence::Repair, &tx, ctx))).await;
            drop(tx);
            r
        };
        let (r, ()) = tokio::join!(work, forward);
        r.map(|_| ()).map_err(|(step, mut f)| {
            f.unit.get_or_insert_with(|| d.unit.clone());
            (step, f)
        })
    }

    /// Repair another host's decode through the fleet: a fleet request for that unit on that host
    /// (its pdctld restarts it through every gate, taking its slot), waited for, then the pair
    /// probed again.
    pub(in crate::engine) async fn fleet_repair(&self, d: &Worker, host: &str, unit: &str, p: &Worker, sink: &Sink, ctx: Ctx<'_>) -> Result<(), (Step, Fail)> {
        use crate::ports::{CasChange, Write};
        let blocked = |why: String| -> (Step, Fail) {
            runbook::failed_before(sink, &p.unit, Step::Pair, Fail::from(Cause::RepairBlocked { decode: d.unit.clone(), prefill: p.unit.clone(), why }))
        };
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return Err(blocked("it is on another host and this host has no [fleet] to ask it".into()));
        };
        let id = format!("f{}-repair-{}", crate::fleet::now_secs(), &crate::fleet::token()[..6]);
        let r = crate::fleet::FleetRollout {
            id: id.clone(),
            hosts: vec![host.to_string()],
            allow_outage: ctx.outage.accepted(),
            by: format!("pdctld on {} (rollout {})", f.host, ctx.writes.id),
            reason: Some(format!("repair of {unit}'s stale pairing with {}/{}", f.host, p.unit)),
            canary: None,
            created_at: crate::fleet::now_secs(),
            units: vec![unit.to_string()],
            repair_of: Some(format!("{}/{}", f.host, p.unit)),
            load_changes: false,
            bake_secs: None,
            weights: None,
        };
        let value = serde_json::to_vec(&r).unwrap_or_default();
        let s = StepRun::start(sink, &p.unit, Step::Pair);
        s.emit(Status::Started, detail_of(&FleetRepair { repair_through_fleet: &id, host, unit }));
        match c.cas(vec![CasChange { key: crate::fleet::rollout_key(&f.name, &id), expect: 0, write: Write::Put(value) }]).await {
            Ok(true) => {}
            Ok(false) => return Err(blocked(format!("the fleet request {id} exists already"))),
            Err(e) => return Err((Step::Pair, Fail::from(Cause::FleetLost { message: e.to_string() }))),
        }
        let ro = &self.settings.rollout;
        let limit = f.slot_timeout + ro.ready_timeout + ro.health_timeout + ro.router_timeout + ro.metrics_timeout + ro.min_healthy;
        let key = crate::fleet::host_summary_key(&f.name, &id, host);
        let t0 = Instant::now();
        let summary = loop {
            if let Ok(Some(e)) = c.get(&key).await {
                if let Ok(hs) = serde_json::from_slice::<crate::fleet::HostSummary>(&e.value) {
                    break hs;
                }
            }
            if t0.elapsed() >= limit {
                return Err(blocked(format!("{host} did not report its repair {id} within {}", humantime::format_duration(limit))));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        if summary.result != crate::fleet::HostResult::Succeeded {
            let why = summary
                .why
                .or_else(|| summary.summary.and_then(|x| x.failed).map(|x| format!("{} failed at {}: {}", x.unit, x.step.as_str(), x.cause)))
                .unwrap_or_default();
            return Err(blocked(format!("{host}'s pdctld did not repair it ({:?}): {why}", summary.result)));
        }
        let (verdict, _, probes) = gates::pair::probe_pair(self, p, d).await;
        if verdict != crate::sglang::pairing::Verdict::Paired {
            let f = Fail {
                cause: Cause::StalePair { decode: d.unit.clone(), prefill: p.unit.clone() },
                detail: detail_of(&Probed { probes: &probes }),
                unit: None,
                last_lines: Vec::new(),
            };
            s.fail(&f);
            return Err((Step::Pair, f));
        }
        s.pass(detail_of(&FleetRepaired { repaired_through_fleet: &id, host, unit, local_id: summary.local_id.as_deref(), probes: &probes }));
        Ok(())
    }
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_fleet_repair_details_have_the_keys_of_the_contract() {
        assert_eq!(
            detail_of(&FleetRepair { repair_through_fleet: "f1", host: "b", unit: "d" }),
            json!({"repair_through_fleet": "f1", "host": "b", "unit": "d"})
        );
        assert_eq!(
            detail_of(&FleetRepaired { repaired_through_fleet: "f1", host: "b", unit: "d", local_id: None, probes: &[] }),
            json!({"repaired_through_fleet": "f1", "host": "b", "unit": "d", "local_id": null, "probes": []})
        );
        assert_eq!(detail_of(&Probed { probes: &[] }), json!({"probes": []}));
    }
}
