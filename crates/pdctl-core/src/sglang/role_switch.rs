//! SGLang's runtime role switch as pdctl relies on it, read in the 0.5.23 wheel
//! (`disaggregation/role_switch.py`, the tokenizer's `pd_role_switch` in
//! `managers/tokenizer_control_mixin.py`, the route in `entrypoints/http_server.py`):
//! `POST /pd_role_switch {"new_role", "decode_cuda_graph_memory_gb"?, "prepare_only"?}` flips a
//! running PD server between prefill and decode when it was started with
//! `--enable-pd-role-switch` and its transfer backend supports it (mooncake and mori declare
//! `supports_role_switch`). The answer is `{success, message, old_role, new_role,
//! safe_to_restore}`, 200 or 400. The server must be fully idle; a flip to decode that will
//! capture CUDA graphs needs their footprint measured on a serving decode; a rebuild that fails
//! after the teardown leaves the server unhealthy ("restart required").
//!
//! What the answers mean ([`Answer::refusal`]), which way each worker changes role
//! ([`path_for`]), the unit's words after a change ([`with_role`]) and which workers a ratio
//! flips ([`plan_ratio`]) are decided here, without I/O.

pub use crate::wire::{Answer, Ask};
use pdctl_contract::records::Role;

/// The flag a server needs for the runtime switch.
pub const FLAG: &str = "--enable-pd-role-switch";

/// The route (an admin route: the admin key when there is one).
pub const ROUTE: &str = "/pd_role_switch";

/// The transfer backends whose KV manager declares `supports_role_switch`, as `/server_info`
/// reports them resolved (`mooncake_tcp` is reported as `mooncake`).
pub const BACKENDS: &[&str] = &["mooncake", "mori"];

/// The answers pdctl tells apart, as 0.5.23 words them (`{}`: a value); the conformance test holds
/// them to the wheel.
pub const NOT_ENABLED: &str = "--enable-pd-role-switch is not set on this server";
/// A rebuild failed before: only a restart helps.
pub const UNHEALTHY: &str = "instance is unhealthy after a failed role switch; restart required";
/// Another switch runs.
pub const IN_PROGRESS: &str = "another role switch is already in progress";
/// Requests are still in flight, queued or held for a decode.
pub const NOT_IDLE: &str = "instance is not idle; drain all requests before switching";
/// A flip to decode that will capture CUDA graphs was not told their footprint.
pub const GRAPH_MEMORY_REQUIRED: &str = "decode_cuda_graph_memory_gb is required before capturing decode graphs";
/// Less memory is free than the graphs' footprint.
pub const GRAPH_HEADROOM: &str = "insufficient decode CUDA graph headroom: required={} GB, available={} GB";
/// The rebuild failed after the teardown: the server is unhealthy.
pub const REBUILD_FAILED: &str = "role switch failed; instance unhealthy, restart required: {}";
/// The server runs no PD role.
pub const NOT_PD: &str = "instance is not running in PD disaggregation mode";
/// The transfer backend cannot switch.
pub const BACKEND: &str = "transfer backend {} does not support runtime role switch";

impl Answer {
    /// Why the server did not switch; `None`: it did (or, with `prepare_only`, would).
    pub fn refusal(&self) -> Option<Refusal> {
        if self.success {
            return None;
        }
        let m = self.message.as_str();
        let starts = |template: &str| template.split("{}").next().is_some_and(|head| m.starts_with(head));
        // A DP server joins its workers' messages with "; ": the first one decides.
        Some(if m.contains(NOT_ENABLED) {
            Refusal::NotEnabled
        } else if m.contains(UNHEALTHY) || starts(REBUILD_FAILED) {
            Refusal::RestartRequired(self.message.clone())
        } else if m.contains(IN_PROGRESS) {
            Refusal::InProgress
        } else if m.contains(NOT_IDLE) {
            Refusal::NotIdle
        } else if m.contains(GRAPH_MEMORY_REQUIRED) || starts(GRAPH_HEADROOM) {
            Refusal::GraphMemory(self.message.clone())
        } else if m.contains(NOT_PD) || starts(BACKEND) {
            Refusal::Unable(self.message.clone())
        } else {
            Refusal::Other(self.message.clone())
        })
    }
}

/// Why a server did not switch, as pdctl acts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Started without `--enable-pd-role-switch`: the restart path changes its role.
    NotEnabled,
    /// A plain server, or a transfer backend that cannot switch: the restart path.
    Unable(String),
    /// Requests remain: the drain was not complete (nothing was torn down).
    NotIdle,
    /// The decode graphs' footprint was missing or does not fit (nothing was torn down).
    GraphMemory(String),
    /// Another switch runs on it (someone else's: pdctl runs one per worker).
    InProgress,
    /// The rebuild failed: the server serves nothing until it is restarted.
    RestartRequired(String),
    /// Anything else the server said.
    Other(String),
}

impl Refusal {
    /// Nothing was torn down: the server still runs its old role and may be routed to again.
    pub fn safe_to_restore(&self) -> bool {
        !matches!(self, Refusal::RestartRequired(_) | Refusal::Other(_))
    }
}

/// Which way a worker changes role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchPath {
    /// `POST /pd_role_switch` on the running server: no restart.
    Runtime,
    /// A restart with the unit's new `--disaggregation-mode` (the reason the runtime switch
    /// cannot be used).
    Restart(String),
}

/// Which way a worker changes role, and what a flip to decode at run time tells SGLang.
#[derive(Debug, Clone, PartialEq)]
pub struct Way {
    /// At run time, or by a restart.
    pub path: SwitchPath,
    /// A flip to decode at run time: its decode CUDA graphs' footprint (GB), measured on a
    /// serving decode (0 with `--disable-cuda-graph`: nothing is captured).
    pub graph_memory_gb: Option<f64>,
}

/// A server's radix cache as `/server_info` reports it resolved (`None`: not reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Radix {
    /// `disable_radix_cache`: 0.5.23 resolves it `true` on a decode started without
    /// `--disaggregation-decode-enable-radix-cache`, `false` on a prefill unless
    /// `--disable-radix-cache` is given; a run-time flip does not change it.
    pub disabled: Option<bool>,
    /// `disaggregation_decode_enable_radix_cache`: a decode that keeps a radix cache accounts for it.
    pub decode_accounts: Option<bool>,
}

impl Radix {
    /// The two fields in a `/server_info` answer.
    pub fn of(info: &serde_json::Value) -> Radix {
        let flag = |k: &str| info.get(k).and_then(|v| v.as_bool());
        Radix { disabled: flag("disable_radix_cache"), decode_accounts: flag("disaggregation_decode_enable_radix_cache") }
    }
}

/// Why a server with `radix` must not become a decode at run time; `None`: it may. Measured on
/// the real 0.5.23 on this CPU: a server started as a prefill with its radix cache on (the
/// default), flipped to decode, decodes with a radix cache its decode path does not account for
/// (the decode path keeps one only with `--disaggregation-decode-enable-radix-cache`); after a few
/// concurrent requests its idle pool check finds the requests' KV missing ("pool memory leak
/// detected! [full] total=8192, available=7898, evictable=48") and the scheduler exits, the server
/// with it (`SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE` is on by default). Started with
/// `--disable-radix-cache` or `--disaggregation-decode-enable-radix-cache` it served every
/// request and stayed up.
pub fn decode_refusal(radix: Radix) -> Option<String> {
    match (radix.disabled, radix.decode_accounts) {
        (Some(true), _) | (_, Some(true)) => None,
        (Some(false), _) => Some(
            "its radix cache is on and SGLang's decode path does not account for it after a run-time flip \
             (sglang 0.5.23 then loses KV and the server exits at its next idle check): \
             start it with --disable-radix-cache or --disaggregation-decode-enable-radix-cache to flip it at run time"
                .into(),
        ),
        (None, _) => Some("the server does not report whether its radix cache is on (disable_radix_cache)".into()),
    }
}

/// The path to `to` for a server that was asked to run `launch` (`/server_info`'s
/// `launch_command`, its `--config` file merged in) and resolved `backend`
/// (`disaggregation_transfer_backend`) and `radix`.
pub fn path_for(launch: Option<&[String]>, backend: Option<&str>, radix: Radix, to: Role) -> SwitchPath {
    let Some(argv) = launch else {
        return SwitchPath::Restart("the server does not report what it was started with (no launch_command)".into());
    };
    if !argv.iter().any(|a| a == FLAG) {
        return SwitchPath::Restart(format!("the server was started without {FLAG}"));
    }
    match backend {
        Some(b) if BACKENDS.contains(&b) => {}
        Some(b) => return SwitchPath::Restart(format!("its transfer backend {b} cannot switch at run time (only {})", BACKENDS.join(" and "))),
        None => return SwitchPath::Restart("the server does not report its transfer backend".into()),
    }
    match decode_refusal(radix) {
        Some(why) if to == Role::Decode => SwitchPath::Restart(why),
        _ => SwitchPath::Runtime,
    }
}

/// `argv` (a unit's command) running `role`: its `--disaggregation-mode` value replaced, or the
/// flag added when it has none (a `--config` file's value loses to the command line in 0.5.23's
/// `ConfigArgumentMerger`).
pub fn with_role(argv: &[String], role: Role) -> Vec<String> {
    const MODE: &str = "--disaggregation-mode";
    let mut out = Vec::with_capacity(argv.len() + 2);
    let mut replaced = false;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if a == MODE {
            out.push(a.clone());
            out.push(role.as_str().to_string());
            let _ = it.next();
            replaced = true;
        } else if a.starts_with(&format!("{MODE}=")) {
            out.push(format!("{MODE}={}", role.as_str()));
            replaced = true;
        } else {
            out.push(a.clone());
        }
    }
    if !replaced {
        out.extend([MODE.to_string(), role.as_str().to_string()]);
    }
    out
}

/// The value of `flag` in `argv` (`--flag v` or `--flag=v`), the last one given (argparse keeps
/// the last).
fn value_of<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    let eq = format!("{flag}=");
    let mut found = None;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if a == flag {
            found = it.next().map(String::as_str);
        } else if let Some(v) = a.strip_prefix(&eq) {
            found = Some(v);
        }
    }
    found
}

/// The PD role a server started with `argv` (its `--config` file merged in) runs:
/// `--disaggregation-mode`; `None` when it names none or `null` (a plain server: the config's
/// role stands).
pub fn unit_role(argv: &[String]) -> Option<Role> {
    match value_of(argv, "--disaggregation-mode")? {
        "prefill" => Some(Role::Prefill),
        "decode" => Some(Role::Decode),
        _ => None,
    }
}

/// The bootstrap port a server started with `argv` listens on (`--disaggregation-bootstrap-port`,
/// default 8998). With `--enable-pd-role-switch` every PD server runs its bootstrap server, a
/// decode too, so a decode switched to prefill is registered with it.
pub fn bootstrap_port(argv: &[String]) -> u16 {
    value_of(argv, "--disaggregation-bootstrap-port").and_then(|p| p.parse().ok()).unwrap_or(crate::sglang::BOOTSTRAP_PORT_DEFAULT)
}

/// Whether a flip of a server started with `argv` to `to` captures decode CUDA graphs (then
/// SGLang wants their footprint): to decode, without `--disable-cuda-graph`.
pub fn captures_graphs(argv: &[String], to: Role) -> bool {
    to == Role::Decode && !argv.iter().any(|a| a == "--disable-cuda-graph")
}

/// A PD worker of this host as a ratio sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The unit.
    pub unit: String,
    /// The role it runs now.
    pub role: Role,
    /// Requests it runs or queues (`None`: not read; chosen last).
    pub in_flight: Option<u64>,
    /// It can change role at run time ([`SwitchPath::Runtime`]): chosen before one that needs a
    /// restart, whose worker is out for a whole start.
    pub runtime: bool,
}

/// One worker to flip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flip {
    /// The unit.
    pub unit: String,
    /// The role it runs now.
    pub from: Role,
    /// The role it will run.
    pub to: Role,
}

/// Why a ratio cannot be reached on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RatioRefusal {
    /// `P + D` is not the number of PD workers here.
    Count {
        /// PD workers on this host.
        have: usize,
        /// `P + D`.
        asked: usize,
    },
    /// A role would be left with no worker.
    Empty(Role),
}

impl std::fmt::Display for RatioRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RatioRefusal::Count { have, asked } => {
                write!(f, "this host has {have} PD worker(s) and the ratio names {asked}: a ratio redistributes the workers there are")
            }
            RatioRefusal::Empty(r) => write!(f, "the ratio leaves no {} worker: every pair needs both roles", r.as_str()),
        }
    }
}

/// The flips that turn `workers` into `prefill`:`decode`: from the role that has too many, those
/// that can switch at run time first (a second out, not a start), then the least busy (fewest
/// requests in flight, those not read last; then by unit name), so the drains before the switches
/// are short.
pub fn plan_ratio(workers: &[Candidate], prefill: usize, decode: usize) -> Result<Vec<Flip>, RatioRefusal> {
    let pd: Vec<&Candidate> = workers.iter().filter(|w| w.role != Role::Regular).collect();
    if prefill + decode != pd.len() {
        return Err(RatioRefusal::Count { have: pd.len(), asked: prefill + decode });
    }
    if prefill == 0 {
        return Err(RatioRefusal::Empty(Role::Prefill));
    }
    if decode == 0 {
        return Err(RatioRefusal::Empty(Role::Decode));
    }
    let now = pd.iter().filter(|w| w.role == Role::Prefill).count();
    let (from, to, n) = if now > prefill { (Role::Prefill, Role::Decode, now - prefill) } else { (Role::Decode, Role::Prefill, prefill - now) };
    let mut pool: Vec<&&Candidate> = pd.iter().filter(|w| w.role == from).collect();
    let key = |w: &Candidate| (!w.runtime, w.in_flight.unwrap_or(u64::MAX), w.unit.clone());
    pool.sort_by_key(|w| key(w));
    Ok(pool.into_iter().take(n).map(|w| Flip { unit: w.unit.clone(), from, to }).collect())
}

/// `P:D` as an operator writes it (`3:1`); `Err`: the sentence.
pub fn parse_ratio(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--ratio {s:?} is not P:D (two whole numbers, e.g. 3:1)");
    let (p, d) = s.split_once(':').ok_or_else(bad)?;
    Ok((p.trim().parse().map_err(|_| bad())?, d.trim().parse().map_err(|_| bad())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(unit: &str, role: Role, in_flight: Option<u64>) -> Candidate {
        Candidate { unit: unit.into(), role, in_flight, runtime: true }
    }

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn answer(success: bool, message: &str, safe: bool) -> Answer {
        Answer { success, message: message.into(), old_role: "prefill".into(), safe_to_restore: safe }
    }

    #[test]
    fn the_role_and_bootstrap_port_are_read_as_argparse_keeps_them() {
        assert_eq!(unit_role(&argv("-m x --disaggregation-mode prefill")), Some(Role::Prefill));
        assert_eq!(unit_role(&argv("--disaggregation-mode=prefill --disaggregation-mode decode")), Some(Role::Decode));
        assert_eq!(unit_role(&argv("--disaggregation-mode null")), None);
        assert_eq!(unit_role(&argv("-m x")), None);
        assert_eq!(bootstrap_port(&argv("--disaggregation-bootstrap-port 9100")), 9100);
        assert_eq!(bootstrap_port(&argv("--disaggregation-bootstrap-port=x")), crate::sglang::BOOTSTRAP_PORT_DEFAULT);
        assert!(captures_graphs(&argv("-m x"), Role::Decode));
        assert!(!captures_graphs(&argv("-m x --disable-cuda-graph"), Role::Decode));
        assert!(!captures_graphs(&argv("-m x"), Role::Prefill));
    }

    #[test]
    fn each_answer_is_told_apart() {
        assert_eq!(answer(true, "ok", false).refusal(), None);
        assert_eq!(answer(true, "already in target role", false).refusal(), None);
        assert_eq!(answer(false, NOT_ENABLED, true).refusal(), Some(Refusal::NotEnabled));
        assert_eq!(answer(false, &format!("{NOT_IDLE}; {NOT_IDLE}"), true).refusal(), Some(Refusal::NotIdle));
        let headroom = "insufficient decode CUDA graph headroom: required=100.000 GB, available=12.400 GB";
        assert_eq!(answer(false, headroom, true).refusal(), Some(Refusal::GraphMemory(headroom.into())));
        let failed = "role switch failed; instance unhealthy, restart required: boom";
        let r = answer(false, failed, false).refusal();
        assert_eq!(r, Some(Refusal::RestartRequired(failed.into())));
        assert!(!r.is_some_and(|r| r.safe_to_restore()));
        assert_eq!(answer(false, UNHEALTHY, false).refusal(), Some(Refusal::RestartRequired(UNHEALTHY.into())));
        let nixl = "transfer backend 'nixl' does not support runtime role switch";
        assert_eq!(answer(false, nixl, true).refusal(), Some(Refusal::Unable(nixl.into())));
        assert_eq!(answer(false, "something new", false).refusal(), Some(Refusal::Other("something new".into())));
        let v = serde_json::json!({"success": false, "message": NOT_IDLE, "old_role": "decode", "new_role": "prefill", "safe_to_restore": true});
        assert_eq!(Answer::of(&v).and_then(|a| a.refusal()), Some(Refusal::NotIdle));
        assert_eq!(Answer::of(&serde_json::json!({"detail": "Not Found"})), None);
    }

    #[test]
    fn the_runtime_path_needs_the_flag_and_a_backend_that_can() {
        let off = Radix { disabled: Some(true), decode_accounts: Some(false) };
        let with = argv("--model-path m --disaggregation-mode decode --enable-pd-role-switch");
        assert_eq!(path_for(Some(&with), Some("mooncake"), off, Role::Prefill), SwitchPath::Runtime);
        assert!(matches!(path_for(Some(&with), Some("nixl"), off, Role::Prefill), SwitchPath::Restart(why) if why.contains("nixl")));
        let without = argv("--model-path m --disaggregation-mode decode");
        assert!(matches!(path_for(Some(&without), Some("mooncake"), off, Role::Prefill), SwitchPath::Restart(why) if why.contains(FLAG)));
        assert!(matches!(path_for(None, Some("mooncake"), off, Role::Prefill), SwitchPath::Restart(_)));
    }

    #[test]
    fn a_server_with_its_radix_cache_on_becomes_a_decode_only_by_a_restart() {
        let prefill = argv("--model-path m --disaggregation-mode prefill --enable-pd-role-switch");
        let born_prefill = Radix::of(&serde_json::json!({"disable_radix_cache": false, "disaggregation_decode_enable_radix_cache": false}));
        let to_decode = path_for(Some(&prefill), Some("mooncake"), born_prefill, Role::Decode);
        assert!(matches!(&to_decode, SwitchPath::Restart(why) if why.contains("--disable-radix-cache")), "{to_decode:?}");
        // The other way needs nothing of the cache.
        assert_eq!(path_for(Some(&prefill), Some("mooncake"), born_prefill, Role::Prefill), SwitchPath::Runtime);
        // Either remedy lets it flip at run time; a born decode (resolved off) flips back.
        let accounts = Radix { disabled: Some(false), decode_accounts: Some(true) };
        assert_eq!(path_for(Some(&prefill), Some("mooncake"), accounts, Role::Decode), SwitchPath::Runtime);
        let born_decode = Radix::of(&serde_json::json!({"disable_radix_cache": true}));
        assert_eq!(path_for(Some(&prefill), Some("mooncake"), born_decode, Role::Decode), SwitchPath::Runtime);
        // Not reported: not assumed safe.
        assert!(
            matches!(path_for(Some(&prefill), Some("mooncake"), Radix::default(), Role::Decode), SwitchPath::Restart(why) if why.contains("disable_radix_cache"))
        );
    }

    #[test]
    fn the_units_words_say_the_new_role_whatever_their_spelling() {
        assert_eq!(with_role(&argv("-m x --disaggregation-mode decode --port 1"), Role::Prefill), argv("-m x --disaggregation-mode prefill --port 1"));
        assert_eq!(with_role(&argv("--disaggregation-mode=prefill"), Role::Decode), argv("--disaggregation-mode=decode"));
        assert_eq!(with_role(&argv("--config a.yaml"), Role::Decode), argv("--config a.yaml --disaggregation-mode decode"));
    }

    #[test]
    fn a_ratio_flips_the_least_busy_of_the_role_with_too_many() {
        let two_two = [c("p1", Role::Prefill, Some(3)), c("p2", Role::Prefill, Some(0)), c("d1", Role::Decode, Some(5)), c("d2", Role::Decode, Some(1))];
        assert_eq!(plan_ratio(&two_two, 3, 1), Ok(vec![Flip { unit: "d2".into(), from: Role::Decode, to: Role::Prefill }]));
        assert_eq!(plan_ratio(&two_two, 1, 3), Ok(vec![Flip { unit: "p2".into(), from: Role::Prefill, to: Role::Decode }]));
        assert_eq!(plan_ratio(&two_two, 2, 2), Ok(vec![]));
        // Not read: chosen last.
        let unread = [c("d1", Role::Decode, None), c("d2", Role::Decode, Some(9)), c("p1", Role::Prefill, Some(0))];
        assert_eq!(plan_ratio(&unread, 2, 1).map(|f| f[0].unit.clone()), Ok("d2".into()));
        assert_eq!(plan_ratio(&two_two, 4, 0), Err(RatioRefusal::Empty(Role::Decode)));
        assert_eq!(plan_ratio(&two_two, 0, 4), Err(RatioRefusal::Empty(Role::Prefill)));
        assert_eq!(plan_ratio(&two_two, 3, 3), Err(RatioRefusal::Count { have: 4, asked: 6 }));
        assert!(RatioRefusal::Count { have: 4, asked: 6 }.to_string().contains("4 PD worker(s)"));
        // One that needs a restart is chosen after every one that switches at run time, however busy.
        let restart = Candidate { runtime: false, ..c("p2", Role::Prefill, Some(0)) };
        let mixed = [c("p1", Role::Prefill, Some(7)), restart, c("d1", Role::Decode, Some(0))];
        assert_eq!(plan_ratio(&mixed, 1, 2).map(|f| f[0].unit.clone()), Ok("p1".into()));
        assert_eq!(plan_ratio(&mixed, 0, 3), Err(RatioRefusal::Empty(Role::Prefill)));
    }

    #[test]
    fn ratios_parse_as_operators_write_them() {
        assert_eq!(parse_ratio("3:1"), Ok((3, 1)));
        assert_eq!(parse_ratio(" 2 : 2 "), Ok((2, 2)));
        assert!(parse_ratio("3/1").is_err_and(|e| e.contains("P:D")));
        assert!(parse_ratio("a:1").is_err());
    }
}
