//! How a watch gets the objects that exist when it starts: from a
//! streaming list where the server serves one, else from a LIST.
//!
//! A streaming list is a watch with `sendInitialEvents=true`: the server
//! sends every current object as an added event, then a bookmark
//! annotated `k8s.io/initial-events-end`, then changes. kube-runtime's
//! watcher speaks it (`InitialListStrategy::StreamingList`) but has no
//! way back when a server refuses it, and a refused watch would be retried
//! as it is, forever. A server that does not serve it says so when the
//! watch starts: `sendInitialEvents` is forbidden while the `WatchList`
//! feature is off (Kubernetes 1.27 to 1.31 by default), and
//! `resourceVersionMatch` on a watch is invalid before 1.27; both are
//! refusals (422 Invalid or 400 Bad Request) before any event. Such a watch
//! ends at once and the next one, started without delay, lists; the
//! choice holds for the rest of the watch's life. client-go falls back the
//! same way on any error, and tries a streaming list again on every start;
//! a refusal here is specific, so other errors (403, an unreachable
//! server) keep their own backoff and the streaming list.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::runtime::watcher::{self, InitialListStrategy};

/// The initial-list choice of one watch, shared by its restarts.
#[derive(Clone, Debug)]
pub(super) struct InitialList {
    /// Whether the next start asks for a streaming list.
    streaming: Arc<AtomicBool>,
    /// `group/version/plural`, for the log line of a fallback.
    resource: Arc<str>,
}

impl InitialList {
    /// Streaming lists first when `streaming` (the cache's
    /// `streaming_lists`), else whatever the watcher settings say.
    pub(super) fn new(streaming: bool, resource: String) -> Self {
        Self {
            streaming: Arc::new(AtomicBool::new(streaming)),
            resource: resource.into(),
        }
    }

    /// The settings of the next start: `base`, asking for a streaming list
    /// unless the server refused one.
    pub(super) fn config(&self, base: &watcher::Config) -> (watcher::Config, bool) {
        let streaming = self.streaming.load(Ordering::Relaxed);
        let mut config = base.clone();
        if streaming {
            config.initial_list_strategy = InitialListStrategy::StreamingList;
        }
        (config, streaming)
    }

    /// Whether `event`, from a start that asked for a streaming list, is
    /// the server refusing it; if it is, the next start lists.
    pub(super) fn refused<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
        if !is_refusal(event) {
            return false;
        }
        self.streaming.store(false, Ordering::Relaxed);
        if let Err(err) = event {
            // The server's message names the parameter it refused; it
            // holds no credential.
            tracing::info!(
                resource = %self.resource,
                reason = %crate::redact::watcher(err),
                "the API server does not serve streaming lists; listing and watching instead"
            );
        }
        true
    }
}

/// A watch that asked for a streaming list and was refused before it began.
fn is_refusal<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
    matches!(
        event,
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))
            if status.code == 400 || status.code == 422
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::Status;

    fn start_failed(code: u16) -> Result<watcher::Event<ConfigMap>, watcher::Error> {
        let status = Status::failure("refused", "Invalid").with_code(code);
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(
            Box::new(status),
        )))
    }

    #[test]
    fn a_refused_streaming_list_turns_the_next_start_into_a_list() {
        let choice = InitialList::new(true, "/v1/configmaps".into());
        let base = watcher::Config::default().page_size(50);
        let (config, streaming) = choice.config(&base);
        assert!(streaming);
        assert_eq!(
            config.initial_list_strategy,
            InitialListStrategy::StreamingList
        );
        assert_eq!(config.page_size, Some(50), "the other settings are kept");

        assert!(choice.refused(&start_failed(422)));
        let (config, streaming) = choice.config(&base);
        assert!(!streaming);
        assert_eq!(config, base, "listed as the watcher settings say");
    }

    #[test]
    fn other_failures_keep_the_streaming_list() {
        let choice = InitialList::new(true, "/v1/configmaps".into());
        for code in [403, 404, 429, 500, 503] {
            assert!(!choice.refused(&start_failed(code)), "{code}");
        }
        let gone: Result<watcher::Event<ConfigMap>, watcher::Error> =
            Err(watcher::Error::WatchError(Box::new(
                Status::failure("expired", "Expired").with_code(410),
            )));
        assert!(!choice.refused(&gone));
        assert!(!choice.refused(&Ok(watcher::Event::<ConfigMap>::Init)));
        assert!(choice.config(&watcher::Config::default()).1);
    }

    #[test]
    fn turned_off_it_leaves_the_watcher_settings_alone() {
        let choice = InitialList::new(false, "/v1/configmaps".into());
        let base = watcher::Config::default();
        assert_eq!(choice.config(&base), (base.clone(), false));
        let streaming = watcher::Config::default().streaming_lists();
        assert_eq!(choice.config(&streaming), (streaming.clone(), false));
    }
}
