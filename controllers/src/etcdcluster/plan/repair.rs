//! Membership repair: what a running cluster needs before any change of
//! size or version. A new volume is recorded with its member, a learner in
//! flight is started and promoted, a failed member (unhealthy past the grace
//! period) is removed under the quorum guard, and storage that holds a gone
//! member's data is deleted so its ordinal can rejoin fresh.

use super::members::Members;
use super::observation::READY_POD_GRACE_FACTOR;
use super::step::{Plan, RemovalCause, Step};

/// Rule: record which member each PVC holds as soon as both exist, so that
/// data of a member that is later removed is recognised as stale; with it
/// the owner, and the etcd version running on the data (kept volumes of a
/// deleted cluster must not be started on an older or too new etcd).
/// (Owner and version of an already recorded volume are brought up to date
/// once nothing else is left to do, not between the steps of an operation:
/// see `maintenance::refresh_volume_records`.)
pub(super) fn record_new_volumes(m: &Members) -> Option<Plan> {
    m.record_pvc_step(|pvc, _| pvc.member_id.is_none())
        .map(Plan::Act)
}

/// Rule: a learner in flight (one this controller added: a foreign learner,
/// whose peer URL is not ours, is reported and never removed) is started,
/// then promoted once caught up; a learner that started and failed is removed.
pub(super) fn learner_in_flight(m: &Members) -> Option<Plan> {
    let (obs, sts, health) = (m.obs, m.sts, m.health);
    let (learner, ordinal) = health
        .learners()
        .find_map(|l| m.ordinal_of(l.member.id).map(|o| (l, o)))?;
    let id = learner.member.id;
    if sts.replicas <= ordinal {
        return Some(Plan::Act(Step::ScaleStatefulSet {
            replicas: ordinal + 1,
        }));
    }
    if let Some(pvc) = obs.pvcs.get(&ordinal)
        && let Some(old) = pvc.member_id
        && old != id
    {
        return Some(Plan::Act(Step::DeleteStaleStorage { ordinal }));
    }
    let why = match health.can_promote(id) {
        Ok(()) => {
            return Some(Plan::Act(Step::PromoteLearner {
                ordinal,
                member_id: id,
            }));
        }
        Err(why) => why,
    };
    // A learner whose pod never ran has not failed: it has not started.
    let started = obs.pods.get(&ordinal).is_some_and(|p| p.running);
    if started && obs.failed_members.contains(&id) && health.can_remove(id).is_ok() {
        return Some(Plan::Act(Step::RemoveMember {
            ordinal: Some(ordinal),
            member_id: id,
            cause: RemovalCause::Failed,
        }));
    }
    // No raft indexes in the message: they change on every write
    // and would turn every reconcile into a status write.
    let why = match why {
        crate::etcd::UnsafeReason::LearnerBehind { .. } => {
            "it is catching up with the leader".to_string()
        }
        other => other.to_string(),
    };
    Some(Plan::Wait(format!(
        "learner {} not promotable yet: {why}",
        obs.names.pod(ordinal)
    )))
}

/// Rule: failed voters are removed. Only members this controller made
/// (foreign ones are reported, never removed), and only when the workload
/// cluster agrees: a member the controller cannot reach but whose pod passes
/// etcd's own health probe is a network problem between us and it, not a
/// failure.
pub(super) fn failed_members(m: &Members) -> Option<Plan> {
    let (obs, health) = (m.obs, m.health);
    let (id, member, o) = obs.failed_members.iter().find_map(|id| {
        let member = health.member(*id).filter(|mo| !mo.member.is_learner)?;
        Some((id, member, m.ordinal_of(*id)?))
    })?;
    // Unreachable (no answer at all, not even status) yet ready: a
    // member that answers but is unhealthy (a wiped disk, another
    // cluster's data) is failed whatever its serializable probe says.
    let ready_pod = obs.pods.get(&o).filter(|p| p.ready && p.running);
    if member.status.is_none() && ready_pod.is_some_and(|p| p.ready_means_etcd_healthy) {
        return Some(Plan::Hold(format!(
            "member {} does not answer the controller, but etcd's health check in its \
             pod passes: it is not replaced; check the network between the controller \
             and the workload cluster (port-forward or pod network)",
            obs.names.pod(o)
        )));
    }
    if member.status.is_none() && ready_pod.is_some() && !obs.failed_long_ago.contains(id) {
        return Some(Plan::Wait(format!(
            "member {} does not answer the controller but its pod is ready: not \
             replaced yet (given {READY_POD_GRACE_FACTOR} failure grace periods); \
             check the network between the controller and the workload cluster",
            obs.names.pod(o)
        )));
    }
    let ordinal = Some(o);
    Some(match health.can_remove(*id) {
        Ok(()) => Plan::Act(Step::RemoveMember {
            ordinal,
            member_id: *id,
            cause: RemovalCause::Failed,
        }),
        Err(why) => Plan::Wait(format!(
            "member {} has failed but cannot be replaced safely: {why}",
            ordinal.map_or_else(|| format!("{id:x}"), |o| obs.names.pod(o))
        )),
    })
}

/// Rule: stale storage, a PVC holding the data of a member that is gone, is
/// deleted (pod and PVC) so its ordinal rejoins fresh.
pub(super) fn stale_storage(m: &Members) -> Option<Plan> {
    let obs = m.obs;
    obs.pvcs.iter().find_map(|(ordinal, pvc)| {
        let old = pvc.member_id?;
        (m.health.member(old).is_none() && *ordinal < obs.desired_replicas)
            .then_some(Plan::Act(Step::DeleteStaleStorage { ordinal: *ordinal }))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::tests::{converged, member, with_members};
    use super::*;

    fn members(obs: &super::super::Observation) -> Members<'_> {
        Members::of(obs).unwrap()
    }

    #[test]
    fn a_converged_cluster_needs_no_repair() {
        let obs = converged(3, 3);
        let m = members(&obs);
        assert_eq!(record_new_volumes(&m), None);
        assert_eq!(learner_in_flight(&m), None);
        assert_eq!(failed_members(&m), None);
        assert_eq!(stale_storage(&m), None);
    }

    #[test]
    fn an_unrecorded_volume_is_recorded_with_the_member_on_it() {
        let mut obs = converged(3, 3);
        obs.pvcs.get_mut(&1).unwrap().member_id = None;
        assert!(matches!(
            record_new_volumes(&members(&obs)),
            Some(Plan::Act(Step::RecordPvcMember {
                ordinal: 1,
                member_id: 101,
                ..
            }))
        ));
    }

    #[test]
    fn a_started_learner_is_promoted_once_it_can_be() {
        let obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, true, false, true),
            ],
        );
        assert_eq!(
            learner_in_flight(&members(&obs)),
            Some(Plan::Act(Step::PromoteLearner {
                ordinal: 2,
                member_id: 102
            }))
        );
    }

    #[test]
    fn a_failed_voter_is_removed_and_a_gone_members_volume_deleted() {
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, false),
            ],
        );
        obs.pods.get_mut(&2).unwrap().ready = false;
        obs.failed_members = BTreeSet::from([102]);
        assert!(matches!(
            failed_members(&members(&obs)),
            Some(Plan::Act(Step::RemoveMember {
                member_id: 102,
                cause: RemovalCause::Failed,
                ..
            }))
        ));
        let obs = with_members(
            converged(3, 3),
            vec![member(0, true, true, false), member(1, true, false, false)],
        );
        assert_eq!(
            stale_storage(&members(&obs)),
            Some(Plan::Act(Step::DeleteStaleStorage { ordinal: 2 }))
        );
    }
}
