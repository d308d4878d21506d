//! `pdctl-core`: configuration (TOML layers → validated [`config::Settings`]), the [`plan::Plan`],
//! the rollout state machine ([`engine::Engine`]: the runbook's steps, resume, rollback); what
//! SGLang is and does ([`sglang`]: its built-in facts, what journal lines mean, PD pairs, a
//! worker's stop, the model it computes with); what pdctld keeps on disk ([`state`]: revisions and
//! config drift, the drain ledger, in-place loads); what clients see ([`service`]: the SLO gate,
//! the restart storm); the fleet's keys and transactions ([`fleet`]). The contract with clients
//! (the API, events, causes, exit codes, the lifecycle) is the crate `pdctl-contract`, re-exported
//! here under the same module names. It reaches systemd, the journal and HTTP only through the
//! traits in [`ports`]; the crate `pdctl-real` implements them over the driver crates.

#![warn(missing_docs)]

// The engine's fakes (`tests/fakes`) name this crate `pdctl_core`, as the integration tests do;
// compiled into its own unit tests too, so that a gate is tested next to it.
extern crate self as pdctl_core;
#[cfg(test)]
#[path = "../tests/fakes/mod.rs"]
#[allow(unused_imports)] // re-exports for the test files, each of which uses some
pub(crate) mod fakes;

pub use pdctl_contract::{api, cause, clock, details, events, exit, lifecycle, names, next, redact, url, window};

pub mod apply;
pub mod config;
pub mod engine;
pub mod fleet;
pub mod fuzzing;
pub mod pair_probe;
pub mod plan;
pub mod ports;
pub mod resume;
pub mod revert;
pub mod service;
pub mod sglang;
pub mod state;
pub mod wire;
