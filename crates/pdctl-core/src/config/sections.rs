//! Each section validated by its own function, from the merged raw input to its settings: the
//! workers, `[router]`, `[verify]`, `[rollout]`, `[fleet]`, and the access paths (`[systemd]`,
//! `[journal]`). Each error names the file, the line and the key.

use std::path::PathBuf;

use super::merge::Origins;
use super::raw::{BusKind, OneOrMany, RawFleet, RawJournal, RawMaintenance, RawRollout, RawRouter, RawSlo, RawStorm, RawSystemd, RawVerify, RawWorker};
use super::settings::{
    d, parse_gpus, server_url, BusSetting, FleetSettings, FleetTls, KeySource, MaintenanceSettings, MetricsMode, OnFailure, OnStalePair, Replica, Role,
    Rollout, RouterSettings, SinglePair, Slo, StrandedKv, UnknownLoad, Verify, Worker,
};
use super::ConfigError;
use crate::url::{canonical_url, same_url};

/// `[[worker]]`: at least one; units and URLs unique, GPU sets disjoint, keys readable in form.
pub(super) fn workers(o: &Origins, raw: Vec<(PathBuf, usize, RawWorker)>) -> Result<Vec<Worker>, ConfigError> {
    if raw.is_empty() {
        return Err(o.err(&o.last(), None, "no [[worker]] is configured: add one per SGLang unit (unit, role, url)".into()));
    }
    let mut out: Vec<Worker> = Vec::new();
    let mut seen: Vec<(String, PathBuf, usize)> = Vec::new();
    for (path, line, w) in raw {
        let unit = w.unit.get_ref().clone();
        if let Some((_, p, l)) = seen.iter().find(|(u, _, _)| *u == unit) {
            return Err(o.err(&path, Some(line), format!("worker.unit: {unit} is configured twice (first at {}:{l})", p.display())));
        }
        out.push(worker(o, &path, line, w, &out)?);
        seen.push((unit, path, line));
    }
    Ok(out)
}

/// One `[[worker]]` (at `path:line`), checked against the workers before it.
fn worker(o: &Origins, path: &std::path::Path, line: usize, w: RawWorker, before: &[Worker]) -> Result<Worker, ConfigError> {
    let unit = w.unit.into_inner();
    if !unit.contains('.') {
        return Err(o.err(path, Some(line), format!("worker.unit: {unit:?} is not a unit name (expected e.g. \"sglang-prefill.service\")")));
    }
    let line_at = |offset: usize| super::raw::line_of(o.text_of(path), offset);
    let url_line = line_at(w.url.span().start);
    let url = w.url.into_inner();
    if let Err(why) = server_url(&url) {
        return Err(o.err(path, Some(url_line), format!("worker.url of {unit}: {:?} {why}", crate::url::redacted(&url))));
    }
    if let Some(other) = before.iter().find(|b| same_url(&b.url, &url)) {
        return Err(o.err(path, Some(url_line), format!("worker.url of {unit}: {url:?} is also the URL of {}; each worker is its own server", other.unit)));
    }
    if w.bootstrap_port.is_some() && w.role != Role::Prefill {
        return Err(o.err(path, Some(line), format!("worker.bootstrap_port of {unit}: only a prefill worker has a bootstrap port")));
    }
    let gpus = match w.gpus {
        None => None,
        Some(g) => {
            let gl = line_at(g.span().start);
            let set = parse_gpus(g.get_ref())
                .ok_or_else(|| o.err(path, Some(gl), format!("worker.gpus of {unit}: {:?} is not a GPU list like \"0-3\" or \"4,5,6,7\"", g.get_ref())))?;
            if let Some(b) = before.iter().find(|b| b.gpus.as_ref().is_some_and(|og| !og.is_disjoint(&set))) {
                return Err(o.err(
                    path,
                    Some(gl),
                    format!("worker.gpus of {unit}: GPUs overlap with those of {}: two servers cannot share GPUs; give each worker its own GPUs", b.unit),
                ));
            }
            Some(set)
        }
    };
    let key = |k: Option<toml::Spanned<String>>, name: &str| -> Result<Option<KeySource>, ConfigError> {
        match k {
            None => Ok(None),
            Some(k) => {
                let kl = line_at(k.span().start);
                Ok(Some(KeySource::parse(k.get_ref()).map_err(|why| o.err(path, Some(kl), format!("worker.{name} of {unit}: {why}")))?))
            }
        }
    };
    let api_key = key(w.api_key_file, "api_key_file")?;
    let admin_api_key = key(w.admin_api_key_file, "admin_api_key_file")?;
    Ok(Worker {
        unit: unit.clone(),
        role: w.role,
        url: url.trim_end_matches('/').to_string(),
        bootstrap_port: w.bootstrap_port,
        gpus,
        watch_files: w.watch_files,
        api_key,
        admin_api_key,
    })
}

/// `[router]`: one URL or one per replica, each a server's base URL, with as many metrics URLs.
pub(super) fn router(o: &Origins, rt: RawRouter) -> Result<Option<RouterSettings>, ConfigError> {
    let Some(urls) = rt.url.map(OneOrMany::list) else { return Ok(None) };
    if urls.is_empty() {
        return Err(o.at("router.url", "is an empty list; give the gateway's URL (or each replica's)".into()));
    }
    let metrics: Vec<String> = rt.metrics_url.map(OneOrMany::list).unwrap_or_default();
    if !metrics.is_empty() && metrics.len() != urls.len() {
        return Err(o.at(
            "router.metrics_url",
            format!("lists {} endpoint(s) for {} router url(s): give one per replica, in the same order", metrics.len(), urls.len()),
        ));
    }
    let mut replicas = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        server_url(url).map_err(|why| o.at("router.url", format!("{:?} {why}", crate::url::redacted(url))))?;
        if replicas.iter().any(|r: &Replica| same_url(&r.url, url)) {
            return Err(o.at("router.url", format!("{url:?} is listed twice")));
        }
        let m = metrics.get(i).cloned();
        if let Some(m) = &m {
            canonical_url(m).map_err(|why| o.at("router.metrics_url", format!("{:?} {why}", crate::url::redacted(m))))?;
        }
        replicas.push(Replica { url: url.trim_end_matches('/').to_string(), metrics_url: m });
    }
    let api_key = match &rt.api_key_file {
        Some(k) => Some(KeySource::parse(k).map_err(|why| o.at("router.api_key_file", why))?),
        None => None,
    };
    Ok(Some(RouterSettings { url: replicas[0].url.clone(), metrics_url: replicas[0].metrics_url.clone(), replicas, api_key }))
}

/// `[verify]`: the gates that need a router are off without one.
pub(super) fn verify(o: &Origins, vf: RawVerify, slo: Option<RawSlo>, router: Option<&RouterSettings>) -> Result<Verify, ConfigError> {
    let availability_probe = match &vf.availability_probe {
        Some(r) => crate::service::availability::parse_rate(r).map_err(|why| o.at("verify.availability_probe", why))?,
        None => Some(2.0),
    };
    if vf.router == Some(true) && router.is_none() {
        return Err(o.err(&o.last(), None, "verify.router = true needs [router] url".into()));
    }
    Ok(Verify {
        router: vf.router.unwrap_or(true) && router.is_some(),
        metrics: vf.metrics.unwrap_or(MetricsMode::Required),
        smoke_request: vf.smoke_request.unwrap_or(true),
        warmup_request: vf.warmup_request.unwrap_or(true),
        availability_probe: if router.is_some() { availability_probe } else { None },
        pair: vf.pair.unwrap_or(true),
        pair_timeout: o.bounded("verify.pair_timeout", vf.pair_timeout, d(30))?,
        stranded_kv: vf.stranded_kv.unwrap_or(StrandedKv::Warn),
        stranded_kv_timeout: match vf.stranded_kv_timeout {
            Some(v) => Some(o.bounded("verify.stranded_kv_timeout", Some(v), d(0))?),
            None => None,
        },
        slo: slo.map(|s| self::slo(o, s)).transpose()?,
    })
}

/// `[verify.slo]`: ratios of at least 1, an error rate between 0 and 1, at least one request.
fn slo(o: &Origins, s: RawSlo) -> Result<Slo, ConfigError> {
    let ratio = |key: &str, v: Option<f64>| -> Result<f64, ConfigError> {
        match v {
            None => Ok(1.5),
            Some(r) if r.is_finite() && r >= 1.0 => Ok(r),
            Some(r) => Err(o.at(key, format!("{r} is not a ratio of at least 1 (1.5: the restarted worker's p50 may be 1.5 times its baseline's)"))),
        }
    };
    let error_rate = match s.error_rate {
        None => 0.01,
        Some(r) if (0.0..=1.0).contains(&r) => r,
        Some(r) => return Err(o.at("verify.slo.error_rate", format!("{r} is not a fraction between 0 and 1 (0.01: 1 % of requests may fail)"))),
    };
    let min_requests = match s.min_requests {
        None => 20,
        Some(0) => return Err(o.at("verify.slo.min_requests", "must be at least 1 (a figure over no request judges nothing)".into())),
        Some(n) => n,
    };
    Ok(Slo {
        ttft_ratio: ratio("verify.slo.ttft_ratio", s.ttft_ratio)?,
        itl_ratio: ratio("verify.slo.itl_ratio", s.itl_ratio)?,
        e2e_ratio: ratio("verify.slo.e2e_ratio", s.e2e_ratio)?,
        error_rate,
        min_requests,
        max_wait: o.bounded("verify.slo.max_wait", s.max_wait, d(120))?,
        unjudged: s.unjudged.unwrap_or(super::settings::Unjudged::Probe),
    })
}

/// `[rollout]`: every worker's role in the order, a usable ready pattern, durations in bounds.
pub(super) fn rollout(
    o: &Origins,
    ro: RawRollout,
    ready_origin: Option<(PathBuf, usize)>,
    workers: &[Worker],
    verify: &Verify,
) -> Result<Rollout, ConfigError> {
    let order = ro.order.unwrap_or_else(|| vec![Role::Prefill, Role::Decode, Role::Regular]);
    if let Some(w) = workers.iter().find(|w| !order.contains(&w.role)) {
        return Err(o.err(
            &o.last(),
            None,
            format!("rollout.order: role {:?} of {} is not in the order {:?}", w.role.as_str(), w.unit, order.iter().map(|r| r.as_str()).collect::<Vec<_>>()),
        ));
    }
    let max_unavailable = match ro.max_unavailable {
        Some(m) if *m.get_ref() == 0 => return Err(o.at("rollout.max_unavailable", "must be at least 1 (a restart takes a unit down)".into())),
        Some(m) => m.into_inner(),
        None => 1,
    };
    let ready_pattern = match (ro.ready_pattern, ready_origin) {
        (Some(p), Some((path, line))) => {
            let p = p.into_inner();
            if let Some(why) = crate::sglang::unusable_ready_pattern(&p) {
                return Err(o.err(
                    &path,
                    Some(line),
                    format!("rollout.ready_pattern: {p:?} cannot be the ready pattern: {why}; use a substring of SGLang's ready line (the default)"),
                ));
            }
            p
        }
        _ => crate::sglang::READY_LINE.to_string(),
    };
    let ready_timeout = o.bounded("rollout.ready_timeout", ro.ready_timeout, d(15 * 60))?;
    Ok(Rollout {
        order,
        ready_pattern,
        fatal_patterns: crate::sglang::fatal_patterns(&ro.fatal_patterns.unwrap_or_default()),
        ready_timeout,
        health_timeout: o.bounded("rollout.health_timeout", ro.health_timeout, d(5 * 60))?,
        router_timeout: o.bounded("rollout.router_timeout", ro.router_timeout, d(3 * 60))?,
        metrics_timeout: o.bounded("rollout.metrics_timeout", ro.metrics_timeout, d(40))?,
        job_timeout: o.bounded("rollout.job_timeout", ro.job_timeout, ready_timeout)?,
        min_healthy: o.bounded("rollout.min_healthy", ro.min_healthy, d(10))?,
        on_failure: ro.on_failure.unwrap_or(OnFailure::Halt),
        max_unavailable,
        drain: ro.drain.unwrap_or(true) && verify.router,
        drain_timeout: o.bounded("rollout.drain_timeout", ro.drain_timeout, d(120))?,
        allow_outage: ro.allow_outage.unwrap_or(false),
        prefetch_weights: ro.prefetch_weights.unwrap_or(true),
        single_pair: ro.single_pair.unwrap_or(SinglePair::Sequential),
        coherent: ro.coherent.unwrap_or(super::settings::Coherent::Auto),
        coherent_flags: coherent_flags(o, ro.coherent_flags)?,
        model_roots: model_roots(o, ro.model_roots)?,
        in_place: ro.in_place.unwrap_or(super::settings::InPlace::Auto),
        weights_fallback: ro.weights_fallback.unwrap_or(super::settings::WeightsFallback::Revert),
        max_failed_probes: ro.max_failed_probes,
        on_stale_pair: ro.on_stale_pair.unwrap_or(OnStalePair::RestartDecode),
        abort_after_drain_timeout: ro.abort_after_drain_timeout.unwrap_or(false),
        unknown_load: ro.unknown_load.unwrap_or(UnknownLoad::Halt),
        kill_mode: ro.kill_mode.unwrap_or(super::settings::KillModePolicy::Refuse),
    })
}

/// `[rollout] coherent_flags`: each an SGLang flag (`--chat-template`).
fn coherent_flags(o: &Origins, flags: Option<Vec<String>>) -> Result<Vec<String>, ConfigError> {
    let flags = flags.unwrap_or_default();
    if let Some(bad) = flags.iter().find(|f| !f.starts_with("--") || f.len() < 3 || f.contains(['=', ' '])) {
        return Err(o.at("rollout.coherent_flags", format!("{bad:?} is not a flag: write it as SGLang's --flag-name, without a value")));
    }
    Ok(flags)
}

/// `[rollout] model_roots`: absolute directories, without `..`.
fn model_roots(o: &Origins, roots: Option<Vec<String>>) -> Result<Vec<std::path::PathBuf>, ConfigError> {
    let roots = roots.unwrap_or_default();
    if let Some(bad) = roots.iter().find(|r| !r.starts_with('/') || r.split('/').any(|c| c == "..")) {
        return Err(o.at("rollout.model_roots", format!("{bad:?} is not an absolute directory (without ..): list where checkpoints live, e.g. [\"/models\"]")));
    }
    Ok(roots.into_iter().map(std::path::PathBuf::from).collect())
}

/// `[fleet]` (`None` without the table): etcd endpoints, a key-safe name, this host's name
/// (`hostname` when not set: the caller reads it), per-role limits, etcd credentials and TLS.
pub(super) fn fleet(o: &Origins, fl: RawFleet, storm: RawStorm, seen: bool, hostname: Option<&str>) -> Result<Option<FleetSettings>, ConfigError> {
    if !seen {
        return Ok(None);
    }
    let etcd = fl.etcd.unwrap_or_default();
    if etcd.is_empty() {
        return Err(o.at("fleet.etcd", "[fleet] needs etcd = [\"http://HOST:2379\", …] (the endpoints of the fleet's etcd cluster)".into()));
    }
    for e in &etcd {
        server_url(e).map_err(|why| o.at("fleet.etcd", format!("{:?} {why}", crate::url::redacted(e))))?;
    }
    let name = fl.name.unwrap_or_default();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(o.at("fleet.name", format!("{name:?} must be a non-empty name of letters, digits, '-', '_' or '.' (it is the key prefix /pdctl/NAME/)")));
    }
    let host = fl.host.unwrap_or_else(|| hostname.unwrap_or_default().to_string());
    if host.is_empty() || host.contains('/') {
        return Err(o.at("fleet.host", format!("{host:?} must be a non-empty host name without '/'")));
    }
    let max_unavailable: std::collections::BTreeMap<String, u32> =
        fl.max_unavailable.unwrap_or_default().into_iter().map(|(r, n)| (r.as_str().to_string(), n)).collect();
    if let Some((r, _)) = max_unavailable.iter().find(|(_, n)| **n == 0) {
        return Err(o.at("fleet.max_unavailable", format!("{r} = 0 would never let a {r} worker restart; use at least 1")));
    }
    let user = match (fl.user, fl.password_file) {
        (Some(u), Some(p)) => Some((u, p)),
        (None, None) => None,
        _ => return Err(o.at("fleet.user", "user and password_file go together (etcd authentication)".into())),
    };
    let identity = match (fl.cert_file, fl.key_file) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(o.at("fleet.cert_file", "cert_file and key_file go together (etcd client certificate)".into())),
    };
    let https = etcd.iter().any(|e| e.starts_with("https://"));
    let tls = (https || fl.ca_file.is_some() || identity.is_some()).then_some(FleetTls { ca_file: fl.ca_file, identity });
    if tls.as_ref().is_some_and(|t| t.ca_file.is_none()) {
        return Err(o.at("fleet.etcd", "https:// endpoints (or a client certificate) need ca_file: the CA that signed etcd's certificates".into()));
    }
    let slot_timeout = o.bounded("fleet.slot_timeout", fl.slot_timeout, d(30 * 60))?;
    let default = crate::service::storm::Storm::default();
    let storm = crate::service::storm::Storm {
        restarts: storm.restarts.unwrap_or(default.restarts),
        within: o.bounded("fleet.storm.within", storm.within, default.within)?,
    };
    let bake = fl.bake.map(|b| o.bounded("fleet.bake", Some(b), std::time::Duration::ZERO)).transpose()?;
    let keep_rollouts = fl.keep_rollouts.unwrap_or(200);
    if keep_rollouts == 0 {
        return Err(o.at("fleet.keep_rollouts", "must be at least 1 (the fleet rollout running is kept whatever this says)".into()));
    }
    Ok(Some(FleetSettings { etcd, name, host, slot_timeout, max_unavailable, user, canary: fl.canary, keep_rollouts, bake, storm, tls }))
}

/// `[maintenance]` (`None` without the table): the FleetLock endpoint's address and id, the
/// windows, the alert hold.
pub(super) fn maintenance(
    o: &Origins,
    m: RawMaintenance,
    seen: bool,
    fleet: Option<&FleetSettings>,
    hostname: Option<&str>,
) -> Result<Option<MaintenanceSettings>, ConfigError> {
    if !seen {
        return Ok(None);
    }
    let listen = m.fleetlock_listen.unwrap_or_else(|| super::settings::FLEETLOCK_LISTEN.to_string());
    let fleetlock_listen = if listen.is_empty() {
        None
    } else {
        let addr = listen.parse::<std::net::SocketAddr>().map_err(|e| {
            o.at(
                "maintenance.fleetlock_listen",
                format!("{listen:?} is not an address and port ({e}): write it like \"127.0.0.1:9753\", or \"\" for no endpoint"),
            )
        })?;
        // The protocol carries no credential: only on loopback does pdctld know who asks (the
        // kernel's socket table names the caller's account).
        if !addr.ip().is_loopback() {
            return Err(o.at(
                "maintenance.fleetlock_listen",
                format!("{listen} is not a loopback address: FleetLock requests carry no credential and pdctld can tell who sends one only on loopback (the update agent runs on the host); listen on 127.0.0.1 or [::1]"),
            ));
        }
        Some(addr)
    };
    let fleetlock_id = m.fleetlock_id.or_else(|| fleet.map(|f| f.host.clone())).unwrap_or_else(|| hostname.unwrap_or_default().to_string());
    if fleetlock_id.is_empty() {
        return Err(o.at(
            "maintenance.fleetlock_id",
            "the FleetLock id this host answers to is empty: set fleetlock_id (Zincati sends its node's app-specific id)".into(),
        ));
    }
    let mut windows = Vec::new();
    for w in m.windows.unwrap_or_default() {
        windows.push(crate::service::reboot_window::RebootWindow::parse(&w).map_err(|why| o.at("maintenance.windows", why))?);
    }
    let hold_while_alerting = match m.hold_while_alerting {
        Some(u) => {
            crate::url::canonical_url(&u).map_err(|why| o.at("maintenance.hold_while_alerting", format!("{:?} {why}", crate::url::redacted(&u))))?;
            if !u.contains("/api/v1/query") {
                return Err(o.at(
                    "maintenance.hold_while_alerting",
                    "must be a Prometheus instant query, like \"http://prometheus:9090/api/v1/query?query=ALERTS{alertstate=%22firing%22}\"".into(),
                ));
            }
            Some(u)
        }
        None => None,
    };
    let fleetlock_users = m.fleetlock_users.unwrap_or_default();
    if let Some(bad) = fleetlock_users.iter().find(|u| u.is_empty() || u.len() > 32 || !u.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))) {
        return Err(o.at("maintenance.fleetlock_users", format!("{bad:?} is not an account name: list local accounts, like [\"zincati\"]")));
    }
    let group = fleet.map(|f| f.name.clone()).unwrap_or_else(|| "default".into());
    let balance_roles = m.balance_roles.unwrap_or(false);
    let balance_after = o.bounded("maintenance.balance_after", m.balance_after, d(15 * 60))?;
    Ok(Some(MaintenanceSettings { fleetlock_listen, fleetlock_id, fleetlock_users, group, windows, hold_while_alerting, balance_roles, balance_after }))
}

/// `[systemd]` and `[journal]`: how this process reaches the manager, the journal and procfs.
pub(super) fn access(sd: RawSystemd, jn: RawJournal) -> (BusSetting, Option<PathBuf>, PathBuf) {
    let bus = match (sd.address, sd.bus) {
        (Some(a), _) => BusSetting::Address(a),
        (None, Some(BusKind::User)) => BusSetting::User,
        (None, _) => BusSetting::System,
    };
    (bus, jn.directory, jn.procfs.unwrap_or_else(|| PathBuf::from("/proc")))
}
