//! Recovery: drains left by a crash reconciled at start and while idle, and the drain undone at
//! shutdown.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use pdctl_contract::api::Record;
use pdctl_contract::events::Event;
use pdctl_core::state::drain_ledger::Drain;
use pdctl_real::RealEngine;

use crate::metrics::ResultLabel;

use super::{engine, lock, notify_status, snapshot, Daemon};

/// From `d`'s drain to now: from the start of its drain step in the rollout's events (`drain`
/// passed: its time less its length, to the millisecond), else the ledger's `drained_at`
/// (seconds); the re-admission's own steps are `events` (this reconcile's).
fn out_until_now(d: &Drain, before: &[Event], events: &[Event]) -> pdctl_contract::window::Window {
    let ms_of = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map(|x| x.as_millis() as u64).unwrap_or(0);
    let now_ms = ms_of(std::time::SystemTime::now());
    let drained_ms = before
        .iter()
        .rev()
        .find(|e| e.unit == d.unit && e.step == pdctl_contract::events::Step::Drain && e.status == pdctl_contract::events::Status::Passed)
        .and_then(|e| humantime::parse_rfc3339_weak(&e.at).ok().map(|t| ms_of(t).saturating_sub(e.elapsed_ms)))
        .unwrap_or(d.drained_at.saturating_mul(1000));
    let total_ms = now_ms.saturating_sub(drained_ms);
    let readmit: u64 =
        events.iter().filter(|e| e.unit == d.unit && e.status == pdctl_contract::events::Status::Passed).map(|e| e.elapsed_ms).sum::<u64>().min(total_ms);
    let parts = vec![
        pdctl_contract::window::WindowPart { step: "until pdctld came back".into(), ms: total_ms - readmit },
        pdctl_contract::window::WindowPart { step: "re-admission".into(), ms: readmit },
    ];
    pdctl_contract::window::Window { total_ms, parts }
}

impl Daemon {
    /// Undo one drain (events in the record of the rollout that made it, metrics, journal).
    pub(super) async fn reconcile_one(&self, e: &RealEngine, d: &Drain, budget: std::time::Duration, record: Option<&Mutex<Record>>) {
        let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let result = e.reconcile(d, self.store.ledger(), budget, &sink).await;
        drop(sink);
        let mut events = Vec::new();
        while let Some(ev) = rx.recv().await {
            tracing::info!(pdctl_rollout_id = %d.rollout_id, pdctl_unit = %ev.unit, pdctl_step = ev.step.as_str(), "{}", pdctl_core::engine::sentence(&ev));
            events.push(ev);
        }
        let note = match &result {
            Ok(n) => {
                self.metrics.reconciles.get_or_create(&ResultLabel { result: "restored".into() }).inc();
                n.clone()
            }
            Err(c) => {
                self.metrics.reconciles.get_or_create(&ResultLabel { result: "not_restored".into() }).inc();
                tracing::error!(pdctl_rollout_id = %d.rollout_id, pdctl_unit = %d.unit, "{}", c.sentence());
                c.sentence()
            }
        };
        // The window this drain kept the worker out of the gateway — from the drain to this
        // re-admission, pdctld's own downtime included — belongs to the rollout that drained it.
        let ok = result.is_ok();
        let apply = |r: &mut Record| {
            let window = ok.then(|| out_until_now(d, &r.events, &events));
            r.events.extend(events.iter().cloned());
            r.notes.push(note.clone());
            if let Some(w) = &window {
                r.notes.push(format!("{} was {} (pdctld re-admitted it at its start)", d.unit, w.sentence()));
                r.windows.insert(d.unit.clone(), w.clone());
            }
        };
        match record {
            Some(m) => {
                let mut r = lock(m);
                apply(&mut r);
                self.save(&r);
            }
            None => {
                if let Some(mut r) = self.load(&d.rollout_id) {
                    apply(&mut r);
                    self.save(&r);
                }
            }
        }
        self.metrics.drained.set(self.store.ledger().all().0.len() as i64);
    }

    /// One pass over the workers a weights rollout of a predecessor left paused: each is
    /// continued; returns those that did not answer.
    async fn continue_pass(&self, e: &RealEngine, left: Vec<pdctl_core::engine::PausedWorker>) -> Vec<pdctl_core::engine::PausedWorker> {
        use pdctl_core::ports::Probes as _;
        let mut still = Vec::new();
        for w in left {
            match e.probes.resume(&w.url, std::time::Duration::from_secs(10)).await {
                Ok(()) => tracing::warn!(
                    pdctl_unit = %w.unit,
                    "{} was paused by a weights rollout when pdctld stopped: continued; check its weights (pdctl status)",
                    w.unit
                ),
                Err(er) => {
                    tracing::warn!(pdctl_unit = %w.unit, "{} may still be paused by a weights rollout ({er}): trying again", w.unit);
                    still.push(w);
                }
            }
        }
        still
    }

    /// What a previous process left, undone before any rollout starts (`reconciling` until then):
    /// first the workers a weights rollout paused (on record in `paused.json`, written before the
    /// pause: they hold every request meanwhile), then the drains in the ledger (each worker
    /// re-admitted once it serves, see `Engine::reconcile`, waiting up to `ready_timeout` for one
    /// that is starting), then fleet slots. Good revisions are recorded eagerly too (what each
    /// worker's running process started with, so that a rollback works from the first day).
    ///
    /// pdctld never gives up on these: while systemd or the config cannot be used, or a paused
    /// worker does not continue, it tries again (every second, every 5 s after two minutes), and
    /// what is left is said in `status` (`unresolved`, with what to do), counted in
    /// `pdctl_unresolved`, and no rollout starts.
    pub async fn reconcile_at_start(self: Arc<Self>) {
        let paused_file = pdctl_core::engine::paused_path(&self.store.revisions_dir());
        let mut paused = std::mem::take(&mut *lock(&self.paused_at_start));
        let (mut drains_done, mut recorded) = (false, false);
        let t0 = std::time::Instant::now();
        let patience = std::time::Duration::from_secs(120);
        loop {
            match engine(&self).await {
                Ok(e) => {
                    self.set_unresolved("engine", None);
                    if !paused.is_empty() {
                        paused = self.continue_pass(&e, paused).await;
                        if paused.is_empty() {
                            let _ = std::fs::remove_file(&paused_file);
                            self.set_unresolved("paused", None);
                        }
                    }
                    if !recorded {
                        if let Err(c) = e.staleness(&self.store.revisions_dir()).await {
                            tracing::warn!("cannot record the workers' revisions at start: {}", c.sentence());
                        }
                        recorded = true;
                    }
                    if !drains_done {
                        let budget = e.settings.rollout.ready_timeout;
                        for d in &self.store.ledger().all().0 {
                            notify_status(&format!("re-admitting {} (drained by {})", d.unit, d.rollout_id));
                            self.reconcile_one(&e, d, budget, None).await;
                        }
                        // Fleet slots left by a previous process: given back once their workers serve.
                        for n in e.reconcile_slots(self.store.ledger(), None).await {
                            tracing::warn!("{n}");
                        }
                        drains_done = true;
                    }
                }
                Err(c) => {
                    let drains: Vec<String> = self.store.ledger().all().0.into_iter().map(|d| d.unit).collect();
                    let what: Vec<String> =
                        drains.iter().map(|u| format!("{u} (drained)")).chain(paused.iter().map(|w| format!("{} (paused)", w.unit))).collect();
                    let why = format!(
                        "pdctld cannot use systemd or its config ({}): {} not undone yet; fix that (journalctl -u pdctld), pdctld keeps trying",
                        c.sentence(),
                        if what.is_empty() { "nothing of a previous process is".to_string() } else { what.join(", ") + " are" }
                    );
                    tracing::error!("{why}");
                    if !what.is_empty() {
                        self.set_unresolved("engine", Some(why));
                    }
                    // Nothing to undo but revisions to record: not worth holding rollouts for.
                    if what.is_empty() {
                        drains_done = true;
                        paused.clear();
                    }
                }
            }
            if drains_done && paused.is_empty() {
                break;
            }
            if t0.elapsed() >= patience && !paused.is_empty() {
                let hand: Vec<String> = paused.iter().map(|w| format!("curl -X POST {}/continue_generation", w.url)).collect();
                let why = format!(
                    "{} may still be paused by a weights rollout of the previous pdctld and did not continue: it holds every request sent to it; continue it by hand ({}); pdctld keeps trying",
                    paused.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", "),
                    hand.join("; ")
                );
                tracing::error!("{why}");
                self.set_unresolved("paused", Some(why));
            }
            let every = if t0.elapsed() < patience { 1 } else { 5 };
            tokio::time::sleep(std::time::Duration::from_secs(every)).await;
        }
        self.reconciling.store(false, Ordering::SeqCst);
        notify_status("idle");
        // A host maintenance on record: resumed now if the host rebooted (or pdctld stopped
        // during it), else it waits for its reboot.
        self.clone().maintenance_at_start().await;
    }

    /// While idle: a drain in the ledger whose worker the gateway lists admitted again (the
    /// gateway came back with it, or an operator re-added it) is no longer pdctl's to undo: it is
    /// cleared and the note written in the rollout's record, so that `status` and
    /// `pdctl_drained_workers` stop saying the worker is out. Checked every 5 s, only while the
    /// ledger holds drains; a rollout cannot start meanwhile (`reconciling`).
    pub async fn reconcile_idle(self: Arc<Self>) {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.reconciling.load(Ordering::SeqCst) || self.running_id().is_some() || self.store.ledger().all().0.is_empty() {
                continue;
            }
            let Ok(e) = engine(&self).await else { continue };
            if e.settings.router.is_none() {
                continue;
            }
            let Ok(Ok(listed)) = tokio::time::timeout(std::time::Duration::from_secs(5), pdctl_core::ports::Probes::router_workers(&e.probes, 0)).await else {
                continue;
            };
            // No rollout may start while a drain is cleared: claim, then check again.
            if self.reconciling.swap(true, Ordering::SeqCst) {
                continue;
            }
            if self.running_id().is_none() {
                for d in self.store.ledger().all().0 {
                    if !listed.iter().any(|x| pdctl_core::config::same_url(&x.url, &d.url) && x.admitted()) {
                        continue;
                    }
                    let note = format!(
                        "reconciled: the gateway lists {} ({}) admitted again, outside pdctl; the drain rollout {} had left is cleared",
                        d.unit, d.url, d.rollout_id
                    );
                    match self.store.ledger().clear(&d.unit) {
                        Ok(()) => {
                            tracing::warn!(pdctl_rollout_id = %d.rollout_id, pdctl_unit = %d.unit, "{note}");
                            self.metrics.reconciles.get_or_create(&ResultLabel { result: "restored".into() }).inc();
                            if let Some(mut r) = self.load(&d.rollout_id) {
                                r.notes.push(note);
                                self.save(&r);
                            }
                        }
                        Err(er) => tracing::error!(pdctl_unit = %d.unit, "cannot clear the drain of {} from the ledger: {er}", d.unit),
                    }
                }
                self.metrics.drained.set(self.store.ledger().all().0.len() as i64);
            }
            self.reconciling.store(false, Ordering::SeqCst);
        }
    }

    /// SIGTERM: stop the running rollout's engine, undo its drain (within `budget`), and mark it
    /// interrupted, so that stopping pdctld — an upgrade, `systemctl restart pdctld` — never leaves
    /// a worker out of the router. What is not undone in time stays in the ledger for the next start.
    pub async fn shutdown(&self, budget: std::time::Duration) {
        let running = lock(&self.running).take();
        let Some(r) = running else {
            return;
        };
        if let Some(h) = lock(&r.task).take() {
            h.abort();
        }
        // Let the event consumer write what the engine emitted before it stopped.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        tracing::warn!(pdctl_rollout_id = %r.id, "pdctld is stopping during rollout {}: undoing its drain, then it is interrupted (resume it with pdctl rollout resume {})", r.id, r.id);
        let e = engine(self).await;
        if let Ok(e) = &e {
            let (drains, _) = self.store.ledger().all();
            for d in drains.iter().filter(|d| d.rollout_id == r.id) {
                self.reconcile_one(e, d, budget, Some(&r.record)).await;
            }
            // A weights rollout's paused workers hold every request: continued now, not at the
            // next start (what does not answer stays on record for it).
            let paused = self.paused_on_record();
            if !paused.is_empty() {
                let left = self.continue_pass(e, paused).await;
                let file = pdctl_core::engine::paused_path(&self.store.revisions_dir());
                if left.is_empty() {
                    let _ = std::fs::remove_file(&file);
                    lock(&r.record).notes.push("pdctld stopped during the weights rollout: every worker it had paused was continued".into());
                } else {
                    let bytes = serde_json::to_vec_pretty(&left).unwrap_or_default();
                    let _ = pdctl_core::state::state_file::atomic_write(&file, &bytes, pdctl_core::state::state_file::STATE_FILE_MODE);
                    lock(&r.record).notes.push(format!(
                        "pdctld stopped during the weights rollout: {} did not continue; the next pdctld continues them at its start",
                        left.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
        let sd = e.as_ref().ok().map(|e| &e.units);
        let plan = lock(&r.record).plan.clone();
        let units = snapshot(sd, &plan).await;
        let mut rec = lock(&r.record).clone();
        self.interrupt(&mut rec, units);
        if let Some(end) = rec.end_line() {
            let _ = r.tx.send(end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paused workers continued at start are those a previous process left: a `paused.json`
    /// written after this process started — by a weights rollout of its own, about to pause —
    /// is never taken for one (CI saw the startup reconcile continue the workers of the rollout
    /// that had just begun, then nothing continue them after that pdctld was killed).
    #[tokio::test]
    async fn a_paused_file_written_after_start_is_this_process_own_and_is_left_alone() {
        let dir = std::env::temp_dir().join(format!("pdctld-paused-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::Store::open(&dir).unwrap();
        let d = Daemon::new(dir.join("pdctl.toml"), store).await;
        assert!(!d.reconciling.load(Ordering::SeqCst), "nothing to reconcile at start");
        let path = pdctl_core::engine::paused_path(&d.store.revisions_dir());
        let w = pdctl_core::engine::PausedWorker { unit: "p.service".into(), url: "http://127.0.0.1:9".into() };
        std::fs::write(&path, serde_json::to_vec(&vec![w.clone()]).unwrap()).unwrap();
        let d = Arc::new(d);
        tokio::time::timeout(std::time::Duration::from_secs(5), d.clone().reconcile_at_start())
            .await
            .expect("returns at once: nothing was left paused at start");
        assert!(path.exists(), "the running rollout's record of its pause is kept");
        // Found at start (a predecessor's): this process reconciles first.
        let d2 = Daemon::new(dir.join("pdctl.toml"), crate::store::Store::open(&dir).unwrap()).await;
        assert!(d2.reconciling.load(Ordering::SeqCst), "no rollout starts before the paused workers are continued");
        assert_eq!(lock(&d2.paused_at_start).as_slice(), [w]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
