//! The gates, one file each, in runbook order. Each is a typed method of [`super::Engine`].

mod bake;
pub use bake::{BakeLook, BakeMarks};
mod drain;
pub(in crate::engine) use drain::Deferred;
mod health;
mod metrics;
mod pair;
mod preflight;
mod ready;
mod router;
mod slo;
mod soak;
mod stranded_kv;
