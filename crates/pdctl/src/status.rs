//! `pdctl status`: per worker, the unit's state and run, the router's view, KV usage and requests.
//! Read-only; works without the daemon.

use std::path::Path;
use std::time::{Duration, SystemTime};

use pdctl_core::api::{DaemonStatus, Exit};
use pdctl_core::ports::{KvReport, Probes as _, Units as _};
use pdctl_core::real::SystemdUnits;
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

fn kv_text(kv: &Result<KvReport, String>) -> (String, String, String) {
    match kv {
        Ok(r) => (
            match r.max_total_tokens {
                Some(m) => format!("{:.0}/{:.0} ({:.2})", r.used_tokens, m, r.token_usage),
                None => format!("{:.0}/? ({:.2})", r.used_tokens, r.token_usage),
            },
            r.running_reqs.map(|v| format!("{v:.0}")).unwrap_or("-".into()),
            r.queue_reqs.map(|v| format!("{v:.0}")).unwrap_or("-".into()),
        ),
        Err(e) => (format!("({})", e.split(':').next().unwrap_or(e)), "-".into(), "-".into()),
    }
}

/// Run `pdctl status` (the daemon's state too, when `client` reaches it).
pub async fn run_with_daemon(config: &Path, json: bool, client: &crate::client::Client) -> Exit {
    let line = match client.call::<DaemonStatus>("GET", "/v1/status", None::<&()>).await {
        Ok(Ok(v)) => match v.running {
            Some(id) => json!({ "pdctld": "running a rollout", "rollout": id }),
            None => json!({ "pdctld": "idle", "last": v.last }),
        },
        Ok(Err(e)) => json!({ "pdctld": "error", "detail": e.error }),
        Err(e) => json!({ "pdctld": "not reachable", "detail": e.to_string() }),
    };
    if json {
        println!("{line}");
    } else {
        match line["pdctld"].as_str() {
            Some("running a rollout") => println!(
                "pdctld: running rollout {} (pdctl rollout watch {})",
                line["rollout"].as_str().unwrap_or("?"),
                line["rollout"].as_str().unwrap_or("?")
            ),
            Some("idle") => println!(
                "pdctld: idle; last rollout: {}",
                if line["last"].is_null() {
                    "none".to_string()
                } else {
                    format!("{} ({})", line["last"]["id"].as_str().unwrap_or("?"), line["last"]["state"].as_str().unwrap_or("?"))
                }
            ),
            _ => println!("pdctld: not reachable ({})", line["detail"].as_str().unwrap_or("")),
        }
    }
    run(config, json).await
}

/// Run `pdctl status`.
pub async fn run(config: &Path, json: bool) -> Exit {
    let s = match context::settings(config) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let sd = SystemdUnits::connect(&s).await;
    let probes = pdctl_core::real::probes(&s);
    let router = if s.router.is_some() { Some(probes.router_workers().await.map_err(|e| e.to_string())) } else { None };
    let mut rows: Vec<Value> = Vec::new();
    for w in &s.workers {
        let state = match &sd {
            Ok(sd) => sd.state(&w.unit).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let kv = probes.kv(&w.url).await.map_err(|e| e.to_string());
        let in_router = match &router {
            None => Value::Null,
            Some(Err(e)) => json!({ "error": e }),
            Some(Ok(list)) => match list.iter().find(|x| x.url == w.url) {
                Some(x) => {
                    json!({ "listed": true, "worker_type": x.worker_type, "is_healthy": x.is_healthy, "load": x.load, "id": x.id })
                }
                None => json!({ "listed": false }),
            },
        };
        let (since_at, ago) = state.as_ref().map(|st| since(st.active_enter_us)).unwrap_or_default();
        let mut row = json!({
            "unit": w.unit, "role": w.role, "url": w.url,
            "router": in_router,
        });
        if let Some(o) = row.as_object_mut() {
            match &state {
                Ok(st) => {
                    o.insert("active_state".into(), json!(st.active_state));
                    o.insert("sub_state".into(), json!(st.sub_state));
                    o.insert("invocation_id".into(), json!(st.invocation_id));
                    o.insert("main_pid".into(), json!(st.main_pid));
                    o.insert("n_restarts".into(), json!(st.n_restarts));
                    o.insert("active_since".into(), json!(since_at));
                }
                Err(e) => {
                    o.insert("unit_error".into(), json!(e));
                }
            }
            match &kv {
                Ok(r) => o.insert("kv".into(), serde_json::to_value(r).unwrap_or(Value::Null)),
                Err(e) => o.insert("kv".into(), json!({ "error": e })),
            };
        }
        if json {
            println!("{row}");
        } else {
            if rows.is_empty() {
                println!(
                    "{:<30} {:<16} {:>7}  {:<9} {:<34} {:<18} {:<26} {:>4} {:>5}",
                    "UNIT", "STATE", "PID", "RUN", "ACTIVE SINCE", "ROUTER", "KV USED/MAX (USAGE)", "RUN", "QUEUE"
                );
            }
            let (kvs, run, queue) = kv_text(&kv);
            let router_s = match &row["router"] {
                Value::Null => "-".to_string(),
                r if r["listed"] == true => {
                    format!("{} {}", r["worker_type"].as_str().unwrap_or("?"), if r["is_healthy"] == true { "healthy" } else { "UNHEALTHY" })
                }
                r if r["listed"] == false => "NOT LISTED".into(),
                _ => "unreachable".into(),
            };
            match &state {
                Ok(st) => println!(
                    "{:<30} {:<16} {:>7}  {:<9} {:<34} {:<18} {:<26} {:>4} {:>5}",
                    w.unit,
                    format!("{}/{}", st.active_state, st.sub_state),
                    st.main_pid,
                    st.invocation_id.get(..8).unwrap_or("-"),
                    format!("{since_at} ({ago} ago)"),
                    router_s,
                    kvs,
                    run,
                    queue
                ),
                Err(e) => println!("{:<30} {e}", w.unit),
            }
        }
        rows.push(row);
    }
    match sd {
        Ok(_) => Exit::Ok,
        Err(e) => {
            eprintln!("pdctl: {e}");
            Exit::Unreachable
        }
    }
}
