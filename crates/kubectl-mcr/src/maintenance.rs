//! `kubectl mcr cordon | uncordon | drain TYPE/NAME`: the maintenance
//! label every propagation honours, on a member's inventory object (its
//! kubeconfig Secret, its ClusterProfile, its Cluster API Cluster): the
//! provider carries the object's labels to the member, as it does for
//! stage selectors.

use std::process::ExitCode;

use kube::api::{Patch, PatchParams};
use multicluster_propagation::MAINTENANCE_LABEL;
use serde_json::json;

use crate::Error;
use crate::hub::Hub;

#[derive(Clone, Copy)]
pub(crate) enum Verb {
    Cordon,
    Uncordon,
    Drain,
}

pub(crate) async fn run(hub: &Hub, object: &str, verb: Verb) -> Result<ExitCode, Error> {
    let (api, name) = hub.api_for(object).await?;
    let Some(current) = api.get_opt(&name).await? else {
        return Err(Error::Refused(format!("{object} not found")));
    };
    let now = current
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MAINTENANCE_LABEL));
    let (value, done) = match verb {
        Verb::Cordon => (Some("cordon"), "cordoned"),
        Verb::Drain => (Some("drain"), "drained"),
        Verb::Uncordon => (None, "uncordoned"),
    };
    if now.map(String::as_str) == value {
        println!("{object} already {done}");
        return Ok(ExitCode::SUCCESS);
    }
    let patch = json!({ "metadata": { "labels": { MAINTENANCE_LABEL: value } } });
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    println!("{object} {done}");
    Ok(ExitCode::SUCCESS)
}
