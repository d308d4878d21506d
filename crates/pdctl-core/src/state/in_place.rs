//! Whether a config rollout's change is new weights only, which SGLang can load into a running
//! server (`POST /update_weights_from_disk`, 0.5.23 `entrypoints/http_server.py`) instead of a
//! restart: every file of the worker is the same as in the revision it runs, but for its
//! `ExecStart=` lines (a drop-in that only sets `ExecStart` may be new), and the command
//! systemd runs from them differs only in the values of `--model-path` (`--model`) and
//! `--weight-version` — and in how its tokenizer is named, as long as it stays the same one. Any
//! other difference — another flag, an environment line, another setting — needs a restart, and
//! the reason names it. Pure: whether two tokenizer paths hold the same tokenizer is asked of the
//! caller ([`crate::sglang::tokenizer::same`] on the host).
//!
//! The tokenizer: SGLang loads weights in place, not a tokenizer, so a load keeps the one the
//! server started with — `--tokenizer-path`, or else its start's `--model-path`. The new files
//! may leave it unpinned (it then follows the new `--model-path`) or pin it
//! (`--tokenizer-path`); either loads in place when the tokenizer they resolve is the one that
//! runs: the same path, or the same tokenizer files. Otherwise the change is a new tokenizer:
//! a restart, rolled as any model change is (a coherent switch, or refused as `mixed_versions`).
//!
//! What a successful in-place load leaves (0.5.23 `managers/tokenizer_manager.py`
//! `_update_model_path_info`): `/model_info` reports the new `model_path` and `weight_version`
//! (and the model path as `served_model_name`), `/server_info` keeps the startup values; a later
//! restart starts from the new files, so the two agree again.

use std::collections::BTreeMap;

use crate::state::revisions::Revision;

/// The flags an in-place load changes, and the tokenizer's (which may be named otherwise as long
/// as it resolves the same).
pub const IN_PLACE_FLAGS: &[&str] = &["--model-path", "--model", "--weight-version", "--tokenizer-path"];

/// Why a change is not loaded in place, so a rollout restarts instead: one sentence that names the
/// flag, line, file or worker (the rollout's notes and `pdctl rollout diff` say it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotInPlace {
    /// `[rollout] in_place = "never"`.
    #[error("[rollout] in_place = \"never\"")]
    Never,
    /// A fleet's other hosts would pair across versions.
    #[error("with [fleet] the other hosts' workers would pair with these across versions (`pdctl fleet weights` loads every host in step)")]
    Fleet,
    /// A file's contents were not kept on record.
    #[error("{0}'s contents are not on record")]
    NotOnRecord(String),
    /// A line other than `ExecStart=` changes (`line` already redacted).
    #[error("{path} changes more than its ExecStart's weights ({line})")]
    OtherLines {
        /// The file.
        path: String,
        /// The line, as it may be said.
        line: String,
    },
    /// Not exactly one `ExecStart=` takes effect.
    #[error("its ExecStart is not one command line")]
    NotOneCommand,
    /// The command line cannot be split into flags.
    #[error("its ExecStart does not read")]
    Unreadable,
    /// Another flag changes (`change` already redacted).
    #[error("its ExecStart changes {0} besides --model-path and --weight-version: only new weights load in place")]
    OtherFlags(String),
    /// The new command names no model.
    #[error("its new ExecStart names no --model-path")]
    NoModelPath,
    /// The weights are the same.
    #[error("its ExecStart's weights do not change")]
    WeightsUnchanged,
    /// The tokenizer the new files resolve is not the one that runs.
    #[error("{named} changes {running} → {asked} ({why}): SGLang loads weights in place, not a tokenizer, so this is a restart; to load in place keep the tokenizer it runs (--tokenizer-path {running})")]
    Tokenizer {
        /// How the new files name it.
        named: &'static str,
        /// The tokenizer the server runs.
        running: String,
        /// The one the new files resolve.
        asked: String,
        /// Why they differ.
        why: String,
    },
    /// A worker's files could not be compared (the reader thread failed).
    #[error("its files could not be compared ({0})")]
    NotCompared(String),
    /// A worker's unit cannot be read from systemd.
    #[error("its unit cannot be read ({0})")]
    UnitUnreadable(String),
    /// No revision of a worker is on record.
    #[error("the files it runs are not on record")]
    NoRecord,
    /// One worker's reason.
    #[error("{unit}: {why}")]
    Worker {
        /// The worker's unit.
        unit: String,
        /// Why.
        why: Box<NotInPlace>,
    },
    /// Two workers ask for different weights.
    #[error("{unit} asks for {asked} but {other} for {theirs}: one load serves every worker the same weights")]
    Differ {
        /// The worker that differs.
        unit: String,
        /// What it asks for.
        asked: String,
        /// The first worker.
        other: String,
        /// What that asks for.
        theirs: String,
    },
    /// The plan changes no worker.
    #[error("no worker changes")]
    NothingChanges,
    /// A PD worker that does not change would pair with the loaded ones across versions.
    #[error("{0} does not change with the others: new weights in only some PD workers would pair versions")]
    PartOfPd(String),
}

/// The weights a worker's new files ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The new `--model-path`.
    pub model_path: String,
    /// The new `--weight-version`, when given.
    pub version: Option<String>,
}

/// A file's logical lines: a line ending in `\` continues on the next (systemd's syntax).
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        match line.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(line);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// An `ExecStart=` line's words without the in-place flags and their values, and those values.
fn split_exec(line: &str) -> Option<(Vec<String>, BTreeMap<String, String>)> {
    let cmd = line.trim().strip_prefix("ExecStart=")?;
    let mut rest = Vec::new();
    let mut values = BTreeMap::new();
    let mut words = cmd.split_whitespace();
    while let Some(w) = words.next() {
        let (name, inline) = match w.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (w, None),
        };
        if IN_PLACE_FLAGS.contains(&name) {
            let key = if name == "--model" { "--model-path" } else { name };
            let v = inline.or_else(|| words.next().map(String::from)).unwrap_or_default();
            values.insert(key.to_string(), v);
        } else {
            rest.push(w.to_string());
        }
    }
    Some((rest, values))
}

/// Each file's setting lines other than `ExecStart=`, by path.
type SettingLines = BTreeMap<String, Vec<String>>;

/// A revision read as systemd would: its effective `ExecStart=` (the unit file's, then each
/// drop-in's in file-name order; an empty `ExecStart=` clears the list), and every other setting
/// line of each file (section headers, blank lines and comments aside).
fn read(rev: &Revision) -> Result<(Vec<String>, SettingLines), NotInPlace> {
    let name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let mut units: Vec<(&String, &str)> = Vec::new();
    let mut others = BTreeMap::new();
    for (path, f) in &rev.files {
        if f.sha256 == "absent" {
            continue;
        }
        let Some(text) = f.contents.as_deref() else { return Err(NotInPlace::NotOnRecord(path.clone())) };
        let mut rest = Vec::new();
        for line in logical_lines(text) {
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') || t.starts_with(';') || t.starts_with('[') {
                continue;
            }
            if t.starts_with("ExecStart=") {
                units.push((path, text));
            } else {
                rest.push(t.to_string());
            }
        }
        others.insert(path.clone(), rest);
    }
    // The unit file first (it has no `.d/` in its path), then the drop-ins by name.
    let mut files: Vec<&String> = units.iter().map(|(p, _)| *p).collect();
    files.dedup();
    files.sort_by_key(|p| (p.contains(".d/"), name(p)));
    let mut exec: Vec<String> = Vec::new();
    for p in files {
        let text = rev.files.get(p.as_str()).and_then(|f| f.contents.as_deref()).unwrap_or_default();
        for line in logical_lines(text) {
            if let Some(cmd) = line.trim().strip_prefix("ExecStart=") {
                if cmd.trim().is_empty() {
                    exec.clear();
                } else {
                    exec.push(format!("ExecStart={}", cmd.trim()));
                }
            }
        }
    }
    Ok((exec, others))
}

/// The command line a restart would run from the files of `rev` (the first effective
/// `ExecStart=`'s words, split on whitespace as the flags pdctl reads need; systemd's quoting
/// is not interpreted): what a dry run compares before the manager has loaded the files.
/// `None`: no `ExecStart=`.
pub fn effective_argv(rev: &Revision) -> Result<Option<Vec<String>>, String> {
    let (exec, _) = read(rev).map_err(|e| e.to_string())?;
    let Some(argv) = exec.first().and_then(|l| l.strip_prefix("ExecStart=")).map(|cmd| cmd.split_whitespace().map(String::from).collect::<Vec<_>>()) else {
        return Ok(None);
    };
    // Its `--config` file as the revision holds it (a revision taken before the unit named it:
    // as the disk has it).
    let merged = crate::sglang::launch_config::expand(&argv, |path| match rev.files.get(path) {
        Some(f) => f.contents.clone().ok_or_else(|| "absent".to_string()),
        None => std::fs::read_to_string(path).map_err(|e| e.to_string()),
    });
    merged.map(Some).map_err(|e| e.to_string())
}

/// The flags of a command line's words with their values (`--flag value`, `--flag=value`; a
/// flag followed by another flag, or last, has none), in order; words before the first flag (the
/// program) under "".
fn flags(words: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut it = words.iter().peekable();
    while let Some(w) = it.next() {
        if let Some((n, v)) = w.split_once('=').filter(|(n, _)| n.starts_with("--")) {
            out.push((n.to_string(), v.to_string()));
        } else if w.starts_with("--") {
            let v = it.next_if(|n| !n.starts_with("--")).cloned().unwrap_or_default();
            out.push((w.clone(), v));
        } else {
            match out.last_mut() {
                Some(last) => last.1 = format!("{} {w}", last.1).trim().to_string(),
                None => out.push((String::new(), w.clone())),
            }
        }
    }
    out
}

/// The first flag that differs between two command lines, said as a change
/// ("--dtype bfloat16 → float16", "--quantization fp8 added", "--program changes").
/// A changed line of a unit's files (a unit file, a drop-in or an env file) as it may be said
/// (in `rollout diff`, a record's notes, pdctld's log): the value of an environment variable —
/// an env file's `NAME=…` or an `Environment=NAME=…` setting — is never shown, since they carry
/// tokens (`HF_TOKEN=…`), and the values of secret-bearing flags are masked. A unit setting
/// (`TimeoutStopSec=30`) is said as it is.
fn said(line: &str) -> String {
    let l = crate::redact::line(line);
    let (head, rest) = match l.strip_prefix("Environment=") {
        Some(r) => ("Environment=", r),
        None => ("", l.trim_start_matches("export ")),
    };
    let env_name = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    match rest.trim_start_matches('"').split_once('=') {
        Some((key, _)) if !head.is_empty() || env_name(key) => format!("{head}{key}=… (value not shown)"),
        _ => l.clone(),
    }
}

fn first_change(old: &[String], new: &[String]) -> String {
    let (a, b) = (flags(old), flags(new));
    let show = |v: &str| if v.is_empty() { String::new() } else { format!(" {v}") };
    for (n, v) in &b {
        match a.iter().find(|(m, _)| m == n) {
            None if n.is_empty() => return format!("its program ({v})"),
            None => return format!("{n}{} added", show(v)),
            Some((_, w)) if w != v && n.is_empty() => return format!("its program ({w} → {v})"),
            Some((_, w)) if w != v => return format!("{n}{} →{}", show(w), show(v)),
            Some(_) => {}
        }
    }
    match a.iter().find(|(m, _)| !b.iter().any(|(n, _)| n == m)) {
        Some((n, v)) => format!("{n}{} removed", show(v)),
        None => "the order of its flags".into(),
    }
}

/// What `new` asks a worker running `old` to load, when that is all that changes; `Err`: why it
/// needs a restart (one sentence that names the flag or line). `same_tokenizer(a, b)` tells
/// whether two tokenizer paths hold the same tokenizer (`Err`: why not).
pub fn target<E: std::fmt::Display>(old: &Revision, new: &Revision, same_tokenizer: impl Fn(&str, &str) -> Result<(), E>) -> Result<Target, NotInPlace> {
    let (old_exec, old_rest) = read(old)?;
    let (new_exec, new_rest) = read(new)?;
    let paths: std::collections::BTreeSet<&String> = old_rest.keys().chain(new_rest.keys()).collect();
    for p in paths {
        let (a, b) = (old_rest.get(p).cloned().unwrap_or_default(), new_rest.get(p).cloned().unwrap_or_default());
        if a != b {
            let changed = b.iter().find(|l| !a.contains(l)).or_else(|| a.iter().find(|l| !b.contains(l))).cloned().unwrap_or_default();
            return Err(NotInPlace::OtherLines { path: p.clone(), line: said(&changed) });
        }
    }
    let ([a], [b]) = (old_exec.as_slice(), new_exec.as_slice()) else {
        return Err(NotInPlace::NotOneCommand);
    };
    let (Some((ar, av)), Some((br, bv))) = (split_exec(a), split_exec(b)) else { return Err(NotInPlace::Unreadable) };
    if ar != br {
        return Err(NotInPlace::OtherFlags(crate::redact::line(&first_change(&ar, &br))));
    }
    let Some(model_path) = bv.get("--model-path").filter(|p| !p.is_empty()).cloned() else {
        return Err(NotInPlace::NoModelPath);
    };
    let weights = |v: &BTreeMap<String, String>| (v.get("--model-path").cloned(), v.get("--weight-version").cloned());
    if weights(&av) == weights(&bv) {
        return Err(NotInPlace::WeightsUnchanged);
    }
    // The tokenizer the server runs (it keeps its start's) and the one the new files resolve.
    let tokenizer = |v: &BTreeMap<String, String>| v.get("--tokenizer-path").or(v.get("--model-path")).cloned().unwrap_or_default();
    let (running, asked) = (tokenizer(&av), tokenizer(&bv));
    if let Err(why) = same_tokenizer(&running, &asked) {
        let named = if bv.contains_key("--tokenizer-path") { "--tokenizer-path" } else { "its tokenizer (no --tokenizer-path: it follows --model-path)" };
        return Err(NotInPlace::Tokenizer { named, running, asked, why: why.to_string() });
    }
    Ok(Target { model_path, version: bv.get("--weight-version").cloned() })
}

/// One target for a whole plan: every worker's change loadable in place, all to the same
/// weights; `Err`: why the plan restarts instead.
pub fn one_target(per_worker: &[(String, Result<Target, NotInPlace>)]) -> Result<Target, NotInPlace> {
    let mut first: Option<(&str, &Target)> = None;
    for (unit, t) in per_worker {
        let t = t.as_ref().map_err(|why| NotInPlace::Worker { unit: unit.clone(), why: Box::new(why.clone()) })?;
        match first {
            None => first = Some((unit, t)),
            Some((u, f)) if f != t => return Err(NotInPlace::Differ { unit: unit.clone(), asked: show(t), other: u.to_string(), theirs: show(f) }),
            Some(_) => {}
        }
    }
    first.map(|(_, t)| t.clone()).ok_or(NotInPlace::NothingChanges)
}

/// "/models/b (weight_version v2)".
pub fn show(t: &Target) -> String {
    show_parts(&t.model_path, t.version.as_deref())
}

/// [`show`] of a model path and an optional version.
pub fn show_parts(model_path: &str, version: Option<&str>) -> String {
    match version {
        Some(v) => format!("{model_path} (weight_version {v})"),
        None => model_path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::revisions::FileRev;

    #[test]
    fn a_changed_lines_secrets_are_never_said() {
        assert_eq!(said("HF_TOKEN=hf_NEWSECRET"), "HF_TOKEN=… (value not shown)");
        assert_eq!(said("export HF_TOKEN=hf_NEWSECRET"), "HF_TOKEN=… (value not shown)");
        assert_eq!(said("Environment=HF_TOKEN=hf_x"), "Environment=HF_TOKEN=… (value not shown)");
        assert_eq!(said("TimeoutStopSec=30"), "TimeoutStopSec=30", "a unit setting is said");
        let flag = crate::redact::line(&first_change(&["sglang".into()], &["sglang".into(), "--api-key".into(), "sk-live-123".into()]));
        assert!(flag.contains("--api-key") && !flag.contains("sk-live-123"), "{flag}");
    }

    fn rev(files: &[(&str, &str)]) -> Revision {
        Revision {
            unit: "u.service".into(),
            recorded_at: 0,
            why: "t".into(),
            files: files
                .iter()
                .map(|(p, c)| {
                    (
                        p.to_string(),
                        FileRev {
                            sha256: format!("{:x}", c.len() * 31 + c.bytes().map(u64::from).sum::<u64>() as usize),
                            contents: Some(c.to_string()),
                            owner: None,
                        },
                    )
                })
                .collect(),
        }
    }

    const UNIT: &str = "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m/a --tokenizer-path /m/tok --port 1 --disaggregation-mode prefill\nRestart=no\n";

    #[test]
    fn a_new_model_path_and_version_in_a_drop_in_load_in_place() {
        let old = rev(&[("/u", UNIT), ("/u.d/50.conf", "[Service]\nExecStart=\nExecStart=x --model-path /m/a --port 1 --tokenizer-path=/m/tok\n")]);
        assert!(read(&old).is_ok());
        let new =
            rev(&[("/u", UNIT), ("/u.d/50.conf", "[Service]\nExecStart=\nExecStart=x --model=/m/b --port 1 --tokenizer-path=/m/tok --weight-version v2\n")]);
        assert_eq!(target(&old, &new, by_path), Ok(Target { model_path: "/m/b".into(), version: Some("v2".into()) }));
        // A new drop-in that only replaces ExecStart (what `systemctl edit` writes).
        let new = rev(&[("/u", UNIT), ("/u.d/60.conf", "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m/b --tokenizer-path /m/tok --port 1 --disaggregation-mode prefill\n")]);
        assert_eq!(target(&rev(&[("/u", UNIT)]), &new, by_path).map(|t| t.model_path), Ok("/m/b".to_string()));
        // One that adds a second ExecStart (systemd would run both) is not one command.
        let new = rev(&[("/u", UNIT), ("/u.d/60.conf", "[Service]\nExecStart=x --model-path /m/b\n")]);
        assert!(target(&rev(&[("/u", UNIT)]), &new, by_path).unwrap_err().to_string().contains("not one command"));
        // Across a continuation line too.
        let cont = UNIT.replace(" --port 1", " \\\n  --port 1");
        let new = rev(&[("/u", &cont.replace("/m/a", "/m/b"))]);
        assert_eq!(target(&rev(&[("/u", &cont)]), &new, by_path).map(|t| t.model_path), Ok("/m/b".to_string()));
    }

    /// Tokenizers judged by path alone (the host's files are [`crate::sglang::tokenizer::same`]'s).
    fn by_path(a: &str, b: &str) -> Result<(), String> {
        if a == b {
            Ok(())
        } else {
            Err("other files".into())
        }
    }

    #[test]
    fn any_other_change_needs_a_restart_and_names_the_flag() {
        let old = rev(&[("/u", UNIT)]);
        let e = target(&old, &rev(&[("/u", &UNIT.replace("--port 1", "--port 2").replace("/m/a", "/m/b"))]), by_path).unwrap_err().to_string();
        assert!(e.contains("changes --port 1 → 2 besides --model-path"), "{e}");
        let e = target(&old, &rev(&[("/u", &UNIT.replace("/m/a", "/m/b --dtype float16"))]), by_path).unwrap_err().to_string();
        assert!(e.contains("--dtype float16 added"), "{e}");
        let e = target(&old, &rev(&[("/u", &UNIT.replace(" --disaggregation-mode prefill", ""))]), by_path).unwrap_err().to_string();
        assert!(e.contains("--disaggregation-mode prefill removed"), "{e}");
        let e = target(&old, &rev(&[("/u", &UNIT.replace("Restart=no", "Restart=on-failure"))]), by_path).unwrap_err().to_string();
        assert!(e.contains("Restart=on-failure"), "{e}");
        let e = target(&old, &rev(&[("/u", UNIT), ("/e", "A=1")]), by_path).unwrap_err().to_string();
        assert!(e.contains("/e changes more") && e.contains("A=… (value not shown)") && !e.contains("A=1"), "an env value is never said: {e}");
        assert!(target(&old, &old, by_path).unwrap_err().to_string().contains("do not change"));
        // A new version of the same path: the tokenizer stays.
        let free = UNIT.replace(" --tokenizer-path /m/tok", "");
        let v2 = free.replace("/m/a", "/m/a --weight-version v2");
        assert_eq!(target(&rev(&[("/u", &free)]), &rev(&[("/u", &v2)]), by_path).map(|t| t.version), Ok(Some("v2".to_string())));
    }

    #[test]
    fn a_new_path_loads_in_place_when_its_tokenizer_resolves_to_the_one_that_runs() {
        let free = UNIT.replace(" --tokenizer-path /m/tok", "");
        let old = rev(&[("/u", &free)]);
        // Unpinned, it follows the new path: in place when that path holds the same tokenizer.
        let moved = rev(&[("/u", &free.replace("/m/a", "/m/b"))]);
        let same_files = |_: &str, _: &str| Ok::<(), String>(());
        assert_eq!(target(&old, &moved, same_files).map(|t| t.model_path), Ok("/m/b".to_string()));
        let e = target(&old, &moved, by_path).unwrap_err().to_string();
        assert!(e.starts_with("its tokenizer (no --tokenizer-path: it follows --model-path) changes /m/a → /m/b (other files)"), "{e}");
        assert!(e.contains("keep the tokenizer it runs (--tokenizer-path /m/a)"), "{e}");
        // The runbook's way: the new files pin the tokenizer the server started with.
        let pinned = rev(&[("/u", &free.replace("--model-path /m/a", "--model-path /m/b --tokenizer-path /m/a"))]);
        assert_eq!(target(&old, &pinned, by_path).map(|t| t.model_path), Ok("/m/b".to_string()));
        // Pinned to another tokenizer: a restart, and the flag is named.
        let other = rev(&[("/u", &UNIT.replace("/m/a", "/m/b").replace("/m/tok", "/m/tok2"))]);
        let e = target(&rev(&[("/u", UNIT)]), &other, by_path).unwrap_err().to_string();
        assert!(e.starts_with("--tokenizer-path changes /m/tok → /m/tok2"), "{e}");
        // A pinned tokenizer dropped while it is the model path's: the same tokenizer.
        let unpin = rev(&[("/u", &UNIT.replace("/m/tok", "/m/a").replace("--model-path /m/a", "--model-path /m/a --weight-version v3"))]);
        let back = rev(&[("/u", &free.replace("--model-path /m/a", "--model-path /m/a --weight-version v4"))]);
        assert_eq!(target(&unpin, &back, by_path).map(|t| t.version), Ok(Some("v4".to_string())));
    }

    #[test]
    fn one_plan_loads_one_target_or_restarts() {
        let t = |p: &str| Ok(Target { model_path: p.into(), version: None });
        assert_eq!(one_target(&[("p".into(), t("/m/b")), ("d".into(), t("/m/b"))]), t("/m/b"));
        let e = one_target(&[("p".into(), t("/m/b")), ("d".into(), t("/m/c"))]).unwrap_err().to_string();
        assert!(e.contains("d asks for /m/c but p for /m/b"), "{e}");
        let e = one_target(&[("p".into(), t("/m/b")), ("d".into(), Err(NotInPlace::NoModelPath))]).unwrap_err();
        assert_eq!(e.to_string(), "d: its new ExecStart names no --model-path");
    }
}
