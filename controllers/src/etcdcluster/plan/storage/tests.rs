//! The storage rules, through the whole policy ([`plan_next_step`]): what a
//! growth does next, what it waits for, what is refused.

use super::super::observation::TargetClass;
use super::super::plan_next_step;
use super::super::step::RemovalCause;
use super::super::tests::{IMG, converged, member, pod, with_members};
use super::*;
use crate::etcd::{Alarm, AlarmKind};

/// A converged 3-member cluster on 8Gi volumes of class `standard`, asked
/// for 16Gi; the class allows expansion.
fn asked_to_grow() -> Observation {
    let mut obs = converged(3, 3);
    obs.storage.size = "16Gi".into();
    obs.storage.expansion = Expansion::Allowed("standard".into());
    obs
}

fn claim(obs: &mut Observation, ordinal: u32, requested: &str, capacity: &str) {
    let size = &mut obs.pvcs.get_mut(&ordinal).unwrap().size;
    size.requested = Some(requested.into());
    size.capacity = Some(capacity.into());
}

fn step(obs: &Observation) -> StorageStep {
    match plan_next_step(obs) {
        Plan::Act(Step::Storage(step)) => step,
        other => panic!("expected a storage step, got {other:?}"),
    }
}

fn wait(obs: &Observation) -> String {
    match plan_next_step(obs) {
        Plan::Wait(why) => why,
        other => panic!("expected a wait, got {other:?}"),
    }
}

fn refusal(obs: &Observation) -> Refusal {
    match plan_next_step(obs) {
        Plan::Refuse(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_growth_expands_one_claim_at_a_time_then_recreates_the_statefulset() {
    let mut obs = asked_to_grow();
    let expand = |ordinal| StorageStep::ExpandVolume {
        ordinal,
        size: "16Gi".into(),
    };
    // Followers first, the leader (ordinal 0) last.
    assert_eq!(step(&obs), expand(1));
    // Asked for, not there yet: the next claim waits.
    claim(&mut obs, 1, "16Gi", "8Gi");
    let why = wait(&obs);
    assert!(why.contains("c-etcd-1 is growing: 8Gi of 16Gi"), "{why}");
    claim(&mut obs, 1, "16Gi", "16Gi");
    assert_eq!(step(&obs), expand(2));
    claim(&mut obs, 2, "16Gi", "16Gi");
    assert_eq!(step(&obs), expand(0));
    claim(&mut obs, 0, "16Gi", "16Gi");
    assert_eq!(
        step(&obs),
        StorageStep::RecreateStatefulSet {
            class: None,
            size: "16Gi".into()
        }
    );
    // Deleted with its pods orphaned, not yet gone: wait; gone: bootstrap
    // creates it again, wide enough for every volume.
    obs.statefulset.as_mut().unwrap().deleting = true;
    assert!(wait(&obs).contains("old StatefulSet is still being deleted"));
    obs.statefulset = None;
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::Bootstrap { replicas: 3 })
    );
    // Created with the new template: nothing of the growth is left.
    obs = asked_to_grow();
    for o in 0..3 {
        claim(&mut obs, o, "16Gi", "16Gi");
    }
    obs.storage.template = Some((None, Some("16Gi".into())));
    assert_eq!(plan_next_step(&obs), Plan::Converged);
}

#[test]
fn sizes_are_compared_as_quantities_not_as_text() {
    let mut obs = converged(3, 3);
    obs.storage.size = "8192Mi".into();
    assert_eq!(plan_next_step(&obs), Plan::Converged);
    obs.storage.size = "8.5Gi".into();
    obs.storage.expansion = Expansion::Allowed("standard".into());
    assert!(matches!(
        step(&obs),
        StorageStep::ExpandVolume { ordinal: 1, .. }
    ));
}

#[test]
fn a_file_system_that_grows_at_restart_restarts_one_member_under_the_quorum_guard() {
    let mut obs = asked_to_grow();
    claim(&mut obs, 1, "16Gi", "8Gi");
    obs.pvcs.get_mut(&1).unwrap().size.restart_pending = true;
    assert_eq!(
        step(&obs),
        StorageStep::RestartForResize {
            ordinal: 1,
            member_id: 101
        }
    );
    // Another member down: restarting this one would lose the quorum.
    let mut obs = with_members(
        obs,
        vec![
            member(0, true, true, false),
            member(1, true, false, false),
            member(2, false, false, false),
        ],
    );
    obs.pods.get_mut(&2).unwrap().ready = false;
    let why = wait(&obs);
    assert!(
        why.contains("the volume of c-etcd-1 grew; its restart waits"),
        "{why}"
    );
    // Member 2 answers again; its pod's readiness probe has not passed.
    let mut obs = asked_to_grow();
    claim(&mut obs, 1, "16Gi", "8Gi");
    obs.pvcs.get_mut(&1).unwrap().size.restart_pending = true;
    obs.pods.get_mut(&2).unwrap().ready = false;
    let why = wait(&obs);
    assert!(
        why.contains("c-etcd-1 waits to restart: the kubelet does not report pod c-etcd-2 Ready"),
        "{why}"
    );
    // The leader's: leadership moves first.
    let mut obs = asked_to_grow();
    claim(&mut obs, 0, "16Gi", "8Gi");
    obs.pvcs.get_mut(&0).unwrap().size.restart_pending = true;
    assert!(matches!(
        plan_next_step(&obs),
        Plan::Act(Step::MoveLeader { from: 100, .. })
    ));
    // Its pod already restarting: wait for it.
    let mut obs = asked_to_grow();
    claim(&mut obs, 1, "16Gi", "8Gi");
    obs.pvcs.get_mut(&1).unwrap().size.restart_pending = true;
    obs.pods.get_mut(&1).unwrap().deleting = true;
    assert!(wait(&obs).contains("c-etcd-1 is restarting so its file system grows"));
}

#[test]
fn a_claim_is_expanded_only_while_every_member_is_healthy() {
    let obs = with_members(
        asked_to_grow(),
        vec![
            member(0, true, true, false),
            member(1, false, false, false),
            member(2, true, false, false),
        ],
    );
    let why = wait(&obs);
    assert!(
        why.contains("volume growth waits: member c-etcd-1 is unhealthy"),
        "{why}"
    );
}

#[test]
fn a_resize_error_is_said_while_the_growth_waits() {
    let mut obs = asked_to_grow();
    claim(&mut obs, 0, "16Gi", "8Gi");
    obs.pvcs.get_mut(&0).unwrap().size.error = Some("disk quota exceeded".into());
    assert!(wait(&obs).contains("(disk quota exceeded)"));
}

#[test]
fn a_shrink_is_refused_and_nothing_is_written() {
    let mut obs = converged(3, 3);
    obs.storage.size = "4Gi".into();
    let r = refusal(&obs);
    assert_eq!(r.reason, "StorageShrink");
    assert!(
        r.message.contains(
            "spec.storage.size 4Gi is smaller than the members' volumes (8589934592 bytes)"
        ),
        "{}",
        r.message
    );
    // Smaller than a claim that already grew, though not than the template.
    let mut obs = asked_to_grow();
    claim(&mut obs, 0, "16Gi", "16Gi");
    obs.storage.size = "12Gi".into();
    assert_eq!(refusal(&obs).reason, "StorageShrink");
}

#[test]
fn a_growth_the_class_cannot_take_is_refused_naming_the_class() {
    for (expansion, reason, says) in [
        (
            Expansion::NotAllowed("slow".into()),
            "StorageNotExpandable",
            "StorageClass \"slow\" does not set allowVolumeExpansion: true",
        ),
        (
            Expansion::Missing("gone".into()),
            "StorageNotExpandable",
            "StorageClass \"gone\" does not exist",
        ),
        (
            Expansion::NoClass,
            "StorageNotExpandable",
            "claims name no StorageClass",
        ),
        (
            Expansion::Unreadable {
                class: "fast".into(),
                error: "forbidden".into(),
            },
            "StorageClassUnreadable",
            "StorageClass \"fast\" could not be read (forbidden)",
        ),
    ] {
        let mut obs = asked_to_grow();
        obs.storage.expansion = expansion;
        let r = refusal(&obs);
        assert_eq!(r.reason, reason);
        assert!(r.message.contains(says), "{}", r.message);
        assert!(r.message.contains("nothing is written"), "{}", r.message);
    }
    // Every claim asked for the size already: the class is not needed.
    let mut obs = asked_to_grow();
    obs.storage.expansion = Expansion::NotAllowed("slow".into());
    for o in 0..3 {
        claim(&mut obs, o, "16Gi", "16Gi");
    }
    assert!(matches!(
        step(&obs),
        StorageStep::RecreateStatefulSet { .. }
    ));
}

#[test]
fn a_move_to_no_class_or_a_missing_one_and_a_size_that_is_no_quantity_are_refused() {
    let mut obs = converged(3, 3);
    obs.storage.template = Some((Some("old".into()), Some("8Gi".into())));
    assert_eq!(refusal(&obs).reason, "StorageImmutable");
    obs.storage.class = Some("new".into());
    obs.storage.target = TargetClass::Missing;
    let r = refusal(&obs);
    assert_eq!(r.reason, "StorageClassMissing");
    assert!(r.message.contains("\"new\""), "{}", r.message);
    obs.storage.target = TargetClass::Unreadable("forbidden".into());
    assert_eq!(refusal(&obs).reason, "StorageClassUnreadable");
    let mut obs = converged(3, 3);
    obs.storage.size = "lots".into();
    let r = refusal(&obs);
    assert_eq!(r.reason, "StorageSizeInvalid");
    assert!(
        r.message.contains("\"lots\" is not a quantity"),
        "{}",
        r.message
    );
}

#[test]
fn a_growth_waits_for_a_version_change_rotation_or_roll_that_came_first() {
    let mut obs = asked_to_grow();
    let (from, to) = (semver::Version::new(3, 5, 1), semver::Version::new(3, 6, 0));
    obs.version.minor_change = Some((from, to));
    // The preflight has nothing to do here (no StatefulSet write pending);
    // the growth says what it waits for.
    let why = wait(&obs);
    assert!(
        why.contains("the change of version 3.5.1 → 3.6.0 comes first"),
        "{why}"
    );

    let mut obs = asked_to_grow();
    obs.statefulset.as_mut().unwrap().template_hash = Some("new".into());
    for p in obs.pods.values_mut() {
        p.template_hash = Some("old".into());
    }
    let why = match super::super::RULES
        .iter()
        .find(|(n, _)| *n == "grow volumes")
    {
        Some((_, super::super::Rule::Members(rule))) => {
            rule(&super::super::Members::of(&obs).unwrap())
        }
        _ => panic!("the growth rule is a members rule"),
    };
    // A roll under way is driven by a later rule: the growth does not
    // answer (a wait would hold the roll, and the growth with it, forever),
    // and the roll restarts a member.
    assert_eq!(why, None);
    assert!(
        matches!(plan_next_step(&obs), Plan::Act(Step::RestartMember { .. })),
        "{:?}",
        plan_next_step(&obs)
    );
}

#[test]
fn a_version_change_or_rotation_asked_during_a_growth_waits_for_it() {
    let mut obs = asked_to_grow();
    claim(&mut obs, 0, "16Gi", "16Gi");
    let (from, to) = (semver::Version::new(3, 5, 1), semver::Version::new(3, 6, 0));
    obs.version.minor_change = Some((from, to));
    obs.version.backup_destination = Some("s3://b/p".into());
    // Begun: the growth goes on, the version's preflight snapshot waits.
    assert_eq!(
        step(&obs),
        StorageStep::ExpandVolume {
            ordinal: 1,
            size: "16Gi".into()
        }
    );
    obs.ca_rotation.requested = Some("r1".into());
    assert!(matches!(
        step(&obs),
        StorageStep::ExpandVolume { ordinal: 1, .. }
    ));
    // Every volume grown: the StatefulSet write is pending, so the
    // preflight's snapshot comes before the StatefulSet is created again.
    for o in 1..3 {
        claim(&mut obs, o, "16Gi", "16Gi");
    }
    assert!(matches!(
        plan_next_step(&obs),
        Plan::Act(Step::Version(
            crate::etcdcluster::plan::VersionStep::SnapshotBefore { .. }
        ))
    ));
    obs.version.snapshot_taken = true;
    assert!(matches!(
        step(&obs),
        StorageStep::RecreateStatefulSet { .. }
    ));
}

#[test]
fn nospace_lets_a_roll_onto_a_grown_quota_go_first() {
    let mut obs = converged(3, 3);
    obs.alarms = vec![Alarm {
        member_id: 101,
        kind: AlarmKind::NoSpace,
    }];
    assert_eq!(plan_next_step(&obs), Plan::Act(Step::RecoverFromNoSpace));
    obs.statefulset.as_mut().unwrap().template_hash = Some("new".into());
    for p in obs.pods.values_mut() {
        p.template_hash = Some("old".into());
    }
    assert!(matches!(
        plan_next_step(&obs),
        Plan::Act(Step::RestartMember { ordinal: 1, .. })
    ));
}

/// A converged 3-member cluster on class `old`, asked to move to `new`.
fn asked_to_move() -> Observation {
    let mut obs = converged(3, 3);
    obs.storage.class = Some("new".into());
    obs.storage.template = Some((Some("old".into()), Some("8Gi".into())));
    obs.storage.target = TargetClass::Exists;
    for pvc in obs.pvcs.values_mut() {
        pvc.size.class = Some("old".into());
    }
    obs
}

/// The claim of `ordinal` on `class`, recorded for member `100 + ordinal`
/// (or no member yet).
fn volume(obs: &mut Observation, ordinal: u32, class: &str, member: bool) {
    let pvc = obs.pvcs.entry(ordinal).or_default();
    pvc.size.class = Some(class.into());
    pvc.member_id = member.then_some(100 + u64::from(ordinal));
    pvc.owner_recorded = true;
}

#[test]
fn a_move_recreates_the_statefulset_adds_a_spare_then_replaces_members_leader_last() {
    let mut obs = asked_to_move();
    assert_eq!(
        step(&obs),
        StorageStep::RecreateStatefulSet {
            class: Some("new".into()),
            size: "8Gi".into()
        }
    );
    // Created again with the new class: the spare joins at ordinal 3.
    obs.storage.template = Some((Some("new".into()), Some("8Gi".into())));
    obs.storage.target = TargetClass::NotRead;
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::AddLearner { ordinal: 3 })
    );
    // The spare is a voter: a follower on the old class goes first.
    let four = |leader: u32| {
        (0..4)
            .map(|o| member(o, true, o == leader, false))
            .collect()
    };
    let mut obs = with_members(obs, four(0));
    obs.statefulset.as_mut().unwrap().replicas = 4;
    obs.pods.insert(3, pod(IMG));
    volume(&mut obs, 3, "new", true);
    let removal = |ordinal: u32| {
        Plan::Act(Step::RemoveMember {
            ordinal: Some(ordinal),
            member_id: 100 + u64::from(ordinal),
            cause: RemovalCause::StorageClassMove,
        })
    };
    assert_eq!(plan_next_step(&obs), removal(2));
    // Removed: its volume goes, and its ordinal rejoins on the new class.
    let three: Vec<_> = [0, 1, 3].map(|o| member(o, true, o == 0, false)).into();
    let mut obs = with_members(obs, three);
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::DeleteStaleStorage {
            ordinal: 2,
            force_pod: false
        })
    );
    volume(&mut obs, 2, "new", false);
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::AddLearner { ordinal: 2 })
    );
    // Member 2 back on the new class: member 1 next; then the leader hands
    // over to a member on the new class before it goes.
    let mut obs = with_members(obs, four(0));
    volume(&mut obs, 2, "new", true);
    assert_eq!(plan_next_step(&obs), removal(1));
    volume(&mut obs, 1, "new", true);
    assert!(matches!(
        plan_next_step(&obs),
        Plan::Act(Step::MoveLeader { from: 100, .. })
    ));
    let mut obs = with_members(obs, four(1));
    assert_eq!(plan_next_step(&obs), removal(0));
    // Every member on the new class: the spare leaves as a scale-down.
    volume(&mut obs, 0, "new", true);
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
fn a_member_down_or_a_volume_the_new_class_does_not_provision_holds_the_move() {
    let mut obs = asked_to_move();
    obs.storage.template = Some((Some("new".into()), Some("8Gi".into())));
    let mut obs = with_members(
        obs,
        (0..4).map(|o| member(o, o != 2, o == 0, false)).collect(),
    );
    obs.statefulset.as_mut().unwrap().replicas = 4;
    obs.pods.insert(3, pod(IMG));
    volume(&mut obs, 3, "new", true);
    let why = wait(&obs);
    assert!(why.contains("c-etcd-2 is unhealthy"), "{why}");
    // The spare's volume never bound.
    volume(&mut obs, 3, "new", false);
    obs.pvcs.get_mut(&3).unwrap().size.unprovisioned =
        Some("unbound for 90s; ProvisioningFailed: no capacity".into());
    match plan_next_step(&obs) {
        Plan::Hold(why) => {
            assert!(why.contains("StorageClass new"), "{why}");
            assert!(why.contains("c-etcd-3"), "{why}");
            assert!(why.contains("ProvisioningFailed: no capacity"), "{why}");
        }
        other => panic!("expected a hold, got {other:?}"),
    }
}

#[test]
fn a_move_asked_while_members_are_outdated_lets_the_roll_go_first() {
    // As after a move reverted half way: the StatefulSet of the first
    // re-creation has another template than the members kept from before.
    let mut obs = asked_to_move();
    obs.statefulset.as_mut().unwrap().template_hash = Some("new".into());
    for p in obs.pods.values_mut() {
        p.template_hash = Some("old".into());
    }
    assert!(
        matches!(plan_next_step(&obs), Plan::Act(Step::RestartMember { .. })),
        "{:?}",
        plan_next_step(&obs)
    );
    for p in obs.pods.values_mut() {
        p.template_hash = Some("new".into());
    }
    assert!(matches!(
        step(&obs),
        StorageStep::RecreateStatefulSet { .. }
    ));
}

#[test]
fn a_move_waits_for_a_version_change_and_volumes_it_replaces_do_not_grow() {
    let mut obs = asked_to_move();
    let (from, to) = (semver::Version::new(3, 5, 1), semver::Version::new(3, 6, 0));
    obs.version.minor_change = Some((from, to));
    assert!(wait(&obs).contains("the change of version 3.5.1 → 3.6.0 comes first"));
    // A larger size with the move: the new volumes get it; none is expanded.
    let mut obs = asked_to_move();
    obs.storage.size = "16Gi".into();
    obs.storage.expansion = Expansion::NotAllowed("old".into());
    assert!(matches!(
        step(&obs),
        StorageStep::RecreateStatefulSet { .. }
    ));
}
