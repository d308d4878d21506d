//! New weights read before anyone stops: a rollout that changes `--model-path` to a checkpoint
//! directory on the host reads its files into the page cache first — before the first worker's
//! drain (a restart) or pause (an in-place load) — with its progress and figures in the record.
//! Observed from outside: the checkpoint's pages are dropped from the cache before the rollout
//! (`dd iflag=nocache`, POSIX_FADV_DONTNEED) and resident after it (`fincore`); the simulator
//! does not read its model path, so nothing but pdctl's read brings them in.

use std::path::{Path, PathBuf};

use pdctl_tests::pdctl_sandbox::stack::{Stack, StackOptions};
use pdctl_tests::{model_info, stack_with_pdctld};
use serde_json::Value;

use super::{D, LIMIT, P};

const SHARD: usize = 48 << 20;

/// A checkpoint directory with one 48 MiB shard and its config, out of the page cache.
fn checkpoint(stack: &Stack, name: &str) -> (PathBuf, u64) {
    let dir = stack.sandbox.dir().join("models").join(name);
    std::fs::create_dir_all(&dir).expect("the checkpoint's directory");
    let shard = dir.join("model-00001-of-00001.safetensors");
    std::fs::write(&shard, vec![0x5au8; SHARD]).expect("shard");
    std::fs::write(dir.join("config.json"), br#"{"architectures": ["DeepseekV3ForCausalLM"]}"#).expect("config");
    std::fs::File::open(&shard).and_then(|f| f.sync_all()).expect("on disk");
    let out = std::process::Command::new("dd").arg(format!("if={}", shard.display())).args(["iflag=nocache", "count=0"]).output().expect("dd");
    assert!(out.status.success(), "dd: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(resident(&shard), 0, "the shard is out of the page cache before the rollout: else this test could not observe the read");
    let bytes = std::fs::read_dir(&dir).expect("list").map(|e| e.expect("entry").metadata().expect("meta").len()).sum();
    (shard, bytes)
}

/// Bytes of `file` in the page cache (`fincore`, util-linux).
fn resident(file: &Path) -> u64 {
    let out = std::process::Command::new("fincore").args(["--bytes", "--noheadings", "--output", "RES"]).arg(file).output().expect("fincore");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("fincore: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Most of `shard` is in the page cache: this machine's kernel reclaims cold pages by itself
/// (DAMON), so a few may be gone again by the time the test looks; nothing read them but pdctl.
fn in_memory(shard: &Path) {
    let r = resident(shard);
    assert!(r >= SHARD as u64 * 3 / 4, "the shard is in the page cache: {r} of {SHARD} bytes");
}

/// The rollout's passed prefetch event, and its position in the stream.
fn prefetched(events: &[Value]) -> (usize, &Value) {
    events.iter().enumerate().find(|(_, e)| e["step"] == "prefetch" && e["status"] == "passed").unwrap_or_else(|| panic!("a passed prefetch step: {events:#?}"))
}

#[test]
fn a_restart_onto_a_new_checkpoint_reads_it_into_memory_before_the_first_worker_leaves() {
    let (stack, config, d) = stack_with_pdctld();
    let (shard, bytes) = checkpoint(&stack, "dsv4-ft-1206");
    let model = shard.parent().expect("dir").display().to_string();
    let opts = StackOptions::default();
    for (unit, w) in [(P, &stack.prefill), (D, &stack.decode)] {
        let exec = stack.worker_unit(w, &opts, &["--model-path".into(), model.clone()]);
        let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
        stack.drop_in(unit, "50-new-model", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
    }
    std::fs::write(config.parent().expect("dir").join("config.d/40-together.toml"), "[rollout]\nsingle_pair = \"together\"\nallow_outage = true\n")
        .expect("together");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--load-changes", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let (at, e) = prefetched(&r.events);
    let detail = &e["detail"];
    assert_eq!(detail["model_path"], model.as_str(), "{e:#}");
    assert_eq!((detail["files"].as_u64(), detail["bytes"].as_u64(), detail["read_bytes"].as_u64()), (Some(2), Some(bytes), Some(bytes)), "{e:#}");
    let mut units: Vec<&str> = detail["units"].as_array().expect("units").iter().filter_map(Value::as_str).collect();
    units.sort();
    assert_eq!(units, [D, P], "one read for both workers that start from it");
    let first_out = r.events.iter().position(|e| ["drain", "restart", "stop"].contains(&e["step"].as_str().unwrap_or(""))).expect("a drain");
    assert!(at < first_out, "read before anyone left the gateway: prefetch event {at}, first drain/restart {first_out}");
    in_memory(&shard);
    for url in [&stack.prefill.url, &stack.decode.url] {
        assert_eq!(model_info(url)["model_path"], model.as_str());
    }
    // A restart that changes nothing reads nothing: the workers serve what their files say.
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert!(!r.events.iter().any(|e| e["step"] == "prefetch"), "no prefetch without a new checkpoint");
}

#[test]
fn new_weights_loaded_in_place_are_read_before_the_pause_and_one_that_does_not_fit_is_said() {
    let (stack, config, d) = stack_with_pdctld();
    let (shard, bytes) = checkpoint(&stack, "dsv4-ft-1207");
    let model = shard.parent().expect("dir").display().to_string();
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", &model, "--version", "ft-1207", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let (at, e) = prefetched(&r.events);
    assert_eq!((e["detail"]["bytes"].as_u64(), e["detail"]["read_bytes"].as_u64()), (Some(bytes), Some(bytes)), "{e:#}");
    let paused = r.events.iter().position(|e| e["step"] == "weights").expect("a weights step");
    assert!(at < paused, "read before the first pause: prefetch event {at}, first weights event {paused}");
    in_memory(&shard);
    assert_eq!(model_info(&stack.decode.url)["weight_version"], "ft-1207");
    // A checkpoint larger than the memory this host has left: nothing read, and the summary says why.
    let big = stack.sandbox.dir().join("models/too-big");
    std::fs::create_dir_all(&big).expect("dir");
    let f = std::fs::File::create(big.join("model.safetensors")).expect("shard");
    f.set_len(1 << 40).expect("a sparse 1 TiB shard");
    let too_big = big.display().to_string();
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", &too_big, "--version", "big", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let skipped = r.events.iter().find(|e| e["step"] == "prefetch" && e["status"] == "skipped").expect("a skipped prefetch");
    let why = skipped["detail"]["reason"].as_str().unwrap_or("");
    assert!(why.starts_with(&format!("{too_big} not read ahead: its 1024.00 GiB do not fit")), "{why}");
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert!(rec["notes"].as_array().is_some_and(|n| n.iter().any(|x| x.as_str() == Some(why))), "the record's notes say it: {rec:#}");
}
