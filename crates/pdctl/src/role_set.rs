//! `pdctl role set --dry-run`: which workers would change role and which way, and the run's own
//! preflight of them, here (the run itself is pdctld's).

use std::path::Path;

use pdctl_contract::api::Exit;
use pdctl_core::engine::role_change::{planned, RoleAsk};
use pdctl_core::sglang::role_switch::SwitchPath;

/// What was asked on the command line.
pub struct Ask {
    /// The worker (with `role`).
    pub unit: Option<String>,
    /// Its new role.
    pub role: Option<String>,
    /// `P:D`.
    pub ratio: Option<String>,
}

impl Ask {
    /// The command that runs it.
    fn command(&self) -> String {
        match (&self.unit, &self.role, &self.ratio) {
            (_, _, Some(r)) => format!("pdctl role set --ratio {r}"),
            (Some(u), Some(role), None) => format!("pdctl role set {u} {role}"),
            _ => "pdctl role set UNIT prefill|decode".into(),
        }
    }
}

/// The dry run: the flips pdctld would make, each with its way (a run-time switch, or a
/// restart and why), after the preflight the run starts with; touching nothing.
pub async fn dry_run(config: &Path, ask: &Ask, json: bool, client: &crate::client::Client) -> Exit {
    let ask_core = match RoleAsk::of(ask.unit.as_deref(), ask.role.as_deref(), ask.ratio.as_deref()) {
        Ok(a) => a,
        Err(why) => {
            eprintln!("pdctl: ✗ {why}; nothing was touched; next: pdctl role set --help");
            return Exit::Usage;
        }
    };
    let settings = match crate::context::settings(config) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let engine = match pdctl_real::connect(settings).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("pdctl: ✗ {}; nothing was touched; next: pdctl status", e.cause().sentence());
            return Exit::Unreachable;
        }
    };
    let flips = match engine.role_flips(&ask_core).await {
        Ok(f) => f,
        Err(why) => {
            if json {
                println!("{}", serde_json::json!({ "dry_run": true, "result": "failed", "refused": format!("{why}; nothing was touched") }));
            } else {
                println!("pdctl: ✗ dry run: {why}; nothing was touched; next: pdctl status");
            }
            return Exit::GateFailed;
        }
    };
    // pdctld's view of pending changes (a run-time switch's own drop-in is recorded as running)
    // and each worker's last measured start and window (the restart path's expected time out),
    // when it runs this config.
    let known = crate::context::known_changes(client, config).await;
    if let Some(exit) = preflight(&engine, &flips, json, ask, known.as_ref()).await {
        return exit;
    }
    let paths = engine.role_paths(&flips).await;
    let known = known.unwrap_or_default();
    let timing = |unit: &str| known.get(unit).and_then(|k| k.timing.clone());
    if json {
        let rows: Vec<serde_json::Value> = paths
            .iter()
            .map(|(f, w)| {
                let (path, why) = match &w.path {
                    SwitchPath::Runtime => ("runtime", None),
                    SwitchPath::Restart(why) => ("restart", Some(why.clone())),
                };
                let out = pdctl_core::engine::role_change::expected_out(w, timing(&f.unit).as_ref());
                serde_json::json!({ "unit": f.unit, "from": f.from.as_str(), "to": f.to.as_str(), "path": path, "restart_because": why, "graph_memory_gb": w.graph_memory_gb, "expected_out": out })
            })
            .collect();
        println!("{}", serde_json::json!({ "dry_run": true, "result": "succeeded", "flips": rows }));
        return Exit::Ok;
    }
    if paths.is_empty() {
        println!("pdctl: ✓ dry run: nothing to change (the workers already run these roles); nothing was touched; next: pdctl status");
        return Exit::Ok;
    }
    println!("pdctl: role set would change, one at a time, each drained first and verified after:");
    for (f, p) in &paths {
        println!("  {}", planned(f, p, timing(&f.unit).as_ref()));
    }
    println!("pdctl: ✓ dry run: nothing was touched; next: {}", ask.command());
    Exit::Ok
}

/// The run's preflight of the workers `flips` change, with live output; `Some`: it failed (its
/// events and the failed summary printed as a rolling restart's dry run prints them), the exit.
async fn preflight(
    engine: &pdctl_real::RealEngine,
    flips: &[pdctl_core::sglang::role_switch::Flip],
    json: bool,
    ask: &Ask,
    known: Option<&pdctl_core::engine::KnownChanges>,
) -> Option<Exit> {
    if flips.is_empty() {
        return None;
    }
    let units: Vec<String> = flips.iter().map(|f| f.unit.clone()).collect();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let what = "dry run (preflight only, nothing is touched) of a change of role";
    let printer = tokio::spawn(crate::render::Renderer::for_units_as(json, &units, crate::render::Kind::DryRun, Some(what)).with_next(ask.command()).run(rx));
    let t0 = std::time::Instant::now();
    let failed = engine.role_preflight(flips, &tx, known).await;
    drop(tx);
    let renderer = printer.await.ok();
    let failed = failed?;
    let summary = pdctl_contract::api::Summary::untouched(t0.elapsed().as_millis() as u64, Some(failed));
    if let Some(r) = renderer {
        r.summary(&summary, &crate::render::Epilogue { plan: units, ..Default::default() });
    }
    Some(Exit::of(&summary))
}
