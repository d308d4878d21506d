//! The coherent switch: a restart that changes the model PD workers compute with (a tokenizer, a
//! quantization, a dtype — what cannot be loaded in place) on a host with at least two workers of
//! each role. A plain rolling restart would pair a new prefill with an old decode behind the
//! gateway (smg 1.13 picks the prefill and the decode independently; its `pd_pairing` label is the
//! KV transfer protocol only and its model labels are not used in selection — measured). So:
//!
//! 1. **new group out**: half of each role (the new group) is drained — written down as held
//!    ([`Hold::New`]) — restarted onto the new model and verified *inside the group* (its pair
//!    probes go straight to the group's own workers), while the old group serves;
//! 2. **switch**: the old group is taken out of the gateway ([`Hold::Old`], written first) and the
//!    new group admitted, all at once; until the gateway admits the new group no PD pair is
//!    routable — that window is measured (to the first request through the gateway that answers)
//!    and reported;
//! 3. **old group in**: each worker of the old group, decodes first (a prefill restarted later
//!    finds the decodes that cached its old process and repairs them while the others serve),
//!    through every gate, paired only with workers of the new model, and re-admitted.
//!
//! A crash leaves no pair of two models routable: held drains are not undone as plain ones
//! ([`crate::engine::machine::Engine::reconcile`]).

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::{Ctx, Tally, Underway};
use crate::engine::gates;
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::runbook::{self, Sequence, WorkerRun};
use crate::engine::step_run::{Fail, StepRun, Verdict};
use crate::engine::work::Groups;
use crate::events::{Outcome, Sink, Step, Summary};
use crate::plan::Plan;
use crate::ports::{Logs, Probes, Units};
use crate::state::drain_ledger::Hold;

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// The plan's groups for a coherent switch, or why it cannot be switched: one host's gateway
    /// (no `[fleet]`), the router gate on, every PD worker of the host in the plan, at least two
    /// of each role, and half of each role within `max_unavailable` (the new group is out before
    /// the switch, the old one after it).
    /// With `[fleet]` the groups are hosts ([`Engine::fleet_groups`]): `fleet_rollout` is this
    /// host's part of one, `dry` a dry run (the groups it would have as a fleet rollout).
    pub(in crate::engine) async fn switch_groups(&self, plan: &Plan, fleet_rollout: Option<&str>, dry: bool) -> Result<Groups, String> {
        if !self.settings.verify.router {
            return Err("a switch moves the gateway from one group to the other: it needs [router] and the router gate".into());
        }
        let pd: Vec<&Worker> = self.settings.workers.iter().filter(|w| w.role != Role::Regular).collect();
        let left: Vec<&str> = pd.iter().filter(|w| !plan.workers.iter().any(|p| p.unit == w.unit)).map(|w| w.unit.as_str()).collect();
        if !left.is_empty() {
            return Err(format!("a switch moves every PD worker of the host and the plan leaves out {}", left.join(", ")));
        }
        if self.settings.fleet.is_some() {
            return match (fleet_rollout, dry) {
                (Some(id), _) => self.fleet_groups(plan, Some(id)).await,
                (None, true) => self.fleet_groups(plan, None).await,
                (None, false) => Err("with [fleet] other hosts' workers serve beside this host's in the gateway: a model change is switched fleet-wide, hosts in step: `pdctl fleet restart --rolling --load-changes` (new weights of the same model load in place: `pdctl fleet weights`)".into()),
            };
        }
        let role = |r: Role| plan.workers.iter().filter(|w| w.role == r).cloned().collect::<Vec<_>>();
        let (p, d) = (role(Role::Prefill), role(Role::Decode));
        if p.len() < 2 || d.len() < 2 {
            return Err(format!(
                "a switch needs two workers of each role, one group serving while the other restarts ({} prefill(s), {} decode(s)); one of each restarts together with single_pair = \"together\"",
                p.len(),
                d.len()
            ));
        }
        let half = |n: usize| n.div_ceil(2);
        let need = half(p.len()).max(half(d.len()));
        if need as u32 > self.settings.rollout.max_unavailable {
            return Err(format!(
                "a switch has half of each role out at once: it needs [rollout] max_unavailable = {need} (it is {})",
                self.settings.rollout.max_unavailable
            ));
        }
        let (pn, dn) = (half(p.len()), half(d.len()));
        let new = p[..pn].iter().chain(&d[..dn]).cloned().collect();
        let old = d[dn..].iter().chain(&p[pn..]).cloned().collect();
        Ok(Groups { new, old, fleet: None })
    }

    /// The switch's first two phases (module docs): `Ok` with the old group, which the roll
    /// layer restarts next (phase 3, through every gate, decodes first). `Err`: the summary of
    /// a halted run; the units verified are in `t.done`.
    pub(in crate::engine) async fn run_switch<'g>(&self, plan: &Plan, g: &'g Groups, run: &mut Underway<'_>) -> Result<Vec<&'g Worker>, Summary> {
        if let Some(f) = &g.fleet {
            return Box::pin(self.run_fleet_switch(plan, g, f, run)).await;
        }
        let (sink, ctx) = (run.sink, run.ctx);
        run.notes.push(g.sentence(&plan.workers.iter().collect::<Vec<_>>()));
        self.restart_new_group(g, run).await?;
        // 2. The switch.
        let t_out = Instant::now();
        if let Err((w, f)) = self.take_out(&g.old, ctx).await {
            // Part of the old group may be out already: it comes back (the new group stays out).
            run.notes.push(self.switch_back(g, ctx, sink, "the old group could not be taken out of the gateway").await);
            return Err(run.t.summary(Outcome::Failed, Some(halt::failure(self, &w.unit, Step::Drain, f).await)));
        }
        let admitted = futures_util::future::join_all(g.new.iter().map(|w| self.admit_at_switch(w, sink, ctx, t_out))).await;
        if let Some((w, f)) = admitted.into_iter().find_map(Result::err) {
            run.notes.push(self.switch_back(g, ctx, sink, "the gateway did not admit the new group").await);
            return Err(run.t.summary(Outcome::Failed, Some(halt::failure(self, &w.unit, Step::Router, f).await)));
        }
        let switched = self.switched(g, t_out, ctx, run.t).await;
        run.notes.extend(switched);
        // 3. The old group, through every gate, decodes first: the roll layer's.
        Ok(g.old.iter().collect())
    }

    /// Phase 1: the new group out, restarted onto the new model and verified inside itself,
    /// held out of the gateway (written down as [`Hold::Verified`] at the end). `Err`: the
    /// summary of the halted run (what it holds out stays out, said in the notes).
    pub(in crate::engine) async fn restart_new_group(&self, g: &Groups, run: &mut Underway<'_>) -> Result<(), Summary> {
        let new_units = Groups::units(&g.new);
        let (sink, abort, ctx) = (run.sink, run.abort, run.ctx);
        let held = Ctx { scope: crate::engine::context::Scope { hold: Some(Hold::New), pair_scope: Some(&new_units), ..ctx.scope }, ..ctx };
        let run = &mut Underway { ctx: held, sink, abort, notes: run.notes, t: &mut *run.t };
        // 1. The new group: out, restarted, verified inside itself (its prefills first: its
        // decodes then start after them and cache no old prefill process).
        let mut up = Vec::new();
        for w in &g.new {
            if abort.load(Ordering::SeqCst) {
                self.halted_switch(run).await;
                return Err(run.t.summary(Outcome::Aborted, None));
            }
            if let Some(c) = ctx.clients {
                *crate::engine::step_run::lock(&c.current) = Some(w.unit.clone());
            }
            let r = WorkerRun::new(w, Sequence::SwitchNew, sink, held);
            match runbook::until_healthy(self, &r).await {
                Ok(healthy) => up.push((r, healthy)),
                Err((step, f)) => return Err(self.switch_failed(w, step, f, run).await),
            }
        }
        // 2. Each verified inside the group: its pairs (a stale one fails the switch), then the
        // rest of its steps (held out of the gateway).
        for (r, healthy) in up {
            if let Err((step, f)) = runbook::back_in_service(self, &r, healthy).await {
                return Err(self.switch_failed(r.w, step, f, run).await);
            }
        }
        if let Err(e) = self.hold_as(&g.new, Hold::Verified, ctx) {
            let f = Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() });
            return Err(self.switch_failed(&g.new[0], Step::Router, f, run).await);
        }
        Ok(())
    }

    /// The new group admitted: its drains crossed off, its revisions recorded, counted done; the
    /// notes (each revision recorded, then the sentence that says how long no PD pair was routable (from `t_out`, when the old group
    /// began to go out, to the first request through the gateway that answered)).
    pub(in crate::engine) async fn switched(&self, g: &Groups, t_out: Instant, ctx: Ctx<'_>, t: &mut Tally) -> Vec<String> {
        let new_units = Groups::units(&g.new);
        let first_answer = self.first_answer(t_out).await;
        let window_ms = first_answer.unwrap_or_else(|| t_out.elapsed().as_millis() as u64);
        let mut recorded = Vec::new();
        for w in &g.new {
            if let Some(l) = ctx.writes.ledger {
                let _ = l.clear(&w.unit);
            }
            if let Some(dir) = ctx.writes.revisions {
                recorded.push(self.record_revision(w, dir, ctx.writes.id).await);
            }
            t.done.push(w.unit.clone());
        }
        let old = if g.old.is_empty() {
            g.fleet.as_ref().map(|f| format!("the old hosts' workers ({})", f.old_hosts.join(", "))).unwrap_or_default()
        } else {
            Groups::units(&g.old).join(", ")
        };
        let said = match first_answer {
            Some(ms) => format!(
                "switched the gateway from {old} to {}: no PD pair was routable for {ms} ms (the old group out → the first request through the gateway answered by the new group)",
                new_units.join(", ")
            ),
            None => format!(
                "switched the gateway from {old} to {}: the new group is admitted but no request through the gateway answered within {window_ms} ms (the smoke request is off or failed)",
                new_units.join(", ")
            ),
        };
        recorded.push(said);
        recorded
    }

    /// Rewrite the group's held drains as `hold`.
    pub(in crate::engine) fn hold_as(&self, ws: &[Worker], hold: Hold, ctx: Ctx<'_>) -> std::io::Result<()> {
        let Some(l) = ctx.writes.ledger else { return Ok(()) };
        for w in ws {
            if let Some(mut d) = l.get(&w.unit) {
                d.hold = Some(hold);
                l.record(&d)?;
            }
        }
        Ok(())
    }

    /// The old group out of every replica at once, each written down first as held
    /// ([`Hold::Old`]); its requests in flight finish meanwhile (its drain step waits for them
    /// before its stop).
    pub(in crate::engine) async fn take_out<'w>(&self, ws: &'w [Worker], ctx: Ctx<'_>) -> Result<(), (&'w Worker, Fail)> {
        let mut lists = Vec::new();
        for r in 0..self.probes.replicas() {
            let list = self
                .probes
                .router_workers(r)
                .await
                .map_err(|e| (&ws[0], Fail::from(Cause::DrainFailed { unit: ws[0].unit.clone(), error: format!("the router does not answer: {e}") })))?;
            lists.push((r, list));
        }
        for w in ws {
            let entries: Vec<(usize, String)> = lists
                .iter()
                .flat_map(|(r, l)| l.iter().filter(|x| crate::config::same_url(&x.url, &w.url) && !x.draining()).map(move |x| (*r, x.id.clone())))
                .collect();
            if let Some(l) = ctx.writes.ledger {
                let id = entries.first().map(|(_, id)| id.clone()).unwrap_or_default();
                gates::drain::record_drain(self, l, w, &id, ctx.writes.id, Some(Hold::Old)).await.map_err(|f| (w, f))?;
            }
            for (r, id) in &entries {
                self.probes
                    .deregister(*r, id)
                    .await
                    .map_err(|e| (w, Fail::from(Cause::DrainFailed { unit: w.unit.clone(), error: format!("the router refused to remove {}: {e}", w.url) })))?;
            }
        }
        Ok(())
    }

    /// One worker of the new group admitted at the switch (its router gate; no smoke request of
    /// its own while the other role is not admitted yet: the switch sends one for the group).
    pub(in crate::engine) async fn admit_at_switch<'w>(&self, w: &'w Worker, sink: &Sink, ctx: Ctx<'_>, t_out: Instant) -> Result<(), (&'w Worker, Fail)> {
        let s = StepRun::start(sink, &w.unit, Step::Router);
        match gates::router::router_recorded(self, w, true, true, ctx.writes.ledger.map(|l| (l, ctx.writes.id))).await {
            Ok(router) => {
                let switch = AdmittedAtSwitch { admitted_after_ms: t_out.elapsed().as_millis() as u64 };
                s.end(Verdict::passed(AtSwitch { router, switch }));
                Ok(())
            }
            Err(f) => {
                s.fail(&f);
                Err((w, f))
            }
        }
    }

    /// Milliseconds from `t_out` to the first request through the gateway that answers 200
    /// (tried every 10 ms, bounded by router_timeout); `None`: the smoke request is off, or none
    /// answered.
    async fn first_answer(&self, t_out: Instant) -> Option<u64> {
        if !self.settings.verify.smoke_request {
            return None;
        }
        while t_out.elapsed() < self.settings.rollout.router_timeout {
            if self.probes.smoke(0, 1).await.is_ok() {
                return Some(t_out.elapsed().as_millis() as u64);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        None
    }

    /// The switch could not be made (`why`): the new group out again, and the old group (which
    /// still runs the old model and passed its gates before) back in, so that the host serves as
    /// before.
    pub(in crate::engine) async fn switch_back(&self, g: &Groups, ctx: Ctx<'_>, sink: &Sink, why: &str) -> String {
        for r in 0..self.probes.replicas() {
            if let Ok(list) = self.probes.router_workers(r).await {
                for x in list.iter().filter(|x| g.new.iter().any(|w| crate::config::same_url(&x.url, &w.url)) && !x.draining()) {
                    let _ = self.probes.deregister(r, &x.id).await;
                }
            }
        }
        let _ = self.hold_as(&g.new, Hold::New, ctx);
        let mut back = Vec::new();
        for w in &g.old {
            let s = StepRun::start(sink, &w.unit, Step::Reconcile);
            match gates::router::router(self, w, true, false).await {
                Ok(d) => {
                    s.end(Verdict::passed(d));
                    if let Some(l) = ctx.writes.ledger {
                        let _ = l.clear(&w.unit);
                    }
                    back.push(w.unit.clone());
                }
                Err(f) => s.fail(&f),
            }
        }
        format!(
            "{why} ({}): the new group is out again (held, on the new model) and {} serve(s) the old model again",
            Groups::units(&g.new).join(", "),
            if back.is_empty() { "nothing".to_string() } else { back.join(", ") }
        )
    }

    /// A step of the new group failed before the switch: the rollout halts; what it holds out
    /// stays out (the old group serves), said in the notes.
    async fn switch_failed(&self, w: &Worker, step: Step, f: Fail, run: &mut Underway<'_>) -> Summary {
        let unit = f.unit.clone().unwrap_or_else(|| w.unit.clone());
        let failure = halt::failure(self, &unit, step, f).await;
        self.halted_switch(run).await;
        run.t.summary(Outcome::Failed, Some(failure))
    }

    /// What this rollout holds out, said (and left out: each runs another model than the group
    /// serving).
    async fn halted_switch(&self, run: &mut Underway<'_>) {
        halt::reconcile_drains(self, "", Step::Drain, run.ctx, run.sink, run.notes).await;
    }
}

/// A new group's worker's router detail: the gate's, and when it was admitted at the switch.
#[derive(serde::Serialize)]
struct AtSwitch {
    /// The router gate's detail.
    #[serde(flatten)]
    router: gates::router::RouterDetail,
    /// When it was admitted.
    switch: AdmittedAtSwitch,
}

/// Its part of a new group's router detail (`switch`): when it was admitted, after the old group
/// was taken out.
#[derive(serde::Serialize)]
struct AdmittedAtSwitch {
    /// After the old group left the gateway.
    admitted_after_ms: u64,
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use crate::engine::gates::router::{Admitted, RouterDetail};
    use crate::engine::step_run::detail_of;

    #[test]
    fn a_worker_admitted_at_the_switch_has_the_router_gates_keys_and_its_own() {
        let mut want = detail_of(&Admitted::example());
        want["switch"] = serde_json::json!({"admitted_after_ms": 7});
        let d = AtSwitch { router: RouterDetail::One(Admitted::example()), switch: AdmittedAtSwitch { admitted_after_ms: 7 } };
        assert_eq!(detail_of(&d), want);
    }
}
