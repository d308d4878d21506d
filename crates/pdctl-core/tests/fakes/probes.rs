//! The fake HTTP port: what each worker and the gateway answer, from the [`World`].

use super::*;

/// Every HTTP call of the engine, answered from the shared [`World`] (and recorded there).
pub struct FakeProbes(pub W);
impl Probes for FakeProbes {
    async fn health(&self, url: &str) -> Health {
        let mut w = self.0.lock().unwrap();
        w.health_asked.push(url.to_string());
        if w.unhealthy.iter().any(|u| u == url) {
            Health::Unavailable("503".into())
        } else {
            Health::Up
        }
    }
    async fn ready(&self, url: &str) -> Option<Health> {
        let w = self.0.lock().unwrap();
        w.ready_served.then(|| if w.unhealthy.iter().any(|u| u == url) { Health::Unavailable("503".into()) } else { Health::Up })
    }
    async fn kv(&self, _url: &str) -> Result<KvReport, MetricsError> {
        Ok(KvReport {
            max_total_tokens: Some(10.0),
            token_usage: 0.0,
            used_tokens: 0.0,
            available_tokens: None,
            evictable_tokens: None,
            running_reqs: None,
            queue_reqs: None,
            names: vec![],
            ranks: Vec::new(),
            unpublished: Vec::new(),
        })
    }
    async fn in_flight(&self, url: &str) -> Result<u64, HttpFailure> {
        Ok(self.0.lock().unwrap().in_flight.get(url).copied().unwrap_or(0))
    }
    async fn auth(&self, url: &str) -> pdctl_core::ports::Auth {
        if self.0.lock().unwrap().keyed.iter().any(|k| k == url) {
            return pdctl_core::ports::Auth::Rejected { endpoint: format!("{url}/server_info"), status: 401, key: "no key".into() };
        }
        pdctl_core::ports::Auth::Accepted
    }
    async fn abort_all(&self, url: &str) -> Result<(), HttpFailure> {
        let mut w = self.0.lock().unwrap();
        w.in_flight.remove(url);
        w.aborted.push(url.into());
        Ok(())
    }
    async fn warm_worker(&self, _url: &str) -> Result<(), HttpFailure> {
        Ok(())
    }
    fn replicas(&self) -> usize {
        usize::from(self.0.lock().unwrap().router.is_some())
    }
    async fn router_workers(&self, _r: usize) -> Result<Vec<RouterWorker>, HttpFailure> {
        Ok(self.0.lock().unwrap().router.as_ref().map(|r| r.workers.clone()).unwrap_or_default())
    }
    async fn register(&self, _r: usize, u: &str, t: &str, _b: Option<u16>) -> Result<String, HttpFailure> {
        let mut w = self.0.lock().unwrap();
        let r = w.router.as_mut().ok_or_else(|| HttpFailure("no router".into()))?;
        r.log.push(format!("register {u}"));
        let id = r.add(u, t);
        if let Some((_, unit)) = r.crash_on_register.clone().filter(|(url, _)| url == u) {
            if let Some(st) = w.states.get_mut(&unit) {
                st.active_state = "failed".into();
                st.result = "exit-code".into();
                st.exec_main_code = 1;
                st.exec_main_status = 1;
            }
        }
        Ok(id)
    }
    async fn settle_now(&self, _r: usize, id: &str) -> Result<(), HttpFailure> {
        let mut w = self.0.lock().unwrap();
        let r = w.router.as_mut().ok_or_else(|| HttpFailure("no router".into()))?;
        r.log.push(format!("settle_now {id}"));
        Ok(())
    }
    async fn deregister(&self, _r: usize, id: &str) -> Result<(), HttpFailure> {
        let mut w = self.0.lock().unwrap();
        let restarts = w.restarted.len();
        let r = w.router.as_mut().ok_or_else(|| HttpFailure("no router".into()))?;
        r.log.push(format!("deregister {id} after {restarts} restart(s)"));
        r.workers.retain(|x| x.id != id);
        Ok(())
    }
    async fn cb_state(&self, _r: usize, _url: &str) -> Result<Option<f64>, MetricsError> {
        Ok(None)
    }
    async fn open_breakers(&self, _r: usize) -> Result<Vec<String>, MetricsError> {
        Ok(Vec::new())
    }
    async fn smoke(&self, _r: usize, _n: u32) -> Result<(), HttpFailure> {
        match self.0.lock().unwrap().router.as_ref() {
            Some(r) if r.smoke_fails => Err(HttpFailure("503 No available decode workers".into())),
            _ => Ok(()),
        }
    }
    async fn pair(&self, t: PairTarget<'_>, _limit: Duration) -> PairProbe {
        let mut w = self.0.lock().unwrap();
        w.pairs.push((t.prefill_url.into(), t.decode_url.into()));
        let start = |url: &str| w.states.get(&format!("{}.service", url.trim_start_matches("http://"))).map(|s| s.exec_main_start_us).unwrap_or(0);
        let stale = w.stale_cache && start(t.decode_url) < start(t.prefill_url);
        let decode = if stale {
            Half::Answered { status: 500, body: format!("Decode transfer failed for request rank=0 with exception KVTransferError(bootstrap_room={}): Request timed out after 3.0s in KVPoll.WaitingForInput", t.room) }
        } else {
            Half::Answered { status: 200, body: "{}".into() }
        };
        PairProbe {
            room: t.room,
            prefill: if stale { Half::NoAnswer } else { Half::Answered { status: 200, body: "{}".into() } },
            decode,
            took: Duration::from_millis(1),
            abandoned: None,
        }
    }
    async fn server_info(&self, _url: &str) -> Result<serde_json::Value, HttpFailure> {
        Ok(serde_json::json!({"page_size": 1}))
    }
    async fn reach(&self, _url: &str) -> pdctl_core::ports::Reach {
        pdctl_core::ports::Reach::Open
    }
    async fn service(&self, url: &str) -> Result<ServiceScrape, MetricsError> {
        let mut w = self.0.lock().unwrap();
        match w.served.get_mut(url) {
            Some(q) if q.len() > 1 => Ok(q.remove(0)),
            Some(q) if q.len() == 1 => Ok(q[0].clone()),
            _ => Err(MetricsError { diagnosis: pdctl_core::cause::MetricsDiagnosis::Unreachable, message: "no figures".into(), pending_ranks: 0 }),
        }
    }
    async fn gateway_outcomes(&self, _url: &str) -> Option<(f64, f64)> {
        None
    }
    async fn gateway_responses(&self) -> Option<(f64, f64)> {
        None
    }
    async fn model_info(&self, url: &str) -> Result<(String, String), HttpFailure> {
        Ok(self.0.lock().unwrap().weights.get(url).cloned().unwrap_or_else(|| ("m".into(), "default".into())))
    }
    async fn running_role(&self, url: &str) -> Result<Option<pdctl_core::config::Role>, HttpFailure> {
        Ok(self.0.lock().unwrap().roles.get(url).copied())
    }
    async fn decode_graph_gb(&self, _url: &str) -> Result<Option<f64>, MetricsError> {
        Ok(None)
    }
    async fn role_switch(
        &self,
        url: &str,
        ask: &pdctl_core::sglang::role_switch::Ask,
        _limit: Duration,
    ) -> Result<pdctl_core::sglang::role_switch::Answer, HttpFailure> {
        let mut g = self.0.lock().unwrap();
        let verb = if ask.prepare_only { "prepare" } else { "switch" };
        g.switch_log.push(format!("{verb} {url} {}", ask.new_role.as_str()));
        let old_role = g.roles.get(url).map(|r| r.as_str().to_string()).unwrap_or_default();
        if !g.switch_answers.is_empty() {
            return Ok(g.switch_answers.remove(0));
        }
        if !ask.prepare_only {
            g.roles.insert(url.to_string(), ask.new_role);
        }
        let message = if ask.prepare_only { "ready" } else { "ok" };
        Ok(pdctl_core::sglang::role_switch::Answer { success: true, message: message.into(), old_role, safe_to_restore: ask.prepare_only })
    }
    async fn pause(&self, url: &str, mode: pdctl_core::ports::PauseMode, _limit: Duration) -> Result<(), HttpFailure> {
        let mode = if mode == pdctl_core::ports::PauseMode::Retract { String::new() } else { format!("{} ", mode.as_str()) };
        self.0.lock().unwrap().weight_log.push(format!("pause {mode}{url}"));
        Ok(())
    }
    async fn resume(&self, url: &str, _limit: Duration) -> Result<(), HttpFailure> {
        self.0.lock().unwrap().weight_log.push(format!("continue {url}"));
        Ok(())
    }
    async fn flush_cache(&self, url: &str, _limit: Duration) -> Result<bool, HttpFailure> {
        self.0.lock().unwrap().weight_log.push(format!("flush {url}"));
        Ok(true)
    }
    async fn update_weights(&self, url: &str, model_path: &str, version: Option<&str>, _limit: Duration) -> Result<String, HttpFailure> {
        let mut w = self.0.lock().unwrap();
        w.weight_log.push(format!("load {url} {model_path}"));
        if w.weights_fail.iter().any(|u| u == url) {
            return Err(HttpFailure("400 Failed to get weights iterator".into()));
        }
        let v = version.map(String::from).unwrap_or_else(|| w.weights.get(url).map(|x| x.1.clone()).unwrap_or_else(|| "default".into()));
        w.weights.insert(url.into(), (model_path.into(), v));
        Ok("Succeeded to update model weights.".into())
    }
    async fn pd_queues(&self, _url: &str) -> Result<PdQueues, MetricsError> {
        let mut w = self.0.lock().unwrap();
        Ok(if w.held.is_empty() { PdQueues { held_reqs: 0.0, used_tokens: 0.0, source: "/v1/loads" } } else { w.held.remove(0) })
    }
}
