//! What a pair probe answered (both halves of one PD request sent straight to a prefill and a
//! decode) and a prefill's PD queues: the facts the `Probes` port hands to the pair and
//! stranded-KV gates, judged in `sglang/pairing.rs`.

use std::time::Duration;

use serde::Serialize;

/// One half of a pair probe: what one server answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "answer")]
pub enum Half {
    /// An HTTP answer (the start of its body).
    Answered {
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// No connection (refused, reset).
    Unreachable {
        /// The client's error.
        error: String,
    },
    /// No answer within the probe's time limit.
    NoAnswer,
}

impl Half {
    pub(crate) fn ok(&self) -> bool {
        matches!(self, Half::Answered { status: 200, .. })
    }

    /// A short description for sentences.
    pub fn describe(&self) -> String {
        match self {
            Half::Answered { status, body } => format!("{status} {}", body.chars().take(300).collect::<String>()),
            Half::Unreachable { error } => format!("unreachable: {error}"),
            Half::NoAnswer => "no answer".into(),
        }
    }
}

/// Both halves of one pair probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairProbe {
    /// The room both halves carried.
    pub room: u64,
    /// The prefill's answer.
    pub prefill: Half,
    /// The decode's answer (the one that carries the result, as the router reads it).
    pub decode: Half,
    /// How long the probe took.
    #[serde(serialize_with = "ms")]
    pub took: Duration,
    /// A half that got no answer: what became of the probe's own request, aborted by its rid on
    /// both servers so that it holds no room (a prefill would keep its KV until its bootstrap
    /// timeout, a decode would wait for it until its waiting timeout, holding a drain).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abandoned: Option<String>,
}

impl PairProbe {
    /// Both halves answered 200.
    pub fn answered(&self) -> bool {
        self.prefill.ok() && self.decode.ok()
    }
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// A prefill's PD queues: requests whose KV it holds for a decode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PdQueues {
    /// Requests in the bootstrap queue (waiting for their decode) plus those in transfer.
    pub held_reqs: f64,
    /// Tokens in use (includes the held rooms' KV; moves with live load).
    pub used_tokens: f64,
    /// Where they were read: `/v1/loads` (the scheduler's state now) or `/metrics` (the queue
    /// gauges, refreshed at batch reports and the idle publish).
    pub source: &'static str,
}
