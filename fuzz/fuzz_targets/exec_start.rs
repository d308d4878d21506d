//! Fuzz target: `pdctl_core::fuzzing::exec_start` (cargo +nightly fuzz run exec_start).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pdctl_core::fuzzing::exec_start(data));
