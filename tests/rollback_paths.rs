//! A rollback writes only where it means to. A unit's `EnvironmentFile=` lies under a directory
//! its service account owns (as one in its `ReadWritePaths=`); during a rollout that account
//! replaces a directory on the way with a link to a directory only root may write, and the start
//! fails. The rollback (`on_failure = "rollback"`) must not create the file behind the link: it
//! stops at the link, names it, and the preflight had said which directories another account can
//! change. On the sandbox (real systemd, journald, D-Bus) behind the real gateway.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use pdctl_tests::{pdctl_daemon, pdctl_run, stack_with_pdctld};

const P: &str = "sglang-dsv4-prefill.service";
const LIMIT: Duration = Duration::from_secs(150);
const NOBODY: u32 = 65534;

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn a_rollback_stops_at_a_link_the_service_account_put_in_place_of_a_directory() {
    let (stack, config, d) = stack_with_pdctld();
    std::fs::write(config.parent().unwrap().join("config.d/10-rollback.toml"), "[rollout]\non_failure = \"rollback\"\n").unwrap();
    // envdir: the service account's; sub/w1.conf: the worker's environment.
    let envdir = stack.sandbox.dir().join("envdir");
    std::fs::create_dir_all(envdir.join("sub")).unwrap();
    std::os::unix::fs::chown(&envdir, Some(NOBODY), Some(NOBODY)).unwrap();
    let env = envdir.join("sub/w1.conf");
    std::fs::write(&env, "SGLANG_SIM_TOKENS_PER_SEC=200\n").unwrap();
    // A directory only root may write, that the account would like a file in.
    let target = stack.sandbox.dir().join("root-only");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    stack.drop_in(P, "50-env", &format!("[Service]\nEnvironmentFile={}\n", env.display())).unwrap();
    // A rollout that passes records the worker's files with w1.conf as its last good revision.
    let first = pdctl_daemon(&d, &config, &["restart", "--rolling", "--load-changes", "--unit", P, "--json"], LIMIT);
    assert_eq!(first.code, 0, "{:#}\n{}", first.summary, first.stderr);
    // The change: a w1.conf whose start fails.
    std::fs::write(&env, "SGLANG_SIM_EXIT_CODE=3\n").unwrap();
    // Its dry run names the directory the account can change.
    let dry = pdctl_daemon(&d, &config, &["restart", "--rolling", "--load-changes", "--unit", P, "--dry-run", "--json"], LIMIT);
    let warned = dry.events.iter().any(|e| e.to_string().contains(&format!("{} (owned by uid {NOBODY})", envdir.display())));
    assert!(warned, "the preflight names {}: {:#?}", envdir.display(), dry.events);
    // While the worker restarts, the account swaps sub for a link of its own to root's directory.
    let mut swapped = false;
    let args = ["restart", "--rolling", "--load-changes", "--unit", P, "--json", "--config", &s(&config), "--socket", &s(&d.socket)];
    let r = pdctl_run(&args, LIMIT, |e| {
        if !swapped && e["unit"] == P && e["step"] == "restart" && e["status"] == "started" {
            std::fs::rename(envdir.join("sub"), envdir.join("sub.old")).unwrap();
            std::os::unix::fs::symlink(&target, envdir.join("sub")).unwrap();
            std::os::unix::fs::lchown(envdir.join("sub"), Some(NOBODY), Some(NOBODY)).unwrap();
            swapped = true;
        }
    });
    assert!(swapped, "{:#?}", r.events);
    assert_ne!(r.code, 0, "{:#}\n{}", r.summary, r.stderr);
    let rollback = r.event(P, "rollback", "failed");
    eprintln!("{rollback:#}");
    assert!(rollback.to_string().contains("symbolic link owned by uid 65534, not followed"), "the rollback names the link: {rollback:#}");
    assert!(!target.join("w1.conf").exists(), "nothing was written behind the link");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "not even a temporary file");
    assert_eq!(std::fs::read_to_string(envdir.join("sub.old/w1.conf")).unwrap(), "SGLANG_SIM_EXIT_CODE=3\n", "the real file as the change left it");
}
