//! `pdctl-parse`: the pure parsers of what SGLang and its gateways export — Prometheus text
//! ([`prom`]), the KV gauges and their identity per stats rank ([`kv`]), histogram quantiles
//! ([`quantile`]), a worker's service figures over a window ([`service`]), a gateway's answer
//! counters and breakers ([`gateway`]). No HTTP client and no I/O: the HTTP drivers
//! (`pdctl-probe`) fetch, pdctl-core judges, both through these.

#![warn(missing_docs)]

pub mod gateway;
pub mod kv;
pub mod prom;
pub mod quantile;
pub mod service;
