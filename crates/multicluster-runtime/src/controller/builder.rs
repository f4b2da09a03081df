//! Building a controller: what it watches ([`Watch`]), in which clusters,
//! how it maps events to requests, and its settings.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use kube::api::{ApiResource, DynamicObject};
use kube::core::Selector;
use kube::runtime::events::Reporter;

use super::primary::Primary;
use super::settings::Chosen;
use super::source::{InformerSource, Source, in_same_cluster};
use super::{
    Action, Backoff, ClusterScope, Controller, Filter, Inner, MapContext, ReconcileError,
    Reconciler, Request, WorkQueue, work,
};
use crate::cache::CachedResource;
use crate::cluster::Cluster;
use crate::engagements::Engagements;
use crate::error::Error;
use crate::metrics::Metrics;
use multicluster_core::ClusterName;

/// Which clusters and events a watch covers; used with the builder's
/// `for_resource`, `owns` and `watches`.
pub struct Watch<K> {
    clusters: ClusterScope,
    labels: Option<Selector>,
    filters: Vec<Filter<K>>,
}

impl<K> Default for Watch<K> {
    fn default() -> Self {
        Self {
            clusters: ClusterScope::Fleet,
            labels: None,
            filters: Vec::new(),
        }
    }
}

impl<K> Watch<K> {
    /// The fleet, every event.
    pub fn new() -> Self {
        Self::default()
    }

    /// Watch these clusters instead of the fleet.
    #[must_use]
    pub fn clusters(mut self, clusters: ClusterScope) -> Self {
        self.clusters = clusters;
        self
    }

    /// Watch only the clusters, of those [`Watch::clusters`] selects,
    /// whose labels ([`Cluster::inventory`]) `selector` matches, with
    /// Kubernetes' label selector semantics (a `LabelSelector`'s
    /// `matchLabels` and `matchExpressions`, converted with `try_into`).
    /// The selection follows the labels: a cluster relabelled into it is
    /// watched from then on (its objects arrive as new, so each is
    /// reconciled), one relabelled out of it is no longer watched. For the
    /// primary watch ([`ControllerBuilder::for_resource`]) a cluster
    /// entering the selection is also owed what
    /// [`ControllerBuilder::owed_on_engage`] gives, and one leaving it what
    /// [`ControllerBuilder::owed_on_disengage`] gives (while it stays
    /// engaged, so requests for the cluster itself are reconciled too: the
    /// place to remove what the controller made there).
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::core::{Expression, Selector};
    /// use multicluster_runtime::controller::Watch;
    ///
    /// let production: Selector = [
    ///     Expression::Equal("env".into(), "production".into()),
    ///     Expression::DoesNotExist("decommissioning".into()),
    /// ]
    /// .into_iter()
    /// .collect();
    /// let watch = Watch::<ConfigMap>::new().cluster_labels(production);
    /// ```
    #[must_use]
    pub fn cluster_labels(mut self, selector: Selector) -> Self {
        self.labels = Some(selector);
        self
    }

    pub(super) fn into_parts(self) -> (ClusterScope, Option<Selector>, Vec<Filter<K>>) {
        (self.clusters, self.labels, self.filters)
    }

    /// Only events passing `filter` (all filters must pass).
    #[must_use]
    pub fn filter(mut self, filter: Filter<K>) -> Self {
        self.filters.push(filter);
        self
    }

    /// Only events for which `passes` holds: [`Watch::filter`] with a
    /// closure, whose argument type is then known.
    #[must_use]
    pub fn filter_by(
        self,
        passes: impl Fn(&crate::cache::CacheEvent<K>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filter(Arc::new(passes))
    }
}

type OwnedSource = Box<dyn FnOnce(&(String, String)) -> Arc<dyn Source> + Send>;

/// Builds a [`Controller`].
pub struct ControllerBuilder {
    name: String,
    primary: Option<(String, String)>,
    sources: Vec<Arc<dyn Source>>,
    /// Owned-type sources wait for the primary's (apiVersion, kind).
    owned: Vec<OwnedSource>,
    /// Settings set here; the rest come from the manager's defaults.
    chosen: Chosen,
    metrics: Option<Metrics>,
    owed: Option<Owed>,
    owed_on_disengage: Option<Owed>,
    owed_on_relabel: Option<Owed>,
    primary_ops: Option<Primary>,
    /// The primary watch's cluster label selector.
    primary_labels: Option<Selector>,
    warning_events: Option<Reporter>,
    triggers: super::triggers::Triggers,
    error_policy: Option<ErrorPolicyFn>,
    local_on_every_replica: bool,
}

type ErrorPolicyFn = work::PolicyFn;

/// What a cluster is owed when it is engaged.
pub(super) type Owed = Arc<dyn Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync>;

impl ControllerBuilder {
    /// What [`Controller::builder`] starts from.
    pub(super) fn new(name: String) -> Self {
        Self {
            name,
            primary: None,
            sources: Vec::new(),
            owned: Vec::new(),
            chosen: Chosen::default(),
            metrics: None,
            owed: None,
            owed_on_disengage: None,
            owed_on_relabel: None,
            primary_ops: None,
            primary_labels: None,
            warning_events: None,
            local_on_every_replica: false,
            triggers: super::triggers::Triggers::default(),
            error_policy: None,
        }
    }

    /// Reconcile objects of `K`: each event of a `K` requests its own
    /// reconcile.
    #[must_use]
    pub fn for_resource<K: CachedResource>(mut self, watch: Watch<K>) -> Self {
        self.primary = Some((K::api_version(&()).into_owned(), K::kind(&()).into_owned()));
        self.primary_labels = watch.labels.clone();
        self.primary_ops = Some(Primary::of::<K>());
        self.sources.push(Arc::new(InformerSource::typed(
            watch,
            in_same_cluster(Arc::new(|obj: &K| {
                vec![(
                    obj.meta().namespace.clone(),
                    obj.meta().name.clone().unwrap_or_default(),
                )]
            })),
        )));
        self
    }

    /// Reconcile the controlling owner (of the primary kind) of every `O` that
    /// changes.
    #[must_use]
    pub fn owns<O: CachedResource>(mut self, watch: Watch<O>) -> Self {
        self.owned.push(Box::new(move |(api_version, kind)| {
            let (api_version, kind) = (api_version.clone(), kind.clone());
            Arc::new(InformerSource::typed(
                watch,
                in_same_cluster(Arc::new(move |obj: &O| {
                    obj.meta()
                        .owner_references
                        .iter()
                        .flatten()
                        .filter(|owner| {
                            owner.controller == Some(true)
                                && owner.kind == kind
                                && owner.api_version == api_version
                        })
                        .map(|owner| (obj.meta().namespace.clone(), owner.name.clone()))
                        .collect()
                })),
            )) as Arc<dyn Source>
        }));
        self
    }

    /// Reconcile whatever requests `mapper` returns for each changed `W`.
    /// The [`MapContext`] names the cluster the event came from
    /// ([`MapContext::here`] makes a request in it) and the clusters engaged
    /// now, so a mapper may also reach across clusters: propagate a hub
    /// object to every member ([`map::to_every_member`](super::map::to_every_member)) or report a member
    /// object's change to its owner on the hub ([`map::to_owner`](super::map::to_owner)).
    /// Requests for clusters that are not engaged are dropped (see
    /// [`ControllerBuilder::owed_on_engage`] for those that join later).
    #[must_use]
    pub fn watches<W: CachedResource>(
        mut self,
        watch: Watch<W>,
        mapper: impl Fn(&MapContext<'_>, &W) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.sources
            .push(Arc::new(InformerSource::typed(watch, Arc::new(mapper))));
        self
    }

    /// Reconcile each request `requests` yields (kube-runtime's
    /// `reconcile_on`): a signal from outside the clusters, a timer of
    /// one's own. Requests for clusters that are not engaged are dropped.
    #[must_use]
    pub fn reconcile_on(
        mut self,
        requests: impl futures::Stream<Item = Request> + Send + 'static,
    ) -> Self {
        self.triggers.requests.push(Box::pin(requests));
        self
    }

    /// Reconcile every object of the primary type (set by
    /// [`ControllerBuilder::for_resource`]) each time `trigger` yields: in
    /// the named cluster for `Some(name)`, in every engaged cluster for
    /// `None` (kube-runtime's `reconcile_all_on`, for a fleet). Objects come
    /// from the caches, as a relist would have them.
    #[must_use]
    pub fn reconcile_all_on(
        mut self,
        trigger: impl futures::Stream<Item = Option<ClusterName>> + Send + 'static,
    ) -> Self {
        self.triggers.all.push(Box::pin(trigger));
        self
    }

    /// When a cluster leaves (its lifetime ends; not when it is replaced
    /// by a new instance of itself), queue the requests `owed` returns: the
    /// mirror of [`ControllerBuilder::owed_on_engage`], for what other
    /// clusters must do about the departure (recount every hub object that
    /// counted the member: [`map::local_requests`](super::map::local_requests)).
    /// `owed` gets the departed cluster's name and the controller; it must
    /// not block. Requests for the departed cluster itself are dropped.
    #[must_use]
    pub fn owed_on_disengage(
        mut self,
        owed: impl Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.owed_on_disengage = Some(Arc::new(owed));
        self
    }

    /// When a cluster is engaged, queue the requests `owed` returns for it,
    /// so a cluster that joins late converges without waiting for an event
    /// elsewhere (for example every hub object for a new member:
    /// [`map::local_objects`](super::map::local_objects)). `owed` gets the new cluster's name and the
    /// controller (to read other clusters' caches); it must not block.
    #[must_use]
    pub fn owed_on_engage(
        mut self,
        owed: impl Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.owed = Some(Arc::new(owed));
        self
    }

    /// When an engaged cluster's labels change (its provider updated its
    /// inventory in place: [`Cluster::set_inventory`](crate::Cluster::set_inventory)),
    /// queue the requests `owed` returns for it: for reconcilers that choose
    /// clusters by their labels themselves (`multicluster_propagation::Propagation::members_labelled`)
    /// rather than through [`Watch::cluster_labels`]. `owed` gets the
    /// cluster's name and the controller; it must not block.
    #[must_use]
    pub fn owed_on_relabel(
        mut self,
        owed: impl Fn(&ClusterName, &Controller) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.owed_on_relabel = Some(Arc::new(owed));
        self
    }

    /// Like [`ControllerBuilder::watches`] for a resource known at run time.
    #[must_use]
    pub fn watches_dynamic(
        mut self,
        resource: ApiResource,
        watch: Watch<DynamicObject>,
        mapper: impl Fn(&MapContext<'_>, &DynamicObject) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.sources.push(Arc::new(InformerSource::dynamic(
            resource,
            watch,
            Arc::new(mapper),
        )));
        self
    }

    /// Reconciles of one cluster running at once (default 1, as
    /// controller-runtime runs one controller's: each cluster has that many
    /// slots of its own). A cluster's requests never wait for another
    /// cluster's slots, so members whose reconciles hang cannot hold up the
    /// rest of the fleet.
    #[must_use]
    pub fn max_concurrent_reconciles(mut self, limit: usize) -> Self {
        self.chosen.max_concurrent_reconciles = Some(limit.max(1));
        self
    }

    /// Reconciles running at once across every cluster (default: no limit
    /// beyond each cluster's own slots). `1` gives controller-runtime's
    /// strict one reconcile at a time for the whole controller. A limit
    /// here is shared: clusters whose reconciles hang can hold all of it
    /// until the reconcile deadline frees them, and healthy members wait
    /// meanwhile. Reach for it to cap work on a shared resource (the local
    /// cluster, an external API), not for isolation.
    #[must_use]
    pub fn max_concurrent_reconciles_total(mut self, limit: usize) -> Self {
        self.chosen.max_concurrent_reconciles_total = Some(Some(limit.max(1)));
        self
    }

    /// How long a reconcile may run (default `DEFAULT_RECONCILE_TIMEOUT`,
    /// 5 minutes; `None`: as long as it takes). One that runs longer is
    /// cancelled, counted as an error with the result `timeout`, and backed
    /// off like any error.
    ///
    /// Cancelling drops the reconcile's future: it stops at the `.await` it
    /// was waiting on, and whatever it had done until then stays done. A
    /// reconciler must therefore be safe to stop at any `.await` — which it
    /// must be anyway, since the process can stop at any point — and converge
    /// when run again.
    #[must_use]
    pub fn reconcile_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.chosen.reconcile_timeout = Some(timeout);
        self
    }

    /// Error backoff (default 5 ms doubling up to 1000 s).
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.chosen.backoff = Some(backoff);
        self
    }

    /// Waits until a request has been left alone for `debounce` before
    /// running it (default zero: at once), as kube-runtime's debounce does:
    /// every event for it restarts the wait, so a burst of changes to one
    /// object is reconciled once. A request whose object changes without
    /// pause for longer than that keeps waiting; keep it short (a second
    /// or less). A request that changes while it runs runs again right
    /// after.
    #[must_use]
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.chosen.debounce = Some(debounce);
        self
    }

    /// Record reconcile metrics in `metrics` (the manager passes its own).
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Decides what follows a failed reconcile: `Some(action)` replaces
    /// the backoff (`Action::requeue(after)` retries after `after`,
    /// `Action::await_change()` waits for the next event), `None` keeps
    /// the backoff. A [`Terminal`](super::Terminal) error is never retried. See
    /// [`WorkQueueBuilder::error_policy`](super::WorkQueueBuilder::error_policy).
    #[must_use]
    pub fn error_policy(
        mut self,
        policy: impl Fn(&Request, &ReconcileError) -> Option<Action> + Send + Sync + 'static,
    ) -> Self {
        self.error_policy = Some(Arc::new(policy));
        self
    }

    /// When a reconcile fails, publishes a Warning Event about its object
    /// in the request's cluster (reason `ReconcileFailed`, the error's
    /// redacted text as its note, reported by `reporter`), so that
    /// `kubectl describe` in that cluster shows why. Only for requests of
    /// the `for_resource` type whose object is cached; repeated failures
    /// are counted as one Event's series. Off by default.
    #[must_use]
    pub fn warning_events(mut self, reporter: impl Into<Reporter>) -> Self {
        self.warning_events = Some(reporter.into());
        self
    }

    /// Works on the local cluster on every replica when a sharded
    /// coordinator shares the fleet among replicas, not only on the one it
    /// gives the local cluster to ([`Aware::local_on_every_replica`](crate::Aware::local_on_every_replica)):
    /// for a controller whose member reconciles read the hub. Its
    /// reconciles of local requests then run on every replica at once, so
    /// its writes to the local cluster must allow for that (per-replica
    /// fields, or a `resourceVersion` precondition).
    #[must_use]
    pub fn local_on_every_replica(mut self) -> Self {
        self.local_on_every_replica = true;
        self
    }

    /// Builds the controller around `reconcile`, which gets each request,
    /// its cluster and `context` (shared state: clients of other clusters,
    /// settings, a recorder), as kube-runtime's `Controller::run` does.
    pub fn build_with_context<C, F, Fut, E>(
        self,
        context: Arc<C>,
        reconcile: F,
    ) -> Result<Controller, Error>
    where
        C: Send + Sync + 'static,
        F: Fn(Request, Cluster, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Into<ReconcileError> + 'static,
    {
        self.build(move |request, cluster| reconcile(request, cluster, context.clone()))
    }

    /// Builds the controller around `reconcile`. Its error may be any type
    /// that converts into a boxed error (an error type of one's own,
    /// `Box<dyn Error + Send + Sync>`, `anyhow::Error`); wrap it in
    /// [`Terminal`](super::Terminal) when retrying cannot help.
    pub fn build<F, Fut, E>(self, reconcile: F) -> Result<Controller, Error>
    where
        F: Fn(Request, Cluster) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: Into<ReconcileError> + 'static,
    {
        let mut sources = self.sources;
        if !self.owned.is_empty() {
            let primary = self.primary.as_ref().ok_or_else(|| Error::InvalidOptions {
                component: format!("controller {}", self.name),
                reason: "owns() needs for_resource() to name the owner kind".to_string(),
            })?;
            sources.extend(self.owned.into_iter().map(|make| make(primary)));
        }
        if sources.is_empty() {
            return Err(Error::InvalidOptions {
                component: format!("controller {}", self.name),
                reason: "it watches nothing".to_string(),
            });
        }
        let warnings = match (self.warning_events, &self.primary_ops) {
            (None, _) => None,
            (Some(reporter), Some(primary)) => Some(Arc::new((reporter, primary.clone()))),
            (Some(_), None) => {
                return Err(Error::InvalidOptions {
                    component: format!("controller {}", self.name),
                    reason:
                        "warning_events() needs for_resource() to name the objects Events are about"
                            .to_string(),
                });
            }
        };
        let reconcile = Arc::new(reconcile);
        let reconciler: Reconciler = Arc::new(move |request, cluster| {
            let reconcile = reconcile.clone();
            let Some(warnings) = warnings.clone() else {
                return async move { reconcile(request, cluster).await.map_err(Into::into) }
                    .boxed();
            };
            async move {
                let result = reconcile(request.clone(), cluster.clone())
                    .await
                    .map_err(Into::into);
                if let Err(error) = &result {
                    let (reporter, primary) = warnings.as_ref();
                    primary.warn(reporter, &request, &cluster, error).await;
                }
                result
            }
            .boxed()
        });
        let mut work = WorkQueue::builder(self.name.clone());
        if let Some(metrics) = self.metrics {
            work = work.metrics(metrics);
        }
        if let Some(policy) = self.error_policy {
            work = work.error_policy(move |request, error| policy(request, error));
        }
        Ok(Controller {
            inner: Arc::new(Inner {
                name: self.name,
                sources,
                reconciler,
                work: work.build_gated(self.chosen),
                clusters: Mutex::new(Engagements::default()),
                running: Mutex::new(HashMap::new()),
                finished: tokio::sync::Notify::new(),
                behind: Mutex::default(),
                caught_up: tokio::sync::Notify::new(),
                owed: self.owed,
                owed_on_disengage: self.owed_on_disengage,
                owed_on_relabel: self.owed_on_relabel,
                primary: self.primary_ops,
                primary_labels: self.primary_labels,
                triggers: Mutex::new(self.triggers),
                local_on_every_replica: self.local_on_every_replica,
                coordinator: std::sync::OnceLock::new(),
            }),
        })
    }
}
