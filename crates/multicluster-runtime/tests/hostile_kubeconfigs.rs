//! Nothing read from a cluster panics the path from a Secret's bytes to
//! the first answer of its server: the YAML parse, the cut to one
//! context, the kubeconfig policy, the server URL and credentials checked,
//! the proxy, the client's layers, and a first request. Run over the seed
//! corpus in `tests/hostile` (each file a kubeconfig written to break
//! something), then over random mutations of it and over generated
//! kubeconfigs whose every field is arbitrary text, with a fixed seed and
//! a bounded number of cases (`PROPTEST_CASES` raises it). An error never
//! quotes a value: the corpus marks its values with `VALUE`.
//!
//! `LISTENER` in the corpus (and in generated servers) is a listener on
//! loopback that answers every connection with an HTTP response and
//! closes it; `LISTENER_PORT` is its port. A client built on a server on
//! loopback sends it one request; names elsewhere are not dialled (the
//! machine has no names to resolve). A panic in a task the client spawns
//! is caught by tokio, so panics are counted
//! ([`multicluster_envtest::panics`]). The policy is the one kubeconfigs
//! from cluster objects get (nothing is run or read), and the same with
//! everything allowed that needs no I/O at build time (proxies, skipped
//! verification, plain HTTP).

use std::path::PathBuf;
use std::time::Duration;

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

/// A listener on loopback answering every connection with a response.
struct Listener {
    runtime: tokio::runtime::Runtime,
    address: std::net::SocketAddr,
    panics: multicluster_envtest::panics::Panics,
}

impl Listener {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("listener");
        let address = listener.local_addr().expect("address");
        runtime.spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self {
            runtime,
            address,
            panics: multicluster_envtest::panics::Panics::count(),
        }
    }

    fn placed(&self, text: &str) -> String {
        text.replace("LISTENER_PORT", &self.address.port().to_string())
            .replace("LISTENER", &self.address.to_string())
    }
}

/// Whether `server` names loopback, where a request may go.
fn on_loopback(server: &str) -> bool {
    server
        .trim()
        .parse::<http::Uri>()
        .ok()
        .and_then(|uri| uri.host().map(str::to_string))
        .is_some_and(|host| {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|address| address.is_loopback())
        })
}

/// Secret bytes to a built cluster, as the kubeconfig provider takes
/// them, and one request when its server is on loopback: whatever the
/// outcome, nothing panics, and an error names its source and quotes no
/// value.
fn build(listener: &Listener, bytes: &[u8]) -> Result<(), TestCaseError> {
    let text = listener.placed(&String::from_utf8_lossy(bytes));
    for policy in policies() {
        let mut wanted = KubeconfigCluster {
            name: "hostile".into(),
            text: text.clone(),
            source: "Secret fleet/hostile key \"kubeconfig\"".to_string(),
            policy,
            stable_id: None,
            member: MemberOptions::default(),
            inventory: Default::default(),
        };
        let mut member = MemberOptions::default();
        member.client.request_timeout = Some(Duration::from_secs(2));
        member.client.connect_timeout = Some(Duration::from_secs(1));
        wanted.member = member;
        let built = listener.runtime.block_on(async {
            let cluster = wanted.build().await?;
            let server = multicluster_runtime::client::kubeconfig::parse(&text, "hostile")
                .ok()
                .and_then(|parsed| parsed.clusters.first().cloned())
                .and_then(|named| named.cluster)
                .and_then(|cluster| cluster.server)
                .unwrap_or_default();
            if on_loopback(&server) {
                let client = cluster.client();
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), client.apiserver_version()).await;
            }
            Ok::<_, multicluster_runtime::Error>(())
        });
        if let Err(err) = built {
            let message = err.to_string();
            prop_assert!(message.contains("Secret fleet/hostile"), "{message}");
            prop_assert!(!message.contains("VALUE"), "quotes a value: {message}");
        }
        prop_assert_eq!(
            listener.panics.since(),
            0,
            "panicked: {:?}",
            listener.panics.messages()
        );
    }
    Ok(())
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
fn every_kubeconfig_of_the_corpus_is_refused_or_answered_without_a_panic() {
    let listener = Listener::start();
    for (name, bytes) in corpus() {
        build(&listener, &bytes).unwrap_or_else(|err| panic!("{name}: {err}"));
    }
}

#[test]
fn mutations_of_the_corpus_are_refused_or_answered_without_a_panic() {
    let listener = Listener::start();
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
        .run(&mutated, |bytes| build(&listener, &bytes))
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
        // Around the listener: no scheme, `//`, user info, a path, ...
        (text(), text()).prop_map(|(before, after)| format!("{before}LISTENER{after}")),
        prop::sample::select(vec![
            "LISTENER",
            "//LISTENER",
            "https://LISTENER",
            "http://LISTENER",
            "https://VALUE:x@LISTENER",
            "https://:LISTENER_PORT",
            "https://::1:LISTENER_PORT",
            "https://[::1]:LISTENER_PORT",
            "https://127.0.0.1:0",
            "https://LISTENER/some/path?q=1#f",
            "HTTPS://LISTENER",
        ])
        .prop_map(str::to_string),
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
fn generated_kubeconfigs_are_refused_or_answered_without_a_panic() {
    let listener = Listener::start();
    runner(256)
        .run(&generated(), |bytes| build(&listener, &bytes))
        .expect("no kubeconfig panics or quotes a value");
}
