//! The engine's `/metrics`: its gauges, counters and histograms as Prometheus text, the way
//! SGLang's `prometheus_client` in multiprocess mode renders them (one series per stats rank).

use super::*;

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Engine {
    /// Render `/metrics`. `openmetrics` follows `Accept: application/openmetrics-text`:
    /// names become `sglang_…` and the text ends with `# EOF`.
    pub fn render_metrics(&self, openmetrics: bool) -> String {
        let s = self.lock();
        let v = self.cfg.sim.version;
        let mut fams: Vec<Family> = Vec::new();
        let max = self.max_total_tokens() as f64;
        // Constants (≥0.5.11: written by every TP rank at init).
        if v.constants_at_init() {
            self.constant_families(max, &mut fams);
        }
        // Each stats rank's own series (0.5.23: one per attention-DP group, its `dp_rank` label).
        let mut stats: Vec<Family> = Vec::new();
        for (r, pool) in s.ranks.iter().enumerate() {
            let Some(p) = pool.published else { continue };
            let (tp_rank, dp_rank) = (self.cfg.stats_tp_rank(r), self.cfg.stats_dp_rank(r));
            let mut stat = |name: &str, help: &str, val: f64| Family::add_gauge(&mut stats, name, help, self.labels(tp_rank, dp_rank, None), val);
            let used = p.used as f64;
            stat("sglang:num_running_reqs", "The number of running requests.", p.running as f64);
            stat("sglang:num_queue_reqs", "The number of requests in the waiting queue.", p.queued as f64);
            stat("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0.0);
            stat("sglang:num_used_tokens", "The number of used tokens.", used);
            stat("sglang:token_usage", "The token usage.", round2(used / max));
            stat("sglang:gen_throughput", "The generation throughput (token/s).", p.gen_throughput);
            stat("sglang:cache_hit_rate", "The prefix cache hit rate.", p.cache_hit_rate);
            if v.has_full_token_usage() {
                stat("sglang:full_token_usage", "The token usage for full attention layers.", used / max);
            }
            if v.has_kv_tokens() {
                stat("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.", used);
                stat("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.", p.available as f64);
                stat("sglang:kv_evictable_tokens", "Number of evictable (cached, unreferenced) token slots in the KV cache pool.", p.evictable as f64);
            }
            if v.has_max_total_num_tokens() && !v.constants_at_init() {
                stat("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", max);
            }
            // PD queues: both roles publish the full set; the other role's stay 0.
            stat(v.prefill_bootstrap_queue_name(), "The number of requests in the prefill bootstrap queue.", p.bootstrap_queue as f64);
            stat(v.prefill_inflight_queue_name(), "The number of requests in the prefill inflight queue.", 0.0);
            stat("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.", p.prealloc_queue as f64);
            stat("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.", 0.0);
            if v.has_pending_prealloc() {
                stat("sglang:pending_prealloc_token_usage", "The token usage of pending preallocated requests.", 0.0);
            }
            if v.has_deferred_kv_release() {
                // On by default for 30 s (`SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`): a
                // decode whose transfer failed holds the allocation until the prefill acknowledges.
                stat(
                    "sglang:num_decode_deferred_kv_release_reqs",
                    "The number of failed decode requests whose KV allocations are held pending transfer drain acknowledgement or timeout.",
                    p.deferred_release as f64,
                );
            }
            if v.has_retracted() {
                // No multiprocess_mode: prometheus `all` mode adds a pid label.
                let pid = std::process::id().to_string();
                for (name, help) in
                    [("sglang:num_retracted_reqs", "The number of retracted requests."), ("sglang:num_paused_reqs", "The number of paused requests.")]
                {
                    Family::add_gauge(&mut stats, name, help, self.labels(tp_rank, dp_rank, Some(&pid)), 0.0);
                }
            }
        }
        fams.extend(stats);
        self.service_families(&s, &mut fams);
        drop(s);
        written(&fams, openmetrics)
    }

    /// The pool's constants, one series per TP rank (≥0.5.11 writes them at init).
    fn constant_families(&self, max: f64, fams: &mut Vec<Family>) {
        let page = self.cfg.page_size as f64;
        for (name, help, val) in [
            ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", max),
            ("sglang:page_size", "The page size of the KV cache.", page),
            ("sglang:num_pages", "The number of pages in the KV cache pool.", (max / page).floor()),
            ("sglang:context_len", "The context length of the model.", self.cfg.context_length as f64),
        ] {
            let samples = self.cfg.schedulers().into_iter().map(|(tp, dp)| (self.labels(tp, dp, None), val)).collect();
            fams.push(Family::gauge(name, help, samples));
        }
        // 0.5.23 writes every phase of its base schema (`graph_memory_usage.py`), 0 where
        // nothing was captured; a decode's captured graphs under `phase="decode"`.
        let graphs = if self.decode_graphs() { self.cfg.sim.graph_memory_gb } else { 0.0 };
        let mut samples = Vec::new();
        for (tp, dp) in self.cfg.schedulers() {
            for phase in ["prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"] {
                let mut l = self.labels(tp, dp, None);
                l.push(("phase".into(), phase.into()));
                l.sort();
                samples.push((l, if phase == "decode" { graphs } else { 0.0 }));
            }
        }
        fams.push(Family::gauge("sglang:graph_memory_usage_gb", "Memory used by captured device graphs in GB.", samples));
    }

    /// The tokenizer manager's families: token and request counters, the three latency
    /// histograms; each label set once it was observed, a family once it has a sample.
    fn service_families(&self, s: &State, fams: &mut Vec<Family>) {
        let labels = self.tokenizer_labels();
        let with_stream = |stream: bool| {
            let mut l = labels.clone();
            l.push(("is_streaming".to_string(), streaming(stream).to_string()));
            l.sort();
            l
        };
        let mut push = |f: Family| {
            if !f.samples.is_empty() {
                fams.push(f);
            }
        };
        let admitted = s.prompt_tokens_total > 0 || !s.service.requests.is_empty();
        let once = |v: u64| if admitted { vec![(labels.clone(), v as f64)] } else { Vec::new() };
        let tokens = |f: fn(&(u64, u64)) -> u64| s.finished_tokens.iter().map(|(st, t)| (with_stream(*st), f(t) as f64)).collect::<Vec<_>>();
        push(Family::counter("sglang:prompt_tokens", "Number of prefill tokens processed.", tokens(|t| t.0)));
        push(Family::counter("sglang:generation_tokens", "Number of generation tokens processed.", tokens(|t| t.1)));
        let requests = s.service.requests.iter().map(|(st, n)| (with_stream(*st), *n as f64)).collect();
        push(Family::counter("sglang:num_requests", "Number of requests processed.", requests));
        // Created at the first abort (0.5.23 labels it per abort: no series before one).
        if s.aborted_total > 0 {
            push(Family::counter("sglang:num_aborted_requests", "Number of requests aborted.", once(s.aborted_total)));
        }
        if self.mode() == crate::args::Mode::Decode {
            // Simulator-only (no SGLang server has them): a decode's PD requests and those whose
            // KV came from a prefill of another weight version.
            push(Family::counter(
                MIXED_VERSIONS,
                "sglang-sim only: PD requests whose prefill and decode weight versions differed.",
                vec![(labels.clone(), s.mixed_versions as f64)],
            ));
            push(Family::counter(PD_DECODED, "sglang-sim only: PD requests decoded.", vec![(labels.clone(), s.pd_decoded as f64)]));
        }
        let by_stream = |m: &'_ std::collections::BTreeMap<bool, Series>| -> Vec<(Vec<(String, String)>, Series)> {
            m.iter().map(|(st, x)| (with_stream(*st), x.clone())).collect()
        };
        let ttft = by_stream(&s.service.ttft);
        push(Family::histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            ttft.iter().map(|(l, x)| (l.clone(), x)).collect(),
        ));
        let itl: Vec<_> = s.service.itl.iter().map(|x| (labels.clone(), x)).collect();
        push(Family::histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itl));
        let e2e = by_stream(&s.service.e2e);
        push(Family::histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            e2e.iter().map(|(l, x)| (l.clone(), x)).collect(),
        ));
    }

    /// Scheduler labels for a TP rank, sorted by name as the multiprocess collector does.
    fn labels(&self, tp_rank: u32, dp_rank: Option<u32>, pid: Option<&str>) -> Vec<(String, String)> {
        let v = self.cfg.sim.version;
        // 0.5.23 `observability/metrics_collector.py`: "dynamic" with `--enable-pd-role-switch`
        // ("keep one metric series across role flips").
        let engine_type = if v.engine_type_by_role() && self.cfg.enable_pd_role_switch {
            "dynamic"
        } else if v.engine_type_by_role() {
            match self.cfg.mode {
                Mode::Null => "unified",
                Mode::Prefill => "prefill",
                Mode::Decode => "decode",
            }
        } else {
            "unified"
        };
        let mut l = vec![("engine_type".to_string(), engine_type.to_string()), ("model_name".to_string(), self.cfg.served_model_name.clone())];
        if v.has_moe_ep_rank() {
            l.push(("moe_ep_rank".into(), "0".into()));
        }
        if let Some(pid) = pid {
            l.push(("pid".into(), pid.into()));
        }
        if v.has_rank_labels() {
            l.push(("pp_rank".into(), "0".into()));
            l.push(("tp_rank".into(), tp_rank.to_string()));
            if let Some(dp) = dp_rank {
                l.push(("dp_rank".into(), dp.to_string()));
            }
        }
        l.sort();
        l
    }

    fn tokenizer_labels(&self) -> Vec<(String, String)> {
        let mut l = self.labels(0, None, None);
        l.retain(|(k, _)| k == "engine_type" || k == "model_name");
        l
    }

    /// Exposed for `/server_info`'s `internal_states`.
    pub fn token_usage(&self) -> f64 {
        let s = self.lock();
        s.used() as f64 / (self.max_total_tokens() * s.ranks.len().max(1) as u64) as f64
    }
}

/// The families as exposition text (OpenMetrics ends with `# EOF`).
fn written(fams: &[Family], openmetrics: bool) -> String {
    let mut out = String::new();
    for f in fams {
        f.write(&mut out, openmetrics);
    }
    if openmetrics {
        out.push_str("# EOF\n");
    }
    out
}
