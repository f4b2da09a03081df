//! What both test binaries of the control plane share.

use std::time::{Duration, Instant};

/// Polls `find` every 100 ms until it returns `Some` (at most `within`),
/// and returns what it found. Every wait in these tests is on the API
/// server (the garbage collector, namespace finalization, the token
/// authenticator's cache), which tells this process nothing; the
/// runtime's `testing::eventually` cannot be used from here, as the
/// control plane is below it.
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
