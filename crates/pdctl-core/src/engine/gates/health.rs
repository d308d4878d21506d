//! The health gate: `/health` (and `/ready` where served) answers 200 for the same run.

use std::time::Instant;

use serde_json::{json, Value};

use crate::cause::{Cause, Phase};
use crate::config::Worker;
use crate::engine::step::{within, Fail, POLL};
use crate::engine::Engine;
use crate::judge::crashed_since;
use crate::ports::{Health, Logs, Probes, UnitState, Units};

impl<U: Units, L: Logs, P: Probes> Engine<U, L, P> {
    pub(in crate::engine) async fn health(&self, w: &Worker, after: Option<&UnitState>) -> Result<Value, Fail> {
        let t0 = Instant::now();
        let limit = self.settings.rollout.health_timeout;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last = match within(t0, limit, self.probes.health(&w.url)).await {
                // Where the server serves `/ready` (0.5.23), it must say ready too: `/health` can
                // answer 200 again after a failed PD warm-up, and a paused server is not serving.
                Some(Health::Up) => match within(t0, limit, self.probes.ready(&w.url)).await {
                    Some(None) => return Ok(json!({ "attempts": attempts, "checked": ["/health"] })),
                    Some(Some(Health::Up)) => return Ok(json!({ "attempts": attempts, "checked": ["/health", "/ready"] })),
                    Some(Some(Health::Unavailable(s) | Health::Down(s))) => format!("/health 200, but {s}"),
                    None => "/health 200, /ready did not answer".into(),
                },
                Some(Health::Unavailable(s)) => format!("{s} (warming up or unhealthy)"),
                Some(Health::Down(s)) => s,
                None => "no answer".into(),
            };
            if let Some(after) = after {
                let st = self.units.state(&w.unit).await?;
                if let Some(why) = crashed_since(&st, after) {
                    return Err(Cause::Crashed { unit: w.unit.clone(), phase: Phase::Health, why }.into());
                }
            }
            if t0.elapsed() >= limit {
                return Err(Cause::HealthTimeout { url: w.url.clone(), after: limit, last }.into());
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
