use std::collections::BTreeSet;

use super::super::observation::TrustProbe;
use super::super::plan_next_step;
use super::super::tests::{converged, member, with_members};
use super::*;
use crate::etcd::MemberObservation;

/// An existing (old) member `i`, id `900 + i`, at its owner's names.
fn old(i: u64, healthy: bool, leader: bool) -> MemberObservation {
    let mut m = member(0, healthy, leader, false);
    let id = 900 + i;
    m.member.id = id;
    m.member.name = format!("legacy-etcd-{i}");
    m.member.peer_urls = vec![format!(
        "https://legacy-etcd-{i}.legacy-etcd.etcd-system.svc:2380"
    )];
    m.member.client_urls = vec![format!(
        "https://legacy-etcd-{i}.legacy-etcd.etcd-system.svc:2379"
    )];
    if let Some(s) = m.status.as_mut() {
        s.member_id = id;
        s.leader = if leader { id } else { 0 };
    }
    m
}

fn probes(result: Result<bool, ProbeError>) -> Vec<TrustProbe> {
    (0..3)
        .flat_map(|i| {
            let host = format!("https://legacy-etcd-{i}.legacy-etcd.etcd-system.svc");
            [
                TrustProbe {
                    url: format!("{host}:2379"),
                    port: ProbedPort::Client,
                    result: Ok(true),
                },
                TrustProbe {
                    url: format!("{host}:2380"),
                    port: ProbedPort::Peer,
                    result: result.clone(),
                },
            ]
        })
        .collect()
}

/// A cluster of 3 wanting to adopt the 3 old members, before anything changed.
fn before_start() -> Observation {
    let mut obs = with_members(
        converged(0, 3),
        vec![old(0, true, true), old(1, true, false), old(2, true, false)],
    );
    obs.statefulset = None;
    obs.pods.clear();
    obs.pvcs.clear();
    obs.known_voters = 0;
    obs.requested_version = Some("3.5.1".into());
    obs.adoption = Some(AdoptionObservation {
        credentials: Ok(()),
        ca_imported: true,
        endpoints: (0..3)
            .map(|i| format!("https://legacy-etcd-{i}.legacy-etcd.etcd-system.svc:2379"))
            .collect(),
        spec_version: "3.5.1".into(),
        recorded: BTreeSet::from([900, 901, 902]),
        retired: BTreeSet::new(),
        probes: probes(Ok(true)),
        deletable: vec![],
    });
    obs
}

fn adoption(obs: &mut Observation) -> &mut AdoptionObservation {
    obs.adoption.as_mut().unwrap()
}

fn refusal_reason(obs: &Observation) -> &'static str {
    match plan_next_step(obs) {
        Plan::Refuse(r) => r.reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn each_failed_check_refuses_before_any_write_and_names_what_to_fix() {
    let ok = before_start();
    assert_eq!(adoption_state(&ok), Some(AdoptionState::Ready));

    let mut obs = ok.clone();
    obs.tls = false;
    assert_eq!(refusal_reason(&obs), reason::TLS_MISMATCH);

    let mut obs = ok.clone();
    adoption(&mut obs).credentials = Err("Secret team-a/legacy-ca has no ca.key".into());
    assert_eq!(refusal_reason(&obs), reason::CREDENTIALS_INVALID);

    let mut obs = ok.clone();
    adoption(&mut obs).probes[0].result = Err(ProbeError::Untrusted("UnknownIssuer".into()));
    assert_eq!(refusal_reason(&obs), reason::SERVER_TRUST_MISSING);

    let mut obs = ok.clone();
    obs.etcd = EtcdObservation::Unreachable("connection refused".into());
    assert_eq!(refusal_reason(&obs), reason::UNREACHABLE);

    let obs = with_members(
        ok.clone(),
        vec![
            old(0, true, true),
            old(1, true, false),
            old(2, false, false),
        ],
    );
    let Plan::Refuse(r) = plan_next_step(&obs) else {
        panic!("refused")
    };
    assert_eq!(r.reason, reason::MEMBER_UNHEALTHY);
    assert!(r.message.contains("legacy-etcd-2"), "{}", r.message);

    let mut learner = old(2, true, false);
    learner.member.is_learner = true;
    let obs = with_members(
        ok.clone(),
        vec![old(0, true, true), old(1, true, false), learner],
    );
    assert_eq!(refusal_reason(&obs), reason::LEARNER_SLOT_TAKEN);

    // The spec's version, even while the other rules hold the running one.
    let mut obs = ok.clone();
    adoption(&mut obs).spec_version = "3.4.23".into();
    assert_eq!(refusal_reason(&obs), reason::VERSION_SKEW);

    for peer in [
        Err(ProbeError::Rejected("alert BadCertificate".into())),
        Err(ProbeError::Untrusted("UnknownIssuer".into())),
        Ok(false),
    ] {
        let mut obs = ok.clone();
        adoption(&mut obs).probes = probes(peer);
        assert_eq!(refusal_reason(&obs), reason::PEER_TRUST_MISSING);
    }

    // A peer port that did not answer is no verdict on trust.
    let mut obs = ok.clone();
    adoption(&mut obs).probes = probes(Err(ProbeError::Unreachable("timed out".into())));
    assert_eq!(refusal_reason(&obs), reason::UNREACHABLE);

    let mut clash = old(1, true, false);
    clash.member.name = "c-etcd-1".into();
    let obs = with_members(ok, vec![old(0, true, true), clash, old(2, true, false)]);
    assert_eq!(refusal_reason(&obs), reason::NAMES_CLASH);
}

#[test]
fn the_ca_is_imported_then_the_membership_recorded_then_the_first_member_joins() {
    let mut obs = before_start();
    adoption(&mut obs).ca_imported = false;
    assert_eq!(plan_next_step(&obs), Plan::Act(Step::ImportCa));
    adoption(&mut obs).ca_imported = true;
    // Not yet recorded as it is now: wait for the status write.
    adoption(&mut obs).recorded = BTreeSet::from([900, 901]);
    assert!(matches!(plan_next_step(&obs), Plan::Wait(w) if w.contains("recording")));
    adoption(&mut obs).recorded = BTreeSet::from([900, 901, 902]);
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::AddLearner { ordinal: 0 })
    );
    // The learner is in etcd: the StatefulSet starts it (never a new
    // cluster), once the members ConfigMap is there.
    let mut learner = member(0, false, false, true);
    learner.member.name.clear();
    let mut obs = with_members(
        obs,
        vec![
            old(0, true, true),
            old(1, true, false),
            old(2, true, false),
            learner,
        ],
    );
    obs.stale_objects = vec![ObjectKind::MembersConfigMap, ObjectKind::StatefulSet];
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::WriteObjects(vec![ObjectKind::MembersConfigMap]))
    );
    obs.stale_objects = vec![ObjectKind::StatefulSet];
    assert_eq!(
        plan_next_step(&obs),
        Plan::Act(Step::Bootstrap { replicas: 1 })
    );
    assert_eq!(adoption_state(&obs), Some(AdoptionState::Joining));
}

/// The takeover after the first change: `ours` members of this cluster
/// (voters unless `learner`), the old ones given.
fn started(ours: u32, olds: Vec<MemberObservation>) -> Observation {
    let mut obs = before_start();
    let mut members: Vec<MemberObservation> =
        (0..ours).map(|o| member(o, true, false, false)).collect();
    members.extend(olds);
    let mut obs = with_members(
        {
            let mut o = converged(ours, 3);
            o.adoption = obs.adoption.take();
            o.requested_version = Some("3.5.1".into());
            o
        },
        members,
    );
    obs.known_voters = ours + 3;
    obs
}

#[test]
fn members_join_one_at_a_time_then_leadership_moves_then_old_members_leave() {
    let olds = || vec![old(0, true, true), old(1, true, false), old(2, true, false)];
    assert_eq!(
        plan_next_step(&started(1, olds())),
        Plan::Act(Step::AddLearner { ordinal: 1 })
    );
    assert_eq!(
        plan_next_step(&started(2, olds())),
        Plan::Act(Step::AddLearner { ordinal: 2 })
    );
    let all = started(3, olds());
    assert_eq!(adoption_state(&all), Some(AdoptionState::Retiring));
    assert!(matches!(
        plan_next_step(&all),
        Plan::Act(Step::MoveLeader { from: 900, to }) if (100..103).contains(&to)
    ));
    // Leadership is ours: an unhealthy old member leaves first.
    let mut led = started(
        3,
        vec![
            old(0, true, false),
            old(1, true, false),
            old(2, false, false),
        ],
    );
    if let EtcdObservation::Observed(h) = &mut led.etcd {
        let mut members = h.members().to_vec();
        members[0] = member(0, true, true, false);
        *h = ClusterHealth::new(members);
    }
    assert_eq!(
        plan_next_step(&led),
        Plan::Act(Step::RetireMember { member_id: 902 })
    );
    // Retired members are gone: nothing halts, the cluster is taken over.
    let mut done = started(3, vec![]);
    if let EtcdObservation::Observed(h) = &mut done.etcd {
        let mut members = h.members().to_vec();
        members[0] = member(0, true, true, false);
        *h = ClusterHealth::new(members);
    }
    adoption(&mut done).retired = BTreeSet::from([900, 901, 902]);
    assert_eq!(adoption_state(&done), Some(AdoptionState::Completed));
    assert_eq!(plan_next_step(&done), Plan::Converged);
}

#[test]
fn a_membership_change_underneath_halts_the_takeover() {
    // A member nobody recorded joined the existing cluster.
    let obs = started(
        1,
        vec![
            old(0, true, true),
            old(1, true, false),
            old(2, true, false),
            old(7, true, false),
        ],
    );
    assert!(matches!(plan_next_step(&obs), Plan::Hold(w) if w.contains("legacy-etcd-7")));
    // An old member left without etcdfleet removing it.
    let mut obs = started(2, vec![old(0, true, true), old(1, true, false)]);
    assert!(matches!(plan_next_step(&obs), Plan::Hold(w) if w.contains("386")));
    // ... unless etcdfleet recorded its removal first.
    adoption(&mut obs).retired = BTreeSet::from([902]);
    assert!(!matches!(plan_next_step(&obs), Plan::Hold(_)));
}
