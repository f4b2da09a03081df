//! Kubeconfigs for a control plane's identities, with every credential inline
//! (`*-data` fields) so they can be stored in a Secret or handed to a
//! provider without files beside them.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::config::{
    AuthInfo, Cluster, Context, ExecConfig, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use secrecy::SecretString;

/// Who a kubeconfig authenticates as.
pub(crate) enum Credentials {
    /// A client certificate and key, PEM encoded.
    Certificate { cert_pem: String, key_pem: String },
    /// A bearer token.
    Token(String),
    /// An exec credential plugin.
    Exec(Box<ExecConfig>),
}

/// Builds a single-context kubeconfig named `name` for `server`.
pub(crate) fn build(
    name: &str,
    server: &str,
    ca_pem: &str,
    credentials: Credentials,
) -> Kubeconfig {
    let auth_info = match credentials {
        Credentials::Certificate { cert_pem, key_pem } => AuthInfo {
            client_certificate_data: Some(STANDARD.encode(cert_pem)),
            client_key_data: Some(SecretString::from(STANDARD.encode(key_pem))),
            ..AuthInfo::default()
        },
        Credentials::Token(token) => AuthInfo {
            token: Some(SecretString::from(token)),
            ..AuthInfo::default()
        },
        Credentials::Exec(exec) => AuthInfo {
            exec: Some(*exec),
            ..AuthInfo::default()
        },
    };
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.to_string(),
            cluster: Some(Cluster {
                server: Some(server.to_string()),
                certificate_authority_data: Some(STANDARD.encode(ca_pem)),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.to_string(),
            auth_info: Some(auth_info),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: name.to_string(),
            context: Some(Context {
                cluster: name.to_string(),
                user: Some(name.to_string()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(name.to_string()),
        api_version: Some("v1".to_string()),
        kind: Some("Config".to_string()),
        ..Kubeconfig::default()
    }
}

/// Renders a kubeconfig as YAML, the form kubectl and kubeconfig Secrets use.
pub fn to_yaml(kubeconfig: &Kubeconfig) -> Result<String, crate::Error> {
    serde_saphyr::to_string(kubeconfig).map_err(|err| crate::Error::Kubeconfig(err.to_string()))
}

/// Builds a `kube::Client` from a kubeconfig's current context. Must be called
/// inside a tokio runtime; the client is bound to that runtime.
pub async fn client_for(kubeconfig: &Kubeconfig) -> Result<kube::Client, crate::Error> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &Default::default())
        .await
        .map_err(|err| crate::Error::Kubeconfig(err.to_string()))?;
    kube::Client::try_from(config).map_err(crate::Error::Client)
}
