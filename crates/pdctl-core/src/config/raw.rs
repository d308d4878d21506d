//! The raw input: each file's TOML as written (every key optional, unknown keys refused), with
//! the spans that errors point at. Nothing here is validated beyond its type.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::settings::{
    Coherent, InPlace, KillModePolicy, MetricsMode, OnFailure, OnStalePair, Role, SinglePair, StrandedKv, Unjudged, UnknownLoad, WeightsFallback,
};
use super::ConfigError;

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len())).map(|t| t.matches('\n').count() + 1).unwrap_or(1)
}

/// A duration written as "90s", "10m", "1h 30m".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map(Dur)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration {s:?} ({e}); write it like \"90s\", \"10m\" or \"1h 30m\"")))
    }
}

/// Which bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusKind {
    /// System manager.
    System,
    /// The caller's user manager.
    User,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSystemd {
    pub(super) bus: Option<BusKind>,
    pub(super) address: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJournal {
    pub(super) directory: Option<PathBuf>,
    pub(super) procfs: Option<PathBuf>,
}

/// One string or a list of them (`[router] url` of several gateway replicas).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub(super) fn list(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouter {
    pub(super) url: Option<OneOrMany>,
    pub(super) metrics_url: Option<OneOrMany>,
    pub(super) api_key_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorker {
    pub(super) unit: Spanned<String>,
    pub(super) role: Role,
    pub(super) url: Spanned<String>,
    pub(super) bootstrap_port: Option<u16>,
    pub(super) gpus: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) watch_files: Vec<PathBuf>,
    pub(super) api_key_file: Option<Spanned<String>>,
    pub(super) admin_api_key_file: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRollout {
    pub(super) order: Option<Vec<Role>>,
    pub(super) ready_pattern: Option<Spanned<String>>,
    pub(super) fatal_patterns: Option<Vec<String>>,
    pub(super) ready_timeout: Option<Dur>,
    pub(super) health_timeout: Option<Dur>,
    pub(super) router_timeout: Option<Dur>,
    pub(super) metrics_timeout: Option<Dur>,
    pub(super) job_timeout: Option<Dur>,
    pub(super) min_healthy: Option<Dur>,
    pub(super) on_failure: Option<OnFailure>,
    pub(super) max_unavailable: Option<Spanned<u32>>,
    pub(super) drain: Option<bool>,
    pub(super) drain_timeout: Option<Dur>,
    pub(super) allow_outage: Option<bool>,
    pub(super) single_pair: Option<SinglePair>,
    pub(super) coherent: Option<Coherent>,
    pub(super) coherent_flags: Option<Vec<String>>,
    pub(super) model_roots: Option<Vec<String>>,
    pub(super) in_place: Option<InPlace>,
    pub(super) weights_fallback: Option<WeightsFallback>,
    pub(super) max_failed_probes: Option<u64>,
    pub(super) on_stale_pair: Option<OnStalePair>,
    pub(super) abort_after_drain_timeout: Option<bool>,
    pub(super) unknown_load: Option<UnknownLoad>,
    pub(super) kill_mode: Option<KillModePolicy>,
    pub(super) prefetch_weights: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVerify {
    pub(super) router: Option<bool>,
    pub(super) metrics: Option<MetricsMode>,
    pub(super) smoke_request: Option<bool>,
    pub(super) warmup_request: Option<bool>,
    pub(super) availability_probe: Option<String>,
    pub(super) pair: Option<bool>,
    pub(super) pair_timeout: Option<Dur>,
    pub(super) stranded_kv: Option<StrandedKv>,
    pub(super) stranded_kv_timeout: Option<Dur>,
    pub(super) slo: Option<RawSlo>,
}

/// `[fleet.storm]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorm {
    pub(super) restarts: Option<u32>,
    pub(super) within: Option<Dur>,
}

/// `[verify.slo]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlo {
    pub(super) ttft_ratio: Option<f64>,
    pub(super) itl_ratio: Option<f64>,
    pub(super) e2e_ratio: Option<f64>,
    pub(super) error_rate: Option<f64>,
    pub(super) min_requests: Option<u64>,
    pub(super) max_wait: Option<Dur>,
    pub(super) unjudged: Option<Unjudged>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleet {
    pub(super) etcd: Option<Vec<String>>,
    pub(super) name: Option<String>,
    pub(super) host: Option<String>,
    pub(super) slot_timeout: Option<Dur>,
    pub(super) max_unavailable: Option<std::collections::BTreeMap<Role, u32>>,
    pub(super) user: Option<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) canary: Option<String>,
    pub(super) keep_rollouts: Option<u32>,
    pub(super) bake: Option<Dur>,
    pub(super) storm: Option<RawStorm>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
}

/// `[maintenance]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMaintenance {
    pub(super) fleetlock_listen: Option<String>,
    pub(super) fleetlock_id: Option<String>,
    pub(super) fleetlock_users: Option<Vec<String>>,
    pub(super) windows: Option<Vec<String>>,
    pub(super) hold_while_alerting: Option<String>,
    pub(super) balance_roles: Option<bool>,
    pub(super) balance_after: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) maintenance: Option<RawMaintenance>,
    pub(super) fleet: Option<RawFleet>,
    pub(super) systemd: Option<RawSystemd>,
    pub(super) journal: Option<RawJournal>,
    pub(super) router: Option<RawRouter>,
    pub(super) worker: Option<Vec<RawWorker>>,
    pub(super) rollout: Option<RawRollout>,
    pub(super) verify: Option<RawVerify>,
}

/// The line where `key = …` is set in `text` (first such line).
pub(super) fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines().position(|l| l.trim_start().strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('='))).map(|i| i + 1)
}

/// The key set on line `line` of `text` (1-based), with its table: `rollout.drain_timeout` for
/// `drain_timeout = 3` under `[rollout]` (`worker.url` under `[[worker]]`); `None` when the line
/// sets no key.
pub(super) fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let (key, _) = lines.get(line.checked_sub(1)?)?.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || key.starts_with('[') || key.contains(char::is_whitespace) {
        return None;
    }
    let table = lines[..line - 1].iter().rev().map(|l| l.trim()).find(|l| l.starts_with('[')).map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

pub(super) fn parse_file(path: &Path, text: &str) -> Result<RawFile, ConfigError> {
    toml::from_str::<RawFile>(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let msg = e.message().trim().to_string();
        // Unknown keys name the key; a wrong type or value does not: the key is named here.
        let msg = match line.and_then(|l| key_at(text, l)) {
            Some(k) if !msg.contains(k.rsplit('.').next().unwrap_or(&k)) => format!("{k}: {msg}"),
            _ => msg,
        };
        ConfigError { file: path.display().to_string(), line, msg }
    })
}

#[cfg(test)]
mod key_tests {
    #[test]
    fn a_type_error_names_its_key_and_table() {
        let text = "[[worker]]\nunit = \"p.service\"\nrole = \"regular\"\nurl = \"http://127.0.0.1:9\"\n[rollout]\ndrain_timeout = 3\n[verify.slo]\nunjudged = \"bogus\"\n";
        assert_eq!(super::key_at(text, 6).as_deref(), Some("rollout.drain_timeout"));
        assert_eq!(super::key_at(text, 2).as_deref(), Some("worker.unit"));
        assert_eq!(super::key_at(text, 5), None);
        let e = super::parse_file(std::path::Path::new("c.toml"), text).expect_err("invalid");
        assert_eq!(e.line, Some(6));
        assert!(e.msg.starts_with("rollout.drain_timeout: invalid type"), "{}", e.msg);
        let e = super::parse_file(std::path::Path::new("c.toml"), &text.replace("drain_timeout = 3", "drain_timeout = \"3s\"")).expect_err("invalid");
        assert!(e.msg.starts_with("verify.slo.unjudged: unknown variant `bogus`"), "{}", e.msg);
    }
}
