//! Client load through the gateway while a rollout runs, what it was answered, and the decodes'
//! count of requests decoded from KV of another model (the mixed-version hazard).

use std::time::Duration;

use crate::http;

/// Steady client traffic through a gateway: a request every `1/rate` s, each on its own task
/// (a slow answer does not slow the next send), until [`Load::stop`]. Counts what was sent and
/// what failed (non-2xx or no answer), so a test can say what clients saw.
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<(u64, u64)>>,
    answers: std::sync::Arc<std::sync::Mutex<Vec<Answer>>>,
}

/// One request of a [`Load`]: when it was sent (seconds after the load started), how long its
/// answer took (seconds) and whether it succeeded.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// Sent this long after the start.
    pub sent_at: f64,
    /// Its answer this long after it was sent (or its failure).
    pub took: f64,
    /// 2xx.
    pub ok: bool,
}

/// Finished requests a worker has counted (`sglang:num_requests_total`, every series).
pub async fn served_requests(worker_url: &str) -> f64 {
    let Ok(r) = http().get(format!("{worker_url}/metrics")).send().await else { return 0.0 };
    let text = r.text().await.unwrap_or_default();
    text.lines().filter(|l| l.starts_with("sglang:num_requests_total")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// The simulator's count of PD requests whose decode continued from KV of another model
/// (`sglang_sim_pd_mixed_version_requests_total`), summed over the given decodes and over each
/// one's processes (a restart starts its count at 0), read every 100 ms until stopped.
pub struct MixedWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<f64>,
}

impl Load {
    /// Start sending `POST {router}/generate` (`max_new_tokens` tokens) at `rate` per second.
    pub fn start(router: &str, rate: f64, max_new_tokens: u32) -> Load {
        Load::start_with_key(router, rate, max_new_tokens, None)
    }

    /// [`Load::start`] with `Authorization: Bearer KEY` on every request (a gateway with a key).
    pub fn start_with_key(router: &str, rate: f64, max_new_tokens: u32, key: Option<String>) -> Load {
        Load::start_with(router, rate, max_new_tokens, key, None)
    }

    /// [`Load::start_with_key`] whose prompts all begin with `prefix` (a system prompt shared by
    /// every request, as a prefix cache serves it), then their own words.
    pub fn start_with(router: &str, rate: f64, max_new_tokens: u32, key: Option<String>, prefix: Option<String>) -> Load {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let url = format!("{router}/generate");
        let answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = answers.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let c = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
                let (sent, failed) = (std::sync::Arc::new(AtomicU64::new(0)), std::sync::Arc::new(AtomicU64::new(0)));
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                let mut tasks = Vec::new();
                let mut n: u64 = 0;
                let t0 = std::time::Instant::now();
                while !flag.load(Ordering::SeqCst) {
                    tick.tick().await;
                    n += 1;
                    let (c, url, sent, failed, key, prefix, log) =
                        (c.clone(), url.clone(), sent.clone(), failed.clone(), key.clone(), prefix.clone(), log.clone());
                    tasks.push(tokio::spawn(async move {
                        let at = std::time::Instant::now();
                        sent.fetch_add(1, Ordering::SeqCst);
                        // Prompts that share no prefix, as real traffic mostly does: smg's default
                        // cache-aware policy sends prompts with a common prefix to one worker.
                        let own = format!("{:016x} {n} asks about the capital of France", sglang_sim::ids::rand_u128() as u64);
                        let text = match &prefix {
                            Some(p) => format!("{p}{own}"),
                            None => own,
                        };
                        let body = serde_json::json!({"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}});
                        let mut req = c.post(&url).json(&body);
                        if let Some(k) = &key {
                            req = req.bearer_auth(k);
                        }
                        let ok = req.send().await.is_ok_and(|r| r.status().is_success());
                        if !ok {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                        let answer = Answer { sent_at: at.duration_since(t0).as_secs_f64(), took: at.elapsed().as_secs_f64(), ok };
                        if let Ok(mut l) = log.lock() {
                            l.push(answer);
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
                (sent.load(Ordering::SeqCst), failed.load(Ordering::SeqCst))
            })
        });
        Load { stop, thread: Some(thread), answers }
    }

    /// Stop sending, wait for the answers in flight; `(sent, failed)`.
    pub fn stop(self) -> (u64, u64) {
        let (sent, failed, _) = self.stop_with_answers();
        (sent, failed)
    }

    /// [`Load::stop`], with every request's [`Answer`] in the order they came back.
    pub fn stop_with_answers(mut self) -> (u64, u64, Vec<Answer>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (sent, failed) = self.thread.take().and_then(|t| t.join().ok()).unwrap_or((0, 0));
        let answers = self.answers.lock().map(|a| a.clone()).unwrap_or_default();
        (sent, failed, answers)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl MixedWatch {
    /// Start watching the decodes at `urls`.
    pub fn start(urls: Vec<String>) -> MixedWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let read = |url: &str| -> Option<f64> {
                let text = rt.block_on(async { http().get(format!("{url}/metrics")).send().await.ok()?.text().await.ok() })?;
                text.lines()
                    .find(|l| l.starts_with("sglang_sim_pd_mixed_version_requests_total"))
                    .and_then(|l| l.split_whitespace().last())
                    .and_then(|v| v.parse().ok())
            };
            // Per decode, the largest count of each of its processes.
            let (mut most, mut last, mut sum) = (vec![0.0f64; urls.len()], vec![0.0f64; urls.len()], 0.0);
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                for (i, u) in urls.iter().enumerate() {
                    let now = read(u).unwrap_or(last[i]);
                    if now < last[i] {
                        sum += most[i];
                        most[i] = 0.0;
                    }
                    most[i] = most[i].max(now);
                    last[i] = now;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            sum + most.iter().sum::<f64>()
        });
        MixedWatch { stop, thread }
    }

    /// Stop; the mixed-version requests counted over the whole watch.
    pub fn stop(self) -> f64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("mixed watch")
    }
}

/// A request through the gateway of `tokens` tokens (200 tokens/s in the simulator), running on a
/// decode before this returns: the thread that ends with its status, and that decode's unit.
pub fn request_in_flight_on(stack: &crate::pdctl_sandbox::stack::Stack, tokens: u32) -> (std::thread::JoinHandle<Option<u16>>, String) {
    let url = format!("{}/generate", stack.router.as_ref().expect("a gateway").url);
    let load = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let c = reqwest::Client::builder().timeout(Duration::from_secs(90)).build().expect("client");
            c.post(&url)
                .json(&serde_json::json!({"text": "long", "sampling_params": {"max_new_tokens": tokens}}))
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16())
        })
    });
    // SGLang 0.5.23 serves its load at /v1/loads only (no /get_load).
    let busy = |url: &str| {
        crate::pdctl_sandbox::stack::http_get(&format!("{url}/v1/loads")).is_ok_and(|(status, b)| status == 200 && !b.contains("\"num_running_reqs\":0"))
    };
    let mut unit = None;
    let found = crate::until(Duration::from_secs(10), Duration::from_millis(20), || {
        unit = stack.workers().into_iter().find(|w| w.role == "decode" && busy(&w.url)).map(|w| w.unit.clone());
        unit.is_some()
    });
    assert!(found, "the request reached a decode");
    (load, unit.unwrap_or_default())
}
