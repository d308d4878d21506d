//! A worker that keeps its SGLang flags in a `--config` YAML file, as many deployments do: the
//! file the sandbox writes and the command line that names it.

/// Write `args` but `--port` into the YAML file `path` (a flag with a value as `name: "value"`, a
/// bare flag as `name: true`) and return the command line that names it: the words before the
/// first flag (`-m sglang.launch_server`), `--config FILE` and `--port N`, as a deployment that
/// keeps its flags in a file has them.
pub fn flags_to_config(path: &std::path::Path, port: u16, args: Vec<String>) -> Vec<String> {
    let mut yaml = String::from("# written by the pdctl sandbox: this worker's SGLang flags\n");
    let mut lead: Vec<String> = args.iter().take_while(|a| !a.starts_with("--")).cloned().collect();
    let mut it = args.into_iter().skip(lead.len()).peekable();
    while let Some(flag) = it.next() {
        let Some(name) = flag.strip_prefix("--") else { continue };
        match it.next_if(|v| !v.starts_with("--")) {
            Some(_) if name == "port" => {}
            // SGLang 0.5.23 refuses its deprecated store-true spellings in a file.
            None if name == "disable-cuda-graph" || name == "enable-dp-attention" => lead.push(flag),
            Some(v) => yaml.push_str(&format!("{name}: \"{}\"\n", v.replace('\\', "\\\\").replace('"', "\\\""))),
            None => yaml.push_str(&format!("{name}: true\n")),
        }
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(path, yaml);
    lead.into_iter().chain(["--config".into(), path.display().to_string(), "--port".into(), port.to_string()]).collect()
}
