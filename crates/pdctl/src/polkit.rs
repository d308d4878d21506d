//! `pdctl polkit-rule`: the polkit rule that lets pdctld, run as its own unprivileged account (the
//! packaged drop-in `pdctld-as-pdctl-user.conf`), do exactly what a rollout asks of systemd and
//! nothing more — as Zincati's shipped rule lets the `zincati` user reboot and nothing else.
//!
//! What pdctld asks of systemd over D-Bus (crates/pdctl-systemd): `StartUnit`, `StopUnit`,
//! `RestartUnit`, `ResetFailedUnit` on a configured worker, and `Reload` (daemon-reload, after a
//! rollback or a role change wrote a unit's files back). systemd asks polkit for each unprivileged
//! caller: `org.freedesktop.systemd1.manage-units` with the details `unit` and `verb` (`start`,
//! `stop`, `restart`, `reset-failed`), and `org.freedesktop.systemd1.reload-daemon`. polkit's rules
//! cannot read pdctl's config, so the unit names are written into the rule from it: run this again
//! when `[[worker]]` changes.

use std::path::Path;

use pdctl_contract::api::Exit;

/// Where the rule goes (rules in /etc take precedence over a file of the same name in
/// /usr/share/polkit-1/rules.d, where the package puts the one for its own example config).
pub const RULE: &str = "/etc/polkit-1/rules.d/50-pdctl.rules";

/// The verbs of `manage-units` a rollout uses.
pub const VERBS: [&str; 4] = ["start", "stop", "restart", "reset-failed"];

/// The rule's text: `user` may do [`VERBS`] on exactly `units`, and reload systemd.
pub fn text(user: &str, units: &[String], source: &Path) -> String {
    let list = |v: &mut dyn Iterator<Item = String>| v.map(|s| serde_json::Value::String(s).to_string()).collect::<Vec<_>>().join(", ");
    let units = list(&mut units.iter().cloned());
    let verbs = list(&mut VERBS.iter().map(|v| v.to_string()));
    let user = serde_json::Value::String(user.to_string()).to_string();
    format!(
        "// 50-pdctl.rules — written by `pdctl polkit-rule` from {source}\n\
         // pdctld, run as the account {user} (not root), may start, stop and restart exactly the\n\
         // SGLang units its config names and clear their failed state, and reload systemd's\n\
         // configuration (after a rollback wrote a unit's files back). Nothing else: any other\n\
         // unit, verb or action falls through to polkit's defaults (administrator only).\n\
         // Run `pdctl polkit-rule --write` again whenever [[worker]] changes.\n\
         polkit.addRule(function(action, subject) {{\n\
         \x20   if (subject.user != {user}) {{\n\
         \x20       return polkit.Result.NOT_HANDLED;\n\
         \x20   }}\n\
         \x20   if (action.id == \"org.freedesktop.systemd1.reload-daemon\") {{\n\
         \x20       return polkit.Result.YES;\n\
         \x20   }}\n\
         \x20   if (action.id == \"org.freedesktop.systemd1.manage-units\") {{\n\
         \x20       var units = [{units}];\n\
         \x20       var verbs = [{verbs}];\n\
         \x20       if (units.indexOf(action.lookup(\"unit\")) >= 0 && verbs.indexOf(action.lookup(\"verb\")) >= 0) {{\n\
         \x20           return polkit.Result.YES;\n\
         \x20       }}\n\
         \x20   }}\n\
         \x20   return polkit.Result.NOT_HANDLED;\n\
         }});\n",
        source = source.display(),
    )
}

/// `pdctl polkit-rule [--user NAME] [--write]`.
pub fn run(config: &Path, user: &str, write: bool) -> Exit {
    if user.is_empty() || !user.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
        eprintln!("pdctl: ✗ --user {user:?} is not an account name (letters, digits, _ - .); give the account pdctld.service runs as");
        return Exit::Usage;
    }
    let s = match crate::context::settings(config) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let units: Vec<String> = s.workers.iter().map(|w| w.unit.clone()).collect();
    let t = text(user, &units, config);
    if !write {
        print!("{t}");
        println!("// next: pdctl polkit-rule --write (as root); polkitd reads it at once");
        return Exit::Ok;
    }
    // polkitd watches the directory and reloads its rules itself.
    match pdctl_core::state::revisions::atomic_write(Path::new(RULE), t.as_bytes(), 0o644) {
        Ok(()) => {
            println!("pdctl: ✓ wrote {RULE} ({} unit(s) for account {user}); next: systemctl restart pdctld while no rollout runs (pdctl status)", units.len());
            Exit::Ok
        }
        Err(e) => {
            eprintln!("pdctl: ✗ cannot write {RULE}: {e}; run as root (polkit's rules directory is root's)");
            Exit::Unreachable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_exactly_the_configured_units_the_verbs_and_the_account() {
        let t = text("pdctl", &["sglang-prefill.service".into(), "sglang-decode.service".into()], Path::new("/etc/pdctl/pdctl.toml"));
        assert!(t.contains("if (subject.user != \"pdctl\")"), "{t}");
        assert!(t.contains("var units = [\"sglang-prefill.service\", \"sglang-decode.service\"];"), "{t}");
        assert!(t.contains("var verbs = [\"start\", \"stop\", \"restart\", \"reset-failed\"];"), "{t}");
        assert!(t.contains("org.freedesktop.systemd1.reload-daemon") && !t.contains("manage-unit-files"), "{t}");
        // A name is a JavaScript string literal, never code.
        let odd = text("pdctl", &["a\"b.service".into()], Path::new("x"));
        assert!(odd.contains("[\"a\\\"b.service\"]"), "{odd}");
    }
}
