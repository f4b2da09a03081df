//! Hub to members as a library facility: a [`Propagation`] keeps the
//! objects a hub object asks for applied in a set of members, and reports
//! on the hub object how each member is doing.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
//! # use multicluster_propagation::{Desired, Propagation};
//! # fn quota_for(hub: &ConfigMap) -> ResourceQuota { ResourceQuota::default() }
//! # fn demo(manager: &multicluster_runtime::Manager) -> Result<(), multicluster_runtime::Error> {
//! // Every hub ConfigMap labelled `fleet.example/quota=true` becomes a
//! // ResourceQuota in every member; its status goes to an annotation.
//! let quotas = Propagation::<ConfigMap>::new("fleet-quota")
//!     .select(|hub| hub.metadata.labels.as_ref()
//!         .is_some_and(|labels| labels.get("fleet.example/quota").is_some_and(|v| v == "true")))
//!     .propagates::<ResourceQuota>()
//!     .desired(|hub, _member| Ok(vec![Desired::new(&quota_for(hub))?]))
//!     .status_annotation("fleet.example/propagation")
//!     .build()?;
//! manager.add_controller(quotas)?;
//! # Ok(()) }
//! ```
//!
//! What it does, per hub object and member:
//!
//! - **Applies** the desired objects with server-side apply under the
//!   propagation's name as field manager, labelled
//!   [`PROPAGATION_LABEL`]`=<name>` and pointing at the hub object with
//!   [`Request::owner_annotations`].
//!   An object that is no longer desired is deleted.
//! - **Letting go**: what a member no longer gets (the hub object deleted,
//!   the member out of the selection, an object no longer desired) is
//!   deleted or orphaned ([`DeletionPolicy`]: by
//!   [`Propagation::when_hub_deleted`], [`Propagation::when_member_leaves`],
//!   or an object's [`DELETION_POLICY_ANNOTATION`]), the latest wave first.
//! - **In waves** (see `waves`: Namespaces and definitions, then RBAC,
//!   then configuration, then the rest; [`WAVE_ANNOTATION`] places an
//!   object elsewhere): each wave once every object of the one before is
//!   available, so the order `desired` lists them in does not matter. A
//!   wave waiting is `Progressing`, never `Failed`.
//! - **Health**: whether each applied object works ([`Health`]: built-in
//!   rules for Deployments, StatefulSets, DaemonSets, Jobs, definitions,
//!   Namespaces, claims, and anything with a `Ready` or `Available`
//!   condition; [`Propagation::health`] for a type of yours). A member is
//!   `InSync` only once everything is available.
//! - **Drift**: the member watch of each propagated type (metadata only)
//!   sees a change made in a member; by [`Drift`], the object is applied
//!   again (taking its fields back) or reported `Drifted` and left alone.
//! - **Apply modes** ([`ApplyMode`]): applied (the default), created once
//!   and left alone, or only compared by a server-side dry run (nothing
//!   written); fields to leave to others ([`Propagation::ignore_fields`]).
//! - **Conflicts**: an object the propagation did not make, holding a
//!   field it would set under another field manager, is reported
//!   `Conflict` or taken over, by [`Conflicts`].
//! - **Selection**: every engaged member, or those a function chooses (a
//!   placement decision, [`Propagation::members_chosen_by`]), accepts
//!   ([`Propagation::members_matching`]) or whose labels match
//!   ([`Propagation::members_labelled`]). A member that leaves the
//!   selection loses the objects after [`Propagation::removal_grace`]
//!   (a move between two decision slices is no deletion); one that comes
//!   back within it keeps them.
//! - **Rollout**: a new revision of the hub object reaches every selected
//!   member at once, or paced ([`Propagation::rollout`]: a few members
//!   at a time, stage after stage, with approvals, a failure budget and a
//!   pause), its state kept on the hub object so that restarts and
//!   several controllers keep the bound.
//! - **The hub object** holds a finalizer until every engaged member is
//!   cleaned up; its status says, per member, `InSync`, `Progressing`,
//!   `Drifted`, `Conflict`, `Degraded`, `Failed` (with a short redacted
//!   reason), `Pending` or `NotEngaged`, and a `Propagated` condition sums
//!   up. Writes are
//!   coalesced: members changing together cause about one write a
//!   second. A member that fails is told in a Warning Event on the hub
//!   object, where its owner looks, never in the member.
//!
//! **Replicas**: one, several under leader election, or several sharing
//! the fleet (a sharded coordinator): every replica then watches the hub
//! and works on its own members, and the replicas share what the others
//! need through the hub object (each one's members in the status, with
//! its counts in `countsByReplica`; each one's rollout facts in the
//! rollout's record; [`CLEANED_ANNOTATION`] before the finalizer goes),
//! every write with the object's `resourceVersion` as a precondition.
//!
//! Nothing else is watched in the members: in particular not the hub
//! type, so a member whose RBAC allows only the propagated types (`get`,
//! `list`, `watch`, `create`, `patch`, `delete`: server-side apply of an
//! object that does not exist yet needs `create`) is served fully and never
//! turned `degraded` by the propagation.

mod apply_modes;
mod applying;
mod builder;
mod digest;
mod events;
mod gates;
mod health;
mod history;
mod hub;
mod kinds;
mod letting_go;
mod maintenance;
mod member;
mod metrics;
mod outcomes;
mod owners;
mod paced;
mod per_hub;
mod record;
mod rolling_back;
mod rollout;
mod schema;
mod sources;
mod status;
mod step;
mod waves;
mod windows;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::api::{ApiResource, DynamicObject};
use kube::core::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;

use kinds::Kind;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{
    Controller, ControllerBuilder, MapContext, ReconcileError, Request,
};
use outcomes::Outcomes;
use status::Outcome;

/// Locks `mutex`, carrying on if a holder panicked (the data is as it was
/// left; the panic is reported where it happened).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
pub use apply_modes::ApplyMode;
pub use builder::Propagation;
pub use gates::{GATE_JOB_ENV, Gate, GateCheck};
pub use health::Health;
pub use history::CLUSTER_SCOPED_HISTORY_NAMESPACE;
pub use hub::CLEANED_ANNOTATION;
pub use letting_go::{DELETION_POLICY_ANNOTATION, DeletionPolicy};
pub use maintenance::MAINTENANCE_LABEL;
pub use rollout::{
    APPROVAL_ANNOTATION, MaxUnavailable, OnFailure, PAUSE_ANNOTATION, REVISION_ANNOTATION,
    ROLL_BACK_ANNOTATION, Rollout, Stage, revision_of,
};
pub use schema::{
    GateState, GateStatus, MemberStatus, PropagationStatus, ReplicaMembers, RollingBack,
    RolloutStatus, UpdatingMember,
};
pub use status::{CONDITION_TYPE, MemberState};
pub use waves::WAVE_ANNOTATION;
pub use windows::{WINDOWS_ANNOTATION, Window, WindowError};

/// The label on every object a propagation makes: the propagation's name.
pub const PROPAGATION_LABEL: &str = "mcr.sigs.k8s.io/propagation";

/// How long a member that left the selection keeps its objects by default.
pub(crate) const DEFAULT_REMOVAL_GRACE: Duration = Duration::from_secs(5);

/// How long member outcomes gather before the hub object's status is
/// written.
const STATUS_COALESCE: Duration = Duration::from_secs(1);

/// An object a hub object wants in a member.
#[derive(Clone, Debug)]
pub struct Desired {
    resource: ApiResource,
    object: serde_json::Value,
}

impl Desired {
    /// A typed object (its `metadata.name` set; `metadata.namespace` for a
    /// namespaced type). Its type must be registered with
    /// [`Propagation::propagates`].
    pub fn new<T>(object: &T) -> Result<Self, serde_json::Error>
    where
        T: Resource<DynamicType = ()> + Serialize,
    {
        Self::from_value(ApiResource::erase::<T>(&()), serde_json::to_value(object)?)
    }

    /// An object of a type known at run time.
    pub fn dynamic(
        resource: ApiResource,
        object: &DynamicObject,
    ) -> Result<Self, serde_json::Error> {
        Self::from_value(resource, serde_json::to_value(object)?)
    }

    fn from_value(
        resource: ApiResource,
        mut object: serde_json::Value,
    ) -> Result<Self, serde_json::Error> {
        object["apiVersion"] = resource.api_version.clone().into();
        object["kind"] = resource.kind.clone().into();
        // What the server keeps for itself, had the caller copied it from
        // another object.
        if let Some(metadata) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            for field in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "managedFields",
                "generation",
                "deletionTimestamp",
                "selfLink",
            ] {
                metadata.remove(field);
            }
        }
        Ok(Self { resource, object })
    }

    fn name(&self) -> Option<&str> {
        self.object
            .pointer("/metadata/name")?
            .as_str()
            .filter(|name| !name.is_empty())
    }

    fn namespace(&self) -> Option<&str> {
        self.object
            .pointer("/metadata/namespace")?
            .as_str()
            .filter(|ns| !ns.is_empty())
    }
}

/// Names the members a hub object's objects go to.
type Choose<K> = Arc<dyn Fn(&K) -> Vec<ClusterName> + Send + Sync>;

/// Accepts a member for a hub object.
type Accept<K> = Arc<dyn Fn(&K, &Cluster) -> bool + Send + Sync>;

/// Which members a hub object's objects go to.
enum Members<K> {
    /// Every engaged member.
    All,
    /// The members this function names for the hub object.
    Chosen(Choose<K>),
    /// The engaged members this function accepts for the hub object.
    Matching(Accept<K>),
}

impl<K> Clone for Members<K> {
    fn clone(&self) -> Self {
        match self {
            Members::All => Members::All,
            Members::Chosen(choose) => Members::Chosen(choose.clone()),
            Members::Matching(accept) => Members::Matching(accept.clone()),
        }
    }
}

impl<K> Members<K> {
    fn includes(&self, hub: &K, name: &ClusterName, cluster: &Cluster) -> bool {
        match self {
            Members::All => true,
            Members::Chosen(choose) => choose(hub).contains(name),
            Members::Matching(accept) => accept(hub, cluster),
        }
    }
}

/// What to do about a change made in a member to a field the propagation
/// manages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Drift {
    /// Apply the object again, taking the field back (the default).
    #[default]
    Repair,
    /// Leave it, and report the member `Drifted` with the server's words
    /// (the fields and the manager that changed them), until the drift is
    /// undone. The propagation's own changes (a new hub object) are not
    /// applied meanwhile where they touch a drifted field.
    Report,
}

/// What to do about an object the propagation did not make that holds a
/// field it would set, owned by another field manager.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Conflicts {
    /// Leave it, and report the member `Conflict` with the server's words
    /// (the default).
    #[default]
    Report,
    /// Apply with force: the fields become the propagation's.
    TakeOver,
    /// Take over only an object that applying would not change (a server
    /// -side dry run says so): an object made by hand as desired is
    /// adopted, one that differs is reported `Conflict` with the fields
    /// that differ.
    TakeOverWhenEqual,
}

/// Where a hub object's status goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum StatusTarget {
    /// Nowhere.
    #[default]
    None,
    /// The hub type's status subresource (a `CustomResource` with
    /// `status`): `status.members` (a list of `cluster`, `state`,
    /// `reason`, `appliedGeneration`) and a condition of type
    /// [`CONDITION_TYPE`] in `status.conditions`, by server-side apply
    /// under `<name>-status`. The CRD's schema must allow those fields.
    Subresource,
    /// An annotation of the hub object holding the same as JSON
    /// (`{"members": [...], "condition": {...}}`), for types without a
    /// status of their own.
    Annotation(String),
}

impl StatusTarget {
    /// The annotation holding a paced rollout's state, in annotation mode.
    fn rollout_annotation(&self) -> Option<String> {
        match self {
            StatusTarget::Annotation(key) => Some(format!("{key}-rollout")),
            _ => None,
        }
    }
}

type DesiredFn<K> = Arc<dyn Fn(&K, &Cluster) -> Result<Vec<Desired>, ReconcileError> + Send + Sync>;
type Configure = Box<dyn FnOnce(ControllerBuilder) -> ControllerBuilder + Send>;
type Report = Arc<dyn Fn(&DynamicObject) -> Option<serde_json::Value> + Send + Sync>;
type Concerns = Arc<dyn Fn(&MapContext<'_>, &DynamicObject) -> Vec<Request> + Send + Sync>;

/// A hub object's namespace and name.
type HubKey = (Option<String>, String);

/// What every reconcile of one propagation shares.
struct Shared<K> {
    name: String,
    finalizer: String,
    status_manager: String,
    select: Arc<dyn Fn(&K) -> bool + Send + Sync>,
    desired: DesiredFn<K>,
    kinds: Vec<Kind>,
    members: Members<K>,
    drift: Drift,
    conflicts: Conflicts,
    removal_grace: Duration,
    status: StatusTarget,
    events: bool,
    report: Option<Report>,
    /// The users' health rules, by type.
    health: Vec<(ApiResource, health::Rule)>,
    /// A paced rollout's settings and what this process knows of it.
    rollouts: paced::Rollouts<K>,
    /// What becomes of the members' objects when the hub object goes
    /// (`when_hub_deleted`, or per hub object `when_hub_deleted_by`).
    when_hub_deleted: per_hub::PerHub<K, DeletionPolicy>,
    when_member_leaves: DeletionPolicy,
    mode: ApplyMode,
    /// JSON pointers taken out of every desired object.
    ignored_fields: Vec<String>,
    /// Registered in the manager's registry at the first use (see
    /// [`Shared::metrics`]).
    metrics: OnceLock<metrics::PropagationMetrics>,
    /// Each hub object's members and how they are doing (change it with
    /// [`Shared::change_outcomes`], which keeps the gauge current).
    outcomes: Mutex<Outcomes>,
    /// When each hub object's status was last written.
    status_written: Mutex<HashMap<HubKey, Instant>>,
    /// Since when a member has been out of a hub object's selection.
    leaving: Mutex<HashMap<(HubKey, ClusterName), Instant>>,
    /// Whether the hub refused an Event already (warned once).
    events_refused: AtomicBool,
    controller: OnceLock<Controller>,
}

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    /// The hub object a member object was made for by this propagation.
    fn hub_of(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Option<HubKey> {
        kinds::hub_of(&self.name, meta)
    }

    /// Whether `hub` is anything to this propagation: selected, or holding
    /// its finalizer (selected once, its members maybe not clean yet), or
    /// with members on record. Other objects of the hub type (most, often)
    /// cause no member request.
    fn concerns(&self, hub: &K) -> bool {
        (self.select)(hub)
            || hub
                .meta()
                .finalizers
                .as_ref()
                .is_some_and(|finalizers| finalizers.contains(&self.finalizer))
            || crate::lock(&self.outcomes).has_hub(&key_of(hub))
    }

    /// The member requests for `hub`: every engaged member (selection is
    /// decided by each member's reconcile), and the members it has an
    /// outcome in.
    fn member_requests(&self, engaged: Vec<ClusterName>, key: &HubKey) -> Vec<Request> {
        let mut members: Vec<ClusterName> = engaged
            .into_iter()
            .filter(|name| !name.is_local())
            .collect();
        if let Some(outcomes) = crate::lock(&self.outcomes).members(key) {
            members.extend(outcomes.keys().cloned());
        }
        members.sort();
        members.dedup();
        members
            .into_iter()
            .map(|member| Request::new(member, key.0.as_deref(), key.1.as_str()))
            .collect()
    }

    /// The propagation's metrics, in the registry its controller records
    /// in (the manager's, once added to one: this is asked from
    /// reconciles only).
    fn metrics(&self) -> Option<&metrics::PropagationMetrics> {
        if let Some(metrics) = self.metrics.get() {
            return Some(metrics);
        }
        let controller = self.controller.get()?;
        Some(self.metrics.get_or_init(|| {
            metrics::PropagationMetrics::register(&self.name, &controller.metrics())
        }))
    }

    /// Changes the members' outcomes by `change`, and the members gauge
    /// with them.
    fn change_outcomes<T>(&self, change: impl FnOnce(&mut Outcomes) -> T) -> T {
        let mut outcomes = crate::lock(&self.outcomes);
        let changed = change(&mut outcomes);
        if let Some(metrics) = self.metrics() {
            metrics.members_now(outcomes.counts());
        }
        changed
    }

    /// Records `outcome` for `member` of `key`, and has the hub object's
    /// status written soon (once for many members).
    fn record(&self, key: &HubKey, member: &ClusterName, outcome: Option<Outcome>) {
        self.change_outcomes(|outcomes| match outcome {
            Some(outcome) => outcomes.set(key, member, outcome),
            None => outcomes.remove(key, member),
        });
        if let Some(controller) = self.controller.get() {
            controller.enqueue_after(
                Request::new(ClusterName::local(), key.0.as_deref(), key.1.as_str()),
                STATUS_COALESCE,
            );
        }
    }
}

/// The key of a hub object.
fn key_of<K: Resource>(hub: &K) -> HubKey {
    (
        hub.meta().namespace.clone(),
        hub.meta().name.clone().unwrap_or_default(),
    )
}
