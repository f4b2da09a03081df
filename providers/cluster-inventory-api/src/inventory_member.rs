//! One cluster per inventory member (KEP-4322's
//! `multicluster.x-k8s.io/inventory-member-id`).
//!
//! ClusterProfiles carrying the same member id describe one cluster (one
//! written by Cluster API's manager and one by Open Cluster Management,
//! say). They are engaged as one cluster named by the member id, from one
//! profile at a time, chosen as follows:
//!
//! 1. profiles being deleted and profiles that are not ready are passed
//!    over;
//! 2. of the rest, the first, oldest first (`creationTimestamp`, then
//!    namespace and name), whose credentials can be had: its Secret is
//!    there and usable, or one of its access providers is in the provider
//!    file.
//!
//! The others are listed as duplicates of the member (`/clusters`,
//! [`crate::ClusterProfileProvider::duplicates`]). When the chosen profile
//! goes (or turns unready, or loses its credentials), the next is built
//! and engaged under the same name, replacing the old client only once the
//! new one is built: the member's controllers keep their engagement and
//! see no gap if the old credential still works meanwhile. A credential
//! plugin that fails for the chosen profile is retried with backoff; it
//! does not pass the member to the next profile.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::api::DynamicObject;
use multicluster_runtime::controller::Action;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::{ClusterName, Error};

use crate::{INVENTORY_MEMBER_ID_LABEL, Shared, Wanted};

/// The name of the hub cache's index of profiles by member id.
pub(crate) const INDEX: &str = "inventory-member-id";

/// A profile's inventory member id, if it carries a non-empty one.
pub(crate) fn id(profile: &DynamicObject) -> Option<&str> {
    profile
        .metadata
        .labels
        .as_ref()?
        .get(INVENTORY_MEMBER_ID_LABEL)
        .map(String::as_str)
        .filter(|id| !id.is_empty())
}

fn profile_name(profile: &DynamicObject) -> ClusterName {
    ClusterName::from(crate::profile_key(profile))
}

/// What the profiles of one member call for.
enum Choice {
    /// No profile carries the id (any more).
    None,
    /// Engage `wanted`, built from the profile `from`, which hands a
    /// plugin what `steered` says (see `steering`).
    Engage {
        wanted: Box<KubeconfigCluster>,
        from: ClusterName,
        steered: crate::Steered,
    },
    /// Ready profiles exist, none with usable credentials: why, per
    /// profile, and the metrics label (a refusal if any profile was
    /// refused).
    NoCredentials(Vec<String>, &'static str),
    /// No profile is ready.
    NotReady,
}

impl Shared {
    /// The live profiles carrying member id `id`, in order of preference.
    fn member_profiles(&self, id: &str) -> Vec<Arc<DynamicObject>> {
        let mut profiles: Vec<_> = self
            .profiles()
            .by_index(INDEX, id, None)
            .into_iter()
            .filter(|profile| profile.metadata.deletion_timestamp.is_none())
            .collect();
        profiles.sort_by_key(|profile| {
            (
                profile.metadata.creation_timestamp.clone().map(|at| at.0),
                profile.metadata.namespace.clone(),
                profile.metadata.name.clone(),
            )
        });
        profiles
    }

    fn choose(&self, id: &str, cluster: &ClusterName, profiles: &[Arc<DynamicObject>]) -> Choice {
        if profiles.is_empty() {
            return Choice::None;
        }
        let mut reasons = Vec::new();
        let mut label = crate::NO_CREDENTIALS;
        for profile in profiles {
            match self.wanted(Some(profile), cluster) {
                Wanted::Engage {
                    mut wanted,
                    steered,
                } => {
                    wanted.source = format!("{} (inventory member {id:?})", wanted.source);
                    return Choice::Engage {
                        wanted,
                        from: profile_name(profile),
                        steered,
                    };
                }
                Wanted::NoCredentials { reason, kind } => {
                    if kind == crate::REFUSED {
                        label = kind;
                    }
                    if reason.starts_with("ClusterProfile ") {
                        reasons.push(reason);
                    } else {
                        reasons.push(format!(
                            "ClusterProfile {}: {reason}",
                            profile_name(profile)
                        ));
                    }
                }
                Wanted::NotReady | Wanted::Gone => {}
            }
        }
        if reasons.is_empty() {
            Choice::NotReady
        } else {
            Choice::NoCredentials(reasons, label)
        }
    }

    /// Brings the fleet in line with the profiles of member `id`.
    pub(crate) async fn reconcile_member(&self, id: &str) -> Result<Action, Error> {
        let cluster = ClusterName::from(id);
        let profiles = self.member_profiles(id);
        let choice = self.choose(id, &cluster, &profiles);
        let chosen = match &choice {
            Choice::Engage { from, .. } => Some(from.clone()),
            _ => None,
        };
        // Every other live profile is a duplicate of the one chosen; with
        // none chosen, none is.
        let duplicates: BTreeSet<ClusterName> = match &chosen {
            Some(from) => profiles
                .iter()
                .map(|profile| profile_name(profile))
                .filter(|name| name != from)
                .collect(),
            None => BTreeSet::new(),
        };
        self.fleet.failures().set_duplicates(&cluster, duplicates);
        if !matches!(choice, Choice::NotReady) {
            self.ready_again(&cluster);
        }
        match choice {
            Choice::None => self.fleet.remove(
                &cluster,
                "no ClusterProfile carries its inventory member id any more",
            ),
            Choice::NotReady => self.not_ready(
                &cluster,
                "no ClusterProfile of the inventory member is ready",
            ),
            Choice::NoCredentials(reasons, label) => {
                self.fleet
                    .failures()
                    .record(&cluster, reasons.join("; "), label);
            }
            Choice::Engage {
                wanted,
                from,
                steered,
            } => {
                let now = || {
                    let profiles = self.member_profiles(id);
                    match self.choose(id, &cluster, &profiles) {
                        Choice::Engage {
                            wanted, from: now, ..
                        } if now == from => Some(*wanted),
                        Choice::NoCredentials(reasons, label) => {
                            // Shown, not dropped: nothing else brings it
                            // back until a profile changes.
                            self.fleet
                                .failures()
                                .record(&cluster, reasons.join("; "), label);
                            None
                        }
                        _ => None,
                    }
                };
                let action = self.fleet.engage(*wanted, now).await;
                self.settle(&cluster, from.as_str(), steered);
                return action;
            }
        }
        Ok(Action::await_change())
    }
}
