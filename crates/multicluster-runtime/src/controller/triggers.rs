//! Reconciles asked for from outside the watches: a stream of requests
//! (`reconcile_on`) and a stream that asks for every primary object again,
//! in one cluster or in every engaged one (`reconcile_all_on`), as
//! kube-runtime's `Controller::reconcile_on` and `reconcile_all_on` do for
//! one cluster.

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;

use super::{Controller, Request};
use multicluster_core::ClusterName;

/// The trigger streams a controller was built with, taken when it runs.
#[derive(Default)]
pub(super) struct Triggers {
    pub(super) requests: Vec<BoxStream<'static, Request>>,
    /// `None` asks for every engaged cluster, `Some` for one.
    pub(super) all: Vec<BoxStream<'static, Option<ClusterName>>>,
}

impl Controller {
    /// Follows the trigger streams until `shutdown` or until they end.
    pub(super) fn follow_triggers(&self, triggers: Triggers, shutdown: &CancellationToken) {
        for mut requests in triggers.requests {
            let (controller, stop) = (self.clone(), shutdown.clone());
            tokio::spawn(async move {
                loop {
                    let request = tokio::select! {
                        () = stop.cancelled() => return,
                        request = requests.next() => request,
                    };
                    let Some(request) = request else { return };
                    controller.inner.work.enqueue(request);
                }
            });
        }
        for mut all in triggers.all {
            let (controller, stop) = (self.clone(), shutdown.clone());
            tokio::spawn(async move {
                loop {
                    let which = tokio::select! {
                        () = stop.cancelled() => return,
                        which = all.next() => which,
                    };
                    let Some(which) = which else { return };
                    controller.reconcile_all(which.as_ref());
                }
            });
        }
    }

    /// Queues every primary object of `cluster` (every engaged cluster when
    /// `None`).
    fn reconcile_all(&self, cluster: Option<&ClusterName>) {
        let Some(primary) = &self.inner.primary else {
            return;
        };
        let clusters = match cluster {
            Some(name) => vec![name.clone()],
            None => self.engaged_clusters(),
        };
        for name in clusters {
            let Some(engaged) = self.cluster(&name) else {
                continue;
            };
            for (namespace, object) in primary.list(&engaged) {
                self.inner
                    .work
                    .enqueue(Request::new(name.clone(), namespace.as_deref(), object));
            }
        }
    }
}
