//! What clients see: the SLO gate's judgement of latency and errors ([`slo`]), the availability
//! probe's figures ([`availability`]), restarts pdctl did not make (the restart storm,
//! [`storm`]), and when a host may begin maintenance ([`reboot_window`]).

pub use pdctl_contract::availability;
pub mod reboot_window;
pub mod slo;
pub mod storm;
