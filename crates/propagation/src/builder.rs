//! A propagation's settings, as its user gives them, checked and turned
//! into what its reconciles share.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::core::{Resource, Selector, SelectorExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::gates::GateCheck;
use super::kinds::Kind;
use super::paced::{self, Approve, CheckGate, Pause, RolloutHooks};
use super::per_hub::PerHub;
use super::sources::{hub_sources, member_sources, reconciler, reselect_sources};
#[allow(unused_imports)] // for the docs
use super::{
    APPROVAL_ANNOTATION, CONDITION_TYPE, DELETION_POLICY_ANNOTATION, PAUSE_ANNOTATION,
    PROPAGATION_LABEL, Stage,
};
use super::{
    ApplyMode, Concerns, Configure, Conflicts, DEFAULT_REMOVAL_GRACE, DeletionPolicy, Desired,
    DesiredFn, Drift, Health, Members, Report, Rollout, Shared, StatusTarget, health,
};
use multicluster_runtime::Cluster;
use multicluster_runtime::ClusterName;
use multicluster_runtime::Error;
use multicluster_runtime::cache::CachedResource;
use multicluster_runtime::controller::{
    Controller, ControllerBuilder, MapContext, ReconcileError, Request,
};

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
    rollout: PerHub<K, Rollout>,
    pause: Option<Pause<K>>,
    approve: Option<Approve<K>>,
    check_gates: Option<CheckGate<K>>,
    when_hub_deleted: PerHub<K, DeletionPolicy>,
    when_member_leaves: DeletionPolicy,
    revision_history: usize,
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
            rollout: PerHub::Fixed(Rollout::default()),
            pause: None,
            check_gates: None,
            approve: None,
            when_hub_deleted: PerHub::Fixed(DeletionPolicy::Delete),
            when_member_leaves: DeletionPolicy::Delete,
            revision_history: DEFAULT_REVISION_HISTORY,
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
        self.kinds.push(Kind::of::<T>(&self.name));
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
        self.when_hub_deleted = PerHub::Fixed(policy);
        self
    }

    /// Like [`Propagation::when_hub_deleted`], decided for each hub object
    /// by `policy` (its `spec` may say: a `keepOnDelete` field). Read from
    /// the hub object as it is being deleted (its finalizer holds it until
    /// the members are clean), or no longer selected.
    #[must_use]
    pub fn when_hub_deleted_by(
        mut self,
        policy: impl Fn(&K) -> DeletionPolicy + Send + Sync + 'static,
    ) -> Self {
        self.when_hub_deleted = PerHub::By(Arc::new(policy));
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
        self.rollout = PerHub::Fixed(rollout);
        self
    }

    /// Like [`Propagation::rollout`], decided for each hub object by
    /// `rollout` (its `spec` may say how many members may change at once:
    /// [`MaxUnavailable::from_int_or_string`](crate::MaxUnavailable::from_int_or_string)
    /// reads a Deployment-style `maxUnavailable`). Asked at every step of
    /// the object's rollout, so a change of pace applies from the next
    /// step; it needs a status target, as a paced rollout does.
    #[must_use]
    pub fn rollout_for(mut self, rollout: impl Fn(&K) -> Rollout + Send + Sync + 'static) -> Self {
        self.rollout = PerHub::By(Arc::new(rollout));
        self
    }

    /// How many revisions of each hub object a paced rollout keeps, as
    /// ControllerRevisions in the hub object's namespace owned by it
    /// (default 10; 0 keeps none, and a roll back is then refused): what
    /// a roll back ([`OnFailure::RollBack`](crate::OnFailure),
    /// [`ROLL_BACK_ANNOTATION`](crate::ROLL_BACK_ANNOTATION)) computes the
    /// members' objects from. The hub identity needs `create`, `list` and
    /// `delete` on `controllerrevisions` there; without them the rollout
    /// goes on and roll backs are refused, by name.
    #[must_use]
    pub fn revision_history(mut self, revisions: usize) -> Self {
        self.revision_history = revisions;
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

    /// Decides the stages [gated by](crate::Stage::gated_by) [`Gate::checked`](crate::Gate::checked):
    /// `check` is asked with the hub object, the stage's name and the
    /// revision rolled out while the stage is up, every 2 seconds and
    /// whenever the hub object changes, until it passes or fails. It runs
    /// on the reconcile's task: a check that must ask elsewhere (a
    /// monitoring query) keeps its own state and answers from it.
    #[must_use]
    pub fn check_gates_with(
        mut self,
        check: impl Fn(&K, &str, &str) -> GateCheck + Send + Sync + 'static,
    ) -> Self {
        self.check_gates = Some(Arc::new(check));
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
        // Every replica sharing a fleet reads the hub for its own members.
        let mut builder = Controller::builder(shared.name.clone()).local_on_every_replica();
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
        let may_be_paced = match &self.rollout {
            PerHub::Fixed(rollout) => rollout.is_paced(),
            PerHub::By(_) => true,
        };
        if let PerHub::Fixed(rollout) = &self.rollout
            && rollout.has_checked_gate()
            && self.check_gates.is_none()
        {
            return Err(invalid(
                "a stage is gated by `Gate::checked()`: it needs `check_gates_with`".into(),
            ));
        }
        if may_be_paced && self.status == StatusTarget::None {
            return Err(invalid(
                "a paced rollout (or `rollout_for`) keeps its state on the hub object: it needs `status_subresource` or `status_annotation`".into(),
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
            rollouts: paced::Rollouts::new(
                self.rollout,
                RolloutHooks {
                    pause: self.pause,
                    approve: self.approve,
                    check_gates: self.check_gates,
                },
                self.revision_history,
            ),
            when_hub_deleted: self.when_hub_deleted,
            when_member_leaves: self.when_member_leaves,
            mode: self.mode,
            ignored_fields: self.ignored_fields,
            metrics: OnceLock::new(),
            outcomes: Mutex::default(),
            status_written: Mutex::new(HashMap::new()),
            leaving: Mutex::new(HashMap::new()),
            events_refused: AtomicBool::new(false),
            controller: OnceLock::new(),
        });
        Ok((shared, self.reselect, self.configure))
    }
}

/// How many revisions of each hub object are kept by default.
const DEFAULT_REVISION_HISTORY: usize = 10;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Desired, Gate, GateCheck, MaxUnavailable, Stage};
    use k8s_openapi::api::core::v1::ConfigMap;

    fn checked_stages() -> Propagation<ConfigMap> {
        Propagation::<ConfigMap>::new("gated")
            .propagates::<ConfigMap>()
            .desired(|hub, _| Ok(vec![Desired::new(hub)?]))
            .status_annotation("example.com/status")
            .rollout(Rollout::staged(
                [Stage::named("main", ["a"]).gated_by(Gate::checked())],
                MaxUnavailable::Count(1),
            ))
    }

    #[test]
    fn a_checked_gate_needs_its_check() {
        let err = checked_stages().into_shared().err().expect("refused");
        assert!(err.to_string().contains("check_gates_with"), "{err}");
        assert!(
            checked_stages()
                .check_gates_with(|_, _, _| GateCheck::Passed)
                .into_shared()
                .is_ok()
        );
    }
}
