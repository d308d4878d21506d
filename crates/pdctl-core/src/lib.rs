//! `pdctl-core`: configuration (TOML layers → validated [`config::Settings`]), the [`plan::Plan`],
//! the rollout state machine ([`engine::Engine`]: the gates of one restart), and the events it
//! emits. It reaches systemd, the journal and HTTP only through the traits in [`ports`].

#![warn(missing_docs)]

pub mod config;
pub mod engine;
pub mod events;
pub mod plan;
pub mod ports;
