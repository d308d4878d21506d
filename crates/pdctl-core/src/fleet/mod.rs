//! The fleet: many hosts behind one gateway, each host's pdctld coordinating through etcd v3.
//!
//! [`keys`] is the logic, with no I/O: the keys, what a slot semaphore holds, and whether a
//! holder may take a slot. [`store`] reads and changes them through the fleet's store (the
//! [`crate::ports::Coordinator`] port); the etcd driver (`pdctl-fleet`) stores these values and applies every
//! change with a compare-and-swap transaction on the keys' revisions, so that two hosts deciding
//! at the same moment cannot both win (the pattern of Fedora CoreOS's FleetLock server, airlock:
//! one JSON value per semaphore, updated by CAS, no lease on a slot — a host that dies keeps its
//! slot, because its worker really is down, until its pdctld comes back or an operator releases
//! it).
//!
//! Keys, under `/pdctl/<fleet name>/`:
//!
//! | key | value |
//! |---|---|
//! | `limits` | [`Limits`]: `max_unavailable` per role, written by the first pdctld; a host whose config disagrees refuses |
//! | `slots/<role>` | [`Semaphore`]: the holders of that role's slots |
//! | `hosts/<host>` | [`HostState`], bound to the host's lease (gone when its pdctld is) |
//! | `paused` | [`Pause`] while no new slot is granted fleet-wide (an operator's, or a restart storm's) |
//! | `storm_since` | when the last pause was lifted (seconds): self-restarts before it were that pause's, and make no storm again |
//! | `requests/<id>` | [`FleetRollout`]: a fleet rollout every named host's pdctld runs its part of |
//! | `rollouts/<id>/hosts/<host>/events/<seq>` | [`HostEvent`]: that host's events, in order |
//! | `rollouts/<id>/hosts/<host>/summary` | [`HostSummary`]: how that host's part ended |
//! | `rollouts/<id>/hosts/<host>/bake` | [`HostBake`]: that host's bake of its changed workers (`[fleet] bake`) |
//! | `rollouts/<id>/revert` | [`FleetRevert`]: after a bake's breach, the hosts to revert, in order |
//! | `rollouts/<id>/hosts/<host>/revert` | [`HostSummary`]: how that host's revert ended |

pub mod bake;
pub mod keys;
pub mod store;
pub mod view;

pub use bake::*;
pub use keys::*;
pub use store::*;
pub use view::*;

#[cfg(test)]
mod tests;
