//! The planner's policy as a whole: observations in, the one answer out.
//! Each rule's own tests sit next to it.

use std::collections::BTreeSet;

use super::*;
use crate::etcd::{Alarm, AlarmKind, ClusterHealth};
use crate::etcd::{Member, MemberObservation, MemberStatus};
use crate::render::Names;

pub(super) const IMG: &str = "etcd:v3.5.1";

pub(crate) fn names() -> Names {
    Names::new("c", "etcd-system")
}

/// A member at `ordinal` with id `100 + ordinal`.
pub(crate) fn member(
    ordinal: u32,
    healthy: bool,
    leader: bool,
    learner: bool,
) -> MemberObservation {
    let id = 100 + u64::from(ordinal);
    MemberObservation {
        member: Member {
            id,
            name: names().pod(ordinal),
            peer_urls: vec![names().peer_url(ordinal, true)],
            client_urls: vec![names().client_url(ordinal, true)],
            is_learner: learner,
        },
        status: healthy.then(|| MemberStatus {
            member_id: id,
            cluster_id: 1,
            version: "3.5.1".into(),
            leader: if leader { id } else { 0 },
            raft_index: 50,
            raft_term: 2,
            raft_applied_index: 50,
            revision: 40,
            db_size: 1,
            db_size_in_use: 1,
            is_learner: learner,
            errors: vec![],
            storage_version: String::new(),
            downgrade_target: None,
        }),
        healthy,
        error: (!healthy).then(|| "connection refused".to_string()),
    }
}

pub(super) fn pod(image: &str) -> PodObservation {
    PodObservation {
        image: image.into(),
        template_hash: None,
        running: true,
        ready: true,
        restart_count: 0,
        deleting: false,
        stuck_deleting: false,
        ready_means_etcd_healthy: false,
        last_exit: None,
        node: None,
        forcing: None,
    }
}

/// A converged cluster of `n` members, leader at ordinal 0.
pub(crate) fn converged(n: u32, desired: u32) -> Observation {
    Observation {
        names: names(),
        tls: true,
        desired_replicas: desired,
        stale_objects: vec![],
        members_announced: false,
        statefulset: Some(StatefulSetObservation {
            replicas: n,
            image: IMG.into(),
            template_hash: None,
            template_seen: true,
            forcing: None,
            deleting: false,
        }),
        pods: (0..n).map(|o| (o, pod(IMG))).collect(),
        pvcs: (0..n)
            .map(|o| {
                (
                    o,
                    PvcObservation {
                        member_id: Some(100 + u64::from(o)),
                        owner_recorded: true,
                        etcd_version: Some("3.5.1".into()),
                        deleting: false,
                        size: ClaimSize {
                            requested: Some("8Gi".into()),
                            capacity: Some("8Gi".into()),
                            ..ClaimSize::default()
                        },
                    },
                )
            })
            .collect(),
        etcd: EtcdObservation::Observed(ClusterHealth::new(
            (0..n).map(|o| member(o, true, o == 0, false)).collect(),
        )),
        failed_members: BTreeSet::new(),
        failed_long_ago: BTreeSet::new(),
        replacements: Default::default(),
        alarms: vec![],
        conflicts: vec![],
        pki_lost: false,
        storage: StorageObservation {
            size: "8Gi".into(),
            class: None,
            template: Some((None, Some("8Gi".into()))),
            ..StorageObservation::default()
        },
        requested_version: None,
        downgrade_acknowledged: None,
        version: Default::default(),
        known_voters: n,
        restore: RestoreGate::NotNeeded,
        last_failure: None,
        adoption: None,
        ca_rotation: Default::default(),
        recovery: Default::default(),
    }
}

pub(crate) fn with_members(mut obs: Observation, members: Vec<MemberObservation>) -> Observation {
    obs.etcd = EtcdObservation::Observed(ClusterHealth::new(members));
    obs
}

#[test]
fn converged_cluster_needs_nothing() {
    assert_eq!(plan_next_step(&converged(3, 3)), Plan::Converged);
}

#[test]
fn missing_objects_are_written_first_and_bootstrap_creates_one_member() {
    let mut obs = converged(0, 3);
    obs.statefulset = None;
    obs.etcd = EtcdObservation::Unreachable("no member pods".into());
    obs.stale_objects = vec![
        ObjectKind::Pki,
        ObjectKind::PeerService,
        ObjectKind::MembersConfigMap,
        ObjectKind::StatefulSet,
    ];
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::WriteObjects(vec![
            ObjectKind::Pki,
            ObjectKind::PeerService
        ]))
    );
    obs.stale_objects = vec![ObjectKind::MembersConfigMap, ObjectKind::StatefulSet];
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::Bootstrap { replicas: 1 })
    );
}

#[test]
fn a_refused_restore_writes_nothing_and_a_verified_one_bootstraps() {
    let mut obs = converged(0, 3);
    obs.statefulset = None;
    obs.known_voters = 0;
    obs.etcd = EtcdObservation::Unreachable("no member pods".into());
    obs.stale_objects = vec![
        ObjectKind::Pki,
        ObjectKind::PeerService,
        ObjectKind::MembersConfigMap,
        ObjectKind::StatefulSet,
    ];
    let refused = Refusal {
        reason: "ChecksumMismatch",
        message: "snapshot object shop/1.db has SHA-256 ..".into(),
    };
    obs.restore = RestoreGate::Refused(refused.clone());
    assert_eq!(plan_next_step(&obs), Plan::Refuse(refused));
    obs.restore = RestoreGate::Verified;
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::WriteObjects(vec![
            ObjectKind::Pki,
            ObjectKind::PeerService
        ]))
    );
}

#[test]
fn a_lost_statefulset_is_recreated_wide_enough_for_every_volume() {
    let mut obs = converged(3, 3);
    obs.statefulset = None;
    obs.pods.clear();
    obs.etcd = EtcdObservation::Unreachable("down".into());
    obs.stale_objects = vec![ObjectKind::StatefulSet];
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::Bootstrap { replicas: 3 })
    );
}

#[test]
fn bootstrap_mode_only_waits_or_adds() {
    let mut obs = converged(3, 1);
    obs.known_voters = 0;
    obs.etcd = EtcdObservation::Unreachable("connection refused".into());
    obs.failed_members = BTreeSet::from([101]);
    match plan_next_step(&obs) {
        Plan::Wait(why) => assert!(why.contains("no etcd member answers"), "{why}"),
        other => panic!("expected wait, got {other:?}"),
    }
    // A StatefulSet scaled below its volumes is widened, never narrowed.
    obs.statefulset.as_mut().unwrap().replicas = 1;
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::ScaleStatefulSet { replicas: 3 })
    );
}

#[test]
fn scale_up_adds_one_learner_then_starts_then_promotes() {
    let obs = converged(1, 3);
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::AddLearner { ordinal: 1 })
    );

    // learner added, not started yet
    let mut learner = member(1, false, false, true);
    learner.member.name.clear();
    learner.member.client_urls.clear();
    let obs2 = with_members(obs.clone(), vec![member(0, true, true, false), learner]);
    assert_eq!(
        plan_next_step(&obs2),
        Plan::Act(Step::ScaleStatefulSet { replicas: 2 })
    );

    // started and caught up
    let mut obs3 = with_members(
        obs.clone(),
        vec![member(0, true, true, false), member(1, true, false, true)],
    );
    obs3.statefulset.as_mut().unwrap().replicas = 2;
    obs3.pods.insert(1, pod(IMG));
    obs3.pvcs.insert(
        1,
        PvcObservation {
            member_id: Some(101),
            owner_recorded: true,
            etcd_version: Some("3.5.1".into()),
            deleting: false,
            size: Default::default(),
        },
    );
    assert_eq!(
        plan_next_step(&obs3),
        Plan::Act(Step::PromoteLearner {
            ordinal: 1,
            member_id: 101
        })
    );
}

#[test]
fn a_new_volume_is_recorded_with_its_member() {
    let mut obs = with_members(
        converged(2, 3),
        vec![member(0, true, true, false), member(1, true, false, true)],
    );
    obs.pvcs.insert(1, PvcObservation::default());
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RecordPvcMember {
            ordinal: 1,
            member_id: 101,
            version: Some("3.5.1".into()),
        })
    );
}

#[test]
fn a_learner_behind_waits() {
    let mut behind = member(1, true, false, true);
    behind.status.as_mut().unwrap().raft_index = 10;
    let obs = with_members(converged(2, 3), vec![member(0, true, true, false), behind]);
    match plan_next_step(&obs) {
        Plan::Wait(why) => {
            assert!(why.contains("not promotable"), "{why}");
            // Stable while the learner catches up: no raft index in it.
            assert!(!why.contains("10") && !why.contains("50"), "{why}");
        }
        other => panic!("expected wait, got {other:?}"),
    }
}

#[test]
fn scaling_waits_while_a_member_is_down_and_says_why() {
    let obs = with_members(
        converged(3, 5),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, false, false, false),
        ],
    );
    match plan_next_step(&obs) {
        Plan::Wait(why) => {
            assert!(
                why.contains("scaling to 5 members waits until every member is healthy"),
                "{why}"
            );
            assert!(why.contains("c-etcd-2 is not"), "{why}");
        }
        other => panic!("expected wait, got {other:?}"),
    }
    // With two of three down there is no quorum: it waits and says why.
    let obs = with_members(
        converged(3, 5),
        vec![
            member(0, true, true, false),
            member(1, false, false, false),
            member(2, false, false, false),
        ],
    );
    match plan_next_step(&obs) {
        Plan::Hold(why) => assert!(why.contains("quorum lost"), "{why}"),
        other => panic!("expected a hold, got {other:?}"),
    }
}

#[test]
fn scale_down_moves_leadership_away_then_removes_the_highest_member() {
    let obs = with_members(
        converged(5, 3),
        (0..5).map(|o| member(o, true, o == 4, false)).collect(),
    );
    match plan_next_step(&obs) {
        Plan::Act(Step::MoveLeader { from: 104, to }) => assert!(to < 103, "{to}"),
        other => panic!("expected MoveLeader, got {other:?}"),
    }
    let obs = converged(5, 3);
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RemoveMember {
            ordinal: Some(4),
            member_id: 104,
            cause: RemovalCause::ScaleDown
        })
    );
}

#[test]
fn after_a_removal_the_statefulset_shrinks_and_then_the_pvc_goes() {
    let mut obs = with_members(
        converged(5, 3),
        (0..4).map(|o| member(o, true, o == 0, false)).collect(),
    );
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::ScaleStatefulSet { replicas: 4 })
    );
    obs.statefulset.as_mut().unwrap().replicas = 4;
    obs.pods.remove(&4);
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::DeletePvc { ordinal: 4 })
    );
    // The pod still running: the PVC waits for it.
    obs.pods.insert(4, pod(IMG));
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RemoveMember {
            ordinal: Some(3),
            member_id: 103,
            cause: RemovalCause::ScaleDown
        })
    );
}

#[test]
fn a_failed_member_is_removed_its_storage_deleted_and_it_rejoins_as_a_learner() {
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, false, false, false),
        ],
    );
    obs.failed_members = BTreeSet::from([102]);
    obs.pods.get_mut(&2).unwrap().ready = false;
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RemoveMember {
            ordinal: Some(2),
            member_id: 102,
            cause: RemovalCause::Failed
        })
    );
    // removed: its volume still holds member 102's data
    let mut obs = with_members(
        converged(3, 3),
        vec![member(0, true, true, false), member(1, true, false, false)],
    );
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::DeleteStaleStorage {
            ordinal: 2,
            force_pod: false
        })
    );
    // fresh volume: it comes back as a learner at the same ordinal
    obs.pvcs.insert(2, PvcObservation::default());
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::AddLearner { ordinal: 2 })
    );
}

#[test]
fn volumes_record_their_owner_and_the_etcd_version_running_on_them() {
    let mut obs = converged(3, 3);
    obs.pvcs.get_mut(&1).unwrap().owner_recorded = false;
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RecordPvcMember {
            ordinal: 1,
            member_id: 101,
            version: Some("3.5.1".into()),
        })
    );
    // After an upgrade the version on the volume follows the member.
    let mut obs = converged(3, 3);
    obs.pvcs.get_mut(&2).unwrap().etcd_version = Some("3.4.23".into());
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RecordPvcMember {
            ordinal: 2,
            member_id: 102,
            version: Some("3.5.1".into()),
        })
    );
    // A volume recorded for another member is stale storage, not re-recorded.
    let mut obs = converged(3, 3);
    let pvc = obs.pvcs.get_mut(&2).unwrap();
    pvc.member_id = Some(999);
    pvc.owner_recorded = false;
    assert!(!matches!(
        plan_next_step(&obs),
        Plan::Act(Step::RecordPvcMember { .. })
    ));
}

#[test]
fn kept_volumes_of_a_newer_or_much_older_etcd_refuse_the_bootstrap() {
    // The cluster was deleted with its volumes kept, and recreated.
    let mut obs = converged(3, 3);
    obs.statefulset = None;
    obs.pods.clear();
    obs.etcd = EtcdObservation::Unreachable("no pods".into());
    obs.known_voters = 0;
    obs.requested_version = Some("3.4.23".into());
    match plan_next_step(&obs) {
        Plan::Refuse(r) => {
            assert_eq!(r.reason, "VersionRejected");
            assert!(
                r.message.contains("data-c-etcd-0") && r.message.contains("3.5.1"),
                "{}",
                r.message
            );
            assert!(r.message.contains("downgrade"), "{}", r.message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    for pvc in obs.pvcs.values_mut() {
        pvc.etcd_version = Some("3.3.27".into());
    }
    obs.requested_version = Some("3.5.1".into());
    assert!(matches!(plan_next_step(&obs), Plan::Refuse(_)));
    // The same version (or the next minor) starts on the kept data.
    for pvc in obs.pvcs.values_mut() {
        pvc.etcd_version = Some("3.5.1".into());
    }
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::Bootstrap { replicas: 3 })
    );
}

#[test]
fn a_failed_member_is_not_removed_when_that_would_lose_quorum() {
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, false, false, false),
            member(2, false, false, false),
        ],
    );
    obs.failed_members = BTreeSet::from([101, 102]);
    match plan_next_step(&obs) {
        Plan::Hold(why) => {
            assert!(why.contains("quorum lost"), "{why}");
            assert!(why.contains("restore from a backup"), "{why}");
        }
        other => panic!("expected a hold, got {other:?}"),
    }
}

#[test]
fn a_stuck_learner_is_removed() {
    let mut obs = with_members(
        converged(2, 3),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, false, false, true),
        ],
    );
    obs.statefulset.as_mut().unwrap().replicas = 3;
    obs.pods.insert(2, pod(IMG));
    obs.pvcs.insert(
        2,
        PvcObservation {
            member_id: Some(102),
            owner_recorded: true,
            ..Default::default()
        },
    );
    obs.failed_members = BTreeSet::from([102]);
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RemoveMember {
            ordinal: Some(2),
            member_id: 102,
            cause: RemovalCause::Failed
        })
    );
}

#[test]
fn rolling_upgrade_goes_followers_first_then_moves_leadership_then_the_leader() {
    const NEW: &str = "etcd:v3.5.2";
    let mut obs = converged(3, 3);
    obs.statefulset.as_mut().unwrap().image = NEW.into();
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RestartMember {
            ordinal: 1,
            member_id: 101
        })
    );
    obs.pods.insert(1, pod(NEW));
    obs.pods.insert(2, pod(NEW));
    match plan_next_step(&obs) {
        Plan::Act(Step::MoveLeader { from: 100, to }) => assert!(to == 101 || to == 102),
        other => panic!("expected MoveLeader, got {other:?}"),
    }
    let mut obs2 = with_members(
        obs.clone(),
        (0..3).map(|o| member(o, true, o == 1, false)).collect(),
    );
    obs2.pods.insert(1, pod(NEW));
    assert_eq!(
        plan_next_step(&obs2),
        Plan::Act(Step::RestartMember {
            ordinal: 0,
            member_id: 100
        })
    );
}

#[test]
fn rolling_upgrade_waits_while_any_member_is_unhealthy() {
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, false, false, false),
            member(2, true, false, false),
        ],
    );
    obs.statefulset.as_mut().unwrap().image = "etcd:v3.5.2".into();
    match plan_next_step(&obs) {
        Plan::Wait(why) => assert!(why.contains("c-etcd-1 is unhealthy"), "{why}"),
        other => panic!("expected wait, got {other:?}"),
    }
}

#[test]
fn a_single_member_cluster_is_restarted_for_an_upgrade() {
    let mut obs = converged(1, 1);
    obs.statefulset.as_mut().unwrap().image = "etcd:v3.5.2".into();
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RestartMember {
            ordinal: 0,
            member_id: 100
        })
    );
}

#[test]
fn nospace_is_recovered_once_every_member_is_healthy() {
    let mut obs = converged(3, 3);
    obs.alarms = vec![Alarm {
        member_id: 101,
        kind: AlarmKind::NoSpace,
    }];
    assert_eq!(plan_next_step(&obs), Plan::Act(Step::RecoverFromNoSpace));
    let mut sick = with_members(
        obs.clone(),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, false, false, false),
        ],
    );
    sick.alarms = obs.alarms.clone();
    match plan_next_step(&sick) {
        Plan::Wait(why) => assert!(why.contains("NOSPACE recovery waits"), "{why}"),
        other => panic!("expected wait, got {other:?}"),
    }
}

#[test]
fn a_corrupt_alarm_is_left_to_a_person() {
    let mut obs = converged(3, 3);
    obs.alarms = vec![Alarm {
        member_id: 102,
        kind: AlarmKind::Corrupt,
    }];
    match plan_next_step(&obs) {
        Plan::Hold(why) => {
            assert!(why.contains("CORRUPT") && why.contains("c-etcd-2"), "{why}")
        }
        other => panic!("expected a hold, got {other:?}"),
    }
}

#[test]
fn fragmented_members_are_defragmented_followers_first_leader_last() {
    let fragmented = |o: u32, leader: bool| {
        let mut m = member(o, true, leader, false);
        let s = m.status.as_mut().unwrap();
        s.db_size = 512 << 20;
        s.db_size_in_use = 100 << 20;
        m
    };
    let obs = with_members(
        converged(3, 3),
        vec![
            fragmented(0, true),
            member(1, true, false, false),
            fragmented(2, false),
        ],
    );
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::Defragment {
            ordinal: 2,
            member_id: 102
        })
    );
    let obs = with_members(
        converged(3, 3),
        vec![
            fragmented(0, true),
            member(1, true, false, false),
            member(2, true, false, false),
        ],
    );
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::Defragment {
            ordinal: 0,
            member_id: 100
        })
    );
    // Small databases are left alone however fragmented.
    let mut small = member(1, true, false, false);
    small.status.as_mut().unwrap().db_size = 10 << 20;
    let obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            small,
            member(2, true, false, false),
        ],
    );
    assert_eq!(plan_next_step(&obs), Plan::Converged);
}

pub(super) fn foreign(id: u64, healthy: bool, learner: bool) -> MemberObservation {
    let mut m = member(0, healthy, false, learner);
    m.member.id = id;
    m.member.name = "someone-else".into();
    m.member.peer_urls = vec!["https://10.9.9.9:2380".into()];
    m.member.client_urls = vec!["https://10.9.9.9:2379".into()];
    if let Some(s) = m.status.as_mut() {
        s.member_id = id;
    }
    m
}

fn refused(plan: Plan) -> Refusal {
    match plan {
        Plan::Refuse(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_object_owned_by_another_cluster_refuses_every_step() {
    let mut obs = converged(3, 3);
    obs.stale_objects = vec![ObjectKind::StatefulSet];
    obs.conflicts = vec![ForeignObject {
        object: "StatefulSet/etcd-system/c-etcd".into(),
        owner: Some("team-b.c".into()),
    }];
    let r = refused(plan_next_step(&obs));
    assert_eq!(r.reason, "ObjectOwnedElsewhere");
    assert!(
        r.message
            .contains("StatefulSet/etcd-system/c-etcd (owned by team-b.c)"),
        "{}",
        r.message
    );
    obs.conflicts[0].owner = None;
    assert!(
        refused(plan_next_step(&obs))
            .message
            .contains("no owner label")
    );
}

#[test]
fn lost_pki_and_untakeable_storage_changes_are_refused() {
    let mut obs = converged(3, 3);
    obs.pki_lost = true;
    obs.stale_objects = vec![ObjectKind::Pki];
    assert_eq!(refused(plan_next_step(&obs)).reason, "PkiLost");
    let mut obs = converged(3, 3);
    obs.storage.class = Some("fast".into());
    obs.storage.target = TargetClass::Missing;
    assert_eq!(refused(plan_next_step(&obs)).reason, "StorageClassMissing");
}

#[test]
fn identity_mismatch_names_what_moved_and_nothing_recorded_passes() {
    let recorded = etcdfleet_api::ManagedIdentity {
        kubeconfig_secret: "a-kubeconfig/value".into(),
        workload_namespace: "etcd-system".into(),
        tls: true,
    };
    assert_eq!(identity_mismatch(None, &recorded), None);
    assert_eq!(identity_mismatch(Some(&recorded), &recorded), None);
    let mut moved = recorded.clone();
    moved.workload_namespace = "other".into();
    moved.tls = false;
    let why = identity_mismatch(Some(&recorded), &moved).unwrap();
    assert!(
        why.contains("workloadNamespace (etcd-system → other)"),
        "{why}"
    );
    assert!(why.contains("tls.enabled (true → false)"), "{why}");
}

#[test]
fn a_version_below_what_etcd_reports_is_refused() {
    // A CR recreated over retained volumes: no status, members at 3.5.1.
    let mut obs = converged(3, 3);
    obs.requested_version = Some("3.4.23".into());
    assert_eq!(refused(plan_next_step(&obs)).reason, "VersionRejected");
    obs.requested_version = Some("3.5.1".into());
    assert_eq!(plan_next_step(&obs), Plan::Converged);
}

#[test]
fn foreign_members_are_reported_never_removed() {
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, true, false, false),
            foreign(999, false, true),
        ],
    );
    obs.failed_members = BTreeSet::from([999]);
    match plan_next_step(&obs) {
        Plan::Hold(why) => assert!(why.contains("3e7") && why.contains("by hand"), "{why}"),
        other => panic!("expected a hold, got {other:?}"),
    }
    // A failed foreign voter is not removed either.
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, true, false, false),
            foreign(999, false, false),
        ],
    );
    obs.failed_members = BTreeSet::from([999]);
    assert!(matches!(plan_next_step(&obs), Plan::Hold(_)));
}

#[test]
fn a_member_unreachable_from_the_controller_but_ready_in_its_pod_is_not_failed() {
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, false, false, false),
        ],
    );
    obs.failed_members = BTreeSet::from([102]);
    match plan_next_step(&obs) {
        Plan::Wait(why) => assert!(why.contains("pod is ready"), "{why}"),
        other => panic!("expected wait, got {other:?}"),
    }
    // Past the longer grace, it is replaced after all: without a
    // readiness probe, ready only means the process runs.
    obs.failed_long_ago = BTreeSet::from([102]);
    assert!(matches!(
        plan_next_step(&obs),
        Plan::Act(Step::RemoveMember { member_id: 102, .. })
    ));
    // When readiness is etcd's own health check, the workload cluster's
    // view wins however long the controller cannot reach it.
    obs.pods.get_mut(&2).unwrap().ready_means_etcd_healthy = true;
    match plan_next_step(&obs) {
        Plan::Hold(why) => {
            assert!(
                why.contains("etcd's health check in its pod passes"),
                "{why}"
            )
        }
        other => panic!("expected a hold, got {other:?}"),
    }
    // Not ready (etcd's check fails too): a failed member, replaced.
    obs.pods.get_mut(&2).unwrap().ready = false;
    assert!(matches!(
        plan_next_step(&obs),
        Plan::Act(Step::RemoveMember { member_id: 102, .. })
    ));
}

#[test]
fn a_learner_whose_pod_never_started_is_not_failed() {
    let mut learner = member(2, false, false, true);
    learner.member.name.clear();
    let mut obs = with_members(
        converged(2, 3),
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            learner,
        ],
    );
    obs.statefulset.as_mut().unwrap().replicas = 3;
    obs.pods.insert(
        2,
        PodObservation {
            running: false,
            ready: false,
            ..pod(IMG)
        },
    );
    obs.failed_members = BTreeSet::from([102]);
    assert!(matches!(plan_next_step(&obs), Plan::Wait(_)));
}

#[test]
fn scale_down_is_refused_while_a_member_is_unhealthy() {
    let obs = with_members(
        converged(5, 3),
        (0..5).map(|o| member(o, o != 1, o == 0, false)).collect(),
    );
    match plan_next_step(&obs) {
        Plan::Wait(why) => {
            assert!(
                why.contains("scale-down to 3 members waits") && why.contains("c-etcd-1"),
                "{why}"
            )
        }
        other => panic!("expected wait, got {other:?}"),
    }
}

#[test]
fn quorum_loss_takes_no_step_and_says_what_a_person_can_do() {
    let mut obs = converged(3, 3);
    obs.etcd = EtcdObservation::Unreachable("context deadline exceeded".into());
    obs.failed_members = BTreeSet::from([100, 101]);
    match plan_next_step(&obs) {
        Plan::Hold(why) => {
            assert!(
                why.contains("quorum lost") && why.contains("snapshot"),
                "{why}"
            )
        }
        other => panic!("expected wait, got {other:?}"),
    }
}

#[test]
fn a_controller_cut_off_from_members_ready_in_their_pods_holds_without_claiming_quorum_loss() {
    let cut_off = |why: &str| {
        assert!(
            why.contains("cut off")
                && why.contains("network")
                && !why.contains("quorum lost")
                && !why.contains("restore")
                && !why.contains("snapshot"),
            "{why}"
        )
    };
    let by_health = |obs: &mut Observation, ordinals: &[u32]| {
        for o in ordinals {
            obs.pods.get_mut(o).unwrap().ready_means_etcd_healthy = true;
        }
    };
    // No member answers; every pod passes etcd's own health check.
    let mut obs = converged(3, 3);
    obs.etcd = EtcdObservation::Unreachable("connection refused".into());
    by_health(&mut obs, &[0, 1, 2]);
    assert_eq!(
        quorum_view(&obs),
        QuorumView::Unreachable(CutOff {
            answering: 0,
            ready_in_pods: 3,
            voters: 3
        })
    );
    match plan_next_step(&obs) {
        Plan::Hold(why) => cut_off(&why),
        other => panic!("expected a hold, got {other:?}"),
    }
    // Two of three ready are still a quorum by the pods' view.
    obs.pods.get_mut(&2).unwrap().ready = false;
    assert!(matches!(quorum_view(&obs), QuorumView::Unreachable(_)));
    // One of three (another being replaced): the members' own health
    // says quorum is lost.
    obs.pods.get_mut(&1).unwrap().deleting = true;
    assert_eq!(
        quorum_view(&obs),
        QuorumView::Lost {
            healthy: 0,
            voters: 3
        }
    );
    match plan_next_step(&obs) {
        Plan::Hold(why) => assert!(why.contains("quorum lost"), "{why}"),
        other => panic!("expected a hold, got {other:?}"),
    }

    // One member answers, two do not but pass their pods' check.
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, false, false, false),
            member(2, false, false, false),
        ],
    );
    by_health(&mut obs, &[1, 2]);
    match plan_next_step(&obs) {
        Plan::Hold(why) => cut_off(&why),
        other => panic!("expected a hold, got {other:?}"),
    }
    // Ready without etcd's health check behind it is no vantage point.
    let mut obs = with_members(
        converged(3, 3),
        vec![
            member(0, true, true, false),
            member(1, false, false, false),
            member(2, false, false, false),
        ],
    );
    assert!(matches!(quorum_view(&obs), QuorumView::Lost { .. }));
    // A cluster no voter was ever seen of is not started, not lost.
    obs.etcd = EtcdObservation::Unreachable("no member pods".into());
    obs.known_voters = 0;
    assert_eq!(quorum_view(&obs), QuorumView::NotStarted);
    assert!(matches!(plan_next_step(&obs), Plan::Wait(_)));
}

#[test]
fn a_pod_from_an_older_template_is_rolled_and_a_rewritten_image_is_not() {
    let mut obs = converged(3, 3);
    obs.statefulset.as_mut().unwrap().template_hash = Some("new".into());
    for p in obs.pods.values_mut() {
        p.template_hash = Some("old".into());
    }
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::RestartMember {
            ordinal: 1,
            member_id: 101
        })
    );
    // Every pod from the current template, images rewritten by a webhook.
    for p in obs.pods.values_mut() {
        p.template_hash = Some("new".into());
        p.image = "mirror.example/etcd@sha256:abc".into();
    }
    assert_eq!(plan_next_step(&obs), Plan::Converged);
}

#[test]
fn a_step_that_keeps_failing_backs_off_exponentially() {
    assert_eq!(retry_delay(1), std::time::Duration::ZERO);
    assert_eq!(retry_delay(2), RETRY_BASE);
    assert_eq!(retry_delay(3), RETRY_BASE * 2);
    assert_eq!(retry_delay(40), RETRY_MAX);
    let mut obs = converged(3, 3);
    obs.alarms = vec![Alarm {
        member_id: 101,
        kind: AlarmKind::NoSpace,
    }];
    obs.last_failure = Some(FailedStep {
        kind: "RecoverFromNoSpace".into(),
        failures: 3,
        age: std::time::Duration::from_secs(2),
        message: "RecoverFromNoSpace: etcd unreachable".into(),
    });
    match plan_next_step(&obs) {
        Plan::Hold(why) => assert!(why.contains("failed 3 time(s)"), "{why}"),
        other => panic!("expected a hold, got {other:?}"),
    }
    obs.last_failure.as_mut().unwrap().age = std::time::Duration::from_secs(11);
    assert_eq!(plan_next_step(&obs), Plan::Act(Step::RecoverFromNoSpace));
}

#[test]
fn destructive_steps_are_marked() {
    assert!(Step::DeletePvc { ordinal: 1 }.is_destructive());
    assert!(!Step::AddLearner { ordinal: 1 }.is_destructive());
}

#[test]
fn every_rule_has_its_own_name_and_a_quiet_cluster_passes_them_all() {
    let names: BTreeSet<&str> = RULES.iter().map(|(name, _)| *name).collect();
    assert_eq!(names.len(), RULES.len());
    let obs = converged(3, 3);
    let members = Members::of(&obs).unwrap();
    for (name, rule) in RULES {
        let answer = match rule {
            Rule::Observation(decide) => decide(&obs),
            Rule::Members(decide) => decide(&members),
        };
        assert_eq!(answer, None, "rule {name:?} answered a converged cluster");
    }
}

/// Clients of the client Service never lose two members at once: no step
/// that takes a member out (a scale-down's removal, a defragmentation)
/// is taken while another member's pod is not Ready yet (a member just
/// restarted or promoted serves once its readiness probe passes).
#[test]
fn no_member_is_taken_out_while_another_members_pod_is_not_ready() {
    let waits_for_1 = |plan: Plan| match plan {
        Plan::Wait(why) => assert!(why.contains("pod c-etcd-1 Ready yet"), "{why}"),
        other => panic!("expected a wait for c-etcd-1, got {other:?}"),
    };
    // A scale-down 3 → 1 would remove c-etcd-2 first.
    let mut obs = converged(3, 1);
    obs.pods.get_mut(&1).unwrap().ready = false;
    waits_for_1(plan_next_step(&obs));
    obs.pods.get_mut(&1).unwrap().ready = true;
    assert!(
        matches!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember {
                ordinal: Some(2),
                ..
            })
        ),
        "{:?}",
        plan_next_step(&obs)
    );
    // A defragmentation of c-etcd-2.
    let mut fragmented = member(2, true, false, false);
    let s = fragmented.status.as_mut().unwrap();
    (s.db_size, s.db_size_in_use) = (512 << 20, 100 << 20);
    let members = vec![
        member(0, true, true, false),
        member(1, true, false, false),
        fragmented,
    ];
    let mut obs = with_members(converged(3, 3), members);
    obs.pods.get_mut(&1).unwrap().ready = false;
    waits_for_1(plan_next_step(&obs));
}
