//! Commands that go through pdctld: start a rollout and watch it (Ctrl-C detaches; the rollout
//! goes on), watch/abort/resume one, history, and config rollouts (diff, apply).

use pdctl_core::api::{AbortAccepted, ApiError, Diff, Exit, History, Record, Request, Started, StreamLine};

use crate::client::{Client, ClientError};
use crate::context::Kind;
use crate::render::Renderer;

fn fail(e: ClientError) -> Exit {
    eprintln!("pdctl: {e}");
    e.exit()
}

fn api_error(e: ApiError) -> Exit {
    eprintln!("pdctl: {}", e.error);
    e.exit_code
}

/// Ask pdctld, or the exit code of what went wrong (printed).
async fn ask<T: serde::de::DeserializeOwned>(client: &Client, method: &str, path: &str, body: Option<&Request>) -> Result<T, Exit> {
    match client.call::<T>(method, path, body).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(api_error(e)),
        Err(e) => Err(fail(e)),
    }
}

/// Ask pdctld to start a rollout, then watch it.
pub async fn start(client: &Client, req: &Request, json: bool) -> Exit {
    let started: Started = match ask(client, "POST", "/v1/rollouts", Some(req)).await {
        Ok(s) => s,
        Err(c) => return c,
    };
    let Some(id) = started.id else {
        // A config rollout with nothing stale.
        let message = started.message.unwrap_or_else(|| "nothing to do".into());
        if json {
            println!("{}", serde_json::json!({ "result": "succeeded", "units": [], "message": message }));
        } else {
            println!("pdctl: {message}");
        }
        return Exit::Ok;
    };
    if !json {
        eprintln!("pdctl: rollout {id} started by pdctld; Ctrl-C detaches (the rollout goes on): pdctl rollout watch {id}");
    }
    watch(client, &id, json).await
}

/// Follow a rollout's events from the beginning; returns its exit code.
pub async fn watch(client: &Client, id: &str, json: bool) -> Exit {
    let rec: Record = match ask(client, "GET", &format!("/v1/rollouts/{id}"), None).await {
        Ok(r) => r,
        Err(c) => return c,
    };
    let mut r = Renderer::for_units(json, &rec.plan, Kind::Rollout);
    let mut last: Option<StreamLine> = None;
    let path = format!("/v1/rollouts/{id}/events");
    let stream = client.lines(&path, |line| match line {
        StreamLine::Event(e) => r.event(&e),
        end => last = Some(end),
    });
    tokio::select! {
        res = stream => {
            if let Err(e) = res {
                return fail(e);
            }
        }
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\npdctl: detached; rollout {id} goes on in pdctld. Re-attach: pdctl rollout watch {id}");
            return Exit::Ok;
        }
    }
    match last {
        Some(StreamLine::Summary(s)) => {
            let code = Exit::of(&s);
            r.summary(&s);
            code
        }
        Some(StreamLine::Interrupted(end)) => {
            if json {
                println!("{}", serde_json::to_string(&end).unwrap_or_default());
            } else {
                let i = &end.interrupted;
                let units: Vec<String> = i
                    .units
                    .iter()
                    .map(|u| match (&u.active_state, &u.sub_state, &u.error) {
                        (Some(a), Some(s), _) => format!("{} {a}/{s}", u.unit),
                        (_, _, Some(e)) => format!("{} unknown ({e})", u.unit),
                        _ => format!("{} unknown", u.unit),
                    })
                    .collect();
                println!(
                    "pdctl: rollout {id} was interrupted at {} ({}): pdctld stopped while it ran. Units then: {}",
                    i.unit.as_deref().unwrap_or("its start"),
                    i.step.map(|s| s.as_str()).unwrap_or("-"),
                    units.join(", ")
                );
                println!("pdctl: nothing resumes by itself; continue with: pdctl rollout resume {id}");
            }
            Exit::GateFailed
        }
        Some(StreamLine::Event(_)) | None => {
            eprintln!("pdctl: the event stream of {id} ended without a summary; see pdctl rollout history");
            Exit::Unreachable
        }
    }
}

/// `pdctl rollout abort ID`.
pub async fn abort(client: &Client, id: &str) -> Exit {
    match ask::<AbortAccepted>(client, "POST", &format!("/v1/rollouts/{id}/abort"), None).await {
        Ok(a) => {
            println!("pdctl: {}", a.message);
            Exit::Ok
        }
        Err(c) => c,
    }
}

/// `pdctl rollout history`.
pub async fn history(client: &Client, json: bool) -> Exit {
    let h: History = match ask(client, "GET", "/v1/rollouts", None).await {
        Ok(v) => v,
        Err(c) => return c,
    };
    if json {
        for i in &h.rollouts {
            println!("{}", serde_json::to_string(i).unwrap_or_default());
        }
        return Exit::Ok;
    }
    println!("{:<16} {:<8} {:<12} {:<20} DETAIL", "ID", "KIND", "STATE", "CREATED");
    for i in &h.rollouts {
        let created = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(i.created_at)).to_string();
        let detail = if let Some(f) = &i.failed {
            format!("{} at {}: {}", f.unit, f.step.as_str(), f.cause)
        } else if let Some(x) = &i.interrupted {
            format!("interrupted at {} ({})", x.unit.as_deref().unwrap_or("its start"), x.step.map(|s| s.as_str()).unwrap_or("-"))
        } else {
            i.plan.join(", ")
        };
        println!("{:<16} {:<8} {:<12} {:<20} {detail}", i.id, i.kind.as_str(), i.state.as_str(), created);
    }
    Exit::Ok
}

/// `pdctl rollout diff`.
pub async fn diff(client: &Client, json: bool) -> Exit {
    let d: Diff = match ask(client, "GET", "/v1/diff", None).await {
        Ok(v) => v,
        Err(c) => return c,
    };
    for w in &d.workers {
        if json {
            println!("{}", serde_json::to_string(w).unwrap_or_default());
        } else if w.stale {
            println!("{} is stale:", w.unit);
            for r in &w.reasons {
                println!("  - {r}");
            }
        } else {
            println!("{} runs its current config", w.unit);
        }
    }
    Exit::Ok
}
