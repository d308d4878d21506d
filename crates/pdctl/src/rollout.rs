//! Commands that go through pdctld: start a rollout and watch it (Ctrl-C detaches; the rollout
//! goes on), watch/abort/resume one, history, and config rollouts (diff, apply).

use pdctl_core::events::{Event, Summary};
use serde_json::{json, Value};

use crate::client::{Client, ClientError};
use crate::context::{code, Kind};
use crate::exit;
use crate::render::Renderer;

fn fail(e: ClientError) -> i32 {
    eprintln!("pdctl: {e}");
    match e {
        ClientError::NotRunning(..) | ClientError::Denied(..) => exit::UNREACHABLE,
        ClientError::Other(_) => exit::UNREACHABLE,
    }
}

fn api_error(status: u16, v: &Value) -> i32 {
    let msg = v.get("error").and_then(Value::as_str).map(String::from).unwrap_or_else(|| v.to_string());
    eprintln!("pdctl: {msg}");
    v.get("exit_code").and_then(Value::as_i64).map(|c| c as i32).unwrap_or(if status == 409 { 4 } else { exit::USAGE })
}

/// Ask pdctld to start a rollout, then watch it.
pub async fn start(client: &Client, req: Value, json: bool) -> i32 {
    let (status, v) = match client.json("POST", "/v1/rollouts", Some(&req)).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if status != 202 && status != 200 {
        return api_error(status, &v);
    }
    let Some(id) = v.get("id").and_then(Value::as_str) else {
        // A config rollout with nothing stale.
        if json {
            println!("{}", json!({ "result": "succeeded", "units": [], "message": v.get("message") }));
        } else {
            println!("pdctl: {}", v.get("message").and_then(Value::as_str).unwrap_or("nothing to do"));
        }
        return exit::OK;
    };
    if !json {
        eprintln!("pdctl: rollout {id} started by pdctld; Ctrl-C detaches (the rollout goes on): pdctl rollout watch {id}");
    }
    watch(client, id, json).await
}

/// Follow a rollout's events from the beginning; returns its exit code.
pub async fn watch(client: &Client, id: &str, json: bool) -> i32 {
    let (status, rec) = match client.json("GET", &format!("/v1/rollouts/{id}"), None).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if status != 200 {
        return api_error(status, &rec);
    }
    let units: Vec<String> =
        rec.get("plan").and_then(Value::as_array).map(|a| a.iter().filter_map(|u| u.as_str().map(String::from)).collect()).unwrap_or_default();
    let mut r = Renderer::for_units(json, &units, Kind::Rollout).with_id(id);
    let mut outcome: Option<i32> = None;
    let mut last: Option<Value> = None;
    let path = format!("/v1/rollouts/{id}/events");
    let stream = client.lines(&path, |v| {
        if v.get("result").is_some() {
            last = Some(v);
        } else if let Ok(e) = serde_json::from_value::<Event>(v) {
            r.event(&e);
        }
    });
    tokio::select! {
        res = stream => {
            if let Err(e) = res {
                return fail(e);
            }
        }
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\npdctl: detached; rollout {id} goes on in pdctld. Re-attach: pdctl rollout watch {id}");
            return exit::OK;
        }
    }
    match last {
        Some(v) => match serde_json::from_value::<Summary>(v.clone()) {
            Ok(s) => {
                outcome = Some(code(&s));
                r.summary(&s);
            }
            Err(_) => {
                if json {
                    println!("{v}");
                } else {
                    let i = &v["interrupted"];
                    println!(
                        "pdctl: rollout {id} was interrupted at {} ({}): pdctld stopped while it ran. Units then: {}",
                        i["unit"].as_str().unwrap_or("?"),
                        i["step"].as_str().unwrap_or("?"),
                        i["units"]
                    );
                    println!("pdctl: nothing resumes by itself; continue with: pdctl rollout resume {id}");
                }
                outcome = Some(exit::GATE_FAILED);
            }
        },
        None => eprintln!("pdctl: the event stream of {id} ended without a summary"),
    }
    outcome.unwrap_or(exit::UNREACHABLE)
}

/// `pdctl rollout abort ID`.
pub async fn abort(client: &Client, id: &str) -> i32 {
    match client.json("POST", &format!("/v1/rollouts/{id}/abort"), None).await {
        Ok((202, v)) => {
            println!("pdctl: {}", v.get("message").and_then(Value::as_str).unwrap_or("aborting"));
            exit::OK
        }
        Ok((s, v)) => api_error(s, &v),
        Err(e) => fail(e),
    }
}

/// GET a JSON document from pdctld, or the exit code of what went wrong.
async fn get(client: &Client, path: &str) -> Result<Value, i32> {
    match client.json("GET", path, None).await {
        Ok((200, v)) => Ok(v),
        Ok((status, v)) => Err(api_error(status, &v)),
        Err(e) => Err(fail(e)),
    }
}

/// `pdctl rollout history`.
pub async fn history(client: &Client, json: bool) -> i32 {
    let v = match get(client, "/v1/rollouts").await {
        Ok(v) => v,
        Err(c) => return c,
    };
    let items = v.get("rollouts").and_then(Value::as_array).cloned().unwrap_or_default();
    if json {
        for i in &items {
            println!("{i}");
        }
        return exit::OK;
    }
    println!("{:<16} {:<8} {:<12} {:<20} DETAIL", "ID", "KIND", "STATE", "CREATED");
    for i in &items {
        let created = i["created_at"]
            .as_u64()
            .map(|s| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s)).to_string())
            .unwrap_or_default();
        let detail = if let Some(f) = i.get("failed").filter(|f| !f.is_null()) {
            format!("{} at {}: {}", f["unit"].as_str().unwrap_or("?"), f["step"].as_str().unwrap_or("?"), f["cause"].as_str().unwrap_or(""))
        } else if let Some(x) = i.get("interrupted").filter(|x| !x.is_null()) {
            format!("interrupted at {} ({})", x["unit"].as_str().unwrap_or("?"), x["step"].as_str().unwrap_or("?"))
        } else {
            i["plan"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")).unwrap_or_default()
        };
        println!(
            "{:<16} {:<8} {:<12} {:<20} {detail}",
            i["id"].as_str().unwrap_or("?"),
            i["kind"].as_str().unwrap_or("?"),
            i["state"].as_str().unwrap_or("?"),
            created
        );
    }
    exit::OK
}

/// `pdctl rollout diff`.
pub async fn diff(client: &Client, json: bool) -> i32 {
    let v = match get(client, "/v1/diff").await {
        Ok(v) => v,
        Err(c) => return c,
    };
    let ws = v.get("workers").and_then(Value::as_array).cloned().unwrap_or_default();
    for w in &ws {
        if json {
            println!("{w}");
        } else if w["stale"] == true {
            println!("{} is stale:", w["unit"].as_str().unwrap_or("?"));
            for r in w["reasons"].as_array().into_iter().flatten() {
                println!("  - {}", r.as_str().unwrap_or(""));
            }
        } else {
            println!("{} runs its current config", w["unit"].as_str().unwrap_or("?"));
        }
    }
    exit::OK
}
