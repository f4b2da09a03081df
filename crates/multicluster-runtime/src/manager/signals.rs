//! The signals `Manager::run_until_signal` stops on, and the flag their
//! handler raises so that no reconcile starts once one is received.

use std::sync::Arc;

/// SIGTERM and SIGINT, listened to from the moment [`Signals::install`]
/// returns (a listener made in a task of its own would miss a signal
/// received before that task first ran), until dropped.
pub(super) struct Signals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    /// Unregistered when the listener goes: a signal after the run is no
    /// longer this manager's.
    #[cfg(unix)]
    flags: Vec<signal_hook::SigId>,
}

impl Signals {
    /// Listens for the signals, and has their handler raise `flag` (lowered
    /// first: a manager run again starts open).
    pub(super) fn install(flag: &Arc<std::sync::atomic::AtomicBool>) -> Self {
        flag.store(false, std::sync::atomic::Ordering::SeqCst);
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let flags = [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT]
                .into_iter()
                .filter_map(|signal| match signal_hook::flag::register(signal, flag.clone()) {
                    Ok(id) => Some(id),
                    Err(err) => {
                        tracing::warn!(signal, error = %err, "could not have the signal close the controllers' queues at once; they close when the manager stops");
                        None
                    }
                })
                .collect();
            Self {
                terminate: signal(SignalKind::terminate()).ok(),
                interrupt: signal(SignalKind::interrupt()).ok(),
                flags,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = flag;
            Self {}
        }
    }

    /// Waits for the first of the signals.
    pub(super) async fn received(&mut self) {
        #[cfg(unix)]
        {
            async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = next(&mut self.terminate) => {}
                () = next(&mut self.interrupt) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(unix)]
impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.flags.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
