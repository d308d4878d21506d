//! Keys and secrets on the sandbox behind the real gateway: workers started with SGLang's
//! `--api-key` and `--admin-api-key` are rolled and loaded with the keys pdctl reads from their
//! `api_key_file`s, a wrong or missing key is named (never repeated), and a key placed in any
//! input pdctl takes from outside appears in nothing pdctl writes or prints.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pdctl_tests::pdctl_sandbox::stack::{Pdctld, Stack, StackOptions};
use pdctl_tests::pdctl_sandbox::Gateway;
use pdctl_tests::{pdctl_daemon, pdctl_run};
use serde_json::Value;

const P: &str = "sglang-dsv4-prefill.service";
const D: &str = "sglang-dsv4-decode.service";
const LIMIT: Duration = Duration::from_secs(150);

/// Workers started with SGLang's `--api-key`, behind smg 1.13 started with the same key (smg's
/// `--api-key` is its key for the workers and also guards the gateway): pdctl reads the keys from
/// its `api_key_file`s and sends them on every call that needs one (the drain's `/v1/loads`,
/// `/server_info`, the pair probe, the gateway's `/workers`, the re-registration). With a wrong
/// key `pdctl check` refuses with `api_key_rejected` before anything is touched. The key itself
/// appears nowhere pdctl writes.
#[test]
fn workers_with_an_api_key_are_rolled_with_it_and_a_wrong_key_is_named() {
    const KEY: &str = "k3y-0f-the-w0rkers";
    let opts = StackOptions { gateway: Gateway::Smg113, api_key: Some(KEY.into()), ..Default::default() };
    let (stack, config, d) = pdctl_tests::stack_with_pdctld_opts(&opts);
    let guarded = pdctl_tests::pdctl_sandbox::stack::http_get(&format!("{}/server_info", stack.decode.url)).expect("the decode answers");
    assert_eq!(guarded.0, 401, "the workers do guard their endpoints: {guarded:?}");

    let r = pdctl_daemon(&d, &config, &["restart", "--rolling", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#?} {}", r.summary, r.stderr);
    let drain = &r.event(D, "drain", "passed")["detail"];
    assert!(drain["in_flight_at_start"].as_u64().is_some(), "the drain read /v1/loads with the key: {drain}");
    assert_eq!(r.event(P, "pair", "passed")["status"], "passed");
    assert_eq!(
        r.event(D, "router", "passed")["detail"]["re_registered"],
        true,
        "re-registered with its key, and admitted: {:#}",
        r.event(D, "router", "passed")
    );
    let record = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{}", r.summary["id"].as_str().unwrap()), "");
    assert!(!format!("{record:?}{}{}", r.stderr, serde_json::to_string(&r.events).unwrap()).contains(KEY), "the key is in no output or record");
    secrets_stay_secret(&stack, &config, &d, KEY);

    std::fs::write(stack.key_file(), "not-the-key\n").unwrap();
    let check = pdctl_run(&["check", "--json", "--config", config.to_str().unwrap()], LIMIT, |_| {});
    assert_eq!(check.code, 2, "{:#?} {}", check.summary, check.stderr);
    let f = &check.summary["failed"];
    assert_eq!((f["step"].as_str(), f["cause_code"].as_str()), (Some("preflight"), Some("api_key_rejected")), "{f:#}");
    let cause = f["cause"].as_str().unwrap_or("");
    assert!(
        cause.contains("/server_info answered 401") && cause.contains(&stack.key_file().display().to_string()),
        "names the endpoint and the key's file: {cause}"
    );
    assert!(!cause.contains("not-the-key") && !check.stderr.contains("not-the-key"), "never the key: {cause}");
}

/// The key, placed in each input pdctl takes from outside, appears in no output, record, state
/// file (but the private copies of the unit's own files) or log line of pdctld: a failed unit's journal lines (SGLang 0.5.23's `server_args={…
/// 'api_key': …}` at start, an older `ServerArgs(api_key=…)`, a command line's `--api-key`, a
/// bearer header, a URL's password — with a terminal escape among them), a URL with the key as
/// its password in the config, and the key pasted as `api_key_file` by mistake (a bare word
/// reads as a systemd credential's name). What a failure keeps of the journal goes to etcd
/// unchanged (a fleet host's summary), so it is covered by the record.
fn secrets_stay_secret(stack: &Stack, config: &Path, d: &Pdctld, key: &str) {
    let dir = config.parent().unwrap();
    let script = dir.join("leaks-the-key.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"server_args={{'model_path': 'm', 'api_key': '{key}', 'admin_api_key': None}}\"\necho \"ServerArgs(api_key='{key}', port=1)\"\n\
             echo \"python3 -m sglang.launch_server --api-key {key} --port 1\"\necho \"curl -H 'Authorization: Bearer {key}' http://user:{key}@127.0.0.1:1/\"\n\
             printf '\\033]0;a terminal title\\007 and on\\n'\nexit 1\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    stack.drop_in(D, "70-leaks", &format!("[Service]\nExecStartPre={}\n", script.display())).expect("drop-in");
    std::fs::write(dir.join("config.d/70-rollback.toml"), "[rollout]\non_failure = \"rollback\"\n").unwrap();
    let failed = pdctl_daemon(d, config, &["restart", "--rolling", "--unit", D, "--load-changes", "--json"], LIMIT);
    assert_eq!(failed.summary["result"], "rolled_back", "{:#?} {}", failed.summary, failed.stderr);
    let id = failed.summary["id"].as_str().unwrap().to_string();
    let record = pdctl_tests::raw_api(&d.socket, "GET", &format!("/v1/rollouts/{id}"), "").1.to_string();
    assert!(record.contains("'api_key': '***'") && record.contains("--api-key ***"), "the journal lines are kept, redacted: {record}");
    let shown = pdctl_run(&["rollout", "show", &id, "--config", config.to_str().unwrap()], LIMIT, |_| {});
    let mut outputs = vec![record, failed.stderr.clone(), serde_json::to_string(&failed.events).unwrap(), shown.stderr.clone(), shown.summary.to_string()];
    let text = std::process::Command::new(pdctl_tests::pdctl_sandbox::workspace_bin("pdctl", "PDCTL_BIN").unwrap())
        .args(["rollout", "show", &id, "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned() + &String::from_utf8_lossy(&text.stderr);
    assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "no terminal escape reaches the terminal: {text:?}");
    outputs.push(text);
    std::fs::remove_file(dir.join("config.d/70-rollback.toml")).unwrap();

    // The key as a URL's password, then pasted as `[router] api_key_file`: refused or unreadable,
    // and said without it.
    for (name, fragment) in
        [("80-url.toml", format!("[router]\nurl = \"http://admin:{key}@127.0.0.1:1\"\n")), ("80-pasted.toml", format!("[router]\napi_key_file = \"{key}\"\n"))]
    {
        std::fs::write(dir.join("config.d").join(name), fragment).unwrap();
        let check = pdctl_run(&["check", "--json", "--config", config.to_str().unwrap()], LIMIT, |_| {});
        assert_ne!(check.code, 0, "{name}: {:#?} {}", check.summary, check.stderr);
        outputs.push(format!("{}{}", check.summary, check.stderr));
        let restart = pdctl_run(&["restart", "--rolling", "--dry-run", "--json", "--config", config.to_str().unwrap()], LIMIT, |_| {});
        outputs.push(format!("{}{}{:?}", restart.summary, restart.stderr, restart.events));
        std::fs::remove_file(dir.join("config.d").join(name)).unwrap();
    }
    let log = stack.sandbox.journalctl(&["-u", "pdctld.service", "-o", "json", "--no-pager"]).unwrap();
    outputs.push(String::from_utf8_lossy(&log.stdout).into_owned());
    for f in walk(&d.state) {
        if f.starts_with(d.state.join("revisions")) {
            // Copies of the unit's own files (its ExecStart holds `--api-key`), kept to restore
            // them byte for byte: as private as the originals, never shown.
            let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&f).unwrap().permissions());
            assert_eq!(mode & 0o007, 0, "{} is not for others: {mode:o}", f.display());
            continue;
        }
        outputs.push(String::from_utf8_lossy(&std::fs::read(&f).unwrap_or_default()).into_owned());
    }
    for (i, o) in outputs.iter().enumerate() {
        assert!(!o.contains(key), "output {i} holds the key: {o}");
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Workers started with `--admin-api-key`: SGLang's pause, continue, load and flush refuse the
/// API key then. Without `admin_api_key_file` the rollout fails at the first pause, naming the
/// setting, and nothing was loaded; with it, the new weights go in.
#[test]
fn an_admin_key_is_sent_to_sglangs_admin_routes_and_a_missing_one_is_named() {
    let (stack, config, d) =
        pdctl_tests::stack_with_pdctld_opts(&StackOptions { api_key: Some("s3cret".into()), admin_api_key: Some("adm1n".into()), ..Default::default() });
    // Configured without the admin key: refused at the decode's pause, nothing loaded.
    // (pdctld reads its own copy, `d.config`, at each request; the CLI's is `config`.)
    let configs = [config.clone(), d.config.clone()];
    let texts: Vec<String> = configs.iter().map(|c| std::fs::read_to_string(c).expect("config")).collect();
    for (c, text) in configs.iter().zip(&texts) {
        let without: String = text.lines().filter(|l| !l.starts_with("admin_api_key_file")).map(|l| format!("{l}\n")).collect();
        std::fs::write(c, without).expect("config");
    }
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127", "--version", "ft-1127", "--json"], LIMIT);
    assert_eq!(r.code, 1, "{:#}\n{}", r.summary, r.stderr);
    let f = &r.summary["failed"];
    assert_eq!((f["unit"].as_str(), f["cause_code"].as_str()), (Some(D), Some("weights_failed")), "{f:#}");
    assert!(f["cause"].as_str().is_some_and(|c| c.contains("401") && c.contains("admin_api_key_file")), "{f:#}");
    let key = |url: &str| pdctl_tests::pdctl_sandbox::stack::http_get_with(&format!("{url}/model_info"), Some("s3cret")).expect("model_info");
    for url in [&stack.prefill.url, &stack.decode.url] {
        let v: Value = serde_json::from_str(&key(url).1).expect("JSON");
        assert_eq!(v["weight_version"], "default", "nothing loaded on {url}");
    }
    // With it: the same rollout passes.
    for (c, text) in configs.iter().zip(&texts) {
        std::fs::write(c, text).expect("config");
    }
    let r = pdctl_tests::pdctl_daemon(&d, &config, &["rollout", "weights", "--model-path", "/models/dsv4-ft-1127", "--version", "ft-1127", "--json"], LIMIT);
    assert_eq!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    for url in [&stack.prefill.url, &stack.decode.url] {
        let v: Value = serde_json::from_str(&key(url).1).expect("JSON");
        assert_eq!(v["weight_version"], "ft-1127", "{url}");
    }
}
