//! Sharding settings and how fences are held.

use std::time::Duration;

use crate::dns1123;
use multicluster_runtime::Error;

/// Sharding settings; the defaults are Go multicluster-runtime's.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShardingOptions {
    /// Where peer and fence Leases live (default `kube-system`).
    pub namespace: String,
    /// This replica's ID (default: the host name, which is the pod name in
    /// Kubernetes). Made DNS-1123-safe.
    pub peer_id: Option<String>,
    /// Peer Lease name prefix (default `mcr-peer`). Replicas with another
    /// prefix are not peers, so one namespace can hold several groups.
    pub peer_prefix: String,
    /// This replica's weight (default 1; 0 counts as 1).
    pub peer_weight: u32,
    /// How long a peer counts as alive after its last renewal (default 30 s).
    pub peer_lease_duration: Duration,
    /// How often a replica renews its peer Lease and reads the others'
    /// (default 10 s).
    pub peer_renew_interval: Duration,
    /// Fence Lease name prefix (default `mcr-shard`).
    pub fence_prefix: String,
    /// How long a fence holds after its last renewal (default 20 s).
    pub fence_lease_duration: Duration,
    /// How often a held fence is renewed (default 10 s).
    pub fence_renew_interval: Duration,
    /// How long to wait before trying again to take a fence that was busy
    /// or could not be taken (default 750 ms).
    pub fence_retry_delay: Duration,
    /// How often ownership is re-examined even when nothing changed
    /// (default 5 s).
    pub probe_interval: Duration,
    /// How long reconciles still running on a cluster that moves to another
    /// replica may take before its fence is handed over anyway (default
    /// 30 s). The fence stays renewed meanwhile, so the new owner waits.
    pub handover_timeout: Duration,
    /// How held fences are kept (default [`FenceHold::Renewed`], Go's way).
    pub fence_hold: FenceHold,
    /// How long a starting replica waits for its provider to say it has
    /// engaged the inventory it first found
    /// ([`ProviderContext::inventory_engaged`](multicluster_runtime::ProviderContext::inventory_engaged))
    /// before its peer Lease says it is ready anyway (default 5 minutes).
    /// Until then the others keep working on the clusters it owns rather
    /// than hand them over (it takes those nobody works on as it engages
    /// them). Every provider of this project says so; with one that never
    /// does, hand-overs to a restarted or added replica wait this long.
    pub inventory_wait: Duration,
    /// How long a stopping replica hands its clusters one by one to their
    /// next owners, with fences held with the peer Lease (default 15 s).
    /// Each cluster is worked on until the moment its fence is written as
    /// the next owner's, who starts at once: a rolling update leaves no
    /// cluster unworked while the others take its fences. Its Lease says it
    /// is leaving meanwhile, so the others do not count it as an owner. What
    /// is left when the time is up (and everything, with zero or with no
    /// ready peer) is freed at once by deleting the peer Lease, one request,
    /// and taken by the others with a write each. Keep it well below the
    /// manager's shutdown grace (it comes out of it) and the pod's
    /// termination grace period. On a two-core machine shared with the API
    /// server one replica handed over about 570 clusters a second.
    pub leave_handover: Duration,
}

/// How a replica keeps the fences it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceHold {
    /// Every fence is renewed on its own every `fence_renew_interval` and
    /// lapses `fence_lease_duration` after its last renewal (Go's way).
    /// Steady cost: a write per held cluster per interval, about 1,000
    /// requests a second for 10,000 clusters at the defaults.
    #[default]
    Renewed,
    /// A fence holds while its holder's peer Lease is live in the epoch the
    /// fence was taken in (`crate::wire::HELD_WITH_ANNOTATION`);
    /// nothing renews it. Steady cost: one peer Lease renewal per replica
    /// per interval, whatever the fleet's size. A replica that cannot renew
    /// its peer Lease until one `peer_renew_interval` before it would
    /// lapse stops all its work. Another replica that wants a fence held
    /// with a lapsed peer Lease first ends that epoch (one write clearing
    /// the Lease's holder), which frees every fence held with it. A
    /// replica whose renewal comes through before that (an API server
    /// outage that every replica sat through) resumes its epoch and all
    /// its fences without a request each; one whose epoch was ended starts
    /// a new one and takes its clusters again. After a crash, the others
    /// take its clusters when its peer Lease lapses (`peer_lease_duration`)
    /// instead of each fence. Replicas of either kind can share a fleet.
    WithPeer,
}

impl Default for ShardingOptions {
    fn default() -> Self {
        Self {
            namespace: "kube-system".to_string(),
            peer_id: None,
            peer_prefix: "mcr-peer".to_string(),
            peer_weight: 1,
            peer_lease_duration: Duration::from_secs(30),
            peer_renew_interval: Duration::from_secs(10),
            fence_prefix: "mcr-shard".to_string(),
            fence_lease_duration: Duration::from_secs(20),
            fence_renew_interval: Duration::from_secs(10),
            fence_retry_delay: Duration::from_millis(750),
            probe_interval: Duration::from_secs(5),
            handover_timeout: Duration::from_secs(30),
            fence_hold: FenceHold::Renewed,
            inventory_wait: Duration::from_secs(300),
            leave_handover: Duration::from_secs(15),
        }
    }
}

multicluster_runtime::option_setters!(ShardingOptions {
    namespace: impl Into<String>,
    peer_id: impl Into<Option<String>>,
    peer_prefix: impl Into<String>,
    peer_weight: u32,
    peer_lease_duration: Duration,
    peer_renew_interval: Duration,
    fence_prefix: impl Into<String>,
    fence_lease_duration: Duration,
    fence_renew_interval: Duration,
    fence_retry_delay: Duration,
    probe_interval: Duration,
    handover_timeout: Duration,
    fence_hold: FenceHold,
    inventory_wait: Duration,
    leave_handover: Duration,
});

impl ShardingOptions {
    pub(super) fn check(&self) -> Result<(), Error> {
        let invalid = |reason: String| {
            Err(Error::InvalidOptions {
                component: "sharding options".to_string(),
                reason,
            })
        };
        for (field, prefix) in [
            ("peer_prefix", &self.peer_prefix),
            ("fence_prefix", &self.fence_prefix),
        ] {
            // The peer prefix is also a label value: at most 63 characters.
            if prefix.is_empty() || prefix.len() > 63 || dns1123(prefix) != *prefix {
                return invalid(format!(
                    "{field} {prefix:?} must be 1 to 63 characters of a-z, 0-9, '-' and '.', alphanumeric at both ends"
                ));
            }
        }
        if self.namespace.is_empty() {
            return invalid("namespace is empty".to_string());
        }
        for (what, duration, renew) in [
            ("peer", self.peer_lease_duration, self.peer_renew_interval),
            (
                "fence",
                self.fence_lease_duration,
                self.fence_renew_interval,
            ),
        ] {
            if renew.is_zero() || renew >= duration {
                return invalid(format!(
                    "the {what} renew interval ({renew:?}) must be above zero and below the {what} lease duration ({duration:?})"
                ));
            }
        }
        if self.probe_interval.is_zero() {
            return invalid("probe_interval is zero".to_string());
        }
        Ok(())
    }
}
