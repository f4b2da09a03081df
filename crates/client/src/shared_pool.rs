//! Clients that would connect alike share their connections, as
//! client-go's transports are shared by TLS settings: clusters on one
//! server with one TLS identity (a fleet behind a gateway, namespaces of
//! one server as clusters, kubeconfigs that differ only in their token,
//! which is a header) reach it over the same HTTP/2 connection rather than
//! one each. A few dozen clusters at most share one client: its one
//! connection carries their watches as streams, and an API server takes a
//! bounded number of streams on one connection (hyper-util's pool opens no
//! second HTTP/2 connection when they run out, where Go's transport does).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use multicluster_core::lock;

/// How many clusters share one client at most: their watches (a few
/// types each) stay well inside the streams a server lets one connection
/// carry (Go's HTTP/2 server allows 250 unless configured otherwise).
pub(crate) const CLUSTERS_PER_CLIENT: usize = 32;

/// Everything a connection depends on: where it goes and how TLS is
/// spoken there. Two clients with equal keys connect alike. It holds the
/// client key: compared whole, never hashed, so that no two identities
/// can ever share a connection.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct TransportKey {
    scheme_and_authority: String,
    root_certificates: Option<Vec<Vec<u8>>>,
    root_certificate_file: Option<std::path::PathBuf>,
    accept_invalid_certificates: bool,
    tls_server_name: Option<String>,
    proxy: Option<String>,
    connect_timeout: Option<Duration>,
    client_certificate: Option<String>,
    client_certificate_file: Option<String>,
    client_key: Option<String>,
    client_key_file: Option<String>,
}

impl std::fmt::Debug for TransportKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportKey")
            .field("server", &self.scheme_and_authority)
            .finish_non_exhaustive()
    }
}

impl TransportKey {
    pub(crate) fn of(config: &kube::Config) -> Self {
        use secrecy::ExposeSecret;
        let url = &config.cluster_url;
        let auth = &config.auth_info;
        Self {
            scheme_and_authority: format!(
                "{}://{}",
                url.scheme_str().unwrap_or_default(),
                url.authority().map(|a| a.as_str()).unwrap_or_default()
            ),
            root_certificates: config.root_cert.clone(),
            root_certificate_file: config.root_cert_file.clone(),
            accept_invalid_certificates: config.accept_invalid_certs,
            tls_server_name: config.tls_server_name.clone(),
            proxy: config.proxy_url.as_ref().map(ToString::to_string),
            connect_timeout: config.connect_timeout,
            client_certificate: auth.client_certificate_data.clone(),
            client_certificate_file: auth.client_certificate.clone(),
            client_key: auth
                .client_key_data
                .as_ref()
                .map(|key| key.expose_secret().to_string()),
            client_key_file: auth.client_key.clone(),
        }
    }
}

type Shared = Weak<dyn Any + Send + Sync>;

fn pools() -> &'static Mutex<HashMap<TransportKey, Vec<Shared>>> {
    static POOLS: OnceLock<Mutex<HashMap<TransportKey, Vec<Shared>>>> = OnceLock::new();
    POOLS.get_or_init(Mutex::default)
}

/// A client for `key` that fewer than [`CLUSTERS_PER_CLIENT`] clusters
/// use yet, or a new one made by `make`.
pub(crate) fn shared<T: Any + Send + Sync>(key: TransportKey, make: impl FnOnce() -> T) -> Arc<T> {
    let mut pools = lock(pools());
    // Forget the clients nobody uses any more, of every key, so the map
    // does not grow with clusters long gone.
    pools.retain(|_, clients| {
        clients.retain(|client| client.strong_count() > 0);
        !clients.is_empty()
    });
    let clients = pools.entry(key).or_default();
    let free = clients.iter().find_map(|client| {
        (client.strong_count() < CLUSTERS_PER_CLIENT)
            .then(|| client.upgrade())
            .flatten()
            .and_then(|client| client.downcast::<T>().ok())
    });
    if let Some(client) = free {
        return client;
    }
    let client = Arc::new(make());
    let erased: Arc<dyn Any + Send + Sync> = client.clone();
    clients.push(Arc::downgrade(&erased));
    client
}
