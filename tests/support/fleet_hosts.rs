//! The fleet's hosts for the fleet tests: each host a sandbox (real systemd, journald, D-Bus, the
//! real router) with its own pdctld in fleet `t` of a real etcd, and the commands and reads the
//! tests make of them (fleet status, slot holders over etcd's history, a fleet rollout followed
//! to its end, a long history seeded into etcd); and another host's workers on one sandbox: a
//! pdctld config that knows some workers only, a worker taken out of the gateway or put back.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pdctl_sandbox::etcd::Etcd;
use pdctl_sandbox::stack::{Pdctld, Stack, StackOptions};
use serde_json::Value;

/// Whether event `e` is `unit`'s `step` with `status`.
pub fn is(e: &Value, unit: &str, step: &str, status: &str) -> bool {
    e["unit"] == unit && e["step"] == step && e["status"] == status
}

/// A host of fleet `t` named `host`, using `etcd`.
pub fn host(etcd: &str, host: &str) -> (Stack, PathBuf, Pdctld) {
    host_with(etcd, host, &StackOptions::default())
}

/// [`host`] with these stack options.
pub fn host_with(etcd: &str, host: &str, opts: &StackOptions) -> (Stack, PathBuf, Pdctld) {
    let (stack, config, d) = crate::stack_with_pdctld_opts(opts);
    let frag = config.parent().expect("dir").join("config.d/30-fleet.toml");
    std::fs::write(
        &frag,
        format!("[fleet]\netcd = [\"{etcd}\"]\nname = \"t\"\nhost = \"{host}\"\nslot_timeout = \"2m\"\n[fleet.max_unavailable]\nprefill = 1\ndecode = 1\n"),
    )
    .expect("fleet fragment");
    (stack, config, d)
}

/// `pdctl ARGS --config CONFIG`: exit code and stdout (one JSON document with --json).
pub fn pdctl(config: &Path, args: &[&str]) -> (i32, String, String) {
    let bin = crate::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let out = std::process::Command::new(bin).args(args).arg("--config").arg(config).output().expect("run pdctl");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `pdctl fleet status --json` of the host whose config is `config`.
pub fn fleet_status(config: &Path) -> Value {
    let (code, out, err) = pdctl(config, &["fleet", "status", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(out.trim()).expect("fleet status JSON")
}

/// The holders of `role`'s slot in a fleet status.
pub fn holders(status: &Value, role: &str) -> Vec<String> {
    status["slots"][role]["holders"].as_array().map(|a| a.iter().filter_map(|h| h["holder"].as_str().map(String::from)).collect()).unwrap_or_default()
}

/// Whether `host` is alive (its liveness key) in a fleet status.
pub fn alive(status: &Value, host: &str) -> bool {
    status["hosts"].as_array().is_some_and(|a| a.iter().any(|h| h["host"] == host))
}

/// Poll `f` (an HTTP or etcd state with no events) until it holds, at most `deadline`.
pub fn until(deadline: Duration, f: impl FnMut() -> bool) -> bool {
    crate::until(deadline, Duration::from_millis(250), f)
}

/// The most holders the role's slot ever had, over every revision etcd kept.
pub fn max_holders_ever(etcd: &str, role: &str) -> (usize, Vec<Vec<String>>) {
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

/// `pdctl fleet restart` from host a's CLI and pdctld; the JSON lines it printed and its exit code.
pub fn fleet_restart(config: &Path, d: &Pdctld, extra: &[&str]) -> (i32, Vec<Value>, String) {
    fleet_restart_watching(config, d, extra, |_| {})
}

/// [`fleet_restart`], calling `on_line` with each line as it arrives (to act on an event).
pub fn fleet_restart_watching(config: &Path, d: &Pdctld, extra: &[&str], mut on_line: impl FnMut(&Value)) -> (i32, Vec<Value>, String) {
    let mut args = vec!["fleet", "restart", "--rolling", "--json", "--socket"];
    let socket = d.socket.display().to_string();
    args.push(&socket);
    args.extend_from_slice(extra);
    let bin = crate::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl built");
    let mut child = std::process::Command::new(bin)
        .args(&args)
        .arg("--config")
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pdctl");
    let out = child.stdout.take().expect("stdout");
    let lines = crate::line_reader(out, |l| serde_json::from_str::<Value>(&l).ok());
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(420);
    while let Ok(v) = lines.recv_timeout(end.saturating_duration_since(Instant::now())) {
        on_line(&v);
        seen.push(v);
    }
    // A fleet rollout still followed at the deadline is ended here: the test fails, never hangs.
    if child.try_wait().ok().flatten().is_none() {
        let _ = child.kill();
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
pub fn fleet_restart_under_load(hosts: &[(Stack, PathBuf, Pdctld)], extra: &[&str]) -> (i32, Vec<Value>, String) {
    fleet_restart_under_load_watching(hosts, extra, |_| {})
}

/// [`fleet_restart_under_load`], calling `on_line` with each line as it arrives.
pub fn fleet_restart_under_load_watching(hosts: &[(Stack, PathBuf, Pdctld)], extra: &[&str], on_line: impl FnMut(&Value)) -> (i32, Vec<Value>, String) {
    let (_, ca, da) = &hosts[0];
    let names: Vec<String> = hosts.iter().map(|(_, c, _)| host_of(c)).collect();
    assert!(until(Duration::from_secs(30), || {
        let s = fleet_status(ca);
        names.iter().all(|h| alive(&s, h))
    }));
    for (s, _, _) in hosts {
        assert_eq!(s.wait_router_healthy(2, Duration::from_secs(60)).expect("router"), 2);
    }
    let loads: Vec<crate::Load> = hosts.iter().map(|(s, _, _)| crate::Load::start(&s.router.as_ref().expect("router").url, 8.0, 4)).collect();
    let out = fleet_restart_watching(ca, da, extra, on_line);
    for l in loads {
        l.stop();
    }
    out
}

/// The host name a host's config gives itself (`[fleet] host` in its fragment).
pub fn host_of(config: &Path) -> String {
    let frag = std::fs::read_to_string(config.parent().expect("dir").join("config.d/30-fleet.toml")).expect("fleet fragment");
    frag.lines().find_map(|l| l.strip_prefix("host = \"")).and_then(|r| r.strip_suffix('"')).expect("host").to_string()
}

/// Fleet `t`'s history as a busy fleet has it: `n` finished fleet rollouts of `hosts` (each
/// request and every host's summary), each request with a change ticket's text as its reason
/// (900 bytes), so that the requests alone are more than etcd-client's 4 MB answer limit when
/// read as one range; and one liveness value that is not JSON (a corrupt host).
pub fn seed_history(etcd: &str, hosts: &[&str], n: u64) {
    use pdctl_core::fleet::{host_summary_key, rollout_key, FleetRollout, HostResult, HostSummary};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let e = pdctl_fleet::Etcd::connect(&[etcd.to_string()], None, None, Duration::from_secs(5)).await.expect("etcd");
        let put = |key: String, value: Vec<u8>| pdctl_fleet::Change { key, expect: -1, value: Some(Some(value)) };
        let reason = "CHG-4711: raise --max-running-requests on the decode after the capacity review; ".repeat(11);
        let mut batch = Vec::new();
        for i in 0..n {
            let at = 1_700_000_000 + i;
            let id = format!("f{at}");
            let r = FleetRollout {
                id: id.clone(),
                hosts: hosts.iter().map(|h| h.to_string()).collect(),
                allow_outage: false,
                by: "uid 0 on gpu-node-a".into(),
                reason: Some(reason.clone()),
                canary: None,
                created_at: at,
                units: vec![],
                repair_of: None,
                load_changes: false,
                bake_secs: None,
                weights: None,
            };
            batch.push(put(rollout_key("t", &id), serde_json::to_vec(&r).expect("request")));
            for h in hosts {
                let s = HostSummary {
                    host: h.to_string(),
                    result: HostResult::Succeeded,
                    local_id: Some(format!("r{at}")),
                    summary: None,
                    why: None,
                    finished_at: Some(at + 60),
                };
                batch.push(put(host_summary_key("t", &id, h), serde_json::to_vec(&s).expect("summary")));
            }
            if batch.len() >= 90 || i + 1 == n {
                assert!(e.cas(&batch).await.expect("seed"), "seeded");
                batch.clear();
            }
        }
        e.put("/pdctl/t/hosts/gpu-node-z", b"{\"host\": \"gpu-node-z\", \"work".to_vec()).await.expect("garbage liveness");
    });
}

/// How many fleet rollout requests etcd holds for fleet `t`.
pub fn requests_in_etcd(etcd: &str) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let e = pdctl_fleet::Etcd::connect(&[etcd.to_string()], None, None, Duration::from_secs(5)).await.expect("etcd");
        e.get_prefix("/pdctl/t/requests/").await.expect("requests").len()
    })
}

/// Healthy workers listed by the gateway at `url`.
pub fn healthy_on(url: &str) -> Vec<String> {
    let Ok((200, body)) = crate::pdctl_sandbox::stack::http_get(&format!("{url}/workers")) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["workers"]
        .as_array()
        .map(|a| a.iter().filter(|w| w["is_healthy"] == true).filter_map(|w| w["url"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// The stale pairs a pair event names.
pub fn pairs_stale(e: &Value) -> Vec<String> {
    e["detail"]["stale"].as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default()
}

/// Three hosts of one fleet behind **one shared gateway** (host a's: every host's workers
/// registered in it, every pdctld's `[router]` pointed at it, so any prefill pairs with any
/// host's decode), every worker on one model path (the sandbox's own directory differs per
/// host, and the simulator tells models apart by path); `extra`: the decode's extra arguments
/// of a host. Returns once every host is alive in etcd and the gateway admits all six workers.
pub fn three_hosts_behind_one_gateway(etcd: &Etcd, decode_extra: impl Fn(&str) -> Vec<String>) -> Vec<(Stack, PathBuf, Pdctld)> {
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

/// POST `body` as JSON to `url`; it must succeed.
pub fn http_post(url: &str, body: &Value) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let status = rt.block_on(async { crate::http().post(url).json(body).send().await.expect("POST").status() });
    assert!(status.is_success(), "POST {url}: {status}");
}

/// GET `url` as JSON.
pub fn http_json(url: &str) -> Value {
    serde_json::from_str(&http_text(url)).expect("JSON")
}

/// GET `url` as text.
pub fn http_text(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async { crate::http().get(url).send().await.expect("GET").text().await.expect("body") })
}

/// pdctld's config `text` with only the `[[worker]]` tables of `units`: the others then stand
/// for another host's workers behind the same gateway.
pub fn config_with_only(text: &str, units: &[&str]) -> String {
    let first = text.find("[[worker]]").unwrap_or(text.len());
    let (head, rest) = text.split_at(first);
    let tail_at = rest.find("\n[rollout]").map(|i| i + 1).unwrap_or(rest.len());
    let (workers, tail) = rest.split_at(tail_at);
    let kept: String =
        workers.split("[[worker]]").filter(|b| units.iter().any(|u| b.contains(&format!("unit = \"{u}\"")))).map(|b| format!("[[worker]]{b}")).collect();
    format!("{head}{kept}{tail}")
}

/// Take `w` out of smg at `router` (`DELETE /workers/{id}`, waited until it is no longer
/// listed) or put it back (`POST /workers` with its type and bootstrap port).
pub fn gateway_worker(router: &str, w: &crate::pdctl_sandbox::stack::Worker, admit: bool) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let listed = || {
        let (_, b) = crate::pdctl_sandbox::stack::http_get(&format!("{router}/workers")).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&b).unwrap_or(serde_json::Value::Null);
        v["workers"].as_array().and_then(|ws| ws.iter().find(|x| x["url"] == w.url.as_str()).cloned())
    };
    if admit {
        let mut body = serde_json::json!({"url": w.url, "worker_type": w.role});
        if let Some(b) = w.bootstrap_port {
            body["bootstrap_port"] = serde_json::json!(b);
        }
        let status = rt.block_on(async { crate::http().post(format!("{router}/workers")).json(&body).send().await.map(|r| r.status().as_u16()).unwrap_or(0) });
        assert!((200..300).contains(&status), "smg took {} back: {status}", w.url);
    } else {
        let id = listed().and_then(|x| x["id"].as_str().map(String::from)).expect("listed");
        let status = rt.block_on(async { crate::http().delete(format!("{router}/workers/{id}")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) });
        assert!((200..300).contains(&status), "smg let {} go: {status}", w.url);
        assert!(crate::until(Duration::from_secs(30), Duration::from_millis(100), || listed().is_none()), "smg no longer lists {}", w.url);
    }
}
