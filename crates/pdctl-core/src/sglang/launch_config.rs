//! What a unit that keeps its flags in a `--config FILE.yaml` runs with. SGLang 0.5.23 merges the
//! file into its argv before it parses them (`server_args.py` `prepare_server_args`,
//! `utils/server_args_config_parser.py` `ConfigArgumentMerger`): the YAML's root mapping becomes
//! `--key value` words placed *before* the command line, so a flag given on both wins on the
//! command line (argparse keeps the last). `launch_command` in `/server_info` is recorded after
//! the merge. Every comparison of a new ExecStart with a running server reads [`expand`]'s argv,
//! never the ExecStart words alone. Pure: the caller reads the file.
//!
//! The merge, as the wheel's: only the exact word `--config` followed by a path (no `=` form);
//! one `--config` at most; the path must end in `.yaml` or `.yml`; an empty file is no flags; a
//! root that is not a mapping is an error. Per key: `true` → `--key` (the store-true flags pdctl
//! reads: `--enable-metrics`, `--enable-dp-attention`...; SGLang writes `--key true` for a
//! non-store-true boolean, which no flag pdctl reads is), `false` → nothing, a list → `--key a b`,
//! a mapping → `--key` and its JSON, anything else → `--key` and its text. Keys are written as
//! SGLang writes them (`--{key}`); `_` in a key is read as `-` (argparse knows both spellings of
//! the flags pdctl reads).

use yaml_rust2::{Yaml, YamlLoader};

/// Keys SGLang 0.5.23 refuses in a config file: flags whose argparse action is neither a
/// store-true nor a one-value one — the deprecated spellings registered in `server_args.py`
/// (`DeprecatedStoreTrueAction`). It fails at start with "Unsupported config option
/// 'disable_cuda_graph' with action 'DeprecatedStoreTrueAction'" (measured on the real server):
/// give them on the command line.
pub const NOT_IN_A_FILE: &[&str] = &["disable_cuda_graph", "enable_dp_attention"];

/// The largest `--config` file read (a server config is a few hundred bytes).
pub const MAX_BYTES: u64 = 1 << 20;

/// The path after `--config` in `argv`, when one is given.
pub fn config_path(argv: &[String]) -> Option<&str> {
    let i = argv.iter().position(|a| a == "--config")?;
    argv.get(i + 1).map(String::as_str)
}

/// Why a `--config` file cannot be merged (SGLang would not start with it either).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {what}")]
pub struct ConfigFileError {
    /// The file as ExecStart names it.
    pub path: String,
    /// What is wrong (with the line where the YAML says it).
    pub what: String,
}

/// `argv` (program first) with its `--config` file merged as SGLang merges it; `argv` itself when
/// it names none. `read` reads the file (its text, or why not).
pub fn expand(argv: &[String], read: impl FnOnce(&str) -> Result<String, String>) -> Result<Vec<String>, ConfigFileError> {
    let Some(path) = config_path(argv) else { return Ok(argv.to_vec()) };
    let err = |what: String| ConfigFileError { path: path.to_string(), what };
    if argv.iter().filter(|a| *a == "--config").count() > 1 {
        return Err(err("more than one --config is given; SGLang takes one".into()));
    }
    let ext = std::path::Path::new(path).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if !matches!(ext.as_deref(), Some("yaml" | "yml")) {
        return Err(err("SGLang reads a --config file only when its name ends in .yaml or .yml".into()));
    }
    let text = read(path).map_err(err)?;
    let words = words_of(&text).map_err(err)?;
    let at = argv.iter().position(|a| a == "--config").unwrap_or(0);
    let mut out = Vec::with_capacity(argv.len() + words.len());
    out.extend(argv.first().cloned());
    out.extend(words);
    out.extend(argv.iter().take(at).skip(1).cloned());
    out.extend(argv.iter().skip(at + 2).cloned());
    Ok(out)
}

/// The `--key value` words of a YAML config's root mapping, in the file's order.
pub fn words_of(text: &str) -> Result<Vec<String>, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("line {}: not YAML: {}", e.marker().line(), e.info()))?;
    let root = match docs.into_iter().next() {
        None | Some(Yaml::Null) => return Ok(Vec::new()),
        Some(Yaml::Hash(h)) => h,
        Some(_) => return Err("the root is not a mapping of flag names to values (SGLang: \"Config file must contain a dictionary at root level\")".into()),
    };
    let mut out = Vec::new();
    for (k, v) in root {
        let Some(key) = scalar(&k) else { return Err(format!("a key is not a flag name: {k:?}")) };
        let norm = key.replace('-', "_");
        if NOT_IN_A_FILE.contains(&norm.as_str()) {
            return Err(format!(
                "SGLang refuses the key {key} in a config file (\"Unsupported config option '{norm}' with action 'DeprecatedStoreTrueAction'\"): give --{} on the command line",
                norm.replace('_', "-")
            ));
        }
        let flag = format!("--{}", key.replace('_', "-"));
        match v {
            Yaml::Boolean(true) => out.push(flag),
            Yaml::Boolean(false) => {}
            Yaml::Array(items) => {
                if !items.is_empty() {
                    out.push(flag);
                    out.extend(items.iter().map(|i| scalar(i).unwrap_or_default()));
                }
            }
            Yaml::Hash(_) => {
                out.push(flag);
                out.push(serde_json::to_string(&json_of(&v)).unwrap_or_default());
            }
            other => {
                out.push(flag);
                out.push(scalar(&other).unwrap_or_default());
            }
        }
    }
    Ok(out)
}

/// A scalar as Python's `str()` writes it (`None` for null, `True`/`False`).
fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(if *b { "True" } else { "False" }.into()),
        Yaml::Null => Some("None".into()),
        _ => None,
    }
}

fn json_of(y: &Yaml) -> serde_json::Value {
    use serde_json::Value;
    match y {
        Yaml::Hash(h) => Value::Object(h.iter().map(|(k, v)| (scalar(k).unwrap_or_default(), json_of(v))).collect()),
        Yaml::Array(a) => Value::Array(a.iter().map(json_of).collect()),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(r) => r.parse::<f64>().map(Value::from).unwrap_or(Value::String(r.clone())),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::String(s) => Value::String(s.clone()),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_yaml_goes_before_the_command_line_which_wins() {
        let yaml =
            "model-path: /models/a\npage_size: 16\nenable-metrics: true\ndisable-radix-cache: false\nkv-cache-dtype: fp8_e5m2\nextra:\n  a: 1\nlist: [x, y]\n";
        let got = expand(&argv("python -m sglang.launch_server --port 1 --config /etc/p.yaml --page-size 32"), |p| {
            assert_eq!(p, "/etc/p.yaml");
            Ok(yaml.into())
        })
        .unwrap();
        assert_eq!(
            got,
            argv("python --model-path /models/a --page-size 16 --enable-metrics --kv-cache-dtype fp8_e5m2 --extra {\"a\":1} --list x y -m sglang.launch_server --port 1 --page-size 32")
        );
        // The command line's --page-size comes last: argparse, and pdctl's readers, take it.
        let s = crate::sglang::pairing::settings_of_argv(&got);
        assert_eq!((s.page_size.as_str(), s.kv_cache_dtype.as_str()), ("32", "float8_e5m2"));
    }

    #[test]
    fn what_sglang_refuses_is_refused_with_the_line() {
        let e = expand(&argv("s --config /etc/p.yaml"), |_| Ok("a: [1\nb: 2".into())).unwrap_err();
        assert!(e.to_string().starts_with("/etc/p.yaml: line "), "{e}");
        let e = expand(&argv("s --config /etc/p.json"), |_| Ok(String::new())).unwrap_err();
        assert!(e.what.contains(".yaml or .yml"), "{e}");
        let e = expand(&argv("s --config /etc/p.yaml"), |_| Ok("- a\n- b\n".into())).unwrap_err();
        assert!(e.what.contains("root is not a mapping"), "{e}");
        let e = expand(&argv("s --config /etc/p.yaml"), |_| Ok("model-path: /m\ndisable-cuda-graph: true\n".into())).unwrap_err();
        assert!(e.what.contains("Unsupported config option 'disable_cuda_graph'") && e.what.contains("--disable-cuda-graph on the command line"), "{e}");
        let e = expand(&argv("s --config /etc/p.yaml"), |_| Err("No such file or directory".into())).unwrap_err();
        assert_eq!(e.to_string(), "/etc/p.yaml: No such file or directory");
        assert_eq!(expand(&argv("s --config /etc/p.yaml"), |_| Ok(String::new())).unwrap(), argv("s"), "an empty file is no flags");
        assert_eq!(expand(&argv("s --config=/etc/p.yaml"), |_| unreachable!()).unwrap(), argv("s --config=/etc/p.yaml"), "only the word --config");
    }
}
