//! The prefetch gate: the checkpoints a rollout's next starts (or in-place loads) read that no
//! worker serves yet, each read into the page cache before the first worker stops, where it fits
//! in memory ([`crate::sglang::checkpoint`]). A read that cannot be made is said and skipped: it
//! never stops a rollout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Worker;
use crate::details::{Prefetch, PrefetchRead};
use crate::engine::machine::Engine;
use crate::engine::step_run::Verdict;
use crate::engine::steps::PREFETCH_LIMIT;
use crate::ports::{Probes, Units};
use crate::sglang::checkpoint;

/// One checkpoint to read, and the workers whose next start (or load) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) struct Target {
    /// The checkpoint directory.
    pub(in crate::engine) model_path: String,
    /// The workers, in plan order.
    pub(in crate::engine) units: Vec<String>,
}

/// The checkpoints `workers`' next starts read that they do not serve now: each worker's
/// `--model-path` as systemd will run it (a `--config` file merged), where its server reports
/// another one (`/model_info`) or does not answer; each path once, in plan order. A path that
/// does not exist here is nothing to read (a model hub id: the server downloads it itself).
pub(in crate::engine) async fn targets<U: Units, L, P: Probes>(eng: &Engine<U, L, P>, workers: &[Worker]) -> Vec<Target> {
    let mut out: Vec<Target> = Vec::new();
    for w in workers {
        let Ok(cfg) = eng.units.config(&w.unit).await else { continue };
        let Some(path) = cfg.exec_start.iter().find_map(|argv| crate::sglang::coherence::model_path(argv)) else { continue };
        if on_this_host(&path) && eng.probes.model_info(&w.url).await.ok().map(|(p, _)| p) != Some(path.clone()) {
            with(&mut out, &path, &w.unit);
        }
    }
    out
}

/// Whether `path` is something on this host (a directory, or one this process may not look
/// into: the read says why), not a model hub id.
fn on_this_host(path: &str) -> bool {
    path.starts_with('/') && std::fs::metadata(path).map_or_else(|e| e.kind() != std::io::ErrorKind::NotFound, |_| true)
}

/// The checkpoint an in-place load reads, for `units` (those that do not serve it yet): none when
/// it is not on this host.
pub(in crate::engine) fn for_load<'a>(path: &str, units: impl Iterator<Item = &'a str>) -> Vec<Target> {
    let mut out = Vec::new();
    if on_this_host(path) {
        units.for_each(|u| with(&mut out, path, u));
    }
    out
}

/// `unit` reads `path`: added to its target, or a new one.
fn with(out: &mut Vec<Target>, path: &str, unit: &str) {
    match out.iter_mut().find(|t| t.model_path == path) {
        Some(t) => t.units.push(unit.to_string()),
        None => out.push(Target { model_path: path.to_string(), units: vec![unit.to_string()] }),
    }
}

/// Read `t`'s checkpoint into the page cache, telling `progress` about once a second, until its
/// end, `abort` or [`PREFETCH_LIMIT`]. Skipped (with the reason) where it is not a directory
/// this process can read, or does not fit in the memory available.
pub(in crate::engine) async fn prefetch(t: &Target, abort: &AtomicBool, progress: &(dyn Fn(PrefetchRead) + Sync)) -> Verdict<Prefetch> {
    let dir = std::path::PathBuf::from(&t.model_path);
    let looked = tokio::task::spawn_blocking(move || Ok::<_, checkpoint::NotRead>((checkpoint::list(&dir)?, checkpoint::memory()?))).await;
    let (c, mem) = match looked {
        Ok(Ok(x)) => x,
        Ok(Err(why)) => return Verdict::Skipped(format!("{} not read ahead: {why}", t.model_path)),
        Err(e) => return Verdict::Skipped(format!("{} not read ahead: {e}", t.model_path)),
    };
    if let Err(why) = checkpoint::fits(c.bytes, mem) {
        return Verdict::Skipped(format!("{} not read ahead: {why}", t.model_path));
    }
    let (read, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let (files, r, s) = (c.files.clone(), read.clone(), stop.clone());
    let mut job = tokio::task::spawn_blocking(move || checkpoint::read(&files, &r, &s));
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let ended = loop {
        tokio::select! {
            r = &mut job => break r.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())),
            _ = tick.tick() => {
                progress(PrefetchRead { read_bytes: read.load(Ordering::SeqCst), of_bytes: c.bytes });
                if abort.load(Ordering::SeqCst) || t0.elapsed() >= PREFETCH_LIMIT {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        }
    };
    let read_bytes = match ended {
        Ok(n) => n,
        Err(why) => return Verdict::Skipped(format!("{} not read ahead: {why}", t.model_path)),
    };
    let detail = Prefetch {
        model_path: t.model_path.clone(),
        units: t.units.clone(),
        files: c.files.len(),
        bytes: c.bytes,
        read_bytes,
        mem_available_bytes: mem.available,
        headroom_bytes: checkpoint::headroom(mem.total),
    };
    if read_bytes < c.bytes {
        let why = format!(
            "{} read {} of {} before {}: the rest comes from disk at the start",
            t.model_path,
            checkpoint::gib(read_bytes),
            checkpoint::gib(c.bytes),
            if abort.load(Ordering::SeqCst) { "the rollout was aborted" } else { "the read's time was up" }
        );
        return Verdict::Passed(detail, crate::details::Said { note: Some(why), ..Default::default() });
    }
    Verdict::passed(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_checkpoint_once_with_every_worker_that_reads_it() {
        let mut t = Vec::new();
        with(&mut t, "/m/b", "p.service");
        with(&mut t, "/m/b", "d.service");
        with(&mut t, "/m/c", "x.service");
        assert_eq!(
            t,
            [
                Target { model_path: "/m/b".into(), units: vec!["p.service".into(), "d.service".into()] },
                Target { model_path: "/m/c".into(), units: vec!["x.service".into()] }
            ]
        );
        // A model hub id, or a path that is not on this host: nothing to read.
        assert_eq!(for_load("deepseek-ai/DeepSeek-V3", ["p.service"].into_iter()), []);
        assert_eq!(for_load("/nonexistent/m", ["p.service"].into_iter()), []);
        let d = tempfile::tempdir().unwrap();
        let here = d.path().display().to_string();
        assert_eq!(
            for_load(&here, ["p.service", "d.service"].into_iter()),
            [Target { model_path: here.clone(), units: vec!["p.service".into(), "d.service".into()] }]
        );
    }

    #[tokio::test]
    async fn a_checkpoint_is_read_through_with_its_progress_and_a_missing_one_is_skipped_with_why() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("model.safetensors"), vec![7u8; 1 << 20]).unwrap();
        let t = Target { model_path: d.path().display().to_string(), units: vec!["p.service".into()] };
        let v = prefetch(&t, &AtomicBool::new(false), &|_| {}).await;
        let Verdict::Passed(p, said) = v else { panic!("{v:?}") };
        assert_eq!((p.files, p.bytes, p.read_bytes), (1, 1 << 20, 1 << 20));
        assert!(p.mem_available_bytes > 0 && p.headroom_bytes >= 1 << 30);
        assert_eq!(said.note, None);
        let gone = Target { model_path: "/nonexistent/m".into(), units: vec![] };
        let v = prefetch(&gone, &AtomicBool::new(false), &|_| {}).await;
        assert!(matches!(&v, Verdict::Skipped(why) if why.contains("/nonexistent/m not read ahead") && why.contains("cannot be read")), "{v:?}");
    }
}
