//! Fuzz target: `pdctl_core::fuzzing::api` (cargo +nightly fuzz run api).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::api(data));
