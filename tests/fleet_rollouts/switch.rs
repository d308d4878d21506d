//! A model change across three hosts behind one gateway, switched as one coherent group with
//! no mixed pair.

use super::*;

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
        let change = |s: &Stack, host: &str| to_fp8(case, s, host);
        if !fail {
            change(&hosts[2].0, &names[2]);
            one_host_alone_is_refused(&hosts[2]);
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
        let record = finished_part;
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
        let window = assert_switched(&hosts, &runs, &names);
        println!("coherent fleet switch: no PD pair routable for {window} ms at most; {failed} of {sent} requests failed through the shared gateway over the rollout; {mixed} mixed");
    }
}

/// One host changed alone: its restart is refused, naming the other hosts' workers it would
/// pair with.
fn one_host_alone_is_refused((_, config, d): &(Stack, PathBuf, Pdctld)) {
    let r = pdctl_daemon(d, config, &["restart", "--rolling", "--load-changes", "--json"], LIMIT);
    assert_eq!(r.code, 2, "{:#}", r.summary);
    let f = &r.summary["failed"];
    assert_eq!(f["cause_code"], "mixed_versions", "{f:#}");
    assert!(f["cause"].as_str().is_some_and(|c| c.contains("gpu-node-a/")), "the other hosts' workers are named: {f:#}");
}

/// Change every worker unit of `s` (host `host`) to the same model on fp8 by a drop-in, as `case`
/// asks (b's decode made to fail its start, or b left unchanged).
fn to_fp8(case: &str, s: &Stack, host: &str) {
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
}

/// A host's local record of its last finished part.
fn finished_part(d: &Pdctld) -> Value {
    let (_, list) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    let id = list["rollouts"]
        .as_array()
        .and_then(|a| a.iter().filter(|r| r["state"] != "running").max_by_key(|r| r["created_at"].as_u64()))
        .and_then(|r| r["id"].as_str())
        .map(String::from)
        .unwrap_or_else(|| panic!("a finished part: {list:#}"));
    pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "").1
}

/// Every host switched: both workers restarted once onto fp8, each record succeeded with the
/// switch's notes; the longest window (ms) with no PD pair routable, from the first half's notes.
fn assert_switched(hosts: &[(Stack, PathBuf, Pdctld)], runs: &[(String, String)], names: &[String]) -> u64 {
    let record = finished_part;
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
    window
}
