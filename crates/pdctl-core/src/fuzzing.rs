//! Entry points for fuzzing the inputs pdctl takes from outside — the config loader, the
//! Prometheus text parser with the KV check and the service figures (the SLO histograms), the
//! control API's request decoding, the journal judge's field handling, every etcd value and the
//! decisions taken on it, the gateway's and workers' JSON, pdctld's on-disk state, and the
//! ExecStart reading of a config change. The `fuzz/` targets (cargo fuzz, nightly) call these; the corpora they
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
        if let Ok(e) = pdctl_parse::prom::parse(text) {
            let _ = pdctl_parse::kv::check(&e);
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
    let j = crate::sglang::judge::Judge {
        ready_pattern: crate::sglang::READY_LINE.into(),
        fatal_patterns: crate::sglang::fatal_patterns(&[]),
        run: crate::sglang::judge::Run {
            invocation_id: "0123456789abcdef0123456789abcdef".into(),
            main_pid: 4242,
            procfs: PathBuf::from("/nonexistent-procfs"),
        },
    };
    let _ = j.judge(&entry);
}

/// Every etcd value a host reads, decoded as each key type, and what is decided on the ones that
/// decode (down workers, a semaphore's grant, the fleet's view); nothing is decided on one that
/// does not.
pub fn fleet(data: &[u8]) {
    use crate::fleet::*;
    if let Ok(h) = serde_json::from_slice::<HostState>(data) {
        let _ = down_workers(std::slice::from_ref(&h));
    }
    if let Ok(s) = serde_json::from_slice::<Semaphore>(data) {
        let _ = serde_json::to_vec(&s);
    }
    let _ = serde_json::from_slice::<Limits>(data);
    let _ = serde_json::from_slice::<Pause>(data);
    let _ = serde_json::from_slice::<SlotRecord>(data);
    let _ = serde_json::from_slice::<FleetRollout>(data);
    let _ = serde_json::from_slice::<HostPhase>(data);
    let _ = serde_json::from_slice::<HostEvent>(data);
    let _ = serde_json::from_slice::<HostSummary>(data);
}

/// A worker's JSON: `/server_info` (what it was asked: `launch_command`, and the coherence check
/// against a command line) with `/model_info`'s model path.
pub fn worker_json(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let model = v.get("model_path").and_then(serde_json::Value::as_str).map(|p| (p.to_string(), "default".to_string()));
    let running = crate::sglang::coherence::Running::new(v.clone(), model);
    let argv: Vec<String> = "--model-path /m/a --tokenizer-path /m/t --dtype auto".split(' ').map(String::from).collect();
    let _ = crate::sglang::coherence::changes(&argv, &running, &["--chat-template".to_string()]);
}

/// `/metrics` text read as the service gate reads it: latency histograms and request counters,
/// differences between two scrapes, quantiles, the gateway's answers and breakers.
pub fn service(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(e) = pdctl_parse::prom::parse(text) else { return };
    let s = pdctl_parse::service::ServiceScrape::from_exposition(&e);
    let _ = s.since(&pdctl_parse::service::ServiceScrape::default());
    let _ = s.plus(&s);
    let _ = pdctl_parse::gateway::responses_in(&e);
    let _ = pdctl_parse::gateway::open_breakers_in(&e);
}

/// pdctld's files on disk: a drain in the ledger, `paused.json`, a revision, a quarantine.
pub fn state(data: &[u8]) {
    let _ = serde_json::from_slice::<crate::state::drain_ledger::Drain>(data);
    let _ = serde_json::from_slice::<Vec<crate::engine::PausedWorker>>(data);
    let _ = serde_json::from_slice::<crate::state::revisions::Quarantine>(data);
    if let Ok(r) = serde_json::from_slice::<crate::state::revisions::Revision>(data) {
        let _ = crate::state::in_place::effective_argv(&r);
        let _ = crate::state::in_place::target(&r, &r, |_, _| Ok::<(), String>(()));
    }
}

/// A unit's files as a config change sees them: the bytes as a unit file and as a drop-in over
/// it, read as systemd would (continuation lines, `ExecStart=` clearing) and compared for a
/// load in place.
pub fn exec_start(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let rev = |files: &[(&str, &str)]| crate::state::revisions::Revision {
        unit: "x.service".into(),
        recorded_at: 0,
        why: "fuzz".into(),
        files: files
            .iter()
            .map(|(p, c)| (p.to_string(), crate::state::revisions::FileRev { sha256: format!("{}", c.len()), contents: Some(c.to_string()), owner: None }))
            .collect(),
    };
    let base = "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m/a --port 1\n";
    let old = rev(&[("/u", base)]);
    for new in [rev(&[("/u", text)]), rev(&[("/u", base), ("/u.d/50.conf", text)])] {
        let _ = crate::state::in_place::effective_argv(&new);
        let _ = crate::state::in_place::target(&old, &new, |a, b| if a == b { Ok(()) } else { Err(String::new()) });
    }
}
