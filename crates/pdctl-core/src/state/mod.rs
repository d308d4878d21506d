//! What pdctld keeps on disk about the units it rolls: each unit's good revisions and what changed
//! since ([`revisions`]), the drains it made ([`drain_ledger`]), atomic private state files
//! ([`state_file`]), the in-place weight loads on record ([`in_place`]), and the workers a
//! weights rollout paused ([`paused`]), and a worker's role drop-in ([`role_dropin`]).

pub mod drain_ledger;
pub mod in_place;
pub mod paused;
pub mod revisions;
pub mod role_dropin;
pub mod safe_path;
pub mod state_file;
