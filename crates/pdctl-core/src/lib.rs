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

pub use pdctl_contract::{api, cause, clock, details, events, exit, lifecycle, names, next, redact, url, window};

pub mod config;
pub mod engine;
pub mod fleet;
pub mod fuzzing;
pub mod plan;
pub mod ports;
pub mod service;
pub mod sglang;
pub mod state;
