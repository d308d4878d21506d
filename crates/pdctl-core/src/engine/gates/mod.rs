//! The gates, one file each. Each is a typed function whose first argument is the engine (its
//! ports and settings): a call names the gate it enters (`health::health(engine, …)`), and the
//! order they run in is `super::runbook::RUNBOOK`.

pub(in crate::engine) mod deferred_drain;
pub(in crate::engine) use deferred_drain::Deferred;
pub(in crate::engine) mod drain;
pub(in crate::engine) mod health;
pub(in crate::engine) mod metrics;
pub(in crate::engine) mod pair;
pub(in crate::engine) mod pd_checks;
pub(in crate::engine) mod prefetch;
pub(in crate::engine) mod preflight;
pub(in crate::engine) mod ready;
pub(in crate::engine) mod restart;
pub(in crate::engine) use restart::Restarted;
pub(in crate::engine) mod router;
pub(in crate::engine) mod service_level;
pub(in crate::engine) mod slot;
pub(in crate::engine) mod switch_role;
pub(in crate::engine) use service_level::Mark;
pub(in crate::engine) mod soak;
pub(in crate::engine) mod stop;
pub(in crate::engine) mod stranded_kv;
