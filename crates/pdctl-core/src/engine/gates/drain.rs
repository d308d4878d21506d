//! The drain: the worker out of the gateway (the ledger written first), then a bounded wait for its
//! requests in flight.

use std::time::Instant;

use serde_json::{json, Value};

use crate::cause::Cause;
use crate::config::Worker;
use crate::drains::{Drain, Hold, Ledger};
use crate::engine::step::{Fail, POLL};
use crate::engine::steps::{rule, GateMode};
use crate::engine::{Ctx, Engine};
use crate::ports::{Logs, Probes, RouterWorker, Units};

impl<U: Units, L: Logs, P: Probes> Engine<U, L, P> {
    pub(in crate::engine) async fn drain(&self, w: &Worker, ctx: Ctx<'_>) -> Result<Option<Value>, Fail> {
        let drain_failed = |error: String| Fail::from(Cause::DrainFailed { unit: w.unit.clone(), error });
        // Listed on which replicas (a gateway of several replicas: each is drained).
        let mut entries = Vec::new();
        for r in 0..self.probes.replicas() {
            let list = self.probes.router_workers(r).await.map_err(|e| drain_failed(format!("the router does not answer: {e}")))?;
            if let Some(entry) = list.into_iter().find(|x| crate::config::same_url(&x.url, &w.url) && !x.draining()) {
                entries.push((r, entry));
            }
        }
        let Some((_, entry)) = entries.first().cloned() else {
            // Taken out already by this rollout's coherent switch (all of a group at once, the
            // ledger written first): its requests are still waited for before its stop.
            if let Some(held) = ctx.ledger.and_then(|l| l.get(&w.unit)).filter(|d| d.rollout_id == ctx.id && d.hold.is_some()) {
                let t0 = Instant::now();
                let (at_start, left, unknown) = self.wait_in_flight(w, t0).await?;
                return Ok(Some(json!({
                    "taken_out": "by the coherent switch", "hold": held.hold, "removed_router_id": held.router_id,
                    "warning": unknown.as_ref().map(Cause::sentence), "cause_code": unknown.as_ref().map(Cause::code),
                    "in_flight_at_start": at_start, "in_flight_left": left, "waited_for_requests_ms": t0.elapsed().as_millis() as u64,
                    "waited_ms": t0.elapsed().as_millis() as u64, "timed_out": left.is_some_and(|n| n > 0),
                })));
            }
            return Ok(None);
        };
        // Written down before the router is touched: whatever happens next (a failed gate, a
        // crash, SIGKILL), the drain is found and undone.
        if let Some(l) = ctx.ledger {
            self.record_drain(l, w, &entry.id, ctx.id, ctx.hold).await?;
        }
        for (r, e) in &entries {
            self.probes.deregister(*r, &e.id).await.map_err(|er| drain_failed(format!("the router refused to remove {}: {er}", w.url)))?;
        }
        let t0 = Instant::now();
        // Wait until the gateway no longer lists it (smg 1.x lists it as draining for ~5 s and
        // still finishes its requests meanwhile); bounded by drain_timeout. Not for the only
        // worker of its role: nothing else serves meanwhile, so that wait would only lengthen the
        // outage (measured behind smg 1.13: 10 s per unit instead of ~7 s); the router gate waits
        // out the draining entry before it re-registers the worker.
        let listed_for_ms = self.wait_unlisted(w, &entries, t0).await;
        // Wait (bounded) for the requests it runs: read from the server's load endpoint. One that
        // cannot be read is a cause, never taken for "nothing in flight".
        let wait_t0 = Instant::now();
        let (at_start, left, unknown) = self.wait_in_flight(w, t0).await?;
        // What is left would hold the stop (SGLang waits for it, up to TimeoutStopSec and
        // SIGKILL): aborted when it can never finish or by the setting. On a stale decode, requests
        // paired with a healthy prefill end within the drain's wait; those still running then are
        // the ones waiting for KV from the old prefill process (until the decode's waiting
        // timeout), so aborting what is left aborts those.
        let mut aborted = None;
        if left.is_some_and(|n| n > 0) && (ctx.abort_in_flight || self.settings.rollout.abort_after_drain_timeout) {
            self.probes.abort_all(&w.url).await.map_err(|e| drain_failed(format!("POST /abort_request failed: {e}")))?;
            aborted = left;
            tracing::warn!(pdctl_unit = %w.unit, "aborted {} request(s) still in flight on {} before its restart", left.unwrap_or(0), w.url);
        }
        Ok(Some(json!({
            "warning": unknown.as_ref().map(Cause::sentence),
            "cause_code": unknown.as_ref().map(Cause::code),
            "aborted": aborted,
            "aborted_why": aborted.map(|_| if ctx.abort_in_flight { "its pairing is stale: its requests can never finish" } else { "abort_after_drain_timeout = true" }),
            "removed_router_id": entry.id, "router_load": entry.load, "in_flight_left": left, "replicas_drained": entries.len(),
            "in_flight_at_start": at_start, "waited_for_requests_ms": wait_t0.elapsed().as_millis() as u64,
            "router_status": entry.status, "unlisted_after_ms": listed_for_ms,
            "waited_ms": t0.elapsed().as_millis() as u64,
            "timed_out": left.is_some_and(|n| n > 0),
        })))
    }

    /// Write down in `ledger` that rollout `rollout_id` takes `w` (the gateway's entry
    /// `router_id`) out of the gateway — before the gateway is touched, so that whatever happens
    /// next (a failed gate, a crash, SIGKILL) the drain is found and undone (`hold`: kept out
    /// by a coherent switch, see [`Hold`]).
    pub(in crate::engine) async fn record_drain(
        &self,
        ledger: &Ledger,
        w: &Worker,
        router_id: &str,
        rollout_id: &str,
        ctx_hold: Option<Hold>,
    ) -> Result<(), Fail> {
        let st = self.units.state(&w.unit).await?;
        let d = Drain {
            unit: w.unit.clone(),
            url: w.url.clone(),
            role: w.role,
            bootstrap_port: w.bootstrap_port,
            invocation_id: st.invocation_id,
            router_id: router_id.to_string(),
            rollout_id: rollout_id.to_string(),
            drained_at: crate::lifecycle::now(),
            hold: ctx_hold,
        };
        ledger.record(&d).map_err(|e| Fail::from(Cause::RecordUnwritable { dir: "the drain ledger".into(), error: e.to_string() }))
    }

    /// Wait until the gateway no longer lists the worker (smg 1.x lists it as draining for ~5 s
    /// and still finishes its requests meanwhile); bounded by drain_timeout. Not for the only
    /// worker of its role: nothing else serves meanwhile, so that wait would only lengthen the
    /// outage (measured behind smg 1.13: 10 s per unit instead of ~7 s); the router gate waits
    /// out the draining entry before it re-registers the worker. Returns when it was unlisted.
    async fn wait_unlisted(&self, w: &Worker, entries: &[(usize, RouterWorker)], t0: Instant) -> Option<u64> {
        let alone = self.settings.workers.iter().filter(|o| o.role == w.role).count() == 1;
        'wait: while !alone && t0.elapsed() < self.settings.rollout.drain_timeout {
            for (r, _) in entries {
                if let Ok(l) = self.probes.router_workers(*r).await {
                    if l.iter().any(|x| crate::config::same_url(&x.url, &w.url)) {
                        tokio::time::sleep(POLL).await;
                        continue 'wait;
                    }
                }
            }
            return Some(t0.elapsed().as_millis() as u64);
        }
        None
    }

    /// Wait (bounded by drain_timeout from `t0`) until the worker runs no request: in flight at
    /// the start, left at the end, and a load that could not be read (a warning by the setting,
    /// else the failure).
    async fn wait_in_flight(&self, w: &Worker, t0: Instant) -> Result<(Option<u64>, Option<u64>, Option<Cause>), Fail> {
        let mut left = None;
        let mut at_start = None;
        let mut unknown: Option<Cause> = None;
        while t0.elapsed() < self.settings.rollout.drain_timeout {
            match self.probes.in_flight(&w.url).await {
                Ok(n) => {
                    at_start.get_or_insert(n);
                    left = Some(n);
                    if n == 0 {
                        break;
                    }
                }
                Err(e) => {
                    let c = Cause::LoadUnknown { url: w.url.clone(), error: e.to_string() };
                    if rule(crate::events::Step::Drain, &self.settings).mode == GateMode::Required {
                        return Err(c.into());
                    }
                    tracing::warn!(pdctl_unit = %w.unit, "{}", c.sentence());
                    unknown = Some(c);
                    break;
                }
            }
            tokio::time::sleep(POLL).await;
        }
        Ok((at_start, left, unknown))
    }
}
