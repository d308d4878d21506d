//! The SGLang gateway's API as the gates use it (`sglang-router` 0.3.2 and `smg` 1.x): its
//! workers, admission, breakers, the smoke request, re-registration, and the clients' answers
//! counted from its `/metrics`.

use super::*;

/// The SGLang gateway's API used by the gates: `sglang-router` 0.3.2 and `smg` 1.x (the same
/// endpoints; 1.x adds a worker `status` and keeps a deleted worker listed as `draining` for
/// `drain_settle_secs`, 5 s by default).
#[derive(Debug, Clone)]
pub struct Router {
    /// Base URL, e.g. `http://127.0.0.1:30001`.
    pub url: String,
    /// Its Prometheus endpoint, when configured.
    pub metrics_url: Option<String>,
}

impl Router {
    /// `GET /workers`.
    pub async fn workers(&self, http: &Http) -> Result<Vec<RouterWorker>, HttpError> {
        let u = format!("{}/workers", self.url.trim_end_matches('/'));
        let v = http.get_json(&u).await?;
        pdctl_parse::gateway::workers_in(&v).ok_or_else(|| HttpError::Body { url: u.clone(), detail: "no \"workers\" array".into() })
    }

    /// `POST /workers` (re-registration of a worker the router dropped). Returns the router's id.
    pub async fn register(&self, http: &Http, url: &str, worker_type: &str, bootstrap_port: Option<u16>) -> Result<String, HttpError> {
        let u = format!("{}/workers", self.url.trim_end_matches('/'));
        // Said, not left for smg 1.x to find out: with no `runtime_type` its AddWorker workflow
        // probes the worker to classify it (`workflow/steps/classify.rs`) and with no
        // `connection_mode` it probes HTTP against gRPC — measured behind smg 1.13, listed ready
        // 2.0 s after the POST without them, 1.0 s with them; 0.3.2 accepts both (1.0 s either way).
        let mut body = json!({"url": url, "worker_type": worker_type, "connection_mode": "http", "runtime_type": "sglang"});
        if let Some(p) = bootstrap_port {
            body["bootstrap_port"] = json!(p);
        }
        // The worker's own key (smg's `WorkerConfigRequest.api_key`): the gateway needs it to call
        // a server started with `--api-key`.
        if let Some(k) = http.key_of(url) {
            body["api_key"] = json!(k);
        }
        let (status, text) = http.post_json(&u, &body).await?;
        let v = ok_json(&u, status, &text)?;
        Ok(v.get("worker_id").and_then(Value::as_str).unwrap_or_default().to_string())
    }

    /// `smg_worker_cb_state{worker=URL}` (0 closed, 1 open, 2 half-open, -1 removed), if exported.
    pub async fn cb_state(&self, http: &Http, worker_url: &str) -> Result<Option<f64>, MetricsProblem> {
        let Some(m) = &self.metrics_url else {
            return Ok(None);
        };
        let text = fetch_metrics(http, m).await?;
        let e = prom::parse(&text).map_err(|err| MetricsProblem::Unparseable { url: m.clone(), err })?;
        Ok(e.samples.iter().find(|s| s.name == "smg_worker_cb_state" && s.label("worker") == Some(worker_url)).map(|s| s.value))
    }

    /// The workers whose circuit breaker is open now (`smg_worker_cb_state{worker=URL} == 1`),
    /// from one scrape; empty without a metrics URL or on a gateway that does not export it.
    pub async fn open_breakers(&self, http: &Http) -> Result<Vec<String>, MetricsProblem> {
        let Some(m) = &self.metrics_url else {
            return Ok(Vec::new());
        };
        let text = fetch_metrics(http, m).await?;
        let e = prom::parse(&text).map_err(|err| MetricsProblem::Unparseable { url: m.clone(), err })?;
        Ok(open_breakers_in(&e))
    }

    /// The gateway's own count of its answers to clients, `(answered, failed)`: every series of
    /// `smg_http_responses_total{path,status_code,error_code}` whose path is an inference route
    /// (`/generate`, `/v1/…`; not its control plane) (smg 1.x; measured on 1.13: a
    /// request with no worker to take it is `status_code="503",error_code="no_available_workers"`)
    /// summed, and those with a 5xx status; sglang-router 0.3.2's responses have no `path`, so
    /// there the inference requests of `smg_http_requests_total` and every 5xx answer.
    /// `None`: no metrics URL, or a gateway without either.
    pub async fn responses(&self, http: &Http) -> Result<Option<(f64, f64)>, MetricsProblem> {
        let Some(m) = &self.metrics_url else {
            return Ok(None);
        };
        let text = fetch_metrics(http, m).await?;
        let e = prom::parse(&text).map_err(|err| MetricsProblem::Unparseable { url: m.clone(), err })?;
        Ok(responses_in(&e))
    }

    /// The gateway's request outcomes for one worker, `(successes, failures)`, summed over the
    /// series of `smg_worker_cb_outcomes_total{worker=URL,outcome}` (sglang-router 0.3.2 and
    /// smg 1.x; every attempt, retries included; in PD mode an attempt's outcome is counted on
    /// both its prefill and its decode). `None`: no metrics URL, or a gateway without it.
    pub async fn outcomes(&self, http: &Http, worker_url: &str) -> Result<Option<(f64, f64)>, MetricsProblem> {
        let Some(m) = &self.metrics_url else {
            return Ok(None);
        };
        let text = fetch_metrics(http, m).await?;
        let e = prom::parse(&text).map_err(|err| MetricsProblem::Unparseable { url: m.clone(), err })?;
        let of = |outcome: &str| {
            prom::total(
                e.samples
                    .iter()
                    .filter(|s| s.name == "smg_worker_cb_outcomes_total" && s.label("worker") == Some(worker_url) && s.label("outcome") == Some(outcome))
                    .map(|s| s.value),
            )
        };
        let exported = e.types.contains_key("smg_worker_cb_outcomes_total") || e.samples.iter().any(|s| s.name == "smg_worker_cb_outcomes_total");
        Ok(exported.then(|| (of("success"), of("failure"))))
    }

    /// smg 1.x: `PATCH /workers/{id}` `{"health": {"drain_settle_secs": secs}}` — how long its
    /// next `DELETE` keeps the worker listed `draining` before removing it (5 s by default; a
    /// partial health update, `HealthCheckUpdate` in smg's `crates/protocols/src/worker.rs`,
    /// applied by the `update_worker_properties` workflow step, which keeps the worker's type,
    /// bootstrap port and status). smg answers 202 and applies it as a job, and runs its jobs
    /// concurrently (`workflow/job_queue.rs`): a `DELETE` sent before the update's job is done
    /// may drain at the old settle. So `Ok` only once `GET /workers/{id}` no longer lists the
    /// update's job (smg drops a job's `job_status` when it succeeds and keeps a failed one),
    /// within [`SETTLE_APPLIED_WITHIN`]. sglang-router 0.3.2 has no such route and no settle.
    pub async fn set_drain_settle(&self, http: &Http, id: &str, secs: u64) -> Result<(), HttpError> {
        let u = format!("{}/workers/{id}", self.url.trim_end_matches('/'));
        let (status, body) = http.patch_json(&u, &json!({"health": {"drain_settle_secs": secs}})).await?;
        if !(200..300).contains(&status) {
            return Err(HttpError::Status { url: u, status, body: snippet(&body) });
        }
        let t0 = tokio::time::Instant::now();
        loop {
            let entry = http.get_json(&u).await?;
            match update_job(&entry) {
                UpdateJob::Done => return Ok(()),
                UpdateJob::Failed(why) => return Err(HttpError::Status { url: u, status: 202, body: format!("the update's job failed: {}", snippet(&why)) }),
                UpdateJob::Running if t0.elapsed() >= SETTLE_APPLIED_WITHIN => return Err(HttpError::Timeout { url: u, after: SETTLE_APPLIED_WITHIN }),
                UpdateJob::Running => tokio::time::sleep(Duration::from_millis(25)).await,
            }
        }
    }

    /// `DELETE /workers/{id}` (drain: take the worker out of rotation).
    pub async fn deregister(&self, http: &Http, id: &str) -> Result<(), HttpError> {
        let u = format!("{}/workers/{id}", self.url.trim_end_matches('/'));
        let (status, body) = http.delete(&u).await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(HttpError::Status { url: u, status, body: snippet(&body) })
        }
    }

    /// One `/generate` with `max_new_tokens` through the router; `Err` with the status and body
    /// unless it answers 200.
    pub async fn smoke(&self, http: &Http, max_new_tokens: u32) -> Result<(), HttpError> {
        let u = format!("{}/generate", self.url.trim_end_matches('/'));
        let (status, body) =
            http.post_json(&u, &json!({"text": "pdctl smoke test", "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})).await?;
        if status == 200 {
            Ok(())
        } else {
            Err(HttpError::Status { url: u, status, body: snippet(&body) })
        }
    }
}

/// How long smg may take to apply a `drain_settle_secs` update (its job takes milliseconds
/// on an idle gateway).
pub const SETTLE_APPLIED_WITHIN: Duration = Duration::from_secs(3);

/// Where smg's `UpdateWorker` job stands, as one `GET /workers/{id}` entry says.
#[derive(Debug, PartialEq, Eq)]
enum UpdateJob {
    /// Pending or processing.
    Running,
    /// Gone (done) or another job's status now.
    Done,
    /// Failed, with smg's message.
    Failed(String),
}

fn update_job(entry: &Value) -> UpdateJob {
    let job = &entry["job_status"];
    if job["job_type"].as_str() != Some("UpdateWorker") {
        return UpdateJob::Done;
    }
    match job["status"].as_str() {
        Some("failed") => UpdateJob::Failed(job["message"].as_str().unwrap_or("no message").to_string()),
        Some("pending") | Some("processing") => UpdateJob::Running,
        _ => UpdateJob::Done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settle_update_is_applied_once_smg_no_longer_lists_its_job() {
        let job = |t: &str, st: &str| json!({"id": "w", "job_status": {"job_type": t, "status": st, "message": "boom"}});
        assert_eq!(update_job(&job("UpdateWorker", "pending")), UpdateJob::Running);
        assert_eq!(update_job(&job("UpdateWorker", "processing")), UpdateJob::Running);
        assert_eq!(update_job(&job("UpdateWorker", "failed")), UpdateJob::Failed("boom".into()));
        assert_eq!(update_job(&json!({"id": "w"})), UpdateJob::Done);
        assert_eq!(update_job(&job("RemoveWorker", "processing")), UpdateJob::Done);
    }

    #[test]
    fn the_gateways_answers_are_counted_and_its_5xx_are_the_failed_ones() {
        // Scraped from smg 1.13 with no worker behind it (two requests, both refused).
        let text = "smg_http_responses_total{path=\"/v1/completions\",status_code=\"503\",error_code=\"no_available_workers\"} 1\n\
                    smg_http_responses_total{path=\"/generate\",status_code=\"503\",error_code=\"no_available_workers\"} 1\n\
                    smg_http_responses_total{path=\"/generate\",status_code=\"200\",error_code=\"\"} 7\n\
                    smg_http_responses_total{path=\"/generate\",status_code=\"400\",error_code=\"bad_request\"} 1\n\
                    smg_http_responses_total{path=\"/workers\",status_code=\"500\",error_code=\"x\"} 3\n";
        assert_eq!(responses_in(&prom::parse(text).expect("parses")), Some((10.0, 2.0)), "clients' requests only, not /workers");
        assert_eq!(responses_in(&prom::parse("smg_worker_cb_state{worker=\"a\"} 0\n").expect("parses")), None, "not exported: not measured");
        // Scraped from sglang-router 0.3.2 (no worker behind it, two requests refused): its
        // responses have no path label — read as zero requests, they were a "0 failed" untrue.
        let old = "smg_http_responses_total{status_code=\"503\",error_code=\"server_selection_failed\"} 2\n\
                   smg_http_responses_total{status_code=\"200\",error_code=\"\"} 5\n\
                   smg_http_requests_total{method=\"POST\",path=\"/generate\"} 1\n\
                   smg_http_requests_total{method=\"POST\",path=\"/v1/completions\"} 1\n\
                   smg_http_requests_total{method=\"GET\",path=\"/workers\"} 5\n";
        assert_eq!(responses_in(&prom::parse(old).expect("parses")), Some((2.0, 2.0)), "0.3.2: the inference requests, and its 5xx");
    }

    #[test]
    fn open_breakers_are_the_workers_whose_state_is_1() {
        let text = "# TYPE smg_worker_cb_state gauge\nsmg_worker_cb_state{worker=\"http://a:1\"} 1\nsmg_worker_cb_state{worker=\"http://b:1\"} 0\n\
                    smg_worker_cb_state{worker=\"http://c:1\"} 2\nsmg_worker_cb_state{worker=\"http://d:1\"} -1\n";
        assert_eq!(open_breakers_in(&prom::parse(text).expect("parses")), vec!["http://a:1".to_string()]);
    }
}
