//! The rollout state machine. It reads like the runbook — for each worker, in plan order:
//!
//! 1. **preflight** (all workers, before the first restart): the unit exists; reload the manager if
//!    `NeedDaemonReload`; `--enable-metrics` is in ExecStart when the metrics gate is required; GPU
//!    sets do not overlap; a PD worker's ExecStart can pair with its running peers
//!    ([`crate::sglang::pairing::compare`]); the router answers.
//! 2. **drain**: take the worker out of the router, wait (bounded) for its in-flight requests.
//! 3. **restart**: journal cursor, watch the unit, `RestartUnit(name, "replace")`, our job's result.
//! 4. **ready**: the ready line of *this* run ([`crate::sglang::judge::Judge`]); fail fast on a fatal line,
//!    the manager's exit/failure messages, or a crash/auto-restart ([`crate::sglang::judge::crashed_since`]).
//! 5. **health**: `/health` answers 200.
//! 6. **pair** (a PD worker, still out of the router): a PD request sent straight to each pair it
//!    is in; a decode found with a stale pairing after a prefill restart is restarted through every
//!    gate as a repair (`repair_of`), or the rollout halts (`on_stale_pair`).
//! 7. **router**: registered (re-registered if the router dropped it) with the right type, healthy,
//!    circuit breaker not open, one small request through the router answers 200.
//! 8. **metrics**: KV gauges exposed and sane (one warm-up request if they are not published yet).
//! 9. **stranded_kv** (a decode): the prefills release the KV they held for its old process's rooms.
//! 10. **soak**: the same run (InvocationID, NRestarts) stays up for `min_healthy`; then the files it
//!     runs with are recorded as its good revision.
//!
//! The first failure halts the rollout with its [`Cause`] and the unit's last log lines; nothing
//! after it is touched. One unit is down at a time. With `on_failure = "rollback"` the failed unit's
//! last good revision is restored and run through the same gates ([`Engine::execute`]). A resumed
//! rollout re-verifies the unit it stopped at and restarts it only if that fails.

mod after_load;
mod context;
mod fleet;
mod gates;
mod halt;
pub mod host;
mod in_place;
mod machine;
mod plan_steps;
mod policy;
mod reconcile;
mod recovery;
mod repair;
pub mod role_change;
mod role_floor;
mod roll;
mod run;
pub mod runbook;
mod step_run;
pub mod steps;
mod switch;
mod weights;
mod work;

pub use crate::state::paused::{paused_path, PausedWorker};
pub use fleet::bake_look::{BakeLook, BakeMarks};
pub use machine::{Engine, LAST_LINES};
pub use step_run::sentence;
pub use work::{Asked, Finished, Known, KnownChanges, RolloutRun, Staleness, WeightsTarget, Work};
