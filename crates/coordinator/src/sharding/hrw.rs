//! Rendezvous (highest-random-weight) hashing: which peer owns a cluster.
//!
//! Every replica computes the same answer from the same peer list, with no
//! coordination, and a peer joining or leaving moves only the clusters it
//! wins or held: about 1/N of the fleet.
//!
//! This is where we part from Go, whose score is FNV-1a-64 of
//! `cluster|id` times the weight. FNV-1a barely carries the last bytes of
//! its input into the high bits, and peer IDs usually differ only in their
//! last characters (a StatefulSet's `x-0`, `x-1`, ...): with five such
//! peers Go's score gives the last one half of the fleet, and a weight,
//! multiplied in with wrapping, reorders peers rather than growing a share.
//! Here the draw is XXH3-64 (a specified hash, the same on every platform)
//! and the weight enters as weighted rendezvous hashing's
//! `weight / -ln(draw)`, so each peer's share is its weight over the sum.

use xxhash_rust::xxh3::xxh3_64;

/// A replica taking part in sharding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Peer {
    /// The replica's ID (DNS-1123-safe).
    pub id: String,
    /// Its share of the fleet relative to others (a peer of weight 2 gets
    /// twice the clusters of a peer of weight 1); 0 counts as 1.
    pub weight: u32,
}

/// The peer that owns `cluster` among `peers`, or `None` for no peers.
///
/// The highest score wins; on a tie (as good as never) the later
/// peer in `peers` does. Callers pass the peers sorted by ID so that every
/// replica breaks ties alike.
pub(crate) fn owner<'a>(
    cluster: &str,
    peers: impl IntoIterator<Item = &'a Peer>,
) -> Option<&'a Peer> {
    let mut best: Option<(&Peer, f64)> = None;
    for peer in peers {
        let score = score(cluster, peer);
        if best.is_none_or(|(_, high)| score >= high) {
            best = Some((peer, score));
        }
    }
    best.map(|(peer, _)| peer)
}

/// `peer`'s score for `cluster`: `weight / -ln(u)`, where `u` is a uniform
/// draw in (0, 1) from XXH3-64 of `cluster|id`.
pub(crate) fn score(cluster: &str, peer: &Peer) -> f64 {
    let hash = xxh3_64(format!("{cluster}|{}", peer.id).as_bytes());
    // The top 53 bits, as a double strictly between 0 and 1.
    let uniform = ((hash >> 11) as f64 + 0.5) / (1_u64 << 53) as f64;
    f64::from(peer.weight.max(1)) / -uniform.ln()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn peers(ids: &[&str]) -> Vec<Peer> {
        ids.iter()
            .map(|id| Peer {
                id: (*id).to_string(),
                weight: 1,
            })
            .collect()
    }

    fn clusters(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("shard-{i}")).collect()
    }

    fn shares(clusters: &[String], peers: &[Peer]) -> BTreeMap<String, usize> {
        let mut shares = BTreeMap::new();
        for cluster in clusters {
            let owner = owner(cluster, peers).expect("owner");
            *shares.entry(owner.id.clone()).or_default() += 1;
        }
        shares
    }

    #[test]
    fn no_peers_no_owner() {
        assert_eq!(owner("zoo", &[]), None);
    }

    #[test]
    fn the_highest_score_wins() {
        let all = peers(&["a", "b", "c"]);
        let want = all
            .iter()
            .max_by(|x, y| score("zoo", x).total_cmp(&score("zoo", y)))
            .expect("peers");
        assert_eq!(owner("zoo", &all), Some(want));
    }

    #[test]
    fn peers_named_alike_get_equal_shares() {
        // StatefulSet pods: IDs that differ in their last character only.
        // Go's FNV-1a score gives `replica-4` half of these clusters.
        let five = peers(&[
            "replica-0",
            "replica-1",
            "replica-2",
            "replica-3",
            "replica-4",
        ]);
        for (id, share) in shares(&clusters(10_000), &five) {
            assert!(
                (1_800..=2_200).contains(&share),
                "{id} owns {share} of 10000"
            );
        }
    }

    #[test]
    fn a_new_peer_takes_about_its_share_and_nothing_else_moves() {
        let four = peers(&["replica-0", "replica-1", "replica-2", "replica-3"]);
        let five = peers(&[
            "replica-0",
            "replica-1",
            "replica-2",
            "replica-3",
            "replica-4",
        ]);
        let mut moved = 0;
        for cluster in &clusters(10_000) {
            let before = owner(cluster, &four).expect("owner");
            let after = owner(cluster, &five).expect("owner");
            if before != after {
                assert_eq!(after.id, "replica-4", "{cluster} moved between old peers");
                moved += 1;
            }
        }
        // 1/5 of 10,000 is 2,000.
        assert!((1_800..=2_200).contains(&moved), "{moved} clusters moved");
    }

    #[test]
    fn a_peer_of_weight_two_gets_twice_the_share() {
        let mut weighted = peers(&["replica-0", "replica-1", "replica-2", "replica-3"]);
        weighted[0].weight = 2;
        let shares = shares(&clusters(10_000), &weighted);
        // 2/5 of 10,000 for the heavy one, 1/5 for each other.
        assert!((3_700..=4_300).contains(&shares["replica-0"]), "{shares:?}");
        for id in ["replica-1", "replica-2", "replica-3"] {
            assert!((1_800..=2_200).contains(&shares[id]), "{shares:?}");
        }
    }

    #[test]
    fn weight_zero_counts_as_one() {
        let mut zero = peers(&["a", "b"]);
        zero[0].weight = 0;
        let one = peers(&["a", "b"]);
        for cluster in clusters(50) {
            assert_eq!(
                owner(&cluster, &zero).map(|p| &p.id),
                owner(&cluster, &one).map(|p| &p.id)
            );
        }
    }
}
