//! `pdctl-parse`: the pure parsers of what SGLang and its gateways export — Prometheus text
//! ([`prom`]), the KV gauges and their identity per stats rank ([`kv`]), histogram quantiles
//! ([`quantile`]), a worker's service figures over a window ([`service`]), a gateway's answer
//! counters and breakers ([`gateway`]); and systemd's names for a unit's states and results
//! ([`systemd`]). No HTTP client and no I/O: the drivers (`pdctl-probe`, `pdctl-systemd`) fetch
//! and read into these, pdctl-core judges by them.

#![warn(missing_docs)]

pub mod gateway;
pub mod kv;
pub mod prom;
pub mod quantile;
pub mod service;
pub mod systemd;
