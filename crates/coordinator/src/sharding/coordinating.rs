//! The replica as the manager sees it: the [`Coordinator`] contract
//! (engage under a fence, owns, working on, leave, run).

use super::*;

/// Engages the components under the fence's `work`; a failure stops the
/// work, so the cluster is handed back and tried again rather than left
/// half-engaged.
pub(super) fn engage_or_hand_back(
    components: &[Arc<dyn Aware>],
    work: &CancellationToken,
    name: &ClusterName,
    cluster: &Cluster,
) {
    if let Err(err) = engage_each(components, work, name, cluster) {
        tracing::error!(cluster = %name, error = %err, "engaging a component failed; handing the cluster back");
        work.cancel();
    }
}

#[async_trait::async_trait]
impl Coordinator for ShardedCoordinator {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
        components: &[Arc<dyn Aware>],
    ) -> Result<(), Error> {
        // The hub of components whose members' work reads it: engaged on
        // every replica, unfenced, for the cluster's lifetime (Go's
        // multicluster-runtime never shards the local cluster either).
        let (everywhere, components): (Vec<_>, Vec<_>) = components
            .iter()
            .cloned()
            .partition(|component| name.is_local() && component.local_on_every_replica());
        if !everywhere.is_empty() {
            engage_each(&everywhere, &lifetime, &name, &cluster)?;
        }
        // A new cluster, or a new instance under the same name (rotated
        // credentials): the old engagement's work ends, a fence held for it
        // stays, and the work restarts on the new instance.
        let start = self
            .inner
            .working
            .engage(&name, &cluster, &lifetime, &components);
        if let Some((work, cluster, components)) = start {
            engage_or_hand_back(&components, &work, &name, &cluster);
        }
        Ok(())
    }

    fn owns(&self, name: &ClusterName) -> bool {
        self.inner.working.works_on(name)
    }

    fn replicas(&self) -> Option<multicluster_runtime::coordinator::Replicas> {
        let peers = self.peers();
        Some(multicluster_runtime::coordinator::Replicas {
            me: self.inner.me.id.clone(),
            live: peers.iter().map(|peer| peer.id.clone()).collect(),
            owner: Arc::new(move |name: &ClusterName| {
                owner_of(name.as_str(), &peers).map(|peer| peer.id.clone())
            }),
        })
    }

    /// The clusters this replica works on now (it holds their fences),
    /// sorted.
    fn working_on(&self) -> Option<Vec<ClusterName>> {
        Some(self.inner.working.working_on())
    }

    fn inventory_engaged(&self) {
        self.inner.lifecycle.advance(Phase::Ready);
    }

    /// Hands every cluster over one by one (fences held with the peer
    /// Lease; for up to `leave_handover`): the peer Lease says this replica
    /// is leaving, so the others no longer count it as an owner and wait
    /// for its clusters rather than ask for them, and each look hands the
    /// clusters straight to their next owners until one finds none left.
    fn hands_over_on_leave(&self) -> bool {
        let options = &self.inner.options;
        options.fence_hold == FenceHold::WithPeer && !options.leave_handover.is_zero()
    }

    async fn leave(&self) {
        if !self.hands_over_on_leave() {
            return;
        }
        let options = &self.inner.options;
        let began = Instant::now();
        self.inner.lifecycle.advance(Phase::Leaving);
        tracing::info!(peer = %self.inner.me.id, "leaving: handing the clusters over to the others");
        // Or no longer balancing (it failed or ended): nothing would hand
        // anything over.
        let done = self.inner.lifecycle.until(Phase::HandedOver);
        match tokio::time::timeout(options.leave_handover, done).await {
            Ok(()) => {
                tracing::info!(peer = %self.inner.me.id, took = ?began.elapsed(), "leaving: handed over every cluster a ready peer could take");
            }
            Err(_) => {
                let left = self.working_on().map_or(0, |names| names.len());
                tracing::info!(peer = %self.inner.me.id, clusters = left, "leaving: time is up; the rest go with the peer Lease");
            }
        }
    }

    /// Runs the replica as a list of steps (each in `run.rs`): ready at
    /// the latest after `inventory_wait`, the peer registry, the fences
    /// followed (held with the peer Lease), the looks until `stop`, then
    /// everything handed back before the peer Lease goes.
    async fn run(&self, stop: CancellationToken) -> Result<(), Error> {
        let _stopped = self.inner.lifecycle.stops_on_drop();
        let _stop_waiting = self.ready_after_the_inventory_wait(&stop);
        let registry = self.registry();
        let known = registry.known.clone();
        let registry_stop = CancellationToken::new();
        // Should this future be dropped before the end (the manager's stop
        // deadline passed), the registry stops renewing rather than go on
        // for a replica that no longer runs.
        let abandoned = CancellationToken::new();
        let _abandon_when_dropped = abandoned.clone().drop_guard();
        let registry_task = tokio::spawn(registry.run(registry_stop.clone(), abandoned));
        let _stop_following = self.follow_fences();
        tracing::info!(peer = %self.inner.me.id, namespace = %self.inner.options.namespace, "sharding the fleet");
        self.look_until(&stop, &known).await;
        self.inner.lifecycle.advance(Phase::Stopping);
        self.release_all().await;
        registry_stop.cancel();
        registry_task.await.map_err(|source| Error::TaskFailed {
            task: "the peer registry",
            source,
        })
    }
}

impl std::fmt::Debug for ShardedCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedCoordinator")
            .field("peer", &self.inner.me)
            .field("working_on", &self.working_on())
            .finish_non_exhaustive()
    }
}
