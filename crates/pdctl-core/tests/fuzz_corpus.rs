//! The fuzzers' corpora (fuzz/corpus/<target>/, kept in the repository) replayed on stable
//! through the same entry points the fuzz targets call (`pdctl_core::fuzzing`): every input the
//! fuzzers found interesting, or that once crashed, must return without a panic.

use std::path::Path;

/// A fuzz entry point.
type Target = fn(&[u8]);

/// Every fuzz target, by its corpus's name.
const TARGETS: [(&str, Target); 9] = [
    ("config", pdctl_core::fuzzing::config),
    ("prom", pdctl_core::fuzzing::prom),
    ("api", pdctl_core::fuzzing::api),
    ("judge", pdctl_core::fuzzing::judge),
    ("fleet", pdctl_core::fuzzing::fleet),
    ("worker_json", pdctl_core::fuzzing::worker_json),
    ("service", pdctl_core::fuzzing::service),
    ("state", pdctl_core::fuzzing::state),
    ("exec_start", pdctl_core::fuzzing::exec_start),
];

#[test]
fn every_corpus_input_returns_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for (name, run) in TARGETS {
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

/// Without a fuzzer (stable, every CI run): each corpus input mutated a few hundred ways —
/// bytes flipped, cut, duplicated, spliced with another input — by a fixed-seed generator, through
/// the same entry points. Cheap coverage of what lies near the inputs the fuzzers kept; a
/// failure prints the seed and the input.
#[test]
fn mutations_of_every_corpus_input_return_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64*: deterministic, no dependency.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for (name, run) in TARGETS {
        let inputs: Vec<Vec<u8>> = std::fs::read_dir(root.join(name)).expect("corpus").flatten().filter_map(|e| std::fs::read(e.path()).ok()).collect();
        for input in inputs.iter().take(40) {
            for _ in 0..50 {
                let mut m = input.clone();
                match next() % 4 {
                    0 if !m.is_empty() => {
                        let i = (next() as usize) % m.len();
                        m[i] ^= 1 << (next() % 8);
                    }
                    1 if !m.is_empty() => m.truncate((next() as usize) % m.len()),
                    2 if !m.is_empty() => {
                        let i = (next() as usize) % m.len();
                        let j = (i + (next() as usize) % 16).min(m.len());
                        let piece = m[i..j].to_vec();
                        m.splice(i..i, piece);
                    }
                    _ => {
                        let other = &inputs[(next() as usize) % inputs.len()];
                        let cut = if other.is_empty() { 0 } else { (next() as usize) % other.len() };
                        m.extend_from_slice(&other[cut..]);
                    }
                }
                run(&m);
            }
        }
    }
}
