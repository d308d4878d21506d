//! Fuzz target: `pdctl_core::fuzzing::config` (cargo +nightly fuzz run config).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::config(data));
