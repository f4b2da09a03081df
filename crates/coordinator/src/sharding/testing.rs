//! What tests and benches of a sharded fleet read (feature `testing`).

use super::*;

/// Which of `peers` owns `cluster` (rendezvous hashing by weight): for
/// tests and benches that check a fleet's split (feature `testing`).
pub fn owner<'a>(cluster: &str, peers: &'a [Peer]) -> Option<&'a Peer> {
    hrw::owner(cluster, peers)
}
/// Waits until `replicas` work on exactly the shares of `clusters` that
/// rendezvous hashing over their peer IDs and weights gives them (the
/// local cluster aside), for at most `within`; each one's share, in the
/// order of `replicas`. A split on the way (one replica still holding what
/// it is about to hand over) is not taken for the final one. For tests and
/// benches (feature `testing`).
pub async fn until_split(
    replicas: &[&ShardedCoordinator],
    clusters: &[&str],
    within: std::time::Duration,
) -> Result<Vec<Vec<ClusterName>>, String> {
    let peers: Vec<Peer> = replicas
        .iter()
        .map(|replica| replica.inner.me.clone())
        .collect();
    let shares: Vec<Vec<ClusterName>> = peers
        .iter()
        .map(|peer| {
            let mut share: Vec<ClusterName> = clusters
                .iter()
                .filter(|cluster| hrw::owner(cluster, &peers).is_some_and(|owner| owner == peer))
                .map(|cluster| ClusterName::from(*cluster))
                .collect();
            share.sort();
            share
        })
        .collect();
    let mut sets: Vec<_> = replicas
        .iter()
        .map(|replica| replica.working_set())
        .collect();
    let split = async {
        loop {
            let now: Vec<Vec<ClusterName>> = sets
                .iter_mut()
                .map(|set| {
                    set.borrow_and_update()
                        .iter()
                        .filter(|name| !name.is_local())
                        .cloned()
                        .collect()
                })
                .collect();
            if now == shares {
                return;
            }
            let changes = sets.iter_mut().map(|set| Box::pin(set.changed()));
            let _ = futures::future::select_all(changes).await;
        }
    };
    tokio::time::timeout(within, split)
        .await
        .map_err(|_| format!("the fleet not split as {shares:?} within {within:?}"))?;
    Ok(shares)
}

/// The name of the fence Lease that `prefix` gives `cluster`
/// ([`ShardingOptions`]' fence prefix): for tests and benches that read who
/// holds a cluster (feature `testing`).
pub fn fence_lease_name(prefix: &str, cluster: &str) -> String {
    crate::lease_name(prefix, cluster)
}
