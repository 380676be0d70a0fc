//! The storage rules, through the whole policy ([`plan_next_step`]): what a
//! growth does next, what it waits for, what is refused.

use super::super::plan_next_step;
use super::super::tests::{converged, member, with_members};
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
    assert!(
        why.contains("c-etcd-1 is growing: 8589934592 bytes of 17179869184"),
        "{why}"
    );
    claim(&mut obs, 1, "16Gi", "16Gi");
    assert_eq!(step(&obs), expand(2));
    claim(&mut obs, 2, "16Gi", "16Gi");
    assert_eq!(step(&obs), expand(0));
    claim(&mut obs, 0, "16Gi", "16Gi");
    assert_eq!(
        step(&obs),
        StorageStep::RecreateStatefulSet {
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
fn a_change_of_class_and_a_size_that_is_no_quantity_are_refused() {
    let mut obs = converged(3, 3);
    obs.storage.class = Some("fast".into());
    assert_eq!(refusal(&obs).reason, "StorageImmutable");
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
    assert!(
        matches!(&why, Some(Plan::Wait(w)) if w.contains("members are being rolled")),
        "{why:?}"
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
