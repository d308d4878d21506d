//! The engine's part in a fleet: a host's phase written to etcd and the wait for the others'
//! ([`in_step`]: fleet weights, the fleet switch), the coherent switch across hosts behind one
//! gateway ([`switch`]), and the fleet bake's look at a host's changed workers ([`bake_look`]).
//! A worker's fleet slot is a step of its own (`gates/slot.rs`).

pub mod bake_look;
pub(in crate::engine) mod in_step;
mod switch;
