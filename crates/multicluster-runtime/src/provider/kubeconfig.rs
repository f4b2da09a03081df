//! A cluster to build from kubeconfig text, as providers find it.

use std::hash::{Hash, Hasher};

use crate::cache::Cache;
use crate::client::kubeconfig::parse;
use crate::client::{KubeconfigPolicy, client_with_requests};
use crate::cluster::{Cluster, Inventory};
use crate::error::Error;
use crate::name::ClusterName;
use crate::provider::member::MemberOptions;

/// A short, stable digest of kubeconfig text, for telling whether a
/// cluster's connection config changed (not a security measure).
pub(crate) fn fingerprint(text: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// A cluster to build from kubeconfig text: what a provider found, before
/// the (possibly slow) client is built. Building runs exec credential
/// plugins; providers can build several at once and hand the results to
/// [`Clusters::add_or_replace`](crate::provider::clusters::Clusters::add_or_replace) with [`KubeconfigCluster::fingerprint`].
#[derive(Clone)]
pub struct KubeconfigCluster {
    /// The cluster's name in the fleet.
    pub name: ClusterName,
    /// The kubeconfig; its current context is used.
    pub text: String,
    /// Where the text came from, for errors (which never quote it).
    pub source: String,
    /// What the kubeconfig may use, by who wrote it:
    /// [`KubeconfigPolicy::untrusted`] for text read from a cluster object,
    /// [`KubeconfigPolicy::trusted`] for the operator's own (see
    /// [`crate::client`]).
    pub policy: KubeconfigPolicy,
    /// The cluster's stable ID, if known ([`Cluster::stable_id`]).
    pub stable_id: Option<String>,
    /// What its clients and cache are built with.
    pub member: MemberOptions,
    /// Its labels and properties ([`Cluster::inventory`]); not part of
    /// the fingerprint, since a change of them alone needs no new client.
    pub inventory: Inventory,
}

impl std::fmt::Debug for KubeconfigCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigCluster")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("policy", &self.policy)
            .field("stable_id", &self.stable_id)
            .field("member", &self.member)
            .field("inventory", &self.inventory)
            .finish_non_exhaustive()
    }
}

impl KubeconfigCluster {
    /// The [`text`](KubeconfigCluster::text) for a kubeconfig built in
    /// memory: JSON (which is also YAML) with object keys sorted, so equal
    /// settings always give equal text and an unchanged cluster is not
    /// built again (kube-rs keeps exec `env` entries in hash maps, whose
    /// order changes from one map to the next).
    pub fn text_of(kubeconfig: &kube::config::Kubeconfig) -> String {
        crate::client::kubeconfig::canonical_text(kubeconfig)
    }

    /// A digest of the text, stable ID, policy and member options: equal
    /// exactly when building again would give the same cluster.
    pub fn fingerprint(&self) -> String {
        fingerprint(&format!(
            "{}\n{:?}\n{}\n{}",
            self.stable_id.as_deref().unwrap_or_default(),
            self.policy,
            self.member.digest(),
            self.text
        ))
    }

    /// Parses the text and builds the cluster's client and cache with its
    /// policy and member options (running its credential plugin once, if
    /// it has one and the policy allows it: see [`crate::client::build`]).
    pub async fn build(&self) -> Result<Cluster, Error> {
        let parsed = parse(&self.text, &self.source)?;
        let (client, requests) = client_with_requests(
            &parsed,
            None,
            &self.source,
            &self.policy,
            &self.member.client,
        )
        .await?;
        let cache =
            Cache::with_options(self.name.clone(), client.clone(), self.member.cache.clone());
        let cluster =
            Cluster::with_cache(self.name.clone(), client, cache).watching_requests(requests);
        cluster.set_inventory(self.inventory.clone());
        Ok(match &self.stable_id {
            Some(id) => cluster.with_stable_id(id),
            None => cluster,
        })
    }
}
