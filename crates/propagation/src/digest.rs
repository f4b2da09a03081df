//! The one digest of this crate: FNV-1a, 64 bits, the same in every process
//! and release (std's hasher promises neither), so that a revision, a
//! ControllerRevision's name or a gate Job's name computed after a restart
//! or on another replica is the one computed before.

use std::hash::Hasher;

/// FNV-1a, 64 bits, of `bytes`.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    // `write`, not `Hash::hash`: the latter appends a terminator byte.
    hasher.write(bytes);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_reference_vectors() {
        // From the FNV reference test suite.
        assert_eq!(super::fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(super::fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
