//! Fuzz target: `pdctl_core::fuzzing::prom` (cargo +nightly fuzz run prom).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::prom(data));
