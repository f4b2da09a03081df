//! What the kind provider's tests share.
#![allow(unreachable_pub)]

use std::sync::Arc;

use multicluster_provider_kind::KindProvider;
use multicluster_runtime::metrics::Metrics;
use multicluster_runtime::{Aware, Error, Manager, ProviderContext, RunnableProvider};
use tokio_util::sync::CancellationToken;

/// How `provider` fails to start (it must).
pub async fn start_error(provider: KindProvider) -> Error {
    let aware: Arc<dyn Aware> =
        Arc::new(Manager::builder(multicluster_runtime::testing::offline_cluster("local")).build());
    provider
        .start(ProviderContext::new(
            CancellationToken::new(),
            aware,
            Metrics::default(),
        ))
        .await
        .expect_err("start fails")
}
