//! Fuzz target: `pdctl_core::fuzzing::state` (cargo +nightly fuzz run state).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::state(data));
