//! Building blocks for providers that discover clusters from objects in a
//! management cluster (kubeconfig Secrets, Cluster API Clusters,
//! ClusterProfiles), as Go's providers do: discovery is a
//! [`Controller`] over those objects.
//!
//! The controller brings its guarantees to discovery: one reconcile per
//! inventory object at a time, at most
//! [`DEFAULT_MAX_CONCURRENT_BUILDS`] (or the provider's setting) at once,
//! per-object backoff for failures worth retrying (a credential plugin that
//! failed or timed out), and requeues. A slow object — a plugin waiting for
//! a login that never comes — holds only its own slot until its plugin's
//! deadline; objects created after it are engaged meanwhile, deleted ones
//! removed.
//!
//! A provider keeps its clusters in a [`Clusters`] set and its failure
//! reasons in a [`Failures`] record; its reconciler works out the
//! [`KubeconfigCluster`] an object calls for and hands it to
//! [`engage_kubeconfig`]. [`run`] engages the management cluster with the
//! controller and runs it until the provider stops.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clusters::{Clusters, KubeconfigCluster};
use crate::controller::{Action, Controller};
use crate::failures::Failures;
use crate::kubeconfig::ClientOptions;
use crate::{Aware, Cluster, ClusterName, Error};

/// The providers' default backoff for clusters whose credentials could not
/// be obtained (a credential plugin failed or timed out): 1 s, doubling per
/// failure up to 5 minutes.
pub const PROVIDER_BACKOFF: crate::controller::Backoff = crate::controller::Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(300),
};

/// How many clients a provider builds at once by default. Building runs
/// the credential plugin, which can take a second or more.
pub const DEFAULT_MAX_CONCURRENT_BUILDS: usize = 8;

/// The name the management cluster has in a provider's controller, as its
/// logs and spans show it.
pub const MANAGEMENT: &str = "management";

/// Runs `controller` over the objects `management`'s cache holds until
/// `shutdown` fires. Reconciles still running then (client builds) are
/// dropped at once, which stops their credential plugins: nobody will use
/// the clients.
pub async fn run(
    controller: &Controller,
    management: Cluster,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    controller.engage(
        shutdown.child_token(),
        ClusterName::from(MANAGEMENT),
        management,
    )?;
    controller.run(shutdown, Duration::ZERO).await;
    Ok(())
}

/// Engages `wanted` in `clusters`: builds its client unless the set already
/// holds it unchanged, then adds or replaces it, and clears its failure. A
/// failed build is recorded in `failures` (named, never quoting the
/// kubeconfig); when another attempt may help (a credential plugin failed
/// or timed out) the error is returned, so the controller backs the object
/// off and tries again; otherwise the object waits for a change.
///
/// `still_wanted` is asked once the client is built: when the object changed
/// meanwhile, the stale cluster is not engaged (the controller reconciles the
/// object again, since it changed).
pub async fn engage_kubeconfig(
    clusters: &Clusters,
    failures: &Failures,
    wanted: KubeconfigCluster,
    options: &ClientOptions,
    still_wanted: impl FnOnce(&KubeconfigCluster) -> bool,
) -> Result<Action, Error> {
    if clusters.is_current(&wanted) {
        failures.clear(&wanted.name);
        return Ok(Action::await_change());
    }
    let built = match wanted.build(options).await {
        Ok(built) => built,
        Err(err) if failures.record_build_error(&wanted.name, &err) => return Err(err),
        Err(_) => return Ok(Action::await_change()),
    };
    if !still_wanted(&wanted) {
        tracing::debug!(cluster = %wanted.name, "changed while its client was built; building again");
        return Ok(Action::await_change());
    }
    let replaced = clusters.get(&wanted.name).is_ok();
    if clusters.add_or_replace(wanted.name.clone(), built, wanted.fingerprint()) {
        tracing::info!(cluster = %wanted.name, replaced, "cluster engaged from {}", wanted.source);
    }
    failures.clear(&wanted.name);
    Ok(Action::await_change())
}

/// Removes `name` from `clusters` (its inventory object is gone or being
/// deleted) and forgets its failure; `why` is logged.
pub fn remove(clusters: &Clusters, failures: &Failures, name: &ClusterName, why: &str) {
    failures.clear(name);
    if clusters.remove(name) {
        tracing::info!(cluster = %name, "cluster removed: {why}");
    }
}
