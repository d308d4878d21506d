//! `pdctl-contract`: what pdctl promises its clients, apart from how it decides. The control
//! API's requests and answers and the rollout record ([`api`]), the events and summaries of a
//! rollout ([`events`], [`details`]), every failure ([`cause::Cause`]: its code, class, exit code,
//! sentence and next step, [`next`]), the exit-code table ([`exit`]), a rollout's lifecycle
//! ([`lifecycle`]), where a unit's time out of the gateway went ([`window`]), what clients saw
//! ([`availability`]), and the values pdctld keeps and shows ([`records`]). It imports nothing of
//! pdctl's own: the CLI, pdctld and pdctl-core depend on it, and pdctl-core re-exports it under
//! the same module names.

#![warn(missing_docs)]

pub mod api;
pub mod availability;
pub mod cause;
pub mod clock;
pub mod details;
pub mod events;
pub mod exit;
pub mod lifecycle;
pub mod names;
pub mod next;
pub mod records;
pub mod redact;
pub mod rollout_record;
pub mod started_by;
pub mod url;
pub mod window;
