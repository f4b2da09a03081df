//! This replica's own record of the clusters it works on, for tests and
//! benchmarks that check the sharding from outside: a component engaged
//! with every cluster the coordinator hands this replica, under the same
//! lifetime as the controllers, appending a line when it starts and when
//! that lifetime ends.
//!
//! Each line is `<nanoseconds> <start|stop> <cluster>`, the time read from
//! `CLOCK_MONOTONIC`, which every process of the machine shares, so the
//! ledgers of several replicas can be laid side by side. Lines are written
//! one `write` each, unbuffered, so a replica killed with SIGKILL loses
//! none it had written.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use multicluster_runtime::multicluster::Aware;
use multicluster_runtime::{Cluster, ClusterName, Error};
use tokio_util::sync::CancellationToken;

/// Appends this replica's start and stop of work on each cluster to a file.
pub(crate) struct Ledger {
    file: Arc<Mutex<File>>,
    /// Per cluster, the engagement whose stop line is not written yet
    /// (numbered, so an old one's end does not remove a newer one), fired
    /// once it is: the coordinator hands a cluster over only after
    /// [`Aware::settled`], so the next owner's start line comes after it.
    pending: Arc<Mutex<HashMap<ClusterName, (u64, CancellationToken)>>>,
    engagements: AtomicU64,
}

impl Ledger {
    /// A ledger appending to `path` (created if missing).
    pub(crate) fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
            pending: Arc::default(),
            engagements: AtomicU64::new(0),
        })
    }
}

fn append(file: &Mutex<File>, what: &str, cluster: &ClusterName) {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let nanos = u128::try_from(now.tv_sec).unwrap_or_default() * 1_000_000_000
        + u128::try_from(now.tv_nsec).unwrap_or_default();
    let line = format!("{nanos} {what} {cluster}\n");
    let mut file = lock(file);
    if let Err(err) = file.write_all(line.as_bytes()) {
        tracing::warn!(error = %err, "cannot write the ownership ledger");
    }
}

impl Aware for Ledger {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        _cluster: Cluster,
    ) -> Result<(), Error> {
        if name.is_local() || lifetime.is_cancelled() {
            return Ok(());
        }
        append(&self.file, "start", &name);
        let number = self.engagements.fetch_add(1, Ordering::Relaxed);
        let written = CancellationToken::new();
        lock(&self.pending).insert(name.clone(), (number, written.clone()));
        let (file, pending) = (self.file.clone(), self.pending.clone());
        tokio::spawn(async move {
            lifetime.cancelled().await;
            append(&file, "stop", &name);
            let mut pending = lock(&pending);
            if pending.get(&name).is_some_and(|(n, _)| *n == number) {
                pending.remove(&name);
            }
            written.cancel();
        });
        Ok(())
    }

    fn settled(&self, name: &ClusterName) -> BoxFuture<'static, ()> {
        let written = lock(&self.pending)
            .get(name)
            .map(|(_, token)| token.clone());
        Box::pin(async move {
            if let Some(written) = written {
                written.cancelled().await;
            }
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
