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

/// `NAME` → `NAME.service`; a name with a unit type (`x.service`, `x.target`) as it is.
pub fn unit_name(u: &str) -> String {
    const TYPES: [&str; 11] = [".service", ".socket", ".target", ".timer", ".mount", ".automount", ".scope", ".slice", ".path", ".device", ".swap"];
    if TYPES.iter().any(|t| u.ends_with(t)) {
        u.to_string()
    } else {
        format!("{u}.service")
    }
}

/// The ordered workers of a rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// In restart order.
    pub workers: Vec<Worker>,
}

impl Plan {
    /// Build the plan; `only` (from `--unit`) restricts it to those units, keeping the order. A
    /// name without a unit type means `NAME.service`, as systemctl reads it.
    pub fn new(settings: &Settings, only: &[String]) -> Result<Plan, PlanError> {
        let only: Vec<String> = only.iter().map(|u| unit_name(u)).collect();
        let only = only.as_slice();
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

    /// These units in this order (a resume's or a revert's, not the config's role order); an
    /// unknown unit is an error, as for [`Plan::new`].
    pub fn in_order(settings: &Settings, units: &[String]) -> Result<Plan, PlanError> {
        let all = Plan::new(settings, units)?;
        Ok(Plan { workers: units.iter().filter_map(|u| all.workers.iter().find(|w| w.unit == unit_name(u)).cloned()).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_without_its_type_is_a_service() {
        assert_eq!(unit_name("sglang-prefill"), "sglang-prefill.service");
        assert_eq!(unit_name("sglang-prefill.service"), "sglang-prefill.service");
        assert_eq!(unit_name("sglang.v2-prefill"), "sglang.v2-prefill.service");
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://p\"\n";
        let s = crate::config::load_texts(&[(std::path::PathBuf::from("t.toml"), text.to_string())]).unwrap();
        assert_eq!(Plan::new(&s, &["p".into()]).unwrap().workers[0].unit, "p.service");
        assert!(Plan::new(&s, &["q".into()]).is_err());
    }
}
