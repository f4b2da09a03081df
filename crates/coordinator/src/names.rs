//! Lease names from peer IDs and cluster names.
//!
//! Go lowercases a name, turns every character outside `a-z 0-9 - .` into
//! `-` and trims the ends, with no length cap. That makes `a/b` and `a-b`
//! share one Lease, and a long name an invalid one. Here a name that had to
//! change (or be cut to fit) also gets a hash of the original, so distinct
//! names keep distinct Leases; a name that is already valid stays as Go
//! writes it.

use std::hash::Hasher;

/// Longest Kubernetes object name (a DNS-1123 subdomain).
#[cfg(feature = "sharding")]
const MAX_NAME: usize = 253;

/// `value` made into a DNS-1123 subdomain: lowercase, `a-z 0-9 - .` only,
/// alphanumeric at both ends, `unknown` when nothing is left.
pub(crate) fn dns1123(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "unknown".to_string()
    } else {
        trimmed.to_string()
    }
}

/// The Lease name `<prefix>-<value>`, with `value` made DNS-1123-safe. When
/// that changed `value`, or the name would be too long, a hash of `value`
/// is appended (cutting the name to fit) so that no two values share it.
#[cfg(feature = "sharding")]
pub(crate) fn lease_name(prefix: &str, value: &str) -> String {
    let safe = dns1123(value);
    let name = format!("{prefix}-{safe}");
    if safe == value && name.len() <= MAX_NAME {
        return name;
    }
    let suffix = format!("-{:016x}", fnv1a(value));
    let mut head = name;
    head.truncate(MAX_NAME - suffix.len());
    let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}{suffix}")
}

/// FNV-1a, 64 bits, of `value`'s bytes: the hash Go's sharder uses.
pub(crate) fn fnv1a(value: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    // `write`, not `Hash::hash`: the latter appends a terminator byte.
    hasher.write(value.as_bytes());
    hasher.finish()
}

#[cfg(all(test, feature = "sharding"))]
mod tests {
    use super::*;

    #[test]
    fn dns1123_follows_go() {
        for (input, want) in [
            ("Zoo", "zoo"),
            ("ns/name", "ns-name"),
            ("a_b.c", "a-b.c"),
            ("--x--", "x"),
            ("", "unknown"),
            ("///", "unknown"),
            ("ÄÖ1", "1"),
        ] {
            assert_eq!(dns1123(input), want, "{input:?}");
        }
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // From the FNV reference test suite.
        assert_eq!(fnv1a(""), 0xcbf29ce484222325);
        assert_eq!(fnv1a("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn valid_names_stay_as_go_writes_them() {
        assert_eq!(lease_name("mcr-shard", "zoo"), "mcr-shard-zoo");
        assert_eq!(lease_name("mcr-peer", "pod-0.x"), "mcr-peer-pod-0.x");
    }

    #[test]
    fn changed_names_stay_distinct() {
        let names = [
            lease_name("mcr-shard", "a/b"),
            lease_name("mcr-shard", "a-b"),
            lease_name("mcr-shard", "A-B"),
            lease_name("mcr-shard", ""),
            lease_name("mcr-shard", "unknown"),
        ];
        for (i, a) in names.iter().enumerate() {
            assert_eq!(a, &dns1123(a), "{a} is not DNS-1123");
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert!(names[0].starts_with("mcr-shard-a-b-"));
    }

    #[test]
    fn long_names_are_cut_and_stay_distinct() {
        let long_a = format!("{}a", "x".repeat(300));
        let long_b = format!("{}b", "x".repeat(300));
        let (a, b) = (
            lease_name("mcr-shard", &long_a),
            lease_name("mcr-shard", &long_b),
        );
        assert_eq!(a.len(), MAX_NAME);
        assert_eq!(b.len(), MAX_NAME);
        assert_ne!(a, b);
        assert_eq!(a, dns1123(&a));
    }
}
