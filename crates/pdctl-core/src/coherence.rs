//! Which changes must be coherent across PD pairs: in prefill-decode disaggregation a decode
//! continues from the KV its prefill computed, so a change of the model a server computes with
//! — its path, its tokenizer, its quantization, its dtype, the model name it serves under, the
//! checkpoint revision or load format, its weight version — makes every request that pairs a
//! changed worker with an unchanged one decode KV its own model did not compute: wrong output,
//! with HTTP 200. A plain rolling restart of such a change pairs versions for as long as both
//! run (behind one gateway smg picks the prefill and the decode independently). Pure.
//!
//! The change is read from what the worker's new ExecStart asks for against what its running
//! process reports (`/server_info`, which 0.5.23 fills from its resolved server arguments); a
//! flag the running server does not report is not compared. New weights under the same path
//! are not visible here: give each checkpoint its own path (or use `pdctl rollout weights`).

use serde::Serialize;
use serde_json::Value;

/// The flags whose change breaks coherence, with the `/server_info` key each is reported under
/// and its value when not given (`None`: a flag with no fixed default — the model path's).
pub const COHERENT_FLAGS: &[(&str, &str, Option<&str>)] = &[
    ("--model-path", "model_path", None),
    ("--tokenizer-path", "tokenizer_path", None),
    ("--quantization", "quantization", Some("")),
    ("--dtype", "dtype", Some("auto")),
    ("--served-model-name", "served_model_name", None),
    ("--revision", "revision", Some("")),
    ("--load-format", "load_format", Some("auto")),
    ("--weight-version", "weight_version", Some("default")),
];

/// One flag whose value changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlagChange {
    /// The flag (`--model-path`).
    pub flag: String,
    /// What the running server reports.
    pub running: String,
    /// What the new ExecStart asks for.
    pub new: String,
}

impl FlagChange {
    /// "--model-path /models/a → /models/b".
    pub fn sentence(&self) -> String {
        let show = |v: &str| if v.is_empty() { "(unset)".to_string() } else { v.to_string() };
        format!("{} {} → {}", self.flag, show(&self.running), show(&self.new))
    }
}

/// The value of `flag` in `argv` (`--flag V` or `--flag=V`; given twice, the last, as argparse
/// takes it); `--model` is `--model-path`'s alias.
fn value(argv: &[String], flag: &str) -> Option<String> {
    let names: &[&str] = if flag == "--model-path" { &["--model-path", "--model"] } else { &[flag] };
    let mut found = None;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        for n in names {
            if a == n {
                found = it.next().cloned().or(found);
            } else if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                found = Some(v.to_string());
            }
        }
    }
    found
}

/// Every `--flag` the ExecStart gives (for `coherent = "always"`: any setting counts).
pub fn given_flags(argv: &[String]) -> Vec<String> {
    argv.iter().filter(|a| a.starts_with("--")).map(|a| a.split('=').next().unwrap_or(a).to_string()).collect()
}

/// A reported value as text (`null`: unset).
fn reported(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some(String::new()),
        Value::String(s) => Some(s.clone()),
        Value::Bool(_) | Value::Number(_) => Some(v.to_string()),
        _ => None,
    }
}

/// The coherence-breaking changes of a worker: its new ExecStart `argv` against its running
/// `/server_info` `info`, over [`COHERENT_FLAGS`] and `extra` flags (`coherent_flags`,
/// compared when the running server reports them under their own name).
pub fn changes(argv: &[String], info: &Value, extra: &[String]) -> Vec<FlagChange> {
    let model = value(argv, "--model-path").unwrap_or_default();
    let extra_flags: Vec<(String, String, Option<String>)> = extra
        .iter()
        .filter(|f| !COHERENT_FLAGS.iter().any(|(k, _, _)| k == f) && f.as_str() != "--model")
        .map(|f| (f.clone(), f.trim_start_matches("--").replace('-', "_"), Some(String::new())))
        .collect();
    let known = COHERENT_FLAGS.iter().map(|(f, k, d)| (f.to_string(), k.to_string(), d.map(String::from)));
    let mut out = Vec::new();
    for (flag, key, default) in known.chain(extra_flags) {
        let Some(running) = info.get(&key).and_then(reported) else { continue };
        // Not given: its default (the tokenizer and the served name default to the model path).
        let new = value(argv, &flag).or(default).unwrap_or_else(|| model.clone());
        if running != new {
            out.push(FlagChange { flag, running, new });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_new_model_path_is_a_change_and_so_are_the_names_that_follow_it() {
        let info = json!({"model_path": "/m/a", "tokenizer_path": "/m/a", "served_model_name": "/m/a", "dtype": "auto", "quantization": null});
        let c = changes(&argv("python -m sglang.launch_server --model-path /m/b --port 1"), &info, &[]);
        let flags: Vec<&str> = c.iter().map(|x| x.flag.as_str()).collect();
        assert_eq!(flags, ["--model-path", "--tokenizer-path", "--served-model-name"], "{c:?}");
        assert_eq!(c[0].sentence(), "--model-path /m/a → /m/b");
        // A fixed served name keeps clients' model name; the path still changed.
        let c = changes(
            &argv("x --model /m/b --served-model-name dsv4 --tokenizer-path /m/a"),
            &json!({"model_path": "/m/a", "served_model_name": "dsv4", "tokenizer_path": "/m/a"}),
            &[],
        );
        assert_eq!(c.iter().map(|x| x.flag.as_str()).collect::<Vec<_>>(), ["--model-path"]);
        // Given twice, the last counts (argparse).
        let c = changes(&argv("x --model-path /m/a --model-path /m/b"), &json!({"model_path": "/m/a"}), &[]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--model-path /m/a → /m/b"]);
    }

    #[test]
    fn the_same_model_with_other_serving_flags_is_no_change_and_unreported_flags_are_not_compared() {
        let info =
            json!({"model_path": "/m/a", "tokenizer_path": "/m/a", "served_model_name": "/m/a", "dtype": "auto", "quantization": null, "load_format": "auto"});
        assert!(changes(&argv("x --model-path /m/a --mem-fraction-static 0.8 --page-size 64"), &info, &[]).is_empty());
        // A quantization and a dtype are changes; `--revision` is not reported here: not compared.
        let c = changes(&argv("x --model-path=/m/a --quantization fp8 --dtype bfloat16 --revision abc"), &info, &[]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--quantization (unset) → fp8", "--dtype auto → bfloat16"]);
    }

    #[test]
    fn extra_flags_are_compared_under_their_own_name() {
        let info = json!({"model_path": "/m/a", "chat_template": "a.jinja"});
        let c = changes(&argv("x --model-path /m/a --chat-template b.jinja"), &info, &["--chat-template".into()]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--chat-template a.jinja → b.jinja"]);
    }
}
