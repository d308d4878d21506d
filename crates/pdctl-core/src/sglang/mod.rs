//! What SGLang is and does, as pdctl relies on it: its built-in facts (the ready line, fatal
//! lines, flags; [`facts`], re-exported here), what a unit's journal lines mean ([`judge`]), PD
//! pairs and their diagnosis ([`pairing`]), a worker's stop ([`stop`]), the model a worker
//! computes with ([`coherence`]) and its tokenizer ([`tokenizer`]), the arguments a unit that keeps
//! its flags in a `--config` YAML file runs with ([`launch_config`]), a checkpoint's files and
//! reading them into the page cache before a start needs them ([`checkpoint`]), the runtime
//! prefill/decode role switch ([`role_switch`]).

pub mod checkpoint;
pub mod coherence;
pub mod facts;
pub mod judge;
pub mod launch_config;
pub mod pairing;
pub mod role_switch;
pub mod stop;
pub mod tokenizer;

pub use facts::*;
