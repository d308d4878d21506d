//! Which changes must be coherent across PD pairs: in prefill-decode disaggregation a decode
//! continues from the KV its prefill computed, so a change of the model a server computes with
//! — its path, its tokenizer, its quantization, its dtype, the model name it serves under, the
//! checkpoint revision or load format, its weight version — makes every request that pairs a
//! changed worker with an unchanged one decode KV its own model did not compute: wrong output,
//! with HTTP 200. A plain rolling restart of such a change pairs versions for as long as both
//! run (behind one gateway smg picks the prefill and the decode independently). Pure.
//!
//! The change is read from what the worker's new ExecStart asks for against what its running
//! process was asked (`/server_info`'s `launch_command`): 0.5.23 fills the rest of
//! `/server_info` from its *resolved* arguments, which can differ from the flags that asked for
//! them, so an unchanged unit compared with them would look changed. A server that does not
//! report `launch_command` is compared by its reported values; a flag it does not report is not
//! compared. New weights under the same path
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
/// takes it); `--model` is `--model-path`'s alias. The words up to the next flag are one value:
/// 0.5.23 records `launch_command` as its argv joined with spaces, so a value with a space (a
/// served model name) comes back as two words, and is read back whole.
fn value(argv: &[String], flag: &str) -> Option<String> {
    let names: &[&str] = if flag == "--model-path" { &["--model-path", "--model"] } else { &[flag] };
    crate::sglang::pairing::last_value(argv, names)
}

/// The checkpoint `argv` starts from: its `--model-path` (or `--model`).
pub fn model_path(argv: &[String]) -> Option<String> {
    value(argv, "--model-path")
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

/// What a running server computes with, as a new ExecStart is compared with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Running {
    /// What it was asked at its start: `/server_info`'s `launch_command` in words
    /// ([`crate::sglang::launch_argv`]); `None` where the server does not report it.
    pub asked: Option<Vec<String>>,
    /// `/server_info` itself (0.5.23: resolved values): read only where `asked` is `None`.
    pub info: Value,
    /// A weight update loaded since its start: `/model_info`'s `model_path` and
    /// `weight_version` where they differ from `/server_info`'s (0.5.23 moves only those two).
    pub loaded: Option<(String, String)>,
}

impl Running {
    /// From `/server_info` and, when it answered, `/model_info`'s model path and weight version.
    pub fn new(info: Value, model_info: Option<(String, String)>) -> Running {
        // A value the start reported that /model_info now reports otherwise: a load since.
        let moved = |k: &str, now: &str| info.get(k).and_then(reported).is_some_and(|started| started != now);
        let loaded = model_info.filter(|(path, version)| moved("model_path", path) || moved("weight_version", version));
        Running { asked: crate::sglang::launch_argv(&info), info, loaded }
    }

    /// The value it runs with for `flag` (reported under `key`, `default` when not given;
    /// `None`: not known, not compared).
    fn value(&self, flag: &str, key: &str, default: Option<&str>) -> Option<String> {
        if let Some((path, version)) = &self.loaded {
            match flag {
                "--model-path" => return Some(path.clone()),
                "--weight-version" => return Some(version.clone()),
                _ => {}
            }
        }
        match &self.asked {
            // What was asked, read as the new ExecStart is: the same words mean the same thing.
            // Not given: its default; the tokenizer follows the model path it started with, the
            // served name the one it runs (a load in place sets it to the loaded path).
            Some(argv) => Some(value(argv, flag).or(default.map(String::from)).unwrap_or_else(|| match (&self.loaded, flag) {
                (Some((path, _)), "--served-model-name") => path.clone(),
                _ => value(argv, "--model-path").unwrap_or_default(),
            })),
            None => self.info.get(key).and_then(reported),
        }
    }
}

/// The coherence-breaking changes of a worker: its new ExecStart `argv` against what its running
/// process was asked (`launch_command`; a server that does not report it: its `/server_info`
/// values), over [`COHERENT_FLAGS`] and `extra` flags (`coherent_flags`, compared under their
/// own name). A weight update loaded since the start counts as asked.
pub fn changes(argv: &[String], running: &Running, extra: &[String]) -> Vec<FlagChange> {
    let model = value(argv, "--model-path").unwrap_or_default();
    let extra_flags: Vec<(String, String, Option<String>)> = extra
        .iter()
        .filter(|f| !COHERENT_FLAGS.iter().any(|(k, _, _)| k == f) && f.as_str() != "--model")
        .map(|f| (f.clone(), f.trim_start_matches("--").replace('-', "_"), Some(String::new())))
        .collect();
    let known = COHERENT_FLAGS.iter().map(|(f, k, d)| (f.to_string(), k.to_string(), d.map(String::from)));
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (flag, key, default) in known.chain(extra_flags) {
        if !seen.insert(flag.clone()) {
            continue;
        }
        let Some(running) = running.value(&flag, &key, default.as_deref()) else { continue };
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

    /// A server that reports its settings but not what it was asked (before `launch_command`).
    fn reported_only(info: &Value) -> Running {
        Running::new(info.clone(), None)
    }

    #[test]
    fn what_was_asked_is_compared_with_what_is_asked_not_with_resolved_values() {
        // 0.5.23 resolves `--dtype auto` and other values; `launch_command` keeps the words.
        let unit = "--model-path /m/a --dtype auto --disaggregation-transfer-backend mooncake_tcp --port 30000";
        let info = json!({"model_path": "/m/a", "tokenizer_path": "/m/a", "served_model_name": "/m/a", "dtype": "bfloat16", "load_format": "auto", "launch_command": unit});
        let running = Running::new(info.clone(), Some(("/m/a".into(), "default".into())));
        assert_eq!(running.asked.as_deref().map(<[String]>::len), Some(8));
        assert!(changes(&argv(&format!("/venv/bin/python -m sglang.launch_server {unit}")), &running, &[]).is_empty(), "an unchanged unit is no change");
        // Compared with the resolved values instead, the same unit would look changed.
        let resolved = json!({"model_path": "/m/a", "tokenizer_path": "/m/a", "served_model_name": "/m/a", "dtype": "bfloat16"});
        assert_eq!(changes(&argv(unit), &reported_only(&resolved), &[]).len(), 1, "--dtype auto → bfloat16 read from resolved values");
        // A real change of what is asked is still one.
        let c = changes(&argv("--model-path /m/a --dtype float16"), &running, &[]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--dtype auto → float16"]);
        // A flag asked only by the running server counts too (its default is what the new asks).
        let c = changes(&argv("--model-path /m/a"), &Running::new(json!({"launch_command": "--model-path /m/a --quantization fp8"}), None), &[]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--quantization fp8 → (unset)"]);
    }

    #[test]
    fn a_value_with_a_space_reads_back_whole_from_launch_command() {
        // 0.5.23 joins its argv with spaces: "my model" comes back as two words.
        let running = Running::new(json!({"launch_command": "--model-path /m/a --served-model-name my model --port 1"}), None);
        let unit: Vec<String> = ["sglang", "--model-path", "/m/a", "--served-model-name", "my model", "--port", "1"].iter().map(|s| s.to_string()).collect();
        assert!(changes(&unit, &running, &[]).is_empty(), "the same name");
        let other: Vec<String> = ["sglang", "--model-path", "/m/a", "--served-model-name", "my other", "--port", "1"].iter().map(|s| s.to_string()).collect();
        assert_eq!(changes(&other, &running, &[]).iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--served-model-name my model → my other"]);
    }

    #[test]
    fn a_weight_update_loaded_since_the_start_counts_as_asked() {
        let info = json!({"model_path": "/m/a", "weight_version": "default", "launch_command": "--model-path /m/a --tokenizer-path /m/tok"});
        // /model_info says /m/b v2 was loaded in place: a unit that asks for it is no change.
        let loaded = Running::new(info.clone(), Some(("/m/b".into(), "v2".into())));
        assert_eq!(loaded.loaded, Some(("/m/b".into(), "v2".into())));
        assert!(changes(&argv("--model-path /m/b --tokenizer-path /m/tok --weight-version v2"), &loaded, &[]).is_empty());
        let c = changes(&argv("--model-path /m/a --tokenizer-path /m/tok"), &loaded, &[]);
        // Back to the start's path: the served name (which the load set to its path) goes back too.
        assert_eq!(
            c.iter().map(FlagChange::sentence).collect::<Vec<_>>(),
            ["--model-path /m/b → /m/a", "--served-model-name /m/b → /m/a", "--weight-version v2 → default"]
        );
        // /model_info equal to the start: nothing was loaded.
        assert_eq!(Running::new(info, Some(("/m/a".into(), "default".into()))).loaded, None);
    }

    #[test]
    fn a_new_model_path_is_a_change_and_so_are_the_names_that_follow_it() {
        let info = json!({"model_path": "/m/a", "tokenizer_path": "/m/a", "served_model_name": "/m/a", "dtype": "auto", "quantization": null});
        let c = changes(&argv("python -m sglang.launch_server --model-path /m/b --port 1"), &reported_only(&info), &[]);
        let flags: Vec<&str> = c.iter().map(|x| x.flag.as_str()).collect();
        assert_eq!(flags, ["--model-path", "--tokenizer-path", "--served-model-name"], "{c:?}");
        assert_eq!(c[0].sentence(), "--model-path /m/a → /m/b");
        // A fixed served name keeps clients' model name; the path still changed.
        let c = changes(
            &argv("x --model /m/b --served-model-name dsv4 --tokenizer-path /m/a"),
            &reported_only(&json!({"model_path": "/m/a", "served_model_name": "dsv4", "tokenizer_path": "/m/a"})),
            &[],
        );
        assert_eq!(c.iter().map(|x| x.flag.as_str()).collect::<Vec<_>>(), ["--model-path"]);
        // Given twice, the last counts (argparse).
        let c = changes(&argv("x --model-path /m/a --model-path /m/b"), &reported_only(&json!({"model_path": "/m/a"})), &[]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--model-path /m/a → /m/b"]);
    }

    #[test]
    fn the_same_model_with_other_serving_flags_is_no_change_and_unreported_flags_are_not_compared() {
        let info =
            json!({"model_path": "/m/a", "tokenizer_path": "/m/a", "served_model_name": "/m/a", "dtype": "auto", "quantization": null, "load_format": "auto"});
        assert!(changes(&argv("x --model-path /m/a --mem-fraction-static 0.8 --page-size 64"), &reported_only(&info), &[]).is_empty());
        // A quantization and a dtype are changes; `--revision` is not reported here: not compared.
        let c = changes(&argv("x --model-path=/m/a --quantization fp8 --dtype bfloat16 --revision abc"), &reported_only(&info), &[]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--quantization (unset) → fp8", "--dtype auto → bfloat16"]);
    }

    #[test]
    fn extra_flags_are_compared_under_their_own_name() {
        let info = json!({"model_path": "/m/a", "chat_template": "a.jinja"});
        let c = changes(&argv("x --model-path /m/a --chat-template b.jinja"), &reported_only(&info), &["--chat-template".into()]);
        assert_eq!(c.iter().map(FlagChange::sentence).collect::<Vec<_>>(), ["--chat-template a.jinja → b.jinja"]);
    }
}
