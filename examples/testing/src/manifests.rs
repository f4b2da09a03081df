//! The manifests in `config/`, tested as deployed: rendered with `kubectl
//! kustomize`, applied to a real API server, and the example run here with
//! the Deployment's flags and environment as its ServiceAccount.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use multicluster_envtest::ControlPlane;
use multicluster_runtime::testing::{Polled, http_get, poll_within};
use serde_json::Value;
use tokio::process::Command;

/// `kubectl kustomize` of `dir`: the YAML and its documents. Checks on the
/// way that no Deployment's health port (`/clusters`, `/metrics`) is open
/// to every pod: a NetworkPolicy selects its pods and lets only selected
/// sources reach that port.
pub async fn render(dir: &str) -> (String, Vec<Value>) {
    let output = Command::new("kubectl")
        .args(["kustomize", dir])
        .output()
        .await
        .expect("kubectl runs (install the kubernetes-client package)");
    assert!(
        output.status.success(),
        "kustomize {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let yaml = String::from_utf8(output.stdout).expect("UTF-8");
    let documents = serde_saphyr::from_multiple::<Value>(&yaml).expect("YAML documents");
    assert_health_port_closed(dir, &documents);
    (yaml, documents)
}

/// Panics unless every Deployment among `documents` has a NetworkPolicy
/// in its namespace selecting its pods, through which the port named
/// `health` is reached only from the sources it names.
pub(crate) fn assert_health_port_closed(dir: &str, documents: &[Value]) {
    let of_kind = |kind: &'static str| {
        documents
            .iter()
            .filter(move |document| document["kind"] == kind)
    };
    for deployment in of_kind("Deployment") {
        let namespace = &deployment["metadata"]["namespace"];
        let labels = deployment["spec"]["template"]["metadata"]["labels"]
            .as_object()
            .expect("pod labels");
        let selects = |policy: &Value| {
            policy["metadata"]["namespace"] == *namespace
                && policy["spec"]["podSelector"]["matchLabels"]
                    .as_object()
                    .is_some_and(|wanted| {
                        wanted
                            .iter()
                            .all(|(key, value)| labels.get(key) == Some(value))
                    })
        };
        let policies: Vec<&Value> = of_kind("NetworkPolicy")
            .filter(|policy| selects(policy))
            .collect();
        assert!(
            !policies.is_empty(),
            "{dir}: no NetworkPolicy selects the pods of {deployment}"
        );
        for policy in policies {
            for rule in policy["spec"]["ingress"].as_array().into_iter().flatten() {
                let ports = rule["ports"].as_array();
                let reaches_health =
                    ports.is_none_or(|ports| ports.iter().any(|port| port["port"] == "health"));
                let from_anywhere = rule["from"].as_array().is_none_or(Vec::is_empty);
                assert!(
                    !(reaches_health && from_anywhere),
                    "{dir}: the health port is open to every source: {rule}"
                );
            }
        }
    }
}

/// `kubectl apply` of `yaml` as the admin of `cp`.
pub async fn apply(cp: &ControlPlane, yaml: &str) {
    use tokio::io::AsyncWriteExt;
    let mut kubectl = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    let mut stdin = kubectl.stdin.take().expect("stdin");
    stdin.write_all(yaml.as_bytes()).await.expect("write");
    drop(stdin);
    let output = kubectl.wait_with_output().await.expect("kubectl");
    assert!(
        output.status.success(),
        "apply: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        cp.api_server_report()
    );
}

/// The one object of `kind` among `documents`.
pub fn object<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    documents
        .iter()
        .find(|document| document["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"))
}

/// What the Deployment runs: its namespace, ServiceAccount, args and plain
/// environment, with fieldRef values and `$(VAR)` references in args
/// resolved as the kubelet would (the pod is named `<deployment>-0`).
pub struct Container {
    /// The Deployment's namespace.
    pub namespace: String,
    /// Its ServiceAccount.
    pub service_account: String,
    /// The container's args.
    pub args: Vec<String>,
    /// The container's environment.
    pub env: Vec<(String, String)>,
}

/// What the Deployment among `documents` runs.
pub fn container(documents: &[Value]) -> Container {
    of_deployment(object(documents, "Deployment"))
}

/// What each Deployment among `documents` runs, in order.
pub fn containers(documents: &[Value]) -> Vec<Container> {
    documents
        .iter()
        .filter(|document| document["kind"] == "Deployment")
        .map(of_deployment)
        .collect()
}

fn of_deployment(deployment: &Value) -> Container {
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .expect("namespace")
        .to_string();
    let pod_name = format!(
        "{}-0",
        deployment["metadata"]["name"].as_str().expect("name")
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let spec = &pod["containers"][0];
    let env: Vec<(String, String)> = spec["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|var| {
            let name = var["name"].as_str().expect("name").to_string();
            let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => namespace.clone(),
                Some("metadata.name") => pod_name.clone(),
                Some(other) => panic!("unexpected fieldRef {other}"),
                None => var["value"].as_str().unwrap_or_default().to_string(),
            };
            (name, value)
        })
        .collect();
    let args = spec["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|arg| arg.as_str())
        .map(|arg| expand(arg, &env))
        .collect();
    Container {
        service_account: pod["serviceAccountName"]
            .as_str()
            .expect("service account")
            .to_string(),
        namespace,
        args,
        env,
    }
}

/// `arg` with each `$(NAME)` of a variable in `env` replaced by its value,
/// as the kubelet expands container args.
fn expand(arg: &str, env: &[(String, String)]) -> String {
    env.iter().fold(arg.to_string(), |arg, (name, value)| {
        arg.replace(&format!("$({name})"), value)
    })
}

/// Runs the example as the Deployment would, but here: as its
/// ServiceAccount (a TokenRequest token), with its args and environment,
/// serving health on a free local port. First asserts that the
/// ServiceAccount may write nothing in a system namespace
/// ([`SYSTEM_NAMESPACES`]).
pub async fn run_as_deployed(
    binary: &str,
    management: &ControlPlane,
    container: &Container,
    dir: &Path,
) -> (tokio::process::Child, std::net::SocketAddr) {
    writes_nowhere_in_system_namespaces(management, container).await;
    let token = management
        .service_account_token(
            &container.namespace,
            &container.service_account,
            Duration::from_secs(3600),
        )
        .await
        .expect("token");
    let kubeconfig = dir.join(format!("{}.kubeconfig", container.namespace));
    std::fs::write(
        &kubeconfig,
        multicluster_envtest::to_yaml(&management.token_kubeconfig("deployed", token))
            .expect("yaml"),
    )
    .expect("kubeconfig");
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        listener.local_addr().expect("address")
    };
    let args: Vec<String> = container
        .args
        .iter()
        .map(|arg| {
            if arg.starts_with("--health-address=") {
                format!("--health-address={address}")
            } else {
                arg.clone()
            }
        })
        .collect();
    let child = Command::new(binary)
        .args(&args)
        .envs(container.env.iter().cloned())
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");
    (child, address)
}

/// The namespaces Kubernetes keeps for itself, where no example may write.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// Verbs that change something.
const WRITES: [&str; 9] = [
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
    "*",
];

/// Asserts that the ServiceAccount may write nothing in any of
/// [`SYSTEM_NAMESPACES`], by every rule `kubectl auth can-i --list` finds
/// for it there (cluster-wide grants included), but the reviews every
/// authenticated user may create.
pub async fn writes_nowhere_in_system_namespaces(management: &ControlPlane, container: &Container) {
    for namespace in SYSTEM_NAMESPACES {
        let answer = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(management.kubeconfig_path())
            .args(["auth", "can-i", "--list", "--no-headers", "-n", namespace])
            .arg(format!(
                "--as=system:serviceaccount:{}:{}",
                container.namespace, container.service_account
            ))
            .output()
            .await
            .expect("kubectl");
        assert!(
            answer.status.success(),
            "kubectl auth can-i --list: {answer:?}"
        );
        let rules = String::from_utf8_lossy(&answer.stdout);
        let writes: Vec<&str> = rules
            .lines()
            .filter(|rule| {
                let resource = rule.split_whitespace().next().unwrap_or_default();
                let reviews = resource.starts_with("selfsubject")
                    && (resource.ends_with(".authorization.k8s.io")
                        || resource.ends_with(".authentication.k8s.io"));
                let verbs = rule
                    .rsplit_once('[')
                    .map(|(_, verbs)| verbs.trim_end_matches(']'))
                    .unwrap_or_default();
                !reviews && verbs.split_whitespace().any(|verb| WRITES.contains(&verb))
            })
            .collect();
        assert!(
            writes.is_empty(),
            "{} may write in {namespace}:\n{}",
            container.service_account,
            writes.join("\n")
        );
    }
}

/// Binds the ClusterRole `cluster_role` to the container's
/// ServiceAccount in `namespace` (a RoleBinding named after the role), as
/// an operator does when a namespace joins a fleet whose writes are
/// granted per namespace.
pub async fn bind_in(
    management: &ControlPlane,
    namespace: &str,
    cluster_role: &str,
    container: &Container,
) {
    use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
    let binding = RoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(cluster_role.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: cluster_role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: container.service_account.clone(),
            namespace: Some(container.namespace.clone()),
            ..Default::default()
        }]),
    };
    kube::Api::<RoleBinding>::namespaced(management.client().await.expect("client"), namespace)
        .create(&kube::api::PostParams::default(), &binding)
        .await
        .expect("role binding");
}

/// What `kubectl auth can-i` says for the ServiceAccount.
pub async fn can_i(management: &ControlPlane, container: &Container, what: &[&str]) -> bool {
    let answer = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(management.kubeconfig_path())
        .args(["auth", "can-i"])
        .args(what)
        .arg(format!(
            "--as=system:serviceaccount:{}:{}",
            container.namespace, container.service_account
        ))
        .output()
        .await
        .expect("kubectl");
    String::from_utf8_lossy(&answer.stdout).trim() == "yes"
}

/// The clusters (the local one aside) the example at `address` lists on
/// `/clusters`, sorted.
pub async fn engaged(address: std::net::SocketAddr) -> Vec<String> {
    let (_, body) = http_get(address, "/clusters").await.unwrap_or_default();
    let mut names: Vec<String> = body
        .lines()
        .filter_map(|line| line.split('\t').next())
        .filter(|name| !name.is_empty() && *name != "<local>")
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

/// Waits (60 s at most) until each example at `address` lists exactly its
/// `expected` clusters on `/clusters`; panics with what they listed last.
/// Polled ([`Polled::OtherProcess`]): the examples are other processes.
pub async fn wait_until_engaged(instances: &[(std::net::SocketAddr, Vec<String>)]) {
    let engaged_apart = poll_within(Duration::from_secs(60), Polled::OtherProcess, || async {
        let mut seen = Vec::new();
        for (address, _) in instances {
            seen.push(engaged(*address).await);
        }
        let apart = seen
            .iter()
            .zip(instances)
            .all(|(listed, (_, expected))| listed == expected);
        if apart {
            Ok(())
        } else {
            Err(format!("they listed {seen:?}"))
        }
    })
    .await;
    if let Err(seen) = engaged_apart {
        panic!("each instance engages exactly its own clusters; {seen}");
    }
}

/// Asserts that the ServiceAccount may do none of `what` (each a
/// `kubectl auth can-i` argument list).
pub async fn may_not(management: &ControlPlane, container: &Container, what: &[Vec<&str>]) {
    for what in what {
        assert!(
            !can_i(management, container, what).await,
            "{} may {what:?}",
            container.service_account
        );
    }
}

/// Stops each example with SIGTERM, as a Deployment's rollout does, and
/// asserts it exits cleanly within the grace period.
pub async fn stop_all(examples: &mut [&mut tokio::process::Child]) {
    for example in examples.iter_mut() {
        let status = crate::terminate(example, crate::GRACE + Duration::from_secs(5)).await;
        assert!(status.success(), "{status}");
    }
}
