//! Members taken out for maintenance, by a label on their cluster that
//! every propagation honours (`kubectl fleet cordon` and `drain` in
//! KubeFleet): cordoned, a member gets no new revision and keeps what it
//! has; drained, it loses what was propagated, as if it had left every
//! selection. Without the label it catches up.

use multicluster_runtime::Cluster;

/// The cluster label that takes a member out for maintenance: `cordon`
/// (no new revision; what it has stays) or `drain` (what was propagated
/// is let go at once, by the deletion policies, latest wave first).
/// Set on the cluster's inventory object (its kubeconfig Secret, its
/// ClusterProfile, ...), so that every propagation sees it.
pub const MAINTENANCE_LABEL: &str = "propagation.mcr.sigs.k8s.io/maintenance";

/// Whether a member is taken out, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Maintenance {
    /// In service.
    None,
    /// No new revision; what it has stays (and is kept as it is).
    Cordoned,
    /// What was propagated goes.
    Drained,
}

impl Maintenance {
    /// What `member`'s labels say. A value other than `cordon` or `drain`
    /// is taken as `cordon`: a label meant to take it out never leaves it
    /// in service by a typo.
    pub(crate) fn of(member: &Cluster) -> Self {
        // The inventory is shared (an `Arc`): no copy of the labels per
        // reconcile.
        let inventory = member.inventory();
        Self::from_label(inventory.labels.get(MAINTENANCE_LABEL).map(String::as_str))
    }

    fn from_label(value: Option<&str>) -> Self {
        match value {
            None => Maintenance::None,
            Some("drain") => Maintenance::Drained,
            Some(_) => Maintenance::Cordoned,
        }
    }

    /// Whether it takes no part in rollouts.
    pub(crate) fn is_out(self) -> bool {
        self != Maintenance::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_meant_to_take_a_member_out_never_leaves_it_in() {
        assert_eq!(Maintenance::from_label(None), Maintenance::None);
        assert_eq!(Maintenance::from_label(Some("drain")), Maintenance::Drained);
        for value in ["cordon", "Cordon", "", "drained", "yes"] {
            assert_eq!(
                Maintenance::from_label(Some(value)),
                Maintenance::Cordoned,
                "{value:?}"
            );
        }
    }
}
