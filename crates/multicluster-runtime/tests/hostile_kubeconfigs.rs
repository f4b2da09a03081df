//! Nothing read from a cluster panics the path from a Secret's bytes to a
//! built client: the YAML parse, the cut to one context, the kubeconfig
//! policy, the credentials checked as header values, the proxy, the
//! client's layers. Run over the seed corpus in `tests/hostile` (each
//! file a kubeconfig written to break something), then over random
//! mutations of it and over generated kubeconfigs whose every field is
//! arbitrary text, with a fixed seed and a bounded number of cases
//! (`PROPTEST_CASES` raises it). An error never quotes a value: the
//! corpus marks its values with `VALUE`.
//!
//! Building a client sends no request, so no server is needed; the policy
//! is the one kubeconfigs from cluster objects get (nothing is run or
//! read), and the same with everything allowed that needs no I/O at build
//! time (proxies, skipped verification, plain HTTP).

use std::path::PathBuf;

use multicluster_runtime::client::KubeconfigPolicy;
use multicluster_runtime::provider::kubeconfig::KubeconfigCluster;
use multicluster_runtime::provider::member::MemberOptions;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

/// The seed of every run: the same cases each time, unless
/// `PROPTEST_RNG_SEED` says otherwise.
const SEED: u64 = 0x6d63_7273_6875_7a7a;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/hostile");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the corpus")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .map(|path| {
            let name = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned());
            (
                name.unwrap_or_default(),
                std::fs::read(&path).expect("readable"),
            )
        })
        .collect();
    files.sort();
    assert!(files.len() >= 20, "the corpus is in tests/hostile");
    files
}

fn policies() -> [KubeconfigPolicy; 2] {
    [
        KubeconfigPolicy::untrusted(),
        KubeconfigPolicy::untrusted()
            .proxy_url(true)
            .insecure_skip_tls_verify(true)
            .plain_http(true),
    ]
}

/// Secret bytes to a built cluster, as the kubeconfig provider takes
/// them: whatever the outcome, an error names its source and quotes no
/// value.
fn build(runtime: &tokio::runtime::Runtime, bytes: &[u8]) -> Result<(), TestCaseError> {
    let text = String::from_utf8_lossy(bytes).into_owned();
    for policy in policies() {
        let wanted = KubeconfigCluster {
            name: "hostile".into(),
            text: text.clone(),
            source: "Secret fleet/hostile key \"kubeconfig\"".to_string(),
            policy,
            stable_id: None,
            member: MemberOptions::default(),
            inventory: Default::default(),
        };
        if let Err(err) = runtime.block_on(wanted.build()) {
            let message = err.to_string();
            prop_assert!(message.contains("Secret fleet/hostile"), "{message}");
            prop_assert!(!message.contains("VALUE"), "quotes a value: {message}");
        }
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn runner(cases: u32) -> TestRunner {
    let mut config = Config::with_cases(cases);
    config.rng_seed = RngSeed::Fixed(SEED);
    config.failure_persistence = None;
    // The environment (PROPTEST_CASES, PROPTEST_RNG_SEED) may ask for more.
    if let Ok(cases) = std::env::var("PROPTEST_CASES")
        && let Ok(cases) = cases.parse()
    {
        config.cases = cases;
    }
    if let Ok(seed) = std::env::var("PROPTEST_RNG_SEED")
        && let Ok(seed) = seed.parse()
    {
        config.rng_seed = seed;
    }
    TestRunner::new(config)
}

#[test]
fn every_kubeconfig_of_the_corpus_is_refused_or_built_without_a_panic() {
    let runtime = runtime();
    for (name, bytes) in corpus() {
        build(&runtime, &bytes).unwrap_or_else(|err| panic!("{name}: {err}"));
    }
}

#[test]
fn mutations_of_the_corpus_are_refused_or_built_without_a_panic() {
    let runtime = runtime();
    let corpus = corpus();
    let count = corpus.len();
    let mutated = (
        0..count,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..8),
    )
        .prop_map(move |(file, edits)| {
            let mut bytes = corpus[file].1.clone();
            for (at, byte, how) in edits {
                let index = at.index(bytes.len() + 1);
                match how {
                    0 if index < bytes.len() => bytes[index] = byte,
                    1 if index < bytes.len() => {
                        bytes.remove(index);
                    }
                    _ => bytes.insert(index, byte),
                }
            }
            bytes
        });
    runner(256)
        .run(&mutated, |bytes| build(&runtime, &bytes))
        .expect("no mutation panics or quotes a value");
}

/// A kubeconfig (as JSON, which YAML parsers read) whose every field is
/// arbitrary text, control characters included.
fn generated() -> impl Strategy<Value = Vec<u8>> {
    let text = || {
        prop_oneof![
            any::<String>(),
            "[ -~\\t\\r\\n\\x00\\x1b]{0,40}",
            Just(String::new())
        ]
    };
    let server = prop_oneof![
        text(),
        text().prop_map(|host| format!("https://{host}")),
        text().prop_map(|rest| format!("http://127.0.0.1:{rest}")),
    ];
    (
        server,
        prop::option::of(text()),
        prop::option::of((text(), text())),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::option::of(text()),
        (text(), text()),
    )
        .prop_map(
            |(server, token, basic, impersonate, proxy, tls_name, (cluster, user))| {
                let mut entry = serde_json::json!({});
                if let Some(token) = token {
                    entry["token"] = format!("VALUE{token}").into();
                }
                if let Some((name, password)) = basic {
                    entry["username"] = name.into();
                    entry["password"] = format!("VALUE{password}").into();
                }
                if let Some(impersonate) = impersonate {
                    entry["as"] = impersonate.into();
                }
                let mut cluster_entry = serde_json::json!({ "server": server });
                if let Some(proxy) = proxy {
                    cluster_entry["proxy-url"] = proxy.into();
                }
                if let Some(name) = tls_name {
                    cluster_entry["tls-server-name"] = name.into();
                }
                serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "ctx",
                    "clusters": [{"name": cluster, "cluster": cluster_entry}],
                    "contexts": [{"name": "ctx", "context": {"cluster": cluster, "user": user}}],
                    "users": [{"name": user, "user": entry}],
                })
                .to_string()
                .into_bytes()
            },
        )
}

#[test]
fn generated_kubeconfigs_are_refused_or_built_without_a_panic() {
    let runtime = runtime();
    runner(256)
        .run(&generated(), |bytes| build(&runtime, &bytes))
        .expect("no kubeconfig panics or quotes a value");
}
