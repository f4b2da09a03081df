//! `config/webhook`: the manifests render with `kubectl kustomize` and
//! apply (the hub's to the hub, the member's ClusterRole to a member); the
//! example, run with the Deployment's flags and environment as its
//! ServiceAccount, with a member identity bound to that ClusterRole only,
//! registers itself in the member and refuses what it should there — and
//! neither identity may do more.

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::{ControlPlane, ServingFiles};
use multicluster_example_testing::manifests::{
    Container, apply, can_i, container, may_not, render, run_as_deployed, stop_all,
};
use multicluster_provider_kubeconfig::DEFAULT_LABEL;
use multicluster_runtime::testing::eventually;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-webhook");
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/webhook");
const REGISTRAR: &str = "webhook-registrar";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_deploy_with_the_least_privilege_on_hub_and_member() {
    let (hub, member) = tokio::join!(ControlPlane::start(), ControlPlane::start());
    let (hub, member) = (hub.expect("hub"), member.expect("member"));
    let dir = tempfile::tempdir().expect("dir");

    let (hub_yaml, hub_documents) = render(&format!("{CONFIG}/base")).await;
    apply(&hub, &hub_yaml).await;
    let (member_yaml, _) = render(&format!("{CONFIG}/member")).await;
    apply(&member, &member_yaml).await;

    // The member's identity: a service account bound to the ClusterRole.
    let token = member
        .service_account_token("default", REGISTRAR, Duration::from_secs(3600))
        .await
        .expect("token");
    member
        .bind_cluster_role("multicluster-webhook-registration", "default", REGISTRAR)
        .await
        .expect("bind");
    let kubeconfig = member.token_kubeconfig("registrar", token);
    let mut deployed = container(&hub_documents);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("member".into()),
            namespace: Some(deployed.namespace.clone()),
            labels: Some(BTreeMap::from([(
                DEFAULT_LABEL.to_string(),
                "true".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(
                multicluster_envtest::to_yaml(&kubeconfig)
                    .expect("yaml")
                    .into_bytes(),
            ),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(hub.client().await.expect("hub"), &deployed.namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");

    // Here, not in a cluster: the webhook on a free loopback port, its
    // certificate in a directory of files as the Secret volume would be.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let certificates = dir.path().join("certs");
    std::fs::create_dir(&certificates).expect("dir");
    ServingFiles::generate(&certificates).expect("certificates");
    for arg in &mut deployed.args {
        if arg.starts_with("--webhook-address=") {
            *arg = format!("--webhook-address=127.0.0.1:{port}");
        }
    }
    for (name, value) in &mut deployed.env {
        match name.as_str() {
            "WEBHOOK_URL" => *value = format!("https://127.0.0.1:{port}"),
            "CERT_DIR" => *value = certificates.display().to_string(),
            _ => {}
        }
    }
    let (mut example, _) = run_as_deployed(BINARY, &hub, &deployed, dir.path()).await;

    // It works with that RBAC: registered in the member, refusing there.
    let member_admin = member.client().await.expect("member");
    eventually(
        Polled::ApiServer,
        "an unowned ConfigMap refused in the member",
        || async {
            let object = ConfigMap {
                metadata: ObjectMeta {
                    name: Some("plain".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            };
            Api::<ConfigMap>::namespaced(member_admin.clone(), "default")
                .create(&PostParams::default(), &object)
                .await
                .is_err_and(|err| err.to_string().contains("has no fleet.example/owner label"))
        },
    )
    .await;

    // And no more. On the hub: reading its own Secrets.
    assert!(
        can_i(
            &hub,
            &deployed,
            &["list", "secrets", "-n", &deployed.namespace]
        )
        .await
    );
    may_not(
        &hub,
        &deployed,
        &[
            vec!["get", "secrets", "-n", "kube-system"],
            vec!["create", "secrets", "-n", deployed.namespace.as_str()],
            vec!["create", "validatingwebhookconfigurations"],
            vec!["create", "leases", "-n", deployed.namespace.as_str()],
        ],
    )
    .await;
    // In the member: its own configurations, by name.
    let registrar = Container {
        namespace: "default".to_string(),
        service_account: REGISTRAR.to_string(),
        args: Vec::new(),
        env: Vec::new(),
    };
    assert!(
        can_i(
            &member,
            &registrar,
            &[
                "delete",
                "validatingwebhookconfigurations/multicluster-runtime-webhooks"
            ]
        )
        .await
    );
    may_not(
        &member,
        &registrar,
        &[
            vec!["update", "validatingwebhookconfigurations/someone-elses"],
            vec!["delete", "mutatingwebhookconfigurations/someone-elses"],
            vec!["list", "validatingwebhookconfigurations"],
            vec!["list", "configmaps", "-n", "default"],
            vec!["get", "secrets", "-n", "default"],
        ],
    )
    .await;

    stop_all(&mut [&mut example]).await;
}
