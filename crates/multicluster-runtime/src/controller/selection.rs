//! The sources of one engaged cluster, started and stopped as its labels
//! come to match the sources' cluster label selectors or stop matching
//! ([`Watch::cluster_labels`](super::Watch::cluster_labels)).

use std::sync::Arc;

use kube::core::{Selector, SelectorExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Controller;
use super::source::Source;
use crate::cluster::{Cluster, Inventory};
use multicluster_core::ClusterName;

/// What runs for one engaged cluster.
pub(super) struct Selection {
    controller: Controller,
    name: ClusterName,
    cluster: Cluster,
    /// The cluster's lifetime in the controller.
    stop: CancellationToken,
    /// The sources that watch the cluster by name, each with the token of
    /// its run while it runs.
    sources: Vec<(Arc<dyn Source>, Option<CancellationToken>)>,
    /// Whether the primary watch selects the cluster.
    primary: bool,
}

fn selects(selector: Option<&Selector>, inventory: &Inventory) -> bool {
    selector.is_none_or(|selector| selector.matches(&inventory.labels))
}

impl Selection {
    /// Starts those of `sources` whose selectors match the cluster's labels
    /// now and, if any source selects by label, follows the labels until
    /// `stop` fires. Returns whether the primary watch selects the cluster
    /// now (it does when it has no selector).
    pub(super) fn begin(
        controller: &Controller,
        name: &ClusterName,
        cluster: &Cluster,
        sources: Vec<Arc<dyn Source>>,
        stop: &CancellationToken,
    ) -> bool {
        let follows = controller.inner.primary_labels.is_some()
            || controller.inner.owed_on_relabel.is_some()
            || sources
                .iter()
                .any(|source| source.cluster_labels().is_some());
        let mut changes = cluster.inventory_changes();
        let inventory = changes.borrow_and_update().clone();
        let mut selection = Selection {
            controller: controller.clone(),
            name: name.clone(),
            cluster: cluster.clone(),
            stop: stop.clone(),
            sources: sources.into_iter().map(|source| (source, None)).collect(),
            primary: selects(controller.inner.primary_labels.as_ref(), &inventory),
        };
        selection.apply(&inventory);
        let primary = selection.primary;
        if follows {
            tokio::spawn(selection.follow(changes, inventory));
        }
        primary
    }

    /// Starts the sources that select the cluster and do not run, stops
    /// those that run and no longer select it.
    fn apply(&mut self, inventory: &Inventory) {
        for (source, running) in &mut self.sources {
            let wanted = selects(source.cluster_labels(), inventory);
            match (wanted, running.take()) {
                (true, None) => {
                    // Sources without a selector run for the cluster's
                    // whole lifetime: no token of their own to keep.
                    let token = if source.cluster_labels().is_some() {
                        self.stop.child_token()
                    } else {
                        self.stop.clone()
                    };
                    source.start(
                        self.name.clone(),
                        &self.cluster,
                        self.controller.clone(),
                        token.clone(),
                    );
                    *running = Some(token);
                }
                (false, Some(token)) => token.cancel(),
                (_, kept) => *running = kept,
            }
        }
    }

    async fn follow(
        mut self,
        mut changes: watch::Receiver<Arc<Inventory>>,
        mut before: Arc<Inventory>,
    ) {
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            let inventory = changes.borrow_and_update().clone();
            self.apply(&inventory);
            let inner = &self.controller.inner;
            if let Some(owed) = &inner.owed_on_relabel
                && inventory.labels != before.labels
            {
                for request in owed(&self.name, &self.controller) {
                    inner.work.enqueue(request);
                }
            }
            before = inventory.clone();
            let primary = selects(inner.primary_labels.as_ref(), &inventory);
            if primary == self.primary {
                continue;
            }
            self.primary = primary;
            let owed = if primary {
                tracing::info!(controller = %inner.name, cluster = %self.name, "the cluster's labels now match the controller's selector");
                &inner.owed
            } else {
                tracing::info!(controller = %inner.name, cluster = %self.name, "the cluster's labels no longer match the controller's selector");
                &inner.owed_on_disengage
            };
            if let Some(owed) = owed {
                for request in owed(&self.name, &self.controller) {
                    inner.work.enqueue(request);
                }
            }
        }
    }

    /// Whether `source` watches `cluster` now, by name and labels.
    pub(super) fn watches(source: &dyn Source, name: &ClusterName, cluster: &Cluster) -> bool {
        source.clusters().includes(name) && selects(source.cluster_labels(), &cluster.inventory())
    }
}
