//! What both test binaries of the control plane share.

#![allow(dead_code)] // each test file uses its own part

use std::time::{Duration, Instant};

/// Waits (at most `within`) until the object `name` of `api` satisfies
/// `that` (`None`: it does not exist), watching it with kube-runtime's
/// `await_condition`; a watch the server ends with an error (it was just
/// restarted) is opened again. Returns the object as it then was.
pub(crate) async fn until_object<K>(
    within: Duration,
    api: &kube::Api<K>,
    name: &str,
    what: &str,
    that: impl Fn(Option<&K>) -> bool + Clone,
) -> Option<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let waited = tokio::time::timeout(within, async {
        loop {
            match kube::runtime::wait::await_condition(api.clone(), name, that.clone()).await {
                Ok(object) => return object,
                Err(err) => {
                    tracing::debug!(%err, "watching {name} again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("timed out after {within:?} waiting for {what} (watched)"))
}

/// Polls `find` every 100 ms until it returns `Some` (at most `within`),
/// and returns what it found: for what nothing tells of, neither a watch
/// nor a signal (the token authenticator's cache, a port another process
/// holds). The runtime's `testing::eventually` cannot be used from here,
/// as the control plane is below it.
pub(crate) async fn eventually<T, F, Fut>(within: Duration, what: &str, mut find: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = find().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
