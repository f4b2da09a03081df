use kube::api::{ApiResource, GroupVersionKind};
use serde_json::json;

use super::*;

const SECRET: &str = "s3cr3t-api-key";

fn file(json: serde_json::Value) -> ProviderFile {
    ProviderFile::from_json(&json.to_string(), "providers.json").expect("valid provider file")
}

/// A provider handing its plugin what profiles write, allowed any
/// server (`allowUnboundProfileInput`): these tests are about the plugin
/// call; `only_servers_named_one_by_one_...` is about the default.
fn provider(name: &str, args_policy: &str, envs_policy: &str) -> serde_json::Value {
    json!({
        "name": name,
        "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": format!("/plugins/{name}"),
            "args": ["--base"],
            "env": [{"name": "KEEP", "value": "configured"}, {"name": "API_KEY", "value": SECRET}],
            "provideClusterInfo": true,
        },
        "profileSourcedCLIArgsPolicy": args_policy,
        "profileSourcedEnvVarsPolicy": envs_policy,
        "profileSourcedEnvVarNames": ["KEEP", "REGION", "A", "B", "C", "D"],
        "allowUnboundProfileInput": true,
    })
}

fn profile(status: serde_json::Value) -> DynamicObject {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "multicluster.x-k8s.io",
        "v1alpha1",
        "ClusterProfile",
    ));
    let mut profile = DynamicObject::new("edge-1", &resource).within("fleet");
    profile.data = json!({ "status": status });
    profile
}

fn entry(name: &str, server: &str, extensions: serde_json::Value) -> serde_json::Value {
    json!({"name": name, "cluster": {
        "server": server,
        "certificate-authority-data": "Q0EK",
        "tls-server-name": "api.internal",
        "proxy-url": "http://proxy.corp:3128",
        "extensions": extensions,
    }})
}

fn exec(access: &ProfileAccess) -> &ExecConfig {
    access.kubeconfig.auth_infos[0]
        .auth_info
        .as_ref()
        .and_then(|user| user.exec.as_ref())
        .expect("exec user")
}

fn env(exec: &ExecConfig) -> Vec<(String, String)> {
    exec.env
        .iter()
        .flatten()
        .map(|var| (var["name"].clone(), var["value"].clone()))
        .collect()
}

#[test]
fn the_first_provider_in_file_order_that_the_profile_offers_is_used() {
    let providers = file(json!({"providers": [
        provider("preferred", "", ""),
        provider("fallback", "", ""),
    ]}));
    let offers_both = profile(json!({"accessProviders": [
        entry("fallback", "https://fallback:6443", json!([])),
        entry("preferred", "https://preferred:6443", json!([])),
    ]}));
    let access = providers.access_for(&offers_both).expect("access");
    assert_eq!(access.provider, "preferred");
    let cluster = access.kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .expect("cluster");
    assert_eq!(cluster.server.as_deref(), Some("https://preferred:6443"));
    assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0EK"));
    assert_eq!(cluster.tls_server_name.as_deref(), Some("api.internal"));
    assert_eq!(cluster.proxy_url.as_deref(), Some("http://proxy.corp:3128"));
    assert_eq!(exec(&access).command.as_deref(), Some("/plugins/preferred"));
    assert_eq!(
        exec(&access).interactive_mode,
        Some(ExecInteractiveMode::Never)
    );
    assert!(exec(&access).provide_cluster_info);

    let shown = format!("{providers:?} {access:?}");
    assert!(
        shown.contains("API_KEY") && !shown.contains(SECRET),
        "{shown}"
    );

    let offers_fallback = profile(json!({"accessProviders": [
        entry("fallback", "https://fallback:6443", json!([])),
    ]}));
    assert_eq!(
        providers
            .access_for(&offers_fallback)
            .expect("access")
            .provider,
        "fallback"
    );
}

#[test]
fn access_providers_win_over_deprecated_credential_providers_of_the_same_name() {
    let providers = file(json!({"providers": [provider("p", "", "")]}));
    let both = profile(json!({
        "credentialProviders": [entry("p", "https://old:6443", json!([]))],
        "accessProviders": [entry("p", "https://new:6443", json!([]))],
    }));
    let access = providers.access_for(&both).expect("access");
    assert!(!access.deprecated_field);
    let server = access.kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone());
    assert_eq!(server.as_deref(), Some("https://new:6443"));

    let deprecated_only = profile(json!({
        "credentialProviders": [entry("p", "https://old:6443", json!([]))],
    }));
    let access = providers
        .access_for(&deprecated_only)
        .expect("still honoured");
    assert!(access.deprecated_field);
    let server = access.kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone());
    assert_eq!(server.as_deref(), Some("https://old:6443"));
}

/// `profile` as read through v1alpha2.
fn through_v1alpha2(mut profile: DynamicObject) -> DynamicObject {
    profile.types = Some(kube::api::TypeMeta {
        api_version: ApiVersion::V1Alpha2.to_string(),
        kind: "ClusterProfile".into(),
    });
    profile
}

#[test]
fn a_profile_read_through_v1alpha2_follows_its_rules() {
    let providers = file(json!({"providers": [provider("p", "", "")]}));
    // No credentialProviders field in v1alpha2.
    let deprecated_only = through_v1alpha2(profile(json!({
        "credentialProviders": [entry("p", "https://old:6443", json!([]))],
    })));
    let err = providers.access_for(&deprecated_only).unwrap_err();
    assert!(
        err.to_string()
            .contains("none of its access providers (none)"),
        "{err}"
    );
    // No CA file path in a v1alpha2 cluster entry.
    let mut with_ca_file = entry("p", "https://new:6443", json!([]));
    with_ca_file["cluster"]["certificate-authority"] = json!("/etc/ca.pem");
    let status = json!({ "accessProviders": [with_ca_file] });
    let err = providers
        .access_for(&through_v1alpha2(profile(status.clone())))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "ClusterProfile fleet/edge-1: status.accessProviders[\"p\"].cluster.certificate-authority is no field of multicluster.x-k8s.io/v1alpha2"
    );
    // Through v1alpha1 it is the kubeconfig policy's to refuse, later.
    assert!(providers.access_for(&profile(status)).is_ok());
    let plain = through_v1alpha2(profile(json!({
        "accessProviders": [entry("p", "https://new:6443", json!([]))],
    })));
    assert!(providers.access_for(&plain).is_ok());
}

#[test]
fn the_exec_extension_stays_in_the_cluster_entry_for_kube_to_pass_on() {
    let providers = file(json!({"providers": [provider("p", "", "")]}));
    let config = json!({"audience": "edge", "region": "eu-1"});
    let with_extension = profile(json!({"accessProviders": [entry(
        "p",
        "https://edge:6443",
        json!([{"name": "client.authentication.k8s.io/exec", "extension": config}]),
    )]}));
    let access = providers.access_for(&with_extension).expect("access");
    let extensions = access.kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.extensions.clone())
        .expect("extensions");
    assert_eq!(extensions[0].name, "client.authentication.k8s.io/exec");
    assert_eq!(extensions[0].extension, config);
}

fn with_extras(args: serde_json::Value, envs: serde_json::Value) -> DynamicObject {
    profile(
        json!({"accessProviders": [entry("p", "https://edge:6443", json!([
            {"name": ADDITIONAL_ARGS_EXTENSION, "extension": args},
            {"name": ADDITIONAL_ENVS_EXTENSION, "extension": envs},
        ]))]}),
    )
}

#[test]
fn additional_args_are_read_as_the_crd_stores_them_and_as_a_list() {
    let providers = file(json!({"providers": [provider("p", "Append", "Ignore")]}));
    for args in [
        json!({"args": ["--region", "eu-1"]}),
        json!(["--region", "eu-1"]),
    ] {
        let access = providers
            .access_for(&with_extras(args.clone(), json!({})))
            .expect("access");
        assert_eq!(
            exec(&access).args.clone().unwrap_or_default(),
            ["--base", "--region", "eu-1"],
            "{args}"
        );
    }
    for unusable in [
        json!({"arguments": ["--x"]}),
        json!({"args": "--x"}),
        json!("--x"),
    ] {
        let message = providers
            .access_for(&with_extras(unusable.clone(), json!({})))
            .expect_err("unusable")
            .to_string();
        assert!(
            message.contains("is neither {\"args\": [strings]} nor a list of strings"),
            "{unusable}: {message}"
        );
    }
}

#[test]
fn profile_sourced_args_and_envs_follow_the_providers_policies() {
    let extras = with_extras(
        json!({"args": ["--region", "eu-1"]}),
        json!({"KEEP": "from-profile", "REGION": "eu-1"}),
    );
    let cases = [
        (
            "Append",
            "AppendIfNotExists",
            vec!["--base", "--region", "eu-1"],
            "configured",
            true,
        ),
        (
            "Append",
            "Replace",
            vec!["--base", "--region", "eu-1"],
            "from-profile",
            true,
        ),
        ("Ignore", "Ignore", vec!["--base"], "configured", false),
        ("", "", vec!["--base"], "configured", false),
    ];
    for (args_policy, envs_policy, args, keep, has_region) in cases {
        let providers = file(json!({"providers": [provider("p", args_policy, envs_policy)]}));
        let access = providers.access_for(&extras).expect("access");
        let exec = exec(&access);
        let case = format!("{args_policy:?}/{envs_policy:?}");
        assert_eq!(exec.args.clone().unwrap_or_default(), args, "{case}");
        let env = env(exec);
        assert!(
            env.contains(&("KEEP".into(), keep.into())),
            "{case}: {env:?}"
        );
        assert_eq!(
            env.iter().filter(|(name, _)| name == "KEEP").count(),
            1,
            "{case}"
        );
        assert_eq!(
            env.contains(&("REGION".into(), "eu-1".into())),
            has_region,
            "{case}: {env:?}"
        );
        // Work happens on a copy: the file's own settings are unchanged.
        let configured = &providers.providers[0].exec_config;
        assert_eq!(
            configured.args.clone().unwrap_or_default(),
            ["--base"],
            "{case}"
        );
        assert_eq!(configured.env.as_ref().map(Vec::len), Some(2), "{case}");
    }
}

#[test]
fn malformed_extensions_are_errors_only_when_they_would_be_used() {
    let broken = with_extras(json!({"not": "a list"}), json!(["not", "a map"]));
    let ignoring = file(json!({"providers": [provider("p", "Ignore", "Ignore")]}));
    ignoring
        .access_for(&broken)
        .expect("ignored extensions are not read");
    for (policies, expected) in [
        (
            ("Append", "Ignore"),
            "additional-args is neither {\"args\": [strings]} nor a list of strings",
        ),
        (
            ("Ignore", "Replace"),
            "additional-envs is not a map of strings",
        ),
    ] {
        let providers = file(json!({"providers": [provider("p", policies.0, policies.1)]}));
        let message = providers
            .access_for(&broken)
            .expect_err(expected)
            .to_string();
        assert!(message.contains("ClusterProfile fleet/edge-1"), "{message}");
        assert!(message.contains(expected), "{message}");
    }
}

#[test]
fn equal_settings_give_equal_text() {
    let providers = file(json!({"providers": [provider("p", "Append", "Replace")]}));
    let extras = with_extras(
        json!(["--x"]),
        json!({"A": "1", "B": "2", "C": "3", "D": "4"}),
    );
    let first = providers.access_for(&extras).expect("access").text();
    for _ in 0..20 {
        assert_eq!(providers.access_for(&extras).expect("access").text(), first);
    }
    let other = with_extras(json!(["--y"]), json!({}));
    assert_ne!(providers.access_for(&other).expect("access").text(), first);
    let parsed = Kubeconfig::from_yaml(&first).expect("the text is a kubeconfig");
    assert_eq!(parsed.current_context.as_deref(), Some("fleet/edge-1"));
}

#[test]
fn profiles_that_cannot_be_accessed_say_why() {
    let providers = file(json!({"providers": [provider("a", "", ""), provider("b", "", "")]}));
    let cases = [
        (
            json!({}),
            "none of its access providers (none) is in the provider file (\"a\", \"b\")",
        ),
        (
            json!({"accessProviders": [entry("z", "https://z", json!([]))]}),
            "(\"z\") is in the provider file",
        ),
        (
            json!({"accessProviders": [{"name": "a"}]}),
            "status.accessProviders[\"a\"].cluster is not a kubeconfig cluster entry",
        ),
        (
            json!({"accessProviders": [{"name": "b", "cluster": {"certificate-authority-data": "Q0EK"}}]}),
            "status.accessProviders[\"b\"].cluster.server is missing",
        ),
        (
            json!({"accessProviders": [entry("b", "127.0.0.1:6443", json!([]))]}),
            "status.accessProviders[\"b\"].cluster.server has no scheme (https://)",
        ),
        (
            json!({"accessProviders": [entry("b", "https://VALUE:pw@b:6443", json!([]))]}),
            "status.accessProviders[\"b\"].cluster.server carries user info",
        ),
        (
            json!({"accessProviders": [entry("b", "https://b:6443", json!([
                {"name": "client.authentication.k8s.io/exec", "extension": {"cluster": "b"}},
                {"name": "client.authentication.k8s.io/exec", "extension": {"cluster": "VALUE"}},
            ]))]}),
            "cluster.extensions lists \"client.authentication.k8s.io/exec\" twice",
        ),
    ];
    for (status, expected) in cases {
        let message = providers
            .access_for(&profile(status))
            .expect_err(expected)
            .to_string();
        assert!(
            message.starts_with("ClusterProfile fleet/edge-1: "),
            "{message}"
        );
        assert!(
            message.contains(expected),
            "{message} should say {expected}"
        );
        assert!(!message.contains("VALUE"), "{message}");
    }
}

#[test]
fn bad_provider_files_are_named_and_never_quoted() {
    let cases = [
        ("{".to_string(), "not valid JSON"),
        (json!({"providers": []}).to_string(), "lists no providers"),
        (json!({}).to_string(), "missing field `providers`"),
        (
            json!({"providers": [provider("a", "", ""), provider("a", "", "")]}).to_string(),
            "\"a\" is listed twice",
        ),
        (
            json!({"providers": [{"name": "a", "execConfig": {"args": ["x"]}}]}).to_string(),
            "\"a\" has no execConfig.command",
        ),
        (
            json!({"providers": [{"name": "", "execConfig": {"command": "x"}}]}).to_string(),
            "provider #0 has no name",
        ),
        (
            json!({"providers": [provider("a", "Prepend", "")]}).to_string(),
            "unknown variant `Prepend`",
        ),
        (
            json!({"providers": [{"name": "a", "execConfig": {"command": "x", "env": SECRET}}]})
                .to_string(),
            "wrong type or form",
        ),
    ];
    for (text, expected) in cases {
        let message = ProviderFile::from_json(&text, "/etc/providers.json")
            .expect_err(expected)
            .to_string();
        assert!(
            message.starts_with("provider file /etc/providers.json: "),
            "{message}"
        );
        assert!(
            message.contains(expected),
            "{message} should say {expected}"
        );
        assert!(!message.contains(SECRET), "{message}");
    }
    let missing = ProviderFile::from_path("/nonexistent/providers.json")
        .expect_err("missing file")
        .to_string();
    assert!(
        missing.contains("/nonexistent/providers.json: cannot be read"),
        "{missing}"
    );
}

#[test]
fn a_profile_may_set_only_the_variables_the_provider_names() {
    let providers = file(json!({"providers": [provider("p", "Ignore", "AppendIfNotExists")]}));
    for name in [
        "HTTPS_PROXY",
        "SSL_CERT_FILE",
        "AWS_CONFIG_FILE",
        "LD_PRELOAD",
    ] {
        let steering = with_extras(json!([]), json!({ name: "http://203.0.113.9:3128" }));
        let err = providers.access_for(&steering).expect_err(name);
        assert!(matches!(err, AccessError::Refused { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("sets {name:?}"))
                && message.contains("profileSourcedEnvVarNames"),
            "{message}"
        );
        assert!(!message.contains("203.0.113.9"), "{message}");
    }
    let named_code = json!({"providers": [{
        "name": "p",
        "execConfig": {"command": "/plugins/p"},
        "profileSourcedEnvVarNames": ["LD_PRELOAD"],
    }]});
    let err = ProviderFile::from_json(&named_code.to_string(), "providers.json")
        .map(|_| ())
        .expect_err("a variable that changes code");
    assert!(err.to_string().contains("changes what code"), "{err}");
}

#[test]
fn a_bound_provider_refuses_other_servers_and_its_ca_replaces_the_profiles() {
    use base64::Engine;
    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let mut bound = provider("p", "Ignore", "Ignore");
    bound["servers"] = json!(["*.fleet.example", "10.0.0.0/8"]);
    bound["serverCAData"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
    let providers = file(json!({"providers": [bound]}));
    let inside = profile(json!({"accessProviders": [
        entry("p", "https://api.edge-1.fleet.example:6443", json!([])),
    ]}));
    let access = providers.access_for(&inside).expect("inside the binding");
    let cluster = access.kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .expect("cluster");
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(
            base64::engine::general_purpose::STANDARD
                .encode(pem)
                .as_str()
        ),
        "the bundle, not the profile's CA"
    );
    for server in [
        "https://203.0.113.9:6443",
        "https://fleet.example.attacker.io",
    ] {
        let outside = profile(json!({"accessProviders": [entry("p", server, json!([]))]}));
        let err = providers.access_for(&outside).expect_err(server);
        assert!(matches!(err, AccessError::Refused { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("not among the servers"), "{message}");
        assert!(!message.contains("203.0.113.9"), "{message}");
    }
    let mut broken = provider("p", "Ignore", "Ignore");
    broken["servers"] = json!(["a/b"]);
    let err = ProviderFile::from_json(
        &json!({"providers": [broken]}).to_string(),
        "providers.json",
    )
    .map(|_| ())
    .expect_err("bad pattern");
    assert!(err.to_string().contains("provider \"p\""), "{err}");
}

#[test]
fn what_a_profile_hands_the_plugin_is_its_input() {
    let providers = file(json!({"providers": [provider("p", "Append", "Replace")]}));
    let nothing = profile(json!({"accessProviders": [entry("p", "https://a:6443", json!([]))]}));
    assert_eq!(providers.access_for(&nothing).expect("access").input, None);
    let naming = |cluster: &str, server: &str| {
        profile(json!({"accessProviders": [entry("p", server, json!([
            {"name": "client.authentication.k8s.io/exec", "extension": {"cluster": cluster}},
        ]))]}))
    };
    let a = providers
        .access_for(&naming("a", "https://a:6443"))
        .expect("a");
    let copy = providers
        .access_for(&naming("a", "https://stranger:6443"))
        .expect("copy");
    let b = providers
        .access_for(&naming("b", "https://b:6443"))
        .expect("b");
    assert!(a.input.is_some());
    assert_eq!(a.input, copy.input, "the server is not part of the input");
    assert_ne!(a.input, b.input);
    assert_eq!(copy.server(), "https://stranger:6443");
}

fn base64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn pem(name: &str) -> String {
    format!("-----BEGIN CERTIFICATE-----\n{name}\n-----END CERTIFICATE-----\n")
}

#[test]
fn only_servers_named_one_by_one_get_a_plugin_that_reads_profiles_by_default() {
    let reading = |extra: serde_json::Value| {
        let mut provider = provider("p", "Ignore", "Ignore");
        provider
            .as_object_mut()
            .expect("object")
            .remove("allowUnboundProfileInput");
        for (key, value) in extra.as_object().expect("object") {
            provider[key] = value.clone();
        }
        file(json!({"providers": [provider]}))
    };
    let at = |server: &str| profile(json!({"accessProviders": [entry("p", server, json!([]))]}));
    let server = "https://api.edge-1.fleet.example:6443";
    for (binding, bound) in [
        (json!({}), "is bound to no servers"),
        (
            json!({"servers": ["*.fleet.example"]}),
            "not named one by one",
        ),
        (json!({"servers": ["10.0.0.0/8"]}), "not named one by one"),
        (
            json!({"servers": ["api.edge-1.fleet.example:6443"]}),
            "not named one by one",
        ),
        (
            json!({"serverCAData": base64(&pem("ca"))}),
            "not named one by one",
        ),
    ] {
        let err = reading(binding.clone())
            .access_for(&at(server))
            .expect_err("profile input, servers nobody named");
        assert!(matches!(err, AccessError::Refused { .. }), "{err}");
        let message = err.to_string();
        for says in [
            "access provider \"p\" hands its plugin what profiles write (execConfig.provideClusterInfo)",
            bound,
            "allowUnboundProfileInput",
        ] {
            assert!(
                message.contains(says),
                "{binding}: {message} should say {says}"
            );
        }
    }
    // Named with its CA, one by one: runs there, with that CA.
    let named = reading(json!({"servers": [
        {"server": "api.edge-1.fleet.example:6443", "certificateAuthorityData": base64(&pem("edge-1"))},
        {"server": "https://api.edge-2.fleet.example:6443", "certificateAuthorityData": base64(&pem("edge-2"))},
    ]}));
    let access = named.access_for(&at(server)).expect("named");
    let cluster = access.kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .expect("cluster");
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(base64(&pem("edge-1")).as_str()),
        "its own CA, not the profile's"
    );
    let err = named
        .access_for(&at("https://api.edge-3.fleet.example:6443"))
        .expect_err("not named");
    assert!(err.to_string().contains("not among the servers"), "{err}");
    // Exact hosts with ports and one bundle for their CA name them too.
    reading(
        json!({"servers": ["api.edge-1.fleet.example:6443"], "serverCAData": base64(&pem("ca"))}),
    )
    .access_for(&at(server))
    .expect("exact, with the bundle");
    // The opt-in, and a plugin that reads nothing of a profile.
    reading(json!({"allowUnboundProfileInput": true}))
        .access_for(&at(server))
        .expect("allowed");
    let mut blind = provider("p", "Ignore", "Ignore");
    blind["execConfig"]["provideClusterInfo"] = json!(false);
    blind
        .as_object_mut()
        .expect("object")
        .remove("allowUnboundProfileInput");
    let blind = file(json!({"providers": [blind]}));
    assert!(blind.providers[0].profile_input().is_empty());
    blind
        .access_for(&at(server))
        .expect("mints the same for every profile");
}

#[test]
fn inputs_equal_in_meaning_are_one_input() {
    let providers = file(json!({"providers": [provider("p", "Append", "AppendIfNotExists")]}));
    let input = |extensions: serde_json::Value| {
        providers
            .access_for(&profile(
                json!({"accessProviders": [entry("p", "https://a:6443", extensions)]}),
            ))
            .expect("access")
            .input
    };
    let exec = |config: serde_json::Value| json!({"name": "client.authentication.k8s.io/exec", "extension": config});
    let victim = input(json!([exec(json!({"cluster": "a", "region": "eu"}))]));
    assert!(victim.is_some());
    for same in [
        json!([exec(json!({"region": "eu", "cluster": "a"}))]),
        json!([exec(
            json!({"cluster": "a", "region": "eu", "tags": [], "labels": {}, "x": null})
        )]),
        json!([
            exec(json!({"cluster": "a", "region": "eu"})),
            {"name": ADDITIONAL_ARGS_EXTENSION, "extension": {"args": []}},
            {"name": ADDITIONAL_ENVS_EXTENSION, "extension": {}},
        ]),
        // KEEP is configured: AppendIfNotExists leaves the plugin's call as it was.
        json!([
            exec(json!({"cluster": "a", "region": "eu"})),
            {"name": ADDITIONAL_ENVS_EXTENSION, "extension": {"KEEP": "ignored"}},
        ]),
    ] {
        assert_eq!(input(same.clone()), victim, "{same}");
    }
    for other in [
        json!([exec(json!({"cluster": "b", "region": "eu"}))]),
        json!([exec(json!({"cluster": "a", "region": "eu"})), {"name": ADDITIONAL_ARGS_EXTENSION, "extension": {"args": ["--x"]}}]),
        json!([exec(json!({"cluster": "a", "region": "eu"})), {"name": ADDITIONAL_ENVS_EXTENSION, "extension": {"REGION": "us"}}]),
    ] {
        assert_ne!(input(other.clone()), victim, "{other}");
    }
}
