//! A controller's queue and runner settings, and where each comes from:
//! its builder, else the manager's defaults (a [`ControllerSettings`],
//! fixed when the controller is added), else the crate's defaults.

use std::sync::OnceLock;
use std::time::Duration;

use super::{Backoff, DEFAULT_RECONCILE_TIMEOUT};

/// A controller's queue and runner settings: as a manager's defaults
/// (`ManagerOptions::controller_defaults`), those every controller added
/// to it takes unless its builder sets its own, as controller-runtime's
/// manager-wide controller options. `Default` is the crate's defaults.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ControllerSettings {
    /// Reconciles of one cluster at once (default 1; at least 1).
    pub max_concurrent_reconciles: usize,
    /// Reconciles at once across the fleet (default none).
    pub max_concurrent_reconciles_total: Option<usize>,
    /// How long a reconcile may run (default 5 minutes).
    pub reconcile_timeout: Option<Duration>,
    /// Error backoff (default 5 ms doubling up to 1000 s).
    pub backoff: Backoff,
    /// How long a request waits, after the last event asking for it,
    /// before it runs (default zero: at once).
    pub debounce: Duration,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            max_concurrent_reconciles: 1,
            max_concurrent_reconciles_total: None,
            reconcile_timeout: Some(DEFAULT_RECONCILE_TIMEOUT),
            backoff: Backoff::default(),
            debounce: Duration::ZERO,
        }
    }
}

multicluster_core::option_setters!(ControllerSettings {
    max_concurrent_reconciles: usize,
    max_concurrent_reconciles_total: Option<usize>,
    reconcile_timeout: Option<Duration>,
    backoff: Backoff,
    debounce: Duration,
});

/// What a builder set; everything else comes from defaults.
#[derive(Clone, Debug, Default)]
pub(crate) struct Chosen {
    pub(crate) max_concurrent_reconciles: Option<usize>,
    pub(crate) max_concurrent_reconciles_total: Option<Option<usize>>,
    pub(crate) reconcile_timeout: Option<Option<Duration>>,
    pub(crate) backoff: Option<Backoff>,
    pub(crate) debounce: Option<Duration>,
}

impl Chosen {
    fn over(&self, defaults: &ControllerSettings) -> ControllerSettings {
        ControllerSettings {
            max_concurrent_reconciles: self
                .max_concurrent_reconciles
                .unwrap_or(defaults.max_concurrent_reconciles)
                .max(1),
            max_concurrent_reconciles_total: self
                .max_concurrent_reconciles_total
                .unwrap_or(defaults.max_concurrent_reconciles_total)
                .map(|limit| limit.max(1)),
            reconcile_timeout: self.reconcile_timeout.unwrap_or(defaults.reconcile_timeout),
            backoff: self.backoff.unwrap_or(defaults.backoff),
            debounce: self.debounce.unwrap_or(defaults.debounce),
        }
    }
}

/// Settings fixed once: from a manager's defaults when the controller is
/// added to it, else from the crate's on first use.
#[derive(Debug)]
pub(crate) struct FixedOnce {
    chosen: Chosen,
    fixed: OnceLock<ControllerSettings>,
}

impl FixedOnce {
    /// Settings that defaults do not change (a work queue of one's own).
    pub(crate) fn fixed(settings: ControllerSettings) -> Self {
        Self {
            chosen: Chosen::default(),
            fixed: OnceLock::from(settings),
        }
    }

    /// `chosen`, the rest to come from defaults.
    pub(crate) fn chosen(chosen: Chosen) -> Self {
        Self {
            chosen,
            fixed: OnceLock::new(),
        }
    }

    pub(crate) fn get(&self) -> &ControllerSettings {
        self.fixed
            .get_or_init(|| self.chosen.over(&ControllerSettings::default()))
    }

    /// Takes `defaults` for what the builder left unset; false when the
    /// settings were fixed already (used before, or defaults given twice).
    pub(crate) fn take_defaults(&self, defaults: &ControllerSettings) -> bool {
        self.fixed.set(self.chosen.over(defaults)).is_ok()
    }
}
