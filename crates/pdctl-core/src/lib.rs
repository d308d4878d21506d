//! `pdctl-core`: configuration (TOML layers → validated [`config::Settings`]), the [`plan::Plan`],
//! the rollout state machine ([`engine::Engine`]: the gates of one restart, resume, rollback), the
//! lifecycle of a rollout ([`lifecycle`]), every failure ([`cause::Cause`]), the contract with
//! clients ([`api`]), what facts mean ([`judge`]), SGLang's built-in facts ([`sglang`]), PD pairs ([`pairing`]), a worker's stop ([`stop`]) and config
//! drift ([`revisions`]). It reaches systemd, the journal and HTTP only through the traits in
//! [`ports`]; [`real`] implements them over the driver crates.

#![warn(missing_docs)]

pub mod api;
pub mod availability;
pub mod cause;
pub mod clock;
pub mod coherence;
pub mod config;
pub mod details;
pub mod drain_ledger;
pub mod engine;
pub mod events;
pub mod exit;
pub mod fleet;
pub mod fuzzing;
pub mod in_place;
pub mod judge;
pub mod lifecycle;
pub mod names;
pub mod next;
pub mod pairing;
pub mod plan;
pub mod ports;
pub mod real;
pub mod redact;
pub mod revisions;
pub mod sglang;
pub mod slo;
pub mod state_file;
pub mod stop;
pub mod storm;
pub mod tokenizer;
pub mod url;
pub mod window;
