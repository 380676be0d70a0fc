use std::collections::BTreeMap;

use etcdfleet_api::recovery::{QuorumLossPolicy, RecoveryBackup, ResolvedRecovery};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::super::super::observation::{PodObservation, PvcObservation};
use super::super::super::tests::converged;
use super::super::recovery;
use super::*;

fn ago(minutes: i64) -> Timestamp {
    Timestamp::now() - SignedDuration::from_mins(minutes)
}

fn nightly() -> RecoveryBackup {
    RecoveryBackup {
        name: "nightly".into(),
        revision: Some(70),
        ..Default::default()
    }
}

/// Three voters, all gone for an hour: no member answers, the pods the
/// StatefulSet made again crash on new, empty claims; `FromBackup`, and a
/// backup that verified.
fn all_lost() -> Observation {
    let mut obs = converged(3, 3);
    obs.etcd = EtcdObservation::Unreachable("connection refused".into());
    for o in 0..3 {
        obs.pods.insert(
            o,
            PodObservation {
                ready: false,
                ..obs.pods[&o].clone()
            },
        );
        obs.pvcs.insert(
            o,
            PvcObservation {
                member_id: None,
                ..obs.pvcs[&o].clone()
            },
        );
    }
    obs.recovery.policy = ResolvedRecovery {
        quorum_loss: QuorumLossPolicy::FromBackup,
        ..Default::default()
    };
    obs.recovery.local_view = Some(Err("no member answers".into()));
    obs.recovery.recorded_voters = (0..3).map(|o| (obs.names.pod(o), 100 + o as u64)).collect();
    obs.recovery.down_since = (100..103).map(|id| (id, ago(60))).collect();
    obs.recovery.nodes = Some(Ok(BTreeMap::from([("n0".into(), true)])));
    obs.recovery.last_seen_revision = Some(90);
    obs.recovery.backup = Some(Ok(nightly()));
    obs
}

fn begun(obs: &Observation) -> RecoveryPlan {
    match recovery(obs) {
        Some(Plan::Act(Step::Recovery(RecoveryStep::Begin(p)))) => *p,
        other => panic!("expected a recovery to begin, got {other:?}"),
    }
}

#[test]
fn with_every_voter_lost_the_newest_verified_backup_is_restored() {
    let plan = begun(&all_lost());
    assert_eq!(plan.id, "backup-nightly");
    assert_eq!(plan.backup.as_deref(), Some(&nightly()));
    assert_eq!((plan.chosen, plan.kept_revision), (0, 70));
    assert_eq!(plan.last_seen_revision, Some(90));
    let lost: Vec<&str> = plan.lost.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lost, ["c-etcd-0", "c-etcd-1", "c-etcd-2"]);
    assert!(plan.lost.iter().all(|l| l.evidence.len() >= 3), "{plan:?}");
}

#[test]
fn no_backup_that_verifies_holds_and_says_why() {
    let mut obs = all_lost();
    obs.recovery.backup = Some(Err("nightly: sha256 mismatch".into()));
    match recovery(&obs) {
        Some(Plan::Hold(why)) => {
            assert!(
                why.contains("no backup can be restored: nightly: sha256 mismatch"),
                "{why}"
            );
            assert!(why.contains("quorumLoss is FromBackup"), "{why}");
        }
        other => panic!("expected a hold, got {other:?}"),
    }
}

#[test]
fn a_voter_with_a_ready_pod_or_a_volume_that_holds_its_data_is_not_lost() {
    let mut ready = all_lost();
    ready.pods.get_mut(&1).unwrap().ready = true;
    assert!(
        matches!(recovery(&ready), Some(Plan::Hold(why)) if why.contains("its pod is Ready")),
        "{:?}",
        recovery(&ready)
    );
    let mut kept = all_lost();
    kept.pvcs.get_mut(&2).unwrap().member_id = Some(102);
    assert!(
        matches!(recovery(&kept), Some(Plan::Hold(why)) if why.contains("may still hold its data")),
        "{:?}",
        recovery(&kept)
    );
}

#[test]
fn voters_down_for_less_than_lost_after_wait() {
    let mut obs = all_lost();
    obs.recovery.down_since.remove(&101);
    assert!(
        matches!(recovery(&obs), Some(Plan::Wait(why)) if why.contains("counts as lost once")),
        "{:?}",
        recovery(&obs)
    );
}

#[test]
fn from_survivors_never_restores_a_backup() {
    let mut obs = all_lost();
    obs.recovery.policy.quorum_loss = QuorumLossPolicy::FromSurvivors;
    assert!(
        matches!(recovery(&obs), Some(Plan::Hold(why)) if why.contains("none survives")),
        "{:?}",
        recovery(&obs)
    );
}

fn in_phase(phase: &str) -> (Observation, RecoveryStatus) {
    let mut obs = all_lost();
    let record = RecoveryStatus {
        id: "backup-nightly".into(),
        phase: phase.into(),
        backup: Some(nightly()),
        member: "c-etcd-0".into(),
        ..Default::default()
    };
    obs.recovery.record = Some(record.clone());
    (obs, record)
}

#[test]
fn a_recovery_from_a_backup_clears_waits_for_the_old_objects_then_reseeds() {
    let act = |s| Some(Plan::Act(Step::Recovery(s)));
    let (obs, _) = in_phase(phase::FENCING);
    assert_eq!(recovery(&obs), act(RecoveryStep::ClearForRestore));
    let (mut obs, _) = in_phase(phase::RESTORING);
    obs.statefulset = None;
    assert!(
        matches!(recovery(&obs), Some(Plan::Wait(why)) if why.contains("3 pod(s) and 3 PVC(s)")),
        "{:?}",
        recovery(&obs)
    );
    obs.pods.clear();
    obs.pvcs.clear();
    assert_eq!(recovery(&obs), act(RecoveryStep::Reseed));
    let (mut with_sts, _) = in_phase(phase::RESTORING);
    assert_eq!(
        recovery(&with_sts),
        act(RecoveryStep::Reseed),
        "written again"
    );
    with_sts.statefulset.as_mut().unwrap().deleting = true;
    assert!(
        matches!(recovery(&with_sts), Some(Plan::Wait(why)) if why.contains("StatefulSet goes")),
        "the old one, still being deleted: {:?}",
        recovery(&with_sts)
    );
}

#[test]
fn a_cluster_regrowing_from_a_backup_waits_for_member_0_then_completes_when_whole() {
    let (obs, _) = in_phase(phase::REGROWING);
    assert!(
        matches!(recovery(&obs), Some(Plan::Wait(why)) if why.contains("restores backup nightly")),
        "{:?}",
        recovery(&obs)
    );
    let mut whole = converged(3, 3);
    whole.recovery.record = obs.recovery.record.clone();
    assert_eq!(
        recovery(&whole),
        Some(Plan::Act(Step::Recovery(RecoveryStep::Complete)))
    );
    let mut one = converged(1, 3);
    one.recovery.record = obs.recovery.record.clone();
    assert_eq!(recovery(&one), None, "the membership rules grow it");
    // A StatefulSet deleted by hand meanwhile: the bootstrap rule makes it
    // again, the recovery does not stand in its way.
    let mut gone = obs.clone();
    gone.statefulset = None;
    assert_eq!(recovery(&gone), None);
}
