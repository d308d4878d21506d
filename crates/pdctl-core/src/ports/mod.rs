//! The boundary of the engine: four small traits — systemd ([`Units`]), the journal ([`Logs`]),
//! HTTP checks of workers and the router ([`Probes`]), the fleet's store ([`Coordinator`]) — and
//! the facts they report, in core's own types. Drivers report facts; the engine and `sglang::judge` decide what they mean. The real
//! implementations are in the crate `pdctl-real`; unit tests use in-memory fakes behind the same traits.
//!
//! One file a port: [`units`] (systemd), [`logs`] (the journal), [`probes`] (HTTP), [`coordinator`] (the
//! fleet's etcd); every type is re-exported here, so a user names `crate::ports::X`.

pub mod coordinator;
pub mod logs;
pub mod probes;
pub mod units;

pub use coordinator::*;
pub use logs::*;
pub use probes::*;
pub use units::*;
