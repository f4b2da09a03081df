//! What an informer tells its subscribers.

use std::sync::Arc;

/// A change seen by an informer.
#[derive(Debug)]
pub enum CacheEvent<K> {
    /// The object was created or changed. `old` is the previous version the
    /// cache held, if any (a late subscriber's initial contents have none).
    Applied {
        /// The version before the change.
        old: Option<Arc<K>>,
        /// The current version.
        new: Arc<K>,
    },
    /// The object was deleted (also reported when a relist no longer finds
    /// an object, i.e. it was deleted while the watch was down).
    Deleted(Arc<K>),
}

impl<K> CacheEvent<K> {
    /// The object the event is about (the new version for `Applied`).
    pub fn object(&self) -> &Arc<K> {
        match self {
            CacheEvent::Applied { new, .. } => new,
            CacheEvent::Deleted(obj) => obj,
        }
    }
}

impl<K> Clone for CacheEvent<K> {
    fn clone(&self) -> Self {
        match self {
            CacheEvent::Applied { old, new } => CacheEvent::Applied {
                old: old.clone(),
                new: new.clone(),
            },
            CacheEvent::Deleted(obj) => CacheEvent::Deleted(obj.clone()),
        }
    }
}
