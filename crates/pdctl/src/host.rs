//! `pdctl host drain | resume | status`: host maintenance (a driver, CUDA or kernel update that
//! reboots the host), run by pdctld as rollouts of their own kind.

use std::path::Path;

use pdctl_contract::api::{Exit, HostStatus, Request};

use crate::client::Client;
use crate::rollout;

/// `pdctl host status`: this host's maintenance and whether one may begin now.
pub async fn status(client: &Client, json: bool) -> Exit {
    let s: HostStatus = match rollout::ask_said(client, "/v1/host", json).await {
        Ok(s) => s,
        Err(c) => return c,
    };
    if json {
        println!("{}", serde_json::to_string(&s).unwrap_or_default());
        return Exit::Ok;
    }
    for line in describe(&s) {
        println!("{line}");
    }
    Exit::Ok
}

/// The status as lines, the outcome and what to do next last.
fn describe(s: &HostStatus) -> Vec<String> {
    let mut out = Vec::new();
    match &s.fleetlock {
        Some(addr) => out.push(format!(
            "FleetLock endpoint: http://{addr} (id {}, group {})",
            s.fleetlock_id.as_deref().unwrap_or("?"),
            s.fleetlock_group.as_deref().unwrap_or("?")
        )),
        None => out.push("FleetLock endpoint: none ([maintenance] fleetlock_listen)".into()),
    }
    match &s.maintenance {
        None => {
            out.push(match &s.waits {
                Some(why) => format!("a maintenance would wait now: {why}"),
                None => "a maintenance may begin now".into(),
            });
            out.push("pdctl: this host is in service; next: pdctl host drain --reason \"…\" before a reboot".into());
        }
        Some(m) => {
            for u in &m.units {
                out.push(format!("  {:<40} {}", u.unit, if u.stopped { "stopped by the drain" } else { "not stopped" }));
            }
            if let Some(f) = &m.failed {
                out.push(format!("failed: {f}"));
            }
            let next = match m.phase {
                pdctl_contract::records::MaintenancePhase::Down => {
                    "reboot the host; then pdctl host resume (pdctld resumes by itself at its start after the reboot)"
                }
                pdctl_contract::records::MaintenancePhase::Failed => "fix what failed, then pdctl host resume (the host keeps its slots until then)",
                _ => "pdctl rollout watch ID (below)",
            };
            out.push(format!(
                "pdctl: this host is in maintenance: {} since {} (host drain {}, by {}); next: {}",
                m.phase.as_str(),
                pdctl_core::fleet::clock(m.since),
                m.id,
                m.by,
                next.replace("ID (below)", &m.id)
            ));
        }
    }
    out
}

/// `pdctl host drain` / `pdctl host resume`: started in pdctld and followed as a rollout.
pub async fn start(client: &Client, config: &Path, req: Request, json: bool) -> Exit {
    let identity = match rollout::same_config(client, config, json).await {
        Ok(i) => i,
        Err(c) => return c,
    };
    let req = match req {
        Request::HostDrain { allow_outage, reason, .. } => Request::HostDrain { allow_outage, reason, config: identity },
        Request::HostResume { reason, .. } => Request::HostResume { reason, config: identity },
        other => other,
    };
    rollout::start(client, config, &req, json).await
}

/// `pdctl host drain --dry-run`: what pdctld would do now, touching nothing — refused as the
/// drain would be: in maintenance already (pdctld's record, exit 4), or by the drain's own
/// preflight of each worker, run here (`only_worker_of_role` exit 2, an unsafe `KillMode`…).
pub async fn dry_run(client: &Client, config: &Path, json: bool, allow_outage: bool) -> Exit {
    let s: HostStatus = match rollout::ask_said(client, "/v1/host", json).await {
        Ok(s) => s,
        Err(c) => return c,
    };
    let settings = match pdctl_core::config::load(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pdctl: {e}");
            return Exit::Usage;
        }
    };
    let units: Vec<String> = pdctl_core::engine::host::drain_order_of(&settings.workers).iter().map(|w| w.unit.clone()).collect();
    if let Some(m) = &s.maintenance {
        let refused = format!("this host is in maintenance already ({}, host drain {})", m.phase.as_str(), m.id);
        if json {
            println!("{}", serde_json::json!({ "dry_run": true, "order": units, "refused": refused, "waits": s.waits, "fleet": settings.fleet.is_some() }));
        } else {
            println!("pdctl: dry run: refused: {refused}; next: pdctl host status");
        }
        return Exit::Busy;
    }
    if !json {
        let budget = if settings.fleet.is_some() {
            "a slot of each worker's role in the fleet's budget, all in one etcd transaction"
        } else {
            "this host's own budget (a role left with no worker behind the gateway is refused without --allow-outage)"
        };
        println!("pdctl host drain would take {budget}, then take out of the gateway and stop, in this order: {}", units.join(", "));
        if let Some(w) = &s.waits {
            println!("it would wait now: {w}");
        }
    }
    let next = if allow_outage { "pdctl host drain --allow-outage" } else { "pdctl host drain" };
    crate::context::host_drain_dry_run(config, json, allow_outage, next.to_string()).await
}
