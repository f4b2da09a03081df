//! One admission webhook: its name, kind, the resource it admits (for its
//! registration) and its handler, typed or dynamic.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use hyper::body::Bytes;
use kube::api::{ApiResource, DynamicObject};
use kube::core::Resource;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde::de::DeserializeOwned;

use multicluster_runtime::Cluster;

/// Validating (allow or deny) or mutating (also patch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookKind {
    /// Registered in a `ValidatingWebhookConfiguration`.
    Validating,
    /// Registered in a `MutatingWebhookConfiguration`; its responses may
    /// carry a JSON patch ([`AdmissionResponse::with_patch`]).
    Mutating,
}

/// Why a request got no admission answer: the API server then applies the
/// webhook's failure policy.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// The body is not an AdmissionReview of the webhook's type.
    BadRequest(String),
    /// The handler failed (its error, redacted).
    Failed(String),
    /// The body is longer than the server takes (the limit).
    TooLarge(usize),
}

/// The handler without its types: an AdmissionReview's JSON in, the
/// response review's JSON out.
pub(crate) type Handle = Arc<
    dyn Fn(Cluster, Bytes) -> BoxFuture<'static, Result<(bool, Vec<u8>), Unanswered>> + Send + Sync,
>;

/// An admission webhook, served by a [`WebhookServer`](super::WebhookServer)
/// for every engaged cluster at its own path ([`super::path`]), and
/// registered in members by [`Registration`](super::Registration).
#[derive(Clone)]
pub struct Webhook {
    pub(crate) name: String,
    pub(crate) kind: WebhookKind,
    pub(crate) resource: ApiResource,
    pub(crate) handle: Handle,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("resource", &self.resource.plural)
            .finish_non_exhaustive()
    }
}

impl Webhook {
    /// A validating webhook over `K`: `handler` gets the cluster the
    /// request came from (its client, its cache) and the request, and
    /// answers with kube's [`AdmissionResponse`]
    /// (`AdmissionResponse::from(&request)` allows, `.deny(message)`
    /// refuses with that message). An error, or no answer within the
    /// server's deadline, leaves the request to the webhook's failure
    /// policy. `name` is the webhook's path segment and metrics label
    /// (a DNS-1123 label).
    pub fn validating<K, F, Fut, E>(name: impl Into<String>, handler: F) -> Self
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
        F: Fn(Cluster, AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AdmissionResponse, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::typed(name, WebhookKind::Validating, handler)
    }

    /// A mutating webhook over `K`: as [`Webhook::validating`], and the
    /// response may carry a JSON patch.
    pub fn mutating<K, F, Fut, E>(name: impl Into<String>, handler: F) -> Self
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
        F: Fn(Cluster, AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AdmissionResponse, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::typed(name, WebhookKind::Mutating, handler)
    }

    fn typed<K, F, Fut, E>(name: impl Into<String>, kind: WebhookKind, handler: F) -> Self
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
        F: Fn(Cluster, AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AdmissionResponse, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        let resource = ApiResource::erase::<K>(&());
        Self::with_handle(name, kind, resource, handle::<K, F, Fut, E>(handler))
    }

    /// A webhook over a resource known at run time (`kind` says which
    /// sort), its objects as [`DynamicObject`]s.
    pub fn dynamic<F, Fut, E>(
        name: impl Into<String>,
        kind: WebhookKind,
        resource: ApiResource,
        handler: F,
    ) -> Self
    where
        F: Fn(Cluster, AdmissionRequest<DynamicObject>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AdmissionResponse, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::with_handle(
            name,
            kind,
            resource,
            handle::<DynamicObject, F, Fut, E>(handler),
        )
    }

    fn with_handle(
        name: impl Into<String>,
        kind: WebhookKind,
        resource: ApiResource,
        handle: Handle,
    ) -> Self {
        Self {
            name: name.into(),
            kind,
            resource,
            handle,
        }
    }

    /// The webhook's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Validating or mutating.
    pub fn kind(&self) -> WebhookKind {
        self.kind
    }

    /// The resource it admits.
    pub fn resource(&self) -> &ApiResource {
        &self.resource
    }
}

fn handle<K, F, Fut, E>(handler: F) -> Handle
where
    K: Resource + DeserializeOwned + Send + 'static,
    F: Fn(Cluster, AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<AdmissionResponse, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    let handler = Arc::new(handler);
    Arc::new(move |cluster, body| {
        let review: AdmissionReview<K> = match serde_json::from_slice(&body) {
            Ok(review) => review,
            Err(err) => {
                let why = format!("not an AdmissionReview of this webhook's type: {err}");
                return std::future::ready(Err(Unanswered::BadRequest(why))).boxed();
            }
        };
        let request: AdmissionRequest<K> = match review.try_into() {
            Ok(request) => request,
            Err(err) => {
                let why = format!("an AdmissionReview without a request: {err}");
                return std::future::ready(Err(Unanswered::BadRequest(why))).boxed();
            }
        };
        let answer = handler(cluster, request);
        async move {
            let response = answer.await.map_err(|err| {
                Unanswered::Failed(
                    multicluster_runtime::redact::Redacted::error(&err)
                        .as_str()
                        .to_string(),
                )
            })?;
            let allowed = response.allowed;
            let body = serde_json::to_vec(&response.into_review()).map_err(|err| {
                Unanswered::Failed(format!("the response cannot be encoded: {err}"))
            })?;
            Ok((allowed, body))
        }
        .boxed()
    })
}
