use std::collections::BTreeMap;

use etcdfleet_api::recovery::{LostMemberRecord, QuorumLossPolicy, ResolvedRecovery};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::super::observation::{PvcObservation, StatefulSetObservation};
use super::super::plan_next_step;
use super::super::tests::{converged, member, names, with_members};
use super::*;

/// A voter that answers `Status` but, without a quorum, no read.
fn survivor(ordinal: u32, applied: u64, revision: i64) -> MemberObservation {
    let mut m = member(ordinal, true, false, false);
    m.healthy = false;
    m.error = Some("no quorum".into());
    let status = m.status.as_mut().unwrap();
    status.raft_applied_index = applied;
    status.revision = revision;
    m
}

fn lost(ordinal: u32) -> MemberObservation {
    member(ordinal, false, false, false)
}

fn ago(minutes: i64) -> Timestamp {
    Timestamp::now() - SignedDuration::from_mins(minutes)
}

/// Three voters, 1 and 2 gone with their pods and PVCs for an hour, 0
/// answering alone; `FromSurvivors`.
fn two_of_three_lost() -> Observation {
    let mut obs = with_members(converged(3, 3), vec![survivor(0, 50, 40), lost(1), lost(2)]);
    for o in [1, 2] {
        obs.pods.remove(&o);
        obs.pvcs.remove(&o);
    }
    obs.recovery.policy = ResolvedRecovery {
        quorum_loss: QuorumLossPolicy::FromSurvivors,
        ..Default::default()
    };
    obs.recovery.down_since = BTreeMap::from([(101, ago(60)), (102, ago(60))]);
    obs.recovery.nodes = Some(Ok(BTreeMap::from([("n0".into(), true)])));
    obs.recovery.last_seen_revision = Some(45);
    obs
}

fn begun(plan: Option<Plan>) -> RecoveryPlan {
    match plan {
        Some(Plan::Act(Step::Recovery(RecoveryStep::Begin(p)))) => *p,
        other => panic!("expected a recovery to begin, got {other:?}"),
    }
}

fn held(plan: Option<Plan>) -> String {
    match plan {
        Some(Plan::Hold(why)) => why,
        other => panic!("expected a hold, got {other:?}"),
    }
}

#[test]
fn manual_takes_no_step_and_the_quorum_rule_holds_as_before() {
    let mut obs = two_of_three_lost();
    obs.recovery.policy = ResolvedRecovery::default();
    assert_eq!(recovery(&obs), None);
    assert!(
        matches!(plan_next_step(&obs), Plan::Hold(why) if why.contains("quorum lost")),
        "{:?}",
        plan_next_step(&obs)
    );
}

#[test]
fn members_gone_with_their_volumes_are_lost_and_the_survivor_recorded() {
    let plan = begun(recovery(&two_of_three_lost()));
    assert_eq!(
        (plan.chosen, plan.chosen_id, plan.kept_revision),
        (0, 100, 40)
    );
    assert_eq!(plan.last_seen_revision, Some(45));
    assert_eq!(plan.survivors.len(), 1);
    assert_eq!(plan.survivors[0].name, names().pod(0));
    let lost: Vec<&str> = plan.lost.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lost, [names().pod(1), names().pod(2)]);
    let facts = plan.lost[0].evidence.join("; ");
    assert!(
        facts.contains("pod is gone") && facts.contains("PVC") && facts.contains("is gone"),
        "{facts}"
    );
}

#[test]
fn a_member_whose_pod_is_ready_is_never_lost() {
    let mut obs = two_of_three_lost();
    let mut ready = super::super::tests::pod(super::super::tests::IMG);
    ready.ready_means_etcd_healthy = false;
    obs.pods.insert(1, ready);
    let why = held(recovery(&obs));
    assert!(
        why.contains("pod is Ready") && why.contains("not lost"),
        "{why}"
    );
}

#[test]
fn a_member_down_for_less_than_lost_after_is_waited_for() {
    let mut obs = two_of_three_lost();
    obs.recovery.down_since.remove(&102);
    match recovery(&obs) {
        Some(Plan::Wait(why)) => assert!(why.contains("lostAfterSeconds"), "{why}"),
        other => panic!("expected a wait, got {other:?}"),
    }
}

#[test]
fn a_kept_volume_keeps_the_member_unless_it_is_local_to_a_node_that_is_gone() {
    let mut obs = two_of_three_lost();
    let pvc = PvcObservation {
        member_id: Some(102),
        ..Default::default()
    };
    obs.pvcs.insert(2, pvc.clone());
    obs.recovery.pinned = Some(Ok(BTreeMap::from([(2, Some("n2".into()))])));
    obs.recovery.nodes = Some(Ok(BTreeMap::from([("n2".into(), false)])));
    let why = held(recovery(&obs));
    assert!(
        why.contains("may still hold its data")
            && why.contains("local to node n2, which is still there"),
        "{why}"
    );
    // Nodes or volumes that could not be read are no evidence either.
    obs.recovery.nodes = Some(Err("forbidden".into()));
    assert!(held(recovery(&obs)).contains("forbidden"));
    obs.recovery.nodes = Some(Ok(BTreeMap::new()));
    obs.recovery.pinned = Some(Err("reading PersistentVolume pv-2: forbidden".into()));
    assert!(held(recovery(&obs)).contains("pv-2: forbidden"));
    // A network volume outlives its node: a node gone is no evidence.
    obs.recovery.pinned = Some(Ok(BTreeMap::from([(2, None)])));
    assert!(held(recovery(&obs)).contains("network storage outlives a node"));
    // A local volume's node gone from the workload cluster is.
    obs.recovery.pinned = Some(Ok(BTreeMap::from([(2, Some("n2".into()))])));
    let plan = begun(recovery(&obs));
    assert!(
        plan.lost[1]
            .evidence
            .join("; ")
            .contains("local to node n2, which is gone"),
        "{:?}",
        plan.lost[1]
    );
    // A claim no member was recorded on holds none of its data.
    obs.pvcs.insert(2, PvcObservation::default());
    obs.recovery.nodes = Some(Ok(BTreeMap::from([("n2".into(), true)])));
    assert!(
        begun(recovery(&obs)).lost[1]
            .evidence
            .join("; ")
            .contains("new claim")
    );
}

#[test]
fn the_survivor_with_the_most_data_is_chosen() {
    let mut obs = with_members(
        converged(5, 5),
        vec![
            survivor(0, 50, 40),
            survivor(1, 70, 55),
            lost(2),
            lost(3),
            lost(4),
        ],
    );
    for o in [2, 3, 4] {
        obs.pods.remove(&o);
        obs.pvcs.remove(&o);
    }
    obs.recovery = two_of_three_lost().recovery;
    obs.recovery.down_since = (102..=104).map(|id| (id, ago(60))).collect();
    let plan = begun(recovery(&obs));
    assert_eq!((plan.chosen, plan.kept_revision), (1, 55));
    assert_eq!(plan.survivors.len(), 2);
}

fn in_phase(phase: &str) -> Observation {
    let mut obs = two_of_three_lost();
    obs.recovery.record = Some(RecoveryStatus {
        id: "64-50".into(),
        phase: phase.into(),
        member: names().pod(0),
        member_id: "64".into(),
        lost: vec![
            LostMemberRecord {
                name: names().pod(1),
                id: "65".into(),
                evidence: vec![],
            },
            LostMemberRecord {
                name: names().pod(2),
                id: "66".into(),
                evidence: vec![],
            },
        ],
        ..Default::default()
    });
    obs
}

fn forcing_sts<'a>(obs: &'a mut Observation, id: Option<&str>) -> &'a mut StatefulSetObservation {
    let sts = obs.statefulset.as_mut().unwrap();
    sts.replicas = 1;
    sts.forcing = id.map(str::to_string);
    sts
}

#[test]
fn a_recovery_fences_then_forces_once_then_regrows() {
    assert_eq!(
        recovery(&in_phase(phase::FENCING)),
        Some(Plan::Act(Step::Recovery(RecoveryStep::Fence {
            chosen: 0,
            lost: vec![(1, 101), (2, 102)],
        })))
    );
    let mut obs = in_phase(phase::FORCING);
    let act = |s| Some(Plan::Act(Step::Recovery(s)));
    assert_eq!(
        recovery(&obs),
        act(RecoveryStep::WriteForcingTemplate { chosen: 0 })
    );
    forcing_sts(&mut obs, Some("64-50")).template_seen = false;
    assert!(matches!(recovery(&obs), Some(Plan::Wait(_))));
    forcing_sts(&mut obs, Some("64-50")).template_seen = true;
    assert_eq!(
        recovery(&obs),
        act(RecoveryStep::RestartChosen { ordinal: 0 })
    );
    obs.pods.get_mut(&0).unwrap().forcing = Some("64-50".into());
    assert!(matches!(recovery(&obs), Some(Plan::Wait(why)) if why.contains("--force-new-cluster")));
    obs = with_members(obs, vec![member(0, true, true, false)]);
    assert_eq!(recovery(&obs), act(RecoveryStep::EndForce));
}

#[test]
fn regrowing_leaves_the_members_to_the_membership_rules_and_completes_at_size() {
    let mut obs = in_phase(phase::REGROWING);
    obs = with_members(obs, vec![member(0, true, true, false)]);
    forcing_sts(&mut obs, Some("64-50"));
    assert_eq!(
        recovery(&obs),
        Some(Plan::Act(Step::Recovery(RecoveryStep::EndForce)))
    );
    forcing_sts(&mut obs, None);
    assert_eq!(recovery(&obs), None);
    assert!(
        matches!(
            plan_next_step(&obs),
            Plan::Act(Step::AddLearner { ordinal: 1 })
        ),
        "{:?}",
        plan_next_step(&obs)
    );
    let mut whole = with_members(in_phase(phase::REGROWING), converged_members());
    forcing_sts(&mut whole, None).replicas = 3;
    assert_eq!(
        recovery(&whole),
        Some(Plan::Act(Step::Recovery(RecoveryStep::Complete)))
    );
    whole.recovery.record.as_mut().unwrap().phase = phase::COMPLETED.into();
    assert_eq!(recovery(&whole), None);
}

fn converged_members() -> Vec<MemberObservation> {
    (0..3).map(|o| member(o, true, o == 0, false)).collect()
}
