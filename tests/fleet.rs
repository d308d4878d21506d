//! The fleet's coordination: hosts through a real etcd (Debian's etcd-server), each host a sandbox
//! (real systemd, journald, D-Bus, the real router) with its own pdctld. Slots are never
//! over-admitted (checked over etcd's revision history), a waiting host says who holds the slot,
//! etcd down touches nothing, a dead host's slot stays held until its pdctld returns or an
//! operator releases it, a pause freezes grants, a rollout that lost etcd is resumed; TLS, the
//! unit's address allow-list and two gateway replicas.

use std::path::PathBuf;
use std::time::Duration;

use pdctl_tests::fleet_hosts::*;
use pdctl_tests::pdctl_sandbox::etcd::Etcd;
use pdctl_tests::pdctl_sandbox::stack::StackOptions;
use pdctl_tests::{assert_recorded, live_daemon, pdctl_daemon, raw_api, RouterWatch};
use serde_json::Value;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

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

/// Input from other hosts is decoded and checked, never trusted: requests written to etcd that
/// name this host with a `created_at` a day in the future, or a canary that is not one of their
/// hosts, are each answered `not_started` saying why — none is waited on (250 such requests
/// each started a wait of up to 12 h on its own etcd connection: the descriptors ran out).
#[test]
fn forged_fleet_requests_naming_this_host_are_skipped_and_said_never_waited_on() {
    let etcd = Etcd::start().expect("etcd");
    let (stack, config, d) = host(&etcd.url(), "gpu-node-a");
    assert!(until(Duration::from_secs(30), || alive(&fleet_status(&config), "gpu-node-a")), "host a is alive in etcd");
    let p0 = stack.show(P, "InvocationID").expect("p");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let mut ids = Vec::new();
    for i in 0..30 {
        let (id, canary, created_at) = if i % 2 == 0 { (format!("f{i}"), None, now + 86_400) } else { (format!("f{i}"), Some("ghost"), now) };
        let v = serde_json::json!({"id": id, "hosts": ["gpu-node-a"], "allow_outage": true, "by": "uid 0 on elsewhere", "canary": canary, "created_at": created_at});
        let key = pdctl_core::fleet::rollout_key("t", &id);
        let put = std::process::Command::new("etcdctl").args(["--endpoints", &etcd.url(), "put", &key, &v.to_string()]).output().expect("etcdctl");
        assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));
        ids.push((id, canary.is_some()));
    }
    let summary = |id: &str| -> Value {
        let key = pdctl_core::fleet::host_summary_key("t", id, "gpu-node-a");
        let o = std::process::Command::new("etcdctl").args(["--endpoints", &etcd.url(), "get", &key, "--print-value-only"]).output().expect("etcdctl");
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    };
    assert!(until(Duration::from_secs(60), || ids.iter().all(|(id, _)| !summary(id).is_null())), "every request answered");
    for (id, ghost) in &ids {
        let s = summary(id);
        assert_eq!(s["result"], "not_started", "{id}: {s}");
        let why = s["why"].as_str().unwrap_or_default();
        let expected = if *ghost { "is not one of its hosts" } else { "is in the future" };
        assert!(why.contains(expected), "{id}: {why}");
    }
    assert_eq!(stack.show(P, "InvocationID").expect("p"), p0, "nothing restarted");
    assert_eq!(raw_api(&d.socket, "GET", "/v1/ping", "").0, 200, "pdctld answers");
}
