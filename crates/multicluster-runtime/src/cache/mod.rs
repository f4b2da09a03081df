//! A cluster's shared cache: one watch per resource type, shared by every
//! controller that reads that type in that cluster.
//!
//! Informers are created on first use ([`Cache::informer`],
//! [`Cache::dynamic`], [`Cache::metadata`]) and run until the cache is
//! stopped or dropped. Each is a kube-runtime `watcher` with its own backoff,
//! so one failing watch never slows another cluster's. Field indexes
//! registered on the cache ([`Cache::index_field`]) reach informers of that
//! type created before and after.

mod event;
mod index;
mod informer;
mod initial_list;
mod options;
mod retry;
mod scope;
mod scoped;
mod subscription;

use multicluster_core::lock;
use std::any::{Any, TypeId};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

pub use event::CacheEvent;
pub use index::FieldIndex;
pub use informer::Informer;
use initial_list::InitialList;
use options::resource_id;
pub use options::{CacheOptions, LongOutage, MEMBER_UNREACHABLE_MAX, WatchBackoff};
pub(crate) use scope::WatchScope;
pub use subscription::{SUBSCRIBER_BUFFER, Subscription};

use crate::error::Error;
use index::Indexes;
use multicluster_core::ClusterName;

/// How long a read through a cache waits for its informer's first list by
/// default ([`CacheOptions::sync_wait`]), and the manager's default
/// `sync_timeout`.
pub(crate) const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// A Rust type the cache can watch: any k8s-openapi or `kube::CustomResource`
/// type. (Its scope's bound is sealed: the three scopes kube-rs has are all
/// there are.)
pub trait CachedResource:
    Resource<DynamicType = (), Scope: WatchScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> CachedResource for K where
    K: Resource<DynamicType = (), Scope: WatchScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// Identifies one informer of a cache.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ResourceKey {
    rust_type: TypeId,
    group: String,
    version: String,
    plural: String,
}

impl ResourceKey {
    pub(crate) fn typed<K: Resource + 'static>(dyntype: &K::DynamicType) -> Self {
        Self {
            rust_type: TypeId::of::<K>(),
            group: K::group(dyntype).into_owned(),
            version: K::version(dyntype).into_owned(),
            plural: K::plural(dyntype).into_owned(),
        }
    }
}

/// One cluster's shared cache. Cheap to clone; clones share informers.
/// Dropping the last clone stops every informer.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    cluster: ClusterName,
    backend: Backend,
    stop: CancellationToken,
    informers: Mutex<Vec<(ResourceKey, Arc<dyn ErasedInformer>)>>,
    indexes: Mutex<Vec<FieldIndex>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Where a cache's informers get their events.
enum Backend {
    /// Watches against an API server.
    Api {
        client: kube::Client,
        // Boxed: it is large, and a fleet has a cache per cluster.
        options: Box<CacheOptions>,
    },
    /// One namespace of a host cache, shown as `default`.
    Scoped { host: Cache, namespace: String },
}

/// What the cache needs of an informer without knowing its type.
trait ErasedInformer: Send + Sync {
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
    fn is_ready(&self) -> bool;
    fn ready(&self) -> tokio::sync::watch::Receiver<bool>;
    fn failure(&self) -> Option<multicluster_core::health::Failure>;
    fn add_index(&self, index: &FieldIndex);
}

impl<K> ErasedInformer for Informer<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
    fn is_ready(&self) -> bool {
        Informer::is_ready(self)
    }
    fn ready(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ready.clone()
    }
    fn failure(&self) -> Option<multicluster_core::health::Failure> {
        Informer::failure(self)
    }
    fn add_index(&self, index: &FieldIndex) {
        if let Some(extractor) = index.extractor::<K>() {
            Informer::add_index(self, index.field.clone(), extractor);
        }
    }
}

impl Cache {
    /// A cache for `cluster` (used in logs) that watches through `client`.
    pub fn new(cluster: impl Into<ClusterName>, client: kube::Client) -> Self {
        Self::with_options(cluster, client, CacheOptions::default())
    }

    /// A cache with explicit options.
    pub fn with_options(
        cluster: impl Into<ClusterName>,
        client: kube::Client,
        options: CacheOptions,
    ) -> Self {
        Self::with_backend(
            cluster.into(),
            Backend::Api {
                client,
                options: Box::new(options),
            },
        )
    }

    /// The namespace a [`Cache::scoped`] view shows its host namespace as.
    pub const VIRTUAL_NAMESPACE: &'static str = "default";

    /// A view of `host` that shows only `namespace`, renamed to
    /// [`Cache::VIRTUAL_NAMESPACE`] (`default`). Its informers are fed by the
    /// host's, so any number of views share one watch per type; lists and
    /// index queries through the view see only that namespace. The host
    /// cache must not be restricted to another namespace.
    pub fn scoped(
        cluster: impl Into<ClusterName>,
        host: &Cache,
        namespace: impl Into<String>,
    ) -> Self {
        Self::with_backend(
            cluster.into(),
            Backend::Scoped {
                host: host.clone(),
                namespace: namespace.into(),
            },
        )
    }

    /// The options this cache watches with; `None` for a view of another
    /// cache ([`Cache::scoped`]), which watches with its host's.
    pub fn options(&self) -> Option<&CacheOptions> {
        match &self.inner.backend {
            Backend::Api { options, .. } => Some(options),
            Backend::Scoped { .. } => None,
        }
    }

    fn with_backend(cluster: ClusterName, backend: Backend) -> Self {
        Self {
            inner: Arc::new(Inner {
                cluster,
                backend,
                stop: CancellationToken::new(),
                informers: Mutex::new(Vec::new()),
                indexes: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The shared informer for the typed resource `K`, started on first use.
    pub fn informer<K>(&self) -> Arc<Informer<K>>
    where
        K: CachedResource,
    {
        let key = ResourceKey::typed::<K>(&());
        match &self.inner.backend {
            Backend::Api { client, options } => self.ensure(key, (), || {
                let api = restricted_api::<K>(client, options, &());
                let (events, retries) = watch_events(api, &(), options);
                (events, Some(retries))
            }),
            Backend::Scoped { host, namespace } => {
                let host = host.informer::<K>();
                self.ensure(key, (), || (scoped::events(host, namespace.clone()), None))
            }
        }
    }

    /// The informer for `K` if something started it in this cache: for a
    /// look that must not start a watch (a cluster the type is not watched
    /// in may well refuse one).
    pub fn started_informer<K>(&self) -> Option<Arc<Informer<K>>>
    where
        K: CachedResource,
    {
        let key = ResourceKey::typed::<K>(&());
        lock(&self.inner.informers)
            .iter()
            .find(|(existing, _)| *existing == key)
            .and_then(|(_, informer)| informer.clone().into_any().downcast::<Informer<K>>().ok())
    }

    /// The shared informer for a resource known only at run time.
    ///
    /// With a namespace restriction the resource is watched in that namespace;
    /// use an unrestricted cache for cluster-scoped dynamic resources.
    pub fn dynamic(&self, resource: &ApiResource) -> Arc<Informer<DynamicObject>> {
        let key = ResourceKey::typed::<DynamicObject>(resource);
        match &self.inner.backend {
            Backend::Api { client, options } => self.ensure(key, resource.clone(), || {
                let api = restricted_api::<DynamicObject>(client, options, resource);
                let (events, retries) = watch_events(api, resource, options);
                (events, Some(retries))
            }),
            Backend::Scoped { host, namespace } => {
                let host = host.dynamic(resource);
                self.ensure(key, resource.clone(), || {
                    (scoped::events(host, namespace.clone()), None)
                })
            }
        }
    }

    /// A metadata-only informer for `K`: objects carry only their metadata
    /// (lists and watches ask the server for `PartialObjectMetadata`), which
    /// keeps memory and traffic low when a controller needs no spec or
    /// status. It is the informer of `PartialObjectMeta<K>`, so a controller
    /// whose sources watch `Watch::<PartialObjectMeta<K>>` shares it.
    pub fn metadata<K>(&self) -> Arc<Informer<PartialObjectMeta<K>>>
    where
        K: CachedResource,
    {
        self.informer::<PartialObjectMeta<K>>()
    }

    fn ensure<K, S>(
        &self,
        key: ResourceKey,
        dyntype: K::DynamicType,
        events: impl FnOnce() -> (S, Option<retry::RetryState>),
    ) -> Arc<Informer<K>>
    where
        K: Resource + Clone + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    {
        let mut informers = lock(&self.inner.informers);
        if let Some(existing) = informers
            .iter()
            .find(|(existing, _)| *existing == key)
            .and_then(|(_, informer)| informer.clone().into_any().downcast::<Informer<K>>().ok())
        {
            return existing;
        }
        let mut indexes = Indexes::new(dyntype.clone());
        for index in lock(&self.inner.indexes)
            .iter()
            .filter(|index| index.resource == key)
        {
            if let Some(extractor) = index.extractor::<K>() {
                indexes.insert(index.field.clone(), extractor);
            }
        }
        let (events, retries) = events();
        let informer = Informer::spawn(
            self.inner.cluster.clone(),
            dyntype,
            events,
            indexes,
            self.inner.stop.child_token(),
            retries,
        );
        informers.push((key, informer.clone()));
        informer
    }

    /// Registers a field index on this cache, for informers of its resource
    /// that exist now or are created later. Registering a field twice keeps
    /// the first extractor.
    pub fn index_field(&self, index: &FieldIndex) {
        let informers = lock(&self.inner.informers);
        {
            let mut indexes = lock(&self.inner.indexes);
            if indexes
                .iter()
                .any(|known| known.resource == index.resource && known.field == index.field)
            {
                return;
            }
            indexes.push(index.clone());
        }
        for (_, informer) in informers.iter().filter(|(key, _)| *key == index.resource) {
            informer.add_index(index);
        }
    }

    /// Typed objects of `K` in `namespace` (all when `None`), from the cache.
    /// Waits for the informer's first list, at most
    /// [`CacheOptions::sync_wait`] (30 s by default).
    pub async fn list<K>(&self, namespace: Option<&str>) -> Result<Vec<Arc<K>>, Error>
    where
        K: CachedResource,
    {
        let informer = self.informer::<K>();
        self.wait_informer(&*informer, informer.wait_ready())
            .await?;
        Ok(informer.list(namespace))
    }

    /// One typed object from the cache; waits like [`Cache::list`].
    pub async fn get<K>(&self, namespace: Option<&str>, name: &str) -> Result<Option<Arc<K>>, Error>
    where
        K: CachedResource,
    {
        let informer = self.informer::<K>();
        self.wait_informer(&*informer, informer.wait_ready())
            .await?;
        Ok(informer.get(namespace, name))
    }

    /// Typed objects whose indexed `field` has `value`, optionally only in
    /// `namespace`; waits like [`Cache::list`].
    pub async fn by_index<K>(
        &self,
        field: &str,
        value: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<Arc<K>>, Error>
    where
        K: CachedResource,
    {
        let informer = self.informer::<K>();
        self.wait_informer(&*informer, informer.wait_ready())
            .await?;
        Ok(informer.by_index(field, value, namespace))
    }

    async fn wait_informer(
        &self,
        informer: &dyn ErasedInformer,
        ready: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let wait = match &self.inner.backend {
            Backend::Api { options, .. } => options.sync_wait,
            // A view waits as its host's reads do.
            Backend::Scoped { host, .. } => host
                .options()
                .map_or(DEFAULT_SYNC_TIMEOUT, |options| options.sync_wait),
        };
        tokio::time::timeout(wait, ready)
            .await
            .map_err(|_| Error::NotReady {
                name: self.inner.cluster.clone(),
                timeout: wait,
                reason: informer.failure().map_or_else(
                    || multicluster_core::redact::Redacted::new("the informer has not listed yet"),
                    |failure| failure.reason,
                ),
            })
    }

    /// Whether every informer created so far has completed its first list.
    pub fn is_synced(&self) -> bool {
        lock(&self.inner.informers)
            .iter()
            .all(|(_, informer)| informer.is_ready())
    }

    /// Waits until [`Cache::is_synced`], or fails after `timeout` with the last
    /// watch error.
    pub async fn wait_for_sync(&self, timeout: Duration) -> Result<(), Error> {
        if tokio::time::timeout(timeout, self.synced()).await.is_ok() {
            return Ok(());
        }
        let reason = lock(&self.inner.informers)
            .iter()
            .find_map(|(_, informer)| informer.failure())
            .map_or_else(
                || multicluster_core::redact::Redacted::new("informers have not listed yet"),
                |failure| failure.reason,
            );
        Err(Error::NotReady {
            name: self.inner.cluster.clone(),
            timeout,
            reason,
        })
    }

    /// Completes once every informer created so far (including any created
    /// while it waits) has completed its first list.
    pub(crate) async fn synced(&self) {
        loop {
            let ready: Vec<_> = lock(&self.inner.informers)
                .iter()
                .map(|(_, informer)| informer.ready())
                .collect();
            let count = ready.len();
            for mut ready in ready {
                let _ = ready.wait_for(|ready| *ready).await;
            }
            if lock(&self.inner.informers).len() == count {
                return;
            }
        }
    }

    /// The oldest failure among the cache's watches, if any is failing; a
    /// watch that cannot reach the server comes before one the server
    /// refuses.
    pub(crate) fn failure(&self) -> Option<multicluster_core::health::Failure> {
        // A failure lasts until its watch delivers again: every failed
        // watch starts over with a list, whose first result shows it works.
        lock(&self.inner.informers)
            .iter()
            .filter_map(|(_, informer)| informer.failure())
            .min_by_key(|failure| (!failure.unreachable, failure.since))
    }

    /// When the next of its failing watches is tried again, if one is
    /// waiting to be.
    pub(crate) fn next_retry(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        lock(&self.inner.informers)
            .iter()
            .filter_map(|(_, informer)| informer.failure()?.retry_at)
            .filter(|at| *at > now)
            .min()
    }

    /// How the cache's watches are doing: see [`crate::health`].
    pub fn health(&self) -> multicluster_core::health::Health {
        self.failure()
            .map_or(multicluster_core::health::Health::Healthy, |failure| {
                failure.health()
            })
    }

    /// The number of informers (watches) this cache runs.
    pub fn informer_count(&self) -> usize {
        lock(&self.inner.informers).len()
    }

    /// Stops every informer; subscriptions end.
    pub fn stop(&self) {
        self.inner.stop.cancel();
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("cluster", &self.inner.cluster)
            .field("informers", &self.informer_count())
            .finish_non_exhaustive()
    }
}

/// An API for `K` honouring the namespace restriction.
fn restricted_api<K>(
    client: &kube::Client,
    options: &CacheOptions,
    dyntype: &K::DynamicType,
) -> Api<K>
where
    K: Resource<Scope: WatchScope>,
{
    let api = Api::all_with(client.clone(), dyntype);
    match &options.namespace {
        Some(ns) => K::Scope::restrict(api, ns),
        None => api,
    }
}

/// A watch that starts over after failures with its own backoff (see the
/// `retry` module), stripping managed fields when asked, and the record of
/// its retries.
fn watch_events<K>(
    api: Api<K>,
    dyntype: &K::DynamicType,
    options: &CacheOptions,
) -> (
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    retry::RetryState,
)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    let strip = options.strip_managed_fields;
    let resource = resource_id::<K>(dyntype);
    let base = options.watcher_of(&resource).clone();
    let initial_list = InitialList::new(options.streaming_lists, resource);
    let retries = retry::RetryState::default();
    let observed = retries.clone();
    let counted = retries.clone();
    let events = retry::Restarting::new(move || {
        let (config, streaming) = initial_list.config(&base);
        let initial_list = initial_list.clone();
        let counted = counted.clone();
        watcher(api.clone(), config)
            // The watcher has already gone back to listing: waiting first
            // would only delay a normal expiry. From the second in a row
            // it is an error, and waits (see the `retry` module).
            .filter(move |event| std::future::ready(!is_gone(event) || counted.gone() >= 2))
            // A refused streaming list ends this start; the next one,
            // at once, lists.
            .take_while(move |event| {
                std::future::ready(!(streaming && initial_list.refused(event)))
            })
            .boxed()
    })
    .inspect(move |event| observed.observe(event))
    .backoff(retry::WatchRetry::new(options.backoff, retries.clone()))
    .modify(move |obj| {
        if strip {
            obj.managed_fields_mut().clear();
        }
    });
    (events, retries)
}

/// Whether the server ended a watch with `410 Gone`.
fn is_gone<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
    let gone = matches!(event, Err(err) if informer::is_gone(err));
    if gone {
        tracing::debug!("watch expired (410 Gone); listing again");
    }
    gone
}
