//! Fuzz target: `pdctl_core::fuzzing::service` (cargo +nightly fuzz run service).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::service(data));
