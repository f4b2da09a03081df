//! How a provider builds each member cluster: the options of its clients
//! and of its cache, the same for every member or chosen per member from
//! the inventory object it came from (a Secret, a Cluster API `Cluster`, a
//! `ClusterProfile`, a kubeconfig file's context, a kind cluster).
//!
//! Without them every member gets default clients and caches: cluster-wide
//! watches of full objects, which at fleet scale means full lists and
//! cluster-wide RBAC in every member. With them a member's cache can be
//! held to one namespace (so RBAC for that namespace is enough), watch
//! with selectors, page sizes or streaming lists, per type too, keep
//! `managedFields`, and its clients can have their own deadlines and
//! request budget.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kube::runtime::watcher;

use crate::cache::CacheOptions;
use multicluster_client::ClientOptions;

/// The options a member is built with. By default its watches back off
/// up to [`MEMBER_UNREACHABLE_MAX`](crate::cache::MEMBER_UNREACHABLE_MAX)
/// from a server that cannot be reached (a member may be gone for good;
/// the local cluster's watches come back within 2 s).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MemberOptions {
    /// How its clients reach it (deadlines, HTTP/2, credential plugins,
    /// request budget).
    pub client: ClientOptions,
    /// How its cache watches (namespace restriction, watcher settings per
    /// type, `managedFields` stripping, watch backoff).
    pub cache: CacheOptions,
}

impl Default for MemberOptions {
    fn default() -> Self {
        let backoff =
            crate::cache::WatchBackoff::default().max(crate::cache::MEMBER_UNREACHABLE_MAX);
        Self {
            client: ClientOptions::default(),
            cache: CacheOptions::default().backoff(backoff),
        }
    }
}

multicluster_core::option_setters!(MemberOptions {
    client: ClientOptions,
    cache: CacheOptions,
});

/// Every setting counts, each field by name (a field added to the cache
/// options or to kube-runtime's `watcher::Config` fails to compile here
/// until it is hashed too; `ClientOptions` hashes its own the same way),
/// so a member whose options change is built again.
impl Hash for MemberOptions {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.client.hash(state);
        let CacheOptions {
            namespace,
            strip_managed_fields,
            streaming_lists,
            watcher,
            per_resource,
            backoff,
            sync_wait,
        } = &self.cache;
        (
            namespace,
            strip_managed_fields,
            streaming_lists,
            backoff,
            sync_wait,
        )
            .hash(state);
        hash_watcher(watcher, state);
        for (resource, watcher) in per_resource {
            resource.hash(state);
            hash_watcher(watcher, state);
        }
    }
}

fn hash_watcher<H: Hasher>(config: &watcher::Config, state: &mut H) {
    let watcher::Config {
        label_selector,
        field_selector,
        timeout,
        list_semantic,
        initial_list_strategy,
        page_size,
        bookmarks,
    } = config;
    let any = match list_semantic {
        watcher::ListSemantic::MostRecent => false,
        watcher::ListSemantic::Any => true,
    };
    let streaming = match initial_list_strategy {
        watcher::InitialListStrategy::ListWatch => false,
        watcher::InitialListStrategy::StreamingList => true,
    };
    (
        label_selector,
        field_selector,
        timeout,
        any,
        streaming,
        page_size,
        bookmarks,
    )
        .hash(state);
}

impl From<ClientOptions> for MemberOptions {
    fn from(client: ClientOptions) -> Self {
        Self::default().client(client)
    }
}

/// Adjusts a member's options from its inventory object.
type PerMember<I> = dyn Fn(&I, MemberOptions) -> MemberOptions + Send + Sync;

/// The member options of a provider whose inventory objects are `I`: the
/// same options for every member, optionally adjusted per member by a
/// function that sees the member's inventory object. A member is built
/// again when its options change (the function is asked on every change of
/// its object).
pub struct Members<I> {
    every: MemberOptions,
    per_member: Option<Arc<PerMember<I>>>,
}

impl<I> Members<I> {
    /// `every` for every member.
    pub fn new(every: impl Into<MemberOptions>) -> Self {
        Self {
            every: every.into(),
            per_member: None,
        }
    }

    /// Adjusts each member's options with `choose`, given its inventory
    /// object and the options for every member; say, a namespace
    /// restriction read from an annotation.
    #[must_use]
    pub fn per_member(
        mut self,
        choose: impl Fn(&I, MemberOptions) -> MemberOptions + Send + Sync + 'static,
    ) -> Self {
        self.per_member = Some(Arc::new(choose));
        self
    }

    /// The options for every member, before any adjustment.
    pub fn every(&self) -> &MemberOptions {
        &self.every
    }

    /// The options of the member built from `object`.
    pub fn for_member(&self, object: &I) -> MemberOptions {
        match &self.per_member {
            Some(choose) => choose(object, self.every.clone()),
            None => self.every.clone(),
        }
    }
}

impl<I> Default for Members<I> {
    fn default() -> Self {
        Self::new(MemberOptions::default())
    }
}

impl<I> Clone for Members<I> {
    fn clone(&self) -> Self {
        Self {
            every: self.every.clone(),
            per_member: self.per_member.clone(),
        }
    }
}

impl<I> fmt::Debug for Members<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Members")
            .field("every", &self.every)
            .field("per_member", &self.per_member.is_some())
            .finish()
    }
}

impl<I> From<MemberOptions> for Members<I> {
    fn from(every: MemberOptions) -> Self {
        Self::new(every)
    }
}

impl<I> From<ClientOptions> for Members<I> {
    fn from(client: ClientOptions) -> Self {
        Self::new(client)
    }
}

impl<I> From<CacheOptions> for Members<I> {
    fn from(cache: CacheOptions) -> Self {
        Self::new(MemberOptions::default().cache(cache))
    }
}
