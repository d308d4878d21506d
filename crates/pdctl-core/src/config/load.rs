//! Loading a config: files read in order and composed through the phases (raw → merge →
//! sections → settings); `load_texts` does no I/O, `load` reads the files and the host name.

use std::path::{Path, PathBuf};

use super::{merge, sections, Settings};

/// Default location of the main file.
pub const DEFAULT_PATH: &str = "/etc/pdctl/pdctl.toml";

/// A configuration error: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {msg}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong, naming the key.
    pub msg: String,
}

/// The files to read: the main file, then `config.d/*.toml` next to it, in name order.
pub fn files(main: &Path) -> Vec<PathBuf> {
    let mut out = vec![main.to_path_buf()];
    if let Some(dir) = main.parent().map(|p| p.join("config.d")) {
        if let Ok(rd) = std::fs::read_dir(&dir) {
            let mut frags: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "toml")).collect();
            frags.sort();
            out.extend(frags);
        }
    }
    out
}

/// Which main file: `--config`, else `$PDCTL_CONFIG`, else `/etc/pdctl/pdctl.toml`.
pub fn main_path(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf).or_else(|| std::env::var_os("PDCTL_CONFIG").map(PathBuf::from)).unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

/// The sections that say how this process reaches the host (the bus, the journal), not what a
/// rollout does: a CLI and pdctld may reach the same manager by different addresses.
const ACCESS_SECTIONS: [&str; 2] = ["systemd", "journal"];

/// The identity of the config rooted at `main` (its path and [`digest`]), if every file of it
/// can be read: what a CLI and pdctld compare.
pub fn identity(main: &Path) -> Option<crate::api::ConfigIdentity> {
    digest(main).map(|sha256| crate::api::ConfigIdentity { path: main.display().to_string(), sha256 })
}

/// SHA-256 (hex) of what the config rooted at `main` says, every file in merge order, without
/// [`ACCESS_SECTIONS`] (comments and layout do not count: each file's parsed table is hashed;
/// a file that does not parse is hashed as bytes); `None` when a file cannot be read. Which
/// config a CLI and pdctld run with is compared by this.
pub fn digest(main: &Path) -> Option<String> {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    for f in files(main) {
        let bytes = std::fs::read(&f).ok()?;
        let canonical = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| toml::from_str::<toml::Table>(t).ok())
            .and_then(|mut t| {
                for k in ACCESS_SECTIONS {
                    t.remove(k);
                }
                serde_json::to_vec(&t).ok()
            })
            .unwrap_or(bytes);
        h.update((canonical.len() as u64).to_le_bytes());
        h.update(&canonical);
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Load and validate the configuration rooted at `main` (reads the files and, for `[fleet]
/// host`'s default, the machine's host name).
pub fn load(main: &Path) -> Result<Settings, ConfigError> {
    let mut texts = Vec::new();
    for f in files(main) {
        let text = std::fs::read_to_string(&f).map_err(|e| ConfigError {
            file: f.display().to_string(),
            line: None,
            msg: format!("cannot read the config file: {e} (use --config PATH or PDCTL_CONFIG to point at another)"),
        })?;
        texts.push((f, text));
    }
    let hostname = host_name();
    resolve(&texts, hostname.as_deref())
}

/// The machine's host name (`gethostname(2)`: no file under `/proc/sys` to read).
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer and its length are valid; gethostname writes at most that many bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end]).ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
}

/// Validate already-read files: `(path, contents)` in merge order, without the machine's host
/// name (a `[fleet]` without `host` is then an error).
pub fn load_texts(texts: &[(PathBuf, String)]) -> Result<Settings, ConfigError> {
    resolve(texts, None)
}

/// The phases: merge the files, then validate each section by its owner. No I/O.
fn resolve(texts: &[(PathBuf, String)], hostname: Option<&str>) -> Result<Settings, ConfigError> {
    let (m, o) = merge::merge(texts)?;
    let workers = sections::workers(&o, m.workers)?;
    let router = sections::router(&o, m.router)?;
    let verify = sections::verify(&o, m.verify, m.slo, router.as_ref())?;
    let rollout = sections::rollout(&o, m.rollout, m.ready_origin, &workers, &verify)?;
    let fleet = sections::fleet(&o, m.fleet, m.storm, m.fleet_seen, hostname)?;
    // The bake judges with the service gate's tolerances.
    if fleet.as_ref().is_some_and(|f| f.bake.is_some()) && verify.slo.is_none() {
        return Err(o.at(
            "fleet.bake",
            "the bake judges the changed workers with [verify.slo]'s tolerances: add [verify.slo] (its defaults will do) or remove bake".into(),
        ));
    }
    let maintenance = sections::maintenance(&o, m.maintenance, m.maintenance_seen, fleet.as_ref(), hostname)?;
    let (bus, journal_directory, procfs) = sections::access(m.systemd, m.journal);
    Ok(Settings { bus, journal_directory, procfs, router, workers, rollout, verify, fleet, maintenance, sources: texts.iter().map(|t| t.0.clone()).collect() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::*;
    use std::time::Duration;

    const BASE: &str = r#"
[systemd]
bus = "system"
[router]
url = "http://127.0.0.1:30001"
metrics_url = "http://127.0.0.1:29001/metrics"
[[worker]]
unit = "sglang-dsv4-prefill.service"
role = "prefill"
url = "http://127.0.0.1:30003"
bootstrap_port = 8998
gpus = "0-3"
[[worker]]
unit = "sglang-dsv4-decode.service"
role = "decode"
url = "http://127.0.0.1:30002"
gpus = "4-7"
[rollout]
order = ["prefill", "decode"]
ready_pattern = "The server is fired up and ready to roll!"
ready_timeout = "15m"
min_healthy = "10s"
on_failure = "halt"
max_unavailable = 1
drain = true
drain_timeout = "2m"
[verify]
router = true
metrics = "required"
smoke_request = true
"#;

    fn one(text: &str) -> Result<Settings, ConfigError> {
        load_texts(&[(PathBuf::from("/etc/pdctl/pdctl.toml"), text.to_string())])
    }

    #[test]
    fn the_design_contract_parses() {
        let s = one(BASE).unwrap();
        assert_eq!(s.workers.len(), 2);
        assert_eq!(s.workers[0].gpus, Some((0..=3).collect()));
        assert_eq!(s.rollout.ready_timeout, Duration::from_secs(900));
        assert_eq!(s.bus, BusSetting::System);
        assert!(s.verify.router && s.rollout.drain);
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = BASE.replace("min_healthy = \"10s\"", "min_healthy = \"10s\"\nmin_heathy = \"5s\"");
        let e = one(&text).unwrap_err();
        assert_eq!(e.file, "/etc/pdctl/pdctl.toml");
        assert_eq!(e.line, Some(text.lines().position(|l| l.starts_with("min_heathy")).unwrap() + 1));
        assert!(e.msg.contains("min_heathy"), "{e}");
        assert!(e.to_string().starts_with("/etc/pdctl/pdctl.toml:"), "{e}");
    }

    #[test]
    fn bad_duration_and_enum_name_the_line() {
        let e = one(&BASE.replace("\"15m\"", "\"fifteen minutes\"")).unwrap_err();
        assert!(e.msg.contains("invalid duration"), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("ready_timeout")).unwrap() + 1));
        let e = one(&BASE.replace("on_failure = \"halt\"", "on_failure = \"pray\"")).unwrap_err();
        assert!(e.msg.contains("pray"), "{e}");
    }

    #[test]
    fn fragments_override_and_add_workers() {
        let frag = "[rollout]\nmin_healthy = \"1s\"\n[[worker]]\nunit = \"extra.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:1\"\n";
        let s = load_texts(&[(PathBuf::from("a.toml"), BASE.into()), (PathBuf::from("config.d/10.toml"), frag.into())]).unwrap();
        assert_eq!(s.rollout.min_healthy, Duration::from_secs(1));
        assert_eq!(s.workers.len(), 3);
        let dup = "[[worker]]\nunit = \"sglang-dsv4-decode.service\"\nrole = \"decode\"\nurl = \"http://127.0.0.1:1\"\n";
        let e = load_texts(&[(PathBuf::from("a.toml"), BASE.into()), (PathBuf::from("config.d/20.toml"), dup.into())]).unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("config.d/20.toml", Some(2)));
        assert!(e.msg.contains("configured twice"), "{e}");
    }

    #[test]
    fn semantic_errors() {
        assert!(one(&BASE.replace("gpus = \"4-7\"", "gpus = \"four\"")).unwrap_err().msg.contains("worker.gpus"));
        assert!(one(&BASE.replace("max_unavailable = 1", "max_unavailable = 0")).unwrap_err().msg.contains("max_unavailable"));
        assert!(one(&BASE.replace("order = [\"prefill\", \"decode\"]", "order = [\"prefill\"]")).unwrap_err().msg.contains("not in the order"));
        assert!(one("").unwrap_err().msg.contains("no [[worker]]"));
    }

    #[test]
    fn the_shipped_example_config_is_valid() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/pdctl.toml");
        let s = load(&p).unwrap();
        assert_eq!(s.workers.iter().map(|w| w.role).collect::<Vec<_>>(), vec![Role::Prefill, Role::Decode]);
        assert_eq!(s.router.unwrap().metrics_url.as_deref(), Some("http://127.0.0.1:29001/metrics"));
        let slo = s.verify.slo.expect("the example shows the service gate on");
        assert_eq!((slo.ttft_ratio, slo.error_rate, slo.min_requests, slo.max_wait), (1.5, 0.01, 20, Duration::from_secs(120)));
    }

    #[test]
    fn coherence_is_auto_by_default_and_extra_flags_must_be_flags() {
        let s = one(BASE).unwrap();
        assert_eq!((s.rollout.coherent, s.rollout.coherent_flags.len()), (crate::config::Coherent::Auto, 0));
        let two = |frag: &str| {
            load_texts(&[(PathBuf::from("/etc/pdctl/pdctl.toml"), BASE.to_string()), (PathBuf::from("/etc/pdctl/config.d/40.toml"), frag.to_string())])
        };
        let s = two("[rollout]\ncoherent = \"never\"\ncoherent_flags = [\"--chat-template\"]\n").unwrap();
        assert_eq!((s.rollout.coherent, s.rollout.coherent_flags), (crate::config::Coherent::Never, vec!["--chat-template".to_string()]));
        let s = two("[rollout]\nmodel_roots = [\"/models\"]\n").unwrap();
        assert!(s.rollout.model_path_allowed("/models/dsv4-ft").is_ok());
        let e = s.rollout.model_path_allowed("/models/../etc/shadow").unwrap_err();
        assert!(e.contains("not under [rollout] model_roots (/models)"), "{e}");
        assert!(s.rollout.model_path_allowed("/modelsX/a").is_err(), "a sibling directory is not under it");
        assert!(two("[rollout]\nmodel_roots = [\"models\"]\n").unwrap_err().to_string().contains("rollout.model_roots"));
        let e = two("[rollout]\ncoherent_flags = [\"chat-template\"]\n").unwrap_err();
        assert!(e.to_string().contains("rollout.coherent_flags") && e.msg.contains("--flag-name"), "{e}");
    }

    #[test]
    fn weights_load_in_place_by_default_and_a_failed_load_reverts_unless_told_to_restart() {
        use crate::config::{InPlace, WeightsFallback};
        let s = one(BASE).unwrap();
        assert_eq!((s.rollout.in_place, s.rollout.weights_fallback), (InPlace::Auto, WeightsFallback::Revert));
        let two = |frag: &str| {
            load_texts(&[(PathBuf::from("/etc/pdctl/pdctl.toml"), BASE.to_string()), (PathBuf::from("/etc/pdctl/config.d/40.toml"), frag.to_string())])
        };
        let s = two("[rollout]\nin_place = \"never\"\nweights_fallback = \"restart\"\n").unwrap();
        assert_eq!((s.rollout.in_place, s.rollout.weights_fallback), (InPlace::Never, WeightsFallback::Restart));
        let e = two("[rollout]\nweights_fallback = \"reboot\"\n").unwrap_err();
        assert!(e.to_string().contains("40.toml:2") && e.to_string().contains("expected `revert` or `restart`"), "{e}");
    }

    #[test]
    fn the_bake_needs_the_service_gates_tolerances_and_has_bounds() {
        let fleet = "[fleet]\netcd = [\"http://127.0.0.1:2379\"]\nname = \"t\"\nhost = \"a\"\n";
        let s = one(&format!("{BASE}\n{fleet}")).unwrap();
        assert_eq!(s.fleet.unwrap().bake, None, "no bake unless asked for");
        let e = one(&format!("{BASE}\n{fleet}bake = \"10m\"\n")).unwrap_err();
        assert!(e.msg.contains("[verify.slo]") && e.to_string().contains("fleet.bake"), "{e}");
        let s = one(&format!("{BASE}\n[verify.slo]\n{fleet}bake = \"10m\"\n")).unwrap();
        assert_eq!(s.fleet.unwrap().bake, Some(Duration::from_secs(600)));
        let e = one(&format!("{BASE}\n[verify.slo]\n{fleet}bake = \"1s\"\n")).unwrap_err();
        assert!(e.msg.contains("outside 10s to 1day"), "{e}");
    }

    #[test]
    fn the_storm_rule_has_defaults_and_bounds() {
        let fleet = "[fleet]\netcd = [\"http://127.0.0.1:2379\"]\nname = \"t\"\nhost = \"a\"\n";
        let s = one(&format!("{BASE}\n{fleet}")).unwrap();
        assert_eq!(s.fleet.unwrap().storm, crate::service::storm::Storm::default());
        let s = one(&format!("{BASE}\n{fleet}[fleet.storm]\nrestarts = 4\nwithin = \"1m\"\n")).unwrap();
        assert_eq!(s.fleet.unwrap().storm, crate::service::storm::Storm { restarts: 4, within: Duration::from_secs(60) });
        let text = format!("{BASE}\n{fleet}[fleet.storm]\nwithin = \"1s\"\n");
        let e = one(&text).unwrap_err();
        assert!(e.msg.contains("fleet.storm.within") && e.msg.contains("outside 10s to 1day"), "{e}");
        assert_eq!(e.line, Some(text.lines().position(|l| l.starts_with("within")).unwrap() + 1));
    }

    #[test]
    fn maintenance_is_off_without_its_table_and_each_key_is_checked() {
        assert_eq!(one(BASE).unwrap().maintenance, None);
        let fleet = "[fleet]\netcd = [\"http://127.0.0.1:2379\"]\nname = \"prod\"\nhost = \"gpu-node-a\"\n";
        let m = one(&format!("{BASE}\n{fleet}[maintenance]\n")).unwrap().maintenance.unwrap();
        assert_eq!(m.fleetlock_listen, Some("127.0.0.1:9753".parse().unwrap()), "loopback by default");
        assert_eq!((m.fleetlock_id.as_str(), m.group.as_str()), ("gpu-node-a", "prod"), "the host's name and the fleet's");
        let m = one(&format!("{BASE}\n[maintenance]\nfleetlock_listen = \"\"\nfleetlock_id = \"z1\"\nwindows = [\"Sat 02:00-06:00 UTC\"]\n"))
            .unwrap()
            .maintenance
            .unwrap();
        assert_eq!((m.fleetlock_listen, m.group.as_str(), m.windows.len()), (None, "default", 1));
        assert!(m.fleetlock_users.is_empty(), "nobody but root by default");
        assert_eq!((m.balance_roles, m.balance_after), (false, std::time::Duration::from_secs(15 * 60)), "no ratio changed by itself by default");
        let m = one(&format!("{BASE}\n[maintenance]\nfleetlock_id = \"z1\"\nbalance_roles = true\nbalance_after = \"1h\"\n")).unwrap().maintenance.unwrap();
        assert_eq!((m.balance_roles, m.balance_after), (true, std::time::Duration::from_secs(3600)));
        let m = one(&format!("{BASE}\n[maintenance]\nfleetlock_id = \"z1\"\nfleetlock_listen = \"[::1]:9753\"\nfleetlock_users = [\"zincati\"]\n"))
            .unwrap()
            .maintenance
            .unwrap();
        assert_eq!(m.fleetlock_users, ["zincati"]);
        for (bad, key, says) in [
            ("fleetlock_listen = \"localhost\"", "maintenance.fleetlock_listen", "not an address and port"),
            // The protocol carries no credential: who asks is known on loopback only.
            ("fleetlock_listen = \"0.0.0.0:9753\"", "maintenance.fleetlock_listen", "not a loopback address"),
            ("fleetlock_listen = \"10.0.0.5:9753\"", "maintenance.fleetlock_listen", "not a loopback address"),
            ("fleetlock_users = [\"zincati\", \"\"]", "maintenance.fleetlock_users", "not an account name"),
            ("windows = [\"Sat 02:00-06:00 CET\"]", "maintenance.windows", "only UTC"),
            ("hold_while_alerting = \"http://prom:9090/metrics\"", "maintenance.hold_while_alerting", "Prometheus instant query"),
            ("balance_after = \"0s\"", "maintenance.balance_after", "outside 1s"),
            ("balance_roles = \"yes\"", "balance_roles", "invalid type"),
            ("reboot = true", "reboot", "unknown field"),
        ] {
            let text = format!("{BASE}\n[maintenance]\nfleetlock_id = \"a\"\n{bad}\n");
            let e = one(&text).unwrap_err();
            assert!(e.msg.contains(key) && e.msg.contains(says), "{bad}: {e}");
            assert_eq!(e.line, Some(text.lines().position(|l| l == bad).unwrap() + 1), "{bad}: {e}");
        }
    }

    #[test]
    fn the_service_gate_is_off_without_its_table_and_checked_key_by_key() {
        assert_eq!(one(BASE).unwrap().verify.slo, None);
        let with = |slo: &str| format!("{BASE}\n[verify.slo]\n{slo}");
        let s = one(&with("itl_ratio = 2.0\n")).unwrap().verify.slo.unwrap();
        assert_eq!((s.ttft_ratio, s.itl_ratio, s.e2e_ratio, s.min_requests), (1.5, 2.0, 1.5, 20), "unset keys take their defaults");
        for (bad, key, says) in [
            ("ttft_ratio = 0.5", "verify.slo.ttft_ratio", "not a ratio of at least 1"),
            ("error_rate = 2.0", "verify.slo.error_rate", "between 0 and 1"),
            ("min_requests = 0", "verify.slo.min_requests", "at least 1"),
            ("max_wait = \"2h\"", "verify.slo.max_wait", "outside 0s to 1h"),
            ("p99_ratio = 2.0", "p99_ratio", "unknown field"),
        ] {
            let text = with(&format!("{bad}\n"));
            let e = one(&text).unwrap_err();
            assert_eq!(e.line, Some(text.lines().position(|l| l.starts_with(bad.split(' ').next().unwrap())).unwrap() + 1), "{e}");
            assert!(e.msg.contains(key) && e.msg.contains(says), "{e}");
        }
        // A fragment overrides one key of the table and keeps the others.
        let frag = "[verify.slo]\nerror_rate = 0.05\n";
        let s = load_texts(&[(PathBuf::from("a.toml"), with("min_requests = 5\n")), (PathBuf::from("config.d/10.toml"), frag.into())]).unwrap();
        let slo = s.verify.slo.unwrap();
        assert_eq!((slo.min_requests, slo.error_rate), (5, 0.05));
    }

    #[test]
    fn ready_pattern_cannot_match_early_lines_and_fatal_patterns_only_add() {
        let e = one(&BASE.replace("ready_pattern = \"The server is fired up and ready to roll!\"", "ready_pattern = \"\"")).unwrap_err();
        assert!(e.msg.contains("rollout.ready_pattern") && e.msg.contains("empty"), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("ready_pattern")).unwrap() + 1));
        let e = one(&BASE.replace("ready_pattern = \"The server is fired up and ready to roll!\"", "ready_pattern = \"server\"")).unwrap_err();
        assert!(e.msg.contains("server_args") || e.msg.contains("Started server process"), "{e}");
        let s = one(&BASE.replace("drain_timeout = \"2m\"", "drain_timeout = \"2m\"\nfatal_patterns = [\"CUDA out of memory\"]")).unwrap();
        assert!(s.rollout.fatal_patterns.iter().any(|p| p == "CUDA out of memory"));
        assert!(s.rollout.fatal_patterns.iter().any(|p| p == "Initialization failed"), "SGLang's patterns stay");
        let s = one(&BASE.replace("drain_timeout = \"2m\"", "drain_timeout = \"2m\"\nfatal_patterns = []")).unwrap();
        assert_eq!(s.rollout.fatal_patterns.len(), crate::sglang::FATAL_PATTERNS.len(), "an empty list cannot remove them");
    }

    #[test]
    fn durations_have_bounds_and_errors_name_file_line_key() {
        for (key, bad) in [("min_healthy", "0s"), ("drain_timeout", "0s"), ("ready_timeout", "48h"), ("job_timeout", "500ms")] {
            let base: Vec<&str> = BASE.lines().filter(|l| !l.starts_with(&format!("{key} ="))).collect();
            let text = base.join("\n").replace("[verify]", &format!("{key} = \"{bad}\"\n[verify]"));
            let e = one(&text).unwrap_err();
            assert!(e.msg.starts_with(&format!("rollout.{key}: ")) && e.msg.contains("outside"), "{key}: {e}");
            assert_eq!(e.line, Some(text.lines().position(|l| l.starts_with(&format!("{key} = "))).unwrap() + 1), "{key}: {e}");
        }
        // A fragment that sets it is the one named.
        let frag = "[rollout]\nmin_healthy = \"0s\"\n";
        let e = load_texts(&[(PathBuf::from("a.toml"), BASE.into()), (PathBuf::from("config.d/10.toml"), frag.into())]).unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("config.d/10.toml", Some(2)), "{e}");
    }

    #[test]
    fn urls_are_checked_and_compared_canonically() {
        for bad in ["http://", "ftp://127.0.0.1:1", "127.0.0.1:30003", "http://127.0.0.1:99999", "http://127.0.0.1:30003/generate", "http://u:p@127.0.0.1:1"] {
            let e = one(&BASE.replace("url = \"http://127.0.0.1:30003\"", &format!("url = \"{bad}\""))).unwrap_err();
            assert!(e.msg.starts_with("worker.url of sglang-dsv4-prefill.service"), "{bad}: {e}");
            assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("url = \"http://127.0.0.1:30003")).unwrap() + 1));
        }
        let e = one(&BASE.replace("url = \"http://127.0.0.1:30001\"", "url = \"http//127.0.0.1:30001\"")).unwrap_err();
        assert!(e.msg.starts_with("router.url: "), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("url = \"http://127.0.0.1:30001")).unwrap() + 1));
        let e = one(&BASE.replace("url = \"http://127.0.0.1:30002\"", "url = \"HTTP://127.0.0.1:30003/\"")).unwrap_err();
        assert!(e.msg.contains("also the URL of sglang-dsv4-prefill.service"), "{e}");
        assert!(same_url("http://LOCALHOST:80/", "http://localhost"));
        assert!(same_url("http://127.0.0.1:30003", "http://127.0.0.1:30003/"));
        assert!(!same_url("http://127.0.0.1:30003", "https://127.0.0.1:30003"));
        assert!(!same_url("http://127.0.0.1:30003", "http://127.0.0.1:30004"));
    }

    #[test]
    fn overlapping_gpus_are_a_config_error() {
        let e = one(&BASE.replace("gpus = \"4-7\"", "gpus = \"3-7\"")).unwrap_err();
        assert!(e.msg.contains("overlap with those of sglang-dsv4-prefill.service"), "{e}");
        assert_eq!(e.line, Some(BASE.lines().position(|l| l.starts_with("gpus = \"4-7\"")).unwrap() + 1));
    }

    #[test]
    fn gpu_lists() {
        assert_eq!(parse_gpus("0-1,6"), Some([0, 1, 6].into_iter().collect()));
        assert_eq!(parse_gpus("3-1"), None);
        assert_eq!(parse_gpus(""), None);
    }
}
