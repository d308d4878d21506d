//! FleetLock as Zincati speaks it: only root and the update agent's account may drain the host
//! through it, and update agents on three hosts behind one gateway reboot one host at a time on
//! the fleet's slots with no failed request (beside the baseline: three agents rebooting at will).

use super::*;

/// A FleetLock request sent by the local account `uid` (`setpriv`, as a process of that user
/// would send it): status and body.
fn fleetlock_as(uid: u32, base: &str, what: &str, id: &str, group: &str, header: bool) -> (u16, String) {
    let script = "import sys, json, urllib.request, urllib.error\n\
url, idv, grp, hdr = sys.argv[1:5]\n\
req = urllib.request.Request(url, data=json.dumps({'client_params': {'id': idv, 'group': grp}}).encode(), method='POST')\n\
req.add_header('content-type', 'application/json')\n\
if hdr == '1': req.add_header('fleet-lock-protocol', 'true')\n\
try:\n    r = urllib.request.urlopen(req, timeout=60); print(r.status); print(r.read().decode())\n\
except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n";
    let uid = uid.to_string();
    let o = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            &uid,
            "--regid",
            &uid,
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            script,
            &format!("{base}/v1/{what}"),
            id,
            group,
            if header { "1" } else { "0" },
        ])
        .output()
        .expect("setpriv python3");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (code, body) = out.split_once('\n').unwrap_or((&out, ""));
    (code.trim().parse().unwrap_or_else(|_| panic!("no status: {out}{}", String::from_utf8_lossy(&o.stderr))), body.trim().to_string())
}

/// The FleetLock protocol carries no credential, and the endpoint listens on loopback: any local
/// account could drain the host (three requests as `nobody`, the refusals telling it the id and
/// then the group). Only root and the accounts in `[maintenance] fleetlock_users` may ask — told
/// by the kernel's socket table — and everyone else is refused 403 without either being named:
/// nothing stops, nothing is recorded. Named there, the same account drains the host, and the
/// record says its uid.
#[test]
fn only_root_and_the_update_agents_account_may_drain_the_host_through_fleetlock() {
    let (s, config, d) = pdctl_tests::stack_with_pdctld();
    let base = with_fleetlock(&config);
    let ours = config.parent().expect("dir").join("config.d/41-agent.toml");
    std::fs::write(&ours, "[maintenance]\nfleetlock_id = \"node-a\"\n").expect("fragment");
    s.sandbox.systemctl(&["restart", &d.unit]).expect("restart pdctld: the endpoint opens at its start");
    let before = (s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d"));
    const NOBODY: u32 = 65534;
    for (id, group, header) in [("x", "y", false), ("someone", "default", true), ("node-a", "default", true)] {
        let (code, body) = fleetlock_as(NOBODY, &base, "pre-reboot", id, group, header);
        assert_eq!(code, 403, "{id} {group}: {body}");
        assert!(body.contains("\"forbidden\"") && body.contains("uid 65534") && !body.contains("node-a") && !body.contains("\"default\""), "{body}");
    }
    assert_eq!((s.show(P, "InvocationID").expect("p"), s.show(D, "InvocationID").expect("d")), before, "nothing stopped");
    assert!(host_status(&d)["maintenance"].is_null(), "nothing recorded");
    let (_, list) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    assert!(!list.to_string().contains("host_drain"), "no drain: {list:#}");

    // The update agent's account, named: it drains the host.
    std::fs::write(&ours, "[maintenance]\nfleetlock_id = \"node-a\"\nfleetlock_users = [\"nobody\"]\n").expect("fragment");
    let (code, body) = fleetlock_as(NOBODY, &base, "pre-reboot", "node-a", "default", true);
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("host drain") && body.contains("started"), "{body}");
    assert!(until(LIMIT, || host_status(&d)["maintenance"]["phase"] == "down"), "drained: {:#}", host_status(&d));
    let rec = newest(&d);
    assert_eq!((rec["kind"].as_str(), rec["started_by"]["uid"].as_u64()), (Some("host_drain"), Some(u64::from(NOBODY))), "{rec:#}");
    assert_eq!(rec["started_by"]["fleetlock"], "node-a", "{rec:#}");
}

/// `[maintenance]` with the FleetLock endpoint on a free port of this host: its base URL.
fn with_fleetlock(config: &Path) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let frag = config.parent().expect("dir").join("config.d/40-maintenance.toml");
    std::fs::write(frag, format!("[maintenance]\nfleetlock_listen = \"127.0.0.1:{port}\"\n")).expect("maintenance");
    format!("http://127.0.0.1:{port}")
}

/// What the load saw, per role, as the gateway lists its workers: the fewest ready at once.
struct Watch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, usize)>,
}

impl Watch {
    fn start(router: String, prefills: Vec<String>, decodes: Vec<String>) -> Watch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut p, mut d) = (usize::MAX, usize::MAX);
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let healthy = healthy_on(&router);
                p = p.min(prefills.iter().filter(|u| healthy.contains(u)).count());
                d = d.min(decodes.iter().filter(|u| healthy.contains(u)).count());
                std::thread::sleep(Duration::from_millis(200));
            }
            (p, d)
        });
        Watch { stop, thread }
    }

    fn stop(self) -> (usize, usize) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("watch")
    }
}

/// Three hosts × 1P1D behind one gateway, load through it: an update agent on every host asks
/// pre-reboot at once; the fleet's budget (one worker of each role) lets one host drain at a
/// time, each reboots and asks steady-state, and the next goes. No request fails and every role
/// keeps two of its three workers; each host's time from its first pre-reboot to its 200 at
/// steady-state is printed. The baseline in the same run: three agents rebooting at will.
#[test]
fn update_agents_on_three_hosts_reboot_one_host_at_a_time_through_fleetlock_with_no_failed_request() {
    let etcd = Etcd::start().expect("etcd");
    let hosts = three_hosts_behind_one_gateway(&etcd, |_| Vec::new());
    let names: Vec<String> = hosts.iter().map(|(_, c, _)| host_of(c)).collect();
    let shared = hosts[0].0.router.clone().expect("router");
    let bases: Vec<String> = hosts.iter().map(|(_, c, _)| with_fleetlock(c)).collect();
    for (_, c, _) in &hosts {
        // A host waits for the slots through another host's whole maintenance (its reboot and
        // every gate after it).
        std::fs::write(c.parent().expect("dir").join("config.d/42-slot-wait.toml"), "[fleet]\nslot_timeout = \"10m\"\n").expect("slot wait");
    }
    // The endpoint is opened at pdctld's start.
    for (s, _, d) in &hosts {
        s.sandbox.systemctl(&["restart", &d.unit]).expect("restart pdctld");
    }
    let prefills: Vec<String> = hosts.iter().map(|(s, _, _)| s.prefill.url.clone()).collect();
    let decodes: Vec<String> = hosts.iter().map(|(s, _, _)| s.decode.url.clone()).collect();

    // A foreign id, a wrong group, a missing header: refused, nothing started.
    assert_eq!(fleetlock(&bases[0], "pre-reboot", "someone-else", "t").0, 403);
    assert_eq!(fleetlock(&bases[0], "pre-reboot", &names[0], "default").0, 403);
    assert_eq!(fleetlock(&bases[0], "steady-state", &names[0], "t").0, 200, "no lock held: steady-state is 200");

    let watch = Watch::start(shared.url.clone(), prefills.clone(), decodes.clone());
    let load = pdctl_tests::Load::start(&shared.url, 10.0, 8);
    let t0 = std::time::Instant::now();
    let mut took: Vec<Option<Duration>> = vec![None; 3];
    let mut down: Vec<bool> = vec![false; 3];
    let mut asked: Vec<Option<std::time::Instant>> = vec![None; 3];
    let mut kinds: Vec<String> = Vec::new();
    while took.iter().any(Option::is_none) && t0.elapsed() < Duration::from_secs(1200) {
        for i in 0..3 {
            if took[i].is_some() {
                continue;
            }
            let (s, _, d) = &hosts[i];
            if !down[i] {
                let (code, body) = fleetlock(&bases[i], "pre-reboot", &names[i], "t");
                asked[i].get_or_insert_with(std::time::Instant::now);
                if code == 200 {
                    down_and_seen_by_the_fleet(d, &names[i], &hosts[0].1);
                    reboot(s, d);
                    down[i] = true;
                } else if let Some(k) = body["kind"].as_str() {
                    kinds.push(format!("{}: {k}", names[i]));
                }
            } else {
                let (code, _) = fleetlock(&bases[i], "steady-state", &names[i], "t");
                if code == 200 {
                    took[i] = asked[i].map(|a| a.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let (sent, failed) = load.stop();
    let (min_p, min_d) = watch.stop();
    assert!(took.iter().all(Option::is_some), "every host rebooted and came back: {took:?}; answers seen: {kinds:?}");
    assert!(kinds.iter().any(|k| k.ends_with("waiting_for_slot")), "a host waited its turn for the fleet's slots: {kinds:?}");
    assert_eq!(failed, 0, "no request failed through the gateway ({sent} sent)");
    assert!(min_p >= 2 && min_d >= 2, "never fewer than 2 of 3 per role ready: prefills {min_p}, decodes {min_d}");
    for (_, _, d) in &hosts {
        assert!(host_status(d)["maintenance"].is_null(), "every host back in service, its slots given back");
    }
    println!(
        "fleetlock, three hosts: {failed} of {sent} requests failed; fewest ready prefills {min_p}, decodes {min_d}; per host (pre-reboot to steady-state): {}",
        took.iter().zip(&names).map(|(t, h)| format!("{h} {:.0} s", t.unwrap_or_default().as_secs_f64())).collect::<Vec<_>>().join(", ")
    );

    // The baseline, same hosts, same load: three agents reboot at will (no pdctl).
    reboot_at_will(&hosts, &shared.url, prefills, decodes);
}

/// A host FleetLock let reboot: down (drained and stopped) before its 200, and the fleet sees it
/// — in maintenance in its liveness value, holding its slots (`config`: any host's).
fn down_and_seen_by_the_fleet(d: &Pdctld, name: &str, config: &std::path::Path) {
    let st = host_status(d);
    assert_eq!(st["maintenance"]["phase"], "down", "{name}: 200 only once drained and stopped: {st:#}");
    let seen = until(Duration::from_secs(15), || {
        let f = fleet_status(config);
        let listed = f["hosts"].as_array().is_some_and(|hs| hs.iter().any(|h| h["host"] == name && h["maintenance"]["phase"] == "down"));
        listed && f["slots"].to_string().contains("(host maintenance)")
    });
    assert!(seen, "{name} in maintenance in pdctl fleet status: {:#}", fleet_status(config));
}

/// The baseline of the FleetLock test, printed: every host's workers stopped at once (three
/// update agents rebooting at will, no pdctl), down for a short reboot, started again.
fn reboot_at_will(
    hosts: &[(pdctl_tests::pdctl_sandbox::stack::Stack, std::path::PathBuf, Pdctld)],
    gateway: &str,
    prefills: Vec<String>,
    decodes: Vec<String>,
) {
    let watch = Watch::start(gateway.to_string(), prefills, decodes);
    let load = pdctl_tests::Load::start(gateway, 10.0, 8);
    for (s, _, _) in hosts {
        for u in [P, D] {
            s.sandbox.systemctl(&["stop", "--no-block", u]).expect("stop");
        }
    }
    // The reboot itself (a real one takes minutes; the workers are down all that time).
    std::thread::sleep(Duration::from_secs(10));
    for (s, _, _) in hosts {
        for u in [P, D] {
            s.sandbox.systemctl(&["start", "--no-block", u]).expect("start");
        }
    }
    let back = hosts[0].0.wait_router_healthy(6, Duration::from_secs(180)).unwrap_or(0);
    let (sent, failed) = load.stop();
    let (min_p, min_d) = watch.stop();
    println!("baseline, three agents rebooting at will: {failed} of {sent} requests failed; fewest ready prefills {min_p}, decodes {min_d}; {back} of 6 back");
}
