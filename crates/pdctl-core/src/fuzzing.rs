//! Entry points for fuzzing the inputs pdctl takes from outside — the config loader, the
//! Prometheus text parser with the KV check, the control API's request decoding, and the journal
//! judge's field handling. The `fuzz/` targets (cargo fuzz, nightly) call these; the corpora they
//! keep under `fuzz/corpus/` are replayed through the same functions by the normal test suite
//! (`tests/fuzz_corpus.rs`, stable). Each must return, whatever the bytes: no panic, no hang.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

/// The config loader on one file's bytes.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::config::load_texts(&[(PathBuf::from("fuzz.toml"), text.to_string())]);
    }
}

/// `/metrics` text: parse, then look for SGLang's KV gauges.
pub fn prom(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(e) = pdctl_probe::prom::parse(text) {
            let _ = pdctl_probe::kv::check(&e);
        }
    }
}

/// A control-API body, as each endpoint decodes it.
pub fn api(data: &[u8]) {
    let _ = serde_json::from_slice::<crate::api::Request>(data);
    let _ = serde_json::from_slice::<crate::api::FleetRequest>(data);
    let _ = serde_json::from_slice::<crate::api::StreamLine>(data);
    let _ = serde_json::from_slice::<crate::api::Record>(data);
}

/// A journal entry (`KEY=VALUE` lines) through the ready/fatal judge of a run.
pub fn judge(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let fields: BTreeMap<String, String> = text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let entry = crate::ports::LogEntry { realtime_us: 0, read_at: SystemTime::now(), fields };
    let j = crate::judge::Judge {
        ready_pattern: crate::sglang::READY_LINE.into(),
        fatal_patterns: crate::sglang::fatal_patterns(&[]),
        run: crate::judge::Run { invocation_id: "0123456789abcdef0123456789abcdef".into(), main_pid: 4242, procfs: PathBuf::from("/nonexistent-procfs") },
    };
    let _ = j.judge(&entry);
}
