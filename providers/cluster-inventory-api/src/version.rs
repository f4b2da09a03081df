//! Which version of the Cluster Inventory API to read.
//!
//! Upstream serves `multicluster.x-k8s.io/v1alpha2` beside `v1alpha1`
//! (still the storage version, deprecated, no conversion webhook), and a
//! hub installed from a release serves `v1alpha1` only. The provider and
//! the placement reader ask the hub's discovery once, when they start, and
//! read the newest version it serves for the kind; the answer holds until
//! they start again. A CRD upgraded to serve v1alpha2 while they run is
//! read through v1alpha1 until then, which upstream keeps serving; a
//! version that stops being served shows as the hub's watch failing.

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use tokio_util::sync::CancellationToken;

/// The API group of ClusterProfiles and PlacementDecisions.
pub const GROUP: &str = "multicluster.x-k8s.io";

/// How long one discovery request may take.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A version of the Cluster Inventory API this crate reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ApiVersion {
    /// `multicluster.x-k8s.io/v1alpha1`: the released version; profiles may
    /// list access providers in the deprecated
    /// `status.credentialProviders`, and their `cluster` entries may name a
    /// CA file (`certificate-authority`).
    V1Alpha1,
    /// `multicluster.x-k8s.io/v1alpha2`: access providers only in
    /// `status.accessProviders`, cluster entries without a CA file path.
    V1Alpha2,
}

impl ApiVersion {
    /// Newest first: the order in which versions are preferred.
    const PREFERRED: [ApiVersion; 2] = [ApiVersion::V1Alpha2, ApiVersion::V1Alpha1];

    /// The version's name (`v1alpha1`, `v1alpha2`).
    pub fn name(self) -> &'static str {
        match self {
            ApiVersion::V1Alpha1 => "v1alpha1",
            ApiVersion::V1Alpha2 => "v1alpha2",
        }
    }

    /// `kind` (`ClusterProfile`, `PlacementDecision`) in this version.
    pub fn resource(self, kind: &str) -> ApiResource {
        ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, self.name(), kind))
    }

    /// The version `object` was read through, from its `apiVersion`.
    pub fn of(object: &DynamicObject) -> Option<ApiVersion> {
        let api_version = object.types.as_ref()?.api_version.as_str();
        let version = api_version.strip_prefix(GROUP)?.strip_prefix('/')?;
        Self::PREFERRED
            .into_iter()
            .find(|known| known.name() == version)
    }

    /// The newest version in which `hub` serves the resource `plural`
    /// (`clusterprofiles`), `None` when it serves neither (the CRD is not
    /// installed). Each version's discovery document is asked for with a
    /// timeout; a `404` means "not served".
    pub async fn served(
        hub: &kube::Client,
        plural: &str,
    ) -> Result<Option<ApiVersion>, kube::Error> {
        for version in Self::PREFERRED {
            let group_version = format!("{GROUP}/{}", version.name());
            let listed = tokio::time::timeout(
                DISCOVERY_TIMEOUT,
                hub.list_api_group_resources(&group_version),
            )
            .await
            .map_err(|_| {
                kube::Error::Service(
                    format!("discovery of {group_version} took longer than {DISCOVERY_TIMEOUT:?}")
                        .into(),
                )
            })?;
            match listed {
                Ok(resources) if resources.resources.iter().any(|r| r.name == plural) => {
                    return Ok(Some(version));
                }
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }

    /// [`ApiVersion::served`], asked again with backoff (1 s doubling to
    /// 30 s) while the hub cannot answer, until it does or `shutdown`
    /// fires (`None` then too). When the hub serves neither version, v1alpha1
    /// is read: its watch reports the missing CRD until it is installed.
    pub(crate) async fn decide(
        hub: &kube::Client,
        plural: &str,
        shutdown: &CancellationToken,
    ) -> Option<ApiVersion> {
        let mut delay = Duration::from_secs(1);
        let mut failures = 0u32;
        loop {
            let answer = tokio::select! {
                () = shutdown.cancelled() => return None,
                answer = Self::served(hub, plural) => answer,
            };
            match answer {
                Ok(Some(version)) => {
                    tracing::info!(
                        resource = plural,
                        version = version.name(),
                        "reading {GROUP}/{}",
                        version.name()
                    );
                    return Some(version);
                }
                Ok(None) => {
                    tracing::warn!(
                        resource = plural,
                        "the hub serves no {plural}.{GROUP} in v1alpha2 or v1alpha1 (is the CRD installed?); reading v1alpha1"
                    );
                    return Some(ApiVersion::V1Alpha1);
                }
                Err(err) => {
                    failures += 1;
                    // Once, then quietly: the hub being away is reported by
                    // the hub's own health.
                    if failures == 1 {
                        tracing::warn!(resource = plural, error = %err, "cannot ask the hub which versions of {GROUP} it serves; asking again");
                    } else {
                        tracing::debug!(resource = plural, error = %err, failures, "cannot ask the hub which versions of {GROUP} it serves");
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return None,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{GROUP}/{}", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_tells_the_version_it_was_read_through() {
        let mut profile = DynamicObject::new("a", &ApiVersion::V1Alpha2.resource("ClusterProfile"));
        assert_eq!(ApiVersion::of(&profile), Some(ApiVersion::V1Alpha2));
        profile.types.as_mut().unwrap().api_version = "multicluster.x-k8s.io/v1alpha1".into();
        assert_eq!(ApiVersion::of(&profile), Some(ApiVersion::V1Alpha1));
        profile.types.as_mut().unwrap().api_version = "other.x-k8s.io/v1alpha2".into();
        assert_eq!(ApiVersion::of(&profile), None);
        profile.types = None;
        assert_eq!(ApiVersion::of(&profile), None);
    }
}
