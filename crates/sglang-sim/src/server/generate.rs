//! The generate endpoints (native and OpenAI-style, streaming or not), PD's part of a request,
//! and the fault knobs that act on requests.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::args::Mode;
use crate::engine::token_interval;
use crate::log;
use crate::pd::{self, Bootstrap};

use super::{approx_tokens, bad_request, parse_body, unix_now, App, Tracked, ABORTED};

/// What one request asks for, whatever API it came through.
pub(crate) struct Job {
    /// The request's id.
    rid: String,
    prompt_tokens: u64,
    max_new: u64,
    stream: bool,
    /// When the request arrived (time to first token and end-to-end latency count from here).
    arrived: Instant,
}

/// The answer of a request the `--sim-fail-fraction` fault failed.
pub(crate) const FAILED: &str = "Internal server error (simulated: --sim-fail-fraction)";

/// Whether this request is one the `--sim-fail-fraction` fault fails (only after the ready line,
/// and `--sim-faults-after` past it: the fault is a change that started fine).
fn fails_by_fault(app: &App) -> bool {
    let p = app.engine.config().sim.fail_fraction;
    p > 0.0 && app.service_faults_on() && ((crate::ids::rand_u128() % 1_000_000) as f64) < p * 1_000_000.0
}

pub(crate) fn log_request(kind: &str, body: &Value) {
    let s = |k: &str| body.get(k).map(|v| v.to_string()).unwrap_or_else(|| "None".into());
    log::line(&format!(
        "Receive: obj={kind}(rid={}, bootstrap_host={}, bootstrap_port={}, bootstrap_room={})",
        s("rid"),
        s("bootstrap_host"),
        s("bootstrap_port"),
        s("bootstrap_room")
    ));
}

pub(crate) const WORDS: &[&str] = &[" Paris", " is", " the", " capital", " of", " France", ".", " It"];

/// The PD side of a request before it runs: a decode needs the bootstrap fields (400 without)
/// and gets the room's KV from its prefill first (500 with SGLang's abort message when that
/// fails); a prefill returns the room to hold once its batch is done. Requests with the fake
/// bootstrap host (SGLang's own warmup) skip the transfer.
pub(crate) async fn pd_before(app: &App, v: &Value, rid: &str, tracked: &mut Tracked) -> Result<Option<Bootstrap>, Response> {
    let mode = app.engine.mode();
    if app.role_switch.broken() {
        return Err(pd::abort("The scheduler's disaggregation queues were torn down by a failed PD role switch; restart required (simulated)."));
    }
    let b = Bootstrap::of(v);
    match (mode, b) {
        // `managers/scheduler.py` (0.5.23): both roles refuse a request without a room.
        (Mode::Decode | Mode::Prefill, None) => {
            let m = format!("Invalid request: Disaggregated request received without bootstrap room id. req.rid='{rid}'");
            log::line(&m);
            Err(bad_request(&m))
        }
        (Mode::Decode, Some(b)) if !b.fake() => tokio::select! {
            r = app.pd.receive(rid, &b) => match r {
                Ok(kv) => {
                    tracked.kv = Some((kv, app.engine.retractions()));
                    tracked.bootstrap = Some(b);
                    Ok(None)
                }
                Err(m) => Err(pd::abort(&m)),
            },
            () = tracked.aborted() => {
                app.engine.count_abort();
                Err(pd::abort(ABORTED))
            }
        },
        (Mode::Prefill, Some(b)) if !b.fake() => Ok(Some(b)),
        _ => Ok(None),
    }
}

/// A request's place in the running batch. One whose HTTP exchange is dropped midway (the client
/// or the gateway went away: hyper drops the handler) leaves it, as SGLang 0.5.23 aborts a
/// request whose client disconnected (`managers/tokenizer_manager.py`: `is_disconnected()` →
/// `abort_request`, noticed within its 4 s wait for a non-streaming request) — instead of being
/// counted as running, in `/v1/loads`, until the server stops.
struct InBatch<'a> {
    engine: &'a crate::engine::Engine,
    ticket: Option<crate::engine::Ticket>,
}

impl InBatch<'_> {
    /// Finished (or aborted and counted by the caller): its tokens go back now.
    fn finish(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.engine.finish(t);
        }
    }
}

impl Drop for InBatch<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.engine.finish(t);
            self.engine.count_abort();
        }
    }
}

/// Run a request through the engine; `on_token` sees each generated piece. A PD prefill holds
/// the room's KV for its decode (`hold`) instead of finishing; `Err` is the abort message.
pub(crate) async fn execute(
    app: &App,
    job: &Job,
    hold: Option<(&str, &Bootstrap)>,
    tracked: &mut Tracked,
    mut on_token: impl FnMut(usize, &str) -> bool,
) -> Result<u64, String> {
    let engine = &app.engine;
    if fails_by_fault(app) {
        if let Some((_, b)) = hold {
            app.pd.abort_room(b.room);
        }
        return Err(FAILED.into());
    }
    // The `--sim-slowdown` fault acts from the ready line (and `--sim-faults-after`) on.
    let factor = if app.service_faults_on() { engine.config().sim.slowdown } else { 1.0 };
    let mode = engine.mode();
    let mut ticket = InBatch { engine, ticket: Some(engine.admit(job.prompt_tokens)) };
    if mode != Mode::Decode && !engine.config().sim.prefill.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(engine.config().sim.prefill.mul_f64(factor)) => {}
            () = tracked.aborted() => {
                ticket.finish();
                engine.count_abort();
                return Err(ABORTED.into());
            }
        }
    }
    // A PD prefill server only runs the prefill (and the first token).
    let n = if mode == Mode::Prefill { 1 } else { job.max_new };
    let mut produced = 0;
    let mut tick = tokio::time::interval(token_interval(engine.config()).mul_f64(factor));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last = Instant::now();
    // Decode: the retractions counted when its KV came (each later one rebootstraps it).
    let mut retractions_seen = tracked.kv.as_ref().map(|(_, at)| *at);
    for i in 0..n as usize {
        // Paused in place (or retracted): it stops here until the continue. A decode's request
        // retracted by a pause (however short: the real scheduler retracts at the pause) is
        // rebootstrapped through its prefill then.
        app.control.hold_while_paused().await;
        if let (Some(b), Some(seen)) = (&tracked.bootstrap, retractions_seen.as_mut()) {
            let now = engine.retractions();
            if *seen != now {
                *seen = now;
                if let Err(m) = app.pd.rebootstrap(&job.rid, b).await {
                    ticket.finish();
                    return Err(m);
                }
            }
        }
        tokio::select! {
            _ = tick.tick() => {}
            () = tracked.aborted() => {
                ticket.finish();
                engine.count_abort();
                return Err(ABORTED.into());
            }
        }
        if let Some(t) = ticket.ticket.as_mut() {
            engine.decode_step(t);
        }
        produced += 1;
        // A PD prefill never observes time to first token (nor, then, inter-token latency).
        if mode != Mode::Prefill {
            if i == 0 {
                engine.observe_first_token(job.stream, job.arrived.elapsed().as_secs_f64());
            } else {
                engine.observe_later_tokens(last.elapsed().as_secs_f64(), 1);
            }
            last = Instant::now();
        }
        if !on_token(i, WORDS[i % WORDS.len()]) {
            break;
        }
    }
    finished(app, job, hold, &mut ticket, tracked, produced).await?;
    Ok(produced)
}

/// A request's end: a PD prefill holds the room's KV for its decode (`hold`), else its tokens
/// leave the batch; a decode counts the weights its KV was computed with; the latencies.
async fn finished(app: &App, job: &Job, hold: Option<(&str, &Bootstrap)>, ticket: &mut InBatch<'_>, tracked: &Tracked, produced: u64) -> Result<(), String> {
    let engine = &app.engine;
    match (hold, ticket.ticket.take()) {
        (Some((rid, b)), Some(t)) => app.pd.hold(rid, b, t).await?,
        (_, t) => {
            if let Some(t) = t {
                engine.finish(t);
            }
        }
    }
    if let Some((kv, at)) = &tracked.kv {
        // Retracted meanwhile: the decode recomputed it with the weights it serves now.
        let kv = if *at == engine.retractions() { kv.clone() } else { engine.weights().identity() };
        engine.count_decoded(&kv);
    }
    engine.observe_finished(job.stream, job.arrived.elapsed().as_secs_f64(), job.prompt_tokens, produced);
    Ok(())
}

pub(crate) fn sse(rx: tokio::sync::mpsc::UnboundedReceiver<String>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|chunk| (Ok::<_, Infallible>(Bytes::from(chunk)), rx)) });
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], Body::from_stream(stream)).into_response()
}

/// `POST /sim/fail_generate?secs=N` (a simulator knob, not SGLang's): generation fails with 500
/// for the next N seconds, as a server whose scheduler is wedged would answer.
pub(crate) async fn fail_generate(
    State(app): State<App>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let secs: f64 = q.get("secs").and_then(|s| s.parse().ok()).unwrap_or(0.0);
    *app.fail_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + Duration::from_secs_f64(secs.max(0.0)));
    log::line(&format!("simulated fault: generation fails for {secs} s"));
    StatusCode::OK.into_response()
}

/// `POST /sim/faults_now` (a simulator knob): the service faults set in now rather than
/// `--sim-faults-after` seconds after the ready line.
pub(crate) async fn faults_now(State(app): State<App>) -> Response {
    app.faults_now.store(true, std::sync::atomic::Ordering::SeqCst);
    log::line("simulated fault: the service faults act from now on");
    StatusCode::OK.into_response()
}

/// `POST /sim/stall_transfers?secs=N` (a simulator knob): on a decode, requests arriving in the
/// next N seconds wait N seconds before they fetch their KV.
pub(crate) async fn stall_transfers(
    State(app): State<App>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let secs: f64 = q.get("secs").and_then(|s| s.parse().ok()).unwrap_or(0.0);
    app.pd.stall_transfers(secs);
    StatusCode::OK.into_response()
}

pub(crate) fn failing(app: &App) -> Option<Response> {
    let until = *app.fail_until.lock().unwrap_or_else(|p| p.into_inner());
    until
        .filter(|u| Instant::now() < *u)
        .map(|_| (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": {"message": "simulated failure (sim fail_generate)"}}))).into_response())
}

pub(crate) async fn generate(State(app): State<App>, body: Bytes) -> Response {
    let arrived = Instant::now();
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&e),
    };
    if let Some(r) = failing(&app) {
        if let (Mode::Prefill, Some(b)) = (app.engine.mode(), Bootstrap::of(&v)) {
            app.pd.abort_room(b.room);
        }
        return r;
    }
    log_request("GenerateReqInput", &v);
    let prompt_tokens = match (v.get("text").and_then(Value::as_str), v.get("input_ids").and_then(Value::as_array)) {
        (Some(t), _) => approx_tokens(t),
        (None, Some(ids)) => (ids.len() as u64).max(1),
        _ => return bad_request("Either text or input_ids should be provided."),
    };
    let max_new = v.pointer("/sampling_params/max_new_tokens").and_then(Value::as_u64).unwrap_or(128);
    let rid = v.get("rid").and_then(Value::as_str).map(String::from).unwrap_or_else(|| format!("{:032x}", crate::ids::rand_u128()));
    let job = Job { rid: rid.clone(), prompt_tokens, max_new, stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false), arrived };
    let mut tracked = app.requests.track(&rid);
    app.control.admit(&mut tracked).await;
    let hold = match pd_before(&app, &v, &rid, &mut tracked).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    let started = Instant::now();
    let meta_rid = rid.clone();
    let version = app.engine.weights().version;
    let meta = move |n: u64, prompt: u64| {
        json!({"id": meta_rid, "finish_reason": {"type": "length", "length": n}, "prompt_tokens": prompt,
               "completion_tokens": n, "cached_tokens": 0, "weight_version": version,
               "e2e_latency": started.elapsed().as_secs_f64()})
    };
    if job.stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let app = app.clone();
        tokio::spawn(async move {
            let mut text = String::new();
            let mut ids = Vec::new();
            let r = execute(&app, &job, hold.as_ref().map(|b| (rid.as_str(), b)), &mut tracked, |i, w| {
                text.push_str(w);
                ids.push(1000 + i as u64);
                let chunk = json!({"text": text, "output_ids": ids, "meta_info": meta(ids.len() as u64, job.prompt_tokens)});
                tx.send(format!("data: {chunk}\n\n")).is_ok()
            })
            .await;
            end_stream(&tx, r);
        });
        return sse(rx);
    }
    let mut text = String::new();
    let mut ids = Vec::new();
    let r = execute(&app, &job, hold.as_ref().map(|b| (rid.as_str(), b)), &mut tracked, |i, w| {
        text.push_str(w);
        ids.push(1000 + i as u64);
        true
    })
    .await;
    match r {
        Ok(n) => axum::Json(json!({"text": text, "output_ids": ids, "meta_info": meta(n, job.prompt_tokens)})).into_response(),
        Err(m) => pd::abort(&m),
    }
}

pub(crate) async fn completions(State(app): State<App>, body: Bytes) -> Response {
    openai(app, body, false).await
}

pub(crate) async fn chat(State(app): State<App>, body: Bytes) -> Response {
    openai(app, body, true).await
}

pub(crate) async fn openai(app: App, body: Bytes, chat: bool) -> Response {
    let arrived = Instant::now();
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&e),
    };
    log_request(if chat { "ChatCompletionRequest" } else { "CompletionRequest" }, &v);
    let prompt_tokens = if chat {
        match v.get("messages").and_then(Value::as_array) {
            Some(msgs) => msgs.iter().map(|m| approx_tokens(m.get("content").and_then(Value::as_str).unwrap_or(""))).sum(),
            None => return bad_request("messages: Field required"),
        }
    } else {
        match v.get("prompt").and_then(Value::as_str) {
            Some(p) => approx_tokens(p),
            None => return bad_request("prompt: Field required"),
        }
    };
    let max_new = v.get("max_completion_tokens").or_else(|| v.get("max_tokens")).and_then(Value::as_u64).unwrap_or(16);
    let model = app.engine.weights().served_model_name;
    let id = format!("{:032x}", crate::ids::rand_u128());
    let job = Job { rid: id.clone(), prompt_tokens, max_new, stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false), arrived };
    let mut tracked = app.requests.track(&id);
    app.control.admit(&mut tracked).await;
    let hold = match pd_before(&app, &v, &id, &mut tracked).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    let created = unix_now();
    let (object, chunk_object) = if chat { ("chat.completion", "chat.completion.chunk") } else { ("text_completion", "text_completion") };
    if job.stream {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let app = app.clone();
        tokio::spawn(async move {
            let r = execute(&app, &job, hold.as_ref().map(|b| (id.as_str(), b)), &mut tracked, |_, w| {
                let choice = if chat {
                    json!({"index": 0, "delta": {"role": "assistant", "content": w}, "finish_reason": null})
                } else {
                    json!({"index": 0, "text": w, "finish_reason": null})
                };
                let c = json!({"id": id, "object": chunk_object, "created": created, "model": model, "choices": [choice]});
                tx.send(format!("data: {c}\n\n")).is_ok()
            })
            .await;
            end_stream(&tx, r);
        });
        return sse(rx);
    }
    let mut text = String::new();
    let r = execute(&app, &job, hold.as_ref().map(|b| (id.as_str(), b)), &mut tracked, |_, w| {
        text.push_str(w);
        true
    })
    .await;
    let n = match r {
        Ok(n) => n,
        Err(m) => return pd::abort(&m),
    };
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
    } else {
        json!({"index": 0, "text": text, "finish_reason": "length"})
    };
    axum::Json(json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice],
        "usage": {"prompt_tokens": job.prompt_tokens, "completion_tokens": n, "total_tokens": job.prompt_tokens + n}}))
    .into_response()
}

/// The end of a streamed answer: the error (if the request failed), then `[DONE]`.
fn end_stream(tx: &tokio::sync::mpsc::UnboundedSender<String>, r: Result<u64, String>) {
    if let Err(m) = r {
        let _ = tx.send(format!("data: {}\n\n", json!({"error": {"message": m}})));
    }
    let _ = tx.send("data: [DONE]\n\n".into());
}
