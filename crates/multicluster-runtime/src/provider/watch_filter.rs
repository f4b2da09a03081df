//! The watch-filter convention of Cluster API's multi-instance contract:
//! several instances of one provider share a cluster, each taking only the
//! objects labelled `cluster.x-k8s.io/watch-filter=<its value>`. An empty
//! value, like none, takes everything (deployments often pass the flag or
//! variable empty).

use std::collections::BTreeMap;

/// The label key.
pub const LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// The label selector `filter` asks for; `None` when it takes everything.
pub fn selector(filter: Option<&str>) -> Option<String> {
    filter
        .filter(|value| !value.is_empty())
        .map(|value| format!("{LABEL}={value}"))
}

/// Whether an object with `labels` passes `filter`.
pub fn passes(filter: Option<&str>, labels: Option<&BTreeMap<String, String>>) -> bool {
    match filter.filter(|value| !value.is_empty()) {
        None => true,
        Some(value) => {
            labels
                .and_then(|labels| labels.get(LABEL))
                .map(String::as_str)
                == Some(value)
        }
    }
}

/// A watcher configuration that lists only objects passing `filter`.
pub fn watcher_config(filter: Option<&str>) -> kube::runtime::watcher::Config {
    let config = kube::runtime::watcher::Config::default();
    match selector(filter) {
        Some(selector) => config.labels(&selector),
        None => config,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_filter_takes_everything() {
        assert_eq!(selector(None), None);
        assert_eq!(selector(Some("")), None);
        assert_eq!(watcher_config(Some("")).label_selector, None);
        let labelled = BTreeMap::from([(LABEL.to_string(), "a".to_string())]);
        assert!(passes(Some(""), None));
        assert!(passes(Some(""), Some(&labelled)));
        assert!(passes(None, None));
    }

    #[test]
    fn a_value_takes_only_objects_labelled_with_it() {
        assert_eq!(
            selector(Some("a")).as_deref(),
            Some("cluster.x-k8s.io/watch-filter=a")
        );
        assert_eq!(
            watcher_config(Some("a")).label_selector.as_deref(),
            Some("cluster.x-k8s.io/watch-filter=a")
        );
        let labelled = |value: &str| BTreeMap::from([(LABEL.to_string(), value.to_string())]);
        assert!(passes(Some("a"), Some(&labelled("a"))));
        assert!(!passes(Some("a"), Some(&labelled("b"))));
        assert!(!passes(Some("a"), None));
    }
}
