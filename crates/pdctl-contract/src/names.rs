//! The pseudo-units: names that stand in an event's `unit` for something that is not a systemd
//! unit. A leaf: it imports nothing of this crate.

/// The pseudo-unit of events about the router as a whole (its preflight check).
pub const ROUTER: &str = "router";

/// The pseudo-unit of fleet-wide events (preflight's check of the fleet's etcd and limits).
pub const FLEET: &str = "fleet";
