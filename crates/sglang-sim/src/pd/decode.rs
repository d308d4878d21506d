//! The decode's side of PD pairing: its heartbeat to the prefills it pairs with, the bootstrap
//! info it caches per prefill address (stale after that prefill restarts, until upstream PR 36029),
//! the KV fetch of each request, and the recompute a `retract` pause asks of the prefill.

use super::*;

impl Pd {
    /// Decode: the heartbeat (`_start_heartbeat_checker_thread`, `disaggregation/common/conn.py`):
    /// every `heartbeat_interval` GET each cached prefill's bootstrap `/health` (timeouts 2 s
    /// connect, 3 s read); after `heartbeat_failures` failures in a row drop its cached info.
    pub fn start_heartbeat(&self) {
        if self.inner.heartbeat.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let cfg = me.cfg();
            let http = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_else(|_| reqwest::Client::new());
            let mut failures: HashMap<String, u32> = HashMap::new();
            loop {
                tokio::time::sleep(cfg.heartbeat_interval).await;
                let addrs: Vec<String> = lock(&me.inner.cache).keys().cloned().collect();
                failures.retain(|a, _| addrs.contains(a));
                for addr in addrs {
                    let ok = http.get(format!("http://{addr}/health")).send().await.is_ok_and(|r| r.status().is_success());
                    let n = failures.entry(addr.clone()).or_insert(0);
                    *n = if ok { 0 } else { *n + 1 };
                    if *n >= cfg.heartbeat_failures {
                        lock(&me.inner.cache).remove(&addr);
                        failures.remove(&addr);
                        log::line(&format!("Prefill node {addr} failed its heartbeat {} times; dropping its bootstrap info", cfg.heartbeat_failures));
                    }
                }
            }
        });
    }

    /// Decode: the bootstrap info of the prefill named by `b` (`key`): cached, else fetched from
    /// its `/route` and cached. One the decode cannot pair with kills the decode, as SGLang's
    /// scheduler dies on it.
    async fn bootstrap_info(&self, rid: &str, b: &Bootstrap, key: &str) -> Result<Route, String> {
        let cfg = self.cfg();
        let cached = lock(&self.inner.cache).get(key).cloned();
        match cached {
            Some(r) => Ok(r),
            None => {
                let r = self.fetch_route(&b.host, b.port).await.map_err(|e| {
                    let m = format!(
                        "Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={} with exception KVTransferError(bootstrap_room={}): Could not fetch prefill parallel info from bootstrap_addr: {key}: {e}",
                        b.room, b.room
                    );
                    log::line(&m);
                    m
                })?;
                if let Some(why) = incompatible(cfg, &r) {
                    // `try_ensure_parallel_info` raises in the decode's scheduler: the server dies.
                    log::line("Scheduler hit an exception: Traceback (most recent call last):");
                    log::raw("  File \"/usr/lib/python3/dist-packages/sglang/srt/disaggregation/common/conn.py\", line 1323, in try_ensure_parallel_info");
                    log::raw(&format!("RuntimeError: {why}"));
                    log::line("Received sigquit from a child process. It usually means the child failed.");
                    // SAFETY: kill(2) on our own pid; SGLang's SIGQUIT handler kills its process tree.
                    unsafe {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                }
                lock(&self.inner.cache).insert(key.to_string(), r.clone());
                Ok(r)
            }
        }
    }

    /// Decode: get the room's KV from the prefill named by `b` (through the cached bootstrap
    /// info, fetched from `/route` when missing). Returns the weight version the KV was computed
    /// with ([`crate::engine::Weights::identity`], a simulator-only field of the hand-off), or the
    /// abort message on failure.
    pub async fn receive(&self, rid: &str, b: &Bootstrap) -> Result<String, String> {
        let started = Instant::now();
        let cfg = self.cfg();
        let stall = *lock(&self.inner.stall_until);
        if let Some(until) = stall.filter(|u| *u > started) {
            // A full prealloc queue: the request waits before its transfer — the window in
            // which a decode killed mid-request strands the prefill's KV.
            self.engine.prealloc(true);
            tokio::time::sleep_until(until.into()).await;
            self.engine.prealloc(false);
        }
        let key = format!("{}:{}", b.host, b.port);
        let route = self.bootstrap_info(rid, b, &key).await?;
        let waiting = cfg.waiting_timeout;
        let url = format!("http://{}:{}/kv/{}", route.rank_ip, route.rank_port, b.room);
        let body = json!({"identity": route.identity, "page_size": cfg.page_size, "kv_cache_dtype": cfg.kv_cache_dtype});
        let left = waiting.saturating_sub(started.elapsed());
        let answer = tokio::time::timeout(left, self.inner.http.post(&url).json(&body).send()).await;
        let stale = match answer {
            Ok(Ok(r)) if r.status().is_success() => {
                let v: Value = r.json().await.unwrap_or_default();
                return Ok(v.get("model").and_then(Value::as_str).unwrap_or_default().to_string());
            }
            Ok(Ok(r)) if r.status() == reqwest::StatusCode::CONFLICT => {
                // Rejected by the prefill (incompatible settings): at once, the entry stays.
                let text = r.text().await.unwrap_or_default();
                let m = format!(
                    "Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={} with exception KVTransferError(bootstrap_room={}): {text}",
                    b.room, b.room
                );
                log::line(&m);
                self.defer_release();
                return Err(m);
            }
            // The room never came (the prefill half was not sent): the prefill waited for it.
            Ok(Ok(r)) if r.status() == reqwest::StatusCode::NOT_FOUND => false,
            // The rank port is gone (the old process): after the fix the send fails after the
            // send timeout (`SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT`) and the cached info is
            // dropped (`invalidate_cached_bootstrap_infos`); the next request refetches.
            Ok(Err(_)) if cfg.sim.pair_cache == PairCache::Refresh => {
                tokio::time::sleep(cfg.send_timeout.min(waiting.saturating_sub(started.elapsed()))).await;
                true
            }
            // Before the fix, or a port that belongs to another generation: no KV ever arrives;
            // the request fails at the waiting timeout.
            Ok(Ok(_)) | Ok(Err(_)) => {
                tokio::time::sleep(waiting.saturating_sub(started.elapsed())).await;
                true
            }
            Err(_) => false,
        };
        if stale && cfg.sim.pair_cache == PairCache::Refresh {
            // PR 36029: drop the entry only if it is still the generation this request used.
            let mut c = lock(&self.inner.cache);
            if c.get(&key).is_some_and(|r| r.identity == route.identity) {
                c.remove(&key);
            }
        }
        let m = format!(
            "Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={} with exception KVTransferError(bootstrap_room={}): Request {} timed out after {:.1}s in KVPoll.WaitingForInput",
            b.room,
            b.room,
            b.room,
            started.elapsed().as_secs_f64()
        );
        log::line(&m);
        self.defer_release();
        Err(m)
    }

    /// Decode: a failed transfer's KV allocation stays held until the deferred release's timeout
    /// (`SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT`, 30 s; the prefill's
    /// acknowledgement is not simulated): `/flush_cache` is refused meanwhile.
    fn defer_release(&self) {
        let Some(t) = self.cfg().deferred_release else { return };
        self.engine.deferred_release(true);
        let engine = self.engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(t).await;
            engine.deferred_release(false);
        });
    }

    /// Decode: requests arriving in the next `secs` wait that long before their transfer
    /// (`POST /sim/stall_transfers?secs=N`, a simulator fault).
    pub fn stall_transfers(&self, secs: f64) {
        *lock(&self.inner.stall_until) = Some(Instant::now() + Duration::from_secs_f64(secs.max(0.0)));
        log::line(&format!("simulated fault: KV transfers wait {secs} s in the prealloc queue"));
    }

    /// Decode: a request held by a `retract` pause is rebootstrapped at the continue — 0.5.23's
    /// decode asks its prefill to recompute the prefix KV under the weights served now by
    /// POSTing `/generate` to the prefill's HTTP port (learned from its bootstrap server) with
    /// *no* `Authorization` header (`disaggregation/common/conn.py` `_run_prefill_recompute`):
    /// against a prefill started with `--api-key` it gets 401, and the request fails. Measured on
    /// the real server (tests/real.rs); the gateway may retry it elsewhere, from the start.
    pub async fn rebootstrap(&self, rid: &str, b: &Bootstrap) -> Result<(), String> {
        let key = format!("{}:{}", b.host, b.port);
        let port = lock(&self.inner.cache).get(&key).and_then(|r| r.http_port);
        let fail = |why: String| {
            let m = format!(
                "Decode transfer failed for request rank=0 decode_req.req.rid='{rid}' decode_req.req.bootstrap_room={} with exception KVTransferError(bootstrap_room={}): {why}",
                b.room, b.room
            );
            log::line(&m);
            m
        };
        let Some(port) = port else {
            log::line(&format!(
                "PD retract rebootstrap could not resolve the prefill /generate URL from bootstrap info (rid={rid} bootstrap_room={} bootstrap_addr={key}).",
                b.room
            ));
            return Err(fail("PD retract rebootstrap could not resolve the prefill /generate URL from bootstrap info.".into()));
        };
        // The recompute itself is the prefill's business; the simulator sends a one-token
        // request with SGLang's fake bootstrap host (no room is held for it).
        let body = json!({"rid": format!("{rid}-rebootstrap"), "text": "rebootstrap", "sampling_params": {"max_new_tokens": 1},
            "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_port": b.port, "bootstrap_room": b.room});
        let url = format!("http://{}:{port}/generate", b.host);
        match self.inner.http.post(&url).json(&body).timeout(self.cfg().waiting_timeout).send().await {
            Ok(r) if r.status().as_u16() < 400 => Ok(()),
            Ok(r) => {
                let status = r.status().as_u16();
                let text: String = r.text().await.unwrap_or_default().chars().take(512).collect();
                log::line(&format!("PD rebootstrap prefill failed for rid={rid} status={status} body={text}"));
                Err(fail(format!("PD retract rebootstrap /generate failed for rid={rid} (status={status}).")))
            }
            Err(_) => {
                log::line(&format!("PD rebootstrap prefill request failed for rid={rid}"));
                Err(fail(format!("PD retract rebootstrap /generate request errored for rid={rid}.")))
            }
        }
    }

    async fn fetch_route(&self, host: &str, port: u16) -> Result<Route, String> {
        let url = format!("http://{host}:{port}/route?engine_rank=0&target_dp_group=0");
        let r = self.inner.http.get(&url).timeout(Duration::from_secs(5)).send().await.map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            let status = r.status().as_u16();
            return Err(format!("Failed to get prefill server info: {status}, {}", r.text().await.unwrap_or_default()));
        }
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(String::from);
        Some(Route {
            identity: s("identity").unwrap_or_default(),
            rank_ip: s("rank_ip").unwrap_or_else(|| host.to_string()),
            rank_port: v.get("rank_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()).unwrap_or(0),
            page_size: v.get("page_size").and_then(Value::as_u64),
            kv_cache_dtype: s("kv_cache_dtype"),
            http_port: v.get("prefill_http_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()),
        })
        .filter(|r| r.rank_port != 0)
        .ok_or_else(|| format!("{url} gave no rank port"))
    }
}

/// Why a decode cannot pair with the prefill whose `/route` said `r`: the checks of
/// `try_ensure_parallel_info` (`disaggregation/common/conn.py`, 0.5.23), on resolved values.
fn incompatible(cfg: &SimConfig, r: &Route) -> Option<String> {
    if let Some(page) = r.page_size.filter(|p| *p != cfg.page_size) {
        return Some(format!(
            "Page size mismatch: prefill server has page_size={page}, but decode server has page_size={}. Both servers must use the same --page-size value.",
            cfg.page_size
        ));
    }
    let mine = cfg.resolved_kv_cache_dtype();
    if let Some(dtype) = r.kv_cache_dtype.as_ref().filter(|d| **d != mine) {
        return Some(format!(
            "KV cache dtype mismatch: prefill server has kv_cache_dtype={dtype}, but decode server has kv_cache_dtype={mine}. Both servers must use the same --kv-cache-dtype value."
        ));
    }
    None
}
