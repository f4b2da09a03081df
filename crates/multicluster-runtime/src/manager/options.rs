//! The manager's settings.

use std::net::SocketAddr;
use std::time::Duration;

use crate::controller::ControllerSettings;

/// Manager settings: [`Default`], then the setters.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ManagerOptions {
    /// How long a newly engaged cluster may take to answer, and then its
    /// components' watches to list, before it is reported unreachable
    /// (default 30 s).
    pub sync_timeout: Duration,
    /// First retry delay for unreachable clusters, doubling up to
    /// `max_retry_delay` (default 1 s).
    pub retry_delay: Duration,
    /// Longest retry delay (default 60 s).
    pub max_retry_delay: Duration,
    /// How a cluster unreachable for long is probed less often (default:
    /// after 10 minutes, up to every 5): its retry delay grows on past
    /// `max_retry_delay`. Members' watches follow their own
    /// ([`WatchBackoff::long_outage`](crate::cache::WatchBackoff::long_outage)).
    pub long_outage: crate::cache::LongOutage,
    /// How long a failure of a ready cluster must last before it is reported
    /// degraded or unreachable (default 3 s), so that one error retried at
    /// once does not make its state flap.
    pub unhealthy_after: Duration,
    /// How long running reconciles may take to finish at shutdown (default
    /// 30 s). The whole shutdown — reconciles, the coordinator handing its
    /// clusters over, the provider stopping (and its credential plugins
    /// with it) — ends within this plus 3 s: whatever still runs then is
    /// dropped.
    pub shutdown_grace: Duration,
    /// Where to serve `/healthz`, `/readyz`, `/metrics` and `/clusters`;
    /// `None` (the default) serves nothing. Needs the `health` feature (a
    /// default one); without it, [`Manager::run`](crate::Manager::run) refuses an address.
    pub health_address: Option<SocketAddr>,
    /// Raise the process's soft limit on open files to its hard limit when
    /// [`Manager::run`](crate::Manager::run) starts (default true): a
    /// fleet holds a connection per cluster at least, and the usual soft
    /// limit, 1,024, is far below what the hard limit allows (Go raises it
    /// by itself). A cluster that cannot connect for want of file
    /// descriptors says so in its reason.
    pub raise_open_files_limit: bool,
    /// Settings every controller added to the manager takes unless its
    /// builder sets its own: concurrency, reconcile timeout, backoff,
    /// debounce (default: the crate's defaults).
    pub controller_defaults: ControllerSettings,
}

multicluster_core::option_setters!(ManagerOptions {
    sync_timeout: Duration,
    retry_delay: Duration,
    max_retry_delay: Duration,
    long_outage: crate::cache::LongOutage,
    unhealthy_after: Duration,
    shutdown_grace: Duration,
    health_address: Option<SocketAddr>,
    raise_open_files_limit: bool,
    controller_defaults: ControllerSettings,
});

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            sync_timeout: crate::cache::DEFAULT_SYNC_TIMEOUT,
            retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(60),
            long_outage: crate::cache::LongOutage::default(),
            unhealthy_after: Duration::from_secs(3),
            shutdown_grace: Duration::from_secs(30),
            health_address: None,
            raise_open_files_limit: true,
            controller_defaults: ControllerSettings::default(),
        }
    }
}
