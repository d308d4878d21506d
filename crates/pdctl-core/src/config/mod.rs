//! Configuration: `/etc/pdctl/pdctl.toml`, then `/etc/pdctl/config.d/*.toml` merged in name order
//! (`--config PATH` or `PDCTL_CONFIG` replaces the first), validated into [`Settings`] in
//! phases: each file's raw TOML ([`raw`]: every key optional, unknown keys refused), the files merged
//! ([`merge`]), each section validated by its own function ([`sections`]) into the resolved
//! [`settings`]. [`load_texts`] composes the phases and does no I/O; [`load`] reads the files and
//! the machine's host name.
//!
//! Merging: a later file's keys override an earlier file's, table by table; `[[worker]]` entries
//! are appended (a fragment can add a worker; a unit named twice is an error). Unknown keys, bad
//! durations and bad values are errors that name the file, the line and the key.

mod load;
mod merge;
mod raw;
mod sections;
mod settings;

pub use crate::url::{canonical_url, same_url};
pub use load::*;
pub use raw::{BusKind, Dur};
pub use settings::{
    parse_gpus, BusSetting, Coherent, FleetSettings, FleetTls, InPlace, KeySource, KillModePolicy, MaintenanceSettings, MetricsMode, OnFailure, OnStalePair,
    Replica, Role, Rollout, RouterSettings, Settings, SinglePair, Slo, StrandedKv, Unjudged, UnknownLoad, Verify, WeightsFallback, Worker, DURATION_BOUNDS,
};
