//! What clients see: the SLO gate's judgement of latency and errors ([`slo`]), the availability
//! probe's figures ([`availability`]), and restarts pdctl did not make (the restart storm,
//! [`storm`]).

pub use pdctl_contract::availability;
pub mod slo;
pub mod storm;
