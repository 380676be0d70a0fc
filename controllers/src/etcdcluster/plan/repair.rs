//! Membership repair: what a running cluster needs before any change of
//! size or version. A new volume is recorded with its member, a learner in
//! flight is started and promoted, a failed member (unhealthy past the grace
//! period) is removed under the quorum guard, and storage that holds a gone
//! member's data is deleted so its ordinal can rejoin fresh.

use etcdfleet_api::replacement::{HEALTHY_RESETS, Replacement};

use super::members::Members;
use super::observation::{Observation, READY_POD_GRACE_FACTOR};
use super::step::{ObjectKind, Plan, RemovalCause, Step};

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
        return Some(delete_stale_storage(obs, ordinal));
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
        if let Some(bounded) = replacement_bounded(m, id, ordinal) {
            return Some(bounded);
        }
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

/// Rule: once every member etcd lists has started and none is a learner,
/// the members ConfigMap announces no one. A bootstrap's `new` (and a
/// reseed's) is read by a member only on an empty data directory: left in
/// place, member 0 whose volume came back empty would start a new, empty
/// cluster under the same token (so the same cluster and member ids) and
/// take writes as this one. Closed, it exits instead ("couldn't find local
/// name"), and the loss is a loss the quorum rules see.
pub(super) fn close_announcement(m: &Members) -> Option<Plan> {
    let members = m.health.members();
    let settled = members
        .iter()
        .all(|mo| mo.member.is_started() && !mo.member.is_learner);
    (m.obs.members_announced && settled && !members.is_empty())
        .then(|| Plan::Act(Step::WriteObjects(vec![ObjectKind::MembersConfigMap])))
}

/// Rule: a voter unhealthy on a version its data never ran (its pod's image
/// names another version than the one its volume records), whether its
/// container exits or runs without becoming healthy, has failed on the
/// version, not on its data: nothing says the data is the cause, so it is
/// never removed and its volume never deleted. Once the StatefulSet's template moved on (the
/// version set back), its pod is restarted onto it, which brings the member
/// back on its own data; until then, past the failure grace, the cluster
/// holds, naming the member, the version and how its container last ended.
/// A member whose volume records the version it fails on (a wiped or
/// corrupted data directory) or has no volume is left to
/// [`failed_members`].
pub(super) fn cannot_start_on_new_version(m: &Members) -> Option<Plan> {
    let (obs, health) = (m.obs, m.health);
    health.voters().filter(|mo| !mo.healthy).find_map(|mo| {
        let id = mo.member.id;
        let ordinal = m.ordinal_of(id)?;
        let pod = obs.pods.get(&ordinal).filter(|p| !p.deleting)?;
        let runs = etcdfleet_api::version::version_of_image(&pod.image)?.to_string();
        let data = obs.pvcs.get(&ordinal)?.etcd_version.as_ref()?;
        // One that never exited is only starting until its failure grace
        // has passed.
        if &runs == data || (pod.last_exit.is_none() && !obs.failed_members.contains(&id)) {
            return None;
        }
        if m.outdated(ordinal) && !m.sts.template_seen {
            return Some(Plan::Wait(format!(
                "member {} cannot start on etcd {runs}; it is restarted onto the pod \
                 template once the StatefulSet controller has seen it",
                obs.names.pod(ordinal)
            )));
        }
        if m.outdated(ordinal) {
            return Some(match health.can_restart(id) {
                Ok(()) | Err(crate::etcd::UnsafeReason::SingleMemberDowntime { .. }) => {
                    Plan::Act(Step::RestartMember {
                        ordinal,
                        member_id: id,
                    })
                }
                Err(why) => Plan::Wait(format!(
                    "member {} cannot start on etcd {runs}; restarting it onto the pod \
                     template waits: {why}",
                    obs.names.pod(ordinal)
                )),
            });
        }
        let exit = match &pod.last_exit {
            Some(exit) => format!("its container {exit}"),
            None => "it runs but is not healthy".to_string(),
        };
        obs.failed_members.contains(&id).then(|| {
            Plan::Hold(format!(
                "member {} cannot start on etcd {runs}: {exit}. Its data last \
                 ran etcd {data} and is kept: the member is not replaced, since the new \
                 version, not its data, fails. Set spec.version back to {data} to bring \
                 it back on its own data",
                obs.names.pod(ordinal)
            ))
        })
    })
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
    if let Some(bounded) = replacement_bounded(m, *id, o) {
        return Some(bounded);
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

/// A failed member is replaced (removed, its volume deleted, joined again
/// empty) unless earlier replacements did not cure it
/// ([`etcdfleet_api::replacement`]): the next waits a back-off that
/// doubles with each, and after the bound the cluster holds, naming the
/// member, how its container last ended and the replacements made. A
/// cause outside the data (its node, image or resources) is not cured by
/// deleting the data again.
fn replacement_bounded(m: &Members, id: u64, ordinal: u32) -> Option<Plan> {
    let obs = m.obs;
    let pod = obs.names.pod(ordinal);
    let exit = (obs.pods.get(&ordinal).and_then(|p| p.last_exit.as_ref()))
        .map_or_else(String::new, |e| format!("; its etcd container {e}"));
    match obs.replacements.get(&id)? {
        Replacement::Allowed { .. } => None,
        Replacement::BackOff { made, not_before } => Some(Plan::Wait(format!(
            "member {pod} failed again after {made} replacement(s){exit}; it is replaced \
             again at {not_before} at the earliest (each replacement waits twice as long as \
             the one before)"
        ))),
        Replacement::Exhausted { made } => Some(Plan::Hold(format!(
            "member {pod} failed again after {made} replacements{exit}. It is not replaced \
             again: each replacement deleted its volume and none cured it, so the cause lies \
             outside its data (its node, image or resources). Fix the cause: the member comes \
             back as soon as its pod runs, and once healthy for {HEALTHY_RESETS} failure \
             graces its replacements count afresh"
        ))),
    }
}

/// Rule: stale storage, a PVC holding the data of a member that is gone, is
/// deleted (pod and PVC) so its ordinal rejoins fresh.
pub(super) fn stale_storage(m: &Members) -> Option<Plan> {
    let obs = m.obs;
    obs.pvcs.iter().find_map(|(ordinal, pvc)| {
        let old = pvc.member_id?;
        (m.health.member(old).is_none() && *ordinal < obs.desired_replicas)
            .then(|| delete_stale_storage(obs, *ordinal))
    })
}

/// Deletes the pod and PVC of `ordinal` (they hold a removed member's
/// data), or waits while that delete is under way: PVC protection keeps the
/// claim until its pod is gone, and asking again changes nothing. A pod
/// whose deletion no kubelet confirms (its node stopped or cut off:
/// [`PodObservation::stuck_deleting`](super::observation::PodObservation))
/// is deleted again without a grace period, or its ordinal never rejoins:
/// its member is no longer in the cluster, so whatever still runs there
/// cannot rejoin, and its data is a removed member's.
pub(super) fn delete_stale_storage(obs: &Observation, ordinal: u32) -> Plan {
    let stuck = obs.pods.get(&ordinal).is_some_and(|p| p.stuck_deleting);
    if obs.pvcs.get(&ordinal).is_some_and(|p| p.deleting) && !stuck {
        return Plan::Wait(format!(
            "the volume of {} is being deleted (it held a removed member's data)",
            obs.names.pod(ordinal)
        ));
    }
    Plan::Act(Step::DeleteStaleStorage {
        ordinal,
        force_pod: stuck,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::tests::{IMG, converged, member, with_members};
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
    fn a_bootstrap_announcement_is_closed_once_every_member_has_started() {
        let close = Plan::Act(Step::WriteObjects(vec![ObjectKind::MembersConfigMap]));
        // Member 0 bootstrapped `new` and runs: nothing may start from the
        // announcement any more.
        let mut obs = converged(1, 1);
        obs.members_announced = true;
        assert_eq!(close_announcement(&members(&obs)), Some(close.clone()));
        assert_eq!(super::super::plan_next_step(&obs), close);
        // Closed already: nothing to do.
        obs.members_announced = false;
        assert_eq!(close_announcement(&members(&obs)), None);
        // A learner joins from it: it stays until the promotion closes it.
        let learner = member(1, true, false, true);
        let mut joining =
            with_members(converged(1, 2), vec![member(0, true, true, false), learner]);
        joining.members_announced = true;
        assert_eq!(close_announcement(&members(&joining)), None);
        // A member added but not started yet reads it on its first start.
        let mut unstarted = member(1, false, false, false);
        unstarted.member.name = String::new();
        let mut adding = with_members(
            converged(1, 2),
            vec![member(0, true, true, false), unstarted],
        );
        adding.members_announced = true;
        assert_eq!(close_announcement(&members(&adding)), None);
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

    /// Ordinal 2 was restarted onto etcd 3.5.99 (the template) and its
    /// container exits; its volume records 3.5.1; it failed long ago.
    fn crashing_on_a_new_version() -> super::super::Observation {
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, false),
            ],
        );
        let sts = obs.statefulset.as_mut().unwrap();
        sts.image = "etcd:v3.5.99".into();
        sts.template_hash = Some("new".into());
        for o in 0..3 {
            obs.pods.get_mut(&o).unwrap().template_hash = Some("old".into());
        }
        let crashing = obs.pods.get_mut(&2).unwrap();
        crashing.image = "etcd:v3.5.99".into();
        crashing.template_hash = Some("new".into());
        crashing.ready = false;
        crashing.last_exit = Some("exited with code 2 (Error): bad binary".into());
        obs.failed_members = BTreeSet::from([102]);
        obs.failed_long_ago = BTreeSet::from([102]);
        obs
    }

    #[test]
    fn a_member_that_cannot_start_on_a_new_version_is_held_never_removed() {
        let obs = crashing_on_a_new_version();
        let plan = super::super::plan_next_step(&obs);
        let Plan::Hold(why) = &plan else {
            panic!("held, not {plan:?}")
        };
        for words in [
            "c-etcd-2",
            "etcd 3.5.99",
            "exited with code 2 (Error): bad binary",
            "set spec.version back to 3.5.1",
        ] {
            assert!(why.to_lowercase().contains(&words.to_lowercase()), "{why}");
        }
        // Within its failure grace the roll waits for it, as for any member.
        let mut young = obs.clone();
        young.failed_members.clear();
        young.failed_long_ago.clear();
        assert_eq!(cannot_start_on_new_version(&members(&young)), None);
        assert!(matches!(
            super::super::plan_next_step(&young),
            Plan::Wait(_)
        ));
    }

    #[test]
    fn a_member_that_could_not_start_returns_on_its_data_once_the_template_moved_back() {
        let mut obs = crashing_on_a_new_version();
        // spec.version set back: the template is the old one again.
        let sts = obs.statefulset.as_mut().unwrap();
        sts.image = IMG.into();
        sts.template_hash = Some("old".into());
        assert_eq!(
            super::super::plan_next_step(&obs),
            Plan::Act(Step::RestartMember {
                ordinal: 2,
                member_id: 102
            })
        );
        // Not before the StatefulSet controller saw that template; and it
        // is not removed meanwhile.
        obs.statefulset.as_mut().unwrap().template_seen = false;
        let plan = cannot_start_on_new_version(&members(&obs));
        assert!(
            matches!(&plan, Some(Plan::Wait(why)) if why.contains("StatefulSet controller")),
            "{plan:?}"
        );
    }

    #[test]
    fn a_member_failing_on_the_version_its_data_ran_is_left_to_replacement() {
        // A wiped or corrupted data directory: the volume records the version
        // the member fails on, so the failed-member rule replaces it.
        let mut obs = crashing_on_a_new_version();
        obs.pvcs.get_mut(&2).unwrap().etcd_version = Some("3.5.99".into());
        assert_eq!(cannot_start_on_new_version(&members(&obs)), None);
        assert!(matches!(
            failed_members(&members(&obs)),
            Some(Plan::Act(Step::RemoveMember { member_id: 102, .. }))
        ));
        // So is a member with no volume left.
        let mut gone = crashing_on_a_new_version();
        gone.pvcs.remove(&2);
        assert_eq!(cannot_start_on_new_version(&members(&gone)), None);
    }

    #[test]
    fn a_member_running_unhealthy_on_a_new_version_past_its_grace_is_held_never_removed() {
        // Restarted onto the new version, it runs but is not healthy yet
        // past the failure grace (a slow first start on a new minor): the
        // version is the suspect, not the data.
        let mut stuck = crashing_on_a_new_version();
        stuck.pods.get_mut(&2).unwrap().last_exit = None;
        stuck.pods.get_mut(&2).unwrap().running = true;
        let plan = super::super::plan_next_step(&stuck);
        let Plan::Hold(why) = &plan else {
            panic!("held, not {plan:?}")
        };
        assert!(why.contains("it runs but is not healthy"), "{why}");
        assert!(why.contains("Set spec.version back to 3.5.1"), "{why}");
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
            Some(Plan::Act(Step::DeleteStaleStorage {
                ordinal: 2,
                force_pod: false
            }))
        );
    }

    /// A gone member's volume whose delete is under way is waited for while
    /// its pod's kubelet may still confirm; once the pod's delete is stuck
    /// (its node stopped), the pod is deleted again without a grace period.
    #[test]
    fn a_gone_members_pod_stuck_deleting_is_deleted_without_a_grace_period() {
        let mut obs = with_members(
            converged(3, 3),
            vec![member(0, true, true, false), member(1, true, false, false)],
        );
        obs.pvcs.get_mut(&2).unwrap().deleting = true;
        obs.pods.get_mut(&2).unwrap().deleting = true;
        assert!(matches!(stale_storage(&members(&obs)), Some(Plan::Wait(_))));
        obs.pods.get_mut(&2).unwrap().stuck_deleting = true;
        assert_eq!(
            stale_storage(&members(&obs)),
            Some(Plan::Act(Step::DeleteStaleStorage {
                ordinal: 2,
                force_pod: true
            }))
        );
    }
}
