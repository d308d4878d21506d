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
