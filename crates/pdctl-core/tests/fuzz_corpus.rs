//! The fuzzers' corpora (fuzz/corpus/<target>/, kept in the repository) replayed on stable
//! through the same entry points the fuzz targets call (`pdctl_core::fuzzing`): every input the
//! fuzzers found interesting, or that once crashed, must return without a panic.

use std::path::Path;

/// A fuzz entry point.
type Target = fn(&[u8]);

#[test]
fn every_corpus_input_returns_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let targets: [(&str, Target); 4] = [
        ("config", pdctl_core::fuzzing::config),
        ("prom", pdctl_core::fuzzing::prom),
        ("api", pdctl_core::fuzzing::api),
        ("judge", pdctl_core::fuzzing::judge),
    ];
    for (name, run) in targets {
        let dir = root.join(name);
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let bytes = std::fs::read(e.path()).expect("corpus file");
            run(&bytes);
            n += 1;
        }
        assert!(n > 0, "{name}: an empty corpus");
    }
}
