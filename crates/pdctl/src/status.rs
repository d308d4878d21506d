//! `pdctl status`: pdctld's state, then per worker the unit's state and run, the router's view,
//! KV usage and requests. Read-only — it sends no request that changes or loads a worker (no
//! `/health`: SGLang's runs a generate) — and works without the daemon. Exit 1 when a worker is
//! not serving (unit not active, or the router does not list it healthy), 3 when systemd cannot
//! be reached.

use std::path::Path;
use std::time::{Duration, SystemTime};

use pdctl_contract::api::{DaemonStatus, Exit};
use pdctl_core::ports::{KvReport, Probes as _, Units as _};
use pdctl_core::service::role_pressure::Load;
use pdctl_real::SystemdUnits;
use serde_json::{json, Value};

use crate::context;

fn since(us: u64) -> (String, String) {
    if us == 0 {
        return ("-".into(), String::new());
    }
    let t = SystemTime::UNIX_EPOCH + Duration::from_micros(us);
    let ago = SystemTime::now().duration_since(t).map(|d| Duration::from_secs(d.as_secs())).unwrap_or_default();
    (humantime::format_rfc3339_seconds(t).to_string(), humantime::format_duration(ago).to_string())
}

/// `12.5% (65536/524288)`.
fn kv_cell(r: &KvReport) -> String {
    match r.max_total_tokens {
        Some(m) if m > 0.0 => format!("{:.1}% ({:.0}/{:.0})", 100.0 * r.used_tokens / m, r.used_tokens, m),
        _ => format!("{:.0}% ({:.0}/?)", 100.0 * r.token_usage, r.used_tokens),
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into())
}

/// Run `pdctl status` (the daemon's state too, when `client` reaches it). Exit 1 when a worker is
/// not serving, else 3 when pdctld cannot be reached (or answers with an error), else 0; with
/// `--json` one object: `{"pdctld": …, "workers": [...], "serving": bool}`.
pub async fn run_with_daemon(config: &Path, json: bool, client: &crate::client::Client) -> Exit {
    let mut daemon_ok = true;
    let mut pairs = Vec::new();
    let line = match client.call::<DaemonStatus>("GET", "/v1/status", None::<&()>).await {
        Ok(v) => {
            if !json {
                match &v.running {
                    Some(id) => println!("pdctld: running rollout {id} (pdctl rollout watch {id})"),
                    None if v.reconciling => println!("pdctld: re-admitting workers it drained before it stopped (no rollout starts until done)"),
                    None => println!(
                        "pdctld: idle; last rollout: {}",
                        v.last.as_ref().map(|l| format!("{} ({}, {})", l.id, l.kind.as_str(), l.state.as_str())).unwrap_or_else(|| "none".into())
                    ),
                }
                if let Some(b) = &v.role_balance {
                    println!("pdctld: role balance ([maintenance] balance_roles): {b}");
                }
                for d in &v.drained {
                    println!("pdctld: ! {} is out of the router by pdctl's hand since rollout {} and not re-admitted yet (not serving)", d.unit, d.rollout_id);
                }
                for u in &v.unresolved {
                    println!("pdctld: ! unresolved: {u}");
                }
                if let Some(e) = &v.record_error {
                    println!("pdctld: ! rollout records are not being saved: {e}; no rollout starts until they are");
                }
                for c in &v.corrupt {
                    println!("pdctld: ! unreadable record {}: {}", c.file, c.error);
                }
                for q in &v.quarantined {
                    println!(
                        "pdctld: ! {}'s current files are a change that failed in {} ({}); rollout apply skips it until they change",
                        q.unit, q.rollout_id, q.cause
                    );
                }
            }
            pairs = v.pairs.clone();
            serde_json::to_value(&v).unwrap_or(Value::Null)
        }
        Err(crate::client::CallError::Refused(e)) => {
            daemon_ok = false;
            if !json {
                println!("pdctld: error: {}", e.error);
            }
            json!({ "state": "error", "error": e.error })
        }
        Err(crate::client::CallError::Unreachable(e)) => {
            daemon_ok = false;
            if !json {
                println!("pdctld: not reachable ({e}): no rollout can be started or followed; next: `systemctl status pdctld`");
            }
            json!({ "state": "not reachable", "error": e.to_string() })
        }
    };
    // A host in maintenance stops its workers on purpose: said first, and the last line's
    // next step is the maintenance's, not `pdctl check`.
    let maintenance = match client.call::<pdctl_contract::api::HostStatus>("GET", "/v1/host", None::<&()>).await {
        Ok(h) => h.maintenance.map(|m| format!("this host is in maintenance ({}, host drain {}, by {})", m.phase.as_str(), m.id, m.by)),
        Err(_) => None,
    };
    if let (Some(m), false) = (&maintenance, json) {
        println!("pdctld: ! {m}: its workers are stopped on purpose until `pdctl host resume` (pdctld runs it by itself after the reboot)");
    }
    let (code, workers, loads) = run(config, json, maintenance.as_deref(), &pairs).await;
    if json {
        let roles = pdctl_core::service::role_pressure::pressure(&loads);
        println!("{}", json!({ "pdctld": line, "workers": workers, "serving": code != Exit::GateFailed, "roles": roles }));
    }
    match code {
        Exit::Ok if !daemon_ok => Exit::Unreachable,
        c => c,
    }
}

/// Each role's pressure, and the ratio it suggests with the command that shows what it would do.
fn say_pressure(p: &pdctl_core::service::role_pressure::Pressure) {
    if let Some(line) = pressure_line(p) {
        println!("{line}");
    }
}

/// [`say_pressure`]'s line (`None`: not a PD host).
pub(crate) fn pressure_line(p: &pdctl_core::service::role_pressure::Pressure) -> Option<String> {
    if p.prefill.workers == 0 || p.decode.workers == 0 {
        return None;
    }
    Some(match &p.suggested_ratio {
        Some(r) => format!("roles: {}:{} now; {}; next: `pdctl role set --ratio {r} --dry-run`", p.prefill.workers, p.decode.workers, p.why),
        None => format!("roles: {}:{} now; {}", p.prefill.workers, p.decode.workers, p.why),
    })
}

/// One worker's figures for the role pressure (`runs`: the role it runs now, else its unit's).
fn load_of(w: &pdctl_core::config::Worker, runs: Option<pdctl_core::config::Role>, kv: &Kv) -> Load {
    Load::of(runs.unwrap_or(w.role), kv.as_ref().ok())
}

/// Every worker asked at once (its unit, its KV, what it serves), each call bounded: one that
/// accepts and never answers costs the command one bound, not one per call. In `workers`' order.
async fn ask_workers(workers: &[pdctl_core::config::Worker], sd: &Result<SystemdUnits, String>, probes: &pdctl_real::HttpProbes) -> Vec<Option<Fetched>> {
    let mut asked = tokio::task::JoinSet::new();
    for (i, w) in workers.iter().enumerate() {
        let (sd, probes, w) = (sd.clone(), probes.clone(), w.clone());
        asked.spawn(async move {
            let state = async {
                match &sd {
                    Ok(sd) => within(&w.unit, async { sd.state(&w.unit).await.map_err(|e| e.to_string()) }).await,
                    Err(e) => Err(e.clone()),
                }
            };
            let kv = within(&w.url, async { probes.kv(&w.url).await.map_err(|e| e.to_string()) });
            // What it serves (`/model_info`: its weight version, and the path after a weights rollout).
            let weights = within(&w.url, async { probes.model_info(&w.url).await.map_err(|e| e.to_string()) });
            // The role it runs now (`/model_info` follows a runtime role switch).
            let role = within(&w.url, async { probes.running_role(&w.url).await.map_err(|e| e.to_string()) });
            let (state, kv, weights, role) = tokio::join!(state, kv, weights, role);
            (i, state, kv, weights.ok(), role.ok().flatten())
        });
    }
    let mut fetched: Vec<Option<Fetched>> = vec![None; workers.len()];
    while let Some(r) = asked.join_next().await {
        if let Ok((i, state, kv, weights, role)) = r {
            if let Some(slot) = fetched.get_mut(i) {
                *slot = Some((state, kv, weights, role));
            }
        }
    }
    fetched
}

/// Each decode's last pair probes ("pdctld: D pairs with: P ok (3m ago, rollout r1)"): a probe
/// is history, so a pair one of whose workers is not serving now says so instead of "ok".
fn print_pairs(pairs: &[pdctl_contract::api::PairStatus], down: &[String]) {
    let mut decodes: Vec<&str> = pairs.iter().map(|p| p.decode.as_str()).collect();
    decodes.dedup();
    for d in decodes {
        let with: Vec<String> = pairs
            .iter()
            .filter(|p| p.decode == d)
            .map(|p| {
                let when = format!("{} ago, rollout {}", age(&p.checked_at), p.rollout_id);
                match [&p.decode, &p.prefill].into_iter().find(|u| down.contains(u)) {
                    Some(u) => format!("{} not now: {u} is not serving (last probe {}: {when})", p.prefill, if p.ok { "ok" } else { p.result.as_str() }),
                    None => format!("{} {} ({when})", p.prefill, if p.ok { "ok" } else { p.result.as_str() }),
                }
            })
            .collect();
        println!("pdctld: {d} pairs with: {}", with.join("; "));
    }
}

/// How long `pdctl status` waits for any one answer (systemd, the gateway, a worker's metrics or
/// model info) before it says that one did not answer.
const STATUS_CALL: Duration = Duration::from_secs(3);

/// `f`, or "WHAT did not answer within 3s".
async fn within<T>(what: &str, f: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(STATUS_CALL, f).await.unwrap_or_else(|_| Err(format!("{what} did not answer within {}s", STATUS_CALL.as_secs())))
}

/// "3m 12s" since an RFC 3339 time ("?" when it does not parse).
fn age(at: &str) -> String {
    match humantime::parse_rfc3339(at).ok().and_then(|t| std::time::SystemTime::now().duration_since(t).ok()) {
        Some(d) => humantime::format_duration(std::time::Duration::from_secs(d.as_secs())).to_string(),
        None => "?".into(),
    }
}

/// The config, and systemd (or why not) with each worker's role as its unit says it (`pdctl role
/// set` changes it there).
async fn connected(config: &Path) -> Result<(pdctl_core::config::Settings, Result<SystemdUnits, String>), Exit> {
    let mut s = context::settings(config)?;
    let sd = within("systemd", async { SystemdUnits::connect(&s).await.map_err(|e| e.to_string()) }).await;
    if let Ok(units) = &sd {
        pdctl_core::engine::role_change::resolve_roles(units, &mut s).await;
    }
    Ok((s, sd))
}

/// Run `pdctl status` for the workers: the table (not with `json`), and each worker's row as
/// JSON, with the exit code.
/// `maintenance`: pdctld said the host is in maintenance (the sentence).
/// `pairs`: pdctld's last pair probe of each decode and prefill, said after the table beside
/// what each worker is now.
pub async fn run(config: &Path, json: bool, maintenance: Option<&str>, pairs: &[pdctl_contract::api::PairStatus]) -> (Exit, Vec<Value>, Vec<Load>) {
    let (s, sd) = match connected(config).await {
        Ok(x) => x,
        Err(c) => return (c, Vec::new(), Vec::new()),
    };
    let mut loads = Vec::new();
    let probes = pdctl_real::probes(&s);
    let router = if s.router.is_some() { Some(within("the gateway", async { probes.router_workers(0).await.map_err(|e| e.to_string()) }).await) } else { None };
    let fetched = ask_workers(&s.workers, &sd, &probes).await;
    let mut errors: Vec<String> = Vec::new();
    let mut not_serving = false;
    let mut down: Vec<String> = Vec::new();
    let mut rows: Vec<Vec<String>> =
        vec![["UNIT", "ROLE", "STATE", "PID", "RUN", "ACTIVE SINCE", "ROUTER", "HEALTHY", "KV USED", "RUNNING", "QUEUED", "WEIGHTS"]
            .map(String::from)
            .to_vec()];
    let mut json_rows = Vec::new();
    for (w, got) in s.workers.iter().zip(fetched) {
        let (state, kv, weights, runs) = got.unwrap_or_else(|| (Err("not asked".into()), Err("not asked".into()), None, None));
        loads.push(load_of(w, runs, &kv));
        // A worker switched to the other role at run time does not serve as configured.
        let switched = runs.filter(|r| *r != w.role && w.role != pdctl_core::config::Role::Regular);
        if switched.is_some() {
            not_serving = true;
            down.push(w.unit.clone());
        }
        let listed = match &router {
            None => None,
            Some(Err(e)) => Some(Err(e.clone())),
            Some(Ok(list)) => Some(Ok(list.iter().find(|x| pdctl_core::config::same_url(&x.url, &w.url)).cloned())),
        };
        let active = state.as_ref().is_ok_and(|st| st.active_state == pdctl_core::ports::ActiveState::Active);
        let healthy_in_router = match &listed {
            None => true,
            Some(Ok(Some(x))) => x.admitted(),
            Some(Ok(None)) | Some(Err(_)) => false,
        };
        if !active || !healthy_in_router {
            not_serving = true;
            down.push(w.unit.clone());
        }
        if json {
            let mut row = json_row(w, &state, &listed, &kv, active && healthy_in_router);
            if let Some(o) = row.as_object_mut() {
                o.insert("weights".into(), weights.map(|(path, version)| json!({ "model_path": path, "weight_version": version })).unwrap_or(Value::Null));
                // The role it runs now (`null`: not reported); `role` is its configured one.
                o.insert("running_role".into(), runs.map(|r| json!(r.as_str())).unwrap_or(Value::Null));
                if switched.is_some() {
                    o.insert("serving".into(), json!(false));
                }
            }
            json_rows.push(row);
            continue;
        }
        let mut row = text_row(w, &state, &listed, &kv, &mut errors);
        if let (Some(runs), Some(cell)) = (switched, row.get_mut(1)) {
            *cell = format!("{cell} (runs {})", runs.as_str());
            // The words of the cause `pdctl check` gives for it, and its next step.
            let c = pdctl_contract::cause::Cause::RoleMismatch {
                unit: w.unit.clone(),
                url: w.url.clone(),
                runs: runs.as_str().into(),
                configured: w.role.as_str().into(),
            };
            errors.push(format!("{}; next: {}", c.sentence(), c.next_step(&w.unit)));
        }
        row.push(weights.map(|(_, version)| version).unwrap_or_else(|| "-".into()));
        rows.push(row);
    }
    if !json {
        print_table(&rows, &[3, 9, 10]);
        print_pairs(pairs, &down);
        say_pressure(&pdctl_core::service::role_pressure::pressure(&loads));
    }
    if !json && !errors.is_empty() {
        println!();
        for e in &errors {
            println!("  {}", pdctl_contract::redact::line(e));
        }
    }
    let code = match sd {
        Err(e) => {
            eprintln!("pdctl: {e}");
            Exit::Unreachable
        }
        Ok(_) if not_serving => {
            if let (Some(m), false) = (maintenance, json) {
                println!("pdctl: ✗ {m}: its workers are not serving on purpose; next: `pdctl host status` (after the reboot, `pdctl host resume`)");
            } else if !json {
                println!(
                    "pdctl: ✗ a worker is not serving (see STATE / ROUTER / HEALTHY); next: `pdctl check` (which gate fails), `journalctl -u UNIT -n 200`"
                );
            }
            Exit::GateFailed
        }
        Ok(_) => Exit::Ok,
    };
    (code, json_rows, loads)
}

/// Print `rows` (the first is the header) in columns as wide as their widest cell; the columns
/// in `right` are right-aligned (numbers).
fn print_table(rows: &[Vec<String>], right: &[usize]) {
    // Cells quote workers' answers (a weight version, an error): made safe for the terminal.
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| pdctl_contract::redact::line(c)).collect()).collect();
    let rows = &rows;
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|x| x.chars().count()).max().unwrap_or(0)).collect();
    for r in rows {
        let cells: Vec<String> =
            r.iter().enumerate().map(|(c, x)| if right.contains(&c) { format!("{x:>w$}", w = width[c]) } else { format!("{x:<w$}", w = width[c]) }).collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

/// What systemd, the gateway and the metrics said of one worker.
type Unit = Result<pdctl_core::ports::UnitState, String>;
/// The gateway's entry for a worker (`None`: no gateway configured).
type Listed = Option<Result<Option<pdctl_core::ports::RouterWorker>, String>>;
/// The worker's KV report.
type Kv = Result<KvReport, String>;
/// What `pdctl status` asked of one worker: its unit, its KV, what it serves (path, version), the
/// role it runs now (`None`: not reported).
type Fetched = (Unit, Kv, Option<(String, String)>, Option<pdctl_core::config::Role>);

/// One worker's `--json` row.
fn json_row(w: &pdctl_core::config::Worker, state: &Unit, listed: &Listed, kv: &Kv, serving: bool) -> Value {
    let mut row = json!({ "unit": w.unit, "role": w.role, "url": w.url, "serving": serving });
    if let Some(o) = row.as_object_mut() {
        match &state {
            Ok(st) => {
                o.insert("active_state".into(), json!(st.active_state.as_str()));
                o.insert("sub_state".into(), json!(st.sub_state.as_str()));
                o.insert("invocation_id".into(), json!(st.invocation_id));
                o.insert("main_pid".into(), json!(st.main_pid));
                o.insert("n_restarts".into(), json!(st.n_restarts));
                o.insert("active_since".into(), json!(since(st.active_enter_us).0));
            }
            Err(e) => {
                o.insert("unit_error".into(), json!(e));
            }
        }
        let in_router = match &listed {
            None => Value::Null,
            Some(Err(e)) => json!({ "error": e }),
            Some(Ok(None)) => json!({ "listed": false }),
            Some(Ok(Some(x))) => {
                json!({ "listed": true, "worker_type": x.worker_type, "is_healthy": x.is_healthy, "status": x.status, "load": x.load, "id": x.id })
            }
        };
        o.insert("router".into(), in_router);
        o.insert(
            "kv".into(),
            match &kv {
                Ok(r) => serde_json::to_value(r).unwrap_or(Value::Null),
                Err(e) => json!({ "error": e }),
            },
        );
    }
    row
}

/// One worker's table row; what could not be read goes to `errors`, shown under the table.
fn text_row(w: &pdctl_core::config::Worker, state: &Unit, listed: &Listed, kv: &Kv, errors: &mut Vec<String>) -> Vec<String> {
    let (state_cell, pid, run, active_since) = match &state {
        Ok(st) => (
            format!("{}/{}", st.active_state, st.sub_state),
            if st.main_pid == 0 { "-".to_string() } else { st.main_pid.to_string() },
            st.invocation_id.get(..8).unwrap_or("-").to_string(),
            since(st.active_enter_us).1,
        ),
        Err(e) => {
            errors.push(format!("{}: systemd: {e}", w.unit));
            ("error".into(), "-".into(), "-".into(), "-".into())
        }
    };
    let (router_cell, healthy_cell) = match &listed {
        None => ("-".to_string(), "-".to_string()),
        Some(Err(e)) => {
            errors.push(format!("{}: router: {e}", w.unit));
            ("error".into(), "-".into())
        }
        Some(Ok(None)) => ("not listed".into(), "no".into()),
        Some(Ok(Some(x))) => (
            x.worker_type.clone(),
            match (x.admitted(), &x.status) {
                (true, _) => "yes".into(),
                (false, Some(st)) => format!("no ({st})"),
                (false, None) => "no".into(),
            },
        ),
    };
    let (kv_cell, running, queued) = match &kv {
        Ok(r) => (kv_cell(r), opt(r.running_reqs), opt(r.queue_reqs)),
        Err(e) => {
            errors.push(format!("{}: metrics: {e}", w.unit));
            ("(see below)".into(), "-".into(), "-".into())
        }
    };
    let ago = if active_since.is_empty() || active_since == "-" { "-".to_string() } else { format!("{active_since} ago") };
    vec![w.unit.clone(), w.role.as_str().into(), state_cell, pid, run, ago, router_cell, healthy_cell, kv_cell, running, queued]
}
