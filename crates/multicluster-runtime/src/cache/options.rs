//! How a cache watches: its namespace restriction, watcher settings (per
//! resource too), and how a failed watch is retried.

use std::time::Duration;

use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher;

/// How a cache watches.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CacheOptions {
    /// Watch only this namespace (namespaced resources); `None` watches all.
    /// Lets an instance run with RBAC for one namespace.
    pub namespace: Option<String>,
    /// Drop `metadata.managedFields` before storing objects (default true):
    /// it is often the largest part of an object and controllers rarely
    /// read it.
    pub strip_managed_fields: bool,
    /// Fill each watch from a streaming list (default true): one watch
    /// that starts with the current objects and a bookmark marking their
    /// end (`sendInitialEvents`, served by Kubernetes 1.32 and later and
    /// used by client-go's informers since 1.35), instead of a LIST
    /// followed by a watch. One request less per watch, also when a watch
    /// starts over, and no whole list held in memory at once. A watch
    /// whose server refuses it (the `WatchList` feature off, as in 1.27 to
    /// 1.31, or older servers; an aggregated API that does not serve it)
    /// lists and watches instead from then on, without waiting. The
    /// watcher settings' `page_size` and `list_semantic` apply to LISTs
    /// only. `false` leaves the choice to [`CacheOptions::watcher`]'s
    /// `initial_list_strategy`, as kube-runtime's watcher has it.
    pub streaming_lists: bool,
    /// Watcher settings (label/field selectors, page size, ...), applied to
    /// every watch of the cache without its own in `per_resource`.
    pub watcher: watcher::Config,
    /// Watcher settings of particular resources, by `group/version/plural`
    /// (controller-runtime's `ByObject`); fill it with
    /// [`CacheOptions::watcher_for`] and
    /// [`CacheOptions::watcher_for_resource`].
    pub per_resource: Vec<(String, watcher::Config)>,
    /// How a failed watch is retried.
    pub backoff: WatchBackoff,
    /// How long a read through the cache ([`super::Cache::list`], `get`,
    /// `by_index`) waits for its informer's first list before it fails
    /// with [`crate::Error::NotReady`] (default
    /// `DEFAULT_SYNC_TIMEOUT`, 30 s). A reconcile that reads a
    /// member whose watch cannot list holds its slot this long at most.
    pub sync_wait: std::time::Duration,
}

multicluster_core::option_setters!(CacheOptions {
    namespace: impl Into<Option<String>>,
    strip_managed_fields: bool,
    streaming_lists: bool,
    watcher: watcher::Config,
    backoff: WatchBackoff,
    sync_wait: std::time::Duration,
});

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            strip_managed_fields: true,
            streaming_lists: true,
            watcher: watcher::Config::default(),
            per_resource: Vec::new(),
            backoff: WatchBackoff::default(),
            sync_wait: super::DEFAULT_SYNC_TIMEOUT,
        }
    }
}

impl CacheOptions {
    /// Watches `K` with `config` instead of [`CacheOptions::watcher`]: a
    /// label selector for one type only, say.
    #[must_use]
    pub fn watcher_for<K: Resource<DynamicType = ()>>(self, config: watcher::Config) -> Self {
        self.with_override(resource_id::<K>(&()), config)
    }

    /// Like [`CacheOptions::watcher_for`], for a resource known at run time.
    #[must_use]
    pub fn watcher_for_resource(self, resource: &ApiResource, config: watcher::Config) -> Self {
        self.with_override(resource_id::<DynamicObject>(resource), config)
    }

    fn with_override(mut self, id: String, config: watcher::Config) -> Self {
        self.per_resource.retain(|(known, _)| *known != id);
        self.per_resource.push((id, config));
        self
    }

    /// The watcher settings of the resource `id` (`group/version/plural`).
    pub(super) fn watcher_of(&self, id: &str) -> &watcher::Config {
        self.per_resource
            .iter()
            .find(|(known, _)| known == id)
            .map_or(&self.watcher, |(_, config)| config)
    }
}

/// How an informer retries a watch that failed. The delay doubles while
/// failures of one kind go on, each stretched by up to 100 % at random so
/// that many clusters do not retry in step, and starts over only once the
/// watch delivers again (see the `retry` module's notes). A watch that the
/// server ends with `410 Gone` (its resource version is too old) is listed
/// again at once, without a delay; from the second in a row (no change
/// delivered between them, less than a minute apart) it waits as after a
/// refusal, and from the third the cluster is degraded naming the 410s
/// until a watch delivers a change.
///
/// - A server that cannot be reached (connection refused or reset, TLS
///   failure, no answer in time) is tried again from `initial` (250 ms) up
///   to `max` (1 s; 2 s with the random part), so a server back from an
///   outage of any length is seen again within about 2 s: right for the
///   local cluster, whose outage stops everything. The members providers
///   build ([`MemberOptions`](crate::provider::member::MemberOptions)'s
///   default) go up to [`MEMBER_UNREACHABLE_MAX`] instead: a member gone for
///   good is then tried about 6 times a minute rather than 40, and one back
///   is seen within 16 s.
/// - A server that refuses the watch (403 after lost RBAC, 404 for a CRD
///   that is not installed) is asked again from `refused_initial` (1 s) up
///   to `refused_max` (30 s; 60 s with the random part): at most 8 lists
///   in the first minute, and 1 to 2 a minute after that, where
///   kube-runtime's own backoff (which takes the start of every list for a
///   success) kept asking twice a second.
///
/// Fields may be added: start from `WatchBackoff::default()` and use the
/// setters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct WatchBackoff {
    /// The first delay after a failure to reach the server.
    pub initial: Duration,
    /// The longest delay after failures to reach the server, before the
    /// random part.
    pub max: Duration,
    /// The first delay after the server refused the watch.
    pub refused_initial: Duration,
    /// The longest delay after refusals, before the random part.
    pub refused_max: Duration,
    /// How a server unreachable for long is tried less often (default:
    /// after 10 minutes, up to every 5, before the random part).
    pub long_outage: LongOutage,
}

multicluster_core::option_setters!(WatchBackoff {
    initial: Duration,
    max: Duration,
    refused_initial: Duration,
    refused_max: Duration,
    long_outage: LongOutage,
});

/// A server unreachable for long is tried less often: once it has been
/// unreachable for `after` (default 10 min), the delays between attempts
/// grow on from the short-outage cap, doubling, up to `max` (default 5
/// min). A member gone for good then costs a request every few minutes
/// per watch, not six a minute; one back after a short outage is still
/// seen within seconds, and one back after a long one at its next
/// attempt, which `/clusters` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LongOutage {
    /// How long a server must have been unreachable.
    pub after: Duration,
    /// The longest delay then.
    pub max: Duration,
}

multicluster_core::option_setters!(LongOutage {
    after: Duration,
    max: Duration,
});

impl Default for LongOutage {
    fn default() -> Self {
        Self {
            after: Duration::from_secs(600),
            max: Duration::from_secs(300),
        }
    }
}

impl LongOutage {
    /// Whether a server unreachable for `unreachable_for` is in a long
    /// outage.
    pub fn reached(&self, unreachable_for: Duration) -> bool {
        unreachable_for >= self.after
    }

    /// The longest delay for a server unreachable for `unreachable_for`,
    /// whose short-outage cap is `short`.
    pub fn cap(&self, unreachable_for: Duration, short: Duration) -> Duration {
        if self.reached(unreachable_for) {
            self.max.max(short)
        } else {
            short
        }
    }
}

/// The longest delay before a member's watch tries an unreachable server
/// again, before the random part (see [`WatchBackoff`]).
pub const MEMBER_UNREACHABLE_MAX: Duration = Duration::from_secs(8);

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(250),
            max: Duration::from_secs(1),
            refused_initial: Duration::from_secs(1),
            refused_max: Duration::from_secs(30),
            long_outage: LongOutage::default(),
        }
    }
}

impl WatchBackoff {
    /// The delays for a watch of our own that is not an informer's (the
    /// Lease watch of leader election): those of a server that cannot be
    /// reached.
    pub fn strategy(self) -> watcher::ExponentialBackoff {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.initial)
            .with_max_delay(self.max.max(self.initial))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .into()
    }
}

/// The `group/version/plural` of a resource, as [`CacheOptions::per_resource`]
/// names it.
pub(super) fn resource_id<K: Resource>(dyntype: &K::DynamicType) -> String {
    format!(
        "{}/{}/{}",
        K::group(dyntype),
        K::version(dyntype),
        K::plural(dyntype)
    )
}
