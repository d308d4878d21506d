//! What clients see: the SLO gate's judgement of latency and errors ([`slo`]), the availability
//! probe's figures ([`availability`]), restarts pdctl did not make (the restart storm,
//! [`storm`]), when a host may begin maintenance ([`reboot_window`]), each PD role's pressure with the
//! ratio it suggests ([`role_pressure`]), and when pdctld acts on that suggestion by itself
//! ([`role_balance`]).

pub use pdctl_contract::availability;
pub mod reboot_window;
pub mod role_balance;
pub mod role_pressure;
pub mod slo;
pub mod storm;
