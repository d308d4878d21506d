//! The fleet: hosts coordinated through a real etcd (Debian's etcd-server), each host a sandbox
//! (real systemd, journald, D-Bus, the real router) with its own pdctld. Slots are never
//! over-admitted (checked over etcd's revision history), a waiting host says who holds the slot,
//! etcd down touches nothing, a dead host's slot stays held until its pdctld returns or an
//! operator releases it, a pause freezes grants, and a rollout that lost etcd is resumed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pdctl_tests::pdctl_sandbox::etcd::Etcd;
use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack, StackOptions};
use pdctl_tests::{assert_recorded, live_daemon, pdctl_daemon, raw_api, RouterWatch};
use serde_json::Value;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

fn is(e: &Value, unit: &str, step: &str, status: &str) -> bool {
    e["unit"] == unit && e["step"] == step && e["status"] == status
}

/// A host of fleet `t` named `host`, using `etcd`.
fn host(etcd: &str, host: &str) -> (Stack, PathBuf, Pdctld) {
    host_with(etcd, host, &StackOptions::default())
}

/// [`host`] with these stack options.
fn host_with(etcd: &str, host: &str, opts: &StackOptions) -> (Stack, PathBuf, Pdctld) {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(opts);
    let frag = config.parent().expect("dir").join("config.d/30-fleet.toml");
    std::fs::write(
        &frag,
        format!("[fleet]\netcd = [\"{etcd}\"]\nname = \"t\"\nhost = \"{host}\"\nslot_timeout = \"2m\"\n[fleet.max_unavailable]\nprefill = 1\ndecode = 1\n"),
    )
    .expect("fleet fragment");
    (stack, config, d)
}

/// `pdctl ARGS --config CONFIG`: exit code and stdout (one JSON document with --json).
fn pdctl(config: &Path, args: &[&str]) -> (i32, String, String) {
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let out = std::process::Command::new(bin).args(args).arg("--config").arg(config).output().expect("run pdctl");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn fleet_status(config: &Path) -> Value {
    let (code, out, err) = pdctl(config, &["fleet", "status", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(out.trim()).expect("fleet status JSON")
}

fn holders(status: &Value, role: &str) -> Vec<String> {
    status["slots"][role]["holders"].as_array().map(|a| a.iter().filter_map(|h| h["holder"].as_str().map(String::from)).collect()).unwrap_or_default()
}

fn alive(status: &Value, host: &str) -> bool {
    status["hosts"].as_array().is_some_and(|a| a.iter().any(|h| h["host"] == host))
}

/// Poll `f` (an HTTP or etcd state with no events) until it holds, at most `deadline`.
fn until(deadline: Duration, f: impl FnMut() -> bool) -> bool {
    pdctl_tests::until(deadline, Duration::from_millis(250), f)
}

/// The most holders the role's slot ever had, over every revision etcd kept.
fn max_holders_ever(etcd: &str, role: &str) -> (usize, Vec<Vec<String>>) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut e = pdctl_fleet::Etcd::connect(&[etcd.to_string()], None, None, Duration::from_secs(5)).await.expect("etcd");
        let now = e.revision().await.expect("revision");
        let key = format!("/pdctl/t/slots/{role}");
        let mut max = 0;
        let mut seen: Vec<Vec<String>> = Vec::new();
        for rev in 1..=now {
            if let Some(v) = e.get_at(&key, Some(rev)).await.expect("history") {
                let s: Value = serde_json::from_slice(&v.value).expect("semaphore");
                let h: Vec<String> =
                    s["holders"].as_array().map(|a| a.iter().filter_map(|h| h["holder"].as_str().map(String::from)).collect()).unwrap_or_default();
                max = max.max(h.len());
                if seen.last() != Some(&h) {
                    seen.push(h);
                }
            }
        }
        (max, seen)
    })
}

#[test]
fn two_hosts_never_hold_the_prefill_slot_at_once_and_the_waiter_says_who_holds_it() {
    let etcd = Etcd::start().expect("etcd");
    let (_a, ca, da) = host(&etcd.url(), "gpu-node-a");
    let (_b, cb, db) = host(&etcd.url(), "gpu-node-b");
    let mut ra = live_daemon(&da, &ca, &["restart", "--rolling", "--unit", P, "--json"]);
    ra.wait_line(LIMIT, |e| is(e, P, "slot", "passed")).expect("host a took the prefill slot");
    let mut rb = live_daemon(&db, &cb, &["restart", "--rolling", "--unit", P, "--json"]);
    let waiting = rb.wait_line(LIMIT, |e| is(e, P, "slot", "started") && e["detail"]["waiting"].is_string()).expect("host b waits");
    let w = waiting["detail"]["waiting"].as_str().unwrap_or("");
    assert!(w.starts_with(&format!("waiting for a prefill slot: held by gpu-node-a/{P} since ")), "{w}");
    assert_eq!(ra.finish(LIMIT), Some(0), "{:#?}", ra.seen);
    assert_eq!(rb.finish(LIMIT), Some(0), "{:#?}", rb.seen);
    let (max, seen) = max_holders_ever(&etcd.url(), "prefill");
    assert_eq!(max, 1, "never two prefill slots at once: {seen:?}");
    assert!(seen.contains(&vec![format!("gpu-node-a/{P}")]) && seen.contains(&vec![format!("gpu-node-b/{P}")]), "{seen:?}");
    let st = fleet_status(&ca);
    assert!(holders(&st, "prefill").is_empty(), "both given back: {st:#}");
    assert!(alive(&st, "gpu-node-a") && alive(&st, "gpu-node-b"), "{st:#}");
    let a = st["hosts"].as_array().unwrap().iter().find(|h| h["host"] == "gpu-node-a").unwrap();
    assert!(a["workers"].as_array().unwrap().iter().any(|w| w["unit"] == P && w["state"] == "active/running"), "{a:#}");
}

#[test]
fn etcd_down_touches_nothing_and_says_so_with_exit_3() {
    let dead = format!("http://127.0.0.1:{}", pdctl_tests::pdctl_sandbox::free_port().expect("port"));
    let (stack, config, d) = host(&dead, "gpu-node-a");
    let before = stack.show(P, "InvocationID").expect("prefill");
    let watch = RouterWatch::start(&stack);
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"], LIMIT);
    watch.finish().assert_down(0, 0);
    assert_eq!(r.code, 3, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(r.summary["failed"]["cause_code"], "fleet_unreachable");
    assert_recorded(&d.socket, &r);
    assert_eq!(r.summary["failed"]["unit"], "fleet");
    assert!(!r.touched(P) && !r.touched(D));
    assert_eq!(stack.show(P, "InvocationID").expect("prefill"), before);
    let (code, _, err) = pdctl(&config, &["fleet", "status"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("the fleet's etcd cannot be reached"), "{err}");
}

#[test]
fn a_pause_freezes_grants_fleet_wide_until_unpaused() {
    let etcd = Etcd::start().expect("etcd");
    let (_s, config, d) = host(&etcd.url(), "gpu-node-a");
    let (code, out, err) = pdctl(&config, &["fleet", "pause", "--reason", "incident 4711"]);
    assert_eq!(code, 0, "{out}{err}");
    let mut r = live_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    let w = r.wait_line(LIMIT, |e| is(e, P, "slot", "started") && e["detail"]["waiting"].is_string()).expect("waits while paused");
    let w = w["detail"]["waiting"].as_str().unwrap_or("");
    assert!(w.contains("the fleet is paused by uid ") && w.contains("incident 4711"), "{w}");
    assert!(!r.seen.iter().any(|e| is(e, P, "drain", "started")), "nothing drained while paused");
    let (code, out, err) = pdctl(&config, &["fleet", "unpause"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(r.finish(LIMIT), Some(0), "{:#?}", r.seen);
}

#[test]
fn a_dead_hosts_slot_stays_held_until_its_pdctld_returns_or_an_operator_releases_it() {
    let etcd = Etcd::start().expect("etcd");
    let (stack, config, d) = host(&etcd.url(), "gpu-node-a");
    let holder = format!("gpu-node-a/{P}");
    // The host's liveness key is there (written by its pdctld within seconds of its start).
    assert!(until(Duration::from_secs(30), || alive(&fleet_status(&config), "gpu-node-a")), "host a is alive in etcd");
    // 1. pdctld dies holding the slot; the slot stays held; pdctld returns and gives it back.
    let watch = RouterWatch::start(&stack);
    let mut r = live_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    r.wait_line(LIMIT, |e| is(e, P, "restart", "passed")).expect("restarted");
    let (code, _, err) = pdctl(&config, &["fleet", "release", "gpu-node-a"]);
    assert_eq!(code, 2, "refused while the host is alive: {err}");
    assert!(err.contains("gpu-node-a is alive"), "{err}");
    stack.sandbox.systemctl(&["kill", "--signal=SIGKILL", &d.unit]).expect("kill pdctld");
    let _ = r.finish(Duration::from_secs(20));
    assert!(until(Duration::from_secs(40), || !alive(&fleet_status(&config), "gpu-node-a")), "its liveness key expired");
    assert_eq!(holders(&fleet_status(&config), "prefill"), vec![holder.clone()], "a dead host's slot stays held");
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    assert!(until(Duration::from_secs(90), || holders(&fleet_status(&config), "prefill").is_empty()), "given back once the prefill serves again");
    watch.finish().assert_down(1, 0);
    // 2. The same, but an operator releases the dead host's slot.
    let (_, st) = raw_api(&d.socket, "GET", "/v1/status", "");
    assert_eq!(st["reconciling"], false, "{st}");
    let mut r = live_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"]);
    r.wait_line(LIMIT, |e| is(e, P, "restart", "passed")).expect("restarted");
    stack.sandbox.systemctl(&["kill", "--signal=SIGKILL", &d.unit]).expect("kill pdctld");
    let _ = r.finish(Duration::from_secs(20));
    assert!(until(Duration::from_secs(40), || !alive(&fleet_status(&config), "gpu-node-a")));
    let (code, out, err) = pdctl(&config, &["fleet", "release", "gpu-node-a"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("released {holder}'s prefill slot")), "{out}");
    assert!(holders(&fleet_status(&config), "prefill").is_empty());
}

#[test]
fn etcd_lost_mid_rollout_finishes_the_unit_takes_no_new_slot_and_resumes_once_back() {
    let mut etcd = Etcd::start().expect("etcd");
    let (stack, config, d) = host(&etcd.url(), "gpu-node-a");
    let d0 = stack.show(D, "InvocationID").expect("decode");
    let mut r = live_daemon(&d, &config, &["restart", "--rolling", "--json"]);
    r.wait_line(LIMIT, |e| is(e, P, "slot", "passed")).expect("prefill slot");
    etcd.stop();
    assert_eq!(r.finish(LIMIT), Some(3), "{:#?}", r.seen);
    assert!(r.seen.iter().any(|e| is(e, P, "soak", "passed")), "the unit in progress was finished and verified");
    let summary = r.seen.last().cloned().unwrap_or(Value::Null);
    assert_eq!(summary["failed"]["cause_code"], "fleet_lost", "{summary:#}");
    assert_eq!(summary["failed"]["unit"], D);
    assert_eq!(summary["failed"]["step"], "slot");
    assert_eq!(stack.show(D, "InvocationID").expect("decode"), d0, "no new slot, nothing touched");
    let id = summary["id"].as_str().expect("id").to_string();
    let (_, rec) = raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert_eq!(rec["lifecycle"]["state"], "interrupted", "{rec:#}");
    etcd.resume().expect("etcd back");
    let res = pdctl_daemon(&d, &config, &["rollout", "resume", &id, "--json"], LIMIT);
    assert_eq!(res.code, 0, "{:#}\n{}", res.summary, res.stderr);
    assert!(res.touched(D), "the decode, never touched, is restarted (not only re-verified)");
    assert_ne!(stack.show(D, "InvocationID").expect("decode"), d0);
    assert!(
        until(Duration::from_secs(60), || holders(&fleet_status(&config), "prefill").is_empty()),
        "the prefill's slot, kept on record while etcd was away, is given back"
    );
}

/// `pdctl fleet restart` from host a's CLI and pdctld; the JSON lines it printed and its exit code.
fn fleet_restart(config: &Path, d: &Pdctld, extra: &[&str]) -> (i32, Vec<Value>, String) {
    let mut args = vec!["fleet", "restart", "--rolling", "--json", "--socket"];
    let socket = d.socket.display().to_string();
    args.push(&socket);
    args.extend_from_slice(extra);
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let mut child = std::process::Command::new(bin)
        .args(&args)
        .arg("--config")
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pdctl");
    let out = child.stdout.take().expect("stdout");
    let lines = pdctl_tests::line_reader(out, |l| serde_json::from_str::<Value>(&l).ok());
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(420);
    while let Ok(v) = lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
        seen.push(v);
    }
    let status = child.wait().expect("wait");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (status.code().unwrap_or(-1), seen, err)
}

/// [`fleet_restart`] from the first host once every host is alive in etcd and its gateway lists
/// both workers, with clients sending 8 requests a second through each host's gateway meanwhile.
fn fleet_restart_under_load(hosts: &[(Stack, PathBuf, Pdctld)], extra: &[&str]) -> (i32, Vec<Value>, String) {
    let (_, ca, da) = &hosts[0];
    let names: Vec<String> = hosts.iter().map(|(_, c, _)| host_of(c)).collect();
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(ca);
        names.iter().all(|h| alive(&s, h))
    }));
    for (s, _, _) in hosts {
        assert_eq!(s.wait_router_healthy(2, Duration::from_secs(60)).expect("router"), 2);
    }
    let loads: Vec<pdctl_tests::Load> = hosts.iter().map(|(s, _, _)| pdctl_tests::Load::start(&s.router.as_ref().expect("router").url, 8.0, 4)).collect();
    let out = fleet_restart(ca, da, extra);
    for l in loads {
        l.stop();
    }
    out
}

/// The host name a host's config gives itself (`[fleet] host` in its fragment).
fn host_of(config: &Path) -> String {
    let frag = std::fs::read_to_string(config.parent().expect("dir").join("config.d/30-fleet.toml")).expect("fleet fragment");
    frag.lines().find_map(|l| l.strip_prefix("host = \"")).and_then(|r| r.strip_suffix('"')).expect("host").to_string()
}

#[test]
fn a_fleet_rollout_runs_every_hosts_part_serialized_by_slots_with_an_audit_trail() {
    let etcd = Etcd::start().expect("etcd");
    let (_a, ca, da) = host(&etcd.url(), "gpu-node-a");
    let (_b, _cb, db) = host(&etcd.url(), "gpu-node-b");
    // Both hosts alive in etcd before the request names them.
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(&ca);
        alive(&s, "gpu-node-a") && alive(&s, "gpu-node-b")
    }));
    let (code, lines, err) = fleet_restart(&ca, &da, &["--reason", "new flags for dsv4"]);
    assert_eq!(code, 0, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["result"], "succeeded", "{last:#}");
    assert_eq!(last["hosts"]["gpu-node-a"], "succeeded");
    assert_eq!(last["hosts"]["gpu-node-b"], "succeeded");
    for h in ["gpu-node-a", "gpu-node-b"] {
        for u in [P, D] {
            assert!(lines.iter().any(|e| e["host"] == h && is(e, u, "soak", "passed")), "{h} {u} verified");
        }
    }
    for role in ["prefill", "decode"] {
        let (max, seen) = max_holders_ever(&etcd.url(), role);
        assert_eq!(max, 1, "{role}: never two at once across hosts: {seen:?}");
    }
    // Each host's record says who started it and why.
    for d in [&da, &db] {
        let (_, h) = raw_api(&d.socket, "GET", "/v1/rollouts", "");
        let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|r| r["id"].as_str()).expect("a rollout").to_string();
        let (_, rec) = raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
        let by = &rec["started_by"];
        assert_eq!(by["fleet_rollout"], last["id"], "{rec:#}");
        assert!(by["fleet_by"].as_str().unwrap_or("").starts_with("uid 0 on gpu-node-a"), "{by}");
        assert_eq!(by["reason"], "new flags for dsv4");
    }
}

#[test]
fn a_failed_canary_halts_the_fleet_rollout_before_any_other_host_starts() {
    let etcd = Etcd::start().expect("etcd");
    let (a, ca, da) = host(&etcd.url(), "gpu-node-a");
    let (b, _cb, _db) = host(&etcd.url(), "gpu-node-b");
    std::fs::write(ca.parent().expect("dir").join("config.d/31-canary.toml"), "[fleet]\ncanary = \"gpu-node-a\"\n").expect("canary");
    // The canary's prefill gets a flag its SGLang does not know: it fails at start.
    a.drop_in(
        P,
        "50-bad-flag",
        &format!(
            "[Service]\nExecStart=\n{}\n",
            a.worker_unit(&a.prefill, &StackOptions::default(), &["--bogus-flag".into()]).lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart")
        ),
    )
    .expect("drop-in");
    let b_prefill = b.show(P, "InvocationID").expect("b prefill");
    let b_decode = b.show(D, "InvocationID").expect("b decode");
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(&ca);
        alive(&s, "gpu-node-a") && alive(&s, "gpu-node-b")
    }));
    let (code, lines, err) = fleet_restart(&ca, &da, &["--load-changes"]);
    assert_eq!(code, 1, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["result"], "failed", "{last:#}");
    assert_eq!(last["hosts"]["gpu-node-a"], "failed");
    assert_eq!(last["hosts"]["gpu-node-b"], "not_started");
    assert!(!lines.iter().any(|e| e["host"] == "gpu-node-b"), "host b printed no event: it never started");
    let failed = lines.iter().find(|e| e["host"] == "gpu-node-a" && e["status"] == "failed").expect("a's failed step");
    assert_eq!((failed["unit"].as_str(), failed["step"].as_str()), (Some(P), Some("ready")), "the bad flag is rejected at start: {failed:#}");
    assert_eq!(b.show(P, "InvocationID").expect("b prefill"), b_prefill);
    assert_eq!(b.show(D, "InvocationID").expect("b decode"), b_decode);
}

/// Three hosts serving the same traffic; the canary's change makes its prefill 3× slower after a
/// good start. Its soak judges it against the other hosts' prefills over the same window (read
/// from their liveness keys): the canary halts on `slo_regression` and no other host starts.
#[test]
fn a_slow_canary_is_judged_against_the_other_hosts_and_stops_the_fleet_before_any_other_host() {
    let etcd = Etcd::start().expect("etcd");
    let opts = StackOptions { prefill_args: vec!["--sim-prefill-secs".into(), "0.3".into()], ..Default::default() };
    let hosts: Vec<(Stack, PathBuf, Pdctld)> = ["gpu-node-a", "gpu-node-b", "gpu-node-c"].iter().map(|h| host_with(&etcd.url(), h, &opts)).collect();
    for (_, c, _) in &hosts {
        std::fs::write(
            c.parent().expect("dir").join("config.d/32-slo.toml"),
            "[rollout]\nmin_healthy = \"3s\"\n[verify.slo]\nmin_requests = 20\nmax_wait = \"60s\"\n",
        )
        .expect("slo");
    }
    let (a, ca, _) = &hosts[0];
    std::fs::write(ca.parent().expect("dir").join("config.d/31-canary.toml"), "[fleet]\ncanary = \"gpu-node-a\"\n").expect("canary");
    a.drop_in(P, "50-slow", "[Service]\nEnvironment=SGLANG_SIM_SLOWDOWN=3\n").expect("drop-in");
    let before: Vec<(String, String)> =
        hosts[1..].iter().map(|(s, _, _)| (s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d"))).collect();
    let (code, lines, err) = fleet_restart_under_load(&hosts, &["--load-changes"]);
    assert_eq!(code, 1, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["result"], "failed", "{last:#}");
    assert_eq!(
        (last["hosts"]["gpu-node-a"].as_str(), last["hosts"]["gpu-node-b"].as_str(), last["hosts"]["gpu-node-c"].as_str()),
        (Some("failed"), Some("not_started"), Some("not_started")),
        "{last:#}"
    );
    let failed = lines.iter().find(|e| e["host"] == "gpu-node-a" && e["status"] == "failed").expect("a's failed step");
    assert_eq!((failed["unit"].as_str(), failed["step"].as_str()), (Some(P), Some("soak")), "{failed:#}");
    assert_eq!(failed["detail"]["cause_code"], "slo_regression", "{failed:#}");
    let cause = failed["detail"]["cause"].as_str().expect("cause");
    assert!(cause.contains("gpu-node-b/") && cause.contains("gpu-node-c/") && cause.contains("end-to-end latency p50"), "{cause}");
    assert!(!lines.iter().any(|e| e["host"] == "gpu-node-b" || e["host"] == "gpu-node-c"), "no other host printed an event: none started");
    for ((s, _, _), (p0, d0)) in hosts[1..].iter().zip(&before) {
        assert_eq!((&s.show(P, "InvocationID").expect("p"), &s.show(D, "InvocationID").expect("d")), (p0, d0));
    }
}

/// Three hosts under load; on every host a change makes the decode fail 30 % of its requests 45 s
/// after a good start (`SGLANG_SIM_FAULTS_AFTER`): each soak passes — the service gate sees the
/// change serve well — and the fleet rollout ends every host's part. The bake after the last
/// host judges every changed worker against its own figures from before its drain, sees the
/// breach, and reverts every changed host, the last to finish first, each through its gates:
/// the drop-ins are moved aside, the decodes restarted, the prefills (unchanged) left alone.
#[test]
fn a_breach_during_the_bake_reverts_every_changed_host_the_last_first() {
    let etcd = Etcd::start().expect("etcd");
    let names = ["gpu-node-a", "gpu-node-b", "gpu-node-c"];
    let hosts: Vec<(Stack, PathBuf, Pdctld)> = names.iter().map(|h| host(&etcd.url(), h)).collect();
    for (s, c, _) in &hosts {
        std::fs::write(
            c.parent().expect("dir").join("config.d/32-slo.toml"),
            "[rollout]\nmin_healthy = \"3s\"\n[verify.slo]\nmin_requests = 20\nmax_wait = \"60s\"\n[fleet]\nbake = \"60s\"\n",
        )
        .expect("slo and bake");
        s.drop_in(D, "50-late-fail", "[Service]\nEnvironment=SGLANG_SIM_FAIL_FRACTION=0.3\nEnvironment=SGLANG_SIM_FAULTS_AFTER=45\n").expect("drop-in");
    }
    let (_, ca, _) = &hosts[0];
    let (code, lines, err) = fleet_restart_under_load(&hosts, &["--load-changes"]);
    assert_eq!(code, 1, "{lines:#?}\n{err}");
    let last = lines.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["result"], "rolled_back", "{last:#}");
    for h in names {
        assert_eq!(last["hosts"][h], "succeeded", "every part passed its gates: {last:#}");
        assert_eq!(last["reverted"][h], "succeeded", "every changed host was reverted: {last:#}");
        for u in [P, D] {
            assert!(lines.iter().any(|e| e["host"] == h && is(e, u, "soak", "passed")), "{h} {u}: its soak passed before the fault set in");
        }
    }
    let bake = last["bake"].as_str().unwrap_or("");
    assert!(bake.starts_with("breach on gpu-node-") && bake.contains(D) && bake.contains("error rate"), "{bake}");
    // The revert goes from the last host to finish to the first, each after the one before it.
    let revert = lines.iter().find_map(|l| l.get("revert")).cloned().expect("the revert request");
    let order: Vec<String> = revert["order"].as_array().expect("order").iter().filter_map(|h| h.as_str().map(String::from)).collect();
    let finished: Vec<String> = lines.iter().filter_map(|l| l.get("reverted")).filter_map(|r| r["host"].as_str().map(String::from)).collect();
    assert_eq!(finished, order, "reverts ended in the request's order");
    assert_eq!(order.len(), 3);
    let at = |f: &dyn Fn(&Value) -> bool| lines.iter().position(f).unwrap_or(usize::MAX);
    for h in names {
        // Each revert's own steps reach the fleet's watchers: its files put back, then its gates.
        let restored = at(&|e: &Value| e["host"] == h && is(e, D, "rollback", "passed"));
        let reverted = at(&|l: &Value| l["reverted"]["host"] == h);
        assert!(at(&|l: &Value| l.get("revert").is_some()) < restored && restored < reverted, "{h}: the request, its restore, its end, in order");
        assert!(lines[restored]["detail"]["restored"].as_array().is_some_and(|r| r.iter().any(|x| x.as_str().unwrap_or("").contains("50-late-fail.conf"))));
    }
    // An operator's view of the same rollout: the bake, the breach and the revert, then the
    // outcome and what to do next.
    let id = last["id"].as_str().expect("id");
    let (code, out, _) = pdctl(ca, &["fleet", "watch", id]);
    eprintln!("{out}");
    assert_eq!(code, 1, "{out}");
    assert!(out.lines().any(|l| l.contains("bake breach:") && l.contains("error rate")), "{out}");
    assert!(out.lines().any(|l| l.contains("bake breach on gpu-node-") && l.contains("reverting")), "{out}");
    let end = out.lines().last().unwrap_or("");
    assert!(
        end.starts_with(&format!("pdctl: ✗ fleet rollout {id} rolled back: bake breach on gpu-node-")) && end.contains("next: pdctl fleet status"),
        "{end}"
    );
    for (s, _, d) in &hosts {
        // The decode runs its files from before: the drop-in is moved aside, the fault is gone.
        let dir = s.sandbox.unit_dir().join(format!("{D}.d"));
        assert!(!dir.join("50-late-fail.conf").exists(), "the change's drop-in is gone");
        let aside =
            std::fs::read_dir(&dir).expect("drop-in dir").flatten().any(|e| e.file_name().to_string_lossy().starts_with("50-late-fail.conf.pdctl-rejected-"));
        assert!(aside, "moved aside, not deleted");
        assert!(!s.show(D, "Environment").expect("env").contains("SGLANG_SIM_FAIL_FRACTION"));
        // Its record: a revert of the fleet rollout's part, verified; only the decode restarted.
        let (_, h) = raw_api(&d.socket, "GET", "/v1/rollouts", "");
        let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|r| r["id"].as_str()).expect("a rollout").to_string();
        let (_, rec) = raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
        assert_eq!((rec["kind"].as_str(), rec["lifecycle"]["state"].as_str()), (Some("revert"), Some("succeeded")), "{rec:#}");
        assert_eq!(rec["plan"], serde_json::json!([D]), "the unchanged prefill is not restarted again: {rec:#}");
        assert_eq!(rec["started_by"]["fleet_rollout"], last["id"]);
        assert!(rec["started_by"]["reason"].as_str().unwrap_or("").contains("bake"), "{rec:#}");
    }
}

/// Five restarts pdctl did not make within a minute (a decode of host b crash-looping under
/// `Restart=always`; the rule: more than 4 within 1m) pause the fleet — no slot is granted —
/// and the pause says why, naming the host and unit. Once the loop is stopped an operator
/// unpauses, and the same restarts do not pause it again.
#[test]
fn a_restart_storm_on_one_host_pauses_the_fleet_and_says_why() {
    let etcd = Etcd::start().expect("etcd");
    let (_a, ca, _da) = host(&etcd.url(), "gpu-node-a");
    let (b, cb, _db) = host(&etcd.url(), "gpu-node-b");
    for c in [&ca, &cb] {
        std::fs::write(c.parent().expect("dir").join("config.d/33-storm.toml"), "[fleet.storm]\nrestarts = 4\nwithin = \"1m\"\n").expect("storm");
    }
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(&ca);
        alive(&s, "gpu-node-a") && alive(&s, "gpu-node-b") && s["paused"].is_null()
    }));
    let crash = b
        .drop_in(
            D,
            "50-crash-loop",
            "[Unit]\nStartLimitIntervalSec=0\n[Service]\nEnvironment=SGLANG_SIM_CRASH_AFTER_READY=0.2\nRestart=always\nRestartSec=100ms\n",
        )
        .expect("drop-in");
    b.sandbox.systemctl(&["restart", D]).expect("restart");
    let mut status = Value::Null;
    let paused = until(Duration::from_secs(90), || {
        status = fleet_status(&ca);
        !status["paused"].is_null()
    });
    assert!(paused, "the fleet was paused: {status:#}");
    let reason = status["paused"]["reason"].as_str().unwrap_or("");
    assert!(reason.starts_with("restart storm") && reason.contains(&format!("gpu-node-b/{D} ×")), "{reason}");
    assert!(status["paused"]["by"].as_str().unwrap_or("").starts_with("pdctld on gpu-node-"), "{status:#}");
    // The operator's view names them too.
    let (code, out, _) = pdctl(&ca, &["fleet", "status"]);
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.contains("restarts pdctl did not make") && l.contains(&format!("{D} ×"))), "{out}");
    assert!(out.contains("PAUSED by pdctld on") && out.contains("restart storm"), "{out}");
    // The loop stopped (no new restart: a manual start would count as one), an operator
    // unpauses; the same restarts do not pause it again.
    std::fs::remove_file(&crash).expect("remove the drop-in");
    b.sandbox.daemon_reload().expect("reload");
    b.sandbox.systemctl(&["stop", D]).expect("stop");
    let (code, out, err) = pdctl(&ca, &["fleet", "unpause"]);
    assert_eq!(code, 0, "{out}{err}");
    // Two liveness periods (5 s each) of every host's pdctld.
    let repaused = until(Duration::from_secs(12), || !fleet_status(&ca)["paused"].is_null());
    assert!(!repaused, "not paused again for the restarts it was paused for");
}

#[test]
fn thirty_simulated_hosts_with_lost_answers_and_an_etcd_restart_never_exceed_the_limit() {
    use pdctl_tests::fleet_sim::{run, SimSpec};
    let etcd = std::sync::Arc::new(std::sync::Mutex::new(Etcd::start().expect("etcd")));
    let url = etcd.lock().map(|e| e.url()).unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let spec = SimSpec {
        hosts: 30,
        max_unavailable: 1,
        restart: Duration::from_millis(20),
        lose_every: 7,
        etcd_restart_after: Some(Duration::from_millis(200)),
        poll: None,
    };
    let e = etcd.clone();
    let r = rt.block_on(run(&spec, &url, move || {
        if let Ok(mut e) = e.lock() {
            e.stop();
            let _ = e.resume();
        }
    }));
    eprintln!("30 hosts: {:?} total, {} answers lost, {} calls failed, most down {:?}", r.total, r.lost, r.failed_calls, r.max_down);
    assert_eq!(r.waits.len(), 60, "every host restarted both its workers");
    assert!(r.lost > 0, "answers were lost on purpose");
    assert_eq!(r.max_down.get("prefill"), Some(&1), "{:?}", r.max_down);
    assert_eq!(r.max_down.get("decode"), Some(&1), "{:?}", r.max_down);
    // Waiting on the slots' watch, not polling: every wait was ended by a release it saw (one
    // the watch missed would have waited out the 10 s fallback; etcd's restart ends watches,
    // which are then made again from a new read, not waited out).
    assert_eq!(r.fallbacks, 0, "no grant was missed: {r:?}");
}

/// The hardened pdctld.service allows loopback only; `pdctl unit-dropin` prints the drop-in that
/// allows exactly the other addresses the config names. (Whether pdctld's preflight sees the
/// unit's EPERM cannot be shown on the sandbox: its user manager did not enforce `IPAddressDeny=`
/// — measured: the connection went out and timed out instead.)
#[test]
fn unit_dropin_allows_exactly_the_configured_addresses_on_other_hosts() {
    let dir = std::env::temp_dir().join(format!("pdctl-dropin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("pdctl.toml");
    std::fs::write(
        &config,
        "[router]\nurl = \"http://10.0.0.9:30001\"\nmetrics_url = \"http://10.0.0.9:29001/metrics\"\n\
         [[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://127.0.0.1:30003\"\n\
         [fleet]\netcd = [\"http://10.0.0.5:2379\", \"http://10.0.0.6:2379\"]\nname = \"t\"\nhost = \"a\"\n",
    )
    .expect("config");
    let (code, out, err) = pdctl(&config, &["unit-dropin"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("[Service]\nIPAddressAllow=10.0.0.5 10.0.0.6 10.0.0.9\n"), "{out}");
    assert!(out.contains("#   etcd: http://10.0.0.5:2379 → 10.0.0.5"), "{out}");
    assert!(!out.contains("127.0.0.1"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Healthy workers listed by the gateway at `url`.
fn healthy_on(url: &str) -> Vec<String> {
    let Ok((200, body)) = pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{url}/workers")) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["workers"]
        .as_array()
        .map(|a| a.iter().filter(|w| w["is_healthy"] == true).filter_map(|w| w["url"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

#[test]
fn with_two_gateway_replicas_each_is_drained_re_registered_and_checked_for_admission() {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&StackOptions { routers: 2, ..Default::default() });
    let replicas: Vec<String> =
        std::iter::once(stack.router.as_ref().expect("router").url.clone()).chain(stack.extra_routers.iter().map(|r| r.url.clone())).collect();
    assert_eq!(replicas.len(), 2);
    assert!(until(Duration::from_secs(60), || replicas.iter().all(|r| healthy_on(r).len() == 2)), "both replicas admit both workers");
    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(r.event(P, "drain", "passed")["detail"]["replicas_drained"], 2);
    let admitted = &r.event(P, "router", "passed")["detail"]["replicas"];
    assert_eq!(admitted.as_array().map(Vec::len), Some(2), "{admitted:#}");
    for a in admitted.as_array().unwrap_or(&Vec::new()) {
        assert_eq!(a["re_registered"], true, "drained from each replica, so re-registered on each: {a:#}");
    }
    for url in &replicas {
        assert!(healthy_on(url).contains(&stack.prefill.url), "{url} admits the prefill again");
    }
}

#[test]
fn a_stale_decode_on_another_host_is_repaired_by_that_hosts_pdctld_through_the_fleet() {
    let etcd = Etcd::start().expect("etcd");
    let (a, ca, da) = host(&etcd.url(), "gpu-node-a");
    // Host b's decode is of an SGLang release before PR 36029.
    let (b, cb, db) = {
        let (stack, config, d) =
            pdctl_tests::stack_with_pdctld_opts(&StackOptions { decode_args: vec!["--sim-pair-cache".into(), "stale".into()], ..Default::default() });
        let frag = config.parent().expect("dir").join("config.d/30-fleet.toml");
        std::fs::write(
            &frag,
            format!("[fleet]\netcd = [\"{}\"]\nname = \"t\"\nhost = \"gpu-node-b\"\n[fleet.max_unavailable]\nprefill = 1\ndecode = 1\n", etcd.url()),
        )
        .expect("fleet");
        (stack, config, d)
    };
    // One gateway in front of both hosts: a's; b's workers join it, b's pdctld uses it.
    let ra = a.router.clone().expect("router");
    std::fs::write(
        cb.parent().expect("dir").join("config.d/40-router.toml"),
        format!("[router]\nurl = \"{}\"\nmetrics_url = \"{}\"\n", ra.url, ra.metrics_url),
    )
    .expect("router");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (boot_a, boot_b) = (a.prefill.bootstrap_port.expect("a bootstrap"), b.prefill.bootstrap_port.expect("b bootstrap"));
    rt.block_on(async {
        for (url, kind, bp) in [(&b.prefill.url, "prefill", Some(boot_b)), (&b.decode.url, "decode", None)] {
            let mut body = serde_json::json!({"url": url, "worker_type": kind});
            if let Some(p) = bp {
                body["bootstrap_port"] = serde_json::json!(p);
            }
            let r = pdctl_tests::http().post(format!("{}/workers", ra.url)).json(&body).send().await.expect("register");
            assert!(r.status().is_success(), "{}", r.status());
        }
        // b's decode has paired with a's prefill (the gateway would do this any time).
        let pair = serde_json::json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot_a, "bootstrap_room": 77});
        let (p, d) = tokio::join!(
            pdctl_tests::http().post(format!("{}/generate", a.prefill.url)).json(&pair).send(),
            pdctl_tests::http().post(format!("{}/generate", b.decode.url)).json(&pair).send()
        );
        assert_eq!(d.expect("decode").status(), 200);
        assert_eq!(p.expect("prefill").status(), 200);
    });
    assert!(until(Duration::from_secs(60), || healthy_on(&ra.url).len() == 4), "the gateway admits all four workers");
    assert!(
        until(Duration::from_secs(30), || {
            let s = fleet_status(&ca);
            s["hosts"].as_array().is_some_and(|h| {
                h.iter().any(|h| h["host"] == "gpu-node-b" && h["workers"].as_array().is_some_and(|w| w.iter().any(|w| w["url"] == b.decode.url.as_str())))
            })
        }),
        "host b's liveness names its decode's URL"
    );
    let d_b = b.show(D, "InvocationID").expect("b decode");
    let d_a = a.show(D, "InvocationID").expect("a decode");
    let r = pdctl_daemon(&da, &ca, &["restart", "--rolling", "--unit", P, "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let remote = format!("gpu-node-b/{D}");
    assert_eq!(r.summary["repairs"][&remote], P, "{:#}", r.summary);
    let pair = r.event(P, "pair", "passed");
    assert!(pairs_stale(pair).contains(&remote), "{pair:#}");
    assert_ne!(b.show(D, "InvocationID").expect("b decode"), d_b, "host b's pdctld restarted its decode");
    assert_eq!(a.show(D, "InvocationID").expect("a decode"), d_a, "a's own decode refreshed by itself: not restarted");
    // Host b's record of that repair says who asked and why.
    let (_, h) = raw_api(&db.socket, "GET", "/v1/rollouts", "");
    let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|x| x["id"].as_str()).expect("b's rollout").to_string();
    let (_, rec) = raw_api(&db.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    assert!(rec["started_by"]["reason"].as_str().unwrap_or("").contains(&format!("stale pairing with gpu-node-a/{P}")), "{rec:#}");
    assert_eq!(rec["plan"], serde_json::json!([D]));
}

fn pairs_stale(e: &Value) -> Vec<String> {
    e["detail"]["stale"].as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default()
}

#[test]
fn etcd_over_tls_with_client_certificates_and_refused_without_one() {
    use pdctl_tests::pdctl_sandbox::etcd::TlsFiles;
    let dir = std::env::temp_dir().join(format!("pdctl-tls-{}", std::process::id()));
    let tls = TlsFiles::generate(&dir.join("certs")).expect("certificates (openssl)");
    let etcd = Etcd::start_tls(tls.clone()).expect("etcd with TLS");
    assert!(etcd.url().starts_with("https://"));
    let write = |name: &str, extra: &str| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(
            &p,
            format!(
                "[[worker]]\nunit = \"p.service\"\nrole = \"prefill\"\nurl = \"http://127.0.0.1:30003\"\n\
                 [fleet]\netcd = [\"{}\"]\nname = \"t\"\nhost = \"a\"\nca_file = \"{}\"\n{extra}",
                etcd.url(),
                tls.ca.display()
            ),
        )
        .expect("config");
        p
    };
    let with_cert = write("with.toml", &format!("cert_file = \"{}\"\nkey_file = \"{}\"\n", tls.client.0.display(), tls.client.1.display()));
    let (code, out, err) = pdctl(&with_cert, &["fleet", "pause", "--reason", "tls works"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(fleet_status(&with_cert)["paused"]["reason"], "tls works");
    // The cluster requires a client certificate: without one, nothing is changed (exit 3).
    let without = write("without.toml", "");
    let (code, _, err) = pdctl(&without, &["fleet", "unpause"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(fleet_status(&with_cert)["paused"]["reason"], "tls works", "still paused");
    let _ = std::fs::remove_dir_all(dir);
}

/// Three hosts of one fleet behind **one shared gateway** (host a's: every host's workers
/// registered in it, every pdctld's `[router]` pointed at it, so any prefill pairs with any
/// host's decode), every worker on one model path (the sandbox's own directory differs per
/// host, and the simulator tells models apart by path); `extra`: the decode's extra arguments
/// of a host. Returns once every host is alive in etcd and the gateway admits all six workers.
fn three_hosts_behind_one_gateway(etcd: &Etcd, decode_extra: impl Fn(&str) -> Vec<String>) -> Vec<(Stack, PathBuf, Pdctld)> {
    let hosts: Vec<(Stack, PathBuf, Pdctld)> = ["gpu-node-a", "gpu-node-b", "gpu-node-c"]
        .iter()
        .map(|h| {
            let model = vec!["--model-path".to_string(), "/models/dsv4".to_string()];
            let opts = StackOptions { prefill_args: model.clone(), decode_args: [model, decode_extra(h)].concat(), ..Default::default() };
            host_with(&etcd.url(), h, &opts)
        })
        .collect();
    let (_, ca, _) = &hosts[0];
    let names: Vec<String> = hosts.iter().map(|(_, c, _)| host_of(c)).collect();
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(ca);
        names.iter().all(|h| alive(&s, h))
    }));
    let shared = hosts[0].0.router.clone().expect("router");
    for (s, c, _) in &hosts[1..] {
        for w in [&s.prefill, &s.decode] {
            let body = match w.bootstrap_port {
                Some(b) => serde_json::json!({"url": w.url, "worker_type": "prefill", "bootstrap_port": b}),
                None => serde_json::json!({"url": w.url, "worker_type": "decode"}),
            };
            http_post(&format!("{}/workers", shared.url), &body);
        }
        let frag = c.parent().expect("dir").join("config.d/35-shared-gateway.toml");
        std::fs::write(frag, format!("[router]\nurl = \"{}\"\nmetrics_url = \"{}\"\n", shared.url, shared.metrics_url)).expect("shared gateway");
    }
    assert_eq!(hosts[0].0.wait_router_healthy(6, Duration::from_secs(60)).expect("router"), 6, "every host's workers in the shared gateway");
    hosts
}

/// `pdctl fleet weights` on three hosts behind **one shared gateway** (host a's: every host's
/// workers registered in it, every pdctld's `[router]` pointed at it, all load through it, so
/// any prefill pairs with any host's decode) under load: every host pauses, all load, all
/// continue only once every host serves the new weights — no request failed, none decoded KV of
/// another version (each decode's simulator counter), nothing restarted. A host whose decode
/// cannot load them makes every host load its previous weights back.
#[test]
fn fleet_weights_go_into_every_host_in_step_and_a_failed_host_puts_every_host_back() {
    for fail in [false, true] {
        let etcd = Etcd::start().expect("etcd");
        let hosts = three_hosts_behind_one_gateway(&etcd, |h| if fail && h == "gpu-node-c" { vec!["--sim-weights-fail".into()] } else { Vec::new() });
        let runs: Vec<(String, String)> =
            hosts.iter().map(|(s, _, _)| (s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d"))).collect();
        let (_, ca, da) = &hosts[0];
        let names: Vec<String> = hosts.iter().map(|(_, c, _)| host_of(c)).collect();
        let shared = hosts[0].0.router.clone().expect("router");
        let loads: Vec<pdctl_tests::Load> = (0..3).map(|_| pdctl_tests::Load::start(&shared.url, 8.0, 4)).collect();
        let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
        let out = std::process::Command::new(bin)
            .args(["fleet", "weights", "--model-path", "/models/dsv4-ft-1127", "--version", "ft-1127", "--json", "--socket"])
            .arg(&da.socket)
            .arg("--config")
            .arg(ca)
            .output()
            .expect("run pdctl");
        let mut failed = 0;
        for l in loads {
            failed += l.stop().1;
        }
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let last = lines.last().cloned().unwrap_or(Value::Null);
        assert_eq!(failed, 0, "every request was answered (fail = {fail})");
        let expected = if fail { "default" } else { "ft-1127" };
        for (i, (s, _, _)) in hosts.iter().enumerate() {
            for url in [&s.prefill.url, &s.decode.url] {
                let m = http_json(&format!("{url}/model_info"));
                assert_eq!(m["weight_version"], expected, "{} {url} (fail = {fail}): {last:#}", names[i]);
            }
            let metrics = http_text(&format!("{}/metrics", s.decode.url));
            let value =
                |name: &str| metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().last()).and_then(|v| v.parse::<f64>().ok());
            let (decoded, mixed) = (value("sglang_sim_pd_decoded_requests_total"), value("sglang_sim_pd_mixed_version_requests_total"));
            assert!(decoded.is_some_and(|d| d >= 10.0), "{}: PD requests were decoded: {decoded:?}", names[i]);
            assert_eq!(mixed, Some(0.0), "{}: no request decoded KV of another version", names[i]);
            assert_eq!((s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d")), runs[i], "nothing restarted");
        }
        if fail {
            assert_ne!(out.status.code(), Some(0), "{last:#}");
            assert_eq!(last["hosts"]["gpu-node-c"], "failed", "{last:#}");
            assert_eq!(last["result"], "failed", "{last:#}");
        } else {
            assert_eq!(out.status.code(), Some(0), "{lines:#?}");
            assert_eq!(last["result"], "succeeded", "{last:#}");
        }
    }
}

/// Three hosts behind **one shared gateway** (as in the weights test), each 1P1D, every worker
/// on one model; a change of the model the workers compute with (a quantization, in every
/// host's files: not loadable in place) rolled out by `pdctl fleet restart --rolling
/// --load-changes` under load through the gateway.
///
/// First the change on one host alone: refused in preflight, naming the other hosts' workers.
/// Then on all three: the dry run states the fleet switch and its capacity; hosts a and b (the
/// new group) restart theirs onto the new model out of the gateway while c serves, every host's
/// phase goes through etcd, the gateway switches, then c restarts its own. No PD request decodes
/// KV of the other model (every decode's simulator counter, watched over the whole rollout: a
/// restart starts a new count), every worker runs fp8 and was restarted once, and the switch's
/// window is on record.
///
/// Then the same with host b's new decode failing its start: b does not get to `verified`; c
/// never takes its workers out and keeps serving the old model, untouched, its part failing with
/// `switch_failed` naming b; a's restarted workers stay out of the gateway (held, on the new
/// model: only old-model workers are admitted at the end), its part failed (at `out`) or aborted
/// (b's failure reached it during its own restarts); no request failed and none was decoded from
/// KV of the other model.
/// And with b's files left unchanged: b says at once that it takes no part (its plain restart
/// goes on, on the old model, until the fleet halts), and c stops waiting for it — the same
/// outcome, no bound waited out.
#[test]
fn a_model_change_across_three_hosts_behind_one_gateway_is_switched_with_no_mixed_pair() {
    for case in ["switched", "b's new decode fails its start", "b's files unchanged"] {
        let fail = case != "switched";
        let etcd = Etcd::start().expect("etcd");
        let hosts = three_hosts_behind_one_gateway(&etcd, |_| Vec::new());
        for (_, c, _) in &hosts {
            // A whole group of hosts is out at once: two of each role fleet-wide.
            let frag = c.parent().expect("dir").join("config.d/36-switch-limits.toml");
            std::fs::write(frag, "[fleet.max_unavailable]\nprefill = 2\ndecode = 2\n").expect("limits");
        }
        let (_, ca, da) = &hosts[0];
        let names: Vec<String> = hosts.iter().map(|(_, c, _)| host_of(c)).collect();
        let shared = hosts[0].0.router.clone().expect("router");
        let change = |s: &Stack, host: &str| {
            if case == "b's files unchanged" && host == "gpu-node-b" {
                return;
            }
            for w in s.workers() {
                // The unit as the stack wrote it (the fleet's one model path), on fp8.
                let mut extra: Vec<String> = ["--model-path", "/models/dsv4", "--quantization", "fp8"].iter().map(|a| a.to_string()).collect();
                if case == "b's new decode fails its start" && host == "gpu-node-b" && w.role == "decode" {
                    extra.extend(["--sim-exit-code".to_string(), "1".to_string()]);
                }
                let exec = s.worker_unit(w, &StackOptions::default(), &extra);
                let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
                s.drop_in(&w.unit, "50-fp8", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
            }
        };
        if !fail {
            // One host alone: refused, naming the other hosts' workers it would pair with.
            change(&hosts[2].0, &names[2]);
            let (_, cc, dc) = &hosts[2];
            let r = pdctl_daemon(dc, cc, &["restart", "--rolling", "--load-changes", "--json"], LIMIT);
            assert_eq!(r.code, 2, "{:#}", r.summary);
            let f = &r.summary["failed"];
            assert_eq!(f["cause_code"], "mixed_versions", "{f:#}");
            assert!(f["cause"].as_str().is_some_and(|c| c.contains("gpu-node-a/")), "the other hosts' workers are named: {f:#}");
        }
        for (i, (s, _, _)) in hosts.iter().enumerate() {
            change(s, &names[i]);
        }
        if !fail {
            // The plan before anything starts.
            let (code, out, err) = pdctl(ca, &["restart", "--rolling", "--load-changes", "--dry-run", "--socket", &da.socket.display().to_string()]);
            assert!(
                code == 0
                    && err.contains("coherent fleet switch")
                    && err.contains("gpu-node-a, gpu-node-b restart all their PD workers")
                    && err.contains("1 of 3 prefills")
                    && out.contains("next: pdctl fleet restart --rolling --load-changes"),
                "{code}: {err}{out}"
            );
        }
        let runs: Vec<(String, String)> =
            hosts.iter().map(|(s, _, _)| (s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d"))).collect();
        let decodes: Vec<String> = hosts.iter().map(|(s, _, _)| s.decode.url.clone()).collect();
        let watch = pdctl_tests::MixedWatch::start(decodes);
        let load = pdctl_tests::Load::start(&shared.url, 10.0, 8);
        let (code, lines, err) = fleet_restart(ca, da, &["--load-changes"]);
        let (sent, failed) = load.stop();
        let mixed = watch.stop();
        let last = lines.last().cloned().unwrap_or(Value::Null);
        assert_eq!(mixed, 0.0, "no PD request decoded KV of the other model ({case})");
        // Each host's local record of its part.
        let record = |d: &Pdctld| {
            let (_, list) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
            let id = list["rollouts"]
                .as_array()
                .and_then(|a| a.iter().filter(|r| r["state"] != "running").max_by_key(|r| r["created_at"].as_u64()))
                .and_then(|r| r["id"].as_str())
                .map(String::from)
                .unwrap_or_else(|| panic!("a finished part: {list:#}"));
            pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "").1
        };
        if fail {
            assert_ne!(code, 0, "{case}: {last:#}");
            assert_eq!(last["result"], "failed", "{case}: {last:#}");
            assert_eq!(failed, 0, "{case}: c served throughout: every request was answered ({sent} sent)");
            let (sc, _, dc) = &hosts[2];
            assert_eq!((sc.show(P, "InvocationID").expect("p"), sc.show(D, "InvocationID").expect("d")), runs[2], "{case}: c was never restarted");
            // Only the old model in the gateway: a's restarts (all of them, or those done before
            // the abort) are out, held.
            let healthy = healthy_on(&shared.url);
            for url in &healthy {
                assert_ne!(http_json(&format!("{url}/server_info"))["quantization"], "fp8", "{case}: {url} of the new model is in the gateway: {healthy:?}");
            }
            let serves = |s: &Stack| healthy.contains(&s.prefill.url) && healthy.contains(&s.decode.url);
            assert!(serves(sc), "{case}: c's workers serve: {healthy:?}");
            assert_ne!(last["hosts"]["gpu-node-a"], "succeeded", "{case}: {last:#}");
            if case == "b's files unchanged" {
                // b restarted plainly onto what it ran (no model change; halted between units
                // once c failed): it serves the old model.
                assert!(serves(&hosts[1].0), "{case}: b's workers serve: {healthy:?}");
            }
            // c waited for b to be verified: b is named.
            let rec = record(dc);
            assert_eq!(rec["summary"]["failed"]["cause_code"], "switch_failed", "{case}: {rec:#}");
            assert!(rec["summary"]["failed"]["cause"].as_str().is_some_and(|c| c.contains("gpu-node-b")), "{case}: b is named: {rec:#}");
            continue;
        }
        assert_eq!(code, 0, "{last:#}\n{err}");
        assert_eq!(last["result"], "succeeded", "{last:#}");
        let mut window = 0u64;
        for (i, (s, _, d)) in hosts.iter().enumerate() {
            assert_ne!(s.show(P, "InvocationID").expect("p"), runs[i].0, "{}: the prefill was restarted", names[i]);
            assert_ne!(s.show(D, "InvocationID").expect("d"), runs[i].1, "{}: the decode was restarted", names[i]);
            for url in [&s.prefill.url, &s.decode.url] {
                assert_eq!(http_json(&format!("{url}/server_info"))["quantization"], "fp8", "{} {url}", names[i]);
            }
            let rec = record(d);
            assert_eq!(rec["lifecycle"]["state"], "succeeded", "{}: {rec:#}", names[i]);
            let restarts = |unit: &str| rec["events"].as_array().map_or(0, |a| a.iter().filter(|e| is(e, unit, "restart", "passed")).count());
            assert_eq!((restarts(P), restarts(D)), (1, 1), "{}: each restarted once: {rec:#}", names[i]);
            let notes: Vec<&str> = rec["notes"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
            assert!(notes.iter().any(|n| n.starts_with("coherent fleet switch")), "{}: {notes:#?}", names[i]);
            if i < 2 {
                let switched = notes.iter().find(|n| n.starts_with("switched the gateway from the old hosts' workers (gpu-node-c)"));
                let switched = switched.unwrap_or_else(|| panic!("{}: the window on record: {notes:#?}", names[i]));
                window = window.max(switched.split("for ").nth(1).and_then(|t| t.split(" ms").next()).and_then(|n| n.parse().ok()).expect("the window in ms"));
            }
        }
        println!("coherent fleet switch: no PD pair routable for {window} ms at most; {failed} of {sent} requests failed through the shared gateway over the rollout; {mixed} mixed");
    }
}

fn http_post(url: &str, body: &Value) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let status = rt.block_on(async { pdctl_tests::http().post(url).json(body).send().await.expect("POST").status() });
    assert!(status.is_success(), "POST {url}: {status}");
}

fn http_json(url: &str) -> Value {
    serde_json::from_str(&http_text(url)).expect("JSON")
}

fn http_text(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async { pdctl_tests::http().get(url).send().await.expect("GET").text().await.expect("body") })
}
