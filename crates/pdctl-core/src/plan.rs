//! The plan: which workers, in which order — roles in `rollout.order`, workers of a role in file
//! order, one at a time.

use crate::config::{Settings, Worker};

/// A plan that names a unit the config does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{unit} is not a configured worker (configured: {known}); use one of those with --unit, or add a [[worker]] for it")]
pub struct PlanError {
    /// The unknown unit.
    pub unit: String,
    /// The configured ones.
    pub known: String,
}

/// The ordered workers of a rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// In restart order.
    pub workers: Vec<Worker>,
}

impl Plan {
    /// Build the plan; `only` (from `--unit`) restricts it to those units, keeping the order.
    pub fn new(settings: &Settings, only: &[String]) -> Result<Plan, PlanError> {
        for u in only {
            if !settings.workers.iter().any(|w| &w.unit == u) {
                return Err(PlanError { unit: u.clone(), known: settings.workers.iter().map(|w| w.unit.as_str()).collect::<Vec<_>>().join(", ") });
            }
        }
        let mut workers = Vec::new();
        for role in &settings.rollout.order {
            for w in settings.workers.iter().filter(|w| w.role == *role) {
                if only.is_empty() || only.contains(&w.unit) {
                    workers.push(w.clone());
                }
            }
        }
        Ok(Plan { workers })
    }
}
