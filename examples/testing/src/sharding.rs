//! What the sharding tests and benchmark share: a fleet of labelled
//! namespaces, and who worked on which cluster when, read from the
//! ownership ledgers the sharded example's replicas keep (`--ownership-ledger`: one line
//! `<nanoseconds> <start|stop> <cluster>` each time a replica starts or
//! stops working on a cluster, the time from `CLOCK_MONOTONIC`, shared by
//! every process of the machine).
//!
//! The two numbers sharding must keep at zero come from it: clusters worked
//! on by two replicas at once, and clusters worked on by nobody for longer
//! than a bound.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_runtime::testing::{Polled, poll_every};

/// Creates the namespaces `names` labelled
/// `cluster.x-k8s.io/watch-filter=<filter>` (each a cluster of the
/// namespace provider with that watch filter), 32 at a time.
pub async fn create_namespaces(
    admin: &kube::Client,
    names: &[String],
    filter: &str,
) -> Result<(), kube::Error> {
    let api: Api<Namespace> = Api::all(admin.clone());
    let created: Vec<Result<Namespace, kube::Error>> = futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(
                        "cluster.x-k8s.io/watch-filter".to_string(),
                        filter.to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            async move { api.create(&PostParams::default(), &namespace).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    created.into_iter().try_for_each(|result| result.map(drop))
}

/// Now on the ledgers' clock, in nanoseconds.
pub fn now() -> u128 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u128::try_from(now.tv_sec).unwrap_or_default() * 1_000_000_000
        + u128::try_from(now.tv_nsec).unwrap_or_default()
}

/// One replica's spell of work on one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spell {
    /// The replica.
    pub replica: String,
    /// When it started, in nanoseconds.
    pub start: u128,
    /// When it stopped; `None` while it still works on the cluster.
    pub end: Option<u128>,
}

impl Spell {
    fn end_or(&self, open: u128) -> u128 {
        self.end.unwrap_or(open)
    }
}

/// Every replica's spells, by cluster.
#[derive(Clone, Debug, Default)]
pub struct Ownership {
    spells: BTreeMap<String, Vec<Spell>>,
}

/// The ledger of one replica process: the replica's ID, the file, and
/// when the process ended, if it did (its spells still open then end
/// there: a process that is gone works no more).
#[derive(Clone, Debug)]
pub struct LedgerFile {
    /// The replica's ID (a replica started again keeps it, with a new
    /// ledger).
    pub replica: String,
    /// Its ledger.
    pub path: std::path::PathBuf,
    /// When the process ended, on the ledgers' clock.
    pub ended_at: Option<u128>,
}

impl Ownership {
    /// Reads the ledgers. A line that cannot be read (a write cut short)
    /// is an error naming the file and the line.
    pub fn read(ledgers: &[LedgerFile]) -> Result<Self, String> {
        let mut ownership = Ownership::default();
        for ledger in ledgers {
            let text = match std::fs::read_to_string(&ledger.path) {
                Ok(text) => text,
                // Not written yet: the replica has not worked on anything.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(err) => return Err(format!("{}: {err}", ledger.path.display())),
            };
            // Open spells of this replica, by cluster.
            let mut open: BTreeMap<&str, Vec<u128>> = BTreeMap::new();
            for (number, line) in text.lines().enumerate() {
                let bad = || format!("{} line {}: {line:?}", ledger.path.display(), number + 1);
                let mut fields = line.splitn(3, ' ');
                let (Some(at), Some(what), Some(cluster)) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    return Err(bad());
                };
                let at: u128 = at.parse().map_err(|_| bad())?;
                match what {
                    "start" => open.entry(cluster).or_default().push(at),
                    "stop" => {
                        let start = open.get_mut(cluster).and_then(Vec::pop).ok_or_else(bad)?;
                        ownership.add(cluster, &ledger.replica, start, Some(at));
                    }
                    _ => return Err(bad()),
                }
            }
            for (cluster, starts) in open {
                for start in starts {
                    ownership.add(cluster, &ledger.replica, start, ledger.ended_at);
                }
            }
        }
        for spells in ownership.spells.values_mut() {
            spells.sort_by_key(|spell| spell.start);
        }
        Ok(ownership)
    }

    fn add(&mut self, cluster: &str, replica: &str, start: u128, end: Option<u128>) {
        self.spells
            .entry(cluster.to_string())
            .or_default()
            .push(Spell {
                replica: replica.to_string(),
                start,
                end,
            });
    }

    /// The spells of `cluster`, by start.
    pub fn spells(&self, cluster: &str) -> &[Spell] {
        self.spells.get(cluster).map_or(&[], Vec::as_slice)
    }

    /// Who works on each cluster now (a cluster with more than one is
    /// listed under each), by cluster.
    pub fn current(&self) -> BTreeMap<String, Vec<String>> {
        self.spells
            .iter()
            .map(|(cluster, spells)| {
                let working = spells
                    .iter()
                    .filter(|spell| spell.end.is_none())
                    .map(|spell| spell.replica.clone())
                    .collect();
                (cluster.clone(), working)
            })
            .collect()
    }

    /// The clusters two replicas worked on at the same time, each with the
    /// longest such overlap.
    pub fn worked_on_twice(&self) -> BTreeMap<String, Duration> {
        let open = u128::MAX;
        let mut twice = BTreeMap::new();
        for (cluster, spells) in &self.spells {
            let mut longest = 0;
            for (i, one) in spells.iter().enumerate() {
                for other in &spells[i + 1..] {
                    if other.replica == one.replica {
                        continue;
                    }
                    let from = one.start.max(other.start);
                    let to = one.end_or(open).min(other.end_or(open));
                    if to > from {
                        longest = longest.max(to - from);
                    }
                }
            }
            if longest > 0 {
                twice.insert(cluster.clone(), nanos(longest));
            }
        }
        twice
    }

    /// For each of `clusters`, the longest time within `from..to` that no
    /// replica worked on it.
    pub fn longest_unowned(
        &self,
        clusters: &[String],
        from: u128,
        to: u128,
    ) -> BTreeMap<String, Duration> {
        clusters
            .iter()
            .map(|cluster| {
                let mut covered_until = from;
                let mut longest = 0;
                for spell in self.spells(cluster) {
                    let (start, end) = (spell.start.max(from), spell.end_or(to).min(to));
                    if end <= start {
                        continue;
                    }
                    if start > covered_until {
                        longest = longest.max(start - covered_until);
                    }
                    covered_until = covered_until.max(end);
                }
                longest = longest.max(to.saturating_sub(covered_until));
                (cluster.clone(), nanos(longest))
            })
            .collect()
    }
}

/// The owner of `cluster` among the replicas `live`, weight 1 each (what
/// every replica computes by rendezvous hashing).
pub fn owner_among(cluster: &str, live: &[&str]) -> Option<String> {
    use multicluster_coordinator::sharding::{Peer, owner};
    let mut peers: Vec<Peer> = live
        .iter()
        .map(|id| Peer {
            id: id.to_string(),
            weight: 1,
        })
        .collect();
    peers.sort();
    owner(cluster, &peers).map(|peer| peer.id.clone())
}

/// Waits until every cluster of `names` is worked on by exactly its owner
/// among the replicas `live` (rendezvous hashing, weight 1 each), as the
/// `ledgers` say, and returns what they say then; fails after `limit`,
/// naming some clusters that were not. Polled every half second: the
/// ledgers are other processes' files.
pub async fn wait_settled(
    names: &[String],
    live: &[&str],
    ledgers: &[LedgerFile],
    limit: Duration,
) -> Result<Ownership, String> {
    let expected: Vec<Option<Vec<String>>> = names
        .iter()
        .map(|name| owner_among(name, live).map(|owner| vec![owner]))
        .collect();
    // The ledgers are other processes' files, read twice a second (they
    // grow with the fleet, and benchmarks read them while they measure).
    poll_every(
        Duration::from_millis(500),
        limit,
        Polled::OtherProcess,
        || async {
            let ownership = Ownership::read(ledgers)?;
            let current = ownership.current();
            let off: Vec<(&String, Option<&Vec<String>>)> = names
                .iter()
                .zip(&expected)
                .filter(|(name, expected)| current.get(*name) != expected.as_ref())
                .map(|(name, _)| (name, current.get(name)))
                .collect();
            if off.is_empty() {
                return Ok(ownership);
            }
            Err(format!(
                "{} clusters not worked on by exactly their owner, e.g. {:?}",
                off.len(),
                &off[..off.len().min(3)]
            ))
        },
    )
    .await
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(dir: &std::path::Path, replica: &str, lines: &str) -> std::path::PathBuf {
        let path = dir.join(format!("{replica}.ledger"));
        std::fs::write(&path, lines).expect("write");
        path
    }

    #[test]
    fn overlaps_and_gaps_are_found_between_replicas() {
        let dir = tempfile::tempdir().expect("dir");
        // c1: a to 100, b from 100 (a hand-over, no overlap); c2: a from
        // 10 until killed at 300, b from 250 (an overlap of 50); c3: a to
        // 100, b from 160 (a gap of 60).
        let a = ledger(
            dir.path(),
            "a",
            "0 start c1\n10 start c2\n0 start c3\n100 stop c1\n100 stop c3\n",
        );
        let b = ledger(
            dir.path(),
            "b",
            "100 start c1\n250 start c2\n160 start c3\n",
        );
        let ownership = Ownership::read(&[
            LedgerFile {
                replica: "a".into(),
                path: a,
                ended_at: Some(300),
            },
            LedgerFile {
                replica: "b".into(),
                path: b,
                ended_at: None,
            },
        ])
        .expect("read");
        let twice = ownership.worked_on_twice();
        assert_eq!(twice.keys().collect::<Vec<_>>(), ["c2"]);
        assert_eq!(twice["c2"], Duration::from_nanos(50));
        let clusters: Vec<String> = ["c1", "c2", "c3"].map(String::from).to_vec();
        let unowned = ownership.longest_unowned(&clusters, 0, 400);
        assert_eq!(unowned["c1"], Duration::ZERO);
        assert_eq!(unowned["c2"], Duration::from_nanos(10));
        assert_eq!(unowned["c3"], Duration::from_nanos(60));
        assert_eq!(ownership.current()["c1"], ["b"]);
    }

    #[test]
    fn a_stop_without_its_start_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        let a = ledger(dir.path(), "a", "5 stop c1\n");
        let err = Ownership::read(&[LedgerFile {
            replica: "a".into(),
            path: a,
            ended_at: None,
        }])
        .expect_err("unmatched stop");
        assert!(err.contains("line 1"), "{err}");
    }
}
