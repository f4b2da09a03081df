//! What [`Manager::run`] does besides waiting, step by step: start the
//! coordinator, the local cluster's engagement, the controllers and the
//! provider; serve until shutdown (or until the provider ends); stop each
//! part in order, within a bound nothing extends.
//!
//! Two lifetimes order the stop: `stop` ends reconciling (on shutdown, or
//! when the provider fails; with a coordinator that hands clusters over as
//! it leaves, once it has); `components_stop` ends cluster lifetimes and
//! the provider, only after running reconciles have finished with their
//! clusters.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use super::Manager;
use crate::controller::Controller;
use crate::error::Error;
use crate::multicluster::{Aware, ProviderContext};
use crate::sync::stop_within;
use multicluster_core::{ClusterName, lock};

/// The parts of a running manager, and the lifetimes that stop them.
pub(super) struct Running {
    stop: CancellationToken,
    components_stop: CancellationToken,
    grace: Duration,
    controllers: JoinSet<()>,
    /// Controllers added while running.
    late: UnboundedReceiver<Controller>,
    coordinator: JoinSet<Result<(), Error>>,
    provider: JoinSet<Result<(), Error>>,
}

impl Manager {
    /// Raises the open-files limit, if the options ask for it.
    pub(super) fn raise_open_files_limit(&self) {
        if !self.inner.options.raise_open_files_limit {
            return;
        }
        match crate::open_files::raise_open_files_limit() {
            Ok((before, after)) if before != after => {
                tracing::info!(?before, ?after, "raised the open-files limit");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "could not raise the open-files limit"),
        }
    }

    /// Starts the coordinator, engages the local cluster, runs the
    /// controllers added so far and starts the provider.
    pub(super) fn start(&self, shutdown: &CancellationToken) -> Result<Running, Error> {
        let coordinator = self.coordinator();
        let stop = if coordinator.hands_over_on_leave() {
            CancellationToken::new()
        } else {
            shutdown.child_token()
        };
        let components_stop = CancellationToken::new();
        let mut coordinator_task = JoinSet::new();
        let coordinator_stop = components_stop.clone();
        coordinator_task.spawn(async move { coordinator.run(coordinator_stop).await });
        self.engage(
            components_stop.child_token(),
            ClusterName::local(),
            self.inner.local.clone(),
        )?;
        let grace = self.inner.options.shutdown_grace;
        // Controllers added from now on come through `late` (taken under the
        // same lock, so none is missed or run twice).
        let (start_late, late) = tokio::sync::mpsc::unbounded_channel();
        let added = {
            let mut controllers = lock(&self.inner.controllers);
            controllers.start = Some(start_late);
            controllers.added.clone()
        };
        let mut running = Running {
            stop,
            components_stop,
            grace,
            controllers: JoinSet::new(),
            late,
            coordinator: coordinator_task,
            provider: JoinSet::new(),
        };
        for controller in added {
            running.run_controller(controller);
        }
        self.start_provider(&mut running);
        tokio::spawn(self.clone().watch_health(running.components_stop.clone()));
        self.inner.started.send_replace(true);
        Ok(running)
    }

    /// Starts the provider, and tells the coordinator once every cluster
    /// the provider engaged at first was also checked (handed to the
    /// coordinator, or found unreachable).
    fn start_provider(&self, running: &mut Running) {
        let Some(provider) = self.inner.runnable.clone() else {
            self.coordinator().inventory_engaged();
            return;
        };
        let context = ProviderContext::new(
            running.components_stop.clone(),
            Arc::new(self.clone()) as Arc<dyn Aware>,
            self.inner.metrics.clone(),
        );
        let (told, manager) = (context.clone(), self.clone());
        tokio::spawn(async move {
            let engaged = async {
                told.when_inventory_engaged().await;
                manager.all_checked().await;
            };
            tokio::select! {
                () = engaged => manager.coordinator().inventory_engaged(),
                () = told.shutdown.cancelled() => {}
            }
        });
        running
            .provider
            .spawn(async move { provider.start(context).await.map(drop) });
    }

    /// While the controllers still work on what is not handed yet (a
    /// sharded replica's clusters go to the others one by one), the
    /// coordinator hands clusters over; taken out of the grace period.
    pub(super) async fn leave(&self, grace: Duration) {
        let coordinator = self.coordinator();
        if tokio::time::timeout(grace, coordinator.leave())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "the coordinator did not finish handing clusters over within the shutdown grace"
            );
        }
    }
}

impl Running {
    fn run_controller(&mut self, controller: Controller) {
        let (stop, grace) = (self.stop.clone(), self.grace);
        self.controllers
            .spawn(async move { controller.run(stop, grace).await });
    }

    /// Runs controllers added meanwhile until `shutdown`, or until the
    /// provider ends on its own (it failed, or gave up), which ends the
    /// manager: carrying on without a fleet would hide the failure. Returns
    /// how the provider ended, if it did.
    pub(super) async fn serve(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Option<Result<Result<(), Error>, JoinError>> {
        loop {
            let provider_ends = async {
                match self.provider.join_next().await {
                    Some(result) => result,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return None,
                result = provider_ends => return Some(result),
                Some(controller) = self.late.recv() => self.run_controller(controller),
            }
        }
    }

    /// Stops reconciling, waits for running reconciles, then ends cluster
    /// lifetimes, the coordinator and the provider, each within
    /// `deadline`; returns how the provider ended.
    pub(super) async fn stop(
        mut self,
        manager: &Manager,
        provider_ended: Option<Result<Result<(), Error>, JoinError>>,
        deadline: tokio::time::Instant,
    ) -> Result<(), Error> {
        self.stop.cancel();
        tracing::info!("shutting down: no new reconciles; waiting for running ones");
        stop_within(&mut self.controllers, deadline, "the controllers").await;
        manager.inner.stopping.cancel();
        self.components_stop.cancel();
        match stop_within(&mut self.coordinator, deadline, "the coordinator")
            .await
            .pop()
        {
            Some(Ok(Ok(()))) | None => {}
            Some(Ok(Err(err))) => tracing::error!(error = %err, "the coordinator failed"),
            Some(Err(err)) => tracing::error!(error = %err, "the coordinator task failed"),
        }
        let provider_result = match provider_ended {
            Some(result) => result,
            None => stop_within(&mut self.provider, deadline, "the provider")
                .await
                .pop()
                .unwrap_or(Ok(Ok(()))),
        };
        match provider_result {
            Ok(result) => result,
            Err(source) => Err(Error::TaskFailed {
                task: "the provider",
                source,
            }),
        }
    }
}
