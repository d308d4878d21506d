//! The sandbox itself: a real systemd user manager + journald + D-Bus, booted privately, several
//! side by side, and torn down without leaving a process behind.

use std::time::Duration;

use pdctl_tests::pdctl_sandbox::{journal::field, Sandbox};

fn unique() -> String {
    format!("{}{}", std::process::id(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos())
}

fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn a_unit_runs_logs_to_journald_and_everything_dies_with_the_sandbox() {
    let marker = format!("4242.{}", unique());
    let sb = Sandbox::start().expect("sandbox boots");
    sb.write_unit("hello.service", &format!("[Service]\nExecStart=/bin/sh -c 'echo hello-from-unit; exec sleep {marker}'\n")).unwrap();
    sb.daemon_reload().unwrap();
    let mut follow = sb.follow_journal(&["_SYSTEMD_UNIT=hello.service"]).unwrap();
    sb.systemctl(&["start", "hello.service"]).unwrap();
    let line = follow.wait_for(Duration::from_secs(20), |e| field(e, "MESSAGE") == Some("hello-from-unit")).expect("the unit's stdout reached journald");
    assert_eq!(field(&line, "_SYSTEMD_UNIT"), Some("hello.service"));
    let active = sb.systemctl(&["is-active", "hello.service"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&active.stdout).trim(), "active");
    // The manager's own messages reach the journal too (--log-target=journal).
    let mut mgr = sb.follow_journal(&["USER_UNIT=hello.service"]).unwrap();
    assert!(mgr.wait_for(Duration::from_secs(10), |e| field(e, "MESSAGE").is_some_and(|m| m.contains("Started"))).is_some());
    assert!(sb.bus_address().starts_with("unix:path=/proc/"));
    assert!(sb.journal_dir().is_dir(), "journal dir {} visible from outside", sb.journal_dir().display());
    assert_eq!(processes_with(&marker).len(), 1, "the unit's process runs: {:?}", processes_with(&marker));

    let init = sb.init_pid();
    let dir = sb.dir().to_path_buf();
    drop(mgr);
    drop(follow);
    drop(sb);
    assert!(processes_with(&marker).is_empty(), "stray: {:?}", processes_with(&marker));
    assert!(!std::path::Path::new(&format!("/proc/{init}")).exists(), "the namespace's init is gone");
    assert!(!dir.exists(), "the sandbox directory is removed");
}

#[test]
fn two_sandboxes_run_side_by_side_with_the_same_unit_names() {
    let a = Sandbox::start().expect("first sandbox");
    let b = Sandbox::start().expect("second sandbox");
    assert_ne!(a.journal_dir(), b.journal_dir());
    for (sb, word) in [(&a, "from-a"), (&b, "from-b")] {
        sb.write_unit("same.service", &format!("[Service]\nExecStart=/bin/sh -c 'echo {word}; exec sleep 600'\n")).unwrap();
        sb.daemon_reload().unwrap();
        sb.systemctl(&["start", "same.service"]).unwrap();
    }
    for (sb, mine, theirs) in [(&a, "from-a", "from-b"), (&b, "from-b", "from-a")] {
        let mut f = sb.follow_journal(&["_SYSTEMD_UNIT=same.service"]).unwrap();
        assert!(f.wait_for(Duration::from_secs(20), |e| field(e, "MESSAGE") == Some(mine)).is_some());
        let out = sb.journalctl(&["-o", "cat", "_SYSTEMD_UNIT=same.service"]).unwrap();
        assert!(!String::from_utf8_lossy(&out.stdout).contains(theirs), "journals are private");
        let st = sb.systemctl(&["is-active", "same.service"]).unwrap();
        assert_eq!(String::from_utf8_lossy(&st.stdout).trim(), "active");
    }
    // Stopping a unit in one sandbox leaves the other's alone.
    a.systemctl(&["stop", "same.service"]).unwrap();
    let st = b.systemctl(&["is-active", "same.service"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&st.stdout).trim(), "active");
}
