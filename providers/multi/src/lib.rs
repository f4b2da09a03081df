//! Several providers under one fleet (Go: `providers/multi`).
//!
//! Each provider is added under a name; its clusters join the fleet as
//! `<provider><separator><cluster>` (separator `#` by default), so the same
//! cluster name in two providers stays distinct. Lookups split the name at
//! the first separator. Providers can be added and removed at any time:
//! runnable ones start when the multi provider starts, or at once when added
//! later; removing one stops it and disengages every cluster it engaged.
//! Indexes registered on the multi provider reach every provider, including
//! those added later.

use multicluster_runtime::provider::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use multicluster_runtime::cache::FieldIndex;
use multicluster_runtime::{
    Aware, Cluster, ClusterName, Error, InventoryEngaged, Provider, ProviderContext,
    RunnableProvider,
};
use tokio_util::sync::CancellationToken;

/// The default separator between provider and cluster name.
pub const DEFAULT_SEPARATOR: &str = "#";

/// A provider made of named providers.
pub struct MultiProvider {
    separator: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    providers: BTreeMap<String, Member>,
    indexes: Vec<FieldIndex>,
    /// What the multi provider was started with: handed on to every
    /// runnable provider (also those added later) with its own stop and a
    /// prefixing engagement, so their figures reach the manager's metrics.
    started: Option<ProviderContext>,
}

struct Member {
    lookup: Arc<dyn Provider>,
    runnable: Option<Arc<dyn RunnableProvider>>,
    /// Ends the provider's run and every lifetime it handed out.
    stop: CancellationToken,
}

impl Default for MultiProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl MultiProvider {
    /// An empty multi provider with the `#` separator.
    pub fn new() -> Self {
        Self::with_separator(DEFAULT_SEPARATOR)
    }

    /// An empty multi provider with another separator.
    pub fn with_separator(separator: impl Into<String>) -> Self {
        Self {
            separator: separator.into(),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Adds a provider that discovers clusters itself; it starts now if the
    /// multi provider runs, else when it starts.
    pub async fn add_runnable<P: RunnableProvider + 'static>(
        &self,
        name: &str,
        provider: Arc<P>,
    ) -> Result<(), Error> {
        let runnable: Arc<dyn RunnableProvider> = provider.clone();
        self.insert(name, provider, Some(runnable)).await
    }

    /// Adds a provider that is only looked up.
    pub async fn add(&self, name: &str, provider: Arc<dyn Provider>) -> Result<(), Error> {
        self.insert(name, provider, None).await
    }

    async fn insert(
        &self,
        name: &str,
        lookup: Arc<dyn Provider>,
        runnable: Option<Arc<dyn RunnableProvider>>,
    ) -> Result<(), Error> {
        if name.is_empty() || name.contains(self.separator.as_str()) {
            return Err(Error::InvalidOptions {
                component: "multi provider".to_string(),
                reason: format!(
                    "provider name {name:?} must be non-empty and must not contain the separator {:?}",
                    self.separator
                ),
            });
        }
        let indexes = {
            let state = self.lock();
            if state.providers.contains_key(name) {
                return Err(Error::ProviderExists(name.to_string()));
            }
            state.indexes.clone()
        };
        for index in indexes {
            lookup.index_field(index).await?;
        }
        let mut state = self.lock();
        if state.providers.contains_key(name) {
            return Err(Error::ProviderExists(name.to_string()));
        }
        let stop = match &state.started {
            Some(context) => context.shutdown.child_token(),
            None => CancellationToken::new(),
        };
        if let (Some(context), Some(provider)) = (&state.started, &runnable) {
            // Added after the start: not part of the inventory first found.
            self.spawn(name, provider.clone(), stop.clone(), context);
        }
        state.providers.insert(
            name.to_string(),
            Member {
                lookup,
                runnable,
                stop,
            },
        );
        Ok(())
    }

    /// Removes a provider: it stops and its clusters leave the fleet.
    /// Returns whether it was there.
    pub fn remove(&self, name: &str) -> bool {
        match self.lock().providers.remove(name) {
            Some(member) => {
                member.stop.cancel();
                true
            }
            None => false,
        }
    }

    /// Names of the providers, sorted.
    pub fn provider_names(&self) -> Vec<String> {
        self.lock().providers.keys().cloned().collect()
    }

    fn spawn(
        &self,
        name: &str,
        provider: Arc<dyn RunnableProvider>,
        stop: CancellationToken,
        context: &ProviderContext,
    ) -> ProviderContext {
        let prefixed: Arc<dyn Aware> = Arc::new(Prefixed {
            prefix: format!("{name}{}", self.separator),
            stop: stop.clone(),
            aware: context.aware.clone(),
        });
        let context = context.with(stop, prefixed);
        let started = context.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            if let Err(err) = provider.start(context).await {
                tracing::error!(provider = %name, error = %err, "provider stopped with an error");
            }
        });
        started
    }

    fn split<'a>(&self, name: &'a ClusterName) -> Option<(&'a str, &'a str)> {
        name.as_str().split_once(self.separator.as_str())
    }
}

#[async_trait::async_trait]
impl Provider for MultiProvider {
    async fn get(&self, name: &ClusterName) -> Result<Cluster, Error> {
        let Some((provider, cluster)) = self.split(name) else {
            return Err(Error::ClusterNotFound(name.clone()));
        };
        let lookup = self
            .lock()
            .providers
            .get(provider)
            .map(|member| member.lookup.clone());
        match lookup {
            Some(lookup) => {
                lookup
                    .get(&ClusterName::from(cluster))
                    .await
                    .map_err(|err| match err {
                        Error::ClusterNotFound(_) => Error::ClusterNotFound(name.clone()),
                        other => other,
                    })
            }
            None => Err(Error::ClusterNotFound(name.clone())),
        }
    }

    async fn index_field(&self, index: FieldIndex) -> Result<(), Error> {
        let providers: Vec<_> = {
            let mut state = self.lock();
            state.indexes.push(index.clone());
            state
                .providers
                .values()
                .map(|member| member.lookup.clone())
                .collect()
        };
        for provider in providers {
            provider.index_field(index.clone()).await?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl RunnableProvider for MultiProvider {
    async fn start(&self, context: ProviderContext) -> Result<InventoryEngaged, Error> {
        let shutdown = context.shutdown.clone();
        let mut first = Vec::new();
        {
            let mut state = self.lock();
            if state.started.is_some() {
                return Err(Error::AlreadyStarted("multi provider"));
            }
            state.started = Some(context.clone());
            let members: Vec<_> = state
                .providers
                .iter_mut()
                .map(|(name, member)| {
                    // Re-parent the provider's lifetime under our shutdown.
                    member.stop = shutdown.child_token();
                    (name.clone(), member.runnable.clone(), member.stop.clone())
                })
                .collect();
            for (name, runnable, stop) in members {
                if let Some(provider) = runnable {
                    first.push(self.spawn(&name, provider, stop, &context));
                }
            }
        }
        // Engaged once every provider there at the start says so.
        let first_pass = async {
            for provider in &first {
                provider.when_inventory_engaged().await;
            }
        };
        let engaged = tokio::select! {
            () = shutdown.cancelled() => return Ok(context.stopped_before_engaged()),
            () = first_pass => context.inventory_engaged(),
        };
        shutdown.cancelled().await;
        Ok(engaged)
    }
}

/// Engages an inner provider's clusters under prefixed names, with lifetimes
/// that also end when that provider is removed.
struct Prefixed {
    prefix: String,
    stop: CancellationToken,
    aware: Arc<dyn Aware>,
}

impl Aware for Prefixed {
    fn engage(
        &self,
        lifetime: CancellationToken,
        name: ClusterName,
        cluster: Cluster,
    ) -> Result<(), Error> {
        let combined = self.stop.child_token();
        let ended = combined.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = lifetime.cancelled() => ended.cancel(),
                () = ended.cancelled() => {}
            }
        });
        let name = ClusterName::from(format!("{}{}", self.prefix, name.as_str()));
        self.aware.engage(combined, name, cluster)
    }
}

impl std::fmt::Debug for MultiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiProvider")
            .field("separator", &self.separator)
            .field("providers", &self.provider_names())
            .finish()
    }
}
