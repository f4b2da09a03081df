//! The test CRDs are upstream's schema: on a real API server, v1alpha2
//! refuses what upstream's v1alpha2 refuses (and v1alpha1 takes), and one
//! stored object reads through both versions.

mod common;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use multicluster_envtest::ControlPlane;
use multicluster_provider_cluster_inventory_api::ApiVersion;
use serde_json::{Value, json};

use common::NS;

fn api(hub: &kube::Client, version: ApiVersion, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(hub.clone(), NS, &version.resource(kind))
}

fn profile(name: &str, version: ApiVersion, spec: Value) -> DynamicObject {
    let mut profile = DynamicObject::new(name, &version.resource("ClusterProfile")).within(NS);
    profile.data = json!({ "spec": spec });
    profile
}

fn access_provider(name: &str, cluster: Value) -> Value {
    json!({"name": name, "cluster": cluster})
}

/// The API server's message for a refused write, or a panic naming what
/// was wrongly accepted.
fn refused<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{what}: {status:?}");
            status.message
        }
        other => panic!("{what} was not refused as invalid: {other:?}"),
    }
}

async fn set_status(
    api: &Api<DynamicObject>,
    name: &str,
    status: Value,
    params: &PatchParams,
) -> Result<DynamicObject, kube::Error> {
    api.patch_status(name, params, &Patch::Merge(json!({ "status": status })))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1alpha2_refuses_what_upstream_refuses_and_reads_what_v1alpha1_stored() {
    let hub_cp = ControlPlane::start().await.expect("hub");
    let hub = common::hub(&hub_cp).await;
    let placement_crd = multicluster_envtest::upstream::placement_decision_crd()
        .await
        .expect("upstream CRD");
    hub_cp.install_crds(&placement_crd).await.expect("CRD");
    let (v1, v2) = (ApiVersion::V1Alpha1, ApiVersion::V1Alpha2);
    let (profiles_v1, profiles_v2) = (
        api(&hub, v1, "ClusterProfile"),
        api(&hub, v2, "ClusterProfile"),
    );
    let post = PostParams::default();
    let merge = PatchParams::default();

    // spec.clusterManager.name must be a label value in v1alpha2 only.
    let bad_manager = json!({"clusterManager": {"name": "not a label value!"}});
    let message = refused(
        "a cluster manager name that is no label value",
        profiles_v2
            .create(&post, &profile("bad-manager", v2, bad_manager.clone()))
            .await,
    );
    assert!(
        message.contains("must be a valid Kubernetes label value"),
        "{message}"
    );
    profiles_v1
        .create(&post, &profile("bad-manager", v1, bad_manager))
        .await
        .expect("v1alpha1 takes any cluster manager name");
    // Immutable in both.
    for api in [&profiles_v1, &profiles_v2] {
        let message = refused(
            "a changed cluster manager",
            api.patch(
                "bad-manager",
                &merge,
                &Patch::Merge(json!({"spec": {"clusterManager": {"name": "other"}}})),
            )
            .await,
        );
        assert!(message.contains("ClusterManager is immutable"), "{message}");
    }

    // One object written through v1alpha1 with what only v1alpha1 has...
    profiles_v1
        .create(
            &post,
            &profile("both", v1, json!({"clusterManager": {"name": "test"}})),
        )
        .await
        .expect("profile");
    let cluster = json!({
        "server": "https://member.example:6443",
        "certificate-authority": "/etc/ssl/member-ca.pem",
    });
    set_status(
        &profiles_v1,
        "both",
        json!({
            "accessProviders": [access_provider("token", cluster.clone())],
            "credentialProviders": [access_provider("legacy", cluster)],
        }),
        &merge,
    )
    .await
    .expect("v1alpha1 status");
    // ... reads through v1alpha2 as a v1alpha2 object: the fields v1alpha2
    // lacks are not there, the rest is.
    let read = profiles_v2
        .get("both")
        .await
        .expect("read through v1alpha2");
    assert_eq!(ApiVersion::of(&read), Some(v2));
    assert_eq!(read.data["spec"]["clusterManager"]["name"], "test");
    let providers = &read.data["status"]["accessProviders"];
    assert_eq!(providers[0]["name"], "token");
    assert_eq!(
        providers[0]["cluster"]["server"],
        "https://member.example:6443"
    );
    assert!(
        providers[0]["cluster"]
            .get("certificate-authority")
            .is_none(),
        "v1alpha2 has no CA file path: {providers}"
    );
    assert!(
        read.data["status"].get("credentialProviders").is_none(),
        "v1alpha2 has no credentialProviders: {}",
        read.data["status"]
    );
    // Through v1alpha1 the stored object is whole.
    let read = profiles_v1
        .get("both")
        .await
        .expect("read through v1alpha1");
    assert_eq!(
        read.data["status"]["credentialProviders"][0]["name"],
        "legacy"
    );
    assert_eq!(
        read.data["status"]["accessProviders"][0]["cluster"]["certificate-authority"],
        "/etc/ssl/member-ca.pem"
    );

    // Access providers: rules v1alpha2 adds.
    profiles_v2
        .create(
            &post,
            &profile("checked", v2, json!({"clusterManager": {"name": "test"}})),
        )
        .await
        .expect("v1alpha2 profile");
    let with_cluster =
        |cluster: Value| json!({"accessProviders": [access_provider("token", cluster)]});
    for (what, cluster, expected) in [
        (
            "a server that is not a URL",
            json!({"server": "member.example:6443"}),
            "server must be a valid absolute URL with a host",
        ),
        (
            "a server without a host",
            json!({"server": "https://"}),
            "server must be a valid absolute URL with a host",
        ),
        (
            "an ftp proxy",
            json!({"server": "https://member.example", "proxy-url": "ftp://proxy.example"}),
            "proxy-url must be a valid URL with scheme http, https, or socks5 and a host",
        ),
        (
            "a TLS server name longer than 253",
            json!({"server": "https://member.example", "tls-server-name": "a".repeat(254)}),
            "Too long",
        ),
        (
            "two extensions of one name",
            json!({"server": "https://member.example", "extensions": [
                {"name": "x", "extension": {}},
                {"name": "x", "extension": {"y": 1}},
            ]}),
            "Duplicate value",
        ),
    ] {
        let message = refused(
            what,
            set_status(
                &profiles_v2,
                "checked",
                with_cluster(cluster.clone()),
                &merge,
            )
            .await,
        );
        assert!(message.contains(expected), "{what}: {message}");
        // v1alpha1 has none of these rules.
        set_status(&profiles_v1, "checked", with_cluster(cluster), &merge)
            .await
            .unwrap_or_else(|err| panic!("v1alpha1 refused {what}: {err}"));
    }
    let sixty_five: Vec<Value> = (0..65)
        .map(|i| {
            access_provider(
                &format!("p{i}"),
                json!({"server": "https://member.example"}),
            )
        })
        .collect();
    let message = refused(
        "a 65th access provider",
        set_status(
            &profiles_v2,
            "checked",
            json!({"accessProviders": sixty_five}),
            &merge,
        )
        .await,
    );
    assert!(message.contains("must have at most 64 items"), "{message}");
    // A CA file path is an unknown field of v1alpha2: refused when the
    // writer asks for strict validation, dropped otherwise.
    let with_ca_file = with_cluster(json!({
        "server": "https://member.example",
        "certificate-authority": "/etc/ssl/member-ca.pem",
    }));
    let message = match set_status(
        &profiles_v2,
        "checked",
        with_ca_file.clone(),
        &PatchParams {
            field_validation: Some(kube::api::ValidationDirective::Strict),
            ..PatchParams::default()
        },
    )
    .await
    {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("a CA file path was not refused under strict validation: {other:?}"),
    };
    assert!(message.contains("unknown field"), "{message}");
    assert!(message.contains("certificate-authority"), "{message}");
    let kept = set_status(&profiles_v2, "checked", with_ca_file, &merge)
        .await
        .expect("dropped, not refused, without strict validation");
    assert!(
        kept.data["status"]["accessProviders"][0]["cluster"]
            .get("certificate-authority")
            .is_none()
    );

    // PlacementDecisions.
    let (decisions_v1, decisions_v2) = (
        api(&hub, v1, "PlacementDecision"),
        api(&hub, v2, "PlacementDecision"),
    );
    let decision = |name: &str, version: ApiVersion, data: Value| {
        let mut slice = DynamicObject::new(name, &version.resource("PlacementDecision")).within(NS);
        slice.data = data;
        slice
    };
    let refs = |n: usize| -> Value {
        (0..n)
            .map(|i| json!({"clusterProfileRef": {"name": format!("c{i}")}}))
            .collect()
    };
    for (what, data, expected) in [
        (
            "101 decisions",
            json!({"decisions": refs(101)}),
            "must have at most 100 items",
        ),
        (
            "no decisions field",
            json!({"schedulerName": "s"}),
            "decisions: Required value",
        ),
        (
            "a profile name that is no DNS-1123 subdomain",
            json!({"decisions": [{"clusterProfileRef": {"name": "Not_A_Name"}}]}),
            "must be a DNS-1123 subdomain",
        ),
        (
            "a profile namespace that is no DNS-1123 label",
            json!({"decisions": [{"clusterProfileRef": {"name": "a", "namespace": "a.b"}}]}),
            "must be empty or a DNS-1123 label",
        ),
    ] {
        let message = refused(
            what,
            decisions_v2
                .create(&post, &decision("refused", v2, data))
                .await,
        );
        assert!(message.contains(expected), "{what}: {message}");
    }
    // The names v1alpha2 refuses are v1alpha1's to take.
    decisions_v1
        .create(
            &post,
            &decision(
                "loose",
                v1,
                json!({"decisions": [{"clusterProfileRef": {"name": "Not_A_Name", "namespace": "a.b"}}]}),
            ),
        )
        .await
        .expect("v1alpha1 takes any reference");
    let full = decisions_v2
        .create(
            &post,
            &decision("full", v2, json!({"decisions": refs(100)})),
        )
        .await
        .expect("100 decisions");
    assert_eq!(full.data["decisions"].as_array().map(Vec::len), Some(100));
}
