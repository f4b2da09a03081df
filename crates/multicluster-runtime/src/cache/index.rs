//! Field indexes: an extractor maps an object to the values it is found
//! under; queries by value are answered from the cache without a scan.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::reflector::ObjectRef;

use super::ResourceKey;

/// Maps an object to the values of one indexed field.
pub(crate) type Extractor<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// A field index to register on caches: which resource, the field name it is
/// queried by, and how to compute its values.
///
/// Built with [`FieldIndex::new`] for a Rust type or [`FieldIndex::dynamic`]
/// for a [`kube::api::DynamicObject`] resource, then handed to
/// [`crate::Provider::index_field`] (every cluster, now and later) or
/// [`super::Cache::index_field`] (one cluster).
#[derive(Clone)]
pub struct FieldIndex {
    pub(crate) resource: ResourceKey,
    pub(crate) field: String,
    /// An `Extractor<K>` for the resource's `K`, type-erased so indexes of
    /// any type can be stored together.
    pub(crate) extractor: Arc<dyn Any + Send + Sync>,
}

impl FieldIndex {
    /// An index over `K` named `field`.
    pub fn new<K>(
        field: impl Into<String>,
        extract: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Self
    where
        K: Resource<DynamicType = ()> + 'static,
    {
        let extractor: Extractor<K> = Arc::new(extract);
        Self {
            resource: ResourceKey::typed::<K>(&()),
            field: field.into(),
            extractor: Arc::new(extractor),
        }
    }

    /// An index over the dynamic resource `resource` named `field`.
    pub fn dynamic(
        resource: &kube::api::ApiResource,
        field: impl Into<String>,
        extract: impl Fn(&kube::api::DynamicObject) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        let extractor: Extractor<kube::api::DynamicObject> = Arc::new(extract);
        Self {
            resource: ResourceKey::typed::<kube::api::DynamicObject>(resource),
            field: field.into(),
            extractor: Arc::new(extractor),
        }
    }

    /// The field name queries use.
    pub fn field(&self) -> &str {
        &self.field
    }

    pub(crate) fn extractor<K: 'static>(&self) -> Option<Extractor<K>> {
        self.extractor.downcast_ref::<Extractor<K>>().cloned()
    }
}

impl std::fmt::Debug for FieldIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FieldIndex")
            .field("resource", &self.resource)
            .field("field", &self.field)
            .finish_non_exhaustive()
    }
}

/// The indexes of one informer.
pub(crate) struct Indexes<K: Resource> {
    dyntype: K::DynamicType,
    extractors: HashMap<String, Extractor<K>>,
    values: HashMap<String, HashMap<String, HashSet<ObjectRef<K>>>>,
}

impl<K> Indexes<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub(crate) fn new(dyntype: K::DynamicType) -> Self {
        Self {
            dyntype,
            extractors: HashMap::new(),
            values: HashMap::new(),
        }
    }

    /// Adds an extractor; false when the field was indexed already (the
    /// first registration wins, as in controller-runtime).
    pub(crate) fn insert(&mut self, field: String, extractor: Extractor<K>) -> bool {
        if self.extractors.contains_key(&field) {
            return false;
        }
        self.extractors.insert(field, extractor);
        true
    }

    /// Recomputes one field for all `objects`.
    pub(crate) fn rebuild(&mut self, field: &str, objects: &[Arc<K>]) {
        let Some(extract) = self.extractors.get(field).cloned() else {
            return;
        };
        let mut values: HashMap<String, HashSet<ObjectRef<K>>> = HashMap::new();
        for obj in objects {
            let key = ObjectRef::from_obj_with(&**obj, self.dyntype.clone());
            for value in extract(obj) {
                values.entry(value).or_default().insert(key.clone());
            }
        }
        self.values.insert(field.to_string(), values);
    }

    /// Moves `key` from the values of `old` to those of `new`.
    pub(crate) fn replace(&mut self, key: &ObjectRef<K>, old: Option<&K>, new: Option<&K>) {
        for (field, extract) in &self.extractors {
            let values = self.values.entry(field.clone()).or_default();
            if let Some(old) = old {
                for value in extract(old) {
                    if let Some(keys) = values.get_mut(&value) {
                        keys.remove(key);
                        if keys.is_empty() {
                            values.remove(&value);
                        }
                    }
                }
            }
            if let Some(new) = new {
                for value in extract(new) {
                    values.entry(value).or_default().insert(key.clone());
                }
            }
        }
    }

    pub(crate) fn lookup(&self, field: &str, value: &str) -> Vec<ObjectRef<K>> {
        self.values
            .get(field)
            .and_then(|values| values.get(value))
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }
}
