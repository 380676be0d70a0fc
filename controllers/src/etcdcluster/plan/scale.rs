//! Scale: down by removing the highest member beyond the desired size
//! (leadership moved away first), shrinking, then deleting its PVC; up by
//! adding the next member as a learner, one at a time. Both only in a fully
//! healthy cluster.

use super::members::Members;
use super::step::{Plan, RemovalCause, Step};

/// Rule: shrink the StatefulSet after a removal, before removing the next
/// member. Never below the desired size: a failed member's ordinal is
/// refilled, not dropped.
pub(super) fn shrink_statefulset(m: &Members) -> Option<Plan> {
    let highest_member = m
        .health
        .members()
        .iter()
        .filter_map(|mo| m.ordinal_of(mo.member.id))
        .max();
    let target = highest_member
        .map_or(1, |o| o + 1)
        .max(m.obs.desired_replicas);
    (m.sts.replicas > target).then_some(Plan::Act(Step::ScaleStatefulSet { replicas: target }))
}

/// Rule: PVCs of members removed by a scale-down go, once their pod is gone.
pub(super) fn delete_removed_volumes(m: &Members) -> Option<Plan> {
    let ordinal = removed_volumes(m).find(|o| !m.obs.pods.contains_key(o))?;
    Some(Plan::Act(Step::DeletePvc { ordinal }))
}

/// Rule (once nothing else is left): a removed member's PVC whose pod is
/// still stopping is waited for; the scale-down is not done, nor the
/// cluster converged, with that volume left.
pub(super) fn removed_volume_waits_for_its_pod(m: &Members) -> Option<Plan> {
    let ordinal = removed_volumes(m).next()?;
    Some(Plan::Wait(format!(
        "the PVC of removed ordinal {ordinal} waits until its pod {} is gone",
        m.obs.names.pod(ordinal)
    )))
}

/// Ordinals whose PVC belongs to no member, beyond both the StatefulSet and
/// the desired size: what a scale-down left.
fn removed_volumes<'a>(m: &'a Members) -> impl Iterator<Item = u32> + 'a {
    let obs = m.obs;
    obs.pvcs.keys().copied().filter(move |o| {
        *o >= m.sts.replicas && *o >= obs.desired_replicas && m.member_at(*o).is_none()
    })
}

/// Rule: the highest voter beyond the desired size is removed, leadership
/// moved away from it first.
pub(super) fn remove_beyond_size(m: &Members) -> Option<Plan> {
    let (obs, health) = (m.obs, m.health);
    let mut beyond: Vec<(u32, u64)> = health
        .voters()
        .filter_map(|mo| m.ordinal_of(mo.member.id).map(|o| (o, mo.member.id)))
        .filter(|(o, _)| *o >= obs.desired_replicas)
        .collect();
    beyond.sort();
    let &(ordinal, id) = beyond.last()?;
    // Preflight: shrinking with a member down removes fault tolerance the
    // cluster is already short of (5 → 3 with one down leaves none).
    if let Some(sick) = health.voters().find(|mo| !mo.healthy) {
        return Some(Plan::Wait(format!(
            "scale-down to {} members waits until every member is healthy: {} is not",
            obs.desired_replicas,
            m.describe(sick.member.id)
        )));
    }
    // Nor while another member's pod is not Ready yet (a member just
    // promoted serves once its readiness probe passes): clients of the
    // client Service would lose two at once.
    if let Some(o) = m.unready_voter().filter(|o| *o != ordinal) {
        return Some(Plan::Wait(format!(
            "scale-down waits: the kubelet does not report pod {} Ready yet",
            obs.names.pod(o)
        )));
    }
    if health.leader() == Some(id) {
        return Some(match m.pick_new_leader(&|o| o < obs.desired_replicas, id) {
            Some(to) => Plan::Act(Step::MoveLeader { from: id, to }),
            None => Plan::Wait(format!(
                "scale-down waits: {} leads and no other healthy member can take over",
                obs.names.pod(ordinal)
            )),
        });
    }
    Some(match health.can_remove(id) {
        Ok(()) => Plan::Act(Step::RemoveMember {
            ordinal: Some(ordinal),
            member_id: id,
            cause: RemovalCause::ScaleDown,
        }),
        Err(why) => Plan::Wait(format!(
            "scale-down waits before removing {}: {why}",
            obs.names.pod(ordinal)
        )),
    })
}

/// Rule: a member whose peer URL is not this cluster's is reported to a
/// person, never removed.
pub(super) fn foreign_members(m: &Members) -> Option<Plan> {
    let id = m
        .health
        .members()
        .iter()
        .map(|mo| mo.member.id)
        .find(|id| m.ordinal_of(*id).is_none())?;
    Some(Plan::Hold(format!(
        "member {id:x} has a peer URL this cluster does not own; remove it by hand if it is not wanted"
    )))
}

/// Rule: scale up through learners, one at a time, only in a fully healthy
/// cluster (a member that is down is replaced first, or comes back).
pub(super) fn scale_up(m: &Members) -> Option<Plan> {
    let (obs, health) = (m.obs, m.health);
    let voters = health.voter_count() as u32;
    if voters >= obs.desired_replicas {
        return None;
    }
    let Some(next) = (0..obs.desired_replicas).find(|o| m.member_at(*o).is_none()) else {
        return Some(Plan::Hold(format!(
            "{voters} voting members, {} wanted, but every ordinal is taken: \
             a member this controller does not own holds one",
            obs.desired_replicas
        )));
    };
    if let Some(pvc) = obs.pvcs.get(&next)
        && pvc.member_id.is_some()
    {
        return Some(super::repair::delete_stale_storage(obs, next));
    }
    // Preflight: grow only a fully healthy cluster.
    if let Some(sick) = health.voters().find(|mo| !mo.healthy) {
        return Some(Plan::Wait(format!(
            "scaling to {} members waits until every member is healthy: {} is not{}",
            obs.desired_replicas,
            m.describe(sick.member.id),
            sick.error
                .as_ref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        )));
    }
    Some(match health.can_add_learner() {
        Ok(()) => Plan::Act(Step::AddLearner { ordinal: next }),
        Err(why) => Plan::Wait(format!(
            "scaling to {} members waits until the cluster is healthy: {why}",
            obs.desired_replicas
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{converged, foreign, member, with_members};
    use super::*;

    fn members(obs: &super::super::Observation) -> Members<'_> {
        Members::of(obs).unwrap()
    }

    #[test]
    fn a_cluster_at_its_size_needs_no_scaling() {
        let obs = converged(3, 3);
        let m = members(&obs);
        assert_eq!(shrink_statefulset(&m), None);
        assert_eq!(delete_removed_volumes(&m), None);
        assert_eq!(remove_beyond_size(&m), None);
        assert_eq!(foreign_members(&m), None);
        assert_eq!(scale_up(&m), None);
    }

    #[test]
    fn scale_down_removes_the_highest_follower_and_scale_up_adds_a_learner() {
        let obs = converged(3, 1);
        assert_eq!(
            remove_beyond_size(&members(&obs)),
            Some(Plan::Act(Step::RemoveMember {
                ordinal: Some(2),
                member_id: 102,
                cause: RemovalCause::ScaleDown
            }))
        );
        let obs = converged(1, 3);
        assert_eq!(
            scale_up(&members(&obs)),
            Some(Plan::Act(Step::AddLearner { ordinal: 1 }))
        );
    }

    #[test]
    fn after_a_removal_the_statefulset_shrinks_then_the_volume_goes() {
        let mut obs = with_members(
            converged(3, 2),
            vec![member(0, true, true, false), member(1, true, false, false)],
        );
        assert_eq!(
            shrink_statefulset(&members(&obs)),
            Some(Plan::Act(Step::ScaleStatefulSet { replicas: 2 }))
        );
        obs.statefulset.as_mut().unwrap().replicas = 2;
        // Its pod still stopping, nothing else to do: the scale-down waits
        // for it rather than report the cluster converged.
        assert_eq!(delete_removed_volumes(&members(&obs)), None);
        let plan = removed_volume_waits_for_its_pod(&members(&obs));
        assert!(
            matches!(&plan, Some(Plan::Wait(why)) if why.contains("c-etcd-2")),
            "{plan:?}"
        );
        assert_eq!(super::super::plan_next_step(&obs), plan.unwrap());
        obs.pods.remove(&2);
        assert_eq!(
            delete_removed_volumes(&members(&obs)),
            Some(Plan::Act(Step::DeletePvc { ordinal: 2 }))
        );
    }

    #[test]
    fn a_foreign_member_is_held_for_a_person() {
        let obs = with_members(
            converged(1, 1),
            vec![member(0, true, true, false), foreign(999, true, false)],
        );
        assert!(matches!(
            foreign_members(&members(&obs)),
            Some(Plan::Hold(_))
        ));
    }
}
