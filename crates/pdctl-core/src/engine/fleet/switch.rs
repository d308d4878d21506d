//! The coherent switch across a fleet behind one gateway (`pdctl fleet restart --rolling
//! --load-changes` with a change of the model the workers compute with). Every host's prefills
//! pair with every host's decodes in the shared gateway, so the groups are hosts: the first
//! half of the rollout's hosts (rounded up) is the new group, the rest the old one. Each host
//! runs its part ([`crate::engine::switch`]'s phases) and the hosts move in step through etcd
//! (`rollouts/<id>/hosts/<host>/switch/<phase>`, [`crate::engine::fleet::in_step`]):
//!
//! 1. each **new host** takes a fleet slot for each of its PD workers, drains them (held,
//!    [`crate::state::drain_ledger::Hold::New`]), restarts them onto the new model and verifies them inside
//!    the host (its pair probes go straight to its own workers), then writes `verified`;
//! 2. once every new host is `verified`, each **old host** takes its slots and takes its workers
//!    out of the gateway (held, [`crate::state::drain_ledger::Hold::Old`], written first), then writes `out`;
//! 3. once every old host is `out`, each new host has its workers admitted and writes `in`; the
//!    window without a routable PD pair (the last `out` seen → the first request through the
//!    gateway that answers) is measured and reported;
//! 4. once every new host is `in`, each old host restarts its workers, decodes first, through
//!    every gate, paired only with workers of the new model, and re-admits them.
//!
//! A host that fails a phase writes it as failed (with why), and the others put back what keeps
//! the gateway coherent: nothing is admitted while another host's old workers serve; a new host
//! whose group was not admitted everywhere is taken out again (`back`), and only then do the old
//! hosts take theirs back in. New workers that were verified but not switched in stay out
//! (held, on the new model), said in the notes. The rollout fails with `switch_failed`.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::{Notes, Tally, Underway};
use crate::engine::gates;
use crate::engine::halt;
use crate::engine::machine::Engine;
use crate::engine::step_run::{detail_of, Fail, StepRun};
use crate::engine::work::{FleetGroups, FleetStep, Groups, Phase, PhaseName};
use crate::events::{Outcome, Sink, Step, Summary};
use crate::names::FLEET;
use crate::plan::Plan;
use crate::ports::{Logs, Probes, Units};

impl FleetGroups {
    /// What the fleet switch does and the capacity at each phase, in one sentence.
    pub(in crate::engine) fn sentence(&self) -> String {
        let [(np, nd), (op, od)] = self.counts;
        let one = self.old_hosts.len() == 1;
        format!(
            "coherent fleet switch{}: {new} restart all their PD workers onto the new model out of the gateway while {old} {serve} ({op} of {p} prefills, {od} of {d} decodes fleet-wide; fleet slots: {mp} prefill(s), {md} decode(s) at once); \
             then {old} {take} its workers out and the gateway admits those of {new} (no PD pair is routable until then: measured and reported); \
             then {old} {restart} them, one at a time on each host, each through every gate",
            if self.id.is_none() { " (as `pdctl fleet restart --rolling --load-changes` over every live host)" } else { "" },
            new = self.new_hosts.join(", "),
            old = self.old_hosts.join(", "),
            p = np + op,
            d = nd + od,
            mp = np.max(op),
            md = nd.max(od),
            serve = if one { "serves" } else { "serve" },
            take = if one { "takes" } else { "each take" },
            restart = if one { "restarts" } else { "restart" },
        )
    }
}

/// Phase `name` of fleet switch `id`.
fn phase(id: &str, name: PhaseName) -> Phase<'_> {
    Phase { id, kind: FleetStep::Switch, name }
}

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// The fleet's groups of hosts for fleet rollout `id` (`None`: a dry run over every live
    /// host), or why a fleet switch cannot be made: no canary (the hosts move in step), two
    /// hosts or more, each group holding both roles (from the hosts' liveness keys), a whole
    /// group within `[fleet.max_unavailable]`, and this host's workers of a role within its
    /// `[rollout] max_unavailable` (all of them go out at once).
    pub(in crate::engine) async fn fleet_groups(&self, plan: &Plan, id: Option<&str>) -> Result<Groups, String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else {
            return Err("a fleet switch needs [fleet] and its etcd".into());
        };
        let rollout = match id {
            Some(id) => Some(self.rollout_hosts(id).await.map_err(|e| e.to_string())?),
            None => None,
        };
        if let Some(canary) = rollout.as_ref().and_then(|r| r.canary.as_ref()) {
            return Err(format!("a fleet switch moves every host in step: it cannot begin with a canary host ({canary}); start it without one"));
        }
        let alive = crate::fleet::hosts(c.as_ref(), &f.name).await.map_err(|e| format!("the hosts' liveness keys cannot be read from etcd: {e}"))?;
        let mut hosts: Vec<String> = match &rollout {
            Some(r) => r.hosts.clone(),
            None => alive.iter().map(|h| h.host.clone()).collect(),
        };
        if rollout.is_none() {
            hosts.sort();
        }
        if !hosts.contains(&f.host) {
            return Err(format!("this host ({}) is not one of the fleet rollout's hosts", f.host));
        }
        if hosts.len() < 2 {
            return Err(format!("a fleet switch needs two hosts or more, one group serving while the other restarts ({} in the rollout)", hosts.len()));
        }
        // Each host's PD workers, from its liveness key.
        let mut roles = Vec::new();
        for h in &hosts {
            let Some(st) = alive.iter().find(|s| &s.host == h) else {
                return Err(format!("{h} has no liveness key in etcd (is its pdctld running?): the groups cannot be sized"));
            };
            let n = |r: Role| st.workers.iter().filter(|w| w.role == r.as_str()).count();
            roles.push((n(Role::Prefill), n(Role::Decode)));
        }
        let n_new = hosts.len().div_ceil(2);
        let sum = |rs: &[(usize, usize)]| rs.iter().fold((0, 0), |(p, d), (a, b)| (p + a, d + b));
        let counts = [sum(&roles[..n_new]), sum(&roles[n_new..])];
        let (new_hosts, old_hosts) = (hosts[..n_new].to_vec(), hosts[n_new..].to_vec());
        for ((p, d), (which, names)) in counts.iter().zip([("new", &new_hosts), ("old", &old_hosts)]) {
            if *p == 0 || *d == 0 {
                return Err(format!(
                    "each group of hosts must hold both roles: the {which} group ({}) holds {p} prefill(s) and {d} decode(s)",
                    names.join(", ")
                ));
            }
        }
        let limits = crate::fleet::Limits { max_unavailable: f.max_unavailable.clone() };
        let (need_p, need_d) = (counts[0].0.max(counts[1].0), counts[0].1.max(counts[1].1));
        if need_p as u32 > limits.of("prefill") || need_d as u32 > limits.of("decode") {
            return Err(format!(
                "a fleet switch has a whole group of hosts out at once: it needs [fleet.max_unavailable] prefill = {need_p} and decode = {need_d} (they are {} and {})",
                limits.of("prefill"),
                limits.of("decode")
            ));
        }
        let own = |r: Role| plan.workers.iter().filter(|w| w.role == r).cloned().collect::<Vec<_>>();
        let (p, d) = (own(Role::Prefill), own(Role::Decode));
        let most = p.len().max(d.len());
        if most as u32 > self.settings.rollout.max_unavailable {
            return Err(format!(
                "a fleet switch has all of this host's workers of a role out at once: it needs [rollout] max_unavailable = {most} (it is {})",
                self.settings.rollout.max_unavailable
            ));
        }
        let per_host = roles.iter().map(|(p, d)| p + d).max().unwrap_or(1) as u32;
        let r = &self.settings.rollout;
        let verify_wait = f.slot_timeout + (r.drain_timeout + r.ready_timeout + r.health_timeout + Duration::from_secs(60)) * per_host.max(1);
        let mine_new = new_hosts.contains(&f.host);
        let (new, old) = if mine_new { (p.into_iter().chain(d).collect(), Vec::new()) } else { (Vec::new(), d.into_iter().chain(p).collect()) };
        let fleet = FleetGroups { id: id.map(String::from), new_hosts, old_hosts, mine_new, counts, verify_wait };
        Ok(Groups { new, old, fleet: Some(fleet) })
    }

    /// This host's part of the fleet switch (module docs). `Err`: the summary of a halted run.
    pub(in crate::engine) async fn run_fleet_switch<'g>(
        &self,
        plan: &Plan,
        g: &'g Groups,
        f: &FleetGroups,
        run: &mut Underway<'_>,
    ) -> Result<Vec<&'g Worker>, Summary> {
        let Some(id) = f.id.as_deref() else {
            return Err(self.switch_halted(PhaseName::Verified, "a dry run's groups cannot be run".into(), String::new(), run.t).await);
        };
        run.notes.push(f.sentence());
        let r = &self.settings.rollout;
        // Out, in and back follow a drain, a re-registration or a deregistration on each host.
        let step_wait = r.drain_timeout + r.router_timeout + r.health_timeout + Duration::from_secs(60);
        if f.mine_new {
            Box::pin(self.fleet_switch_new(g, f, run, id, step_wait)).await.map(|()| Vec::new())
        } else {
            Box::pin(self.fleet_switch_old(plan, g, f, run, id, step_wait)).await
        }
    }

    /// One phase of the switch as a `switch` step of unit `fleet`: this host's `mine` written
    /// (when given), then the wait for `hosts` (bounded by `limit`, ended by `abort`). `Err`:
    /// why not every host got there.
    #[allow(clippy::too_many_arguments)]
    async fn in_step(
        &self,
        sink: &Sink,
        id: &str,
        name: PhaseName,
        mine: Option<&Result<(), String>>,
        hosts: &[String],
        limit: Duration,
        abort: Option<&AtomicBool>,
    ) -> Result<(), String> {
        let s = StepRun::start(sink, FLEET, Step::Switch);
        let t0 = Instant::now();
        let mut r = match mine {
            Some(m) => self.write_phase(phase(id, name), m).await.map_err(|e| e.to_string()),
            None => Ok(()),
        };
        if r.is_ok() && !hosts.is_empty() {
            r = self.await_phase(phase(id, name), hosts, limit, abort).await.map_err(|e| e.to_string());
        }
        let detail = detail_of(&InStep {
            phase: name.as_str(),
            wrote: mine.map(|m| if m.is_ok() { "ok" } else { "failed" }),
            waited_for: hosts,
            waited_ms: t0.elapsed().as_millis() as u64,
        });
        match &r {
            Ok(()) => s.pass(detail),
            Err(why) => {
                let mut f = Fail::from(Cause::SwitchFailed { phase: name.as_str().into(), why: why.clone(), held: String::new() });
                f.detail = detail;
                s.fail(&f);
            }
        }
        r
    }

    /// A new host's part: slots, restarts held out and verified → `verified`; every old host
    /// `out` → admitted → `in`; every new host `in` → done (else out again → `back`).
    async fn fleet_switch_new(&self, g: &Groups, f: &FleetGroups, run: &mut Underway<'_>, id: &str, step_wait: Duration) -> Result<(), Summary> {
        let (sink, abort, ctx) = (run.sink, run.abort, run.ctx);
        let held_out = "this host's new workers stay out of the gateway (held, on the new model)".to_string();
        let mut slots = Vec::new();
        for w in &g.new {
            match crate::engine::plan_steps::take_slots(self, &[w], sink, ctx).await {
                Ok(s) => slots.push((w, s)),
                Err((_, fail)) => {
                    let why = format!("{}: no fleet slot ({})", w.unit, fail.cause.sentence());
                    let _ = self.in_step(sink, id, PhaseName::Verified, Some(&Err(why)), &[], step_wait, None).await;
                    return Err(run.t.summary(Outcome::Failed, Some(halt::failure(self, &w.unit, Step::Slot, fail).await)));
                }
            }
        }
        if let Err(s) = Box::pin(self.restart_new_group(g, run)).await {
            let why = s.failed.as_ref().map(|x| format!("{}: {}", x.unit, x.cause)).unwrap_or_else(|| "halted".into());
            let _ = self.in_step(sink, id, PhaseName::Verified, Some(&Err(why)), &[], step_wait, None).await;
            return Err(s);
        }
        // Verified → every old host out of the gateway.
        if let Err(why) = self.in_step(sink, id, PhaseName::Verified, Some(&Ok(())), &[], step_wait, None).await {
            return Err(self.switch_halted(PhaseName::Verified, why, held_out, run.t).await);
        }
        if let Err(why) = self.in_step(sink, id, PhaseName::Out, None, &f.old_hosts, f.verify_wait + step_wait, Some(abort)).await {
            return Err(self.switch_halted(PhaseName::Out, why, held_out, run.t).await);
        }
        let t_out = Instant::now();
        let admitted = futures_util::future::join_all(g.new.iter().map(|w| self.admit_at_switch(w, sink, ctx, t_out))).await;
        let mine = match admitted.into_iter().find_map(Result::err) {
            Some((w, fail)) => Err(format!("{} was not admitted: {}", w.unit, fail.cause.sentence())),
            None => Ok(()),
        };
        let waits: &[String] = if mine.is_ok() { &f.new_hosts } else { &[] };
        let all_in = self.in_step(sink, id, PhaseName::In, Some(&mine), waits, step_wait, Some(abort)).await.and(mine);
        if let Err(why) = all_in {
            // Out again before the old hosts take theirs back in.
            run.notes.push(self.switch_back(g, ctx, sink, "the new hosts were not all admitted").await);
            let _ = self.in_step(sink, id, PhaseName::Back, Some(&Ok(())), &[], step_wait, None).await;
            return Err(self.switch_halted(PhaseName::In, why, held_out, run.t).await);
        }
        let switched = self.switched(g, t_out, ctx, run.t).await;
        run.notes.extend(switched);
        for (w, s) in &slots {
            gates::slot::release_slots(self, &w.unit, s, ctx).await;
        }
        Ok(())
    }

    /// An old host's part: every new host `verified` → out → `out`; every old host `out` and
    /// every new host `in` → its slots (once the new hosts gave theirs back), then restarted one
    /// at a time (else back in, once every new host that was admitted is out again).
    async fn fleet_switch_old<'g>(
        &self,
        _plan: &Plan,
        g: &'g Groups,
        f: &FleetGroups,
        run: &mut Underway<'_>,
        id: &str,
        step_wait: Duration,
    ) -> Result<Vec<&'g Worker>, Summary> {
        let (sink, abort, ctx) = (run.sink, run.abort, run.ctx);
        let serving = "this host's workers serve the old model as before".to_string();
        if let Err(why) = self.in_step(sink, id, PhaseName::Verified, None, &f.new_hosts, f.verify_wait, Some(abort)).await {
            let _ = self.in_step(sink, id, PhaseName::Out, Some(&Err(format!("not taken out: {why}"))), &[], step_wait, None).await;
            return Err(self.switch_halted(PhaseName::Verified, why, serving, run.t).await);
        }
        // The switch's window begins: the old hosts' workers out of the gateway (stated in the
        // plan; their slots follow, once the new hosts serve and gave theirs back).
        let s = StepRun::start(sink, g.old.first().map_or(FLEET, |w| w.unit.as_str()), Step::Drain);
        let mine = match self.take_out(&g.old, ctx).await {
            Ok(()) => {
                s.pass(detail_of(&TakenOutForSwitch { switch: OutOfGateway { out: Self::names(&g.old) } }));
                Ok(())
            }
            Err((w, fail)) => {
                s.fail(&fail);
                Err(format!("{} could not be taken out: {}", w.unit, fail.cause.sentence()))
            }
        };
        let waits: &[String] = if mine.is_ok() { &f.old_hosts } else { &[] };
        let switched = match self.in_step(sink, id, PhaseName::Out, Some(&mine), waits, step_wait, Some(abort)).await.and(mine) {
            Ok(()) => self.in_step(sink, id, PhaseName::In, None, &f.new_hosts, step_wait, Some(abort)).await.map_err(|why| (PhaseName::In, why)),
            Err(why) => Err((PhaseName::Out, why)),
        };
        if let Err((at, why)) = switched {
            // Back in only once no new host's workers are admitted: those that wrote `in` go
            // out again first (`back`).
            let admitted = self.hosts_at(phase(id, PhaseName::In), &f.new_hosts).await;
            let out_again = if admitted.is_empty() { Ok(()) } else { self.in_step(sink, id, PhaseName::Back, None, &admitted, step_wait, None).await };
            return Err(match out_again {
                Ok(()) => {
                    run.notes.push(self.switch_back(g, ctx, sink, "the fleet switch did not go through").await);
                    self.switch_halted(at, why, serving, run.t).await
                }
                Err(late) => {
                    let held = format!(
                        "this host's workers stay out of the gateway (held, on the old model): {late}, and taking them back in could pair the two models"
                    );
                    self.switch_halted(at, why, held, run.t).await
                }
            });
        }
        // Every new host serves: this host's workers hold their slots (the new hosts give theirs
        // back once they answer), then restart, decodes first, through every gate (each gives
        // its slot back once verified).
        for w in &g.old {
            if let Err((step, fail)) = crate::engine::plan_steps::take_slots(self, &[w], sink, ctx).await {
                return Err(run.t.summary(Outcome::Failed, Some(halt::failure(self, &w.unit, step, fail).await)));
            }
        }
        Ok(g.old.iter().collect())
    }

    /// This host's part of fleet rollout `f` changes no worker's model: said in etcd (the
    /// `none` phase, as a failure of the switch's), so that hosts which do switch stop waiting
    /// for it (they fail with `switch_failed` naming this host); a note when it cannot be said.
    pub(in crate::engine) async fn no_fleet_switch(&self, f: &FleetGroups, notes: &Notes) {
        let Some(id) = f.id.as_deref() else { return };
        let why = "its part changes no worker's model (are its unit files those of the new model?): it takes no part in a coherent switch".to_string();
        if let Err(e) = self.write_phase(phase(id, PhaseName::None), &Err(why)).await {
            notes.push(format!("that this host takes no part in a coherent fleet switch could not be written to etcd ({e}): a host that switches waits for it until its own limit"));
        }
    }

    /// The hosts of `hosts` that wrote `phase` (whatever its outcome).
    async fn hosts_at(&self, phase: Phase<'_>, hosts: &[String]) -> Vec<String> {
        let (Some(c), Some(f)) = (&self.coordinator, &self.settings.fleet) else { return Vec::new() };
        let mut at = Vec::new();
        for h in hosts {
            if matches!(c.get(&crate::fleet::phase_key(&f.name, phase.id, h, phase.kind.as_str(), phase.name.as_str())).await, Ok(Some(_))) {
                at.push(h.clone());
            }
        }
        at
    }

    fn names(ws: &[Worker]) -> Vec<String> {
        ws.iter().map(|w| w.unit.clone()).collect()
    }

    /// The summary of a fleet switch halted at `phase` (`switch_failed`, on the fleet).
    async fn switch_halted(&self, phase: PhaseName, why: String, held: String, t: &mut Tally) -> Summary {
        let cause = Cause::SwitchFailed { phase: phase.as_str().into(), why, held };
        t.summary(Outcome::Failed, Some(halt::failure(self, FLEET, Step::Switch, Fail::from(cause)).await))
    }
}

/// A phase of the fleet switch (a `switch` step of unit `fleet`).
#[derive(Serialize)]
struct InStep<'a> {
    /// `verified`, `out`, `in`, `back`.
    phase: &'a str,
    /// This host's own phase written: `ok`, `failed` (`None`: it writes none in this phase).
    wrote: Option<&'static str>,
    /// The hosts it waited for.
    waited_for: &'a [String],
    /// How long it waited.
    waited_ms: u64,
}

/// The old hosts' drain at the switch: its workers taken out of the gateway.
#[derive(Serialize)]
struct TakenOutForSwitch {
    /// What the switch took out.
    switch: OutOfGateway,
}

/// Workers the switch took out of the gateway.
#[derive(Serialize)]
struct OutOfGateway {
    /// Their units.
    out: Vec<String>,
}

#[cfg(test)]
mod detail_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_switch_details_have_the_keys_of_the_contract() {
        let hosts = vec!["b".to_string()];
        assert_eq!(
            detail_of(&InStep { phase: "out", wrote: Some("ok"), waited_for: &hosts, waited_ms: 2 }),
            json!({"phase": "out", "wrote": "ok", "waited_for": ["b"], "waited_ms": 2})
        );
        assert_eq!(detail_of(&TakenOutForSwitch { switch: OutOfGateway { out: vec!["p".into()] } }), json!({"switch": {"out": ["p"]}}));
    }
}
