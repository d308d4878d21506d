//! Whether two paths give SGLang the same tokenizer. SGLang 0.5.23 resolves its tokenizer once,
//! at start, from `--tokenizer-path` or else from `--model-path` (`server_args.py`:
//! `if self.tokenizer_path is None: self.tokenizer_path = self.model_path`), and a load in
//! place (`/update_weights_from_disk`) replaces the weights only: the tokenizer manager keeps
//! the tokenizer it started with. So new weights under another path load in place without a
//! change of tokenizer only when the tokenizer the new files would resolve is the one the server
//! runs — the same path, or a directory holding the same tokenizer files (a fine-tune saved with
//! its base's tokenizer: `save_pretrained` writes the same bytes).
//!
//! The files compared are the ones Hugging Face's `AutoTokenizer.from_pretrained` reads from a
//! checkpoint directory ([`TOKENIZER_FILES`]); a path that is not a directory on this host (a
//! model hub id) or that holds none of them cannot be judged, and counts as another tokenizer.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The tokenizer files of a checkpoint directory (`transformers` `tokenization_utils_base.py`:
/// the vocabulary files, `tokenizer_config.json`, `special_tokens_map.json`,
/// `added_tokens.json`, and the chat template SGLang applies).
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
];

/// The most of one tokenizer file read (a large vocabulary's `tokenizer.json` is tens of MB).
const MOST: u64 = 256 * 1024 * 1024;

/// Why two tokenizers are not known to be the same (each one phrase).
#[derive(Debug, thiserror::Error)]
pub enum NotSame {
    /// The directory cannot be read by this process.
    #[error("{} cannot be read on this host ({source})", dir.display())]
    Unreadable {
        /// The directory.
        dir: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Not a directory here (a hub id, a file).
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A tokenizer file's name is something other than a regular file.
    #[error("{} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    /// A tokenizer file larger than [`MOST`].
    #[error("{} is larger than {} MB", .0.display(), MOST / (1024 * 1024))]
    TooLarge(PathBuf),
    /// A tokenizer file cannot be read through.
    #[error("{} cannot be read ({source})", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// No tokenizer file at all.
    #[error("{} holds no tokenizer file", .0.display())]
    NoTokenizer(PathBuf),
    /// Both read, and these files differ.
    #[error("{} differ between {a} and {b}", files.join(", "))]
    Differ {
        /// The tokenizer files that differ.
        files: Vec<&'static str>,
        /// One path.
        a: String,
        /// The other.
        b: String,
    },
}

/// Each tokenizer file of `dir` present, by name, with its SHA-256; `Err`: why the directory
/// cannot be judged. Blocking: call it off the async threads.
pub fn fingerprint(dir: &Path) -> Result<BTreeMap<&'static str, String>, NotSame> {
    let meta = std::fs::metadata(dir).map_err(|source| NotSame::Unreadable { dir: dir.into(), source })?;
    if !meta.is_dir() {
        return Err(NotSame::NotADirectory(dir.into()));
    }
    let mut out = BTreeMap::new();
    for name in TOKENIZER_FILES {
        let path = dir.join(name);
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        // A FIFO or a device would block or never end: only regular files are tokenizer files.
        if !meta.is_file() {
            return Err(NotSame::NotAFile(path));
        }
        if meta.len() > MOST {
            return Err(NotSame::TooLarge(path));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(&path).and_then(|f| f.take(MOST + 1).read_to_end(&mut bytes)).map_err(|source| NotSame::Read { path: path.clone(), source })?;
        out.insert(*name, Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect());
    }
    if out.is_empty() {
        return Err(NotSame::NoTokenizer(dir.into()));
    }
    Ok(out)
}

/// Whether the tokenizers at `a` and `b` are the same: the same path, or directories with the
/// same tokenizer files, byte for byte. `Err`: why not, or why it cannot be told.
/// Blocking: call it off the async threads.
pub fn same(a: &str, b: &str) -> Result<(), NotSame> {
    if a.trim_end_matches('/') == b.trim_end_matches('/') {
        return Ok(());
    }
    let (fa, fb) = (fingerprint(Path::new(a))?, fingerprint(Path::new(b))?);
    if fa == fb {
        return Ok(());
    }
    let files = TOKENIZER_FILES.iter().copied().filter(|n| fa.get(n) != fb.get(n)).collect();
    Err(NotSame::Differ { files, a: a.to_string(), b: b.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        for (n, c) in files {
            std::fs::write(d.path().join(n), c).expect("write");
        }
        d
    }

    #[test]
    fn the_same_files_are_the_same_tokenizer_and_a_changed_file_is_named() {
        let a = dir(&[("tokenizer.json", "{\"v\":1}"), ("tokenizer_config.json", "{}"), ("model.safetensors", "a")]);
        let b = dir(&[("tokenizer.json", "{\"v\":1}"), ("tokenizer_config.json", "{}"), ("model.safetensors", "b")]);
        let c = dir(&[("tokenizer.json", "{\"v\":2}"), ("tokenizer_config.json", "{}")]);
        let (pa, pb, pc) = (a.path().display().to_string(), b.path().display().to_string(), c.path().display().to_string());
        assert!(same(&pa, &pb).is_ok(), "weights differ, the tokenizer does not");
        let e = same(&pa, &pc).expect_err("another vocabulary");
        assert!(matches!(&e, NotSame::Differ { files, .. } if files == &["tokenizer.json"]), "{e}");
        let e = e.to_string();
        assert!(e.starts_with("tokenizer.json differ"), "{e}");
        // A file present in one only is a difference too.
        let d = dir(&[("tokenizer.json", "{\"v\":1}"), ("tokenizer_config.json", "{}"), ("chat_template.jinja", "x")]);
        assert!(same(&pa, &d.path().display().to_string()).expect_err("a template more").to_string().contains("chat_template.jinja"));
    }

    #[test]
    fn a_path_that_cannot_be_judged_is_not_the_same_unless_it_is_the_same_path() {
        assert!(same("org/model", "org/model/").is_ok(), "the same path needs no files");
        let e = same("org/model", "org/other").expect_err("hub ids").to_string();
        assert!(e.contains("cannot be read on this host"), "{e}");
        let empty = dir(&[("config.json", "{}")]);
        let p = empty.path().display().to_string();
        assert!(same(&p, "/nonexistent").expect_err("no tokenizer").to_string().contains("holds no tokenizer file"));
    }

    #[test]
    #[cfg(unix)]
    fn a_fifo_in_place_of_a_tokenizer_file_is_refused_not_read() {
        let d = dir(&[("tokenizer_config.json", "{}")]);
        let fifo = d.path().join("tokenizer.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().map(|s| s.success()).unwrap_or(false);
        if !made {
            eprintln!("mkfifo is not available: this test could not observe");
            return;
        }
        let e = fingerprint(d.path()).expect_err("a FIFO").to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
