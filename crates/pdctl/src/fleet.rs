//! `pdctl fleet …`: the fleet's state and an operator's hands on it, straight from etcd (the
//! same keys every pdctld uses, `pdctl_core::fleet`): status, release a dead host's slot, pause
//! and unpause slot grants fleet-wide.

use std::path::Path;

use pdctl_contract::api::Exit;
use pdctl_core::config::FleetSettings;
use pdctl_core::fleet::{self, HostSummary, Pause};
use pdctl_real::EtcdCoordinator;
use serde_json::json;

fn fleet_of(config: &Path) -> Result<FleetSettings, Exit> {
    let s = crate::context::settings(config)?;
    s.fleet.ok_or_else(|| {
        eprintln!("pdctl: this host has no [fleet] in {}: it is a single host; add [fleet] etcd, name (docs/fleet.md)", config.display());
        Exit::Usage
    })
}

fn unreachable(e: &pdctl_core::ports::FleetFailure) -> Exit {
    eprintln!("pdctl: ✗ the fleet's etcd cannot be reached: {e}; nothing was changed; next: check etcd (etcdctl endpoint health)");
    Exit::Unreachable
}

/// `pdctl fleet status`: every live host, the slots and their holders (with whether the holder's
/// host is alive), the pause.
pub async fn status(config: &Path, json: bool) -> Exit {
    let f = match fleet_of(config) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let c = EtcdCoordinator::new(&f);
    let (hosts, slots, paused) = match (fleet::hosts(&c, &f.name).await, fleet::slots(&c, &f.name).await, fleet::paused(&c, &f.name).await) {
        (Ok(h), Ok(s), Ok(p)) => (h, s, p),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return unreachable(&e),
    };
    if json {
        println!("{}", json!({ "fleet": f.name, "hosts": hosts, "slots": slots, "paused": paused }));
        return Exit::Ok;
    }
    println!("fleet {} (etcd {}), seen from {}", f.name, f.etcd.join(", "), f.host);
    match &paused {
        Some(p) => println!("PAUSED by {} since {}: {} — no slot is granted (pdctl fleet unpause)", p.by, fleet::clock(p.at), p.reason),
        None => println!("not paused"),
    }
    println!("{:<24} {:<10} {:<14} WORKERS", "HOST", "VERSION", "ROLLOUT");
    for h in &hosts {
        let workers: Vec<String> = h
            .workers
            .iter()
            .map(|w| format!("{} ({}, {}, KV {})", w.unit, w.role, w.state, w.kv_usage.map(|u| format!("{:.0}%", u * 100.0)).unwrap_or_else(|| "-".into())))
            .collect();
        println!("{:<24} {:<10} {:<14} {}", h.host, h.version, h.rollout.as_deref().unwrap_or("-"), workers.join("; "));
        if let Some(m) = &h.maintenance {
            println!("{:<24} in maintenance: {} since {} (host drain {})", "", m.phase.as_str(), fleet::clock(m.since), m.id);
        }
        if !h.self_restarts.is_empty() {
            let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
            for r in &h.self_restarts {
                *by.entry(r.unit.as_str()).or_default() += 1;
            }
            let list: Vec<String> = by.iter().map(|(u, n)| format!("{u} ×{n}")).collect();
            println!("{:<24} restarts pdctl did not make (within {}): {}", "", humantime::format_duration(f.storm.within), list.join(", "));
        }
    }
    let alive = |holder: &str| hosts.iter().any(|h| holder.split('/').next() == Some(h.host.as_str()));
    for (role, sem) in &slots {
        if sem.holders.is_empty() {
            println!("slots {role}: free");
        }
        for h in &sem.holders {
            println!(
                "slots {role}: held by {} since {} (rollout {}){}",
                h.holder,
                fleet::clock(h.since),
                h.rollout,
                match (alive(&h.holder), h.rollout.ends_with(pdctl_contract::records::MAINTENANCE_HOLD)) {
                    (true, _) => "",
                    (false, true) => " — its host is in maintenance (rebooting): given back once its workers pass their gates after the reboot",
                    (false, false) => " — its host is not alive: its worker may be down; `pdctl fleet release` frees it",
                }
            );
        }
    }
    Exit::Ok
}

/// `pdctl fleet release HOLDER [--force]`: give back a dead host's slots. Refused while the
/// holder's host is alive (its pdctld gives them back itself) unless `--force`.
pub async fn release(config: &Path, holder: &str, force: bool) -> Exit {
    let f = match fleet_of(config) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let c = EtcdCoordinator::new(&f);
    let host = holder.split('/').next().unwrap_or(holder);
    let hosts = match fleet::hosts(&c, &f.name).await {
        Ok(h) => h,
        Err(e) => return unreachable(&e),
    };
    if hosts.iter().any(|h| h.host == host) && !force {
        eprintln!(
            "pdctl: ✗ {host} is alive (its pdctld keeps its liveness key): it gives its slots back itself once its workers serve; refused (nothing changed); pass --force only if you know its worker serves"
        );
        return Exit::Usage;
    }
    match fleet::release_holder(&c, &f.name, holder).await {
        Ok(gone) if gone.is_empty() => {
            println!("pdctl: {holder} holds no slot; nothing changed");
            Exit::Ok
        }
        Ok(gone) => {
            for (role, h) in &gone {
                println!("pdctl: released {}'s {role} slot (held since {}, rollout {})", h.holder, fleet::clock(h.since), h.rollout);
            }
            println!("pdctl: ✓ released {} slot(s) of {holder}; next: pdctl fleet status", gone.len());
            Exit::Ok
        }
        Err(e) => unreachable(&e),
    }
}

/// `pdctl fleet pause --reason R` / `unpause`.
pub async fn pause(config: &Path, reason: Option<&str>) -> Exit {
    let f = match fleet_of(config) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let c = EtcdCoordinator::new(&f);
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let p = reason.map(|r| Pause { by: format!("uid {uid} on {}", f.host), reason: r.to_string(), at: fleet::now_secs() });
    match fleet::set_pause(&c, &f.name, p.as_ref()).await {
        Ok(()) if p.is_some() => {
            println!("pdctl: ✓ fleet {} paused: no new slot is granted anywhere (units in progress finish); next: pdctl fleet unpause", f.name);
            Exit::Ok
        }
        Ok(()) => {
            println!("pdctl: ✓ fleet {} unpaused: waiting rollouts take their slots again", f.name);
            Exit::Ok
        }
        Err(e) => unreachable(&e),
    }
}

/// `pdctl fleet restart --rolling`: ask this host's pdctld to start a fleet rollout (it writes the
/// request for every host's pdctld), then follow it.
pub async fn restart(client: &crate::client::Client, config: &Path, req: pdctl_contract::api::FleetRequest, json: bool) -> Exit {
    let started: pdctl_contract::api::Started = match crate::rollout::ask(client, "POST", "/v1/fleet/rollouts", Some(&req)).await {
        Ok(s) => s,
        Err(c) => return c,
    };
    let Some(id) = started.id else {
        eprintln!("pdctl: pdctld started no fleet rollout: {}", started.message.unwrap_or_default());
        return Exit::Unreachable;
    };
    if !json {
        println!("pdctl: fleet rollout {id} started; following it (Ctrl-C detaches: pdctl fleet watch {id})");
    }
    watch(config, &id, json).await
}

/// Fleet rollout `id`'s request as etcd holds it; `Err`: said, with the exit code.
async fn requested(c: &EtcdCoordinator, fleet_name: &str, id: &str) -> Result<pdctl_core::fleet::FleetRollout, Exit> {
    use pdctl_core::ports::Coordinator as _;
    match c.get(&fleet::rollout_key(fleet_name, id)).await {
        Ok(Some(e)) => serde_json::from_slice(&e.value).map_err(|err| {
            eprintln!("pdctl: fleet rollout {id} does not read: {err}");
            Exit::Unreachable
        }),
        Ok(None) => {
            eprintln!("pdctl: no fleet rollout {id} in fleet {fleet_name}; see pdctl fleet status");
            Err(Exit::Usage)
        }
        Err(e) => Err(unreachable(&e)),
    }
}

/// `pdctl fleet watch ID`: every host's events as they are written to etcd (each with its
/// `host`), then the fleet summary; the exit code of the worst host.
pub async fn watch(config: &Path, id: &str, json: bool) -> Exit {
    use pdctl_core::fleet::FleetRollout;
    use pdctl_core::ports::Coordinator as _;
    let f = match fleet_of(config) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let c = EtcdCoordinator::new(&f);
    let r: FleetRollout = match requested(&c, &f.name, id).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    if !json {
        println!(
            "pdctl: fleet rollout {} on {} host(s): {}{} (by {}{})",
            r.id,
            r.hosts.len(),
            r.hosts.join(", "),
            r.canary.as_ref().map(|c| format!("; canary {c} first")).unwrap_or_default(),
            r.by,
            r.reason.as_ref().map(|x| format!(": {x}")).unwrap_or_default()
        );
    }
    // Everything of the rollout: the hosts' lines and summaries, their bakes (updated as they
    // go: shown at each new revision) and reverts, the revert request.
    let prefix = fleet::rollout_prefix(&f.name, id);
    let mut shown: std::collections::BTreeMap<String, i64> = Default::default();
    let mut view = fleet::FleetView::default();
    let mut failures = 0u32;
    let (mut last_look, mut gone_since) = (std::time::Instant::now(), None::<std::time::Instant>);
    loop {
        let mut entries = match c.get_prefix(&prefix).await {
            Ok(e) => {
                failures = 0;
                e
            }
            Err(e) => {
                failures += 1;
                if failures > 10 {
                    return unreachable(&e);
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        // In the order etcd took them (its revisions): the hosts' lines interleaved as they
        // happened, also when a finished rollout is replayed.
        entries.sort_by_key(|e| e.mod_revision);
        for e in entries {
            if shown.get(&e.key) != Some(&e.mod_revision) {
                shown.insert(e.key.clone(), e.mod_revision);
                show_entry(&e, json, &mut view);
            }
        }
        if view.ended(&r) {
            break;
        }
        // A bake or revert waited on whose host's pdctld is gone will never end: said, not
        // waited for forever (three looks 10 s apart).
        let waiting = view.waiting_on(&r);
        if waiting.is_empty() {
            gone_since = None;
        } else if last_look.elapsed() >= std::time::Duration::from_secs(10) {
            last_look = std::time::Instant::now();
            let alive: Vec<String> = fleet::hosts(&c, &f.name).await.map(|h| h.into_iter().map(|h| h.host).collect()).unwrap_or_default();
            let gone: Vec<&String> = waiting.iter().filter(|h| !alive.contains(h)).collect();
            if gone.is_empty() {
                gone_since = None;
            } else if gone_since.get_or_insert_with(std::time::Instant::now).elapsed() >= std::time::Duration::from_secs(25) {
                let hosts = gone.iter().map(|h| h.as_str()).collect::<Vec<_>>().join(", ");
                eprintln!("pdctl: ✗ fleet rollout {id}: waiting on the bake or revert of {hosts}, whose pdctld is not alive: it will not end by itself; next: pdctl fleet status, then pdctl rollout history on {hosts}");
                return Exit::Unreachable;
            }
        }
        // etcd keeps the lines; a short poll reads each once, in order, without a gap.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    conclude(id, &r, &view, json)
}

/// A host's summary (or revert) as one line: its result and why.
fn host_line(s: &HostSummary) -> String {
    let why = s
        .why
        .as_deref()
        .map(|w| format!(": {w}"))
        .or_else(|| s.summary.as_ref().and_then(|x| x.failed.as_ref()).map(|x| format!(": {} failed at {}: {}", x.unit, x.step.as_str(), x.cause)))
        .unwrap_or_default();
    format!("{}{why}", serde_json::to_value(s.result).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default())
}

/// Show one key of a fleet rollout: an event line, a host's summary, its bake, the revert
/// request or a host's revert (each kept in `view`).
fn show_entry(e: &pdctl_core::ports::KvEntry, json: bool, view: &mut fleet::FleetView) {
    use pdctl_core::fleet::{FleetRevert, HostBake, HostEvent};
    let say = |text: String, what: &str, v: serde_json::Value| {
        if json {
            println!("{}", json!({ what: v }));
        } else {
            println!("{text}");
        }
    };
    if e.key.ends_with("/summary") {
        if let Ok(s) = serde_json::from_slice::<HostSummary>(&e.value) {
            if !json {
                println!("  {:<20} {}", s.host, host_line(&s));
            }
            view.summaries.insert(s.host.clone(), s);
        }
    } else if e.key.ends_with("/bake") {
        if let Ok(b) = serde_json::from_slice::<HostBake>(&e.value) {
            let text = match b.state {
                pdctl_core::fleet::BakeState::Baking if b.figures.is_empty() => {
                    format!("  {:<20} bake: watching {} until {}", b.host, b.units.join(", "), fleet::clock(b.ends_at))
                }
                state => {
                    let why = b.why.as_deref().filter(|_| state != pdctl_core::fleet::BakeState::Baking);
                    let figures = b.figures.join("; ");
                    let text = match (figures.is_empty(), why) {
                        (false, Some(w)) => format!("{figures} — {w}"),
                        (false, None) => figures,
                        (true, Some(w)) => w.to_string(),
                        (true, None) => "no figure yet".into(),
                    };
                    format!("  {:<20} bake {}: {text}", b.host, state.as_str())
                }
            };
            say(text, "bake", serde_json::to_value(&b).unwrap_or_default());
            view.bakes.insert(b.host.clone(), b);
        }
    } else if e.key.ends_with("/revert") && e.key.contains("/hosts/") {
        if let Ok(s) = serde_json::from_slice::<HostSummary>(&e.value) {
            say(format!("  {:<20} revert {}", s.host, host_line(&s)), "reverted", serde_json::to_value(&s).unwrap_or_default());
            view.reverted.insert(s.host.clone(), s);
        }
    } else if e.key.ends_with("/revert") {
        if let Ok(rv) = serde_json::from_slice::<FleetRevert>(&e.value) {
            let text = format!("pdctl: ✗ bake breach on {}: {}; reverting {} in that order", rv.by, rv.why, rv.order.join(", "));
            say(text, "revert", serde_json::to_value(&rv).unwrap_or_default());
            view.revert = Some(rv);
        }
    } else if let Ok(h) = serde_json::from_slice::<HostEvent>(&e.value) {
        if json {
            let mut v = serde_json::to_value(&h.event).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("host".into(), json!(h.host));
            }
            println!("{v}");
        } else if h.event.status != pdctl_contract::events::Status::Started {
            println!("  {:<20} {}", h.host, pdctl_core::engine::sentence(&h.event));
        }
    }
}

/// The fleet rollout's last line (or its JSON summary) and the exit code.
fn conclude(id: &str, r: &pdctl_core::fleet::FleetRollout, view: &fleet::FleetView, json: bool) -> Exit {
    use pdctl_contract::api::{FleetSummary, HostResult};
    use pdctl_contract::events::Outcome;
    let s: FleetSummary = fleet::fleet_summary(r, view);
    let word = |v: &HostResult| serde_json::to_value(v).ok().and_then(|x| x.as_str().map(String::from)).unwrap_or_default();
    let parts_ok = s.hosts.values().all(|v| *v == HostResult::Succeeded);
    let exit = view.summaries.values().filter_map(|h| h.summary.as_ref()).filter_map(|x| x.failed.as_ref()).map(|x| x.kind.exit()).next().unwrap_or(
        match (parts_ok, s.result) {
            (true, Outcome::Succeeded) => Exit::Ok,
            (true, _) => Exit::GateFailed,
            (false, _) => Exit::Aborted,
        },
    );
    if json {
        println!("{}", serde_json::to_string(&s).unwrap_or_default());
        return exit;
    }
    match (&view.revert, s.result) {
        (_, Outcome::Succeeded) => {
            let bake = s.bake.as_ref().map(|b| format!("; bake {b}")).unwrap_or_default();
            println!("pdctl: ✓ fleet rollout {id} succeeded on every host ({}){bake}; next: pdctl fleet status", s.hosts.len());
        }
        (Some(rv), Outcome::RolledBack) => println!(
            "pdctl: ✗ fleet rollout {id} rolled back: bake breach on {}: {}; reverted {} to their files from before it, each through every gate; next: pdctl fleet status, then pdctl rollout history on a host",
            rv.by,
            rv.why,
            rv.order.join(", ")
        ),
        (Some(rv), _) if parts_ok => {
            let ends: Vec<String> = rv.order.iter().map(|h| format!("{h} {}", s.reverted.get(h).map(word).unwrap_or_default())).collect();
            let failed = rv.order.iter().find_map(|h| view.reverted.get(h).filter(|x| x.result != HostResult::Succeeded && x.local_id.is_some()));
            let next = match failed {
                Some(x) => format!("pdctl rollout show {} on {}", x.local_id.as_deref().unwrap_or_default(), x.host),
                None => "pdctl fleet status".into(),
            };
            println!("pdctl: ✗ fleet rollout {id}: bake breach on {}: {}; the revert halted ({}); next: {next}", rv.by, rv.why, ends.join(", "));
        }
        _ => {
            let bad: Vec<String> = s.hosts.iter().filter(|(_, v)| **v != HostResult::Succeeded).map(|(h, v)| format!("{h} {}", word(v))).collect();
            println!("pdctl: ✗ fleet rollout {id} halted: {}; next: pdctl fleet status, then pdctl rollout show on the failed host", bad.join(", "));
        }
    }
    exit
}
