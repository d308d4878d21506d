//! `sglang-sim`: an operational simulator of one SGLang server, faithful to what an orchestrator
//! sees (upstream `sgl-project/sglang` 0.4.6-0.5.23, `python/sglang/srt/`): launch flags and argparse errors, the start-up log lines on
//! stderr, the port opening only after "loading", `/health` 503 during warmup, `/metrics` only with
//! `--enable-metrics` (names, labels and lazy publication by version), PD roles with a bootstrap
//! port, and documented fault knobs. See `docs/sglang-sim.md`.

#![warn(missing_docs)]

pub mod args;
pub mod catalogue;
pub mod config_file;
pub mod engine;
pub mod exposition;
pub mod ids;
pub mod knobs;
pub mod log;
pub mod pd;
pub mod served_model;
pub mod server;
pub mod service;
pub mod version;
