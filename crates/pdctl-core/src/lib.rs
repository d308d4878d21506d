//! `pdctl-core`: configuration (TOML layers → validated [`config::Settings`]), the [`plan::Plan`],
//! the rollout state machine ([`engine::Engine`]: the gates of one restart, resume, rollback), the
//! lifecycle of a rollout ([`lifecycle`]), every failure ([`cause::Cause`]), the contract with
//! clients ([`api`]); what SGLang is and does ([`sglang`]: its built-in facts, what journal lines
//! mean, PD pairs, a worker's stop, the model it computes with); what pdctld keeps on disk
//! ([`state`]: revisions and config drift, the drain ledger, in-place loads); what clients see
//! ([`service`]: the SLO gate, availability, the restart storm). It reaches systemd, the journal
//! and HTTP only through the traits in [`ports`]; the crate `pdctl-real` implements them over the driver
//! crates.

#![warn(missing_docs)]

pub mod api;
pub mod cause;
pub mod clock;
pub mod config;
pub mod details;
pub mod engine;
pub mod events;
pub mod exit;
pub mod fleet;
pub mod fuzzing;
pub mod lifecycle;
pub mod names;
pub mod next;
pub mod plan;
pub mod ports;
pub mod redact;
pub mod service;
pub mod sglang;
pub mod state;
pub mod url;
pub mod window;
