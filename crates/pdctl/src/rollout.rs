//! Commands that go through pdctld: start a rollout and watch it (Ctrl-C detaches; the rollout
//! goes on), watch/abort/resume one, history, and config rollouts (diff, apply).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pdctl_contract::api::{AbortAccepted, ApiError, Diff, Exit, History, Record, Request, Started, StreamLine};
use pdctl_contract::lifecycle::RolloutState;
use pdctl_core::ports::Units as _;

use crate::client::{CallError, Client, ClientError};
use crate::render::{Epilogue, Kind, Renderer};

fn fail(e: ClientError) -> Exit {
    eprintln!("pdctl: {e}");
    e.exit()
}

fn api_error(e: ApiError) -> Exit {
    eprintln!("pdctl: {}", e.error);
    if !e.next.is_empty() {
        eprintln!("pdctl: next: {}", e.next);
    }
    e.exit_code
}

/// The config this command was given is the one pdctld runs with, or the exit code of the
/// refusal (2, printed). Returns this config's identity for the request (pdctld checks again), or
/// `None` where it cannot be read here (pdctld's own config decides). A pdctld too old to say
/// which config it runs with (404) is not compared.
pub async fn same_config(client: &Client, config: &Path, json: bool) -> Result<Option<pdctl_contract::api::ConfigIdentity>, Exit> {
    let Some(ours) = pdctl_core::config::identity(config) else {
        return Ok(None);
    };
    match client.call::<pdctl_contract::api::ConfigIdentity>("GET", "/v1/config", None::<&()>).await {
        Ok(theirs) if theirs.sha256 != ours.sha256 => {
            let c = pdctl_contract::cause::Cause::ConfigMismatch { given: ours.describe(), daemon: theirs.describe() };
            crate::context::refuse(&c, json).map(|()| None)
        }
        Ok(_) | Err(CallError::Refused(_)) => Ok(Some(ours)),
        Err(CallError::Unreachable(e)) => Err(fail(e)),
    }
}

/// Ask pdctld, or the exit code of what went wrong (printed).
/// One call to pdctld; its error (or no answer) printed and turned into the exit code.
pub async fn ask<T: serde::de::DeserializeOwned>(client: &Client, method: &str, path: &str, body: Option<&impl serde::Serialize>) -> Result<T, Exit> {
    match client.call::<T>(method, path, body).await {
        Ok(v) => Ok(v),
        Err(CallError::Refused(e)) => Err(api_error(e)),
        Err(CallError::Unreachable(e)) => Err(fail(e)),
    }
}

/// [`ask`] for a command with `--json`: its error is also the one line on stdout (the `ApiError`
/// object, or `pdctld_unreachable`), as a refused start's is.
pub async fn ask_said<T: serde::de::DeserializeOwned>(client: &Client, path: &str, json: bool) -> Result<T, Exit> {
    said(client.call::<T>("GET", path, None::<&()>).await, json)
}

/// An answer of pdctld, or its error printed (with `--json`, also as the one line on stdout).
fn said<T>(answer: Result<T, CallError>, json: bool) -> Result<T, Exit> {
    match answer {
        Ok(v) => Ok(v),
        Err(CallError::Refused(e)) => {
            if json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            }
            Err(api_error(e))
        }
        Err(CallError::Unreachable(e)) => {
            if json {
                println!("{}", serde_json::json!({ "error": e.to_string(), "exit_code": e.exit(), "cause_code": "pdctld_unreachable" }));
            }
            Err(fail(e))
        }
    }
}

/// Ask pdctld to start a rollout, then watch it. A refusal before the rollout exists prints, with
/// `--json`, the `ApiError` object as its one line (and the sentence on stderr).
pub async fn start(client: &Client, config: &Path, req: &Request, json: bool) -> Exit {
    let started: Started = match said(client.call::<Started>("POST", "/v1/rollouts", Some(req)).await, json) {
        Ok(s) => s,
        Err(code) => return code,
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
    watch(client, config, &id, json).await
}

/// The failed unit's systemd state now, read here (read-only), when the config is readable.
async fn unit_state_now(config: &Path, unit: &str) -> Option<(String, String)> {
    let settings = pdctl_core::config::load(config).ok()?;
    let sd = pdctl_real::SystemdUnits::connect(&settings).await.ok()?;
    let st = sd.state(unit).await.ok()?;
    let inv = st.invocation_id.get(..8).map(|i| format!(", run {i}")).unwrap_or_default();
    Some((unit.to_string(), format!("{}/{}{inv}", st.active_state, st.sub_state)))
}

/// What kind of rollout `rec` is, as its progress display's title says it.
fn what_runs(rec: &Record) -> &'static str {
    match rec.kind {
        pdctl_contract::api::RolloutKind::Restart => "rolling restart (run by pdctld)",
        pdctl_contract::api::RolloutKind::Apply if rec.in_place => "config rollout of new weights, loaded in place (run by pdctld)",
        pdctl_contract::api::RolloutKind::Apply => "config rollout (run by pdctld)",
        pdctl_contract::api::RolloutKind::Resume => "resumed rollout (run by pdctld)",
        pdctl_contract::api::RolloutKind::Revert => "revert (run by pdctld)",
        pdctl_contract::api::RolloutKind::Weights => "weights rollout, every worker at once, without a restart (run by pdctld)",
        pdctl_contract::api::RolloutKind::HostDrain => "host drain for maintenance: every worker out of the gateway and stopped (run by pdctld)",
        pdctl_contract::api::RolloutKind::HostResume => {
            "host resume after maintenance: every worker through its gates, then the slots given back (run by pdctld)"
        }
        pdctl_contract::api::RolloutKind::Role => "change of role: each worker drained, switched (or restarted) into its new role, verified (run by pdctld)",
    }
}

/// Follow a rollout's events from the beginning; returns its exit code.
pub async fn watch(client: &Client, config: &Path, id: &str, json: bool) -> Exit {
    let rec: Record = match ask_said(client, &format!("/v1/rollouts/{id}"), json).await {
        Ok(r) => r,
        Err(c) => return c,
    };
    let what = what_runs(&rec);
    let r = Arc::new(Mutex::new(Renderer::for_units_as(json, &rec.plan, Kind::Rollout, Some(what))));
    lock(&r).note(&format!("pdctl: rollout {id} runs in pdctld; Ctrl-C detaches (the rollout goes on): pdctl rollout watch {id}"));
    let mut last: Option<StreamLine> = None;
    let path = format!("/v1/rollouts/{id}/events");
    // The spinner and the current step's time tick between events.
    let ticker = {
        let r = r.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_millis(100));
            loop {
                t.tick().await;
                lock(&r).redraw();
            }
        })
    };
    let stream = client.lines(&path, |line| match line {
        StreamLine::Event(e) => lock(&r).event(&e),
        end => last = Some(end),
    });
    let res = tokio::select! {
        res = stream => res,
        _ = tokio::signal::ctrl_c() => {
            ticker.abort();
            eprintln!("\npdctl: detached; rollout {id} goes on in pdctld. Re-attach: pdctl rollout watch {id}");
            return Exit::Detached;
        }
    };
    ticker.abort();
    // The ticker holds the renderer until its task has really ended.
    let _ = ticker.await;
    if let Err(e) = res {
        return lost_daemon(id, &e, json);
    }
    let renderer = match Arc::try_unwrap(r) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(_) => {
            eprintln!("pdctl: internal: the progress display is still in use");
            return Exit::Unreachable;
        }
    };
    match last {
        Some(StreamLine::Summary(s)) => {
            let code = Exit::of(&s);
            let rec: Option<Record> = ask(client, "GET", &format!("/v1/rollouts/{id}"), None::<&()>).await.ok();
            let failed_unit = s.failed.as_ref().map(|f| f.unit.clone());
            let unit_state = match failed_unit {
                Some(u) if !json => unit_state_now(config, &u).await,
                _ => None,
            };
            let after = Epilogue {
                load_changes: rec.as_ref().is_some_and(|r| r.load_changes),
                allow_outage: rec.as_ref().is_some_and(|r| r.allow_outage),
                kind: rec.as_ref().map(|r| r.kind),
                in_place: rec.as_ref().is_some_and(|r| r.in_place),
                plan: rec.as_ref().map(|r| r.plan.clone()).unwrap_or_default(),
                notes: rec.map(|r| r.notes).unwrap_or_default(),
                unit_state,
                id: Some(id.to_string()),
            };
            renderer.summary(&s, &after);
            code
        }
        Some(StreamLine::Interrupted(end)) => {
            let rec: Option<Record> = ask(client, "GET", &format!("/v1/rollouts/{id}"), None::<&()>).await.ok();
            let next = rec.map(|r| r.next_after_interruption()).unwrap_or_else(|| format!("pdctl rollout resume {id}"));
            interrupted(id, &end, &next, json)
        }
        Some(StreamLine::Event(_)) | None => {
            eprintln!("pdctl: the event stream of {id} ended without a summary; next: pdctl rollout show {id}");
            Exit::Unreachable
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `pdctl rollout show ID`.
pub async fn show(client: &Client, id: &str, json: bool) -> Exit {
    let rec: Record = match ask_said(client, &format!("/v1/rollouts/{id}"), json).await {
        Ok(r) => r,
        Err(c) => return c,
    };
    if json {
        // One object on one line, as every other command's --json.
        println!("{}", serde_json::to_string(&rec).unwrap_or_default());
        return Exit::Ok;
    }
    let when = |t: u64| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t)).to_string();
    println!("rollout   {} ({})", rec.id, rec.kind.as_str());
    println!("state     {} (since {})", rec.lifecycle.state().as_str(), when(rec.lifecycle.changed_at()));
    // Where it is, only while that is news: a finished rollout's result line says where it ended.
    if let (Some(p), RolloutState::Running | RolloutState::Interrupted) = (rec.lifecycle.position(), rec.lifecycle.state()) {
        println!("at        {} ({})", p.unit, p.step.as_str());
    }
    println!("created   {}", when(rec.created_at));
    if let Some(f) = rec.finished_at {
        println!("finished  {}", when(f));
    }
    println!("plan      {}", rec.plan.join(" → "));
    if let Some(b) = &rec.started_by {
        let who = match (&b.fleet_rollout, &b.fleet_by) {
            (Some(f), Some(by)) => format!("fleet rollout {f} (started by {by})"),
            _ => b.who(),
        };
        println!("by        {who}{}", b.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default());
    }
    if let Some(r) = &rec.resumes {
        println!("resumes   {r}");
    }
    if let Some(by) = rec.lifecycle.resumed_by() {
        println!("resumed by {by}");
    }
    for (u, why) in rec.reasons.iter().filter(|(_, w)| !w.is_empty()) {
        println!("changed   {u}: {}", why.join("; "));
    }
    println!("\n{:<24} {:<30} {:<10} {:<8} {:>8}  DETAIL", "AT", "UNIT", "STEP", "STATUS", "TOOK");
    for e in rec.events.iter().filter(|e| e.status != pdctl_contract::events::Status::Started) {
        let status = format!("{:?}", e.status).to_lowercase();
        let detail = event_detail(&e.detail);
        println!("{:<24} {:<30} {:<10} {:<8} {:>7.1}s  {detail}", e.at, e.unit, e.step.as_str(), status, e.elapsed_ms as f64 / 1000.0);
    }
    if let Some(a) = rec.summary.as_ref().and_then(|s| s.availability.as_ref()) {
        println!(
            "
availability  {}",
            a.sentence()
        );
        for (u, a) in &rec.availability_by_unit {
            println!("  {u}: {}", a.sentence());
        }
    } else if rec.interrupted.is_some() {
        println!("\navailability  not measured: pdctld stopped while it ran (its probe with it); the windows below are from the events and the ledger");
    }
    for (u, w) in &rec.windows {
        println!("window    {u}: {}", w.sentence());
    }
    if let Some(s) = &rec.summary {
        match &s.failed {
            Some(f) => println!("\nresult    {} — {} failed at {} ({}): {}", rec.lifecycle.state().as_str(), f.unit, f.step.as_str(), f.cause_code, f.cause),
            None => println!("\nresult    {} — verified: {}", rec.lifecycle.state().as_str(), s.units.join(", ")),
        }
    }
    if let Some(i) = &rec.interrupted {
        println!(
            "\ninterrupted at {} ({}); next: {}",
            i.unit.as_deref().unwrap_or("its start"),
            i.step.map(|s| s.as_str()).unwrap_or("-"),
            rec.next_after_interruption()
        );
    }
    for n in &rec.notes {
        println!("note      {n}");
    }
    Exit::Ok
}

/// `pdctl rollout abort ID`.
pub async fn abort(client: &Client, id: &str) -> Exit {
    match ask::<AbortAccepted>(client, "POST", &format!("/v1/rollouts/{id}/abort"), None::<&()>).await {
        Ok(a) => {
            println!("pdctl: {}", a.message);
            Exit::Ok
        }
        Err(c) => c,
    }
}

/// `pdctl rollout history`.
pub async fn history(client: &Client, json: bool) -> Exit {
    let h: History = match ask(client, "GET", "/v1/rollouts", None::<&()>).await {
        Ok(v) => v,
        Err(c) => return c,
    };
    if json {
        for i in &h.rollouts {
            println!("{}", serde_json::to_string(i).unwrap_or_default());
        }
        for c in &h.corrupt {
            println!("{}", serde_json::json!({ "state": "corrupt", "file": c.file, "error": c.error }));
        }
        return Exit::Ok;
    }
    // Each column as wide as its longest cell (`host_resume`, `rolled_back`), so none runs into
    // the next.
    let wi = h.rollouts.iter().map(|i| i.id.len()).chain(["ID".len()]).max().unwrap_or(2);
    let wk = h.rollouts.iter().map(|i| i.kind.as_str().len()).chain(["KIND".len()]).max().unwrap_or(4);
    let ws = h.rollouts.iter().map(|i| i.state.as_str().len()).chain(["corrupt".len()]).max().unwrap_or(7);
    println!("{:<wi$} {:<wk$} {:<ws$} {:<20} DETAIL", "ID", "KIND", "STATE", "CREATED");
    for i in &h.rollouts {
        let created = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(i.created_at)).to_string();
        let detail = if let Some(f) = &i.failed {
            format!("{} at {}: {}", f.unit, f.step.as_str(), f.cause)
        } else if let Some(x) = &i.interrupted {
            format!("interrupted at {} ({})", x.unit.as_deref().unwrap_or("its start"), x.step.map(|s| s.as_str()).unwrap_or("-"))
        } else {
            i.plan.join(", ")
        };
        println!("{:<wi$} {:<wk$} {:<ws$} {:<20} {detail}", i.id, i.kind.as_str(), i.state.as_str(), created);
    }
    for c in &h.corrupt {
        println!("{:<wi$} {:<wk$} {:<ws$} {:<20} {}: {}", "?", "?", "corrupt", "?", c.file, c.error);
    }
    Exit::Ok
}

/// A soak's service gate in one cell: the verdict, each figure against its baseline, the sample
/// sizes ("service pass: e2e_p50 0.30s vs 0.30s, error_rate 0.0% vs 0.0% (21 and 106 requests)").
fn service_cell(slo: &serde_json::Value) -> Option<String> {
    let verdict = slo.get("verdict")?.as_str()?;
    if verdict == "not_judged" {
        return Some(format!("service not judged: {}", slo.get("why").and_then(|w| w.as_str()).unwrap_or("too little traffic")));
    }
    let figures: Vec<String> = slo
        .get("figures")?
        .as_array()?
        .iter()
        .filter_map(|f| {
            let (name, v, b) = (f.get("name")?.as_str()?, f.get("value")?.as_f64()?, f.get("baseline")?.as_f64()?);
            Some(if name == "error_rate" { format!("{name} {:.1}% vs {:.1}%", v * 100.0, b * 100.0) } else { format!("{name} {v:.3}s vs {b:.3}s") })
        })
        .collect();
    Some(format!("service {verdict}: {} ({} and {} requests)", figures.join(", "), slo.get("requests")?, slo.get("baseline_requests")?))
}

/// An event's detail in a table cell: the cause, reason or warning when there is one, else its
/// first few plain facts (`key=value`), never an empty cell for an event that has any.
fn event_detail(d: &serde_json::Value) -> String {
    // Details quote workers' answers: made safe for the terminal at this one boundary.
    pdctl_contract::redact::line(&event_detail_raw(d))
}

fn event_detail_raw(d: &serde_json::Value) -> String {
    let said = pdctl_contract::details::Said::of(d);
    if let Some(t) = said.cause.or(said.reason).or(said.warning) {
        return t;
    }
    if let Some(cell) = d.get("slo").and_then(service_cell) {
        return cell;
    }
    let Some(o) = d.as_object() else { return String::new() };
    let cells: Vec<String> = o
        .iter()
        .filter_map(|(k, v)| match v {
            serde_json::Value::String(t) if t.len() <= 40 => Some(format!("{k}={t}")),
            serde_json::Value::Number(n) => Some(format!("{k}={n}")),
            serde_json::Value::Bool(true) => Some(k.clone()),
            _ => None,
        })
        .take(4)
        .collect();
    let mut said = vec![cells.join(" ")];
    // When a worker left the gateway is said whole: the drain's deferral (or why there was
    // none), and the restart's taking out at its server's drain check.
    match d.get("taken_out") {
        Some(serde_json::Value::String(t)) => said.push(format!("taken out: {t}")),
        Some(t @ serde_json::Value::Object(_)) => {
            let when = t.get("when").and_then(|w| w.as_str()).unwrap_or("at its stop");
            let after = t.get("after_ms").and_then(|a| a.as_u64()).map(|ms| format!(", {:.1} s into the stop", ms as f64 / 1000.0)).unwrap_or_default();
            said.push(format!("taken out {when}{after}"));
        }
        _ => {}
    }
    if let Some(n) = d.get("not_deferred").and_then(|n| n.as_str()) {
        said.push(format!("not deferred: {n}"));
    }
    said.retain(|s| !s.is_empty());
    said.join("; ")
}

/// `pdctl rollout diff`.
pub async fn diff(client: &Client, json: bool) -> Exit {
    let d: Diff = match ask(client, "GET", "/v1/diff", None::<&()>).await {
        Ok(v) => v,
        Err(c) => return c,
    };
    if json {
        println!("{}", serde_json::to_string(&d).unwrap_or_default());
        return Exit::Ok;
    }
    for w in &d.workers {
        if w.stale {
            println!("{} is stale:", w.unit);
            for r in &w.reasons {
                println!("  - {r}");
            }
            if let Some(q) = &w.quarantined {
                println!("  quarantined: this change failed in {} ({}); rollout apply skips it until the files change", q.rollout_id, q.cause);
            }
        } else {
            println!("{} runs its current config", w.unit);
        }
    }
    if let Some(a) = &d.apply {
        println!("{a}");
    }
    Exit::Ok
}

/// The stream ended with pdctld stopping while the rollout ran: say where and what to do.
fn interrupted(id: &str, end: &pdctl_contract::api::InterruptedEnd, next: &str, json: bool) -> Exit {
    if json {
        println!("{}", serde_json::to_string(end).unwrap_or_default());
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
        println!("pdctl: ✗ interrupted (rollout {id}); nothing resumes by itself; next: {next}");
    }
    Exit::GateFailed
}

/// pdctld went away while the CLI followed the rollout.
fn lost_daemon(id: &str, e: &ClientError, json: bool) -> Exit {
    // pdctld went away mid-rollout (stopped, crashed, restarted): the rollout is interrupted
    // there and waits for an operator; say which and how to go on.
    eprintln!("pdctl: lost pdctld while following rollout {id}: {e}");
    let next = format!("`pdctl status`, then `pdctl rollout resume {id}`");
    if json {
        println!("{}", serde_json::json!({ "id": id, "result": "interrupted", "error": e.to_string(), "next": next }));
    } else {
        println!(
            "pdctl: ✗ interrupted (rollout {id}): pdctld stopped answering mid-rollout; when pdctld is back, it re-admits any worker it had drained and marks the rollout interrupted; next: {next}"
        );
    }
    e.exit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_soaks_service_gate_reads_in_one_cell() {
        let pass = json!({"held_ms": 5000, "slo": {"verdict": "pass", "requests": 21, "baseline_requests": 106,
            "figures": [{"name": "e2e_p50", "value": 0.3, "baseline": 0.3}, {"name": "error_rate", "value": 0.0, "baseline": 0.0}]}});
        assert_eq!(event_detail(&pass), "service pass: e2e_p50 0.300s vs 0.300s, error_rate 0.0% vs 0.0% (21 and 106 requests)");
        let nj = json!({"note": "x", "slo": {"verdict": "not_judged", "why": "3 requests on the restarted worker, fewer than min_requests = 20"}});
        assert_eq!(event_detail(&nj), "service not judged: 3 requests on the restarted worker, fewer than min_requests = 20");
        // A failed soak says its cause, which names the figure already.
        assert_eq!(event_detail(&json!({"cause": "slow", "slo": {"verdict": "breach"}})), "slow");
    }

    #[test]
    fn when_a_worker_left_the_gateway_is_said_whole() {
        let drain = json!({"looks": 3, "not_deferred": "1 request(s) in flight that a stop would not wait for: taken out now"});
        assert_eq!(event_detail(&drain), "looks=3; not deferred: 1 request(s) in flight that a stop would not wait for: taken out now");
        let restart = json!({"job_ms": 2086, "taken_out": {"after_ms": 2065, "when": "at its server's first drain check: 0 request(s) left"}});
        assert_eq!(event_detail(&restart), "job_ms=2086; taken out at its server's first drain check: 0 request(s) left, 2.1 s into the stop");
    }
}
