//! Random identities: a process's generation, request ids.

/// A random number (per-process identities, request ids).
pub fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let a = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(a);
    (u128::from(a) << 64) | u128::from(h.finish())
}
