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
//! Nothing else is watched in the members: in particular not the hub
//! type, so a member whose RBAC allows only the propagated types (`get`,
//! `list`, `watch`, `create`, `patch`, `delete`: server-side apply of an
//! object that does not exist yet needs `create`) is served fully and never
//! turned `degraded` by the propagation.

mod apply_modes;
mod health;
mod hub;
mod kinds;
mod letting_go;
mod member;
mod metrics;
mod paced;
mod rollout;
mod schema;
mod status;
mod waves;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::core::{Resource, Selector, SelectorExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use kinds::Kind;
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::Error;
use multicluster_runtime::cache::{CacheEvent, CachedResource};
use multicluster_runtime::controller::{
    Action, ClusterScope, Controller, ControllerBuilder, MapContext, ReconcileError, Request,
    Watch, filters, map,
};
use status::Outcome;

/// Locks `mutex`, carrying on if a holder panicked (the data is as it was
/// left; the panic is reported where it happened).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
pub use apply_modes::ApplyMode;
pub use health::Health;
pub use letting_go::{DELETION_POLICY_ANNOTATION, DeletionPolicy};
pub use rollout::{
    APPROVAL_ANNOTATION, MaxUnavailable, PAUSE_ANNOTATION, REVISION_ANNOTATION, Rollout, Stage,
};
pub use schema::{MemberStatus, PropagationStatus, RolloutStatus, UpdatingMember};
pub use status::{CONDITION_TYPE, MemberState};
pub use waves::WAVE_ANNOTATION;

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
/// Whether a hub object's rollout is paused.
type Pause<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;
/// Whether a stage (by name) is approved for a revision of a hub object.
type Approve<K> = Arc<dyn Fn(&K, &str, &str) -> bool + Send + Sync>;

/// Keeps what hub objects of type `K` (in the local cluster) ask for
/// applied in members, and reports back on them. Built like a controller;
/// [`Propagation::build`] gives the [`Controller`] to add to a manager.
pub struct Propagation<K> {
    name: String,
    select: Arc<dyn Fn(&K) -> bool + Send + Sync>,
    desired: Option<DesiredFn<K>>,
    kinds: Vec<Kind>,
    members: Members<K>,
    drift: Drift,
    conflicts: Conflicts,
    removal_grace: Duration,
    status: StatusTarget,
    events: bool,
    report: Option<Report>,
    health: Vec<(ApiResource, health::Rule)>,
    reselect: Vec<(ApiResource, Concerns)>,
    configure: Vec<Configure>,
    rollout: Rollout,
    pause: Option<Pause<K>>,
    approve: Option<Approve<K>>,
    when_hub_deleted: DeletionPolicy,
    when_member_leaves: DeletionPolicy,
    mode: ApplyMode,
    ignored_fields: Vec<String>,
}

impl<K> Propagation<K>
where
    K: CachedResource + Serialize,
{
    /// A propagation named `name`: the field manager of what it applies,
    /// the value of [`PROPAGATION_LABEL`] on it, the controller's name and
    /// the Event reporter. A valid label value (at most 63 characters).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            select: Arc::new(|_| true),
            desired: None,
            kinds: Vec::new(),
            members: Members::All,
            drift: Drift::default(),
            conflicts: Conflicts::default(),
            removal_grace: DEFAULT_REMOVAL_GRACE,
            status: StatusTarget::None,
            events: true,
            report: None,
            health: Vec::new(),
            reselect: Vec::new(),
            configure: Vec::new(),
            rollout: Rollout::default(),
            pause: None,
            approve: None,
            when_hub_deleted: DeletionPolicy::Delete,
            when_member_leaves: DeletionPolicy::Delete,
            mode: ApplyMode::Apply,
            ignored_fields: Vec::new(),
        }
    }

    /// Propagates only the hub objects `select` accepts (default: all).
    /// An object that stops being selected is removed from the members and
    /// its finalizer released.
    #[must_use]
    pub fn select(mut self, select: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.select = Arc::new(select);
        self
    }

    /// The objects the hub object wants in a member. An error fails that
    /// member (`Failed`, retried with backoff).
    #[must_use]
    pub fn desired(
        mut self,
        desired: impl Fn(&K, &Cluster) -> Result<Vec<Desired>, ReconcileError> + Send + Sync + 'static,
    ) -> Self {
        self.desired = Some(Arc::new(desired));
        self
    }

    /// Registers a type the desired objects may have: it is watched in
    /// every member, metadata only (RBAC: `list` and `watch` besides the
    /// `get`, `create`, `patch` and `delete` of applying and removing).
    #[must_use]
    pub fn propagates<T>(mut self) -> Self
    where
        T: CachedResource,
        PartialObjectMeta<T>: CachedResource,
    {
        self.kinds.push(Kind::of::<T>());
        self
    }

    /// Propagates only to the members `choose` names for the hub object
    /// (default: every engaged member): a placement decision, such as
    /// `Placements::clusters`. A named cluster that is not engaged is
    /// reported `NotEngaged`. When what `choose` reads changes without a
    /// hub event (a decision slice), name it with
    /// [`Propagation::reselect_on`].
    #[must_use]
    pub fn members_chosen_by(
        mut self,
        choose: impl Fn(&K) -> Vec<ClusterName> + Send + Sync + 'static,
    ) -> Self {
        self.members = Members::Chosen(Arc::new(choose));
        self
    }

    /// Propagates only to the engaged members `accept` takes for the hub
    /// object (default: every engaged member), asked again when a member's
    /// labels change.
    #[must_use]
    pub fn members_matching(
        mut self,
        accept: impl Fn(&K, &Cluster) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.members = Members::Matching(Arc::new(accept));
        self
    }

    /// Propagates only to the engaged members whose cluster labels
    /// ([`Cluster::labels`]) `selector` matches (default: every engaged
    /// member); a member whose labels change is decided again.
    #[must_use]
    pub fn members_labelled(self, selector: Selector) -> Self {
        self.members_matching(move |_, cluster| selector.matches(&cluster.labels()))
    }

    /// Propagates only to the engaged members whose cluster labels match
    /// the label selector `selector` reads from the hub object (a
    /// placement's `clusterSelector`, say); an empty selector takes every
    /// member, one the API would refuse (an unknown operator) takes none.
    /// A member whose labels change is decided again.
    #[must_use]
    pub fn members_selected_by(
        self,
        selector: impl Fn(&K) -> &LabelSelector + Send + Sync + 'static,
    ) -> Self {
        self.members_matching(move |hub, cluster| {
            Selector::try_from(selector(hub).clone())
                .is_ok_and(|selector| selector.matches(&cluster.labels()))
        })
    }

    /// What to do about drift (default: repair).
    #[must_use]
    pub fn drift(mut self, drift: Drift) -> Self {
        self.drift = drift;
        self
    }

    /// What to do about conflicts with other field managers (default:
    /// report).
    #[must_use]
    pub fn conflicts(mut self, conflicts: Conflicts) -> Self {
        self.conflicts = conflicts;
        self
    }

    /// How long a member that left the selection keeps the objects
    /// (default `DEFAULT_REMOVAL_GRACE`; zero removes them at once).
    /// Deleting the hub object removes them at once.
    #[must_use]
    pub fn removal_grace(mut self, grace: Duration) -> Self {
        self.removal_grace = grace;
        self
    }

    /// Writes the members' status to the hub type's status subresource
    /// (a `CustomResource` with `status`): `status.members` (a list of
    /// `cluster`, `state`, `reason`, `appliedGeneration`) and a condition of
    /// type [`CONDITION_TYPE`] in `status.conditions`, by server-side apply
    /// under `<name>-status`. The CRD's schema must allow those fields.
    #[must_use]
    pub fn status_subresource(mut self) -> Self {
        self.status = StatusTarget::Subresource;
        self
    }

    /// Writes the members' status to the annotation `key` of the hub
    /// object, as JSON (`{"members": [...], "condition": {...}}`): for
    /// types without a status of their own.
    #[must_use]
    pub fn status_annotation(mut self, key: impl Into<String>) -> Self {
        self.status = StatusTarget::Annotation(key.into());
        self
    }

    /// Reports a part of each applied object back to the hub object (as
    /// Karmada's `AggregateStatus`): `report` gets the object as the
    /// member's API server returned it from the apply (its status
    /// included), and what it returns is written under the member's
    /// `reported`, by object (`<Kind> <namespace>/<name>`). The members'
    /// watch sees their objects' status change, so it is kept current. A
    /// status subresource's schema must allow `reported` (for example
    /// `x-kubernetes-preserve-unknown-fields`).
    #[must_use]
    pub fn report(
        mut self,
        report: impl Fn(&DynamicObject) -> Option<serde_json::Value> + Send + Sync + 'static,
    ) -> Self {
        self.report = Some(Arc::new(report));
        self
    }

    /// How an applied object of type `T` is doing, instead of the built-in
    /// rule for its type (see [`Health`]): `rule` gets the object as the
    /// member's API server answered the apply, status included, and again
    /// whenever the member's watch sees it change. A member is `InSync`
    /// once every object is [`Health::Available`]; until then
    /// `Progressing`, or `Degraded` if one says so.
    #[must_use]
    pub fn health<T>(mut self, rule: impl Fn(&T) -> Health + Send + Sync + 'static) -> Self
    where
        T: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let resource = ApiResource::erase::<T>(&());
        let kind = resource.kind.clone();
        let rule: health::Rule =
            Arc::new(move |object: &DynamicObject| {
                match serde_json::to_value(object).and_then(serde_json::from_value::<T>) {
                    Ok(typed) => rule(&typed),
                    Err(err) => {
                        Health::Degraded(format!("the member's {kind} could not be read: {err}"))
                    }
                }
            });
        self.health
            .retain(|(known, _)| known.group != resource.group || known.kind != resource.kind);
        self.health.push((resource, rule));
        self
    }

    /// How the desired objects are brought to the members (default:
    /// [`ApplyMode::Apply`]).
    #[must_use]
    pub fn apply_mode(mut self, mode: ApplyMode) -> Self {
        self.mode = mode;
        self
    }

    /// Fields the propagation leaves to others, as JSON pointers into the
    /// desired objects (`/spec/replicas` under an autoscaler): taken out
    /// of what is applied, so they are neither set nor owned, and a
    /// change there is no drift.
    #[must_use]
    pub fn ignore_fields(mut self, pointers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.ignored_fields
            .extend(pointers.into_iter().map(Into::into));
        self
    }

    /// What becomes of the members' objects when the hub object is
    /// deleted or no longer selected (default: deleted). Orphaned objects
    /// stay, with nothing of the propagation left on them. An object's
    /// [`DELETION_POLICY_ANNOTATION`] overrides it.
    #[must_use]
    pub fn when_hub_deleted(mut self, policy: DeletionPolicy) -> Self {
        self.when_hub_deleted = policy;
        self
    }

    /// What becomes of a member's objects when it leaves the hub object's
    /// selection, once the removal grace has passed (default: deleted).
    /// An object's [`DELETION_POLICY_ANNOTATION`] overrides it.
    #[must_use]
    pub fn when_member_leaves(mut self, policy: DeletionPolicy) -> Self {
        self.when_member_leaves = policy;
        self
    }

    /// How a new revision of a hub object reaches its members (default:
    /// [`Rollout::all_at_once`]). A paced rollout keeps its state on the
    /// hub object, so it needs a status target
    /// ([`Propagation::status_subresource`] or
    /// [`Propagation::status_annotation`]); see [`Rollout`].
    #[must_use]
    pub fn rollout(mut self, rollout: Rollout) -> Self {
        self.rollout = rollout;
        self
    }

    /// Pauses a hub object's paced rollout while `pause` says so, besides
    /// [`PAUSE_ANNOTATION`]: no member is given a slot; those holding one
    /// go on.
    #[must_use]
    pub fn pause_when(mut self, pause: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.pause = Some(Arc::new(pause));
        self
    }

    /// Approves a stage that [needs approval](Stage::needs_approval) when
    /// `approve` says so for the hub object, the stage's name and the
    /// revision rolled out, besides [`APPROVAL_ANNOTATION`].
    #[must_use]
    pub fn approve_with(
        mut self,
        approve: impl Fn(&K, &str, &str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.approve = Some(Arc::new(approve));
        self
    }

    /// Whether a member's failure, conflict or drift is told in a Warning
    /// Event on the hub object (default `true`; one series per member and
    /// reason).
    #[must_use]
    pub fn events(mut self, events: bool) -> Self {
        self.events = events;
        self
    }

    /// Decides the members of some hub objects again whenever an object of
    /// `resource` in the local cluster changes: what [`Propagation::members_chosen_by`]
    /// reads besides the hub object (a placement decision's slices).
    /// `concerns` names the hub objects a change concerns, as requests in
    /// any cluster (only their namespace and name count), so a mapper such
    /// as `Placements::on_decision` serves as is. Every engaged member gets
    /// a request for each, and the hub object's status is written again.
    #[must_use]
    pub fn reselect_on(
        mut self,
        resource: ApiResource,
        concerns: impl Fn(&MapContext<'_>, &DynamicObject) -> Vec<Request> + Send + Sync + 'static,
    ) -> Self {
        self.reselect.push((resource, Arc::new(concerns)));
        self
    }

    /// Changes the controller before it is built: more sources,
    /// concurrency, timeouts.
    #[must_use]
    pub fn configure(
        mut self,
        configure: impl FnOnce(ControllerBuilder) -> ControllerBuilder + Send + 'static,
    ) -> Self {
        self.configure.push(Box::new(configure));
        self
    }

    /// The controller that does the work: hub requests (in the local
    /// cluster) keep the finalizer and the status, member requests apply
    /// and remove.
    pub fn build(self) -> Result<Controller, Error> {
        let (shared, reselect, configure) = self.into_shared()?;
        let mut builder = Controller::builder(shared.name.clone());
        builder = hub_sources(builder, &shared);
        builder = member_sources(builder, &shared);
        builder = reselect_sources(builder, &shared, reselect);
        for configure in configure {
            builder = configure(builder);
        }
        let controller = builder.build(reconciler(shared.clone()))?;
        let _ = shared.controller.set(controller.clone());
        Ok(controller)
    }

    /// Checks the settings and turns them into what reconciles share, with
    /// the sources and configuration the builder still adds.
    #[allow(clippy::type_complexity)]
    fn into_shared(
        self,
    ) -> Result<(Arc<Shared<K>>, Vec<(ApiResource, Concerns)>, Vec<Configure>), Error> {
        let invalid = |reason: String| Error::InvalidOptions {
            component: format!("propagation {:?}", self.name),
            reason,
        };
        if !is_label_value(&self.name) {
            return Err(invalid(
                "its name must be a valid label value (1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)".into(),
            ));
        }
        let Some(desired) = self.desired else {
            return Err(invalid(
                "it needs `desired`: the objects a hub object wants in a member".into(),
            ));
        };
        if self.kinds.is_empty() {
            return Err(invalid("it needs at least one `propagates::<T>()`".into()));
        }
        if self.rollout.is_paced() && self.status == StatusTarget::None {
            return Err(invalid(
                "a paced rollout keeps its state on the hub object: it needs `status_subresource` or `status_annotation`".into(),
            ));
        }
        let shared = Arc::new(Shared {
            finalizer: format!("propagation.mcr.sigs.k8s.io/{}", self.name),
            status_manager: format!("{}-status", self.name),
            name: self.name,
            select: self.select,
            desired,
            kinds: self.kinds,
            members: self.members,
            drift: self.drift,
            conflicts: self.conflicts,
            removal_grace: self.removal_grace,
            status: self.status,
            events: self.events,
            report: self.report,
            health: self.health,
            rollout: self.rollout,
            pause: self.pause,
            approve: self.approve,
            when_hub_deleted: self.when_hub_deleted,
            when_member_leaves: self.when_member_leaves,
            mode: self.mode,
            ignored_fields: self.ignored_fields,
            slots: Mutex::new(HashMap::new()),
            available_since: Mutex::new(HashMap::new()),
            changing_since: Mutex::new(HashMap::new()),
            metrics: OnceLock::new(),
            outcomes: Mutex::new(HashMap::new()),
            status_written: Mutex::new(HashMap::new()),
            leaving: Mutex::new(HashMap::new()),
            events_refused: AtomicBool::new(false),
            controller: OnceLock::new(),
        });
        Ok((shared, self.reselect, self.configure))
    }
}

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
    rollout: Rollout,
    pause: Option<Pause<K>>,
    approve: Option<Approve<K>>,
    when_hub_deleted: DeletionPolicy,
    when_member_leaves: DeletionPolicy,
    mode: ApplyMode,
    /// JSON pointers taken out of every desired object.
    ignored_fields: Vec<String>,
    /// Each hub object's rollout as this process last wrote or read it:
    /// a member given a slot here goes on before the hub cache shows it.
    slots: Mutex<HashMap<HubKey, rollout::RolloutStatus>>,
    /// Since when a member has been available with a revision (for the
    /// soak time).
    available_since: Mutex<HashMap<(HubKey, ClusterName), (String, Instant)>>,
    /// Since when a member has been on its way to a revision (for the
    /// time-to-available histogram).
    changing_since: Mutex<HashMap<(HubKey, ClusterName), (String, Instant)>>,
    /// Registered in the manager's registry at the first use (see
    /// [`Shared::metrics`]).
    metrics: OnceLock<metrics::PropagationMetrics>,
    /// Each hub object's members and how they are doing.
    outcomes: Mutex<HashMap<HubKey, BTreeMap<ClusterName, Outcome>>>,
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
        let ours = meta
            .labels
            .as_ref()
            .and_then(|labels| labels.get(PROPAGATION_LABEL))
            .is_some_and(|value| *value == self.name);
        if !ours {
            return None;
        }
        Request::owner_in(meta)
            .filter(|owner| owner.cluster.is_local())
            .map(|owner| (owner.namespace, owner.name))
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
            || crate::lock(&self.outcomes).contains_key(&key_of(hub))
    }

    /// The member requests for `hub`: every engaged member (selection is
    /// decided by each member's reconcile), and the members it has an
    /// outcome in.
    fn member_requests(&self, engaged: Vec<ClusterName>, key: &HubKey) -> Vec<Request> {
        let mut members: Vec<ClusterName> = engaged
            .into_iter()
            .filter(|name| !name.is_local())
            .collect();
        if let Some(outcomes) = crate::lock(&self.outcomes).get(key) {
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

    /// Notes when `member` of `key` starts on `revision`, and once it is
    /// available with it (`outcome`), how long that took.
    fn time_to_available(
        &self,
        key: &HubKey,
        member: &ClusterName,
        revision: &str,
        starting: bool,
        outcome: &status::Outcome,
    ) {
        let entry = (key.clone(), member.clone());
        let mut changing = crate::lock(&self.changing_since);
        if starting
            && changing
                .get(&entry)
                .is_none_or(|(known, _)| known != revision)
        {
            changing.insert(entry.clone(), (revision.to_string(), Instant::now()));
        }
        if outcome.state == MemberState::InSync
            && outcome.revision.as_deref() == Some(revision)
            && let Some((known, since)) = changing.remove(&entry)
        {
            if known == revision {
                if let Some(metrics) = self.metrics() {
                    metrics.became_available(since.elapsed());
                }
            } else {
                changing.insert(entry, (known, since));
            }
        }
    }

    /// Records `outcome` for `member` of `key`, and has the hub object's
    /// status written soon (once for many members).
    fn record(&self, key: &HubKey, member: &ClusterName, outcome: Option<Outcome>) {
        {
            let mut outcomes = crate::lock(&self.outcomes);
            match outcome {
                Some(outcome) => {
                    outcomes
                        .entry(key.clone())
                        .or_default()
                        .insert(member.clone(), outcome);
                }
                None => {
                    if let Some(members) = outcomes.get_mut(key) {
                        members.remove(member);
                    }
                }
            }
        }
        if let Some(controller) = self.controller.get() {
            controller.enqueue_after(
                Request::new(ClusterName::local(), key.0.as_deref(), key.1.as_str()),
                STATUS_COALESCE,
            );
        }
    }
}

/// What of a hub object its members' objects may depend on: all of it
/// but what the server keeps (`resourceVersion`, `managedFields`) and what
/// the propagation writes (`status`).
/// Whether `name` is a valid label value: 1-63 letters, digits, `-`, `_`
/// or `.`, starting and ending with a letter or digit.
fn is_label_value(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The hub's sources: the hub objects themselves, and a change of one as a
/// request in every member it has or may have objects in (not a change of
/// only what this propagation writes on it, its status, or every status
/// write would apply again in every member); a member joining gets every
/// hub object's request, one leaving makes every status drop it, and
/// members chosen by their labels are decided again when those change.
fn hub_sources<K>(builder: ControllerBuilder, shared: &Arc<Shared<K>>) -> ControllerBuilder
where
    K: CachedResource + Serialize,
{
    let concerned = || {
        let shared = shared.clone();
        move |hub: &K| shared.concerns(hub)
    };
    let changed_beyond_status = filters::custom({
        let status = shared.status.clone();
        move |event: &CacheEvent<K>| match event {
            CacheEvent::Applied {
                old: Some(old),
                new,
            } => beyond_status(old.as_ref(), &status) != beyond_status(new.as_ref(), &status),
            _ => true,
        }
    });
    let to_members = {
        let shared = shared.clone();
        move |context: &MapContext<'_>, hub: &K| {
            if !shared.concerns(hub) {
                return Vec::new();
            }
            shared.member_requests(context.engaged_clusters(), &key_of(hub))
        }
    };
    let builder = builder
        .for_resource(Watch::<K>::new().clusters(ClusterScope::Local))
        .watches(
            Watch::<K>::new()
                .clusters(ClusterScope::Local)
                .filter(changed_beyond_status),
            to_members,
        )
        .owed_on_engage(map::local_objects::<K>(concerned()))
        .owed_on_disengage(map::local_requests::<K>(concerned()));
    if matches!(shared.members, Members::Matching(_)) {
        builder.owed_on_relabel(map::local_objects::<K>(concerned()))
    } else {
        builder
    }
}

/// The members' sources: each propagated type, watched in members
/// (metadata only), mapped back to the hub object it was made for.
fn member_sources<K>(mut builder: ControllerBuilder, shared: &Arc<Shared<K>>) -> ControllerBuilder
where
    K: CachedResource + Serialize,
{
    for kind in shared.kinds.clone() {
        let shared = shared.clone();
        builder = kind.watched_by(
            builder,
            Arc::new(move |context, meta| {
                shared
                    .hub_of(meta)
                    .map(|(namespace, name)| vec![context.here(namespace.as_deref(), name)])
                    .unwrap_or_default()
            }),
        );
    }
    builder
}

/// What else decides the members of a hub object (`reselect_on`): a change
/// of it is a request for the hub objects it concerns, in the hub and in
/// every member they have or may have objects in.
fn reselect_sources<K>(
    mut builder: ControllerBuilder,
    shared: &Arc<Shared<K>>,
    reselect: Vec<(ApiResource, Concerns)>,
) -> ControllerBuilder
where
    K: CachedResource + Serialize,
{
    for (resource, concerns) in reselect {
        let shared = shared.clone();
        builder = builder.watches_dynamic(
            resource,
            Watch::new().clusters(ClusterScope::Local),
            move |context, object| {
                let mut hubs: Vec<HubKey> = concerns(context, object)
                    .into_iter()
                    .map(|request| (request.namespace, request.name))
                    .collect();
                hubs.sort();
                hubs.dedup();
                hubs.into_iter()
                    .flat_map(|key| {
                        let hub =
                            Request::new(ClusterName::local(), key.0.as_deref(), key.1.as_str());
                        shared
                            .member_requests(context.engaged_clusters(), &key)
                            .into_iter()
                            .chain(std::iter::once(hub))
                    })
                    .collect()
            },
        );
    }
    builder
}

/// One reconcile of the propagation, under way.
type Reconciling =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Action, ReconcileError>> + Send>>;

/// The reconciler: a hub object's request reconciles it on the hub (its
/// finalizer and status), a member's applies what it wants there.
fn reconciler<K>(
    shared: Arc<Shared<K>>,
) -> impl Fn(Request, Cluster) -> Reconciling + Send + Sync + 'static
where
    K: CachedResource + Serialize,
{
    move |request, cluster| {
        let shared = shared.clone();
        Box::pin(async move {
            if request.cluster.is_local() {
                shared.reconcile_hub(request, cluster).await
            } else {
                shared.reconcile_member(request, cluster).await
            }
        })
    }
}

fn beyond_status<K: Serialize>(hub: &K, status: &StatusTarget) -> Option<serde_json::Value> {
    let mut value = serde_json::to_value(hub).ok()?;
    if let Some(metadata) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
        if let StatusTarget::Annotation(key) = status
            && let Some(annotations) = metadata
                .get_mut("annotations")
                .and_then(|a| a.as_object_mut())
        {
            annotations.remove(key);
            if let Some(rollout) = status.rollout_annotation() {
                annotations.remove(&rollout);
            }
        }
    }
    if let Some(object) = value.as_object_mut() {
        object.remove("status");
    }
    Some(value)
}

/// The key of a hub object.
fn key_of<K: Resource>(hub: &K) -> HubKey {
    (
        hub.meta().namespace.clone(),
        hub.meta().name.clone().unwrap_or_default(),
    )
}
