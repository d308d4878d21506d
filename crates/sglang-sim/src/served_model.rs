//! The weights a server computes with: its model path, weight version and build (tokenizer,
//! quantization, dtype...), so that a decode can tell KV computed by another model.

/// The weights a server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights {
    /// `model_path` in `/model_info`.
    pub model_path: String,
    /// `served_model_name` in `/model_info` (0.5.23 sets it to the new path on a weight update).
    pub served_model_name: String,
    /// `weight_version` in `/model_info`.
    pub version: String,
    /// What besides the path changes what the model computes, fixed at start: its tokenizer
    /// (`--tokenizer-path`, else the start's model path — a weight update keeps it; identified
    /// by its tokenizer files where the path holds any, so the same tokenizer under another path
    /// is the same), then a quantization, a dtype, a revision, a load format as `--flag=value`.
    pub build: String,
    /// Weights loaded by an update whose cache flush was refused (0.5.23: the model runner
    /// computes with them, `/model_info` still reports the ones before): what computes now.
    pub unreported: Option<String>,
}

/// The flags [`Weights::build`] is made of.
const BUILD_FLAGS: &[&str] = &["--quantization", "--dtype", "--revision", "--load-format"];

/// The tokenizer files compared (the ones `AutoTokenizer.from_pretrained` reads).
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
];

impl Weights {
    /// Which model computes with these weights: the path, the version and the build flags (a
    /// restart onto another path, tokenizer or quantization is another model as much as a new
    /// weight version is).
    pub fn identity(&self) -> String {
        self.unreported.clone().unwrap_or_else(|| format!("{}@{}{}", self.model_path, self.version, self.build))
    }

    /// The build flags of a configuration ([`Weights::build`]).
    pub fn build_of(given: &std::collections::BTreeMap<String, String>, model_path: &str) -> String {
        let tokenizer = given.get("--tokenizer-path").map_or(model_path, String::as_str);
        let flags: String = BUILD_FLAGS.iter().filter_map(|f| given.get(*f).map(|v| format!(" {f}={v}"))).collect();
        format!(" tokenizer={}{flags}", Self::tokenizer_identity(tokenizer))
    }

    /// A tokenizer by its files' contents where `path` holds any, else by its path.
    fn tokenizer_identity(path: &str) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut any = false;
        for name in TOKENIZER_FILES {
            if let Ok(bytes) = std::fs::read(std::path::Path::new(path).join(name)) {
                (name, bytes).hash(&mut h);
                any = true;
            }
        }
        if any {
            format!("files:{:016x}", h.finish())
        } else {
            path.trim_end_matches('/').to_string()
        }
    }
}
