//! The Debian package, built from the binaries the suite already built (scripts/package-deb):
//! its file list, control data, conffiles and maintainer scripts, the accounts its sysusers.d file
//! creates, the polkit rule and drop-in for pdctld as its own user, and lintian reporting no errors.

use std::process::Command;

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_debian_package_has_the_binaries_units_conffiles_man_pages_and_completions_and_lintian_finds_no_error() {
    let root = pdctl_tests::pdctl_sandbox::repo_root();
    let out_dir = std::env::temp_dir().join(format!("pdctl-deb-{}", std::process::id()));
    let deb = run(root.join("scripts/package-deb").to_str().expect("path"), &[out_dir.to_str().expect("path")]).trim().to_string();
    let files = run("dpkg-deb", &["-c", &deb]);
    for path in [
        "./usr/bin/pdctl",
        "./usr/sbin/pdctld",
        "./lib/systemd/system/pdctld.service",
        "./lib/systemd/system/pdctl-rollout.service",
        "./lib/systemd/system/pdctl-rollout.timer",
        "./etc/pdctl/pdctl.toml",
        "./etc/pdctl/config.d/README",
        "./usr/lib/sysusers.d/pdctl.conf",
        "./usr/share/polkit-1/rules.d/50-pdctl.rules",
        "./usr/share/pdctl/pdctld-as-pdctl-user.conf",
        "./usr/share/man/man1/pdctl.1.gz",
        "./usr/share/man/man1/pdctl-fleet.1.gz",
        "./usr/share/man/man8/pdctld.8.gz",
        "./usr/share/bash-completion/completions/pdctl",
        "./usr/share/zsh/vendor-completions/_pdctl",
        "./usr/share/fish/vendor_completions.d/pdctl.fish",
        "./usr/share/doc/pdctl/copyright",
    ] {
        assert!(files.lines().any(|l| l.ends_with(path)), "{path} missing from:\n{files}");
    }
    assert_eq!(run("dpkg-deb", &["-f", &deb, "Package"]).trim(), "pdctl");
    assert!(run("dpkg-deb", &["-f", &deb, "Depends"]).contains("libsystemd0"));
    let ctl = out_dir.join("control");
    run("dpkg-deb", &["-e", &deb, ctl.to_str().expect("path")]);
    let conffiles = std::fs::read_to_string(ctl.join("conffiles")).expect("conffiles");
    assert!(conffiles.lines().any(|l| l == "/etc/pdctl/pdctl.toml"), "{conffiles}");
    let postinst = std::fs::read_to_string(ctl.join("postinst")).expect("postinst");
    assert!(postinst.contains("daemon-reload"), "{postinst}");
    assert!(!postinst.contains("systemctl enable") && !postinst.contains("deb-systemd-helper enable"), "nothing is enabled without the operator: {postinst}");
    assert!(postinst.contains("a rollout runs"), "an upgrade never restarts pdctld under a rollout: {postinst}");
    // The unit runs the packaged daemon, its socket usable by the pdctl group.
    let x = out_dir.join("root");
    run("dpkg-deb", &["-x", &deb, x.to_str().expect("path")]);
    let service = std::fs::read_to_string(x.join("lib/systemd/system/pdctld.service")).expect("unit");
    assert!(service.contains("ExecStart=/usr/sbin/pdctld --socket-group pdctl --socket"), "{service}");
    // The accounts for pdctld as its own user: what the postinst's systemd-sysusers creates,
    // created here in the extracted tree.
    assert!(postinst.contains("systemd-sysusers pdctl.conf"), "{postinst}");
    let sysusers = Command::new("systemd-sysusers")
        .arg(format!("--root={}", x.display()))
        .arg(x.join("usr/lib/sysusers.d/pdctl.conf"))
        .output()
        .expect("systemd-sysusers");
    assert!(sysusers.status.success(), "{}", String::from_utf8_lossy(&sysusers.stderr));
    let passwd = std::fs::read_to_string(x.join("etc/passwd")).expect("passwd");
    let group = std::fs::read_to_string(x.join("etc/group")).expect("group");
    let gid_of = |name: &str| group.lines().find(|l| l.starts_with(&format!("{name}:"))).and_then(|l| l.split(':').nth(2)).map(str::to_string);
    let user = passwd.lines().find(|l| l.starts_with("pdctl:")).unwrap_or_else(|| panic!("the pdctl user: {passwd}"));
    assert_eq!(user.split(':').nth(3).map(str::to_string), gid_of("pdctl"), "its primary group is pdctl: {user}");
    assert!(user.contains(":/var/lib/pdctl:"), "its home is its state directory: {user}");
    assert!(gid_of("pdctl-units").is_some(), "the group of the directories it may write in: {group}");
    // The rule names the example config's units for that user; the drop-in runs pdctld as it.
    let rule = std::fs::read_to_string(x.join("usr/share/polkit-1/rules.d/50-pdctl.rules")).expect("rule");
    assert!(rule.contains("subject.user != \"pdctl\"") && rule.contains("\"sglang-prefill.service\", \"sglang-decode.service\""), "{rule}");
    let dropin = std::fs::read_to_string(x.join("usr/share/pdctl/pdctld-as-pdctl-user.conf")).expect("drop-in");
    assert!(dropin.contains("\nUser=pdctl\n") && dropin.contains("\nCapabilityBoundingSet=\n"), "{dropin}");
    let completion = std::fs::read_to_string(x.join("usr/share/bash-completion/completions/pdctl")).expect("completion");
    assert!(completion.contains("fleet") && completion.contains("rollout"), "generated from the CLI definition");
    // lintian: no errors (warnings are printed for the record).
    let l = Command::new("lintian").args(["--no-tag-display-limit", &deb]).output().expect("lintian (scripts/setup installs it)");
    let report = String::from_utf8_lossy(&l.stdout).into_owned();
    eprintln!("lintian:\n{report}");
    let errors: Vec<&str> = report.lines().filter(|l| l.starts_with("E:")).collect();
    assert!(errors.is_empty(), "lintian errors: {errors:#?}");
    let _ = std::fs::remove_dir_all(out_dir);
}
