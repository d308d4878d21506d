//! A worker's role as its unit says it: `pdctl role set` writes the drop-in
//! `UNIT.d/90-pdctl-role.conf` whose ExecStart= is the unit's own command with its new
//! `--disaggregation-mode` ([`crate::sglang::role_switch::with_role`]). The drop-in is part of the
//! unit's files, so it is recorded in the unit's revision like any change: a later restart, a
//! rollback or a reboot keeps the role, `rollout diff` shows it, and a revert takes it back.
//! The words are written as systemd parses them back (`systemd.syntax(7)`: quoted where needed,
//! `%` and `$` doubled so that neither specifiers nor variables are expanded).

use std::path::{Path, PathBuf};

use crate::config::Role;
use crate::state::safe_path;

/// The drop-in's file name: late in the order, so that it replaces the command of any earlier one.
pub const NAME: &str = "90-pdctl-role.conf";

/// Where `unit`'s role drop-in goes: beside its unit file when that is in `/etc` or `/run` (or any
/// other directory an administrator writes), else `/etc/systemd/system` (a unit shipped in
/// `/usr/lib` is changed from `/etc`).
pub fn path(unit: &str, fragment_path: &str) -> PathBuf {
    let fragment = Path::new(fragment_path);
    let dir = match fragment.parent() {
        Some(d) if fragment.is_absolute() && !d.starts_with("/usr") && !d.starts_with("/lib") => d.to_path_buf(),
        _ => PathBuf::from("/etc/systemd/system"),
    };
    dir.join(format!("{unit}.d")).join(NAME)
}

/// One word as systemd reads it back from an ExecStart= line.
pub fn quote(word: &str) -> String {
    let escaped = word.replace('%', "%%").replace('$', "$$");
    let plain = !escaped.is_empty() && escaped.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%$".contains(c));
    if plain {
        return escaped;
    }
    let mut out = String::with_capacity(escaped.len() + 2);
    out.push('"');
    for c in escaped.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The drop-in's text: `argv` (the unit's command as systemd holds it, no `--config` merged in)
/// running `role`.
pub fn text(unit: &str, role: Role, argv: &[String]) -> String {
    let words = crate::sglang::role_switch::with_role(argv, role);
    let line: Vec<String> = words.iter().map(|w| quote(w)).collect();
    format!(
        "# Written by pdctl role set: {unit} runs as {role}. Recorded in the unit's revision like any\n\
         # change; `pdctl role set {unit} <role>` changes it again, `pdctl rollout revert` takes it back.\n\
         [Service]\nExecStart=\nExecStart={}\n",
        line.join(" "),
        role = role.as_str()
    )
}

/// What was at a drop-in's place before it was written (`None`: nothing).
pub type Before = Option<String>;

/// Write `text` at `path` (its directory made when missing), through real directories only
/// ([`safe_path`]); returns what was there before, for [`undo`].
pub fn write(path: &Path, text: &str) -> std::io::Result<Before> {
    let dir = path.parent().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} names no file", path.display())))?;
    if let (Some(top), Some(name)) = (dir.parent(), dir.file_name()) {
        let parent = safe_path::open_dir(top)?;
        match rustix::fs::mkdirat(&parent, name, rustix::fs::Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (dir, name) = safe_path::open_parent(path)?;
    let before = std::fs::read_to_string(path).ok();
    safe_path::write_in(&dir, &name, text.as_bytes(), 0o644, None)?;
    Ok(before)
}

/// Put back what [`write`] replaced: the old text, or no file.
pub fn undo(path: &Path, before: &Before) -> std::io::Result<()> {
    let (dir, name) = match safe_path::open_parent(path) {
        Ok(x) => x,
        // Its directory was never made: nothing was written, nothing to take back.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && before.is_none() => return Ok(()),
        Err(e) => return Err(e),
    };
    match before {
        Some(t) => safe_path::write_in(&dir, &name, t.as_bytes(), 0o644, None),
        None => match rustix::fs::unlinkat(&dir, name.as_os_str(), rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_as_systemd_reads_them_back() {
        assert_eq!(quote("--port"), "--port");
        assert_eq!(quote("/usr/bin/python3"), "/usr/bin/python3");
        assert_eq!(quote("a b"), "\"a b\"");
        assert_eq!(quote("100%"), "100%%");
        assert_eq!(quote("$HOME"), "$$HOME");
        assert_eq!(quote("{\"k\": 1}"), "\"{\\\"k\\\": 1}\"");
        assert_eq!(quote(""), "\"\"");
    }

    #[test]
    fn the_drop_in_replaces_the_command_with_the_new_role() {
        let argv: Vec<String> = "/usr/bin/python3 -m sglang.launch_server --disaggregation-mode decode --port 30001".split(' ').map(String::from).collect();
        let t = text("sglang-decode.service", Role::Prefill, &argv);
        assert!(t.contains("[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --disaggregation-mode prefill --port 30001\n"), "{t}");
        assert_eq!(path("a.service", "/etc/systemd/system/a.service"), PathBuf::from("/etc/systemd/system/a.service.d/90-pdctl-role.conf"));
        assert_eq!(path("a.service", "/usr/lib/systemd/system/a.service"), PathBuf::from("/etc/systemd/system/a.service.d/90-pdctl-role.conf"));
        assert_eq!(path("a.service", "/tmp/sb/units/a.service"), PathBuf::from("/tmp/sb/units/a.service.d/90-pdctl-role.conf"));
    }

    #[test]
    fn a_written_drop_in_is_undone_to_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().canonicalize().unwrap().join("u.service.d").join(NAME);
        let before = write(&p, "one").unwrap();
        assert_eq!((before, std::fs::read_to_string(&p).unwrap().as_str()), (None, "one"));
        let before = write(&p, "two").unwrap();
        assert_eq!(before.as_deref(), Some("one"));
        undo(&p, &before).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one");
        undo(&p, &None).unwrap();
        assert!(!p.exists());
        undo(&p, &None).unwrap();
        // A directory never made: nothing to take back.
        undo(&dir.path().canonicalize().unwrap().join("never.d").join(NAME), &None).unwrap();
    }
}
