//! `[maintenance] balance_roles`: pdctld changes this host's P:D ratio by itself. Every look
//! (`pdctl_core::service::role_balance::every`) reads each role's pressure as `pdctl status`
//! judges it; once the same ratio has been suggested for `balance_after`
//! (`pdctl_core::service::role_balance::Balance` decides), it starts `pdctl role set --ratio` —
//! only when a host maintenance could begin ([`super::maintenance::waits`]: no rollout running,
//! inside a window, the fleet not paused, the hold query quiet), and then within the budget
//! every rollout keeps (its preflight's floor, the fleet's slots). What it saw and why it waits
//! is in `GET /v1/status` (`role_balance`) and the journal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pdctl_contract::api::{Request, Started, StartedBy};
use pdctl_core::service::role_balance::{every, Balance};

use super::{config, lock, Daemon};

impl Daemon {
    /// Look at the roles' pressure while `balance_roles` is set, and change the ratio once due.
    pub async fn balance_roles(self: Arc<Self>) {
        let t0 = Instant::now();
        let mut balance = Balance::default();
        // The last change started (or refused), said with every look after it.
        let mut last: Option<String> = None;
        loop {
            let settings = config(&self).ok();
            let on = settings.as_ref().and_then(|s| s.maintenance.as_ref()).filter(|m| m.balance_roles).map(|m| m.balance_after);
            let Some(after) = on else {
                balance.made();
                *lock(&self.role_balance) = None;
                tokio::time::sleep(Duration::from_secs(30)).await;
                continue;
            };
            tokio::time::sleep(every(after)).await;
            let Some(settings) = settings else { continue };
            if self.running_id().is_some() {
                // A rollout changes the figures it is judged by: counted again after it.
                balance.made();
                continue;
            }
            let Ok(engine) = super::shared::engine(&self).await else { continue };
            let p = engine.role_pressure().await;
            let now = t0.elapsed().as_millis() as u64;
            let due = balance.look(p.suggested_ratio.as_deref(), now, after);
            let mut said = p.why.clone();
            if let (Some(r), Some(stood)) = (&balance.ratio, balance.stood(now)) {
                said = format!("{r} suggested for {}s of {}s: {said}", stood.as_secs(), after.as_secs());
            }
            let shown = |now: String| {
                Some(match &last {
                    Some(l) => format!("{now}; last: {l}"),
                    None => now,
                })
            };
            let Some(ratio) = due else {
                *lock(&self.role_balance) = shown(said).map(|t| pdctl_contract::redact::line(&t));
                continue;
            };
            if let Some(why) = super::maintenance::waits(&self, &settings).await {
                tracing::info!("the ratio {ratio} is due but waits: {why}");
                *lock(&self.role_balance) = shown(format!("{said}; due, waits: {why}")).map(|t| pdctl_contract::redact::line(&t));
                continue;
            }
            let reason = format!("role balance: {} (suggested for {}s)", p.why, balance.stood(now).unwrap_or_default().as_secs());
            let by = StartedBy { reason: Some(reason.clone()), pdctld: true, ..Default::default() };
            let req = Request::Role { unit: None, role: None, ratio: Some(ratio.clone()), reason: Some(reason), config: None };
            let now_said = match super::rollouts::start(self.clone(), req, by).await {
                Ok(Started { id: Some(id), .. }) => {
                    tracing::info!("role balance: started {id} to change the ratio to {ratio} ({})", p.why);
                    format!("changed to {ratio} by rollout {id}")
                }
                Ok(Started { message, .. }) => format!("nothing to change for {ratio}: {}", message.unwrap_or_default()),
                Err(c) => {
                    tracing::warn!("role balance: the change to {ratio} was refused: {}", c.sentence());
                    format!("the change to {ratio} was refused ({}): {}", c.code(), c.sentence())
                }
            };
            let now_said = pdctl_contract::redact::line(&now_said);
            *lock(&self.role_balance) = Some(now_said.clone());
            last = Some(now_said);
            balance.made();
        }
    }
}
