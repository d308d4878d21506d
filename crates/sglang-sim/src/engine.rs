//! The simulated scheduler: request and KV-cache accounting, and SGLang's rules for when gauges are
//! published (`log_stats()` after a prefill batch, every 40 decode iterations, or at the idle
//! publish), rendered as Prometheus text the way `prometheus_client` in multiprocess mode does.
//!
//! The PD queue gauges follow the same rule (0.5.23 `managers/scheduler_components/
//! metrics_reporter.py`: `report_prefill_stats`, `report_decode_stats`, `_maybe_log_idle_metrics`):
//! a room moving between queues changes what `/v1/loads` reads at once, but `/metrics` only at the
//! next batch report or idle publish — at once when the published running count no longer matches
//! the running batch, otherwise up to 30 s later.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::args::{Mode, SimConfig};
use crate::exposition::Family;
use crate::log;
use crate::service::{streaming, Series, Service};

mod render;

/// SGLang's `--decode-log-interval` default: decode stats are published every 40 iterations.
pub const DECODE_LOG_INTERVAL: u64 = 40;

/// `server_status` as SGLang tracks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Loading finished, warmup running: `/health` answers 503.
    Starting,
    /// Warmup done (or skipped): `/health` answers 200.
    Up,
}

/// The values `log_stats()` last wrote (gauges are `mostrecent`).
#[derive(Debug, Clone, Copy, Default)]
struct Published {
    running: u64,
    queued: u64,
    used: u64,
    available: u64,
    evictable: u64,
    gen_throughput: f64,
    cache_hit_rate: f64,
    bootstrap_queue: u64,
    prealloc_queue: u64,
    deferred_release: u64,
}

/// One stats rank's KV pool (an attention-DP group's scheduler; the only one without attention
/// DP) and what it last published: each rank logs its own stats under its own labels.
#[derive(Debug)]
struct Pool {
    running: u64,
    used: u64,
    evictable: u64,
    decode_iters: u64,
    last_publish: Instant,
    published: Option<Published>,
    last_decode_tps: f64,
}

impl State {
    /// Running requests on every rank.
    fn running(&self) -> u64 {
        self.ranks.iter().map(|p| p.running).sum()
    }

    /// Tokens in use on every rank.
    fn used(&self) -> u64 {
        self.ranks.iter().map(|p| p.used).sum()
    }
}

impl Pool {
    fn new() -> Pool {
        Pool { running: 0, used: 0, evictable: 0, decode_iters: 0, last_publish: Instant::now(), published: None, last_decode_tps: 0.0 }
    }
}

#[derive(Debug)]
struct State {
    status: Status,
    /// One pool per stats rank ([`SimConfig::attn_dp_size`]).
    ranks: Vec<Pool>,
    /// The rank the next request goes to (SGLang's DP controller: `round_robin` for a decode
    /// and a plain server; a prefill's `follow_bootstrap_room` is a room's remainder, as even).
    next_rank: usize,
    /// The tokenizer manager's histograms and request counter.
    service: Service,
    prompt_tokens_total: u64,
    generation_tokens_total: u64,
    /// Prompt and generated tokens of finished requests by `is_streaming` (0.5.23's tokenizer
    /// manager counts them when a request finishes: `sglang:prompt_tokens_total`,
    /// `sglang:generation_tokens_total`, labelled `is_streaming`).
    finished_tokens: std::collections::BTreeMap<bool, (u64, u64)>,
    aborted_total: u64,
    /// Prefill: rooms whose KV is held for a decode that has not fetched it yet. Their requests
    /// left the running batch (`running` does not count them), as in SGLang's PD prefill, where a
    /// request waits in the bootstrap or inflight queue, not in `running_batch`.
    bootstrap_queue: u64,
    /// Decode: requests waiting before their transfer (`--sim-transfer-delay-secs`).
    prealloc_queue: u64,
    /// Decode: failed requests whose KV allocation is still held (the deferred release).
    deferred_release: u64,
    /// The weights served now: model path, served model name, weight version (the flags', until
    /// `/update_weights_from_disk` loads others).
    weights: Weights,
    /// Decode: PD requests whose KV was computed by a prefill of another weight version than
    /// this decode's when it decoded them (a simulator-only figure).
    mixed_versions: u64,
    /// Decode: PD requests decoded at all (so that 0 mixed is a measurement, not a silence).
    pd_decoded: u64,
    /// `/continue_generation` after a `retract` pause: requests in flight then were recomputed
    /// with the weights served from then on.
    retractions: u64,
}

pub use crate::served_model::Weights;

/// The simulator-only counter of mixed-version PD requests (not an SGLang metric: named apart).
pub const MIXED_VERSIONS: &str = "sglang_sim_pd_mixed_version_requests";
/// The simulator-only counter of PD requests a decode decoded.
pub const PD_DECODED: &str = "sglang_sim_pd_decoded_requests";

/// Shared simulator state; cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
    cfg: Arc<SimConfig>,
    state: Arc<Mutex<State>>,
    /// `Some(mode)` while generation is paused (`/pause_generation`): the scheduler runs nothing,
    /// a prefill sends no KV.
    paused: Arc<tokio::sync::watch::Sender<Option<String>>>,
    /// The role the scheduler runs now: `--disaggregation-mode`, until `/pd_role_switch` flips it.
    role: Arc<Mutex<Mode>>,
    /// Decode CUDA graphs were captured (0.5.23's `tp_worker.get_decode_cuda_graph_bs()` not
    /// empty): a decode started without `--disable-cuda-graph`, or a flip to decode that captured.
    decode_graphs: Arc<std::sync::atomic::AtomicBool>,
}

/// Tokens a running request holds; returned to the pool with [`Engine::finish`].
#[derive(Debug)]
pub struct Ticket {
    held: u64,
    generated: u64,
    /// The stats rank whose pool holds it.
    rank: usize,
}

impl Engine {
    /// A scheduler whose KV pool was just allocated (constants are written now in ≥0.5.11).
    pub fn new(cfg: Arc<SimConfig>) -> Engine {
        Engine {
            paused: Arc::new(tokio::sync::watch::channel(None).0),
            role: Arc::new(Mutex::new(cfg.mode)),
            decode_graphs: Arc::new(std::sync::atomic::AtomicBool::new(cfg.mode == Mode::Decode && !cfg.disable_cuda_graph)),
            state: Arc::new(Mutex::new(State {
                status: Status::Starting,
                ranks: (0..cfg.stats_ranks()).map(|_| Pool::new()).collect(),
                next_rank: 0,
                service: Service::default(),
                prompt_tokens_total: 0,
                generation_tokens_total: 0,
                finished_tokens: std::collections::BTreeMap::new(),
                aborted_total: 0,
                bootstrap_queue: 0,
                prealloc_queue: 0,
                deferred_release: 0,
                weights: Weights {
                    model_path: cfg.model_path.clone(),
                    served_model_name: cfg.served_model_name.clone(),
                    version: cfg.weight_version.clone(),
                    build: Weights::build_of(&cfg.given, &cfg.model_path),
                    unreported: None,
                },
                mixed_versions: 0,
                pd_decoded: 0,
                retractions: 0,
            })),
            cfg,
        }
    }

    /// The pause (`Some(mode)` while paused), shared by the HTTP side and the PD hand-off.
    pub fn pause(&self) -> &Arc<tokio::sync::watch::Sender<Option<String>>> {
        &self.paused
    }

    /// Wait while paused (a paused scheduler runs nothing).
    pub async fn wait_unpaused(&self) {
        let mut rx = self.paused.subscribe();
        let _ = rx.wait_for(Option::is_none).await;
    }

    /// The weights served now.
    pub fn weights(&self) -> Weights {
        self.lock().weights.clone()
    }

    /// `/update_weights_from_disk` loaded `model_path` (and `version`, when given): 0.5.23's
    /// `_update_model_path_info` sets the served model name to the path too.
    pub fn load_weights(&self, model_path: &str, version: Option<&str>) {
        let mut s = self.lock();
        s.weights.unreported = None;
        s.weights.model_path = model_path.to_string();
        s.weights.served_model_name = model_path.to_string();
        if let Some(v) = version {
            s.weights.version = v.to_string();
        }
    }

    /// A weight update whose cache flush was refused: the model computes with `model_path`
    /// (`version`: the new one when given) while `/model_info` keeps reporting the weights before.
    pub fn load_weights_unreported(&self, model_path: &str, version: Option<&str>) {
        let mut s = self.lock();
        let version = version.map(String::from).unwrap_or_else(|| s.weights.version.clone());
        s.weights.unreported = Some(format!("{model_path}@{version}{}", s.weights.build));
    }

    /// Whether a cache flush now would find the scheduler busy (0.5.23 `scheduler.py`
    /// `flush_cache` → `is_fully_idle(ignore_waiting=paused)`): rooms in a PD queue or a deferred
    /// KV release always count; requests in flight count unless a `retract` pause took them out
    /// of the running batch — back to the waiting queue, which a paused flush ignores, or on a
    /// decode to the prealloc queue's held rebootstraps (`hold_rebootstrap`, kept out of the
    /// queue so that the flush after a weight update passes). An `in_place` pause leaves them
    /// running. Measured on the real server (tests/differential.rs, tests/real.rs).
    pub fn busy(&self) -> bool {
        let s = self.lock();
        let queues = s.bootstrap_queue > 0 || s.prealloc_queue > 0 || s.deferred_release > 0;
        let retracted = self.paused.borrow().as_deref() == Some("retract");
        queues || (!retracted && s.running() > 0)
    }

    /// How many `retract` pauses were continued (a request or room from before one was
    /// recomputed with the weights served since).
    pub fn retractions(&self) -> u64 {
        self.lock().retractions
    }

    /// A `retract` pause was continued.
    pub fn count_retraction(&self) {
        self.lock().retractions += 1;
    }

    /// Decode: a PD request decoded from KV computed by the model `kv_model`
    /// ([`Weights::identity`]); counted mixed when that is not this server's.
    pub fn count_decoded(&self, kv_model: &str) {
        let mut s = self.lock();
        s.pd_decoded += 1;
        if s.weights.identity() != kv_model {
            s.mixed_versions += 1;
        }
    }

    /// The role the scheduler runs now (the startup role until a `/pd_role_switch`).
    pub fn mode(&self) -> Mode {
        *self.role.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `/pd_role_switch` rebuilt the scheduler as `mode`.
    pub fn set_mode(&self, mode: Mode) {
        *self.role.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }

    /// Whether decode CUDA graphs were captured.
    pub fn decode_graphs(&self) -> bool {
        self.decode_graphs.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A flip to decode captured its graphs.
    pub fn set_decode_graphs(&self) {
        self.decode_graphs.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The configuration the simulator runs with.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another request panicked mid-update; the counters are
        // still usable for a simulator.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current server status.
    pub fn status(&self) -> Status {
        self.lock().status
    }

    /// The PD queues as the scheduler holds them now (not as last published): the prefill's rooms
    /// held for a decode, the decode's requests waiting before their transfer.
    pub fn pd_queue_sizes(&self) -> (u64, u64) {
        let s = self.lock();
        (s.bootstrap_queue, s.prealloc_queue)
    }

    /// A request ended by an abort (`sglang:num_aborted_requests_total`).
    pub fn count_abort(&self) {
        self.lock().aborted_total += 1;
    }

    /// A request's first output, `secs` after it arrived (never on a PD prefill: the caller
    /// does not report one there).
    pub fn observe_first_token(&self, stream: bool, secs: f64) {
        self.lock().service.first_token(stream, secs);
    }

    /// `tokens` more output tokens, `secs` after the previous output.
    pub fn observe_later_tokens(&self, secs: f64, tokens: u64) {
        self.lock().service.later_tokens(secs, tokens);
    }

    /// A request finished (not aborted), `secs` after it arrived.
    pub fn observe_finished(&self, stream: bool, secs: f64, prompt_tokens: u64, generated: u64) {
        let mut s = self.lock();
        s.service.finished(stream, secs);
        let t = s.finished_tokens.entry(stream).or_default();
        t.0 += prompt_tokens;
        t.1 += generated;
    }

    /// Mark warmup finished.
    pub fn set_up(&self) {
        self.lock().status = Status::Up;
    }

    /// KV pool size.
    pub fn max_total_tokens(&self) -> u64 {
        self.cfg.sim.max_total_tokens
    }

    /// Running requests (the running batch), waiting requests (a prefill's held rooms, a decode's
    /// prealloc queue: SGLang counts its PD queues in `num_waiting_reqs`,
    /// `managers/scheduler_components/load_inquirer.py`) and tokens in use, for `/v1/loads` and
    /// `/get_load`.
    pub fn load(&self) -> (u64, u64, u64) {
        let s = self.lock();
        (s.running(), s.bootstrap_queue + s.prealloc_queue, s.used())
    }

    /// Rank `r` logs its stats. The PD queues are the server's, logged by rank 0 (the other
    /// ranks' stay 0: a simplification of per-rank queues).
    fn publish(&self, s: &mut State, r: usize) {
        if self.cfg.sim.no_metrics_publish {
            return;
        }
        let max = self.max_total_tokens();
        let queues = if r == 0 { (s.bootstrap_queue, s.prealloc_queue, s.deferred_release) } else { (0, 0, 0) };
        let Some(p) = s.ranks.get_mut(r) else { return };
        p.published = Some(Published {
            running: p.running,
            queued: 0,
            used: p.used,
            available: max.saturating_sub(p.used + p.evictable),
            evictable: p.evictable,
            gen_throughput: p.last_decode_tps,
            cache_hit_rate: 0.0,
            bootstrap_queue: queues.0,
            prealloc_queue: queues.1,
            deferred_release: queues.2,
        });
        p.last_publish = Instant::now();
    }

    /// A request arrives: the prefill batch allocates its prompt tokens. Prefill batches
    /// publish the gauges (`report_prefill_stats`); a PD decode server runs no prefill batch.
    pub fn admit(&self, prompt_tokens: u64) -> Ticket {
        let max = self.max_total_tokens();
        let mut s = self.lock();
        let rank = s.next_rank % s.ranks.len().max(1);
        s.next_rank = s.next_rank.wrapping_add(1);
        s.prompt_tokens_total += prompt_tokens;
        let need = prompt_tokens.min(max);
        let Some(p) = s.ranks.get_mut(rank) else { return Ticket { held: 0, generated: 0, rank } };
        p.running += 1;
        // Evict cached (finished) tokens when the free pool is short.
        let free = max.saturating_sub(p.used + p.evictable);
        if free < need {
            p.evictable = p.evictable.saturating_sub(need - free);
        }
        p.used += need;
        if self.mode() != Mode::Decode {
            let (used, running) = (p.used, p.running);
            log::line(&format!(
                "Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, token usage: {:.2}, #running-req: {}, #queue-req: 0",
                used as f64 / max as f64,
                running.saturating_sub(1)
            ));
            self.publish(&mut s, rank);
        }
        Ticket { held: need, generated: 0, rank }
    }

    /// One decode iteration produced a token for `t`; every 40 iterations decode stats publish.
    pub fn decode_step(&self, t: &mut Ticket) {
        let max = self.max_total_tokens();
        let tps = self.cfg.sim.tokens_per_sec;
        let mut s = self.lock();
        let Some(p) = s.ranks.get_mut(t.rank) else { return };
        if p.used + p.evictable < max {
            p.used += 1;
            t.held += 1;
        }
        t.generated += 1;
        p.decode_iters += 1;
        p.last_decode_tps = tps * p.running.max(1) as f64;
        if p.decode_iters % DECODE_LOG_INTERVAL == 0 {
            log::line(&format!(
                "Decode batch, #running-req: {}, #token: {}, token usage: {:.2}, gen throughput (token/s): {:.2}, #queue-req: 0",
                p.running,
                p.used,
                p.used as f64 / max as f64,
                p.last_decode_tps
            ));
            self.publish(&mut s, t.rank);
        }
    }

    /// The request finished: its tokens move to the radix cache (evictable).
    pub fn finish(&self, t: Ticket) {
        let mut s = self.lock();
        s.generation_tokens_total += t.generated;
        if let Some(p) = s.ranks.get_mut(t.rank) {
            p.running = p.running.saturating_sub(1);
            p.used = p.used.saturating_sub(t.held);
            p.evictable += t.held;
        }
    }

    /// Prefill: a request's prefill batch is done and its room is held for the decode: it leaves
    /// the running batch for the bootstrap queue. Nothing is published here; the next idle
    /// publish sees the running gauge stale and publishes at once.
    pub fn hold_room(&self, t: &Ticket) {
        let mut s = self.lock();
        if let Some(p) = s.ranks.get_mut(t.rank) {
            p.running = p.running.saturating_sub(1);
        }
        s.bootstrap_queue += 1;
    }

    /// Prefill: a held room ended (fetched, timed out or aborted): its tokens move to the radix
    /// cache. The gauges keep the last published queue until a batch report or the idle publish.
    pub fn release_room(&self, t: Ticket) {
        let mut s = self.lock();
        s.bootstrap_queue = s.bootstrap_queue.saturating_sub(1);
        s.generation_tokens_total += t.generated;
        if let Some(p) = s.ranks.get_mut(t.rank) {
            p.used = p.used.saturating_sub(t.held);
            p.evictable += t.held;
        }
    }

    /// Decode: a request enters (`add`) or leaves its prealloc queue (waiting before its
    /// transfer). Published only at the next batch report or idle publish.
    pub fn prealloc(&self, add: bool) {
        let mut s = self.lock();
        s.prealloc_queue = if add { s.prealloc_queue + 1 } else { s.prealloc_queue.saturating_sub(1) };
    }

    /// Decode: a failed request's KV allocation is held (`add`) or released at last (the
    /// deferred release). Published at the next batch report or idle publish.
    pub fn deferred_release(&self, add: bool) {
        let mut s = self.lock();
        s.deferred_release = if add { s.deferred_release + 1 } else { s.deferred_release.saturating_sub(1) };
    }

    /// A `/health` generate on an idle prefill-capable scheduler is a prefill batch.
    pub fn health_probe(&self) {
        let mut s = self.lock();
        if self.mode() != Mode::Decode && s.running() == 0 {
            // The health generate runs on one DP rank: the first.
            self.publish(&mut s, 0);
        }
    }

    /// `_maybe_log_idle_metrics` (0.5.23): when no batch runs, publish at once if the published
    /// running count disagrees with the running batch (a prefill whose last request moved to a PD
    /// queue), else only when the last publish is older than the idle period (30 s). Called once a
    /// second (SGLang: every idle scheduler loop).
    pub fn idle_tick(&self) {
        let mut s = self.lock();
        for r in 0..s.ranks.len() {
            let p = &s.ranks[r];
            if p.running != 0 {
                continue;
            }
            let stale = p.published.is_some_and(|x| x.running != p.running);
            if stale || p.last_publish.elapsed() >= self.cfg.sim.idle_publish {
                self.publish(&mut s, r);
            }
        }
    }

    /// `/flush_cache`: drop the radix cache unless the scheduler is [`Engine::busy`].
    pub fn flush_cache(&self) -> bool {
        if self.busy() {
            return false;
        }
        for p in &mut self.lock().ranks {
            p.evictable = 0;
        }
        true
    }
}

/// How long a request of `tokens` takes at the configured speed.
pub fn token_interval(cfg: &SimConfig) -> Duration {
    Duration::from_secs_f64(1.0 / cfg.sim.tokens_per_sec)
}

#[cfg(test)]
mod tests;
