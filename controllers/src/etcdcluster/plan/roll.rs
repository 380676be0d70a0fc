//! Version and configuration changes: members are rolled onto the
//! StatefulSet's pod template one at a time, followers first, the leader
//! last after moving leadership, each gated on full health.

use super::members::Members;
use super::step::{Plan, Step};

/// Rule: roll members onto the StatefulSet's pod template (see
/// [`Members::outdated`]).
pub(super) fn roll_members(m: &Members) -> Option<Plan> {
    let (obs, sts, health) = (m.obs, m.sts, m.health);
    let outdated: Vec<(u32, u64)> = obs
        .pods
        .keys()
        .filter(|o| m.outdated(**o))
        .filter_map(|o| m.member_at(*o).map(|id| (*o, id)))
        .collect();
    if outdated.is_empty() {
        return None;
    }
    // A pod deleted before the StatefulSet controller saw the template
    // would come back from the old one (and be restarted twice).
    if !sts.template_seen {
        return Some(Plan::Wait(
            "rolling update waits: the StatefulSet controller has not seen the new pod \
             template yet (status.observedGeneration is behind metadata.generation)"
                .to_string(),
        ));
    }
    if obs.pods.values().any(|p| p.deleting) {
        return Some(Plan::Wait("a member pod is being replaced".to_string()));
    }
    // A voter without a pod: its pod was deleted and not yet recreated. Its
    // process may still be running (and answering) until the kubelet stops
    // it, so restarting another member now could take two down at once.
    if let Some(o) = health
        .voters()
        .filter_map(|mo| m.ordinal_of(mo.member.id))
        .find(|o| !obs.pods.contains_key(o))
    {
        return Some(Plan::Wait(format!(
            "rolling update waits: the pod of member {} is being recreated",
            obs.names.pod(o)
        )));
    }
    if let Some(sick) = health.voters().find(|mo| !mo.healthy) {
        return Some(Plan::Wait(format!(
            "rolling update waits: member {} is unhealthy",
            m.describe(sick.member.id)
        )));
    }
    if let Some(o) = m.unready_voter() {
        return Some(Plan::Wait(format!(
            "rolling update waits: the kubelet does not report pod {} Ready yet",
            obs.names.pod(o)
        )));
    }
    if let Some(lagging) = health
        .voters()
        .find(|mo| health.lag(mo.member.id).is_some_and(|lag| lag > 1000))
    {
        return Some(Plan::Wait(format!(
            "rolling update waits: member {:x} is catching up",
            lagging.member.id
        )));
    }
    let leader = health.leader();
    let (ordinal, id) = outdated
        .iter()
        .copied()
        .find(|(_, id)| Some(*id) != leader)
        .unwrap_or(outdated[0]);
    let voters = health.voter_count() as u32;
    if Some(id) == leader && voters > 1 {
        return Some(match m.pick_new_leader(&|_| true, id) {
            Some(to) => Plan::Act(Step::MoveLeader { from: id, to }),
            None => Plan::Wait("rolling update waits: no member can take over leadership".into()),
        });
    }
    Some(match health.can_restart(id) {
        Ok(()) => Plan::Act(Step::RestartMember {
            ordinal,
            member_id: id,
        }),
        // A single-member cluster cannot restart without downtime; that is
        // what a one-member cluster signs up for.
        Err(crate::etcd::UnsafeReason::SingleMemberDowntime { .. }) => {
            Plan::Act(Step::RestartMember {
                ordinal,
                member_id: id,
            })
        }
        Err(why) => Plan::Wait(format!("rolling update waits: {why}")),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{converged, pod};
    use super::*;

    #[test]
    fn members_on_the_template_are_not_rolled_and_followers_go_first() {
        let mut obs = converged(3, 3);
        assert_eq!(roll_members(&Members::of(&obs).unwrap()), None);
        for o in 0..3 {
            obs.pods.insert(o, pod("etcd:v3.4.0"));
        }
        assert_eq!(
            roll_members(&Members::of(&obs).unwrap()),
            Some(Plan::Act(Step::RestartMember {
                ordinal: 1,
                member_id: 101
            }))
        );
    }

    #[test]
    fn a_voter_whose_pod_is_gone_holds_the_roll_even_while_it_still_answers() {
        // Ordinal 1's pod was deleted and is not recreated yet; its etcd
        // still answers healthy (the kubelet has not stopped it).
        let mut obs = converged(3, 3);
        for o in 0..3 {
            obs.pods.insert(o, pod("etcd:v3.4.0"));
        }
        obs.pods.remove(&1);
        let plan = roll_members(&Members::of(&obs).unwrap());
        assert!(
            matches!(&plan, Some(Plan::Wait(why)) if why.contains("c-etcd-1")),
            "{plan:?}"
        );
    }

    #[test]
    fn a_restarted_member_not_ready_yet_holds_the_roll_unless_an_alarm_makes_every_pod_unready() {
        // Ordinal 1 was restarted; etcd answers for it, its readiness probe
        // has not passed yet.
        let mut obs = converged(3, 3);
        for o in [0, 2] {
            obs.pods.insert(o, pod("etcd:v3.4.0"));
        }
        for p in obs.pods.values_mut() {
            p.ready_means_etcd_healthy = true;
        }
        obs.pods.get_mut(&1).unwrap().ready = false;
        let plan = roll_members(&Members::of(&obs).unwrap());
        assert!(
            matches!(&plan, Some(Plan::Wait(why)) if why.contains("pod c-etcd-1 Ready")),
            "{plan:?}"
        );
        obs.pods.get_mut(&1).unwrap().ready = true;
        assert!(matches!(
            roll_members(&Members::of(&obs).unwrap()),
            Some(Plan::Act(Step::RestartMember { ordinal: 2, .. }))
        ));
        // NOSPACE: every probe fails while the alarm is raised; the roll
        // that carries a larger quota goes on.
        for p in obs.pods.values_mut() {
            p.ready = false;
        }
        obs.alarms = vec![crate::etcd::Alarm {
            member_id: 100,
            kind: crate::etcd::AlarmKind::NoSpace,
        }];
        assert!(matches!(
            roll_members(&Members::of(&obs).unwrap()),
            Some(Plan::Act(Step::RestartMember { ordinal: 2, .. }))
        ));
    }

    #[test]
    fn no_member_is_restarted_before_the_statefulset_controller_saw_the_template() {
        let mut obs = converged(3, 3);
        for o in 0..3 {
            obs.pods.insert(o, pod("etcd:v3.4.0"));
        }
        obs.statefulset.as_mut().unwrap().template_seen = false;
        let plan = roll_members(&Members::of(&obs).unwrap());
        assert!(
            matches!(&plan, Some(Plan::Wait(why)) if why.contains("observedGeneration")),
            "{plan:?}"
        );
        obs.statefulset.as_mut().unwrap().template_seen = true;
        assert!(matches!(
            roll_members(&Members::of(&obs).unwrap()),
            Some(Plan::Act(Step::RestartMember { .. }))
        ));
        // Nothing outdated: an unseen template holds nothing.
        let mut at_rest = converged(3, 3);
        at_rest.statefulset.as_mut().unwrap().template_seen = false;
        assert_eq!(roll_members(&Members::of(&at_rest).unwrap()), None);
    }
}
