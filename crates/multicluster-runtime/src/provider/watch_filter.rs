//! The watch-filter convention of Cluster API's multi-instance contract:
//! several instances of one provider share a cluster, each taking only the
//! objects labelled `cluster.x-k8s.io/watch-filter=<its value>`. An empty
//! value, like none, takes everything (deployments often pass the flag or
//! variable empty).

use std::collections::BTreeMap;

/// One instance's watch filter: the value it takes, or none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchFilter<'a>(Option<&'a str>);

impl<'a> WatchFilter<'a> {
    /// The label key.
    pub const LABEL: &'static str = "cluster.x-k8s.io/watch-filter";

    /// The filter for `value`; `None` and the empty value take everything.
    pub fn new(value: Option<&'a str>) -> Self {
        Self(value.filter(|value| !value.is_empty()))
    }

    /// The label selector it asks for; `None` when it takes everything.
    pub fn selector(self) -> Option<String> {
        self.0.map(|value| format!("{}={value}", Self::LABEL))
    }

    /// Whether an object with `labels` passes it.
    pub fn passes(self, labels: Option<&BTreeMap<String, String>>) -> bool {
        match self.0 {
            None => true,
            Some(value) => {
                labels
                    .and_then(|labels| labels.get(Self::LABEL))
                    .map(String::as_str)
                    == Some(value)
            }
        }
    }

    /// A watcher configuration that lists only objects passing it.
    pub fn watcher_config(self) -> kube::runtime::watcher::Config {
        let config = kube::runtime::watcher::Config::default();
        match self.selector() {
            Some(selector) => config.labels(&selector),
            None => config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_filter_takes_everything() {
        for filter in [WatchFilter::new(None), WatchFilter::new(Some(""))] {
            assert_eq!(filter.selector(), None);
            assert_eq!(filter.watcher_config().label_selector, None);
        }
        let labelled = BTreeMap::from([(WatchFilter::LABEL.to_string(), "a".to_string())]);
        assert!(WatchFilter::new(Some("")).passes(None));
        assert!(WatchFilter::new(Some("")).passes(Some(&labelled)));
        assert!(WatchFilter::new(None).passes(None));
    }

    #[test]
    fn a_value_takes_only_objects_labelled_with_it() {
        let filter = WatchFilter::new(Some("a"));
        assert_eq!(
            filter.selector().as_deref(),
            Some("cluster.x-k8s.io/watch-filter=a")
        );
        assert_eq!(
            filter.watcher_config().label_selector.as_deref(),
            Some("cluster.x-k8s.io/watch-filter=a")
        );
        let labelled =
            |value: &str| BTreeMap::from([(WatchFilter::LABEL.to_string(), value.to_string())]);
        assert!(filter.passes(Some(&labelled("a"))));
        assert!(!filter.passes(Some(&labelled("b"))));
        assert!(!filter.passes(None));
    }
}
