//! docs/cli.md cannot drift from the code: every JSON example parses into the API type its code
//! fence names (unknown fields rejected) and serializes back to the same JSON; the exit-code and
//! cause tables list exactly what `Exit` and `Cause` define.

use std::collections::BTreeSet;
use std::path::Path;

use pdctl_core::api::{AbortAccepted, ApiError, DaemonStatus, Diff, Exit, History, HistoryItem, InterruptedEnd, Record, Request, Started, StreamLine};
use pdctl_core::cause::Cause;
use pdctl_core::events::{Event, Summary};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn cli_md() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md")).expect("docs/cli.md")
}

/// `(type name, JSON text, line)` of every ```json fence.
fn examples(doc: &str) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut lines = doc.lines().enumerate();
    while let Some((i, l)) = lines.next() {
        if let Some(info) = l.strip_prefix("```json") {
            let ty = info.trim().to_string();
            let body: Vec<&str> = lines.by_ref().map(|(_, l)| l).take_while(|l| !l.starts_with("```")).collect();
            out.push((ty, body.join("\n"), i + 1));
        }
    }
    out
}

fn round_trip<T: DeserializeOwned + Serialize>(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&t).map_err(|e| e.to_string())?;
    if back != v {
        return Err(format!("does not serialize back to itself:\n  doc:  {v}\n  code: {back}"));
    }
    Ok(())
}

fn check(ty: &str, text: &str) -> Result<(), String> {
    match ty {
        "Request" => round_trip::<Request>(text),
        "Started" => round_trip::<Started>(text),
        "ApiError" => round_trip::<ApiError>(text),
        "AbortAccepted" => round_trip::<AbortAccepted>(text),
        "DaemonStatus" => round_trip::<DaemonStatus>(text),
        "Diff" => round_trip::<Diff>(text),
        "History" => round_trip::<History>(text),
        "HistoryItem" => round_trip::<HistoryItem>(text),
        "Record" => round_trip::<Record>(text),
        "Event" => round_trip::<Event>(text).and_then(|_| stream_line(text, |l| matches!(l, StreamLine::Event(_)))),
        "ReachReport" => round_trip::<pdctl_core::api::ReachReport>(text),
        "FleetRequest" => round_trip::<pdctl_core::api::FleetRequest>(text),
        "FleetSummary" => round_trip::<pdctl_core::api::FleetSummary>(text),
        "FleetRollout" => round_trip::<pdctl_core::fleet::FleetRollout>(text),
        "Semaphore" => round_trip::<pdctl_core::fleet::Semaphore>(text),
        "HostState" => round_trip::<pdctl_core::fleet::HostState>(text),
        "HostStatus" => round_trip::<pdctl_core::api::HostStatus>(text),
        "HostBake" => round_trip::<pdctl_core::fleet::HostBake>(text),
        "FleetRevert" => round_trip::<pdctl_core::fleet::FleetRevert>(text),
        "Summary" => round_trip::<Summary>(text).and_then(|_| stream_line(text, |l| matches!(l, StreamLine::Summary(_)))),
        "InterruptedEnd" => round_trip::<InterruptedEnd>(text).and_then(|_| stream_line(text, |l| matches!(l, StreamLine::Interrupted(_)))),
        "" => Err("a ```json fence must name its API type (```json Request)".into()),
        other => Err(format!("{other} is not an API type this test knows")),
    }
}

/// The NDJSON reader (`StreamLine`) takes it for the right kind of line.
fn stream_line(text: &str, ok: impl Fn(&StreamLine) -> bool) -> Result<(), String> {
    let l: StreamLine = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if ok(&l) {
        Ok(())
    } else {
        Err(format!("read as the wrong kind of stream line: {l:?}"))
    }
}

#[test]
fn every_json_example_in_cli_md_parses_into_its_api_type() {
    let doc = cli_md();
    let ex = examples(&doc);
    assert!(ex.len() >= 12, "docs/cli.md has its examples: {}", ex.len());
    let errors: Vec<String> = ex.iter().filter_map(|(ty, text, line)| check(ty, text).err().map(|e| format!("docs/cli.md:{line} ({ty}): {e}"))).collect();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let kinds: BTreeSet<&str> = ex.iter().map(|(t, _, _)| t.as_str()).collect();
    for needed in ["Request", "Started", "ApiError", "Event", "Summary", "InterruptedEnd", "Record", "HistoryItem"] {
        assert!(kinds.contains(needed), "docs/cli.md shows a {needed}");
    }
}

#[test]
fn an_example_with_an_unknown_field_is_caught() {
    // The check above would fail on a typo in the document: prove it on one.
    assert!(check("Request", r#"{"kind":"restart","unit":["x"]}"#).is_err());
    assert!(check("Summary", r#"{"result":"succeeded","elapsed_ms":1,"units":[],"extra":1}"#).is_err());
    assert!(check("", "{}").is_err());
}

/// Rows of the markdown table that follows `heading`.
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc.find(heading).unwrap_or_else(|| panic!("docs/cli.md has {heading}"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().trim_matches('`').to_string()).collect())
        .collect()
}

#[test]
fn the_duration_table_is_the_code() {
    let rows = table(&cli_md(), "## Durations");
    let doc: Vec<(String, String, String)> = rows.iter().map(|r| (r[0].clone(), r[1].clone(), r[2].clone())).collect();
    let code: Vec<(String, String, String)> = pdctl_core::config::DURATION_BOUNDS
        .iter()
        .map(|(k, min, max)| (k.to_string(), humantime::format_duration(*min).to_string(), humantime::format_duration(*max).to_string()))
        .collect();
    assert_eq!(doc, code);
}

#[test]
fn the_exit_code_table_is_the_code() {
    let rows = table(&cli_md(), "## Exit codes");
    let doc: Vec<(i32, String)> = rows.iter().map(|r| (r[0].parse().expect("a code"), r[1].clone())).collect();
    let code: Vec<(i32, String)> = Exit::ALL.iter().map(|e| (e.code(), e.meaning().to_string())).collect();
    assert_eq!(doc, code);
}

#[test]
fn the_cause_table_is_the_code() {
    let rows = table(&cli_md(), "## Causes");
    let doc: BTreeSet<(String, String, String)> = rows.iter().map(|r| (r[0].clone(), r[1].clone(), r[2].clone())).collect();
    let code: BTreeSet<(String, String, String)> = Cause::examples()
        .iter()
        .map(|c| {
            let kind = serde_json::to_value(c.kind()).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
            (c.code().to_string(), kind, c.exit().code().to_string())
        })
        .collect();
    let missing: Vec<_> = code.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&code).collect();
    assert!(missing.is_empty() && extra.is_empty(), "not in docs/cli.md: {missing:?}\nin docs/cli.md, not in Cause: {extra:?}");
}

/// The on-call runbook says what every cause means and what to do: each `cause_code` appears in
/// docs/runbook.md.
#[test]
fn the_runbook_covers_every_cause() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let runbook = std::fs::read_to_string(root.join("docs/runbook.md")).expect("docs/runbook.md");
    let missing: BTreeSet<&str> = Cause::examples().iter().map(Cause::code).filter(|c| !runbook.contains(&format!("`{c}`"))).collect();
    assert!(missing.is_empty(), "docs/runbook.md does not mention: {missing:?}");
}
