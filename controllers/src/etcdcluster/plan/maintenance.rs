//! Maintenance of a cluster of the right size and version: alarms (a
//! CORRUPT alarm is left to a person, NOSPACE is recovered), fragmented
//! databases defragmented, and the volumes' records kept up to date.

use crate::etcd::AlarmKind;

use super::members::Members;
use super::step::{Plan, Step};

/// A member is defragmented when at least this many bytes, and at least half
/// of its database file, are free pages.
pub const DEFRAG_MIN_FREE_BYTES: i64 = 128 * 1024 * 1024;

/// Rule: alarms. CORRUPT needs a person; NOSPACE is recovered once every
/// member is healthy (defragmentation blocks the member it runs on).
pub(super) fn alarms(m: &Members) -> Option<Plan> {
    let obs = m.obs;
    if let Some(alarm) = obs.alarms.iter().find(|a| a.kind == AlarmKind::Corrupt) {
        return Some(Plan::Hold(format!(
            "etcd raised a CORRUPT alarm on member {}: its data disagrees with the others; \
             replace that member or restore from a snapshot (no automatic action)",
            m.describe(alarm.member_id)
        )));
    }
    if !obs.alarms.iter().any(|a| a.kind == AlarmKind::NoSpace) {
        return None;
    }
    // Members not yet on the StatefulSet's template roll first: the quota
    // may be what changed (one that follows volumes that grew), and the
    // alarm is disarmed once every member runs with it.
    if obs.pods.keys().any(|o| m.outdated(*o)) {
        return None;
    }
    if let Some(sick) = m.health.voters().find(|mo| !mo.healthy) {
        return Some(Plan::Wait(format!(
            "NOSPACE recovery waits until every member is healthy ({:x} is not)",
            sick.member.id
        )));
    }
    Some(Plan::Act(Step::RecoverFromNoSpace))
}

/// Rule: defragment members whose database is mostly free pages, one at a
/// time, followers first and the leader last, only in a healthy cluster
/// whose other members' pods are Ready.
pub(super) fn defragment(m: &Members) -> Option<Plan> {
    let health = m.health;
    if !health.members().iter().all(|mo| mo.healthy) {
        return None;
    }
    let leader = health.leader();
    let mut fragmented: Vec<(bool, u32, u64)> = health
        .voters()
        .filter_map(|mo| {
            let s = mo.status.as_ref()?;
            let free = s.db_size.saturating_sub(s.db_size_in_use);
            (s.db_size > 0 && free >= DEFRAG_MIN_FREE_BYTES && free * 2 >= s.db_size)
                .then_some(())?;
            Some((
                leader == Some(mo.member.id),
                m.ordinal_of(mo.member.id)?,
                mo.member.id,
            ))
        })
        .collect();
    fragmented.sort();
    let &(_, ordinal, member_id) = fragmented.first()?;
    // A defragmentation blocks its member: not while another member's pod
    // is not Ready yet (clients would lose two at once).
    if let Some(o) = m.unready_voter().filter(|o| *o != ordinal) {
        return Some(Plan::Wait(format!(
            "defragmenting {} waits: the kubelet does not report pod {} Ready yet",
            m.obs.names.pod(ordinal),
            m.obs.names.pod(o)
        )));
    }
    Some(Plan::Act(Step::Defragment { ordinal, member_id }))
}

/// Rule: a member still unhealthy is waited for (nothing else is left that
/// would help it); so is a healthy member that did not answer its status,
/// whose version and raft position are then unknown: the cluster is not
/// reported converged on a version one member has not confirmed.
pub(super) fn unhealthy_member(m: &Members) -> Option<Plan> {
    let members = m.health.members();
    let sick = members.iter().find(|mo| !mo.healthy);
    let (mo, what) = match sick {
        Some(mo) => (mo, "is unhealthy"),
        None => (
            members.iter().find(|mo| mo.status.is_none())?,
            "answered its health check but not its status",
        ),
    };
    let why = mo.error.as_ref().map(|e| format!(": {e}"));
    Some(Plan::Wait(format!(
        "member {} {what}{}",
        m.describe(mo.member.id),
        why.unwrap_or_default()
    )))
}

/// Rule: once nothing else is left to do, the owner and the running etcd
/// version of recorded volumes are brought up to date.
pub(super) fn refresh_volume_records(m: &Members) -> Option<Plan> {
    m.record_pvc_step(|pvc, running| {
        pvc.member_id.is_some()
            && (!pvc.owner_recorded || (running.is_some() && pvc.etcd_version.as_ref() != running))
    })
    .map(Plan::Act)
}

/// Rule: while a roll waits for a restarted member (or, the roll done, the
/// last one is still coming back), the volume records of the members
/// already on the new release are brought up to date; those writes fill
/// the wait instead of following the roll.
pub(super) fn records_while_a_roll_waits(m: &Members) -> Option<Plan> {
    let waits = match super::roll::roll_members(m) {
        Some(plan) => matches!(plan, Plan::Wait(_)),
        None => unhealthy_member(m).is_some(),
    };
    waits.then(|| refresh_volume_records(m)).flatten()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{converged, member, pod, with_members};
    use super::*;
    use crate::etcd::{Alarm, ClusterHealth};
    use crate::etcdcluster::plan::EtcdObservation;

    #[test]
    fn a_roll_waiting_for_a_restarted_member_records_those_already_restarted() {
        // Ordinal 1 was rolled and runs the template; its volume still
        // names the old release. Ordinal 2 is coming back; ordinal 0 leads
        // on the old template.
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, false),
            ],
        );
        for o in [0, 2] {
            obs.pods.insert(o, pod("etcd:v3.4.0"));
        }
        obs.pvcs.get_mut(&1).unwrap().etcd_version = Some("3.4.0".into());
        let m = Members::of(&obs).unwrap();
        assert!(matches!(
            super::super::roll::roll_members(&m),
            Some(Plan::Wait(_))
        ));
        let record = Some(Plan::Act(Step::RecordPvcMember {
            ordinal: 1,
            member_id: 101,
            version: Some("3.5.1".into()),
        }));
        assert_eq!(records_while_a_roll_waits(&m), record);
        assert_eq!(Some(super::super::plan_next_step(&obs)), record);
        // The roll done, the last member still coming back: the same.
        let mut done = obs.clone();
        for o in [0, 2] {
            done.pods.insert(o, obs.pods[&1].clone());
        }
        assert_eq!(
            super::super::roll::roll_members(&Members::of(&done).unwrap()),
            None
        );
        assert_eq!(
            records_while_a_roll_waits(&Members::of(&done).unwrap()),
            record
        );
        // Once ordinal 2 is back the roll goes on first; the record waits.
        obs.etcd = converged(3, 3).etcd;
        let m = Members::of(&obs).unwrap();
        assert_eq!(records_while_a_roll_waits(&m), None);
        assert!(matches!(
            super::super::plan_next_step(&obs),
            Plan::Act(Step::RestartMember { ordinal: 2, .. })
        ));
    }

    #[test]
    fn a_healthy_member_without_a_status_is_waited_for_not_converged() {
        // Member 0's health check passed but its status call failed: its
        // version is unknown, so the cluster is not converged yet.
        let mut obs = converged(3, 3);
        let EtcdObservation::Observed(health) = &obs.etcd else {
            unreachable!()
        };
        let mut members = health.members().to_vec();
        members[0].status = None;
        members[0].error = Some("status: deadline exceeded".into());
        obs.etcd = EtcdObservation::Observed(ClusterHealth::new(members));
        let wait = Plan::Wait(format!(
            "member {} answered its health check but not its status: \
             status: deadline exceeded",
            obs.names.pod(0)
        ));
        assert_eq!(
            unhealthy_member(&Members::of(&obs).unwrap()),
            Some(wait.clone())
        );
        assert_eq!(super::super::plan_next_step(&obs), wait);
    }

    #[test]
    fn a_quiet_healthy_cluster_needs_no_maintenance() {
        let obs = converged(3, 3);
        let m = Members::of(&obs).unwrap();
        assert_eq!(alarms(&m), None);
        assert_eq!(defragment(&m), None);
        assert_eq!(unhealthy_member(&m), None);
        assert_eq!(refresh_volume_records(&m), None);
    }

    #[test]
    fn nospace_waits_for_health_and_corrupt_is_held() {
        let mut obs = with_members(
            converged(2, 2),
            vec![member(0, true, true, false), member(1, false, false, false)],
        );
        obs.alarms = vec![Alarm {
            member_id: 100,
            kind: AlarmKind::NoSpace,
        }];
        assert!(matches!(
            alarms(&Members::of(&obs).unwrap()),
            Some(Plan::Wait(_))
        ));
        obs.alarms[0].kind = AlarmKind::Corrupt;
        assert!(matches!(
            alarms(&Members::of(&obs).unwrap()),
            Some(Plan::Hold(_))
        ));
    }

    #[test]
    fn an_unhealthy_member_is_waited_for_and_an_outdated_record_refreshed() {
        let obs = with_members(
            converged(2, 2),
            vec![member(0, true, true, false), member(1, false, false, false)],
        );
        assert!(matches!(
            unhealthy_member(&Members::of(&obs).unwrap()),
            Some(Plan::Wait(_))
        ));
        let mut obs = converged(1, 1);
        obs.pvcs.get_mut(&0).unwrap().owner_recorded = false;
        assert!(matches!(
            refresh_volume_records(&Members::of(&obs).unwrap()),
            Some(Plan::Act(Step::RecordPvcMember { ordinal: 0, .. }))
        ));
    }
}
