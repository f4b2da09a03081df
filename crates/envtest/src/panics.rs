//! Counting panics: input from a cluster must never panic anything, and a
//! panic inside a spawned task is caught by tokio and printed, not failed.
//!
//! ```
//! let panics = multicluster_envtest::panics::Panics::count();
//! // ... feed the code under test what it must not panic on ...
//! assert_eq!(panics.since(), 0, "panicked: {:?}", panics.messages());
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

static COUNT: AtomicUsize = AtomicUsize::new(0);
static MESSAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static INSTALLED: OnceLock<()> = OnceLock::new();

/// Panics from the moment it was made on, in every thread of the process
/// (tests of one binary running at the same time count too).
#[derive(Debug)]
pub struct Panics {
    start: usize,
}

impl Panics {
    /// Starts counting: wraps the panic hook once per process (the hook
    /// that was set still runs after it).
    pub fn count() -> Self {
        INSTALLED.get_or_init(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                COUNT.fetch_add(1, Ordering::SeqCst);
                let message = info.to_string();
                MESSAGES
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(message);
                previous(info);
            }));
        });
        Self {
            start: COUNT.load(Ordering::SeqCst),
        }
    }

    /// How many panics there were since [`Panics::count`].
    pub fn since(&self) -> usize {
        COUNT.load(Ordering::SeqCst) - self.start
    }

    /// What those panics said.
    pub fn messages(&self) -> Vec<String> {
        let messages = MESSAGES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        messages.iter().skip(self.start).cloned().collect()
    }
}
