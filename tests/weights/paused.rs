//! Workers paused by a weights rollout: a pdctld stopped or killed meanwhile continues every
//! worker — before the stopped one exits, at the killed one's next start — with nothing left on
//! record to continue; a request a `retract` pause took off a decode is fetched again through its
//! prefill, which has an API key the decode's refetch does not send.

use super::*;

/// A 1P1D stack whose weight loads take `load_secs`, and a weights rollout followed until the
/// prefill is paused (its `/ready` 503).
fn paused_by_a_weights_rollout(load_secs: u32) -> (Stack, std::path::PathBuf, pdctl_tests::pdctl_sandbox::stack::Pdctld, pdctl_tests::LivePdctl) {
    let slow = vec!["--sim-weights-load-secs".to_string(), load_secs.to_string()];
    let opts = StackOptions { prefill_args: slow.clone(), decode_args: slow, ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let mut c = pdctl_tests::live_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127", "--json"]);
    c.wait_line(LIMIT, |e| e["unit"] == P && e["step"] == "weights" && e["status"] == "started").expect("the prefill is being paused");
    assert!(pdctl_tests::until(Duration::from_secs(10), Duration::from_millis(100), || ready(&stack.prefill.url) == 503), "the prefill is paused");
    (stack, config, d, c)
}

/// pdctld SIGKILLed while a weights rollout holds every worker paused: the pause was on record
/// (`paused.json`, written before it), so the pdctld that starts again continues them — none is
/// left holding its requests — and the interrupted rollout is not resumed as a restart.
#[test]
fn a_pdctld_killed_while_workers_are_paused_continues_them_when_it_starts() {
    let (stack, config, d, mut c) = paused_by_a_weights_rollout(20);
    pdctl_tests::kill_and_wait(&stack, &d.unit);
    let _ = c.finish(Duration::from_secs(20));
    stack.sandbox.systemctl(&["start", &d.unit]).expect("pdctld starts again");
    // The loads the killed rollout asked for still run (20 s); what matters is that no worker
    // stays paused after them.
    for url in [&stack.prefill.url, &stack.decode.url] {
        if !pdctl_tests::until(Duration::from_secs(60), Duration::from_millis(200), || ready(url) == 200) {
            let log = stack
                .sandbox
                .journalctl(&["-u", &d.unit, "-o", "cat", "--no-pager"])
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            panic!("{url} was not continued by the new pdctld; its journal:\n{log}");
        }
    }
    // Its start's reconciliation ends (revisions recorded, nothing else left) before it takes a request to act.
    assert!(
        pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pdctl_tests::raw_api(&d.socket, "GET", "/v1/status", "").1["reconciling"]
            == false),
        "pdctld finished reconciling"
    );
    let (_, h) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    let id = h["rollouts"].as_array().and_then(|a| a.last()).and_then(|r| r["id"].as_str()).expect("a rollout").to_string();
    let (code, body) = pdctl_tests::raw_api(&d.socket, "POST", "/v1/rollouts", &format!("{{\"kind\":\"resume\",\"id\":\"{id}\"}}"));
    assert_eq!(code, 409, "{body:#}");
    assert!(body["error"].as_str().unwrap_or("").contains("weights rollout is not resumed"), "{body:#}");
    // What `rollout show` suggests instead runs: `pdctl status` (each worker's weights).
    let bin = pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").expect("pdctl");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(&bin)
            .args(args)
            .args(["--config", &config.display().to_string(), "--socket", &d.socket.display().to_string()])
            .output()
            .expect("pdctl");
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let (_, shown) = run(&["rollout", "show", &id]);
    let next = shown.lines().find_map(|l| l.split("next: ").nth(1)).unwrap_or_else(|| panic!("{shown}"));
    assert!(next.starts_with("pdctl status") && !next.contains("resume"), "{next}");
    assert_eq!(run(&["status"]).0, Some(0));
}

/// pdctld stopped (SIGTERM: an upgrade, `systemctl stop pdctld`) while a weights rollout holds
/// every worker paused: it continues them before it exits, not at its next start (before: it
/// undid drains only, and the workers held every request until pdctld started again).
#[test]
fn a_pdctld_stopped_while_workers_are_paused_continues_them_before_it_exits() {
    let (stack, _config, d, mut c) = paused_by_a_weights_rollout(5);
    stack.sandbox.systemctl(&["stop", &d.unit]).expect("pdctld stops");
    let _ = c.finish(Duration::from_secs(20));
    assert_eq!(stack.show(&d.unit, "ActiveState").unwrap(), "inactive", "pdctld is not running");
    for url in [&stack.prefill.url, &stack.decode.url] {
        assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || ready(url) == 200), "{url} was continued by the stopping pdctld");
    }
    assert!(!pdctl_core_paused_file(&d.state).exists(), "nothing left on record to continue");
}

fn pdctl_core_paused_file(state: &std::path::Path) -> std::path::PathBuf {
    state.join("revisions").join("paused.json")
}

/// The simulator does what the real server does (tests/real.rs shows it there): a request a
/// `retract` pause took off a decode is recomputed at the continue through its prefill's
/// `/generate`, sent without the API key — refused (401) by a prefill that has one, and the
/// request fails on the decode (the gateway may retry it from the start). Without a key it is
/// recomputed and nothing fails.
#[test]
fn a_request_retracted_on_a_decode_is_refetched_through_the_prefill_without_its_key() {
    for key in [None, Some("s3cret")] {
        let (stack, _config) = pdctl_tests::stack_with_config(&StackOptions { api_key: key.map(String::from), ..Default::default() });
        let router = stack.router.as_ref().expect("router").url.clone();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let _entered = rt.enter();
        let with_key = |r: reqwest::RequestBuilder| match key {
            Some(k) => r.bearer_auth(k),
            None => r,
        };
        let long = rt.spawn({
            let req = with_key(pdctl_tests::http().post(format!("{router}/generate")))
                .json(&serde_json::json!({"text": "a long answer", "sampling_params": {"max_new_tokens": 1200}}));
            async move { req.timeout(Duration::from_secs(60)).send().await.map(|r| r.status().as_u16()).unwrap_or(0) }
        });
        let running = || {
            let (_, body) = pdctl_tests::pdctl_sandbox::stack::http_get_with(&format!("{}/v1/loads", stack.decode.url), key).unwrap_or((0, String::new()));
            serde_json::from_str::<Value>(&body).ok().and_then(|v| v["loads"][0]["num_running_reqs"].as_u64()).unwrap_or(0) > 0
        };
        assert!(pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(50), running), "the request runs on the decode");
        for path in ["pause_generation", "continue_generation"] {
            let body = if path == "pause_generation" { serde_json::json!({"mode": "retract"}) } else { serde_json::json!({}) };
            let status = rt.block_on(with_key(pdctl_tests::http().post(format!("{}/{path}", stack.decode.url))).json(&body).send()).expect(path).status();
            assert!(status.is_success(), "{path}: {status}");
        }
        let refused = || {
            let out = stack.sandbox.journalctl(&["-u", D, "--no-pager", "-o", "cat"]).expect("journal");
            String::from_utf8_lossy(&out.stdout).contains("PD rebootstrap prefill failed for rid=")
        };
        let status = rt.block_on(long).expect("request task");
        if key.is_some() {
            assert!(pdctl_tests::until(Duration::from_secs(10), Duration::from_millis(100), refused), "the decode's re-fetch was refused (401)");
        } else {
            assert_eq!(status, 200);
            assert!(!refused(), "without a key the prefill recomputed it");
        }
    }
}

/// A model path that cannot be right is refused before anything pauses: empty or relative, by
/// the CLI (exit 2, the flag named) and by pdctld's API (400 `bad_request`, no record), and the
/// workers serve what they served, never paused.
#[test]
fn an_empty_or_relative_model_path_is_refused_before_anything_pauses() {
    let (stack, config, d) = pdctl_tests::stack_with_pdctld();
    for bad in ["", "models/dsv4-ft-1127"] {
        let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", bad, "--json"], LIMIT);
        assert_eq!(r.code, 2, "{bad:?}: {}", r.stderr);
        assert!(r.stderr.contains("--model-path") && r.stderr.contains("nothing was touched"), "{}", r.stderr);
        let body = serde_json::json!({"kind": "weights", "model_path": bad}).to_string();
        let (code, v) = pdctl_tests::raw_api(&d.socket, "POST", "/v1/rollouts", &body);
        assert_eq!((code, v["cause_code"].as_str(), v["exit_code"].as_i64()), (400, Some("bad_request"), Some(2)), "{v:#}");
    }
    let (_, history) = pdctl_tests::raw_api(&d.socket, "GET", "/v1/rollouts", "");
    assert!(history.to_string().matches("\"weights\"").count() == 0, "no weights record: {history:#}");
    for url in [&stack.prefill.url, &stack.decode.url] {
        let m = model_info(url);
        assert_eq!(m["weight_version"], "default", "{m:#}");
        let out = stack.sandbox.journalctl(&["-u", P, "-u", D, "--no-pager", "-o", "cat"]).expect("journal");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("Generation paused"), "nothing was paused");
    }
}

/// The runbook's config rollout of a new checkpoint on a 1P1D host (the servers started without
/// `--tokenizer-path`): SGLang loads weights in place, not a tokenizer, so a drop-in that moves
/// `--model-path` loads in place only when the tokenizer it resolves is the one the servers run.
/// A checkpoint with another vocabulary: the diff and the refusal (`mixed_versions`, exit 2,
/// nothing restarted) name the tokenizer, and the record says how to keep it. The same drop-in
/// with the running tokenizer pinned (the runbook's way): loaded in place, nothing restarted.
/// A checkpoint saved with the same tokenizer files, unpinned: loaded in place too; a later
/// restart of the prefill from those files is no model change (the tokenizer files are the same)
/// and no PD request decodes KV of another model after it (the simulator tells tokenizers by
/// their files as well).
#[test]
fn a_new_checkpoint_in_the_units_loads_in_place_when_its_tokenizer_stays_and_the_refusal_names_it_when_not() {
    let vocab = |v: u32| vec![("tokenizer.json".to_string(), format!("{{\"vocab\":{v}}}")), ("tokenizer_config.json".to_string(), "{}".to_string())];
    let opts = StackOptions { model_files: vocab(1), ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let models = stack.sandbox.dir().join("models");
    let start = models.join("dsv4").display().to_string();
    let checkpoint = |name: &str, v: u32| {
        let dir = models.join(name);
        std::fs::create_dir_all(&dir).expect("checkpoint");
        for (f, c) in vocab(v) {
            std::fs::write(dir.join(f), c).expect("tokenizer file");
        }
        std::fs::write(dir.join("model.safetensors"), name).expect("weights");
        dir.display().to_string()
    };
    let (other_vocab, fine_tune) = (checkpoint("dsv4-v2", 2), checkpoint("dsv4-ft-1127", 1));
    let change = |extra: &[&str]| {
        for (unit, w) in [(P, &stack.prefill), (D, &stack.decode)] {
            let exec = stack.worker_unit(w, &opts, &extra.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            let line = exec.lines().find(|l| l.starts_with("ExecStart=")).expect("ExecStart").to_string();
            stack.drop_in(unit, "50-new-model", &format!("[Service]\nExecStart=\n{line}\n")).expect("drop-in");
        }
    };
    let before = runs(&stack);

    // Another vocabulary under the new path: a restart of a model change, refused on 1P1D.
    change(&["--model-path", &other_vocab]);
    let (code, out) = human(&d, &config, &["rollout", "diff"]);
    assert!(
        code == 0
            && out.contains(&format!("its tokenizer (no --tokenizer-path: it follows --model-path) changes {start} → {other_vocab} (tokenizer.json differ")),
        "{code}: {out}"
    );
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    assert_eq!(r.code, 2, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!(f["cause_code"].as_str(), Some("mixed_versions"), "{f:#}");
    assert!(f["cause"].as_str().unwrap_or("").contains(&format!("--tokenizer-path {start} → {other_vocab}")), "the flag is named: {f:#}");
    let id = r.summary["id"].as_str().expect("id");
    let (_, rec) = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "");
    let notes = rec["notes"].to_string();
    assert!(notes.contains(&format!("keep the tokenizer it runs (--tokenizer-path {start})")), "{rec:#}");
    assert_eq!(runs(&stack), before, "nothing was restarted");

    // The runbook's way: the running tokenizer pinned in the same drop-in.
    change(&["--model-path", &other_vocab, "--tokenizer-path", &start]);
    let (code, out) = human(&d, &config, &["rollout", "diff"]);
    assert!(code == 0 && out.contains(&format!("rollout apply loads {other_vocab} in place into all 2 workers at once")), "{code}: {out}");
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert_eq!(runs(&stack), before, "loaded in place, nothing restarted");
    for url in [&stack.prefill.url, &stack.decode.url] {
        assert_eq!(model_info(url)["model_path"], other_vocab.as_str());
    }

    // A checkpoint saved with the same tokenizer files, unpinned: in place too.
    change(&["--model-path", &fine_tune]);
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "apply", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    assert!(r.events.iter().any(|e| e["step"] == "weights" && e["status"] == "passed"), "loaded in place");
    assert_eq!(runs(&stack), before, "nothing restarted");
    // Restarted from those files, the prefill computes with what the decode runs.
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["restart", "--rolling", "--unit", P, "--json"], LIMIT);
    assert_eq!(r.code, 0, "the same tokenizer under another path is no model change: {:#}\n{}", r.summary, r.stderr);
    assert_eq!(model_info(&stack.prefill.url)["model_path"], fine_tune.as_str());
    let router = stack.router.as_ref().expect("router").url.clone();
    let (decoded, _) = pd_counts(&stack);
    let load = pdctl_tests::Load::start(&router, 10.0, 4);
    let flowed = pdctl_tests::until(Duration::from_secs(30), Duration::from_millis(200), || pd_counts(&stack).0 >= decoded + 10.0);
    let (sent, failed) = load.stop();
    assert!(flowed, "PD requests decoded after the restart ({sent} sent, {failed} failed)");
    assert_eq!(pd_counts(&stack).1, 0.0, "no PD request decoded KV of another model");
}
