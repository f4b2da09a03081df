//! Controllers a test control plane does not run, played as the real ones
//! write their status, for tests of what waits on it: members have no
//! kubelet, so no Deployment ever rolls out by itself.
//!
//! [`Deployments`] plays the Deployment controller of one or more control
//! planes: a Deployment whose spec it has not seen is "rolled out" a set
//! time later (its status written as the real controller writes it:
//! `observedGeneration`, replicas, `Available` and `Progressing`), or, for
//! a namespace told to fail, at once past its progress deadline. It keeps
//! the timeline it saw, from which a test checks how many were between a
//! new spec and its availability at once.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// The played Deployment controller of the control planes it watches.
#[derive(Clone, Default)]
pub struct Deployments {
    state: Arc<Mutex<State>>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

#[derive(Default)]
struct State {
    /// Deployments (`<cluster>/<namespace>/<name>`) given a new spec and
    /// not yet available.
    changing: BTreeSet<String>,
    most: usize,
    /// The most at once per Deployment name (the last part of the key).
    most_named: std::collections::BTreeMap<String, usize>,
    /// Every spec given, by Deployment and image.
    given: Vec<(String, String)>,
    /// Namespaces whose Deployments fail.
    failing: BTreeSet<String>,
    /// Images whose Deployments fail, wherever they are.
    failing_images: BTreeSet<String>,
    /// Every spec rolled out, by Deployment and image.
    available: Vec<(String, String)>,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Deployments {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Plays the Deployment controller of the control plane `client`
    /// reaches (named `cluster` in the timeline), taking `roll_time` to
    /// roll a spec out. Stops when this value's last clone is dropped.
    pub fn watch(&self, cluster: &str, client: kube::Client, roll_time: Duration) {
        let state = self.state.clone();
        let cluster = cluster.to_string();
        let task = tokio::spawn(async move {
            let mut seen = HashSet::new();
            // With backoff: a control plane gone (a test that failed and
            // is dropping it) refuses at once, and a watch retried without
            // a pause never yields, so the test's runtime could not shut
            // down.
            let changes = watcher(
                Api::<Deployment>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff();
            let mut changes = std::pin::pin!(changes);
            while let Some(event) = changes.next().await {
                let deployment = match event {
                    Ok(
                        watcher::Event::Apply(deployment) | watcher::Event::InitApply(deployment),
                    ) => deployment,
                    // Gone (or going): no longer changing, as the real
                    // controller rolls nothing out for a Deployment being
                    // deleted.
                    Ok(watcher::Event::Delete(deployment)) => {
                        forget(&state, &cluster, &deployment);
                        continue;
                    }
                    _ => continue,
                };
                if deployment.metadata.deletion_timestamp.is_some() {
                    forget(&state, &cluster, &deployment);
                    continue;
                }
                let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
                let name = deployment.metadata.name.clone().unwrap_or_default();
                let generation = deployment.metadata.generation.unwrap_or_default();
                let observed = deployment
                    .status
                    .as_ref()
                    .and_then(|status| status.observed_generation)
                    .unwrap_or_default();
                // By uid: a Deployment deleted and made again under its
                // name starts at generation 1 again, and is new.
                let uid = deployment.metadata.uid.clone().unwrap_or_default();
                if observed >= generation || !seen.insert((uid, generation)) {
                    continue;
                }
                let key = format!("{cluster}/{namespace}/{name}");
                let image = deployment
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.template.spec.as_ref())
                    .and_then(|pod| pod.containers.first())
                    .and_then(|container| container.image.clone())
                    .unwrap_or_default();
                let replicas = deployment
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.replicas)
                    .unwrap_or(1);
                let failing = {
                    let mut state = lock(&state);
                    state.changing.insert(key.clone());
                    state.most = state.most.max(state.changing.len());
                    let name = key.rsplit('/').next().unwrap_or_default().to_string();
                    let named = state
                        .changing
                        .iter()
                        .filter(|changing| changing.rsplit('/').next() == Some(name.as_str()))
                        .count();
                    let most = state.most_named.entry(name).or_default();
                    *most = (*most).max(named);
                    state.given.push((key.clone(), image.clone()));
                    state.failing.contains(&namespace) || state.failing_images.contains(&image)
                };
                let (state, client) = (state.clone(), client.clone());
                tokio::spawn(async move {
                    if !failing {
                        // The scenario's clock: how long a rollout takes.
                        tokio::time::sleep(roll_time).await;
                    }
                    let written =
                        write_status(&client, &namespace, &name, generation, replicas, !failing)
                            .await;
                    if written && !failing {
                        let mut state = lock(&state);
                        state.changing.remove(&key);
                        state.available.push((key, image));
                    }
                });
            }
        });
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(task);
    }

    /// The most Deployments that were between a new spec and its
    /// availability at once.
    pub fn most_changing(&self) -> usize {
        self.state().most
    }

    /// The most Deployments named `name` (in any cluster and namespace)
    /// that were between a new spec and its availability at once.
    pub fn most_changing_named(&self, name: &str) -> usize {
        self.state().most_named.get(name).copied().unwrap_or(0)
    }

    /// Forgets the most so far (for a new round).
    pub fn reset_most(&self) {
        let mut state = self.state();
        state.most = state.changing.len();
    }

    /// The Deployments (`<cluster>/<namespace>/<name>`) given `image`.
    pub fn given(&self, image: &str) -> BTreeSet<String> {
        self.state()
            .given
            .iter()
            .filter(|(_, given)| given == image)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// The Deployments (`<cluster>/<namespace>/<name>`) rolled out with
    /// `image`.
    pub fn available(&self, image: &str) -> BTreeSet<String> {
        self.state()
            .available
            .iter()
            .filter(|(_, available)| available == image)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// The Deployments (`<cluster>/<namespace>/<name>`) whose latest spec
    /// has `image` and is rolled out: what runs now, where [`given`] and
    /// [`available`] say what ever was.
    ///
    /// [`given`]: Self::given
    /// [`available`]: Self::available
    pub fn running(&self, image: &str) -> BTreeSet<String> {
        let state = self.state();
        let latest = |specs: &[(String, String)]| {
            specs
                .iter()
                .map(|(key, image)| (key.clone(), image.clone()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let (given, available) = (latest(&state.given), latest(&state.available));
        // Rolled out since its latest spec: no longer changing.
        given
            .into_iter()
            .filter(|(key, given)| {
                given == image && available.get(key) == Some(given) && !state.changing.contains(key)
            })
            .map(|(key, _)| key)
            .collect()
    }

    /// From now on a Deployment given `image` fails (`true`), wherever it
    /// is: a bad release; or rolls out (`false`).
    pub fn fail_image(&self, image: &str, failing: bool) {
        let mut state = self.state();
        if failing {
            state.failing_images.insert(image.to_string());
        } else {
            state.failing_images.remove(image);
        }
    }

    /// From now on the Deployments of `namespace` fail (`true`) or roll
    /// out (`false`).
    pub fn fail_in(&self, namespace: &str, failing: bool) {
        let mut state = self.state();
        if failing {
            state.failing.insert(namespace.to_string());
        } else {
            state.failing.remove(namespace);
        }
    }

    /// Rolls out `cluster`'s Deployment `namespace/name` now (a failing
    /// one that recovers).
    pub async fn roll_out_now(
        &self,
        cluster: &str,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) {
        let Ok(deployment) = Api::<Deployment>::namespaced(client.clone(), namespace)
            .get(name)
            .await
        else {
            return;
        };
        let generation = deployment.metadata.generation.unwrap_or_default();
        let replicas = deployment
            .spec
            .as_ref()
            .and_then(|spec| spec.replicas)
            .unwrap_or(1);
        if write_status(client, namespace, name, generation, replicas, true).await {
            self.state()
                .changing
                .remove(&format!("{cluster}/{namespace}/{name}"));
        }
    }
}

impl Drop for Deployments {
    fn drop(&mut self) {
        // The last clone stops the watches (their tasks hold only the
        // timeline).
        if Arc::strong_count(&self.tasks) == 1 {
            for task in self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .drain(..)
            {
                task.abort();
            }
        }
    }
}

/// Writes the status of the Deployment `namespace/name` as the Deployment
/// controller does once it rolled out `generation` (or gave up); whether
/// it was written.
async fn write_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    generation: i64,
    replicas: i32,
    available: bool,
) -> bool {
    let progressing = if available {
        json!({"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "message": format!("ReplicaSet \"{name}-1\" has successfully progressed.")})
    } else {
        json!({"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": format!("ReplicaSet \"{name}-1\" has timed out progressing.")})
    };
    let ready = if available { replicas } else { 0 };
    let status = json!({"status": {
        "observedGeneration": generation,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [
            {"type": "Available", "status": if available { "True" } else { "False" }, "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability."},
            progressing,
        ],
    }});
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .is_ok()
}

/// Takes `deployment` of `cluster` off the ones changing.
fn forget(state: &Arc<Mutex<State>>, cluster: &str, deployment: &Deployment) {
    let key = format!(
        "{cluster}/{}/{}",
        deployment.metadata.namespace.as_deref().unwrap_or_default(),
        deployment.metadata.name.as_deref().unwrap_or_default()
    );
    lock(state).changing.remove(&key);
}
