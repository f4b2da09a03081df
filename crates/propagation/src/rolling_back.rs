//! Rolling a hub object's members back to an earlier revision: past the
//! failure budget ([`OnFailure::RollBack`](crate::OnFailure)), or asked by
//! [`ROLL_BACK_ANNOTATION`]. The rollout then rolls out the earlier
//! revision (its `revision` is that one), paced as any, and each member
//! given a slot applies what the hub object wanted then, computed again
//! from the hub object kept in the revision history.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::record::{RollingBack, RolloutStatus};
use super::rollout::{self, ROLL_BACK_ANNOTATION, Rollout};
use super::{HubKey, Shared};
use multicluster_runtime::Cluster;
use multicluster_runtime::cache::CachedResource;

/// What the rollout of a hub object goes to: a roll back, or a reason no
/// roll back could be started.
pub(super) struct Decided {
    pub(super) rolling_back: Option<RollingBack>,
    pub(super) refused: Option<String>,
}

impl Decided {
    fn none() -> Self {
        Self {
            rolling_back: None,
            refused: None,
        }
    }

    fn refused(reason: String) -> Self {
        Self {
            rolling_back: None,
            refused: Some(reason),
        }
    }
}

impl<K> Shared<K>
where
    K: CachedResource + Serialize + DeserializeOwned,
{
    /// Whether the rollout of `hub` (as JSON, at revision `current`) rolls
    /// back now: asked by the annotation (for as long as it stands), one
    /// under way for this revision, or one to start because the rollout
    /// of this revision halted and `rollout` rolls back.
    pub(super) async fn rolling_back(
        &self,
        hub_cluster: &Cluster,
        key: &HubKey,
        hub: &Value,
        current: &str,
        rollout: &Rollout,
        before: Option<&RolloutStatus>,
    ) -> Decided {
        let kept = |to: String| async move {
            self.rollouts
                .history
                .content(hub_cluster, &self.name, key, &to)
                .await
                .is_some()
        };
        if let Some(to) = rollout::roll_back_asked(hub) {
            if to == current {
                return Decided::none();
            }
            if !kept(to.clone()).await {
                return Decided::refused(format!(
                    "cannot roll back to revision {to} ({ROLL_BACK_ANNOTATION}): it is not in the revision history"
                ));
            }
            return Decided {
                rolling_back: Some(RollingBack {
                    from: current.to_string(),
                    to,
                    reason: format!("asked by {ROLL_BACK_ANNOTATION}"),
                    by_annotation: true,
                }),
                refused: None,
            };
        }
        let Some(before) = before else {
            return Decided::none();
        };
        if let Some(back) = before
            .rolling_back
            .as_ref()
            .filter(|back| back.from == current && !back.by_annotation)
        {
            return Decided {
                rolling_back: Some(back.clone()),
                refused: None,
            };
        }
        let Some(halted) = before.halted.as_ref().filter(|_| rollout.rolls_back()) else {
            return Decided::none();
        };
        if before.revision != current {
            return Decided::none();
        }
        let Some(to) = before.last_complete.clone().filter(|to| to != current) else {
            return Decided::refused(
                "cannot roll back: no earlier revision reached every member".to_string(),
            );
        };
        if !kept(to.clone()).await {
            return Decided::refused(format!(
                "cannot roll back to revision {to}: it is not in the revision history"
            ));
        }
        Decided {
            rolling_back: Some(RollingBack {
                from: current.to_string(),
                to,
                reason: halted.clone(),
                by_annotation: false,
            }),
            refused: None,
        }
    }

    /// For a member of `key` (the hub object as JSON, at revision
    /// `current`): the hub object as it was at the revision its members
    /// are rolled back to, and that revision, while a roll back is under
    /// way.
    pub(super) async fn rolled_back_to(
        &self,
        hub_cluster: &Cluster,
        key: &HubKey,
        hub: &Value,
        current: &str,
    ) -> Option<(Arc<K>, String)> {
        // Only the roll back is taken from the record, not a copy of it.
        let known = crate::lock(&self.rollouts.slots)
            .get(key)
            .map(|record| record.rolling_back.clone());
        let back = known
            .unwrap_or_else(|| self.read_record(hub).and_then(|record| record.rolling_back))
            .filter(|back| back.from == current)?;
        let content = self
            .rollouts
            .history
            .content(hub_cluster, &self.name, key, &back.to)
            .await?;
        let then: K = serde_json::from_value(content).ok()?;
        Some((Arc::new(then), back.to))
    }
}
