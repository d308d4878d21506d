//! The house rules that keep each fact in one place, checked on the source tree: the production
//! `pdctl` does not link the test sandbox; exit codes are numbered only in the exit-code table;
//! the router pseudo-unit is spelled only in its constant; nothing points at files outside the
//! repository; every test the fault matrix names exists; no file over 700 lines, no function over
//! 100 (but the tables named in `LONG_ALLOWED`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    pdctl_tests::pdctl_sandbox::repo_root()
}

/// Tracked files (and untracked, not ignored ones) under `dir`, as git lists them.
fn files(dir: &str) -> Vec<PathBuf> {
    let out = Command::new("git").args(["ls-files", "--cached", "--others", "--exclude-standard", dir]).current_dir(root()).output().expect("git ls-files");
    assert!(out.status.success(), "git ls-files: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| root().join(l)).filter(|p| p.is_file()).collect()
}

fn rust_sources(dir: &str) -> Vec<PathBuf> {
    files(dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "rs")).collect()
}

/// Code lines (not comments) of a Rust file, with their numbers, up to its unit-test module.
fn code_lines(p: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    text.lines()
        .enumerate()
        .take_while(|(_, l)| !l.trim_start().starts_with("#[cfg(test)]"))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect()
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn pdctl_does_not_link_the_sandbox() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out =
        Command::new(cargo).args(["tree", "--offline", "-p", "pdctl", "-e", "normal", "--prefix", "none"]).current_dir(root()).output().expect("cargo tree");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("pdctl-core ")), "cargo tree lists pdctl's dependencies:\n{tree}");
    for banned in ["pdctl-sandbox ", "sglang-sim "] {
        assert!(!tree.lines().any(|l| l.starts_with(banned)), "pdctl links {banned}(a test part):\n{tree}");
    }
}

/// Does `line` give an exit code a number outside `pdctl_core::api::Exit`?
fn numbered_exit(line: &str) -> bool {
    let l = line.replace(' ', "");
    let digit_after = |pat: &str| l.match_indices(pat).any(|(i, _)| l[i + pat.len()..].starts_with(|c: char| c.is_ascii_digit()));
    digit_after("process::exit(") || digit_after("\"exit_code\":") || digit_after("exit_code:") || digit_after("exit_code=")
}

#[test]
fn exit_codes_are_numbered_only_in_the_exit_table() {
    let mut bad = Vec::new();
    for dir in ["crates/pdctl", "crates/pdctld", "crates/pdctl-core/src", "crates/pdctl-contract/src"] {
        for p in rust_sources(dir) {
            if p.ends_with("pdctl-contract/src/exit.rs") {
                continue; // the table itself
            }
            for (n, l) in code_lines(&p) {
                if numbered_exit(&l) {
                    bad.push(format!("{}:{n}: {}", rel(&p), l.trim()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "exit codes must come from pdctl_contract::api::Exit:\n{}", bad.join("\n"));
    // The detector itself.
    assert!(numbered_exit("std::process::exit(3);") && numbered_exit("json!({\"exit_code\": 4})") && !numbered_exit("Exit::Busy.exit_process()"));
}

/// Does `line` use the string "router" other than as a JSON key or the step's name?
fn router_as_unit(line: &str) -> bool {
    let q = "\"router\"";
    line.match_indices(q).any(|(i, _)| {
        let after = line[i + q.len()..].trim_start();
        let before = line[..i].trim_end();
        let json_key = after.starts_with(':') || (before.ends_with('[') && after.starts_with(']')) || before.ends_with("insert(");
        let step_name = before.ends_with("Step::Router =>");
        !(json_key || step_name)
    })
}

#[test]
fn the_router_pseudo_unit_is_spelled_only_in_its_constant() {
    let mut bad = Vec::new();
    for p in rust_sources("crates") {
        if p.ends_with("pdctl-contract/src/names.rs") {
            continue; // pub const ROUTER: &str = "router";
        }
        for (n, l) in code_lines(&p) {
            if router_as_unit(&l) {
                bad.push(format!("{}:{n}: {}", rel(&p), l.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "use pdctl_contract::api::ROUTER:\n{}", bad.join("\n"));
    assert!(router_as_unit("if unit == \"router\" {") && !router_as_unit("json!({ \"router\": x })") && !router_as_unit("row[\"router\"]"));
    assert!(!router_as_unit("o.insert(\"router\".into(), v);"), "a JSON key");
}

#[test]
fn nothing_points_outside_the_repository() {
    // Spelled in pieces so that this file does not match itself.
    let needles = [format!("{}/", "shared"), format!("{}.md", "rig"), format!("-{}.md", "facts"), format!("design {}", "card"), format!("{}.md", "design")];
    let mut bad = Vec::new();
    for p in files(".") {
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue; // not text
        };
        for (n, l) in text.lines().enumerate() {
            if let Some(needle) = needles.iter().find(|k| l.contains(k.as_str())) {
                bad.push(format!("{}:{}: mentions {needle:?}: {}", rel(&p), n + 1, l.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "state the fact in place or cite the upstream source:\n{}", bad.join("\n"));
}

/// Every test the fault matrix (docs/reliability.md) points at exists, in the file it names
/// (`tests/rollout.rs` when none); `{a,b}` names both.
#[test]
fn every_test_in_the_fault_matrix_exists() {
    let doc = std::fs::read_to_string(root().join("docs/reliability.md")).unwrap();
    let mut checked = 0;
    for row in doc.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| fault") && !l.starts_with("|---")) {
        let test_cell = row.trim_end_matches('|').rsplit('|').next().unwrap_or("");
        for name in test_cell.split('`').skip(1).step_by(2) {
            let (file, test) = match name.rsplit_once("::") {
                Some((f, t)) if f.ends_with(".rs") => (f.to_string(), t.to_string()),
                Some(_) => continue,
                None if name.contains('_') && !name.contains(' ') => ("rollout.rs".into(), name.to_string()),
                None => continue,
            };
            let path = if file.starts_with("crates/") { root().join(&file) } else { root().join("tests").join(&file) };
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // `…{a,b}` expands to both; a trailing `…` (an elided name) is not a test name.
            let names: Vec<String> = match test.split_once('{') {
                Some((stem, alts)) => alts.trim_end_matches('}').split(',').map(|a| format!("{stem}{a}")).collect(),
                None => vec![test.clone()],
            };
            for n in names.iter().filter(|n| !n.contains('…')) {
                assert!(text.contains(&format!("fn {n}()")), "docs/reliability.md names {n} in {file}, which has no such test");
                checked += 1;
            }
        }
    }
    assert!(checked >= 25, "the matrix names {checked} tests");
}

/// The module a `crate::…` or `super::…` path in `file` (the module `at`) names, as one of
/// `modules` (the longest prefix that is a module of the crate).
fn module_named(path: &[String], modules: &std::collections::BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| modules.contains(m))
}

/// The `use crate::` graph of one crate (`src`): file module → the modules it names, from code
/// lines only (not comments, not the unit-test module).
fn module_graph(src: &Path) -> std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let module_of = |p: &Path| -> Vec<String> {
        let rel = p.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
        if parts.last().is_some_and(|l| l == "mod" || l == "lib" || l == "main") {
            parts.pop();
        }
        parts
    };
    let modules: std::collections::BTreeSet<Vec<String>> = files.iter().map(|p| module_of(p)).collect();
    let mut graph = std::collections::BTreeMap::new();
    for p in &files {
        let at = module_of(p);
        let mut to = std::collections::BTreeSet::new();
        for (_, line) in code_lines(p) {
            let line = line.split("//").next().unwrap_or("").to_string();
            // `crate::{a, b::c}` names `crate::a` and `crate::b::c`.
            let line = match line.split_once("crate::{") {
                Some((head, list)) => {
                    let list = list.split('}').next().unwrap_or("");
                    format!("{head} {}", list.split(',').map(|x| format!("crate::{}", x.trim())).collect::<Vec<_>>().join(" "))
                }
                None => line,
            };
            // The crate root names its own modules without `crate::` (`use render::Kind;`).
            if at.is_empty() {
                let t = line.trim_start().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
                if let Some(rest) = t.strip_prefix("use ") {
                    let first: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if first != "crate" && modules.contains(&vec![first.clone()]) {
                        to.insert(vec![first]);
                    }
                }
            }
            for (i, _) in line.match_indices("crate::").chain(line.match_indices("super::")) {
                if line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    continue; // `pdctl_core::…`, `$crate::…`
                }
                let tail = &line[i..];
                let segs: Vec<String> = tail.split("::").map(|s| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>()).collect();
                let path: Vec<String> = if segs[0] == "crate" {
                    segs[1..].iter().take_while(|s| !s.is_empty()).cloned().collect()
                } else {
                    let ups = segs.iter().take_while(|s| *s == "super").count();
                    let mut base = at.clone();
                    // A file module's `super` is its parent; `mod.rs`' too.
                    for _ in 0..ups {
                        base.pop();
                    }
                    base.extend(segs[ups..].iter().take_while(|s| !s.is_empty()).cloned());
                    base
                };
                if let Some(m) = module_named(&path, &modules).or_else(|| Some(Vec::new()).filter(|_| !path.is_empty())) {
                    if (m.is_empty() || !at.starts_with(&m)) && m != at {
                        to.insert(m);
                    }
                }
            }
        }
        graph.insert(at, to);
    }
    graph
}

/// A cycle in `graph`, if there is one (as module paths).
fn find_cycle(graph: &std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
    fn visit(
        n: &Vec<String>,
        g: &std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
        state: &mut std::collections::BTreeMap<Vec<String>, u8>,
        path: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let from = path.iter().position(|p| p == n).unwrap_or(0);
                return Some(path[from..].iter().chain(std::iter::once(n)).map(|m| m.join("::")).collect());
            }
            _ => {}
        }
        state.insert(n.clone(), 1);
        path.push(n.clone());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = std::collections::BTreeMap::new();
    graph.keys().find_map(|n| visit(n, graph, &mut state, &mut Vec::new()))
}

#[test]
fn no_crate_has_an_import_cycle_between_its_files() {
    let mut cycles = Vec::new();
    let crates = std::fs::read_dir(root().join("crates")).expect("crates/");
    for c in crates.flatten() {
        let src = c.path().join("src");
        if src.is_dir() {
            if let Some(cycle) = find_cycle(&module_graph(&src)) {
                cycles.push(format!("{}: {}", rel(&c.path()), cycle.join(" -> ")));
            }
        }
    }
    assert!(cycles.is_empty(), "files of one crate import each other in a circle (make one a leaf):\n{}", cycles.join("\n"));
    // The control API is on top: nothing that decides imports it (only the fuzz entry points;
    // pdctl-core re-exports the contract's modules under the same names), and inside the
    // contract nothing imports it either.
    let api = vec!["api".to_string()];
    for (dir, allowed) in [("crates/pdctl-core/src", "fuzzing"), ("crates/pdctl-contract/src", "")] {
        let graph = module_graph(&root().join(dir));
        let below: Vec<String> = graph.iter().filter(|(m, to)| to.contains(&api) && m.join("::") != allowed).map(|(m, _)| m.join("::")).collect();
        assert!(below.is_empty(), "the control API is the contract on top; these files of {dir} import it: {below:?}");
    }
    // The contract imports nothing of pdctl's own crates.
    let manifest = std::fs::read_to_string(root().join("crates/pdctl-contract/Cargo.toml")).expect("pdctl-contract's Cargo.toml");
    assert!(!manifest.contains("path ="), "pdctl-contract depends on a crate of the workspace:\n{manifest}");
    // The detector itself: a two-file circle is found, a chain is not.
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let g = |edges: &[(&str, &str)]| {
        let mut g = std::collections::BTreeMap::<Vec<String>, std::collections::BTreeSet<Vec<String>>>::new();
        for (a, b) in edges {
            g.entry(m(a)).or_default().insert(m(b));
            g.entry(m(b)).or_default();
        }
        g
    };
    assert!(find_cycle(&g(&[("a", "b"), ("b", "a")])).is_some());
    assert!(find_cycle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])).is_none());
}

#[test]
fn pdctl_core_reaches_the_drivers_only_through_its_ports() {
    // Its own dependencies: no driver crate, no client of the outside world. What it reads of
    // what the drivers fetch, it reads with pdctl-parse.
    let toml = std::fs::read_to_string(root().join("crates/pdctl-core/Cargo.toml")).expect("crates/pdctl-core/Cargo.toml");
    let deps = toml.split("[dependencies]").nth(1).unwrap_or_default().split("\n[").next().unwrap_or_default();
    let names: Vec<&str> = deps.lines().filter_map(|l| l.split(['=', '.']).next()).map(str::trim).filter(|n| !n.is_empty() && !n.starts_with('#')).collect();
    assert!(names.contains(&"pdctl-parse") && names.contains(&"pdctl-contract"), "the scan reads the dependencies: {names:?}");
    let drivers = ["pdctl-systemd", "pdctl-journal", "pdctl-probe", "pdctl-fleet", "pdctl-real", "reqwest", "hyper", "zbus", "systemd", "etcd-client"];
    let linked: Vec<&&str> = drivers.iter().filter(|d| names.contains(d)).collect();
    assert!(linked.is_empty(), "pdctl-core links {linked:?}: reach it through a port (crates/pdctl-core/src/ports.rs) implemented in pdctl-real");
}

#[test]
fn gates_return_verdicts_and_never_write_events() {
    // A gate hands its typed verdict to the runbook, which writes the step's events: no gate
    // builds an event, holds the event sink, or serializes a passed step's detail itself.
    let mut writing = Vec::new();
    let gates = rust_sources("crates/pdctl-core/src/engine/gates");
    assert!(gates.len() > 10, "the scan reads the gates: {gates:?}");
    for f in &gates {
        for (n, line) in code_lines(f) {
            if ["StepRun", "Sink", "Event {", "Status::"].iter().any(|w| line.contains(w)) {
                writing.push(format!("{}:{n}: {}", rel(f), line.trim()));
            }
        }
    }
    assert!(writing.is_empty(), "gates that write events (return a `Verdict` and let engine/runbook.rs write them):\n{}", writing.join("\n"));
}

#[test]
fn the_architecture_doc_names_every_room_of_the_tree() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md");
    let rooms = doc.split("## Where each thing is decided").next().unwrap_or_default();
    let mut missing = Vec::new();
    for c in std::fs::read_dir(root().join("crates")).expect("crates/").flatten() {
        let crate_name = c.file_name().to_string_lossy().to_string();
        if !rooms.contains(&crate_name) {
            missing.push(crate_name.clone());
        }
        let src = c.path().join("src");
        for p in rust_sources(&format!("crates/{crate_name}/src")) {
            let rel = p.strip_prefix(&src).unwrap_or(&p);
            let stem = rel.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
            if matches!(stem.as_str(), "lib" | "main" | "mod") {
                continue;
            }
            // A top-level file as `name.rs`, a folder as `name/`, a file inside one by its stem.
            let named = match rel.parent().filter(|d| !d.as_os_str().is_empty()) {
                None => rooms.contains(&format!("{stem}.rs")),
                Some(dir) => {
                    rooms.contains(&format!("{}/", dir.iter().next().map(|d| d.to_string_lossy()).unwrap_or_default())) && rooms.contains(stem.as_str())
                }
            };
            if !named {
                missing.push(format!("crates/{crate_name}/src/{}", rel.display()));
            }
        }
    }
    assert!(missing.is_empty(), "docs/architecture.md's room list does not name:\n{}", missing.join("\n"));
}

/// The longest a Rust file may be: past it, a file holds more than one thing.
const MAX_FILE_LINES: usize = 700;
/// The longest a function may be: past it, a function does more than one step.
const MAX_FN_LINES: usize = 100;

/// What may pass the limits, each with its reason (`path` for a file, `path::name` for a function).
/// A table reads best whole; anything else is split instead of added here.
const LONG_ALLOWED: &[(&str, &str)] = &[
    ("crates/pdctl-contract/src/cause/sentence.rs::sentence", "one match arm per cause: the table of every refusal's sentence"),
    ("crates/pdctl-contract/src/cause/examples.rs::examples", "one line per cause: the table of sample causes the docs' tables are held to"),
    ("crates/pdctl-contract/src/next.rs::next_step", "one match arm per cause: the table of every refusal's next step"),
    ("crates/sglang-sim/src/args.rs::parse", "one match arm per SGLang flag the simulator takes: the table of flags"),
];

/// Functions of a Rust file longer than `max` lines: `(name, first line, lines)`. A function is
/// `fn` at the start of a line (after its visibility and qualifiers) to the `}` at its indentation,
/// as rustfmt writes it; a declaration without a body is not one.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let indent = &l[..l.len() - l.trim_start().len()];
        let mut rest = l.trim_start();
        // `pub(crate) `, `pub(in crate::engine) `, …
        if let Some((_, r)) = rest.strip_prefix("pub(").and_then(|r| r.split_once(") ")) {
            rest = r;
        }
        for q in ["pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(q).unwrap_or(rest);
        }
        let Some(sig) = rest.strip_prefix("fn ") else {
            i += 1;
            continue;
        };
        let name: String = sig.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // The body opens on the signature's last line; a `;` first is a declaration.
        let mut j = i;
        while j < lines.len() && !lines[j].contains('{') && !lines[j].trim_end().ends_with(';') {
            j += 1;
        }
        if j >= lines.len() || !lines[j].contains('{') || lines[j].trim_end().ends_with('}') {
            i = j + 1;
            continue;
        }
        let close = format!("{indent}}}");
        let end = (j + 1..lines.len()).find(|&k| lines[k] == close).unwrap_or(lines.len() - 1);
        if end - i + 1 > max {
            out.push((name, i + 1, end - i + 1));
        }
        i += 1;
    }
    out
}

#[test]
fn no_file_is_over_700_lines_and_no_function_over_100() {
    let mut over = Vec::new();
    let mut sources = rust_sources("crates");
    sources.extend(rust_sources("tests"));
    sources.extend(rust_sources("fuzz"));
    let allowed = |k: &str| LONG_ALLOWED.iter().any(|(a, _)| *a == k);
    for p in &sources {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let n = text.lines().count();
        if n > MAX_FILE_LINES && !allowed(&rel(p)) {
            over.push(format!("{}: {n} lines (at most {MAX_FILE_LINES}): split it by what its parts hold", rel(p)));
        }
        for (name, at, len) in long_functions(&text, MAX_FN_LINES) {
            let key = format!("{}::{name}", rel(p));
            if !allowed(&key) {
                over.push(format!("{}:{at}: fn {name} is {len} lines (at most {MAX_FN_LINES}): split it into its steps", rel(p)));
            }
        }
    }
    // The limits are a ceiling, not a target: the ten largest files and functions, to be seen
    // (`cargo test --test structure -- --nocapture`).
    let mut files: Vec<(usize, String)> = Vec::new();
    let mut fns: Vec<(usize, String)> = Vec::new();
    for p in &sources {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        files.push((text.lines().count(), rel(p)));
        fns.extend(long_functions(&text, 0).into_iter().map(|(name, at, len)| (len, format!("{}:{at} fn {name}", rel(p)))));
    }
    files.sort_by(|a, b| b.cmp(a));
    fns.sort_by(|a, b| b.cmp(a));
    println!("the ten largest files (at most {MAX_FILE_LINES} lines):");
    for (n, f) in files.iter().take(10) {
        println!("  {n:4}  {f}");
    }
    println!("the ten longest functions (at most {MAX_FN_LINES} lines):");
    for (n, f) in fns.iter().take(10) {
        println!("  {n:4}  {f}");
    }
    // Every allowance still names something long: a stale one would hide the next.
    for (k, why) in LONG_ALLOWED {
        let (file, name) = k.split_once(".rs::").map(|(f, n)| (format!("{f}.rs"), Some(n))).unwrap_or((k.to_string(), None));
        let text = std::fs::read_to_string(root().join(&file)).unwrap_or_default();
        let still = match name {
            Some(n) => long_functions(&text, MAX_FN_LINES).iter().any(|(f, _, _)| f == n),
            None => text.lines().count() > MAX_FILE_LINES,
        };
        if !still {
            over.push(format!("LONG_ALLOWED names {k} ({why}), which is within the limits now: remove the entry"));
        }
    }
    assert!(over.is_empty(), "over the limits:\n{}", over.join("\n"));
}

#[test]
fn the_function_scan_sees_a_long_function_and_skips_declarations() {
    let body = "    x();\n".repeat(5);
    let text = format!("pub trait T {{\n    fn declared(&self);\n}}\n\npub(in crate::x) async fn long(\n    a: u8,\n) -> u8 {{\n{body}}}\nfn short() {{}}\n");
    assert_eq!(long_functions(&text, 5), vec![("long".to_string(), 5, 9)]);
    assert!(long_functions(&text, 9).is_empty());
}

/// Whether two names differ by one letter (one added, dropped or changed).
fn one_letter_apart(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let (short, long) = if a.len() <= b.len() { (&a, &b) } else { (&b, &a) };
    match long.len() - short.len() {
        0 => a.iter().zip(&b).filter(|(x, y)| x != y).count() == 1,
        1 => (0..long.len()).any(|i| long[..i] == short[..i] && long[i + 1..] == short[i..]),
        _ => false,
    }
}

#[test]
fn no_two_files_of_a_folder_are_named_one_letter_apart() {
    assert!(one_letter_apart("slo", "slot") && one_letter_apart("slot", "slat") && !one_letter_apart("slo", "slots") && !one_letter_apart("a", "a"));
    let mut by_dir: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for src in ["crates", "tests", "fuzz"] {
        for p in rust_sources(src) {
            let dir = rel(p.parent().unwrap_or(&p));
            by_dir.entry(dir).or_default().push(p.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default());
        }
    }
    let mut bad = Vec::new();
    for (dir, stems) in &by_dir {
        for (i, a) in stems.iter().enumerate() {
            for b in &stems[i + 1..] {
                if one_letter_apart(a, b) {
                    bad.push(format!("{dir}: {a}.rs and {b}.rs are one letter apart: name each by what it holds"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn no_file_name_is_another_s_plural_in_a_crate_nor_used_three_times() {
    let mut by_stem: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut bad = Vec::new();
    for c in std::fs::read_dir(root().join("crates")).expect("crates/").flatten() {
        let name = c.file_name().to_string_lossy().to_string();
        let stems: std::collections::BTreeSet<String> = rust_sources(&format!("crates/{name}/src"))
            .iter()
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().to_string()))
            .filter(|s| !matches!(s.as_str(), "lib" | "main" | "mod" | "tests"))
            .collect();
        for s in &stems {
            if stems.contains(&format!("{s}s")) {
                bad.push(format!("crates/{name}: {s}.rs and {s}s.rs differ by a letter: name each by what it holds"));
            }
            by_stem.entry(s.clone()).or_default().push(name.clone());
        }
    }
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for p in rust_sources("crates").iter().filter(|p| p.components().any(|c| c.as_os_str() == "src")) {
        let stem = p.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        if !matches!(stem.as_str(), "lib" | "main" | "mod" | "tests") {
            *counts.entry(stem).or_default() += 1;
        }
    }
    for (stem, n) in counts {
        if n >= 3 {
            let crates = by_stem.get(&stem).map(|v| v.join(", ")).unwrap_or_default();
            bad.push(format!("{n} files are named {stem}.rs (in {crates}): a newcomer cannot tell which holds what"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
