//! Fuzz target: `pdctl_core::fuzzing::fleet` (cargo +nightly fuzz run fleet).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::fleet(data));
