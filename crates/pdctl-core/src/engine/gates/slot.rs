//! Fleet slots: a worker's slot of its role's fleet-wide budget, taken (and written to the ledger)
//! before it is drained, released after its soak.

use std::time::Instant;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::Ctx;
use crate::engine::machine::Engine;
use crate::engine::step_run::{Fail, Verdict};
use crate::fleet::SlotRecord;

use crate::ports::Probes;

/// Fleet: take a slot of each worker's role in one transaction (waiting, bounded by
/// `slot_timeout`, while the fleet's slots are held or it is paused). Written down in the
/// ledger before the transaction; `waiting` hears each new reason to wait. The step runs with
/// `[fleet]` ([`applies`]).
pub(in crate::engine) async fn slot<U, L, P: Probes>(
    eng: &Engine<U, L, P>,
    ws: &[&Worker],
    ctx: Ctx<'_>,
    waiting: &(dyn Fn(&str) + Send + Sync),
) -> Result<(Verdict<SlotHeld>, Vec<SlotRecord>), Fail> {
    use crate::fleet::{self as fl, Acquired, Hold};
    let (Some(c), Some(f), Some(first)) = (&eng.coordinator, &eng.settings.fleet, ws.first()) else {
        return Ok((Verdict::Skipped("no [fleet]".into()), Vec::new()));
    };
    let limits = fl::Limits { max_unavailable: f.max_unavailable.clone() };
    let mut recs: Vec<SlotRecord> = ws
        .iter()
        .map(|w| SlotRecord {
            role: w.role.as_str().to_string(),
            hold: Hold {
                holder: fl::holder(&f.host, &w.unit),
                url: w.url.clone(),
                token: fl::token(),
                since: fl::now_secs(),
                rollout: ctx.writes.id.to_string(),
            },
        })
        .collect();
    let write = |recs: &[SlotRecord]| -> Result<(), Box<Fail>> {
        if let Some(l) = ctx.writes.ledger {
            l.record_slot(&first.unit, recs)
                .map_err(|e| Box::new(Fail::from(Cause::RecordUnwritable { dir: "the slot ledger".into(), error: e.to_string() })))?;
        }
        Ok(())
    };
    write(&recs).map_err(|e| *e)?;
    let wants: Vec<(String, Hold)> = recs.iter().map(|r| (r.role.clone(), r.hold.clone())).collect();
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        let unhealthy = unhealthy_by_role(eng).await;
        // Read before the attempt: the wait below watches from here, so a slot given back
        // between the attempt's reads and the watch is not missed.
        let before = c.revision().await.unwrap_or(0);
        let fail = match fl::try_acquire(c.as_ref(), &f.name, &limits, &wants, &unhealthy).await {
            Ok(Acquired::Granted(held)) => {
                // A retry may have found an older hold of ours: that is the one to give back.
                for (r, (_, h)) in recs.iter_mut().zip(&held) {
                    r.hold = h.clone();
                }
                write(&recs).map_err(|e| *e)?;
                return Ok((Verdict::passed(SlotHeld { held: recs.clone(), waited_ms: t0.elapsed().as_millis() as u64 }), recs));
            }
            Ok(Acquired::Wait(why)) if t0.elapsed() < f.slot_timeout => {
                if why != last {
                    tracing::info!(pdctl_unit = %first.unit, "{why}");
                    waiting(&why);
                    last = why;
                }
                // Woken by the slot keys' own changes; polling only as the bounded
                // fallback (a worker counted unhealthy may serve again: no key says so).
                let left = f.slot_timeout.saturating_sub(t0.elapsed());
                fl::wait_for_room(c.as_ref(), &f.name, &limits, &wants, before, fl::SLOT_FALLBACK.min(left)).await;
                continue;
            }
            Ok(Acquired::Wait(why)) => Fail::from(Cause::SlotTimeout { last: why, after: f.slot_timeout }),
            Err(e) => Fail::from(Cause::FleetLost { message: e.to_string() }),
        };
        if let Some(l) = ctx.writes.ledger {
            let _ = l.clear_slot(&first.unit);
        }
        return Err(fail);
    }
}

/// Whether the slot step runs: with `[fleet]` and its coordinator.
pub(in crate::engine) fn applies<U, L, P>(eng: &Engine<U, L, P>) -> bool {
    eng.coordinator.is_some() && eng.settings.fleet.is_some()
}

/// Per role, the URLs the gateway lists but does not admit or whose breaker is open, and the
/// workers any host reports not running (a crash, a restart of their own): down anyway,
/// whoever caused it, so they count against the fleet's budget.
pub(in crate::engine) async fn unhealthy_by_role<U, L, P: Probes>(eng: &Engine<U, L, P>) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    if let Ok(list) = eng.probes.router_workers(0).await {
        let open = eng.probes.open_breakers(0).await.unwrap_or_default();
        let refused = |x: &crate::ports::RouterWorker| open.iter().any(|u| crate::url::same_url(u, &x.url));
        for x in list.iter().filter(|x| (!x.admitted() || refused(x)) && !x.draining()) {
            out.entry(x.worker_type.clone()).or_default().push(x.url.clone());
        }
    }
    if let (Some(c), Some(f)) = (&eng.coordinator, &eng.settings.fleet) {
        if let Ok(hosts) = crate::fleet::hosts(c.as_ref(), &f.name).await {
            for (role, urls) in crate::fleet::down_workers(&hosts) {
                let known = out.entry(role).or_default();
                for u in urls {
                    if !known.iter().any(|k| crate::url::same_url(k, &u)) {
                        known.push(u);
                    }
                }
            }
        }
    }
    out
}

/// Give back the slots of `unit` (verified now); crossed off the ledger once etcd took them.
/// A release that fails stays on record: pdctld gives it back when etcd answers again.
pub(in crate::engine) async fn release_slots<U, L, P>(eng: &Engine<U, L, P>, unit: &str, recs: &[crate::fleet::SlotRecord], ctx: Ctx<'_>) {
    let (Some(c), Some(f)) = (&eng.coordinator, &eng.settings.fleet) else {
        return;
    };
    if recs.is_empty() {
        return;
    }
    let mut all = true;
    for r in recs {
        if let Err(e) = crate::fleet::release(c.as_ref(), &f.name, &r.role, &r.hold.holder, &r.hold.token).await {
            tracing::warn!(pdctl_unit = %unit, "{unit}'s {} slot could not be given back yet ({e}); it stays on record and is given back when etcd answers", r.role);
            all = false;
        }
    }
    if all {
        if let Some(l) = ctx.writes.ledger {
            let _ = l.clear_slot(unit);
        }
    }
}

/// With `[fleet]`: the workers of the other PD role on other hosts, as the gateway lists them
/// (a prefill pairs with every decode behind the same gateway), each with its host and unit
/// when that host's liveness key names it.
pub(in crate::engine) async fn remote_peers<U, L, P: Probes>(eng: &Engine<U, L, P>, w: &Worker) -> Vec<(Worker, Option<(String, String)>)> {
    let (Some(c), Some(f)) = (&eng.coordinator, &eng.settings.fleet) else {
        return Vec::new();
    };
    let other = match w.role {
        Role::Prefill => Role::Decode,
        Role::Decode => Role::Prefill,
        Role::Regular => return Vec::new(),
    };
    let Ok(list) = eng.probes.router_workers(0).await else {
        return Vec::new();
    };
    let hosts = crate::fleet::hosts(c.as_ref(), &f.name).await.unwrap_or_default();
    list.into_iter()
        .filter(|x| x.worker_type == other.as_str() && !x.draining())
        .filter(|x| !eng.settings.workers.iter().any(|o| crate::config::same_url(&o.url, &x.url)))
        .map(|x| {
            let owner =
                hosts.iter().find_map(|h| h.workers.iter().find(|hw| crate::config::same_url(&hw.url, &x.url)).map(|hw| (h.host.clone(), hw.unit.clone())));
            let unit = owner.as_ref().map(|(h, u)| format!("{h}/{u}")).unwrap_or_else(|| x.url.clone());
            (
                Worker {
                    unit,
                    role: other,
                    url: x.url,
                    bootstrap_port: x.bootstrap_port,
                    gpus: None,
                    watch_files: Vec::new(),
                    api_key: None,
                    admin_api_key: None,
                },
                owner,
            )
        })
        .collect()
}

/// The slot step's detail (the JSON in docs/cli.md): the slots held, and how long it waited.
#[derive(serde::Serialize)]
pub(in crate::engine) struct SlotHeld {
    /// Each slot taken, as written to etcd.
    held: Vec<SlotRecord>,
    /// How long it waited for them.
    waited_ms: u64,
}
