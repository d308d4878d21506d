//! `pdctl-probe`: the HTTP gates — a worker's `/health`, the router's view of it (admission,
//! circuit breaker, a smoke request, re-registration), and `/metrics` parsed and checked for
//! SGLang's KV gauges. Every request has a timeout; every failure says which cause it is.

#![warn(missing_docs)]

pub use pdctl_parse::gateway::{open_breakers_in, responses_in, RouterWorker};
pub use pdctl_parse::{kv, prom, quantile, service};
pub mod role;
pub mod router;
pub use router::Router;
pub mod weights;

use std::time::Duration;

use serde_json::{json, Value};

/// Timeout of one HTTP request (SGLang's `/health` runs a generate and waits ≥ 1 s; its own
/// limit is 20 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(25);

/// An HTTP-level failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// Connection refused, reset, DNS…
    #[error("cannot connect to {url}: {detail} (is the process listening on that host and port?)")]
    Unreachable {
        /// The URL.
        url: String,
        /// The error.
        detail: String,
    },
    /// No answer in time.
    #[error("{url} did not answer within {after:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// A non-success status.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// A body we cannot read.
    #[error("{url} sent a body pdctl cannot read: {detail}")]
    Body {
        /// The URL.
        url: String,
        /// What is wrong.
        detail: String,
    },
}

/// The largest answer read from a worker or a gateway (a gateway's `/metrics` over a large fleet
/// is a few MB).
pub const MAX_BODY: usize = 32 * 1024 * 1024;

/// A shared HTTP client.
#[derive(Debug, Clone)]
pub struct Http {
    client: reqwest::Client,
    timeout: Duration,
    keys: std::sync::Arc<Vec<ApiKey>>,
}

/// An API key for the server at `base` (`scheme://host:port`), sent as `Authorization: Bearer`
/// on every request to it except those whose path starts with one of `exempt` (SGLang's
/// `--api-key` leaves `/health*`, `/ready*`, `/metrics*` open). Its `Debug` never shows the key.
#[derive(Clone)]
pub struct ApiKey {
    /// The server's base URL.
    pub base: String,
    /// The key.
    pub key: String,
    /// Path prefixes sent without it.
    pub exempt: &'static [&'static str],
    /// `Some(paths)`: an admin key (SGLang's `--admin-api-key`), sent instead of the server's
    /// API key on these paths only (query aside); `None`: the server's API key.
    pub only: Option<&'static [&'static str]>,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey").field("base", &self.base).field("key", &"<redacted>").field("exempt", &self.exempt).field("only", &self.only).finish()
    }
}

impl Http {
    /// A client whose requests time out after `timeout`.
    pub fn new(timeout: Duration) -> Http {
        let client = reqwest::Client::builder().timeout(timeout).connect_timeout(Duration::from_secs(5)).build().unwrap_or_else(|_| reqwest::Client::new());
        Http { client, timeout, keys: std::sync::Arc::new(Vec::new()) }
    }

    /// The same client, sending these API keys to their servers.
    pub fn with_keys(mut self, keys: Vec<ApiKey>) -> Http {
        self.keys = std::sync::Arc::new(keys);
        self
    }

    /// The API key of the server `url` belongs to, if one is configured (for the path or not;
    /// never its admin key).
    pub fn key_of(&self, url: &str) -> Option<&str> {
        let (base, _) = split_base(url);
        self.keys.iter().find(|k| k.only.is_none() && k.base.trim_end_matches('/') == base).map(|k| k.key.as_str())
    }

    /// The key a request to `url` carries: the server's admin key on its admin paths, else its
    /// API key unless the path is exempt.
    fn key_for(&self, url: &str) -> Option<&str> {
        let (base, path) = split_base(url);
        let route = path.split('?').next().unwrap_or(path);
        let mine = || self.keys.iter().filter(|k| k.base.trim_end_matches('/') == base);
        if let Some(admin) = mine().find(|k| k.only.is_some_and(|o| o.contains(&route))) {
            return Some(&admin.key);
        }
        mine().find(|k| k.only.is_none() && !k.exempt.iter().any(|p| path.starts_with(p))).map(|k| k.key.as_str())
    }

    fn auth(&self, url: &str, rq: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.key_for(url) {
            Some(k) => rq.bearer_auth(k),
            None => rq,
        }
    }

    fn err(&self, url: &str, e: reqwest::Error) -> HttpError {
        if e.is_timeout() {
            HttpError::Timeout { url: url.into(), after: self.timeout }
        } else {
            let mut detail = e.to_string();
            let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
            while let Some(s) = src {
                detail = format!("{detail}: {s}");
                src = s.source();
            }
            HttpError::Unreachable { url: url.into(), detail }
        }
    }

    async fn send(&self, url: &str, rq: reqwest::RequestBuilder) -> Result<(u16, String), HttpError> {
        self.send_within(url, rq, self.timeout).await
    }

    async fn send_within(&self, url: &str, rq: reqwest::RequestBuilder, timeout: Duration) -> Result<(u16, String), HttpError> {
        // Set on every request, not only on the client: a client built by the fallback in
        // `Http::new` must not lose it.
        let r = rq.timeout(timeout).send().await.map_err(|e| match self.err(url, e) {
            HttpError::Timeout { url, .. } => HttpError::Timeout { url, after: timeout },
            other => other,
        })?;
        let status = r.status().as_u16();
        let body = self.bounded_body(url, r).await?;
        Ok((status, body))
    }

    /// A response's body as text, at most [`MAX_BODY`] bytes: a worker, a gateway or anything
    /// answering on their address cannot make pdctld hold an unbounded answer in memory.
    async fn bounded_body(&self, url: &str, mut r: reqwest::Response) -> Result<String, HttpError> {
        if r.content_length().is_some_and(|n| n > MAX_BODY as u64) {
            return Err(HttpError::Body { url: url.into(), detail: format!("the answer is larger than {} MB", MAX_BODY / (1024 * 1024)) });
        }
        let mut out: Vec<u8> = Vec::new();
        while let Some(chunk) = r.chunk().await.map_err(|e| self.err(url, e))? {
            if out.len() + chunk.len() > MAX_BODY {
                return Err(HttpError::Body { url: url.into(), detail: format!("the answer is larger than {} MB", MAX_BODY / (1024 * 1024)) });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// GET, any status.
    pub async fn get(&self, url: &str, accept: Option<&str>) -> Result<(u16, String), HttpError> {
        let mut rq = self.auth(url, self.client.get(url));
        if let Some(a) = accept {
            rq = rq.header("accept", a);
        }
        self.send(url, rq).await
    }

    /// GET expecting 2xx JSON.
    pub async fn get_json(&self, url: &str) -> Result<Value, HttpError> {
        let (status, body) = self.get(url, None).await?;
        ok_json(url, status, &body)
    }

    /// DELETE, any status.
    pub async fn delete(&self, url: &str) -> Result<(u16, String), HttpError> {
        self.send(url, self.auth(url, self.client.delete(url))).await
    }

    /// POST JSON, any status.
    pub async fn post_json(&self, url: &str, body: &Value) -> Result<(u16, String), HttpError> {
        self.send(url, self.auth(url, self.client.post(url).json(body))).await
    }

    /// PATCH JSON, any status.
    pub async fn patch_json(&self, url: &str, body: &Value) -> Result<(u16, String), HttpError> {
        self.send(url, self.auth(url, self.client.patch(url).json(body))).await
    }

    /// POST JSON with its own time limit (instead of the client's), any status.
    pub async fn post_json_within(&self, url: &str, body: &Value, timeout: Duration) -> Result<(u16, String), HttpError> {
        self.send_within(url, self.auth(url, self.client.post(url).json(body)), timeout).await
    }
}

/// `scheme://host:port` and the path of a URL (`("http://h:1", "/generate")`).
fn split_base(url: &str) -> (&str, &str) {
    let after = url.find("://").map(|i| i + 3).unwrap_or(0);
    match url[after..].find('/') {
        Some(i) => (&url[..after + i], &url[after + i..]),
        None => (url, "/"),
    }
}

pub(crate) fn snippet(body: &str) -> String {
    let b = body.trim();
    match b.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &b[..i]),
        None => b.to_string(),
    }
}

fn ok_json(url: &str, status: u16, body: &str) -> Result<Value, HttpError> {
    if !(200..300).contains(&status) {
        return Err(HttpError::Status { url: url.into(), status, body: snippet(body) });
    }
    serde_json::from_str(body).map_err(|e| HttpError::Body { url: url.into(), detail: e.to_string() })
}

/// What a worker's `/health` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// 200.
    Up,
    /// 503: still warming up (or unhealthy).
    Unavailable(String),
    /// Anything else, or no answer.
    Down(String),
}

/// GET `{url}/health`.
pub async fn health(http: &Http, url: &str) -> Health {
    let u = format!("{}/health", url.trim_end_matches('/'));
    match http.get(&u, None).await {
        Ok((200, _)) => Health::Up,
        Ok((503, body)) => Health::Unavailable(format!("503 {}", snippet(&body))),
        Ok((s, body)) => Health::Down(format!("{s} {}", snippet(&body))),
        Err(e) => Health::Down(e.to_string()),
    }
}

/// GET `{url}/ready` (SGLang 0.5.23: 200 only when up and not paused; 503 while starting,
/// paused, shutting down or unhealthy; no generate, no API key): `None` where the server does not
/// serve it (404: before 0.5.23).
pub async fn ready(http: &Http, url: &str) -> Option<Health> {
    let u = format!("{}/ready", url.trim_end_matches('/'));
    match http.get(&u, None).await {
        Ok((404, _)) => None,
        Ok((200, _)) => Some(Health::Up),
        Ok((503, body)) => Some(Health::Unavailable(format!("/ready 503 {}", snippet(&body)))),
        Ok((s, body)) => Some(Health::Down(format!("/ready {s} {}", snippet(&body)))),
        Err(e) => Some(Health::Down(e.to_string())),
    }
}

/// Requests a worker is running or has queued, summed over its DP ranks: from `GET
/// /v1/loads?include=core` (`loads[].num_running_reqs + num_waiting_reqs`; SGLang 0.5.23,
/// `entrypoints/v1_loads.py`), else from `GET /get_load` (`[].num_reqs + num_waiting_reqs`;
/// 0.5.2–0.5.12). An answer in neither shape is an error naming what came back — never "0".
pub async fn in_flight(http: &Http, url: &str) -> Result<u64, HttpError> {
    let base = url.trim_end_matches('/');
    let sum = |ranks: &[Value], running: &str| -> Option<u64> {
        ranks.iter().map(|r| Some(r.get(running)?.as_u64()? + r.get("num_waiting_reqs").and_then(Value::as_u64).unwrap_or(0))).sum()
    };
    let u = format!("{base}/v1/loads?include=core");
    let first = match http.get_json(&u).await {
        Ok(v) => {
            return v
                .get("loads")
                .and_then(Value::as_array)
                .and_then(|l| sum(l, "num_running_reqs"))
                .ok_or_else(|| HttpError::Body { url: u.clone(), detail: format!("no loads[].num_running_reqs in {}", snippet(&v.to_string())) })
        }
        Err(e) => e,
    };
    let u = format!("{base}/get_load");
    match http.get_json(&u).await {
        Ok(v) => v
            .as_array()
            .and_then(|l| sum(l, "num_reqs"))
            .ok_or_else(|| HttpError::Body { url: u.clone(), detail: format!("expected a JSON array of DP ranks with num_reqs: {}", snippet(&v.to_string())) }),
        Err(second) => Err(HttpError::Body { url: base.to_string(), detail: format!("no load endpoint answered: /v1/loads: {first}; /get_load: {second}") }),
    }
}

/// One 1-token `/generate` straight to a regular (non-PD) worker: SGLang publishes its usage
/// gauges at its first batch, so this makes them appear. A PD worker cannot serve it alone (a
/// decode needs bootstrap fields): warm those through the router ([`Router::smoke`]).
pub async fn warm_worker(http: &Http, url: &str) -> Result<(), HttpError> {
    let u = format!("{}/generate", url.trim_end_matches('/'));
    let (status, body) = http.post_json(&u, &json!({"text": "pdctl warm-up", "sampling_params": {"max_new_tokens": 1}})).await?;
    if status == 200 {
        Ok(())
    } else {
        Err(HttpError::Status { url: u, status, body: snippet(&body) })
    }
}

/// A prefill's PD queues from SGLang's live load snapshot (`GET /v1/loads?include=core,disagg`,
/// 0.5.23 `managers/load_snapshot.py`): the requests in its bootstrap and in-flight queues, and the
/// tokens in use, summed over DP ranks. Unlike the queue gauges — refreshed only at batch reports
/// and the idle publish, up to ~30 s late — this is the scheduler's state now. `Ok(None)`: the
/// server has no such endpoint or section (an older SGLang: read the gauges).
pub async fn pd_load(http: &Http, url: &str) -> Result<Option<(f64, f64)>, HttpError> {
    let u = format!("{}/v1/loads?include=core,disagg", url.trim_end_matches('/'));
    let (status, body) = http.get(&u, None).await?;
    if status == 404 {
        return Ok(None);
    }
    let v = ok_json(&u, status, &body)?;
    let Some(loads) = v.get("loads").and_then(Value::as_array) else { return Ok(None) };
    let mut held = 0.0;
    let mut used = 0.0;
    for l in loads {
        let Some(d) = l.get("disaggregation") else { return Ok(None) };
        let n = |k: &str| d.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        held += n("prefill_bootstrap_queue_reqs") + n("prefill_inflight_queue_reqs");
        used += l.get("num_used_tokens").and_then(Value::as_f64).unwrap_or(0.0);
    }
    Ok((!loads.is_empty()).then_some((held, used)))
}

/// Abort every request a worker runs: SGLang's `POST /abort_request {"abort_all": true}`
/// (`entrypoints/http_server.py`, `AbortReq` in `managers/io_struct.py`); 200 when done.
pub async fn abort_all(http: &Http, url: &str) -> Result<(), HttpError> {
    abort(http, url, &json!({"abort_all": true})).await
}

/// Abort one request by its rid: SGLang's `POST /abort_request {"rid": RID}`; its scheduler ends
/// it wherever it waits — on a prefill the room it holds for a decode is released
/// (`disagg_kv_sender.abort()`), on a decode the room it waits for (`kv_receiver.abort()`),
/// `managers/scheduler.py` `abort_request`. 200 when done.
pub async fn abort_rid(http: &Http, url: &str, rid: &str) -> Result<(), HttpError> {
    abort(http, url, &json!({"rid": rid})).await
}

/// `POST /abort_request` with `body`: 200 when done.
async fn abort(http: &Http, url: &str, body: &Value) -> Result<(), HttpError> {
    let u = format!("{}/abort_request", url.trim_end_matches('/'));
    let (status, text) = http.post_json(&u, body).await?;
    if status == 200 {
        Ok(())
    } else {
        Err(HttpError::Status { url: u, status, body: snippet(&text) })
    }
}

/// The rid both halves of the pair probe of `room` carry.
pub fn pair_rid(room: u64) -> String {
    format!("pdctl-pair-{room}")
}

/// How long a pair probe waits for the prefill's answer once the decode's is in.
pub const PREFILL_GRACE: Duration = Duration::from_secs(2);

/// One PD request pair, as the router sends it: the same `/generate` with the prefill's
/// `bootstrap_host`, `bootstrap_port` and `room` to the prefill and to the decode at once; each
/// half waits at most `limit`. Returns (prefill's answer, decode's answer).
pub async fn pd_pair(
    http: &Http,
    prefill_url: &str,
    decode_url: &str,
    bootstrap: (&str, u16),
    room: u64,
    max_new_tokens: u32,
    limit: Duration,
) -> (Result<(u16, String), HttpError>, Result<(u16, String), HttpError>) {
    let body = json!({
        "text": "pdctl pair probe", "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        "bootstrap_host": bootstrap.0, "bootstrap_port": bootstrap.1, "bootstrap_room": room,
        "rid": pair_rid(room),
    });
    let p = format!("{}/generate", prefill_url.trim_end_matches('/'));
    let d = format!("{}/generate", decode_url.trim_end_matches('/'));
    // The decode's answer is the result (as the router reads it); once it is in, the prefill's
    // half gets a short grace: a prefill still holding the room for a decode that will never
    // fetch it would otherwise keep the probe until its bootstrap timeout.
    let t0 = std::time::Instant::now();
    let prefill = http.post_json_within(&p, &body, limit);
    let decode = http.post_json_within(&d, &body, limit);
    tokio::pin!(prefill, decode);
    let mut a = None;
    let b = tokio::select! {
        b = &mut decode => b,
        r = &mut prefill => {
            a = Some(r);
            decode.await
        }
    };
    let a = match a {
        Some(a) => a,
        None => match tokio::time::timeout(PREFILL_GRACE.min(limit.saturating_sub(t0.elapsed())), prefill).await {
            Ok(a) => a,
            Err(_) => Err(HttpError::Timeout { url: p.clone(), after: t0.elapsed() }),
        },
    };
    let cut = |r: Result<(u16, String), HttpError>| r.map(|(s, b)| (s, snippet(&b)));
    (cut(a), cut(b))
}

/// Why `/metrics` gives no usable KV gauges.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetricsProblem {
    /// 404: the server runs without `--enable-metrics`.
    #[error("{url} answered 404: metrics are not enabled (add --enable-metrics to the unit's ExecStart)")]
    Disabled {
        /// The URL.
        url: String,
    },
    /// Cannot connect or no answer.
    #[error("{0}")]
    Http(HttpError),
    /// The text does not parse.
    #[error("{url} is not valid Prometheus text: {err}")]
    Unparseable {
        /// The URL.
        url: String,
        /// The parse error.
        err: prom::ParseError,
    },
    /// Parsed, but the KV gauges are missing or insane.
    #[error("{0}")]
    Kv(kv::KvProblem),
}

impl MetricsProblem {
    /// Worth waiting for (gauges not published yet) rather than failing at once.
    pub fn may_resolve(&self) -> bool {
        matches!(
            self,
            MetricsProblem::Kv(kv::KvProblem::NotPublished { .. } | kv::KvProblem::RanksUnpublished { .. })
                | MetricsProblem::Http(HttpError::Unreachable { .. })
        )
    }
}

/// GET `{url}/metrics` (asking for the plain text format), parse it, and check the KV gauges.
pub async fn kv_metrics(http: &Http, url: &str) -> Result<kv::KvReport, MetricsProblem> {
    let u = format!("{}/metrics", url.trim_end_matches('/'));
    let text = fetch_metrics(http, &u).await?;
    let e = prom::parse(&text).map_err(|err| MetricsProblem::Unparseable { url: u.clone(), err })?;
    kv::check(&e).map_err(MetricsProblem::Kv)
}

/// A decode's captured graphs' footprint (`GET /metrics`, [`kv::decode_graph_gb`]).
pub async fn decode_graph_gb(http: &Http, url: &str) -> Result<Option<f64>, MetricsProblem> {
    let u = format!("{}/metrics", url.trim_end_matches('/'));
    let text = fetch_metrics(http, &u).await?;
    let e = prom::parse(&text).map_err(|err| MetricsProblem::Unparseable { url: u.clone(), err })?;
    Ok(kv::decode_graph_gb(&e))
}

/// A worker's service figures (`GET /metrics`): latency histograms and request counters.
pub async fn service_figures(http: &Http, url: &str) -> Result<service::ServiceScrape, MetricsProblem> {
    let u = format!("{}/metrics", url.trim_end_matches('/'));
    let text = fetch_metrics(http, &u).await?;
    let e = prom::parse(&text).map_err(|err| MetricsProblem::Unparseable { url: u.clone(), err })?;
    Ok(service::ServiceScrape::from_exposition(&e))
}

/// GET a metrics URL as plain text (0.0.4).
pub async fn fetch_metrics(http: &Http, url: &str) -> Result<String, MetricsProblem> {
    match http.get(url, Some("text/plain; version=0.0.4")).await {
        Ok((200, t)) => Ok(t),
        Ok((404, _)) => Err(MetricsProblem::Disabled { url: url.into() }),
        Ok((status, body)) => Err(MetricsProblem::Http(HttpError::Status { url: url.into(), status, body: snippet(&body) })),
        Err(e) => Err(MetricsProblem::Http(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_go_to_their_server_except_on_exempt_paths_and_never_show() {
        let http = Http::new(Duration::from_secs(1)).with_keys(vec![ApiKey {
            base: "http://127.0.0.1:30003".into(),
            key: "s3cret".into(),
            exempt: &["/health", "/ready", "/metrics"],
            only: None,
        }]);
        let auth = |url: &str| {
            http.auth(url, http.client.get(url)).build().ok().and_then(|r| r.headers().get("authorization").map(|v| v.to_str().unwrap_or("").to_string()))
        };
        assert_eq!(auth("http://127.0.0.1:30003/server_info").as_deref(), Some("Bearer s3cret"));
        assert_eq!(auth("http://127.0.0.1:30003/v1/loads?include=core").as_deref(), Some("Bearer s3cret"));
        assert_eq!(auth("http://127.0.0.1:30003/health_generate"), None, "exempt by prefix, as SGLang's auth.py");
        assert_eq!(auth("http://127.0.0.1:30003/metrics"), None);
        assert_eq!(auth("http://127.0.0.1:30002/server_info"), None, "another server gets no key");
        assert_eq!(http.key_of("http://127.0.0.1:30003"), Some("s3cret"));
        assert!(!format!("{http:?}").contains("s3cret"), "Debug never shows a key");
    }

    #[test]
    fn an_admin_key_goes_only_to_its_paths_and_is_never_the_key_of_the_server() {
        let admin = |base: &str| ApiKey { base: base.into(), key: "adm1n".into(), exempt: &[], only: Some(&["/pause_generation", "/flush_cache"]) };
        let normal = ApiKey { base: "http://a:1".into(), key: "s3cret".into(), exempt: &["/health"], only: None };
        let http = Http::new(Duration::from_secs(1)).with_keys(vec![admin("http://a:1"), normal, admin("http://b:1")]);
        let auth = |url: &str| {
            http.auth(url, http.client.get(url)).build().ok().and_then(|r| r.headers().get("authorization").map(|v| v.to_str().unwrap_or("").to_string()))
        };
        assert_eq!(auth("http://a:1/pause_generation").as_deref(), Some("Bearer adm1n"));
        assert_eq!(auth("http://a:1/flush_cache?timeout=0").as_deref(), Some("Bearer adm1n"));
        assert_eq!(auth("http://a:1/model_info").as_deref(), Some("Bearer s3cret"));
        assert_eq!(auth("http://a:1/health"), None);
        // An admin key alone (no --api-key): other paths go without a key.
        assert_eq!(auth("http://b:1/flush_cache").as_deref(), Some("Bearer adm1n"));
        assert_eq!(auth("http://b:1/v1/loads"), None);
        assert_eq!(http.key_of("http://a:1"), Some("s3cret"));
        assert_eq!(http.key_of("http://b:1"), None, "the gateway is never handed an admin key");
        assert!(!format!("{http:?}").contains("adm1n"));
    }
}
