//! The hub cluster, and a hub object as a propagation leaves it: its
//! members' status and its rollout, read from its status subresource
//! (`status.members`, `status.rollout`, the `Propagated` condition) or
//! from the status annotation a propagation without one writes (found by
//! its shape, with its `<key>-rollout` beside it).

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use multicluster_propagation::{CONDITION_TYPE, MemberStatus, RolloutStatus};
use serde_json::{Value, json};

use crate::target::{self, Resolved};
use crate::{Connection, Error};

/// A connection to the hub.
pub(crate) struct Hub {
    pub(crate) client: kube::Client,
    /// The namespace objects are looked for in.
    pub(crate) namespace: String,
    /// How long one request may take (a watch is reopened within it).
    pub(crate) request_timeout: Duration,
}

impl Hub {
    /// Connects as kubectl would: the kubeconfig and context named, or
    /// the current ones.
    pub(crate) async fn connect(connection: &Connection) -> Result<Self, Error> {
        let options = KubeConfigOptions {
            context: connection.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match &connection.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .map_err(|err| Error::Kubeconfig(format!("{}: {err}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
            }
            None => kube::Config::from_kubeconfig(&options).await,
        };
        let mut config = config.map_err(|err| Error::Kubeconfig(err.to_string()))?;
        if connection.request_timeout < Duration::from_secs(1) {
            return Err(Error::Refused(
                "--request-timeout: at least 1s (a request to the hub must be able to finish)"
                    .into(),
            ));
        }
        config.connect_timeout = Some(connection.request_timeout);
        config.read_timeout = Some(connection.request_timeout);
        config.write_timeout = Some(connection.request_timeout);
        let namespace = connection
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config)?;
        Ok(Self {
            client,
            namespace,
            request_timeout: connection.request_timeout,
        })
    }

    /// The objects of the type `TYPE` in `TYPE/NAME` names, and `NAME`.
    pub(crate) async fn api_for(
        &self,
        object: &str,
    ) -> Result<(Api<DynamicObject>, String), Error> {
        let (kind, name) = target::split(object)?;
        let Resolved {
            resource,
            namespaced,
        } = target::resolve(&self.client, kind).await?;
        let api = if namespaced {
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource)
        } else {
            Api::all_with(self.client.clone(), &resource)
        };
        Ok((api, name.to_string()))
    }
}

/// A hub object `TYPE/NAME`: its API and name, and how to say it.
pub(crate) struct HubObject {
    pub(crate) api: Api<DynamicObject>,
    pub(crate) name: String,
    /// `TYPE/NAME` as typed.
    pub(crate) shown: String,
}

impl HubObject {
    pub(crate) async fn find(hub: &Hub, object: &str) -> Result<Self, Error> {
        let (api, name) = hub.api_for(object).await?;
        Ok(Self {
            api,
            name,
            shown: object.to_string(),
        })
    }

    /// The object as it is now, read.
    pub(crate) async fn read(&self) -> Result<Seen, Error> {
        match self.api.get_opt(&self.name).await? {
            Some(object) => Seen::of(&object),
            None => Err(Error::Refused(format!("{} not found", self.shown))),
        }
    }

    /// Sets (or with `None` removes) the annotation `key`, as `kubectl
    /// annotate` does; with `resource_version`, only if the object is
    /// still at it (a read-modify-write of a list).
    pub(crate) async fn annotate(
        &self,
        key: &str,
        value: Option<&str>,
        resource_version: Option<&str>,
    ) -> Result<(), Error> {
        let mut patch = json!({ "metadata": { "annotations": { key: value } } });
        if let Some(resource_version) = resource_version {
            patch["metadata"]["resourceVersion"] = json!(resource_version);
        }
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

/// What a hub object says of its propagation.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The object as JSON.
    pub(crate) value: Value,
    /// Its revision as its propagation computes it.
    pub(crate) revision: String,
    pub(crate) members: Vec<MemberStatus>,
    /// How many members are in each state (all of them, listed or not).
    pub(crate) counts: BTreeMap<String, u64>,
    /// The `Propagated` condition.
    pub(crate) condition: Option<Value>,
    /// A paced rollout's state.
    pub(crate) rollout: Option<RolloutStatus>,
    /// Whether any propagation has written a status on it.
    pub(crate) propagated: bool,
}

impl Seen {
    pub(crate) fn of(object: &DynamicObject) -> Result<Self, Error> {
        let value = serde_json::to_value(object)
            .map_err(|err| Error::Refused(format!("the object as JSON: {err}")))?;
        let mut seen = Seen {
            revision: multicluster_propagation::revision_of(&value),
            ..Seen::default()
        };
        let (status, rollout) = match value.get("status").filter(|status| is_status(status)) {
            Some(status) => {
                let condition = status
                    .get("conditions")
                    .and_then(Value::as_array)
                    .and_then(|conditions| {
                        conditions
                            .iter()
                            .find(|condition| condition["type"] == CONDITION_TYPE)
                    })
                    .cloned();
                let mut status = status.clone();
                status["condition"] = condition.unwrap_or_default();
                let rollout = status.get("rollout").cloned();
                (Some(status), rollout)
            }
            None => from_annotations(&value),
        };
        if let Some(status) = status {
            seen.propagated = true;
            seen.members = parsed(&status["members"], "members")?.unwrap_or_default();
            seen.counts = parsed(&status["counts"], "counts")?.unwrap_or_default();
            seen.condition = Some(status["condition"].clone()).filter(|c| !c.is_null());
        }
        seen.rollout = match rollout {
            Some(rollout) => parsed(&rollout, "rollout")?,
            None => None,
        };
        seen.value = value;
        Ok(seen)
    }

    /// The object's annotation `key`.
    pub(crate) fn annotation(&self, key: &str) -> Option<&str> {
        self.value
            .pointer("/metadata/annotations")?
            .get(key)?
            .as_str()
    }

    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.value.pointer("/metadata/resourceVersion")?.as_str()
    }

    pub(crate) fn uid(&self) -> Option<&str> {
        self.value.pointer("/metadata/uid")?.as_str()
    }
}

/// Whether `status` is a propagation's.
fn is_status(status: &Value) -> bool {
    ["members", "rollout", "counts"]
        .iter()
        .any(|key| status.get(key).is_some())
}

/// The status annotation (`{"members", "counts", "condition"}`) and its
/// rollout beside it (`<key>-rollout`), if the object has them.
fn from_annotations(object: &Value) -> (Option<Value>, Option<Value>) {
    let Some(annotations) = object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    else {
        return (None, None);
    };
    for (key, text) in annotations {
        let Some(status) = text
            .as_str()
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .filter(|status| status.get("members").is_some() && status.get("condition").is_some())
        else {
            continue;
        };
        let rollout = annotations
            .get(&format!("{key}-rollout"))
            .and_then(Value::as_str)
            .and_then(|text| serde_json::from_str(text).ok());
        return (Some(status), rollout);
    }
    (None, None)
}

fn parsed<T: serde::de::DeserializeOwned>(value: &Value, what: &str) -> Result<Option<T>, Error> {
    if value.is_null() {
        return Ok(None);
    }
    serde_json::from_value(value.clone())
        .map(Some)
        .map_err(|err| Error::Refused(format!("the hub object's {what} cannot be read: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> DynamicObject {
        serde_json::from_value(value).expect("object")
    }

    #[test]
    fn the_status_is_read_from_the_subresource_or_the_annotation() {
        let member = json!({"cluster": "east", "state": "InSync", "revision": "3"});
        let rollout = json!({"revision": "3", "updated": 1, "remaining": 0});
        let by_status = Seen::of(&object(json!({
            "apiVersion": "fleet.example/v1", "kind": "FleetDeployment",
            "metadata": {"name": "web", "generation": 3},
            "status": {"members": [member], "counts": {"InSync": 1}, "rollout": rollout,
                       "conditions": [{"type": "Propagated", "status": "True", "reason": "InSync",
                                       "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        })))
        .expect("seen");
        let by_annotation = Seen::of(&object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "web", "annotations": {
                "example.com/propagation": json!({"members": [member], "counts": {"InSync": 1},
                    "condition": {"type": "Propagated", "status": "True"}}).to_string(),
                "example.com/propagation-rollout": rollout.to_string(),
            }},
        })))
        .expect("seen");
        for seen in [&by_status, &by_annotation] {
            assert!(seen.propagated);
            assert_eq!(seen.members.len(), 1);
            assert_eq!(seen.members[0].cluster, "east");
            assert_eq!(seen.counts.get("InSync"), Some(&1));
            assert_eq!(
                seen.condition.as_ref().expect("condition")["status"],
                "True"
            );
            assert_eq!(seen.rollout.as_ref().expect("rollout").revision, "3");
        }
        assert_eq!(by_status.revision, "3");
        let untouched = Seen::of(&object(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"},
        })))
        .expect("seen");
        assert!(!untouched.propagated && untouched.rollout.is_none());
    }
}
