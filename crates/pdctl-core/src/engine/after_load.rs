//! What a load of new weights in place leaves behind, and how pdctl deals with it: the prefix
//! cache the old weights filled (flushed while paused, after the continue, or in a short
//! `retract` quiet window under load; else the rollout fails naming the worker), and a pause as
//! long as SGLang's `/health` timeout (said before it from the worker's last load; after it,
//! pdctl's own `/health` sets each worker Up again).

use std::time::Instant;

use crate::cause::Cause;
use crate::config::{Role, Worker};
use crate::engine::context::Notes;
use crate::engine::machine::Engine;
use crate::engine::step_run::Fail;
use crate::engine::work::WeightsTarget;
use crate::ports::{Health, Logs, PauseMode, Probes, Units};

/// What a worker served before: `(model_path, weight_version)`.
pub(in crate::engine) type Served = (String, String);

/// How `w` is paused: `retract` (its requests in flight are recomputed under the new weights),
/// except a decode when a prefill it may pair with has an API key (`keyed`) — then `in_place`
/// (see [`IN_PLACE_NOTE`]).
pub(in crate::engine) fn pause_mode(w: &Worker, keyed: bool) -> PauseMode {
    if w.role == Role::Decode && keyed {
        PauseMode::InPlace
    } else {
        PauseMode::Retract
    }
}

pub(in crate::engine) fn loaded_notes(to: WeightsTarget<'_>, waited: u64, notes: &Notes) {
    if !to.config {
        notes.push(format!(
            "the units' ExecStart still name the model path they started with: a restart loads that again (refused as mixed_versions while the other role serves {}); put --model-path {} in their unit files",
            to.model_path, to.model_path
        ));
    }
    notes.push(format!(
        "every worker was paused for {} while the new weights loaded: a request that arrived meanwhile waited for its end, one running at the pause finished after it (recomputed under the new weights where paused retract), and none was sent to a worker of another version",
        crate::cause::dur(&std::time::Duration::from_millis(waited))
    ));
}

/// Why decodes were paused `in_place`, for the rollout's notes. After a `retract` pause, 0.5.23's
/// decode asks the prefill to recompute each retracted request's KV by POSTing the prefill's
/// `/generate` *without* an `Authorization` header (`disaggregation/common/conn.py`
/// `_run_prefill_recompute`): against a prefill started with `--api-key` every request running on
/// a decode at the pause fails with 401 at the continue (measured on the real server; a gateway
/// may then retry it from the start).
pub const IN_PLACE_NOTE: &str = "decodes were paused in_place, not retract: a prefill has an API key, and SGLang 0.5.23's decode re-fetches a retracted request's KV through the prefill's /generate without it (each would fail with 401); the requests running on a decode at the pause finished with KV computed by the previous weights";

impl<U, L, P> Engine<U, L, P>
where
    U: Units,
    L: Logs,
    P: Probes,
{
    /// Before the pause: a worker whose last load took as long as its `/health` timeout will be
    /// marked UnHealthy by any `/health` during this one; said with the numbers ([`long_load`]).
    pub(in crate::engine) async fn long_load_ahead(&self, before: &[(&Worker, Served)], dir: Option<&std::path::Path>, notes: &Notes) {
        let Some(dir) = dir else { return };
        for (w, _) in before {
            let Some(last) = crate::state::revisions::last_load(dir, &w.unit) else { continue };
            let env = self.units.config(&w.unit).await.map(|c| c.environment).unwrap_or_default();
            if let Some(said) = long_load(&w.unit, std::time::Duration::from_millis(last.ms), crate::sglang::health_check_timeout(&env)) {
                tracing::warn!(pdctl_unit = %w.unit, "{said}");
                notes.push(said);
            }
        }
    }

    /// After a pause as long as a worker's `/health` timeout, a `/health` sent during it (the
    /// gateway's check) failed and left the server UnHealthy (`/ready` 503, a SIGTERM then
    /// force-exits): pdctl's own `/health` after the continue sets it Up again. Said in a note.
    pub(in crate::engine) async fn healthy_again(&self, paused: &[&Worker], waited_ms: u64, notes: &Notes) {
        let mut said = Vec::new();
        let mut shortest: Option<std::time::Duration> = None;
        for w in paused {
            let env = self.units.config(&w.unit).await.map(|c| c.environment).unwrap_or_default();
            let limit = crate::sglang::health_check_timeout(&env);
            if u128::from(waited_ms) < limit.as_millis() {
                continue;
            }
            shortest = Some(shortest.map_or(limit, |s| s.min(limit)));
            let h = self.probes.health(&w.url).await;
            said.push(format!("{} ({})", w.unit, if h == Health::Up { "Up again".to_string() } else { format!("still not: {h:?}") }));
        }
        if let Some(limit) = shortest {
            notes.push(format!(
                "the pause ({}) was as long as SGLang's /health timeout ({}, {}): a /health sent during it — the gateway's health check — failed and marked the server UnHealthy (smg 1.13 drops a worker after 3 failed checks, 60 s apart); pdctl's /health after the continue: {}",
                crate::cause::dur(&std::time::Duration::from_millis(waited_ms)),
                crate::cause::dur(&limit),
                crate::sglang::HEALTH_CHECK_TIMEOUT_ENV,
                said.join(", ")
            ));
        }
    }

    /// Every worker not flushed while paused, flushed after the continue ([`Self::flush_under_load`]);
    /// the first that could not be, with its failure.
    pub(in crate::engine) async fn flush_after_continue(
        &self,
        before: &[(&Worker, Served)],
        flushed: &mut [Option<String>],
        modes: &[PauseMode],
        limit: std::time::Duration,
    ) -> Option<(String, Fail)> {
        let mut stale_cache: Option<(String, Fail)> = None;
        for (((w, _), f), mode) in before.iter().zip(flushed.iter_mut()).zip(modes).filter(|((_, f), _)| f.is_none()) {
            *f = Some(match self.flush_under_load(w, *mode, limit).await {
                Ok(how) => how,
                Err(why) => {
                    let cause = Cause::WeightsFailed { unit: w.unit.clone(), why: unflushed(w, &why, limit) };
                    stale_cache.get_or_insert((w.unit.clone(), Fail::from(cause)));
                    format!("not flushed: {why}")
                }
            });
        }
        stale_cache
    }

    /// Flush `w`'s cache after the continue, under whatever load it serves (0.5.23 flushes only
    /// a fully idle scheduler: requests running, a prefill's held rooms or chunked request, a
    /// decode's PD queues keep it busy). Tried every 250 ms up to `limit`, each try a plain flush
    /// and — for a worker paused `retract` — a short quiet window: paused alone (`retract`: what
    /// runs is retracted and recomputed under the new weights, new requests wait at admission),
    /// flushed (a retracted request does not count as running), continued at once. Says how it
    /// was flushed, or why not.
    pub(in crate::engine) async fn flush_under_load(&self, w: &Worker, mode: PauseMode, limit: std::time::Duration) -> Result<String, String> {
        let t0 = Instant::now();
        let mut last = String::from("refused: requests still running or waiting");
        let mut windows = 0u32;
        while t0.elapsed() < limit {
            match self.probes.flush_cache(&w.url, limit).await {
                Ok(true) => return Ok(format!("after the continue, {} ms later", t0.elapsed().as_millis())),
                Ok(false) => {}
                Err(e) => last = e.to_string(),
            }
            if mode == PauseMode::Retract {
                windows += 1;
                let p0 = Instant::now();
                if let Err(e) = self.probes.pause(&w.url, PauseMode::Retract, limit).await {
                    last = format!("its quiet window could not pause it: {e}");
                } else {
                    let flushed = matches!(self.probes.flush_cache(&w.url, limit).await, Ok(true));
                    let held = p0.elapsed().as_millis();
                    if let Err(e) = self.probes.resume(&w.url, limit).await {
                        return Err(format!("it did not continue after a quiet window ({e}): continue it by hand (POST {}/continue_generation)", w.url));
                    }
                    if flushed {
                        return Ok(format!("in a quiet window after the continue (paused retract {held} ms, window {windows})"));
                    }
                    last = format!("refused in {windows} quiet window(s) too: rooms held for a decode, or a decode's PD queues");
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        Err(last)
    }
}

/// What a load as long as the last one (`last`) will do to `unit` whose `/health` gives up after
/// `health_timeout` (`None`: nothing). smg 1.13 checks each worker every 60 s with a 5 s timeout
/// and drops it after 3 failures (`router_args.py`).
pub fn long_load(unit: &str, last: std::time::Duration, health_timeout: std::time::Duration) -> Option<String> {
    (last >= health_timeout).then(|| {
        format!(
            "{unit}: its last load of new weights took {}, as long as SGLang's /health timeout ({}, {}): every /health sent during this pause (the gateway's check) will fail and mark it UnHealthy until pdctl's /health after the continue; smg 1.13 drops a worker after 3 failed checks 60 s apart, so a pause of about 2 min or more can take it out of the gateway",
            crate::cause::dur(&last),
            crate::cause::dur(&health_timeout),
            crate::sglang::HEALTH_CHECK_TIMEOUT_ENV
        )
    })
}

/// The sentence of a worker whose cache could not be flushed after a load.
fn unflushed(w: &Worker, why: &str, limit: std::time::Duration) -> String {
    format!(
        "its prefix cache was not flushed within {} after the load ({why}): it serves the new weights, but prompts whose prefix it cached before may be answered from KV the old weights computed until evicted; flush it when it is idle (curl -X POST {}/flush_cache), or restart it through every gate (pdctl restart --rolling --unit {})",
        crate::cause::dur(&limit),
        w.url,
        w.unit
    )
}
