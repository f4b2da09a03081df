//! What the examples' tests share: checking that a running example copies,
//! stopping it as a deployment would, and running it the way its manifests
//! in `config/` deploy it ([`manifests`]).

pub mod chart;
pub mod manifests;
pub mod readme;
pub mod replica;
pub mod sharding;

use multicluster_runtime::testing::Polled;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, PostParams};

use multicluster_example_configmap_sync::{SYNC_LABEL, copy_name};

/// A Secret `name` holding `kubeconfig` as the kubeconfig provider's
/// defaults read it (labelled `sigs.k8s.io/multicluster-runtime-kubeconfig=true`,
/// data key `kubeconfig`), as `hack/create-kubeconfig-secret.sh` makes one.
pub fn kubeconfig_secret(name: &str, kubeconfig: &kube::config::Kubeconfig) -> Secret {
    use multicluster_provider_kubeconfig::{DEFAULT_DATA_KEY, DEFAULT_LABEL};
    let text = multicluster_envtest::to_yaml(kubeconfig).expect("yaml");
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(DEFAULT_LABEL.to_string(), "true".to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some([(DEFAULT_DATA_KEY.to_string(), ByteString(text.into_bytes()))].into()),
        ..Secret::default()
    }
}

/// The shutdown grace period of the examples' managers (the manager's
/// default).
pub const GRACE: Duration = Duration::from_secs(30);

/// Creates a labelled ConfigMap `name` in `default` of `member` and
/// waits until the example has copied it.
pub async fn wait_for_copy(member: kube::Client, name: &str) {
    wait_for_copy_in(member, "default", name).await;
}

/// Like [`wait_for_copy`], in `namespace`.
pub async fn wait_for_copy_in(member: kube::Client, namespace: &str, name: &str) {
    let configmaps = Api::<ConfigMap>::namespaced(member, namespace);
    let mut source = ConfigMap::default();
    source.metadata.name = Some(name.into());
    source.metadata.labels = Some([(SYNC_LABEL.to_string(), "true".to_string())].into());
    source.data = Some([("colour".to_string(), "blue".to_string())].into());
    configmaps
        .create(&PostParams::default(), &source)
        .await
        .unwrap_or_else(|err| panic!("creating {name}: {err}"));
    multicluster_runtime::testing::eventually(
        Polled::ApiServer,
        &format!("the example to copy {name}"),
        || async {
            configmaps
                .get_opt(&copy_name(name))
                .await
                .ok()
                .flatten()
                .and_then(|copy| copy.data)
                .is_some_and(|data| data.get("colour").map(String::as_str) == Some("blue"))
        },
    )
    .await;
}

/// [`terminate`], and when the example does not exit in time, the end of
/// its `log` in the panic, to say what it was waiting for.
pub async fn terminate_showing_log(
    example: &mut tokio::process::Child,
    within: Duration,
    log: &std::path::Path,
) -> std::process::ExitStatus {
    let pid = example.id().expect("the example is running").to_string();
    let signalled = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(signalled.success(), "SIGTERM to {pid}");
    match tokio::time::timeout(within, example.wait()).await {
        Ok(status) => status.expect("exit status"),
        Err(_) => {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "the example did not exit within {within:?} of SIGTERM; its log ends:\n{}",
                tail.join("\n")
            )
        }
    }
}

/// Sends SIGTERM to `example` and waits for it to exit, at most `within`
/// (panics after that).
pub async fn terminate(
    example: &mut tokio::process::Child,
    within: Duration,
) -> std::process::ExitStatus {
    let pid = example.id().expect("the example is running").to_string();
    let signalled = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(signalled.success(), "SIGTERM to {pid}");
    tokio::time::timeout(within, example.wait())
        .await
        .unwrap_or_else(|_| panic!("the example did not exit within {within:?} of SIGTERM"))
        .expect("exit status")
}

/// The first line `example` writes to its stderr (piped) that `wanted`
/// accepts, waiting at most 30 s; panics with the lines seen otherwise.
pub async fn stderr_line(
    example: &mut tokio::process::Child,
    wanted: impl Fn(&str) -> bool,
) -> String {
    use tokio::io::AsyncBufReadExt;
    let stderr = example.stderr.take().expect("stderr is piped");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if wanted(&line) {
                return Some(line);
            }
            seen.push(line);
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => line,
        _ => panic!(
            "no such line on the example's stderr; it wrote:\n{}",
            seen.join("\n")
        ),
    }
}
