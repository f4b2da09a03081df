//! A setting given for the whole propagation or decided per hub object
//! (its pace, its deletion policy): the hub object's own `spec` may say.

use std::borrow::Cow;
use std::sync::Arc;

/// A setting of type `T`, the same for every hub object or decided by a
/// closure from each.
pub(super) enum PerHub<K, T> {
    /// The same for every hub object.
    Fixed(T),
    /// Decided from each hub object.
    By(Arc<dyn Fn(&K) -> T + Send + Sync>),
}

impl<K, T: Clone> PerHub<K, T> {
    /// The setting for `hub`.
    pub(super) fn of(&self, hub: &K) -> Cow<'_, T> {
        match self {
            PerHub::Fixed(value) => Cow::Borrowed(value),
            PerHub::By(decide) => Cow::Owned(decide(hub)),
        }
    }

    /// The setting when no hub object is at hand (it is gone): the fixed
    /// one, or `fallback`.
    pub(super) fn fixed_or(&self, fallback: T) -> T {
        match self {
            PerHub::Fixed(value) => value.clone(),
            PerHub::By(_) => fallback,
        }
    }
}
