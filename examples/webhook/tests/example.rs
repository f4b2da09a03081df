//! The example binary against a real hub and two members: the first member
//! refuses an unowned ConfigMap with the webhook's message, the second is
//! registered when its Secret appears and refuses too, and SIGTERM stops
//! the example within its grace. With the defaults (`Fail`, `kube-system`
//! exempt), the policy holds while the server is down, and `kube-system`
//! stays writable.

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use multicluster_envtest::{ControlPlane, ServingFiles};
use multicluster_example_testing::{GRACE, kubeconfig_secret, terminate};
use multicluster_runtime::testing::eventually;
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_multicluster-example-webhook");

async fn create(client: &kube::Client, name: &str, owner: Option<&str>) -> Result<(), String> {
    create_in(client, "default", name, owner).await
}

async fn create_in(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    owner: Option<&str>,
) -> Result<(), String> {
    let object = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: owner.map(|owner| {
                BTreeMap::from([("fleet.example/owner".to_string(), owner.to_string())])
            }),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .map(|_| ())
        .map_err(|err| err.to_string())
}

async fn registered(client: &kube::Client) -> bool {
    !Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_refuse_unowned_config_maps_once_registered() {
    let (hub, first, second) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub, first, second) = (
        hub.expect("hub"),
        first.expect("first"),
        second.expect("second"),
    );
    let hub_client = hub.client().await.expect("hub");
    let (first_client, second_client) = (
        first.client().await.expect("first"),
        second.client().await.expect("second"),
    );
    let secrets = Api::<Secret>::namespaced(hub_client.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret("first", first.kubeconfig()),
        )
        .await
        .expect("secret");
    let certificates = tempfile::tempdir().expect("dir");
    ServingFiles::generate(certificates.path()).expect("certificates");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();

    let mut example = Command::new(BINARY)
        .args(["--namespace", "default", "--health-address", "127.0.0.1:0"])
        .args(["--webhook-address", &format!("127.0.0.1:{port}")])
        .args(["--webhook-url", &format!("https://127.0.0.1:{port}")])
        .arg("--cert-dir")
        .arg(certificates.path())
        .env("KUBECONFIG", hub.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example");

    eventually(Polled::ApiServer, "the first member registered", || {
        registered(&first_client)
    })
    .await;
    let refused = create(&first_client, "plain", None)
        .await
        .expect_err("an unowned ConfigMap");
    assert!(
        refused
            .contains("ConfigMap default/plain in cluster first has no fleet.example/owner label"),
        "{refused}"
    );
    create(&first_client, "owned", Some("team-a"))
        .await
        .expect("an owned ConfigMap");

    // A member that joins later is registered without a restart.
    assert!(!registered(&second_client).await);
    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret("second", second.kubeconfig()),
        )
        .await
        .expect("secret");
    eventually(Polled::ApiServer, "the second member registered", || {
        registered(&second_client)
    })
    .await;
    let refused = create(&second_client, "plain", None)
        .await
        .expect_err("an unowned ConfigMap");
    assert!(refused.contains("in cluster second"), "{refused}");

    let status = terminate(&mut example, GRACE + Duration::from_secs(5)).await;
    assert!(status.success(), "{status}");

    // The server is gone, its registrations stay: writes it would check
    // are refused, kube-system's are not.
    let refused = create(&first_client, "while-down", Some("team-a"))
        .await
        .expect_err("refused while the server is down");
    assert!(refused.contains("failed calling webhook"), "{refused}");
    create_in(&first_client, "kube-system", "while-down", None)
        .await
        .expect("kube-system is exempt");
}
