//! The workers a weights rollout paused (`paused.json` in pdctld's state directory): written
//! before the first pause and removed when the rollout ends, so that pdctld, starting after a
//! crash mid-load, continues every worker left paused.

/// One worker pdctl may have left paused (`paused.json` in pdctld's state directory).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PausedWorker {
    /// The unit.
    pub unit: String,
    /// Its URL (where `/continue_generation` goes).
    pub url: String,
}

/// Where a weights rollout records the workers it is about to pause (written before the first
/// pause, removed when the rollout ends): what pdctld continues when it starts after a crash.
pub fn paused_path(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("paused.json")
}

/// Record `workers` as about to be paused, before the first pause (atomically, as every state
/// file is written).
pub fn record<'w>(dir: &std::path::Path, workers: impl Iterator<Item = (&'w str, &'w str)>) -> std::io::Result<()> {
    let paused: Vec<PausedWorker> = workers.map(|(unit, url)| PausedWorker { unit: unit.to_string(), url: url.to_string() }).collect();
    let bytes = serde_json::to_vec_pretty(&paused).unwrap_or_default();
    crate::state::state_file::atomic_write(&paused_path(dir), &bytes, crate::state::state_file::STATE_FILE_MODE)
}
