//! The fleet's slots, requests and bakes against an in-memory store that behaves as etcd's
//! transactions do.

use super::*;
use crate::ports::{CasChange, Coordinator, FleetFailure, KvEntry, Write};
use std::collections::BTreeMap;

fn hold(h: &str, url: &str, token: &str) -> Hold {
    Hold { holder: h.into(), url: url.into(), token: token.into(), since: 0, rollout: "r1".into() }
}

#[test]
fn decide_grants_within_the_budget_counting_unhealthy_workers_and_finds_its_own_hold() {
    let mut s = Semaphore::default();
    let a = hold("a/p.service", "http://a:1", "t1");
    assert_eq!(s.decide(&a, 1, &[]), Decision::Grant);
    s.holders.push(a.clone());
    let b = hold("b/p.service", "http://b:1", "t2");
    assert!(matches!(s.decide(&b, 1, &[]), Decision::Wait { .. }));
    // A retry of a's acquisition finds its hold (never a second one).
    assert_eq!(s.decide(&hold("a/p.service", "http://a:1", "t9"), 1, &[]), Decision::AlreadyHeld(a.clone()));
    // An unhealthy worker holding no slot counts; one holding a slot is not counted twice;
    // the asking worker itself being unhealthy does not block it.
    assert!(matches!(s.decide(&b, 2, &["http://c:1".into()]), Decision::Wait { .. }));
    assert_eq!(s.decide(&b, 2, &["http://a:1".into()]), Decision::Grant);
    assert_eq!(s.decide(&b, 2, &["http://b:1".into()]), Decision::Grant);
}

#[test]
fn workers_a_host_reports_not_running_count_as_down_by_role() {
    let w = |unit: &str, role: &str, state: &str| HostWorker {
        unit: unit.into(),
        url: format!("http://{unit}"),
        role: role.into(),
        state: state.into(),
        kv_usage: None,
    };
    let h = HostState {
        host: "b".into(),
        version: "0".into(),
        rollout: None,
        workers: vec![w("p", "prefill", "active/running"), w("d", "decode", "activating/auto-restart"), w("d2", "decode", "failed/failed")],
        self_restarts: Vec::new(),
        maintenance: None,
        updated_at: 0,
    };
    let down = down_workers(&[h]);
    assert_eq!(down.get("decode"), Some(&vec!["http://d".to_string(), "http://d2".to_string()]));
    assert_eq!(down.get("prefill"), None);
}

#[tokio::test]
async fn lifting_a_pause_records_when_so_its_restarts_make_no_storm_again() {
    let c = Mem::default();
    assert_eq!(storm_since(&c, "t").await.unwrap(), 0);
    let p = Pause { by: "pdctld on b".into(), reason: "restart storm".into(), at: 1 };
    set_pause(&c, "t", Some(&p)).await.unwrap();
    assert_eq!(storm_since(&c, "t").await.unwrap(), 0, "setting a pause does not move it");
    let before = now_secs();
    set_pause(&c, "t", None).await.unwrap();
    assert!(storm_since(&c, "t").await.unwrap() >= before);
    assert_eq!(paused(&c, "t").await.unwrap(), None);
}

#[test]
fn a_late_release_with_an_old_token_frees_nothing() {
    let mut s = Semaphore { holders: vec![hold("a/p.service", "u", "new")] };
    assert!(!s.release("a/p.service", "old"));
    assert_eq!(s.holders.len(), 1);
    assert!(s.release("a/p.service", "new"));
    assert!(s.holders.is_empty());
}

#[test]
fn limits_disagreement_names_the_role_and_both_values() {
    let etcd = Limits { max_unavailable: [("prefill".to_string(), 1), ("decode".to_string(), 1)].into() };
    let local = Limits { max_unavailable: [("prefill".to_string(), 2), ("decode".to_string(), 1)].into() };
    assert_eq!(etcd.disagreement(&local), Some(LimitsDisagree { role: "prefill".into(), etcd: "1".into(), local: "2".into() }));
    assert_eq!(etcd.disagreement(&etcd.clone()), None);
}

#[test]
fn the_waiting_sentence_names_holder_and_time() {
    let h = Hold { since: 1_764_511_331, ..hold("gpu-node-b/sglang-prefill.service", "u", "t") };
    assert_eq!(
        waiting_sentence("prefill", std::slice::from_ref(&h), &[]),
        "waiting for a prefill slot: held by gpu-node-b/sglang-prefill.service since 14:02:11"
    );
    let m = Hold { rollout: crate::engine::host::maintenance_hold("r1764511330"), ..h };
    assert_eq!(
        waiting_sentence("prefill", &[m], &[]),
        "waiting for a prefill slot: held by gpu-node-b/sglang-prefill.service (its host is in maintenance) since 14:02:11"
    );
}

/// An in-memory store with etcd's compare-and-swap semantics (unit tests only; the real
/// etcd is in tests/fleet.rs).
/// The store's revision, and each key's value with its mod revision.
type Store = (i64, BTreeMap<String, (Vec<u8>, i64)>);

#[derive(Default)]
struct Mem {
    kv: std::sync::Mutex<Store>,
}

impl Coordinator for Mem {
    fn get<'a>(&'a self, key: &'a str) -> crate::ports::BoxFut<'a, Result<Option<KvEntry>, FleetFailure>> {
        let g = self.kv.lock().unwrap();
        let r = g.1.get(key).map(|(v, r)| KvEntry { key: key.into(), value: v.clone(), mod_revision: *r });
        Box::pin(async move {
            tokio::task::yield_now().await;
            Ok(r)
        })
    }
    fn get_prefix<'a>(&'a self, prefix: &'a str) -> crate::ports::BoxFut<'a, Result<Vec<KvEntry>, FleetFailure>> {
        let g = self.kv.lock().unwrap();
        let r = g.1.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, (v, r))| KvEntry { key: k.clone(), value: v.clone(), mod_revision: *r }).collect();
        Box::pin(async move { Ok(r) })
    }
    fn cas(&self, changes: Vec<CasChange>) -> crate::ports::BoxFut<'_, Result<bool, FleetFailure>> {
        let mut g = self.kv.lock().unwrap();
        let ok = changes.iter().all(|c| c.expect < 0 || g.1.get(&c.key).map(|(_, r)| *r).unwrap_or(0) == c.expect);
        if ok {
            g.0 += 1;
            let rev = g.0;
            for c in changes {
                match c.write {
                    Write::Keep => {}
                    Write::Put(v) => {
                        g.1.insert(c.key, (v, rev));
                    }
                    Write::Delete => {
                        g.1.remove(&c.key);
                    }
                }
            }
        }
        Box::pin(async move {
            tokio::task::yield_now().await;
            Ok(ok)
        })
    }
}

/// One host's liveness value that does not decode (corrupt) and one written by a newer pdctl
/// (a field this one does not know): the corrupt one is skipped and named, the newer one read,
/// the others read — never the whole fleet failed for one key (before: `hosts()` failed, the
/// storm brake switched off and other hosts' down workers stopped counting).
#[tokio::test]
async fn one_bad_or_newer_liveness_value_never_blinds_the_fleet() {
    let mem = Mem::default();
    let put = |host: &str, value: Vec<u8>| {
        let mut g = mem.kv.lock().unwrap();
        g.0 += 1;
        let rev = g.0;
        g.1.insert(host_key("f", host), (value, rev));
    };
    let down = serde_json::json!({"host": "a", "version": "1", "rollout": null, "updated_at": 1,
        "workers": [{"unit": "p.service", "url": "http://a:1", "role": "prefill", "state": "failed/failed", "kv_usage": null}]});
    put("a", serde_json::to_vec(&down).unwrap());
    put("b", b"{\"host\": \"b\", garbage".to_vec());
    let mut newer = down.clone();
    newer["host"] = "c".into();
    newer["gpu_temperature"] = 71.into();
    newer["workers"][0]["url"] = "http://c:1".into();
    put("c", serde_json::to_vec(&newer).unwrap());
    let hosts = hosts(&mem, "f").await.expect("the fleet reads");
    assert_eq!(hosts.iter().map(|h| h.host.as_str()).collect::<Vec<_>>(), ["a", "c"], "b skipped, c read");
    assert_eq!(down_workers(&hosts)["prefill"].len(), 2, "both down workers still count against the budget");
}

/// Retention: 5,000 finished fleet rollouts (request, an event and a summary each) and one not
/// finished among the oldest: after the prune the newest 200 and the unfinished one are left,
/// every key of the others gone, and `requests/` lists 201 values.
#[tokio::test]
async fn retention_deletes_old_finished_fleet_rollouts_whole_and_keeps_an_unfinished_one() {
    let mem = Mem::default();
    let put = |key: String, value: Vec<u8>| {
        let mut g = mem.kv.lock().unwrap();
        g.0 += 1;
        let rev = g.0;
        g.1.insert(key, (value, rev));
    };
    for i in 0..5000u64 {
        let id = format!("f{i:05}");
        let req = serde_json::json!({"id": id, "hosts": ["a"], "allow_outage": false, "by": "uid 0 on a", "reason": null, "canary": null, "created_at": i});
        put(rollout_key("f", &id), serde_json::to_vec(&req).unwrap());
        put(host_event_key("f", &id, "a", 0), b"{}".to_vec());
        if i != 7 {
            put(host_summary_key("f", &id, "a"), b"{}".to_vec());
        }
    }
    let gone = prune_rollouts(&mem, "f", 200).await.unwrap();
    assert_eq!(gone.len(), 4799, "all but the newest 200 and the unfinished f00007");
    let left = mem.get_prefix(&requests_prefix("f")).await.unwrap();
    assert_eq!(left.len(), 201);
    assert!(left.iter().any(|e| e.key.ends_with("f00007")), "the unfinished one is kept");
    assert!(mem.get(&host_event_key("f", "f00001", "a", 0)).await.unwrap().is_none(), "its events went with it");
    assert!(mem.get(&host_event_key("f", "f00007", "a", 0)).await.unwrap().is_some());
    assert!(prune_rollouts(&mem, "f", 200).await.unwrap().is_empty(), "idempotent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hosts_never_over_admit_and_pairs_take_both_slots_or_none() {
    let mem = std::sync::Arc::new(Mem::default());
    let limits = Limits { max_unavailable: [("prefill".to_string(), 1), ("decode".to_string(), 1)].into() };
    let max_seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for h in 0..20 {
        let (mem, limits, max_seen) = (mem.clone(), limits.clone(), max_seen.clone());
        tasks.push(tokio::spawn(async move {
            let want = Hold { holder: holder(&format!("h{h}"), "p.service"), url: format!("http://h{h}:1"), token: token(), since: 0, rollout: "r".into() };
            loop {
                match try_acquire(mem.as_ref(), "f", &limits, &[("prefill".into(), want.clone())], &BTreeMap::new()).await.unwrap() {
                    Acquired::Granted(_) => break,
                    Acquired::Wait(_) => tokio::task::yield_now().await,
                }
            }
            let held = slots(mem.as_ref(), "f").await.unwrap().get("prefill").map(|s| s.holders.len()).unwrap_or(0);
            max_seen.fetch_max(held, std::sync::atomic::Ordering::SeqCst);
            assert!(release(mem.as_ref(), "f", "prefill", &want.holder, &want.token).await.unwrap());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(max_seen.load(std::sync::atomic::Ordering::SeqCst), 1);
    // A pair (two roles) while the decode slot is taken: neither is granted.
    let d = Hold { holder: "x/d.service".into(), url: "http://x:2".into(), token: "t".into(), since: 0, rollout: "r".into() };
    try_acquire(mem.as_ref(), "f", &limits, &[("decode".into(), d)], &BTreeMap::new()).await.unwrap();
    let p = Hold { holder: "y/p.service".into(), url: "http://y:1".into(), token: "t".into(), since: 0, rollout: "r".into() };
    let d2 = Hold { holder: "y/d.service".into(), url: "http://y:2".into(), token: "t".into(), since: 0, rollout: "r".into() };
    let r = try_acquire(mem.as_ref(), "f", &limits, &[("prefill".into(), p), ("decode".into(), d2)], &BTreeMap::new()).await.unwrap();
    assert!(matches!(r, Acquired::Wait(_)));
    assert!(slots(mem.as_ref(), "f").await.unwrap().get("prefill").is_none_or(|s| s.holders.is_empty()), "no prefill slot taken alone");
    // A pause blocks every grant.
    set_pause(mem.as_ref(), "f", Some(&Pause { by: "uid 0 on a".into(), reason: "incident".into(), at: 0 })).await.unwrap();
    let q = Hold { holder: "z/p.service".into(), url: "http://z:1".into(), token: "t".into(), since: 0, rollout: "r".into() };
    match try_acquire(mem.as_ref(), "f", &limits, &[("prefill".into(), q)], &BTreeMap::new()).await.unwrap() {
        Acquired::Wait(w) => assert!(w.contains("paused by uid 0 on a") && w.contains("incident"), "{w}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_first_host_writes_the_limits_and_a_disagreeing_host_is_told_both_values() {
    let mem = Mem::default();
    let a = Limits { max_unavailable: [("prefill".to_string(), 1)].into() };
    assert_eq!(ensure_limits(&mem, "f", &a).await.unwrap(), Ok(a.clone()));
    let b = Limits { max_unavailable: [("prefill".to_string(), 3)].into() };
    assert_eq!(ensure_limits(&mem, "f", &b).await.unwrap(), Err(LimitsDisagree { role: "prefill".into(), etcd: "1".into(), local: "3".into() }));
}
