//! The preflight of a change of minor version (an upgrade to the next minor,
//! or an online downgrade). It guards the write that starts the roll, the
//! StatefulSet's with the new version, and answers, in this order:
//!
//! 1. a member whose etcd runs with the v2 store enabled, on the way to
//!    3.6: refused. etcd's 3.6 upgrade guide asks for `etcdutl check
//!    v2store` exactly then (docs v3.6 `upgrades/upgrade_3_6`, "V2 Store":
//!    only when `--enable-v2` or `ETCD_ENABLE_V2=true` is configured).
//!    etcdfleet never renders either, so only a member started by hand with
//!    them meets this rule; the refusal says what to run;
//! 2. a voting member that is not healthy: the StatefulSet is held (the
//!    other rules go on: a failed member is replaced on the old version);
//! 3. a backup destination and no snapshot recorded for this change: take
//!    one (streamed from a healthy member, verified, recorded in
//!    `status.versionChangeSnapshot`). After a failed snapshot the change is
//!    refused, naming the failure, until a retry (with the planner's
//!    backoff) succeeds.
//!
//! That every member runs at least the gate patch is the version policy's
//! own check of each member's reported version (`plan::refusal`): a member
//! below the gate refuses the change with nothing touched.

use etcdfleet_api::version::DOWNGRADE_ANNOTATION;

use super::{Gate, VersionStep, statefulset_pending};
use crate::etcdcluster::plan::{EtcdObservation, Observation, Plan, Refusal, Step, retry_delay};

/// Condition reason of a change refused for its snapshot.
pub const SNAPSHOT_FAILED: &str = "SnapshotBeforeVersionChangeFailed";
/// Condition reason of a change refused for the v2 store.
pub const V2_STORE_ENABLED: &str = "V2StoreEnabled";

/// The preflight's answer, if it has one (see the module docs).
pub fn preflight(obs: &Observation) -> Option<Gate> {
    let (from, to) = obs.version.minor_change.as_ref()?;
    obs.statefulset.as_ref()?;
    if !statefulset_pending(obs) {
        return None;
    }
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return None;
    };
    let change = if to > from {
        "minor upgrade"
    } else {
        "online downgrade"
    };
    if from.minor < 6 && to.minor >= 6 && !obs.version.v2_enabled.is_empty() {
        return Some(Gate::Take(Plan::Refuse(Refusal {
            reason: V2_STORE_ENABLED,
            message: format!(
                "the {change} from {from} to {to} is refused: {} run etcd with the v2 store \
                 enabled (--enable-v2), which 3.6 removed. As etcd's 3.6 upgrade guide asks, run \
                 `etcdutl check v2store` on each member's data directory, migrate or remove any \
                 custom v2 data, and start the members without --enable-v2; set version back to \
                 {from} meanwhile",
                obs.version.v2_enabled.join(", ")
            ),
        })));
    }
    if let Some(sick) = health.voters().find(|m| !m.healthy) {
        return Some(Gate::HoldStatefulSet(format!(
            "the {change} from {from} to {to} starts once every member is healthy: {} is not",
            sick.member.peer_urls.first().map_or_else(
                || format!("{:x}", sick.member.id),
                |u| obs
                    .names
                    .ordinal_of_peer_url(u)
                    .map_or(u.clone(), |o| obs.names.pod(o)),
            )
        )));
    }
    let destination = obs.version.backup_destination.as_ref()?;
    if obs.version.snapshot_taken {
        return None;
    }
    let step = VersionStep::SnapshotBefore {
        from: from.to_string(),
        to: to.to_string(),
    };
    if let Some(failed) = &obs.last_failure
        && failed.kind == step.kind()
        && failed.age < retry_delay(failed.failures)
    {
        return Some(Gate::Take(Plan::Refuse(Refusal {
            reason: SNAPSHOT_FAILED,
            message: format!(
                "the {change} from {from} to {to} is refused until a snapshot to {destination} \
                 succeeds (failed {} time(s), retried with backoff): {}. Fix the destination or \
                 its credentials, or set version back to {from}{}; nothing was changed",
                failed.failures,
                failed.message,
                if to < from {
                    format!(" and remove {DOWNGRADE_ANNOTATION}")
                } else {
                    String::new()
                }
            ),
        })));
    }
    Some(Gate::Take(Plan::Act(Step::Version(step))))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{cluster, failed, minor_change, sick};
    use super::*;
    use crate::etcdcluster::plan::{ObjectKind, plan_next_step};

    #[test]
    fn nothing_to_check_without_a_change_of_minor_or_once_the_roll_started() {
        let obs = cluster("3.5.35", 3);
        assert_eq!(preflight(&obs), None);
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.backup_destination = Some("s3://b".into());
        obs.stale_objects.clear();
        assert_eq!(preflight(&obs), None, "the StatefulSet was written");
    }

    #[test]
    fn a_snapshot_comes_first_when_the_cluster_has_a_destination() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        assert_eq!(preflight(&obs), None, "no destination: nothing to take");
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(vec![ObjectKind::StatefulSet]))
        );
        obs.version.backup_destination = Some("s3://b/p".into());
        let snapshot = Plan::Act(Step::Version(VersionStep::SnapshotBefore {
            from: "3.5.35".into(),
            to: "3.6.16".into(),
        }));
        assert_eq!(plan_next_step(&obs), snapshot);
        obs.version.snapshot_taken = true;
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(vec![ObjectKind::StatefulSet]))
        );
    }

    #[test]
    fn a_failed_snapshot_refuses_the_change_naming_the_failure_until_the_retry() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.backup_destination = Some("s3://b/p".into());
        obs.last_failure = Some(failed(
            "SnapshotBeforeVersionChange",
            2,
            1,
            "store: access denied",
        ));
        let Plan::Refuse(refusal) = plan_next_step(&obs) else {
            panic!("refused: {:?}", plan_next_step(&obs));
        };
        assert_eq!(refusal.reason, SNAPSHOT_FAILED);
        for words in [
            "minor upgrade from 3.5.35 to 3.6.16 is refused",
            "s3://b/p",
            "store: access denied",
            "set version back to 3.5.35",
        ] {
            assert!(refusal.message.contains(words), "{}", refusal.message);
        }
        // Past the backoff: the snapshot is tried again.
        obs.last_failure = Some(failed("SnapshotBeforeVersionChange", 2, 60, "x"));
        assert!(matches!(
            plan_next_step(&obs),
            Plan::Act(Step::Version(VersionStep::SnapshotBefore { .. }))
        ));
    }

    #[test]
    fn an_unhealthy_member_holds_the_statefulset_but_not_the_other_rules() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.backup_destination = Some("s3://b".into());
        obs = sick(obs, 2);
        let Some(Gate::HoldStatefulSet(why)) = preflight(&obs) else {
            panic!("held: {:?}", preflight(&obs));
        };
        assert!(why.contains("c-etcd-2 is not"), "{why}");
        // No snapshot, no StatefulSet write: the planner waits on the member.
        let plan = plan_next_step(&obs);
        assert!(
            matches!(&plan, Plan::Wait(w) if w.contains("c-etcd-2")),
            "{plan:?}"
        );
        // A failed member is still replaced (on the version it runs).
        obs.failed_members.insert(102);
        obs.failed_long_ago.insert(102);
        assert!(matches!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember { member_id: 102, .. })
        ));
    }

    #[test]
    fn the_v2_store_refuses_the_way_to_3_6_naming_etcdutl_check_v2store() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.v2_enabled = vec!["c-etcd-1".into()];
        let Plan::Refuse(refusal) = plan_next_step(&obs) else {
            panic!("refused");
        };
        assert_eq!(refusal.reason, V2_STORE_ENABLED);
        assert!(refusal.message.contains("etcdutl check v2store"));
        assert!(refusal.message.contains("c-etcd-1"));
        // 3.4 → 3.5 does not need it.
        let mut obs = minor_change(cluster("3.4.23", 3), "3.5.35");
        obs.version.v2_enabled = vec!["c-etcd-1".into()];
        assert_eq!(preflight(&obs), None);
    }
}
