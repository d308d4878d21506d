//! The gates, one file each, in runbook order. Each is a typed method of [`super::Engine`].

mod drain;
pub(in crate::engine) use drain::Deferred;
mod health;
mod metrics;
mod pair;
mod preflight;
mod ready;
mod restart;
pub(in crate::engine) use restart::Restarted;
mod router;
mod slo;
mod slot;
pub(in crate::engine) use slo::Mark;
mod soak;
mod stranded_kv;
