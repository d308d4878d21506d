//! The gates, one file each, in runbook order. Each is a typed method of [`super::Engine`].

mod drain;
pub(in crate::engine) use drain::Deferred;
mod health;
mod metrics;
mod pair;
mod preflight;
mod ready;
mod router;
mod slo;
pub(in crate::engine) use slo::Mark;
mod soak;
mod stranded_kv;
