//! `pdctl fleet …`: the fleet's state and an operator's hands on it, straight from etcd (the
//! same keys every pdctld uses, `pdctl_core::fleet`): status, release a dead host's slot, pause
//! and unpause slot grants fleet-wide.

use std::path::Path;

use pdctl_core::api::Exit;
use pdctl_core::config::FleetSettings;
use pdctl_core::fleet::{self, Pause};
use pdctl_core::real::EtcdCoordinator;
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
                if alive(&h.holder) { "" } else { " — its host is not alive: its worker may be down; `pdctl fleet release` frees it" }
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
pub async fn restart(client: &crate::client::Client, config: &Path, req: pdctl_core::api::FleetRequest, json: bool) -> Exit {
    let started: pdctl_core::api::Started = match crate::rollout::ask(client, "POST", "/v1/fleet/rollouts", Some(&req)).await {
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

/// `pdctl fleet watch ID`: every host's events as they are written to etcd (each with its
/// `host`), then the fleet summary; the exit code of the worst host.
pub async fn watch(config: &Path, id: &str, json: bool) -> Exit {
    use pdctl_core::fleet::{FleetRollout, HostSummary};
    use pdctl_core::ports::Coordinator as _;
    let f = match fleet_of(config) {
        Ok(f) => f,
        Err(e) => return e,
    };
    let c = EtcdCoordinator::new(&f);
    let r: FleetRollout = match c.get(&fleet::rollout_key(&f.name, id)).await {
        Ok(Some(e)) => match serde_json::from_slice(&e.value) {
            Ok(r) => r,
            Err(err) => {
                eprintln!("pdctl: fleet rollout {id} does not read: {err}");
                return Exit::Unreachable;
            }
        },
        Ok(None) => {
            eprintln!("pdctl: no fleet rollout {id} in fleet {}; see pdctl fleet status", f.name);
            return Exit::Usage;
        }
        Err(e) => return unreachable(&e),
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
    let prefix = fleet::rollout_hosts_prefix(&f.name, id);
    let mut shown = std::collections::BTreeSet::new();
    let mut summaries: std::collections::BTreeMap<String, HostSummary> = Default::default();
    let mut failures = 0u32;
    loop {
        let entries = match c.get_prefix(&prefix).await {
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
        for e in entries {
            if shown.insert(e.key.clone()) {
                show_entry(&e, json, &mut summaries);
            }
        }
        if r.hosts.iter().all(|h| summaries.contains_key(h)) {
            break;
        }
        // etcd keeps the lines; a short poll reads each once, in order, without a gap.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    conclude(id, &r, &summaries, json)
}

/// Show one key of a fleet rollout's hosts: an event line, or a host's summary (kept in
/// `summaries`).
fn show_entry(e: &pdctl_core::ports::KvEntry, json: bool, summaries: &mut std::collections::BTreeMap<String, pdctl_core::fleet::HostSummary>) {
    use pdctl_core::fleet::{HostEvent, HostSummary};
    if e.key.ends_with("/summary") {
        if let Ok(s) = serde_json::from_slice::<HostSummary>(&e.value) {
            if !json {
                let why = s
                    .why
                    .as_deref()
                    .map(|w| format!(": {w}"))
                    .or_else(|| s.summary.as_ref().and_then(|x| x.failed.as_ref()).map(|x| format!(": {} failed at {}: {}", x.unit, x.step.as_str(), x.cause)))
                    .unwrap_or_default();
                println!("  {:<20} {}{why}", s.host, serde_json::to_value(s.result).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default());
            }
            summaries.insert(s.host.clone(), s);
        }
    } else if let Ok(h) = serde_json::from_slice::<HostEvent>(&e.value) {
        if json {
            let mut v = serde_json::to_value(&h.event).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("host".into(), json!(h.host));
            }
            println!("{v}");
        } else if h.event.status != pdctl_core::events::Status::Started {
            println!("  {:<20} {}", h.host, pdctl_core::engine::sentence(&h.event));
        }
    }
}

/// The fleet rollout's last line (or its JSON summary) and the exit code.
fn conclude(id: &str, r: &pdctl_core::fleet::FleetRollout, summaries: &std::collections::BTreeMap<String, pdctl_core::fleet::HostSummary>, json: bool) -> Exit {
    use pdctl_core::api::{FleetSummary, HostResult};
    let s: FleetSummary = fleet::fleet_summary(r, summaries);
    let exit = summaries
        .values()
        .filter_map(|h| h.summary.as_ref())
        .filter_map(|x| x.failed.as_ref())
        .map(|x| x.kind.exit())
        .next()
        .unwrap_or(if s.hosts.values().all(|v| *v == HostResult::Succeeded) { Exit::Ok } else { Exit::Aborted });
    if json {
        println!("{}", serde_json::to_string(&s).unwrap_or_default());
    } else if exit == Exit::Ok {
        println!("pdctl: ✓ fleet rollout {id} succeeded on every host ({}); next: pdctl fleet status", s.hosts.len());
    } else {
        let bad: Vec<String> = s
            .hosts
            .iter()
            .filter(|(_, v)| **v != HostResult::Succeeded)
            .map(|(h, v)| format!("{h} {}", serde_json::to_value(v).ok().and_then(|x| x.as_str().map(String::from)).unwrap_or_default()))
            .collect();
        println!("pdctl: ✗ fleet rollout {id} halted: {}; next: pdctl fleet status, then pdctl rollout show on the failed host", bad.join(", "));
    }
    exit
}
