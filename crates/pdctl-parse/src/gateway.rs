//! What a gateway says (smg 1.13 and sglang-router 0.3.2): its workers as `GET /workers` lists
//! them, and its own counters in its exposition — the answers it gave clients, its open circuit
//! breakers.

use serde_json::Value;

use crate::prom;

/// The gateway's answers to clients' inference requests in one scrape: (all, failed with a
/// 5xx); `None` where it exports no responses counter (what `pdctl_probe::Router::responses`
/// reads).
pub fn responses_in(e: &prom::Exposition) -> Option<(f64, f64)> {
    const RESPONSES: &str = "smg_http_responses_total";
    const REQUESTS: &str = "smg_http_requests_total";
    // Clients' inference requests only: not the control plane (`/workers`, `/health`, …).
    fn inference(s: &prom::Sample) -> bool {
        s.label("path").is_some_and(|p| p == "/generate" || p.starts_with("/v1/"))
    }
    fn five(s: &prom::Sample) -> bool {
        s.label("status_code").is_some_and(|c| c.starts_with('5'))
    }
    let family: Vec<&prom::Sample> = e.samples.iter().filter(|s| s.name == RESPONSES).collect();
    if family.is_empty() && !e.types.contains_key(RESPONSES) {
        return None;
    }
    if family.is_empty() || family.iter().any(|s| s.label("path").is_some()) {
        let series: Vec<&prom::Sample> = family.iter().copied().filter(|s| inference(s)).collect();
        return Some((prom::total(series.iter().map(|s| s.value)), prom::total(series.iter().filter(|s| five(s)).map(|s| s.value))));
    }
    // sglang-router 0.3.2: its responses carry no path (`{status_code, error_code}` only; measured),
    // its requests do: the answered are the inference requests counted, the failed every 5xx it
    // answered (its control plane's included: pdctl's own calls there rarely fail with a 5xx).
    let answered = prom::total(e.samples.iter().filter(|s| s.name == REQUESTS && inference(s)).map(|s| s.value));
    Some((answered, prom::total(family.iter().filter(|s| five(s)).map(|s| s.value))))
}

/// The workers whose breaker is open in a gateway's exposition (`smg_worker_cb_state == 1`; 0 is
/// closed, 2 half-open, -1 a removed worker's kept series).
pub fn open_breakers_in(e: &prom::Exposition) -> Vec<String> {
    e.samples.iter().filter(|s| s.name == "smg_worker_cb_state" && s.value == 1.0).filter_map(|s| s.label("worker").map(String::from)).collect()
}

/// One worker as the gateway lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RouterWorker {
    /// The gateway's id for it.
    pub id: String,
    /// Its URL.
    pub url: String,
    /// `prefill`, `decode`, `regular`.
    pub worker_type: String,
    /// Health as the gateway sees it.
    pub is_healthy: bool,
    /// Requests the gateway has in flight to it.
    pub load: i64,
    /// The gateway's own word on it, where it gives one (smg 1.x: `pending`, `ready`,
    /// `not_ready`, `failed`, `draining`); `None` on sglang-router 0.3.2.
    pub status: Option<String>,
    /// A prefill's bootstrap port, as registered.
    pub bootstrap_port: Option<u16>,
}

impl RouterWorker {
    /// Still being removed (smg 1.x keeps a deleted worker listed as `draining` for ~5 s): it
    /// is not registered, whatever else the entry says.
    pub fn draining(&self) -> bool {
        self.status.as_deref() == Some("draining")
    }

    /// Given up on by the gateway (smg 1.x lists it `failed`): it will not admit it again by
    /// itself.
    pub fn given_up(&self) -> bool {
        self.status.as_deref() == Some("failed")
    }

    /// Not ready yet by the gateway's own health checks (smg 1.x `not_ready`): flips back once
    /// they pass.
    pub fn not_ready(&self) -> bool {
        self.status.as_deref() == Some("not_ready")
    }

    /// Admitted: healthy, and `ready` where the gateway reports a status (`pending` is not).
    pub fn admitted(&self) -> bool {
        self.is_healthy && self.status.as_deref().is_none_or(|s| s == "ready")
    }
}

/// The workers of a `GET /workers` answer (`None`: it has no `workers` array). A field a
/// gateway leaves out reads as empty, unhealthy, no load, no status.
pub fn workers_in(v: &Value) -> Option<Vec<RouterWorker>> {
    let list = v.get("workers").and_then(Value::as_array)?;
    Some(
        list.iter()
            .map(|w| RouterWorker {
                id: w.get("id").and_then(Value::as_str).unwrap_or_default().into(),
                url: w.get("url").and_then(Value::as_str).unwrap_or_default().into(),
                worker_type: w.get("worker_type").and_then(Value::as_str).unwrap_or_default().into(),
                is_healthy: w.get("is_healthy").and_then(Value::as_bool).unwrap_or(false),
                load: w.get("load").and_then(Value::as_i64).unwrap_or(0),
                status: w.get("status").and_then(Value::as_str).map(String::from),
                bootstrap_port: w.get("bootstrap_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()),
            })
            .collect(),
    )
}
