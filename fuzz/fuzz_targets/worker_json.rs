//! Fuzz target: `pdctl_core::fuzzing::worker_json` (cargo +nightly fuzz run worker_json).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::worker_json(data));
