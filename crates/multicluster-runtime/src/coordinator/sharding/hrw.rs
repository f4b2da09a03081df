//! Rendezvous (highest-random-weight) hashing: which peer owns a cluster.
//!
//! Every replica computes the same answer from the same peer list, with no
//! coordination, and a peer joining or leaving moves only the clusters it
//! wins or held: about 1/N of the fleet.
//!
//! Weights follow Go exactly (the score times the weight, wrapping), so
//! replicas of both agree. The product wraps for almost every score, so a
//! weight shuffles which clusters a peer wins more than it grows its share.

use crate::coordinator::names::fnv1a;

/// A replica taking part in sharding.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Peer {
    /// The replica's ID (DNS-1123-safe).
    pub id: String,
    /// Its share of the fleet relative to others; 0 counts as 1.
    pub weight: u32,
}

/// The peer that owns `cluster` among `peers`, or `None` for no peers.
///
/// A peer's score is FNV-1a-64 of `cluster|id`, times its weight (wrapping);
/// the highest score wins, and on a tie the later peer in `peers` does (as
/// in Go). Callers pass the peers sorted by ID so that every replica breaks
/// ties alike.
pub fn owner<'a>(cluster: &str, peers: &'a [Peer]) -> Option<&'a Peer> {
    let mut best: Option<(&Peer, u64)> = None;
    for peer in peers {
        let score =
            fnv1a(&format!("{cluster}|{}", peer.id)).wrapping_mul(u64::from(peer.weight.max(1)));
        if best.is_none_or(|(_, high)| score >= high) {
            best = Some((peer, score));
        }
    }
    best.map(|(peer, _)| peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(ids: &[&str]) -> Vec<Peer> {
        ids.iter()
            .map(|id| Peer {
                id: (*id).to_string(),
                weight: 1,
            })
            .collect()
    }

    #[test]
    fn no_peers_no_owner() {
        assert_eq!(owner("zoo", &[]), None);
    }

    #[test]
    fn the_highest_score_wins() {
        let all = peers(&["a", "b", "c"]);
        let score = |id: &str| fnv1a(&format!("zoo|{id}"));
        let want = ["a", "b", "c"]
            .into_iter()
            .max_by_key(|id| score(id))
            .expect("peers");
        assert_eq!(owner("zoo", &all).map(|p| p.id.as_str()), Some(want));
    }

    #[test]
    fn a_new_peer_takes_about_its_share_and_nothing_else_moves() {
        let three = peers(&["r0", "r1", "r2"]);
        let four = peers(&["r0", "r1", "r2", "r3"]);
        let clusters: Vec<String> = (0..1000).map(|i| format!("cluster-{i}")).collect();
        let mut moved = 0;
        for cluster in &clusters {
            let before = owner(cluster, &three).expect("owner");
            let after = owner(cluster, &four).expect("owner");
            if before != after {
                assert_eq!(after.id, "r3", "{cluster} moved between old peers");
                moved += 1;
            }
        }
        // 1/4 of 1000 is 250; FNV over these names lands well inside this.
        assert!((150..350).contains(&moved), "{moved} clusters moved");
    }

    #[test]
    fn weight_zero_counts_as_one() {
        let mut zero = peers(&["a", "b"]);
        zero[0].weight = 0;
        let one = peers(&["a", "b"]);
        for i in 0..50 {
            let cluster = format!("c{i}");
            assert_eq!(
                owner(&cluster, &zero).map(|p| &p.id),
                owner(&cluster, &one).map(|p| &p.id)
            );
        }
    }

    #[test]
    fn weight_multiplies_the_score_wrapping() {
        // As in Go: the product wraps, so a weight reorders scores rather
        // than scaling a peer's share (see the module notes).
        let mut weighted = peers(&["a", "b"]);
        weighted[0].weight = 3;
        for i in 0..50 {
            let cluster = format!("c{i}");
            let a = fnv1a(&format!("{cluster}|a")).wrapping_mul(3);
            let b = fnv1a(&format!("{cluster}|b"));
            let want = if b >= a { "b" } else { "a" };
            assert_eq!(
                owner(&cluster, &weighted).map(|p| p.id.as_str()),
                Some(want)
            );
        }
    }
}
