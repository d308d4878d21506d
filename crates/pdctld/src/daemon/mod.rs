//! The daemon's control API: transport (HTTP/1.1 + JSON on a Unix socket), persistence of every
//! event, sd_notify status and metrics around the engine. What a rollout does is decided in
//! pdctl-core (`Engine::execute`: gates, resume, rollback); what its API looks like in
//! `pdctl_contract::api`; how it fails in `pdctl_contract::cause`.
//!
//! Its rooms: the records and the one running slot ([`shared`]), recovery at start and while idle
//! ([`recovery`]), driving a rollout ([`rollouts`]), the HTTP API ([`http`]), fleet
//! participation ([`fleet`]), host maintenance with its FleetLock endpoint ([`maintenance`]), and
//! the P:D ratio changed by itself when asked to ([`role_balance`]).

pub mod fleet;
pub mod fleet_bake;
pub mod http;
pub mod maintenance;
mod planning;
mod recovery;
mod role_balance;
mod rollouts;
mod shared;
pub mod storm;

pub use shared::*;
