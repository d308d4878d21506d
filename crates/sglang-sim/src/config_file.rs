//! `--config FILE.yaml`: the file's flags merged into the command line as SGLang 0.5.23 merges
//! them, before the arguments are parsed (and `launch_command` recorded).

/// SGLang 0.5.23's `--config FILE.yaml` (`utils/server_args_config_parser.py`,
/// `ConfigArgumentMerger`): the file's root mapping as `--key value` words before the command
/// line (which wins, as argparse keeps the last); `true` is the bare flag, `false` nothing, a list
/// its items. Only the word `--config` and one of them; the name must end in `.yaml`/`.yml`.
pub fn merge_config(args: &[String]) -> Result<Vec<String>, String> {
    let at: Vec<usize> = args.iter().enumerate().filter(|(_, a)| *a == "--config").map(|(i, _)| i).collect();
    let Some(&i) = at.first() else { return Ok(args.to_vec()) };
    if at.len() > 1 {
        return Err("Multiple config files specified! Only one allowed.".into());
    }
    let Some(path) = args.get(i + 1) else { return Err("No config file specified after --config flag!".into()) };
    let suffix = std::path::Path::new(path).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).unwrap_or_default();
    if suffix != "yaml" && suffix != "yml" {
        return Err(format!("Config file must be YAML format, got: .{suffix}"));
    }
    let text = std::fs::read_to_string(path).map_err(|_| format!("Config file not found: {path}"))?;
    let docs = yaml_rust2::YamlLoader::load_from_str(&text).map_err(|e| format!("Failed to read config file {path}: {e}"))?;
    let mut words = Vec::new();
    use yaml_rust2::Yaml;
    let text_of = |y: &Yaml| match y {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(n) => n.to_string(),
        Yaml::Boolean(b) => if *b { "True" } else { "False" }.to_string(),
        _ => "None".to_string(),
    };
    match docs.into_iter().next() {
        None | Some(Yaml::Null) => {}
        Some(Yaml::Hash(h)) => {
            for (k, v) in h {
                // 0.5.23 refuses the deprecated store-true spellings in a file.
                let norm = text_of(&k).replace('-', "_");
                if norm == "disable_cuda_graph" || norm == "enable_dp_attention" {
                    return Err(format!("Unsupported config option '{norm}' with action 'DeprecatedStoreTrueAction'"));
                }
                let flag = format!("--{}", text_of(&k));
                match v {
                    Yaml::Boolean(true) => words.push(flag),
                    Yaml::Boolean(false) => {}
                    Yaml::Array(items) if items.is_empty() => {}
                    Yaml::Array(items) => {
                        words.push(flag);
                        words.extend(items.iter().map(text_of));
                    }
                    other => {
                        words.push(flag);
                        words.push(text_of(&other));
                    }
                }
            }
        }
        Some(_) => return Err("Config file must contain a dictionary at root level".into()),
    }
    words.extend(args[..i].iter().cloned());
    words.extend(args[i + 2..].iter().cloned());
    Ok(words)
}
