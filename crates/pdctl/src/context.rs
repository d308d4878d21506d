//! Settings → drivers → engine, for what the CLI runs itself: `check` and `restart --dry-run`.

use std::path::Path;

use pdctl_contract::api::Exit;
use pdctl_core::config::Settings;
use pdctl_core::engine::KnownChanges;
use pdctl_core::plan::Plan;
use pdctl_real::RealEngine;

use crate::render::{Kind, Renderer};

/// Load the config, printing a clear error (exit 2) on failure.
pub fn settings(path: &Path) -> Result<Settings, Exit> {
    pdctl_core::config::load(path).map_err(|e| {
        eprintln!("pdctl: config error: {e}");
        Exit::Usage
    })
}

/// Before asking pdctld: when the config file is readable here, report its errors (and unknown
/// `--unit`s) at once, exit 2 (with `json`, also as one `ApiError` line on stdout). pdctld reads
/// the same file and checks again.
pub fn validate_locally(path: &Path, only: &[String], json: bool) -> Result<(), Exit> {
    if std::fs::metadata(path).is_err() {
        return Ok(());
    }
    let cause = match pdctl_core::config::load(path) {
        Err(e) => pdctl_contract::cause::Cause::ConfigInvalid { message: e.to_string() },
        Ok(s) => match Plan::new(&s, only) {
            Ok(_) => return Ok(()),
            Err(e) => pdctl_contract::cause::Cause::BadRequest { message: e.to_string() },
        },
    };
    refuse(&cause, json)
}

/// Print a refusal before anything started (stderr; with `json` also the `ApiError` line on
/// stdout) and return its exit code.
pub fn refuse(cause: &pdctl_contract::cause::Cause, json: bool) -> Result<(), Exit> {
    let e = pdctl_contract::api::ApiError::of(cause);
    eprintln!("pdctl: {}", e.error);
    eprintln!("pdctl: next: {}", e.next);
    if json {
        println!("{}", serde_json::to_string(&e).unwrap_or_default());
    }
    Err(e.exit_code)
}

/// Connect the drivers (exit 3 when systemd cannot be reached).
pub async fn engine(settings: Settings) -> Result<RealEngine, Exit> {
    pdctl_real::connect(settings).await.map_err(|e| {
        eprintln!("pdctl: {e}");
        Exit::Unreachable
    })
}

/// Config → plan → connected engine, or the exit code of what went wrong (2 or 3).
async fn prepare(config: &Path, only: &[String]) -> Result<(RealEngine, Plan), Exit> {
    let s = settings(config)?;
    Plan::new(&s, only).map_err(|e| {
        eprintln!("pdctl: {e}");
        Exit::Usage
    })?;
    // The plan's workers with their roles as their units say them (read by the connect).
    let e = engine(s).await?;
    let plan = Plan::new(&e.settings, only).map_err(|e| {
        eprintln!("pdctl: {e}");
        Exit::Usage
    })?;
    Ok((e, plan))
}

/// What pdctld knows of pending changes and quarantines (it keeps the revisions), when it answers
/// and runs with this config; `None` otherwise (the dry run then judges by modification times).
pub async fn known_changes(client: &crate::client::Client, config: &Path) -> Option<KnownChanges> {
    let ours = pdctl_core::config::identity(config)?;
    let theirs = client.call::<pdctl_contract::api::ConfigIdentity>("GET", "/v1/config", None::<&()>).await.ok()?;
    if theirs.sha256 != ours.sha256 {
        return None;
    }
    let diff = client.call::<pdctl_contract::api::Diff>("GET", "/v1/diff", None::<&()>).await.ok()?;
    Some(
        diff.workers
            .into_iter()
            .map(|w| {
                let quarantined = w.quarantined.as_ref().map(|q| q.clause());
                (w.unit, pdctl_core::engine::Known { reasons: w.reasons, quarantined, timing: w.timing })
            })
            .collect(),
    )
}

/// `pdctl restart --rolling --dry-run`: the plan and the preflight verdict, run here (with
/// pdctld's view of pending changes where it can be asked).
pub async fn dry_run(config: &Path, only: &[String], json: bool, allow_outage: bool, load_changes: bool, client: &crate::client::Client) -> Exit {
    let known = known_changes(client, config).await;
    // pdctld refuses every rollout on a host in maintenance: so does its dry run, with the
    // same cause (not a preflight's `peer_role_down` about the stopped workers).
    let maintenance = client.call::<pdctl_contract::api::HostStatus>("GET", "/v1/host", None::<&()>).await.ok().and_then(|h| h.maintenance);
    match prepare(config, only).await {
        Ok((_, plan)) if maintenance.is_some() => {
            let m = maintenance.expect("some");
            let cause = pdctl_contract::cause::Cause::InMaintenance { phase: m.phase.as_str().into(), id: m.id };
            let unit = plan.workers.first().map(|w| w.unit.clone()).unwrap_or_default();
            let failure = pdctl_contract::api::Failure::new(&unit, pdctl_contract::api::Step::Preflight, &cause, Vec::new());
            let summary = pdctl_contract::api::Summary::untouched(0, Some(failure));
            let r = Renderer::new(json, &plan, Kind::DryRun);
            r.summary(&summary, &crate::render::Epilogue { plan: plan.workers.iter().map(|w| w.unit.clone()).collect(), ..Default::default() });
            Exit::of(&summary)
        }
        Ok((engine, plan)) => {
            // The command that does what this previewed: the same units, flags and config.
            let mut next = String::from("pdctl restart --rolling");
            for u in only {
                next.push_str(&format!(" --unit {u}"));
            }
            if allow_outage {
                next.push_str(" --allow-outage");
            }
            if load_changes {
                next.push_str(" --load-changes");
            }
            let given = config.display().to_string();
            if given != "/etc/pdctl/pdctl.toml" && std::env::var("PDCTL_CONFIG").ok().as_deref() != Some(given.as_str()) {
                next.push_str(&format!(" --config {given}"));
            }
            run_read_only(&engine, &plan, json, Some(DryRun { allow_outage, load_changes, known, next })).await
        }
        Err(c) => c,
    }
}

/// `pdctl host drain --dry-run` once pdctld said the host is not in maintenance: the drain's own
/// preflight of every worker (`Engine::host_drain_dry_run`, the code the drain runs), here, with
/// live output; `next` is the command that does what this previewed.
pub async fn host_drain_dry_run(config: &Path, json: bool, allow_outage: bool, next: String) -> Exit {
    let (engine, plan) = match prepare(config, &[]).await {
        Ok(p) => p,
        Err(c) => return c,
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let order: Vec<String> = pdctl_core::engine::host::drain_order_of(&plan.workers).iter().map(|w| w.unit.clone()).collect();
    let renderer = Renderer::for_units_as(json, &order, Kind::DryRun, Some("dry run (preflight only, nothing is touched) of a host drain"));
    let printer = tokio::spawn(renderer.with_next(next).run(rx));
    let summary = engine.host_drain_dry_run(&plan, allow_outage, &tx).await;
    drop(tx);
    if let Ok(r) = printer.await {
        let after = crate::render::Epilogue { plan: plan.workers.iter().map(|w| w.unit.clone()).collect(), ..Default::default() };
        r.summary(&summary, &after);
    }
    Exit::of(&summary)
}

/// What a dry run is given.
struct DryRun {
    allow_outage: bool,
    load_changes: bool,
    known: Option<KnownChanges>,
    /// The command a passed dry run leads to.
    next: String,
}

/// `pdctl check`.
pub async fn check(config: &Path, json: bool, client: &crate::client::Client) -> Exit {
    // This process is not pdctld: ask pdctld, inside its unit's IP sandbox, what it cannot reach.
    if let Ok(r) = client.call::<pdctl_contract::api::ReachReport>("GET", "/v1/reach", None::<&()>).await {
        if !r.blocked.is_empty() {
            for b in &r.blocked {
                eprintln!("pdctl: ✗ pdctld's unit does not let it connect to {} ({}): its IP sandbox allows loopback only", b.url, b.what);
            }
            println!("pdctl: ✗ check failed: pdctld cannot reach {} configured address(es); next: pdctl unit-dropin --write, systemctl daemon-reload, restart pdctld while idle", r.blocked.len());
            return Exit::Usage;
        }
    }
    match prepare(config, &[]).await {
        Ok((engine, plan)) => run_read_only(&engine, &plan, json, None).await,
        Err(c) => c,
    }
}

/// Run the read-only parts of the engine here (`dry`: preflight only; else `check`) with live
/// output; returns the exit code. Rollouts themselves run in pdctld.
/// `dry`: `Some` for a dry run, `None` for check.
async fn run_read_only(engine: &RealEngine, plan: &Plan, json: bool, dry: Option<DryRun>) -> Exit {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let renderer = Renderer::new(json, plan, if dry.is_some() { Kind::DryRun } else { Kind::Check });
    let renderer = match &dry {
        Some(d) => renderer.with_next(d.next.clone()),
        None => renderer,
    };
    let printer = tokio::spawn(renderer.run(rx));
    let summary = match dry {
        Some(d) => engine.dry_run(plan, &tx, d.allow_outage, d.load_changes, d.known.as_ref()).await,
        None => engine.check(plan, &tx).await,
    };
    drop(tx);
    let renderer = printer.await.ok();
    if let Some(r) = renderer {
        let after = crate::render::Epilogue { plan: plan.workers.iter().map(|w| w.unit.clone()).collect(), ..Default::default() };
        r.summary(&summary, &after);
    }
    Exit::of(&summary)
}

/// `pdctl rollout weights --dry-run`: each worker's weights now (read-only `/model_info`) and
/// what the rollout would do; touches nothing. Exit 1 when a worker's weights cannot be read (the
/// rollout would refuse in its preflight), 2 with `[fleet]` (refused).
pub async fn weights_dry_run(config: &Path, model_path: &str, version: Option<&str>, json: bool) -> Exit {
    use pdctl_core::ports::Probes as _;
    let s = match settings(config) {
        Ok(s) => s,
        Err(e) => return e,
    };
    if s.fleet.is_some() {
        eprintln!("pdctl: ✗ rollout weights loads every worker of one host at once; with [fleet] other hosts' workers would pair with them across versions; nothing was touched; next: pdctl fleet weights --model-path {model_path}");
        return Exit::Usage;
    }
    // The real run refuses a checkpoint directory that is not on this host: so does its dry run.
    if let Some(why) = pdctl_core::sglang::model_dir_problem(model_path, false) {
        println!("pdctl: ✗ dry run: {why}; nothing was touched; next: pdctl rollout weights --model-path PATH --dry-run with the checkpoint in place");
        return Exit::Usage;
    }
    let probes = pdctl_real::probes(&s);
    let mut rows = Vec::new();
    let mut unreadable = 0;
    for w in &s.workers {
        let now = probes.model_info(&w.url).await;
        if now.is_err() {
            unreadable += 1;
        }
        rows.push((w, now));
    }
    let to = version.map(|v| format!("{model_path} (weight_version {v})")).unwrap_or_else(|| model_path.to_string());
    if json {
        let workers: Vec<serde_json::Value> = rows
            .iter()
            .map(|(w, now)| match now {
                Ok((path, ver)) => serde_json::json!({ "unit": w.unit, "role": w.role.as_str(), "model_path": path, "weight_version": ver }),
                Err(e) => serde_json::json!({ "unit": w.unit, "role": w.role.as_str(), "error": e.to_string() }),
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "dry_run": true, "model_path": model_path, "weight_version": version, "workers": workers, "capacity_during_load": 0 })
        );
    } else {
        println!("pdctl: rollout weights would load {to} into every worker of this host at once, without a restart:");
        for (w, now) in &rows {
            match now {
                Ok((path, ver)) => println!("  {:<32} {:<8} serves {path} (weight_version {ver})", w.unit, w.role.as_str()),
                Err(e) => println!("  {:<32} {:<8} its weights cannot be read: {e}", w.unit, w.role.as_str()),
            }
        }
        println!("capacity: every worker is paused for the load (requests wait at their admission, none fails unless the load outlives the clients' and the gateway's timeouts); then pair, health, router and metrics gates; a failure loads the previous weights back everywhere");
    }
    if unreadable > 0 {
        println!("pdctl: ✗ dry run: {unreadable} worker(s) cannot say what they serve: the rollout would stop in its preflight; nothing was touched; next: pdctl check");
        return Exit::GateFailed;
    }
    if !json {
        println!(
            "pdctl: ✓ dry run: nothing was touched; next: pdctl rollout weights --model-path {model_path}{}",
            version.map(|v| format!(" --version {v}")).unwrap_or_default()
        );
    }
    Exit::Ok
}
