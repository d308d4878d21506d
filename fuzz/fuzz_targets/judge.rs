//! Fuzz target: `pdctl_core::fuzzing::judge` (cargo +nightly fuzz run judge).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::judge(data));
