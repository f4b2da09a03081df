//! Service-account identities with bearer tokens, for RBAC and credential
//! rotation tests.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::Kubeconfig;

use crate::{ControlPlane, Error};

impl ControlPlane {
    /// Creates (if missing) the namespace and the service account
    /// `namespace/name`, requests a token for it valid for `expiration`
    /// (the API server enforces a minimum of 10 minutes), and returns a
    /// kubeconfig that authenticates with that token.
    ///
    /// Tokens are bound to the service account: deleting the service account
    /// revokes every token issued for it, which is how rotation tests retire
    /// old credentials.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        expiration: Duration,
    ) -> Result<Kubeconfig, Error> {
        let token = self
            .service_account_token(namespace, name, expiration)
            .await?;
        Ok(self.token_kubeconfig(&format!("{namespace}-{name}"), token))
    }

    /// Like [`ControlPlane::service_account_kubeconfig`], returning the bare
    /// token (what a credential plugin hands out).
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        expiration: Duration,
    ) -> Result<String, Error> {
        let client = self.client().await?;
        let what = |action: &str| format!("{action} service account {namespace}/{name}");
        self.create_namespace(namespace).await?;
        let accounts = Api::<ServiceAccount>::namespaced(client, namespace);
        create_if_missing(
            &accounts,
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await
        .map_err(|source| Error::Api {
            what: what("creating"),
            source,
        })?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(i64::try_from(expiration.as_secs()).unwrap_or(i64::MAX)),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let issued = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|source| Error::Api {
                what: what("requesting a token for"),
                source,
            })?;
        issued
            .status
            .map(|status| status.token)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| Error::Api {
                what: what("requesting a token for"),
                source: kube::Error::Service("the TokenRequest came back without a token".into()),
            })
    }

    /// Grants the user `user` (see [`ControlPlane::user_kubeconfig`]) `rules`
    /// in `namespace` only, through a Role and RoleBinding named after the
    /// user.
    pub async fn grant_in_namespace(
        &self,
        namespace: &str,
        user: &str,
        rules: Vec<PolicyRule>,
    ) -> Result<(), Error> {
        let subject = Subject {
            kind: "User".into(),
            name: user.to_string(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        };
        self.grant(namespace, user, subject, rules).await
    }

    /// Grants the service account `account_namespace/account` `rules` in
    /// `namespace` only, through a Role and RoleBinding named
    /// `<account_namespace>-<account>`: deleting that RoleBinding revokes
    /// the grant, and granting again restores it.
    pub async fn grant_service_account_in_namespace(
        &self,
        namespace: &str,
        account_namespace: &str,
        account: &str,
        rules: Vec<PolicyRule>,
    ) -> Result<(), Error> {
        let subject = Subject {
            kind: "ServiceAccount".into(),
            name: account.to_string(),
            namespace: Some(account_namespace.to_string()),
            ..Subject::default()
        };
        let name = format!("{account_namespace}-{account}");
        self.grant(namespace, &name, subject, rules).await
    }

    /// Grants the service account `account_namespace/account` `rules` in
    /// every namespace, through a ClusterRole and ClusterRoleBinding named
    /// `<account_namespace>-<account>`. (The aggregated ClusterRoles such as
    /// `view` are empty here: kube-controller-manager fills them.)
    pub async fn grant_service_account_cluster_wide(
        &self,
        account_namespace: &str,
        account: &str,
        rules: Vec<PolicyRule>,
    ) -> Result<(), Error> {
        let client = self.client().await?;
        let name = format!("{account_namespace}-{account}");
        let what = || format!("granting {name} access in every namespace");
        let role = ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            rules: Some(rules),
            ..ClusterRole::default()
        };
        create_if_missing(&Api::all(client), &role)
            .await
            .map_err(|source| Error::Api {
                what: what(),
                source,
            })?;
        self.bind_cluster_role(&name, account_namespace, account)
            .await
    }

    /// A Role `name` with `rules` in `namespace`, bound to `subject`.
    async fn grant(
        &self,
        namespace: &str,
        name: &str,
        subject: Subject,
        rules: Vec<PolicyRule>,
    ) -> Result<(), Error> {
        let client = self.client().await?;
        let what = || format!("granting {name} access in namespace {namespace}");
        let role = Role {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            rules: Some(rules),
        };
        create_if_missing(&Api::namespaced(client.clone(), namespace), &role)
            .await
            .map_err(|source| Error::Api {
                what: what(),
                source,
            })?;
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: name.to_string(),
            },
            subjects: Some(vec![subject]),
        };
        create_if_missing(&Api::namespaced(client, namespace), &binding)
            .await
            .map_err(|source| Error::Api {
                what: what(),
                source,
            })
    }

    /// A token of the service account `namespace/name` (created if missing)
    /// bound to `cluster-admin`, valid for an hour: what a credential plugin
    /// hands out in tests.
    pub async fn cluster_admin_token(&self, namespace: &str, name: &str) -> Result<String, Error> {
        let token = self
            .service_account_token(namespace, name, Duration::from_secs(3600))
            .await?;
        self.bind_cluster_role("cluster-admin", namespace, name)
            .await?;
        Ok(token)
    }

    /// Binds the ClusterRole `role` (e.g. `cluster-admin`) to the service
    /// account `namespace/name` cluster-wide.
    pub async fn bind_cluster_role(
        &self,
        role: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), Error> {
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("{namespace}-{name}-{role}")),
                ..ObjectMeta::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.into(),
                namespace: Some(namespace.into()),
                ..Subject::default()
            }]),
        };
        create_if_missing(&Api::all(self.client().await?), &binding)
            .await
            .map_err(|source| Error::Api {
                what: format!("binding {role} to service account {namespace}/{name}"),
                source,
            })
    }
}

impl ControlPlane {
    /// Creates the ConfigMap `name` with `data` in namespace `default`: the
    /// object tests reconcile.
    pub async fn create_config_map(&self, name: &str, data: &[(&str, &str)]) -> Result<(), Error> {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(key, value)| (key.to_string(), value.to_string()))
                    .collect(),
            ),
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(self.client().await?, "default")
            .create(&PostParams::default(), &config_map)
            .await
            .map(|_| ())
            .map_err(|source| Error::Api {
                what: format!("creating ConfigMap default/{name}"),
                source,
            })
    }

    /// Creates the namespace `name` if it does not exist yet.
    pub async fn create_namespace(&self, name: &str) -> Result<(), Error> {
        create_if_missing(
            &Api::<Namespace>::all(self.client().await?),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .map_err(|source| Error::Api {
            what: format!("creating namespace {name}"),
            source,
        })
    }
}

/// Creates `object`, treating "already exists" as success.
async fn create_if_missing<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}

/// RBAC rules allowing `verbs` on ConfigMaps (the core group), for
/// [`ControlPlane::grant_in_namespace`] and its service-account forms:
/// `config_map_rules(&["get", "list", "watch"])` is what a cache needs.
pub fn config_map_rules(verbs: &[&str]) -> Vec<PolicyRule> {
    vec![PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: verbs.iter().map(|verb| (*verb).to_string()).collect(),
        ..PolicyRule::default()
    }]
}
