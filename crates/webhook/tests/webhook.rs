//! Admission webhooks across a fleet, called by real kube-apiservers over
//! HTTPS on loopback: one server answers every member with that member's
//! cluster, registers itself in members as they join and leave, follows a
//! replaced certificate, and answers a hung handler within its deadline.

use multicluster_runtime::testing::Polled;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use multicluster_envtest::{ControlPlane, ServingFiles};
use multicluster_runtime::testing::{TestProvider, eventually, run_manager};
use multicluster_runtime::{Cluster, ClusterName, Manager};
use multicluster_webhook::{
    Registration, RegistrationOptions, Webhook, WebhookServer, WebhookServerOptions,
};

/// A cluster built from a control plane's admin kubeconfig.
async fn cluster_for(name: &str, cp: &ControlPlane) -> Cluster {
    Cluster::new(name, cp.client().await.expect("client"))
}

const OWNER: &str = "owner";
/// A member holding a ConfigMap of this name in a namespace accepts
/// unowned ConfigMaps there.
const EXEMPTION: &str = "unowned-allowed";
const CONFIGURATION: &str = "multicluster-runtime-webhooks";

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(String);

fn owner_label() -> Webhook {
    Webhook::validating(
        "owner-label",
        |cluster: Cluster, request: AdmissionRequest<ConfigMap>| async move {
            let response = AdmissionResponse::from(&request);
            let Some(object) = &request.object else {
                return Ok::<_, Failed>(response);
            };
            let name = object.name_any();
            if name.starts_with("hang-") {
                std::future::pending::<()>().await;
            }
            if object.labels().contains_key(OWNER) {
                return Ok(response);
            }
            let exempt = cluster
                .cache()
                .informer::<ConfigMap>()
                .get(request.namespace.as_deref(), EXEMPTION)
                .is_some();
            if exempt {
                return Ok(response);
            }
            Ok(response.deny(format!(
                "ConfigMap {name} in cluster {} has no {OWNER} label",
                cluster.name()
            )))
        },
    )
}

fn stamp() -> Webhook {
    Webhook::mutating(
        "stamp",
        |cluster: Cluster, request: AdmissionRequest<ConfigMap>| async move {
            let response = AdmissionResponse::from(&request);
            let has_labels = request
                .object
                .as_ref()
                .is_some_and(|object| object.metadata.labels.is_some());
            let value = serde_json::Value::String(cluster.name().to_string());
            let operation = if has_labels {
                json_patch::PatchOperation::Add(json_patch::AddOperation {
                    path: json_patch::jsonptr::PointerBuf::from_tokens([
                        "metadata",
                        "labels",
                        "stamped-by",
                    ]),
                    value,
                })
            } else {
                json_patch::PatchOperation::Add(json_patch::AddOperation {
                    path: json_patch::jsonptr::PointerBuf::from_tokens(["metadata", "labels"]),
                    value: serde_json::json!({"stamped-by": value}),
                })
            };
            response
                .with_patch(json_patch::Patch(vec![operation]))
                .map_err(|err| Failed(err.to_string()))
        },
    )
}

fn config_map(name: &str, owner: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: owner.map(|owner| BTreeMap::from([(OWNER.to_string(), owner.to_string())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Creates `object` in `default` without keeping it (a dry run, which
/// admission webhooks without side effects see as any create).
async fn try_create(client: &kube::Client, object: &ConfigMap) -> Result<ConfigMap, String> {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&dry_run, object)
        .await
        .map_err(|err| err.to_string())
}

async fn registered(client: &kube::Client) -> bool {
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get_opt(CONFIGURATION)
        .await
        .expect("get")
        .is_some()
}

/// Waits, watching it, until the member's webhook configuration
/// satisfies `that` (`None`: it is not there).
async fn until_configuration(
    client: &kube::Client,
    what: &str,
    that: impl Fn(Option<&ValidatingWebhookConfiguration>) -> bool,
) {
    let configurations = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    multicluster_runtime::testing::wait_for_object(&configurations, CONFIGURATION, what, that)
        .await;
}

/// Waits until the member has the webhook configuration (`true`) or has
/// none (`false`).
async fn until_registered(client: &kube::Client, registered: bool, what: &str) {
    until_configuration(client, what, |configuration| {
        configuration.is_some() == registered
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_answers_every_member_with_its_own_cluster() {
    let (hub, a, b, c) = tokio::join!(
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start(),
        ControlPlane::start()
    );
    let (hub, a, b, c) = (
        hub.expect("hub"),
        a.expect("a"),
        b.expect("b"),
        c.expect("c"),
    );
    let (a_client, b_client, c_client) = (
        a.client().await.expect("a"),
        b.client().await.expect("b"),
        c.client().await.expect("c"),
    );
    let certificates = tempfile::tempdir().expect("dir");
    let files = ServingFiles::generate(certificates.path()).expect("certificates");

    let provider = Arc::new(TestProvider::default());
    for (name, cp) in [("a", &a), ("b", &b)] {
        provider
            .clusters
            .add(name, cluster_for(name, cp).await)
            .expect("add");
    }
    let manager = Manager::builder(cluster_for("hub", &hub).await)
        .provider(provider.clone())
        .build();
    // The default deadline (9 s) and CA check (10 s): what the README
    // promises, with nothing made faster for the test.
    let server =
        WebhookServer::new(WebhookServerOptions::default().certificate(&files.cert, &files.key))
            .expect("server");
    server.add(owner_label()).expect("webhook");
    server.add(stamp()).expect("webhook");
    server.use_metrics(manager.metrics());
    let running = serve_and_register(&manager, &server, &files, |options| {
        options.include_local = true;
        // The CA file's directory is watched: a new CA must be seen long
        // before this.
        options.ca_check = std::time::Duration::from_secs(3600);
    })
    .await;

    // Registered in both members; a refused in a with the handler's
    // message; an owned one admitted and stamped with its cluster.
    let hub_client = hub.client().await.expect("hub");
    until_registered(&a_client, true, "registration in a").await;
    until_registered(&b_client, true, "registration in b").await;
    until_registered(&hub_client, true, "registration in the hub").await;
    let refused = try_create(&hub_client, &config_map("plain", None))
        .await
        .expect_err("an unowned ConfigMap on the hub");
    assert!(
        refused.contains("ConfigMap plain in cluster hub has no owner label"),
        "{refused}"
    );
    let refused = try_create(&a_client, &config_map("plain", None))
        .await
        .expect_err("an unowned ConfigMap in a");
    assert!(
        refused.contains("ConfigMap plain in cluster a has no owner label"),
        "{refused}"
    );
    let admitted = try_create(&a_client, &config_map("owned", Some("team")))
        .await
        .expect("an owned ConfigMap in a");
    assert_eq!(
        admitted.labels().get("stamped-by").map(String::as_str),
        Some("a")
    );

    // b holds the exemption (the handler reads b's cache): the same
    // ConfigMap is admitted there, stamped with b.
    Api::<ConfigMap>::namespaced(b_client.clone(), "default")
        .create(&PostParams::default(), &config_map(EXEMPTION, Some("team")))
        .await
        .expect("exemption");
    eventually(
        Polled::ApiServer,
        "an unowned ConfigMap admitted in b",
        || async {
            try_create(&b_client, &config_map("plain", None))
                .await
                .is_ok_and(|cm| cm.labels().get("stamped-by").map(String::as_str) == Some("b"))
        },
    )
    .await;

    // A hung handler is answered at the default deadline (9 s, 503): the
    // failure policy (Fail) refuses the request before the API server's own
    // 10 s pass.
    let hung = try_create(&a_client, &config_map("hang-1", None))
        .await
        .expect_err("a request whose handler hangs");
    assert!(
        hung.contains("owner-label") && hung.contains("unable to handle the request"),
        "{hung}"
    );
    assert!(
        !hung.contains("context deadline exceeded"),
        "the API server's own deadline passed: {hung}"
    );

    // c joins: registered; leaves: unregistered.
    provider
        .clusters
        .add("c", cluster_for("c", &c).await)
        .expect("add c");
    until_registered(&c_client, true, "registration in c").await;
    let refused = try_create(&c_client, &config_map("plain", None))
        .await
        .expect_err("an unowned ConfigMap in c");
    assert!(
        refused.contains("in cluster c has no owner label"),
        "{refused}"
    );
    provider.clusters.remove(&ClusterName::from("c"));
    until_registered(&c_client, false, "no registration in c").await;
    // The API server follows webhook configurations through a watch of
    // its own: it may call the webhook for a moment after the removal
    // (and our server, no longer serving c, answers 404 meanwhile).
    eventually(Polled::ApiServer, "c no longer checked", || async {
        try_create(&c_client, &config_map("plain", None))
            .await
            .is_ok()
    })
    .await;

    // A new CA and serving pair: served at the next handshake and
    // registered with the new CA; only both together let the handler
    // answer again.
    let old_ca = std::fs::read(&files.ca).expect("CA");
    ServingFiles::generate(certificates.path()).expect("new certificates");
    let new_ca = std::fs::read(&files.ca).expect("CA");
    assert_ne!(old_ca, new_ca);
    until_configuration(&a_client, "the new CA registered in a", |configuration| {
        configuration.is_some_and(|configuration| {
            configuration.webhooks.iter().flatten().all(|webhook| {
                webhook
                    .client_config
                    .ca_bundle
                    .as_ref()
                    .is_some_and(|ca| ca.0 == new_ca)
            })
        })
    })
    .await;
    eventually(
        Polled::ApiServer,
        "the handler answering with the new certificate",
        || async {
            try_create(&a_client, &config_map("plain", None))
                .await
                .is_err_and(|err| err.contains("in cluster a has no owner label"))
        },
    )
    .await;

    let metrics = manager.metrics().encode();
    for line in [
        r#"mcr_webhook_requests_total{webhook="owner-label",result="denied"}"#,
        r#"mcr_webhook_requests_total{webhook="owner-label",result="timeout"}"#,
        r#"mcr_webhook_requests_total{webhook="stamp",result="allowed"}"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }

    running.stop().await;
    // Stopping keeps the members' registrations (the default).
    assert!(registered(&a_client).await);
}

/// A manager running with `server` serving on a loopback port and
/// registered in its members.
struct Running {
    registration: Registration,
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), multicluster_runtime::Error>>,
    serving: tokio::task::JoinHandle<()>,
}

/// Binds a loopback port, registers `server` there (the options from
/// `files`'s CA, then `adjust`), adds both to `manager` and runs it.
async fn serve_and_register(
    manager: &Manager,
    server: &WebhookServer,
    files: &ServingFiles,
    adjust: impl FnOnce(&mut RegistrationOptions),
) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let mut options = RegistrationOptions::new(format!("https://127.0.0.1:{port}"), &files.ca);
    adjust(&mut options);
    let registration = Registration::new(manager, server, options).expect("registration");
    manager.add(Arc::new(server.clone())).expect("add server");
    manager
        .add(Arc::new(registration.clone()))
        .expect("add registration");
    let (shutdown, task) = run_manager(manager);
    let serving = tokio::spawn({
        let (server, shutdown) = (server.clone(), shutdown.clone());
        async move { server.serve(listener, shutdown).await }
    });
    Running {
        registration,
        shutdown,
        task,
        serving,
    }
}

impl Running {
    /// Stops the manager and the server, and waits for the registration's
    /// work in the members (`remove_on_shutdown` deletions).
    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("task").expect("clean stop");
        self.serving.await.expect("server stopped");
        self.registration.stopped().await;
    }
}

/// An HTTPS client trusting the CA in `ca`.
fn https_client(
    ca: &std::path::Path,
) -> hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<hyper::body::Bytes>,
> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA") {
        roots.add(cert.expect("CA certificate")).expect("root");
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector)
}

/// Requests the API server never sends are answered with the codes the
/// module documents, so a misdirected or malformed call leaves the
/// decision to the failure policy; a well-formed review is answered with
/// its uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outside_admission_get_the_documented_answers() {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use multicluster_runtime::Aware;

    let member = ControlPlane::start().await.expect("member");
    let certificates = tempfile::tempdir().expect("dir");
    let files = ServingFiles::generate(certificates.path()).expect("certificates");
    let mut options = WebhookServerOptions::default().certificate(&files.cert, &files.key);
    // Small enough that a body over it fits the socket buffers: the client
    // finishes writing and reads the answer, sent before the body is read.
    options.max_request_bytes = 64 * 1024;
    let server = WebhookServer::new(options).expect("server");
    server.add(owner_label()).expect("webhook");
    let lifetime = tokio_util::sync::CancellationToken::new();
    server
        .engage(
            lifetime.clone(),
            ClusterName::from("team/a"),
            cluster_for("team/a", &member).await,
        )
        .expect("engage");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!(
        "https://localhost:{}",
        listener.local_addr().expect("address").port()
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn({
        let (server, stop) = (server.clone(), stop.clone());
        async move { server.serve(listener, stop).await }
    });
    let client = https_client(&files.ca);
    let call = |method: &str, path: &str, body: Vec<u8>| {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let (client, what) = (client.clone(), format!("{method} {path}"));
        async move {
            let response = client
                .request(request)
                .await
                .unwrap_or_else(|err| panic!("{what}: {err:?}"));
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3f1c6a44-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "someone"},
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain", "namespace": "default"}},
            "dryRun": false,
        }
    })
    .to_string()
    .into_bytes();

    assert_eq!(call("GET", "/healthz", Vec::new()).await.0, 200);
    let path = multicluster_webhook::path("owner-label", &ClusterName::from("team/a"));
    assert_eq!(path, "/webhooks/owner-label/clusters/team/a");
    let (status, body) = call("POST", &path, review.clone()).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        answer["response"]["uid"],
        "3f1c6a44-0000-4000-8000-000000000001"
    );
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("in cluster team/a has no owner label")),
        "{body}"
    );
    assert_eq!(call("GET", &path, Vec::new()).await.0, 405);
    let (status, body) = call(
        "POST",
        "/webhooks/owner-label/clusters/ghost",
        review.clone(),
    )
    .await;
    assert_eq!(
        (status, body.trim()),
        (404, "cluster ghost is not served here")
    );
    assert_eq!(
        call("POST", "/webhooks/nope/clusters/team/a", review.clone())
            .await
            .0,
        404
    );
    assert_eq!(call("POST", &path, b"{}".to_vec()).await.0, 400);
    let huge = vec![b' '; 100 * 1024];
    assert_eq!(call("POST", &path, huge).await.0, 413);

    // A cluster whose lifetime ended is no longer answered.
    lifetime.cancel();
    // The server forgets the cluster when its lifetime ends and tells
    // no one: asked again until it answers 404.
    eventually(Polled::Unsignalled, "team/a no longer served", || async {
        call("POST", &path, review.clone()).await.0 == 404
    })
    .await;

    stop.cancel();
    serving.await.expect("server stopped");
}

/// A member whose cache is held to one namespace is registered for that
/// namespace only (the server has no cluster-wide view to answer with); a
/// dynamic webhook answers as a typed one; and with `remove_on_shutdown`
/// the registration leaves with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_held_to_a_namespace_is_registered_for_it_and_cleaned_up_on_request() {
    use kube::api::{ApiResource, DynamicObject};
    use multicluster_runtime::cache::{Cache, CacheOptions};
    use multicluster_webhook::WebhookKind;

    let member = ControlPlane::start().await.expect("member");
    let admin = member.client().await.expect("client");
    for namespace in ["team-a", "team-b"] {
        member.create_namespace(namespace).await.expect("namespace");
    }
    let certificates = tempfile::tempdir().expect("dir");
    let files = ServingFiles::generate(certificates.path()).expect("certificates");
    let provider = Arc::new(TestProvider::default());
    let cache = Cache::with_options(
        "held",
        admin.clone(),
        CacheOptions::default().namespace("team-a".to_string()),
    );
    provider
        .clusters
        .add("held", Cluster::with_cache("held", admin.clone(), cache))
        .expect("add");
    let manager = Manager::builder(Cluster::local(admin.clone()))
        .provider(provider)
        .build();
    let server =
        WebhookServer::new(WebhookServerOptions::default().certificate(&files.cert, &files.key))
            .expect("server");
    server
        .add(Webhook::dynamic(
            "owner-label",
            WebhookKind::Validating,
            ApiResource::erase::<ConfigMap>(&()),
            |cluster: Cluster, request: AdmissionRequest<DynamicObject>| async move {
                let response = AdmissionResponse::from(&request);
                Ok::<_, Failed>(match &request.object {
                    Some(object) if !object.labels().contains_key(OWNER) => response.deny(format!(
                        "{} in cluster {} has no {OWNER} label (dynamic)",
                        object.name_any(),
                        cluster.name()
                    )),
                    _ => response,
                })
            },
        ))
        .expect("webhook");
    let running = serve_and_register(&manager, &server, &files, |options| {
        options.remove_on_shutdown = true;
    })
    .await;

    until_registered(&admin, true, "registration in the member").await;
    let configuration = Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .get(CONFIGURATION)
        .await
        .expect("configuration");
    let selector = configuration.webhooks.expect("webhooks")[0]
        .namespace_selector
        .clone()
        .expect("a namespace selector");
    assert_eq!(
        selector.match_expressions.expect("expressions")[0]
            .values
            .as_deref(),
        Some(&["team-a".to_string()][..])
    );
    let create = |namespace: &'static str| {
        let admin = admin.clone();
        async move {
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            Api::<ConfigMap>::namespaced(admin, namespace)
                .create(&dry_run, &config_map("plain", None))
                .await
                .map_err(|err| err.to_string())
        }
    };
    let refused = create("team-a").await.expect_err("unowned in team-a");
    assert!(
        refused.contains("plain in cluster held has no owner label (dynamic)"),
        "{refused}"
    );
    create("team-b").await.expect("team-b is not the member's");

    running.stop().await;
    assert!(
        !registered(&admin).await,
        "registration removed at shutdown"
    );
}
