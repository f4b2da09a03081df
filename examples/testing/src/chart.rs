//! The Helm chart in `charts/multicluster-controller`, rendered and
//! installed by the real `helm` (built from its Go module by
//! `hack/helm/build.sh`, as the control plane is), and the RBAC it grants
//! compared with the kustomize bases' in `config/`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use multicluster_envtest::ControlPlane;
use serde_json::Value;
use tokio::process::Command;

/// The chart's directory.
pub const CHART: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../charts/multicluster-controller"
);
const BUILD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hack/helm/build.sh");
/// How long one helm command may take (an install waits for nothing).
const HELM_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// The `helm` binary, built on first use (a finished build is reused).
pub fn helm() -> PathBuf {
    multicluster_envtest::tools::built_by(std::path::Path::new(BUILD))
        .unwrap_or_else(|said| panic!("building helm: {said}"))
}

/// `helm` with `args`: what it printed, or what it said on failing.
async fn try_run(args: &[&str]) -> Result<String, String> {
    let helm = helm();
    let home = std::env::temp_dir().join("mcr-helm-home");
    let mut command = Command::new(&helm);
    command
        .args(args)
        // Nothing of the user's: no repository list, no plugins, no cache.
        .env("HELM_CONFIG_HOME", &home)
        .env("HELM_CACHE_HOME", &home)
        .env("HELM_DATA_HOME", &home)
        .kill_on_drop(true);
    let output = tokio::time::timeout(HELM_DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("helm {} ran past {HELM_DEADLINE:?}", args.join(" ")))
        .expect("helm runs");
    if output.status.success() {
        Ok(String::from_utf8(output.stdout).expect("UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// `helm` with `args`: what it printed, or a panic with what it said.
async fn run(args: &[&str]) -> String {
    try_run(args)
        .await
        .unwrap_or_else(|said| panic!("helm {}: {said}", args.join(" ")))
}

/// The documents of a stream of YAML documents, the empty ones left out.
fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .expect("YAML documents")
        .into_iter()
        .filter(|document| !document.is_null())
        .collect()
}

fn with_values<'a>(mut args: Vec<&'a str>, values: &[&'a str]) -> Vec<&'a str> {
    for value in values {
        args.extend(["--set", value]);
    }
    args
}

/// `helm template` of the chart as release `release` in `namespace` with
/// `values` (`key=value`, as `--set` takes them): the YAML and its
/// documents, checked as [`crate::manifests::render`] checks kustomize's.
pub async fn render(release: &str, namespace: &str, values: &[&str]) -> (String, Vec<Value>) {
    try_render(release, namespace, values)
        .await
        .unwrap_or_else(|said| panic!("helm template {release} {values:?}: {said}"))
}

/// [`render`], or what helm said on refusing the values.
pub async fn try_render(
    release: &str,
    namespace: &str,
    values: &[&str],
) -> Result<(String, Vec<Value>), String> {
    let args = with_values(
        vec!["template", release, CHART, "--namespace", namespace],
        values,
    );
    let yaml = try_run(&args).await?;
    let documents = documents(&yaml);
    crate::manifests::assert_health_port_closed(&format!("the chart as {release}"), &documents);
    Ok((yaml, documents))
}

/// `helm install` of the chart on `cp` as release `release` in
/// `namespace` (created), with `values`; returns the release's documents
/// as the API server took them (`helm get manifest`).
pub async fn install(
    cp: &ControlPlane,
    release: &str,
    namespace: &str,
    values: &[&str],
) -> Vec<Value> {
    let kubeconfig = cp.kubeconfig_path().to_string_lossy().into_owned();
    let args = with_values(
        vec![
            "install",
            release,
            CHART,
            "--namespace",
            namespace,
            "--create-namespace",
            "--kubeconfig",
            &kubeconfig,
            // Nothing runs pods here: the release is ready once applied.
            "--timeout",
            "120s",
        ],
        values,
    );
    run(&args).await;
    let manifest = run(&[
        "get",
        "manifest",
        release,
        "--namespace",
        namespace,
        "--kubeconfig",
        &kubeconfig,
    ])
    .await;
    documents(&manifest)
}

/// `helm lint` of the chart with `values`: what it said.
pub async fn lint(values: &[&str]) -> String {
    run(&with_values(vec!["lint", "--strict", CHART], values)).await
}

/// One permission: where it holds (`namespace <name>`, `cluster`, or
/// `bound by the operator` for a ClusterRole nothing among the documents
/// binds), API group, resource, resource name (`*`: any) and verb.
pub type Grant = (String, String, String, String, String);

/// Every permission the roles among `documents` grant, each rule split
/// into single permissions so that two ways of grouping them compare
/// equal.
pub fn grants(documents: &[Value]) -> BTreeSet<Grant> {
    let of_kind = |kind: &'static str| {
        documents
            .iter()
            .filter(move |document| document["kind"] == kind)
    };
    let role = |kind: &str, name: &Value, namespace: Option<&Value>| {
        documents.iter().find(|document| {
            document["kind"] == kind
                && document["metadata"]["name"] == *name
                && namespace.is_none_or(|namespace| document["metadata"]["namespace"] == *namespace)
        })
    };
    let mut granted = BTreeSet::new();
    let mut bound = BTreeSet::new();
    for binding in of_kind("RoleBinding").chain(of_kind("ClusterRoleBinding")) {
        let reference = &binding["roleRef"];
        let namespace = &binding["metadata"]["namespace"];
        let scope = if binding["kind"] == "RoleBinding" {
            format!("namespace {}", namespace.as_str().unwrap_or_default())
        } else {
            "cluster".to_string()
        };
        let kind = reference["kind"].as_str().unwrap_or_default();
        let found = match kind {
            "Role" => role("Role", &reference["name"], Some(namespace)),
            _ => role("ClusterRole", &reference["name"], None),
        };
        let found =
            found.unwrap_or_else(|| panic!("{binding} binds a role not among the documents"));
        bound.insert(found["metadata"]["name"].to_string());
        split(&scope, found, &mut granted);
    }
    for unbound in
        of_kind("ClusterRole").filter(|role| !bound.contains(&role["metadata"]["name"].to_string()))
    {
        split("bound by the operator", unbound, &mut granted);
    }
    granted
}

fn split(scope: &str, role: &Value, into: &mut BTreeSet<Grant>) {
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|values| {
                values
                    .iter()
                    .filter_map(|value| value.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    for rule in role["rules"].as_array().into_iter().flatten() {
        let names = strings(&rule["resourceNames"]);
        let names = if names.is_empty() {
            vec!["*".to_string()]
        } else {
            names
        };
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for name in &names {
                    for verb in strings(&rule["verbs"]) {
                        into.insert((
                            scope.to_string(),
                            group.clone(),
                            resource.clone(),
                            name.clone(),
                            verb,
                        ));
                    }
                }
            }
        }
    }
}
