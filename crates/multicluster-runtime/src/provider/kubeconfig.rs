//! A cluster to build from kubeconfig text, as providers find it.

use std::hash::{Hash, Hasher};

use crate::cache::Cache;
use crate::cluster::{Cluster, Inventory};
use crate::error::Error;
use crate::provider::member::MemberOptions;
use multicluster_client::kubeconfig::parse;
use multicluster_client::{KubeconfigPolicy, client_with_requests};
use multicluster_core::ClusterName;

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
        multicluster_client::kubeconfig::canonical_text(kubeconfig)
    }

    /// A digest of the text, stable ID, policy and member options: equal
    /// exactly when building again would give the same cluster.
    /// Hashed within this process (not a security measure, and not
    /// meant to be kept: it may differ between builds).
    pub fn fingerprint(&self) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (&self.stable_id, &self.policy, &self.member, &self.text).hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }

    /// Parses the text and builds the cluster's client and cache with its
    /// policy and member options (running its credential plugin once, if
    /// it has one and the policy allows it: see [`multicluster_client::build`]).
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;

    use super::*;
    use crate::cache::CacheOptions;
    use multicluster_client::{ClientOptions, ExecPolicy};

    fn wanted() -> KubeconfigCluster {
        KubeconfigCluster {
            name: ClusterName::from("a"),
            text: "apiVersion: v1\nkind: Config\n".to_string(),
            source: "test".to_string(),
            policy: KubeconfigPolicy::untrusted(),
            stable_id: None,
            member: MemberOptions::default(),
            inventory: Inventory::default(),
        }
    }

    /// The fingerprint decides whether a cluster is built again: every
    /// setting of what it is built from moves it, labels do not.
    #[test]
    fn the_fingerprint_follows_every_setting_and_only_those() {
        let base = wanted().fingerprint();
        assert_eq!(base, wanted().fingerprint());
        let mut relabelled = wanted();
        relabelled
            .inventory
            .labels
            .insert("tier".into(), "gold".into());
        relabelled.source = "elsewhere".to_string();
        assert_eq!(base, relabelled.fingerprint());

        type Change = fn(&mut KubeconfigCluster);
        let changes: [(&str, Change); 8] = [
            ("text", |c| c.text.push('\n')),
            ("stable id", |c| c.stable_id = Some("id".into())),
            ("policy", |c| c.policy.exec = ExecPolicy::AllowAll),
            ("request budget", |c| {
                c.member.client = ClientOptions::default().request_budget(Some(
                    multicluster_client::budget::RequestBudget::new(5.5, 10),
                ));
            }),
            ("cache namespace", |c| {
                c.member.cache = CacheOptions::default().namespace("ns".to_string());
            }),
            ("watcher page size", |c| {
                c.member.cache =
                    CacheOptions::default().watcher(watcher::Config::default().page_size(10));
            }),
            ("list semantic", |c| {
                c.member.cache =
                    CacheOptions::default().watcher(watcher::Config::default().any_semantic());
            }),
            ("a type's watcher", |c| {
                c.member.cache = CacheOptions::default()
                    .watcher_for::<ConfigMap>(watcher::Config::default().labels("a=b"));
            }),
        ];
        for (what, change) in changes {
            let mut changed = wanted();
            change(&mut changed);
            assert_ne!(base, changed.fingerprint(), "{what} changed nothing");
        }
    }
}
