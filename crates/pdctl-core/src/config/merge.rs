//! The files merged in order: a later file's keys override an earlier file's, table by table;
//! `[[worker]]` entries are appended. What set each key is remembered ([`Origins`]) so that an
//! error found after merging still names the file and line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::raw::{
    line_of, line_of_key, parse_file, Dur, RawFleet, RawJournal, RawMaintenance, RawRollout, RawRouter, RawSlo, RawStorm, RawSystemd, RawVerify, RawWorker,
};
use super::settings::DURATION_BOUNDS;
use super::ConfigError;

/// Every section as merged from all files, still raw.
#[derive(Default)]
pub(super) struct Merged {
    pub(super) systemd: RawSystemd,
    pub(super) journal: RawJournal,
    pub(super) router: RawRouter,
    pub(super) rollout: RawRollout,
    pub(super) verify: RawVerify,
    /// `[verify.slo]`, merged key by key; `None` when no file has the table.
    pub(super) slo: Option<RawSlo>,
    pub(super) fleet: RawFleet,
    /// `[fleet.storm]`, merged key by key.
    pub(super) storm: RawStorm,
    /// A `[fleet]` table was present (even an empty one).
    pub(super) fleet_seen: bool,
    /// `[maintenance]`, merged key by key.
    pub(super) maintenance: RawMaintenance,
    /// A `[maintenance]` table was present (even an empty one: the FleetLock endpoint on its
    /// default address).
    pub(super) maintenance_seen: bool,
    /// Each `[[worker]]` with its file and line.
    pub(super) workers: Vec<(PathBuf, usize, RawWorker)>,
    /// Where `ready_pattern` was set.
    pub(super) ready_origin: Option<(PathBuf, usize)>,
}

/// Which file (and line) last set each `table.key`, and the files themselves.
pub(super) struct Origins<'a> {
    texts: &'a [(PathBuf, String)],
    keys: Keys,
}

/// Which file and line set each `table.key`.
type Keys = BTreeMap<String, (PathBuf, Option<usize>)>;

/// Each key `src` sets overrides `dst`'s, and is noted in `keys` as set by `path` (at its line).
/// A table is named by its ident (`rollout`), a sub-table by its dotted name (`"verify.slo"`).
macro_rules! over {
    ($keys:expr, $sect:ident, $path:expr, $text:expr, $dst:expr, $src:expr, $($f:ident),*) => {
        over!($keys, stringify!($sect), $path, $text, $dst, $src, $($f),*)
    };
    ($keys:expr, $prefix:expr, $path:expr, $text:expr, $dst:expr, $src:expr, $($f:ident),*) => { $( if $src.$f.is_some() {
        $dst.$f = $src.$f;
        $keys.insert(format!("{}.{}", $prefix, stringify!($f)), ($path.to_path_buf(), line_of_key($text, stringify!($f))));
    } )* };
}

/// Merge `texts` (`(path, contents)` in merge order): each file's tables over the files before
/// it, key by key; the workers of every file, in order.
pub(super) fn merge(texts: &[(PathBuf, String)]) -> Result<(Merged, Origins<'_>), ConfigError> {
    let mut m = Merged::default();
    let mut keys = Keys::new();
    for (path, text) in texts {
        let raw = parse_file(path, text)?;
        let k = &mut keys;
        if let Some(s) = raw.systemd {
            over!(k, systemd, path, text, m.systemd, s, bus, address);
        }
        if let Some(s) = raw.journal {
            over!(k, journal, path, text, m.journal, s, directory, procfs);
        }
        if let Some(s) = raw.router {
            over!(k, router, path, text, m.router, s, url, metrics_url, api_key_file);
        }
        if let Some(s) = raw.rollout {
            if let Some(p) = &s.ready_pattern {
                m.ready_origin = Some((path.clone(), line_of(text, p.span().start)));
            }
            rollout(&mut m.rollout, s, k, path, text);
        }
        if let Some(s) = raw.verify {
            verify(&mut m, s, k, path, text);
        }
        if let Some(s) = raw.fleet {
            m.fleet_seen = true;
            fleet(&mut m, s, k, path, text);
        }
        if let Some(s) = raw.maintenance {
            m.maintenance_seen = true;
            over!(
                k,
                maintenance,
                path,
                text,
                m.maintenance,
                s,
                fleetlock_listen,
                fleetlock_id,
                fleetlock_users,
                windows,
                hold_while_alerting,
                balance_roles,
                balance_after
            );
        }
        for w in raw.worker.unwrap_or_default() {
            let line = line_of(text, w.unit.span().start);
            m.workers.push((path.clone(), line, w));
        }
    }
    Ok((m, Origins { texts, keys }))
}

/// `[rollout]`'s keys over the files before.
fn rollout(dst: &mut RawRollout, s: RawRollout, keys: &mut Keys, path: &Path, text: &str) {
    over!(
        keys,
        rollout,
        path,
        text,
        dst,
        s,
        order,
        ready_pattern,
        fatal_patterns,
        ready_timeout,
        health_timeout,
        router_timeout,
        metrics_timeout,
        job_timeout,
        min_healthy,
        on_failure,
        max_unavailable,
        drain,
        drain_timeout,
        allow_outage,
        single_pair,
        coherent,
        coherent_flags,
        model_roots,
        in_place,
        weights_fallback,
        max_failed_probes,
        on_stale_pair,
        abort_after_drain_timeout,
        unknown_load,
        kill_mode,
        prefetch_weights
    );
}

/// `[verify]` and `[verify.slo]`'s keys over the files before.
fn verify(m: &mut Merged, mut s: RawVerify, keys: &mut Keys, path: &Path, text: &str) {
    if let Some(slo) = s.slo.take() {
        let dst = m.slo.get_or_insert_with(RawSlo::default);
        over!(keys, "verify.slo", path, text, dst, slo, ttft_ratio, itl_ratio, e2e_ratio, error_rate, min_requests, max_wait, unjudged);
    }
    over!(
        keys,
        verify,
        path,
        text,
        m.verify,
        s,
        router,
        metrics,
        smoke_request,
        warmup_request,
        availability_probe,
        pair,
        pair_timeout,
        stranded_kv,
        stranded_kv_timeout
    );
}

/// `[fleet]` and `[fleet.storm]`'s keys over the files before.
fn fleet(m: &mut Merged, mut s: RawFleet, keys: &mut Keys, path: &Path, text: &str) {
    if let Some(st) = s.storm.take() {
        over!(keys, "fleet.storm", path, text, m.storm, st, restarts, within);
    }
    over!(
        keys,
        fleet,
        path,
        text,
        m.fleet,
        s,
        etcd,
        name,
        host,
        slot_timeout,
        max_unavailable,
        user,
        password_file,
        canary,
        keep_rollouts,
        bake,
        ca_file,
        cert_file,
        key_file
    );
}

impl Origins<'_> {
    /// An error in `path` at `line`.
    pub(super) fn err(&self, path: &Path, line: Option<usize>, msg: String) -> ConfigError {
        ConfigError { file: path.display().to_string(), line, msg }
    }

    /// The last file (where an error with no better place is reported).
    pub(super) fn last(&self) -> PathBuf {
        self.texts.last().map(|t| t.0.clone()).unwrap_or_default()
    }

    /// The contents of `path`.
    pub(super) fn text_of(&self, path: &Path) -> &str {
        self.texts.iter().find(|t| t.0 == path).map(|t| t.1.as_str()).unwrap_or_default()
    }

    /// The error of a merged `table.key`: the file and line that set it (else the last file).
    pub(super) fn at(&self, key: &str, msg: String) -> ConfigError {
        match self.keys.get(key) {
            Some((p, l)) => self.err(p, *l, format!("{key}: {msg}")),
            None => self.err(&self.last(), None, format!("{key}: {msg}")),
        }
    }

    /// A duration `table.key` within its bounds ([`DURATION_BOUNDS`]), or `default` when unset.
    pub(super) fn bounded(&self, key: &str, v: Option<Dur>, default: Duration) -> Result<Duration, ConfigError> {
        let Some(Dur(v)) = v else {
            return Ok(default);
        };
        let name = key.split_once('.').map_or(key, |(_, k)| k);
        let (_, min, max) = DURATION_BOUNDS.iter().find(|(k, _, _)| *k == name).copied().unwrap_or((name, Duration::ZERO, Duration::MAX));
        if v < min || v > max {
            return Err(self.at(
                key,
                format!(
                    "{} is outside {} to {} (docs/cli.md lists each duration's bounds)",
                    humantime::format_duration(v),
                    humantime::format_duration(min),
                    humantime::format_duration(max)
                ),
            ));
        }
        Ok(v)
    }
}
