//! CA rotation as planner rules (phases in `etcdfleet_api::ca_rotation`):
//! a request starts a rotation once the cluster is converged; each phase
//! moves on only when every member runs on the current template and is
//! healthy (the rules above roll members one at a time, leader last, under
//! the quorum guard, whenever a phase changes what members trust or
//! present); a rotation not yet reissuing can be cancelled at once.

use etcdfleet_api::ca_rotation::{CaRotationStatus, EXPIRY_REQUEST_PREFIX, phase};

use super::members::Members;
use super::observation::{CaRotationObservation, Observation};
use super::step::{Plan, Step};

/// Rule: a lost PKI Secret, with a recovery asked for (and no object of
/// another owner in the way), is rebuilt from the members' current trust
/// (otherwise the refusals say `PkiLost`).
pub(super) fn recover(obs: &Observation) -> Option<Plan> {
    let request_id = obs.ca_rotation.recover_asked.clone()?;
    (obs.tls && obs.pki_lost && obs.conflicts.is_empty())
        .then_some(Plan::Act(Step::RecoverCa { request_id }))
}

/// Rule: a cancelled rotation (annotation removed or `cancel`, or another
/// request) that reissued nothing yet is undone at once, even mid-roll.
pub(super) fn cancel(obs: &Observation) -> Option<Plan> {
    let rotation = &obs.ca_rotation;
    let record = rotation.record.as_ref().filter(|r| r.cancellable())?;
    (obs.tls && cancelled(rotation, record)).then_some(Plan::Act(Step::CancelCaRotation))
}

/// Whether `record` is no longer asked for: `cancel` says so, or the
/// annotation that asked for it is gone or names another request (a
/// rotation started for the CA's expiry is cancelled only by `cancel`).
fn cancelled(rotation: &CaRotationObservation, record: &CaRotationStatus) -> bool {
    rotation.cancel_asked
        || (!record.request_id.starts_with(EXPIRY_REQUEST_PREFIX)
            && rotation.requested.as_deref() != Some(record.request_id.as_str()))
}

/// Rule: start a requested rotation, or move the one in progress to its
/// next phase once the cluster has settled on the current one.
pub(super) fn advance(m: &Members) -> Option<Plan> {
    let rotation = &m.obs.ca_rotation;
    if !m.obs.tls {
        return None;
    }
    // An adopted etcd's old members trust only the old CA, and are not
    // rolled by this cluster: no rotation until they have left.
    if m.obs.adoption.is_some() {
        let asked = rotation.requested.is_some()
            || rotation.record.as_ref().is_some_and(|r| r.in_progress());
        return asked.then(|| {
            Plan::Wait("CA rotation waits for the takeover of the running etcd to complete".into())
        });
    }
    let Some(record) = rotation.record.as_ref().filter(|r| r.in_progress()) else {
        if rotation.requested.is_some() && super::storage::sizes::growth_under_way(m.obs) {
            return Some(Plan::Wait(
                "CA rotation waits for the volume growth under way to finish".into(),
            ));
        }
        return start(rotation);
    };
    if let Some(why) = unsettled(m) {
        return Some(Plan::Wait(format!(
            "CA rotation {:?} ({}) waits: {why}",
            record.request_id, record.phase
        )));
    }
    Some(next_step(record, rotation))
}

/// A new request (never the one recorded last) starts a rotation. A
/// recovery whose PKI Secret was rebuilt but not recorded (the controller
/// stopped in between) is recorded now and goes on from there.
fn start(rotation: &CaRotationObservation) -> Option<Plan> {
    let unrecorded_recovery = rotation.recover_asked.as_ref().filter(|_| rotation.next_ca);
    let requested = rotation.requested.as_ref().or(unrecorded_recovery)?;
    let seen = rotation.record.as_ref().map(|r| &r.request_id) == Some(requested);
    (!seen && !rotation.cancel_asked).then(|| {
        Plan::Act(Step::StartCaRotation {
            request_id: requested.clone(),
        })
    })
}

/// Why the members have not settled: a pod not ready or being replaced, a
/// voter unhealthy. `None` once they all have.
fn unsettled(m: &Members) -> Option<String> {
    if let Some((o, _)) = m.obs.pods.iter().find(|(_, p)| p.deleting || !p.ready) {
        return Some(format!("pod {} is not ready", m.obs.names.pod(*o)));
    }
    m.health
        .voters()
        .find(|v| !v.healthy)
        .map(|v| format!("member {} is unhealthy", m.describe(v.member.id)))
}

/// The step that ends the recorded phase. Each is idempotent, so one taken
/// before a crash (but not yet recorded) is taken again harmlessly. A
/// phase the PKI Secret does not match (restored from an older copy) is
/// held for a person.
fn next_step(record: &CaRotationStatus, rotation: &CaRotationObservation) -> Plan {
    Plan::Act(match record.phase.as_str() {
        phase::PREPARING => Step::GenerateNextCa,
        phase::TRUSTING if rotation.next_ca || rotation.previous_ca => Step::PromoteNextCa,
        phase::REISSUING => Step::DropPreviousCa,
        phase::COMPLETING if !rotation.previous_ca => Step::CompleteCaRotation,
        phase::COMPLETING => Step::DropPreviousCa,
        other => {
            return Plan::Hold(format!(
                "CA rotation {:?} is {other}, but the PKI Secret holds no new CA (was it \
                 restored from an older copy?); cancel the rotation with \
                 etcdfleet.dev/rotate-ca=cancel and ask again",
                record.request_id
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::observation::AdoptionObservation;
    use super::super::plan_next_step;
    use super::super::step::ObjectKind;
    use super::super::tests::converged;
    use super::*;

    fn rotating(phase: &str, next: bool, previous: bool) -> Observation {
        let mut obs = converged(3, 3);
        obs.ca_rotation = CaRotationObservation {
            requested: Some("r1".into()),
            cancel_asked: false,
            recover_asked: None,
            record: Some(CaRotationStatus {
                request_id: "r1".into(),
                phase: phase.into(),
                ..Default::default()
            }),
            next_ca: next,
            previous_ca: previous,
        };
        obs
    }

    fn advance_of(obs: &Observation) -> Option<Plan> {
        advance(&Members::of(obs).unwrap())
    }

    #[test]
    fn a_new_request_starts_once_and_a_seen_one_never_again() {
        let mut obs = converged(3, 3);
        assert_eq!(advance_of(&obs), None, "nothing asked");
        obs.ca_rotation.requested = Some("r1".into());
        assert_eq!(
            advance_of(&obs),
            Some(Plan::Act(Step::StartCaRotation {
                request_id: "r1".into()
            }))
        );
        let done = rotating(phase::COMPLETED, false, false);
        assert_eq!(advance_of(&done), None, "r1 was done already");
        let mut plain = obs.clone();
        plain.tls = false;
        assert_eq!(advance_of(&plain), None, "no TLS, no CA");
    }

    #[test]
    fn each_phase_has_its_step_in_order() {
        let cases = [
            (phase::PREPARING, false, false, Some(Step::GenerateNextCa)),
            (phase::TRUSTING, true, false, Some(Step::PromoteNextCa)),
            (phase::REISSUING, false, true, Some(Step::DropPreviousCa)),
            (
                phase::COMPLETING,
                false,
                false,
                Some(Step::CompleteCaRotation),
            ),
            (phase::COMPLETING, false, true, Some(Step::DropPreviousCa)),
        ];
        for (phase, next, previous, want) in cases {
            let obs = rotating(phase, next, previous);
            assert_eq!(advance_of(&obs), want.map(Plan::Act), "{phase}");
        }
        let lost_next = rotating(phase::TRUSTING, false, false);
        assert!(matches!(advance_of(&lost_next), Some(Plan::Hold(h)) if h.contains("cancel")));
    }

    #[test]
    fn no_rotation_while_an_adopted_etcd_is_taken_over() {
        let mut obs = converged(3, 3);
        obs.ca_rotation.requested = Some("r1".into());
        obs.adoption = Some(AdoptionObservation {
            credentials: Ok(()),
            ca_imported: true,
            endpoints: vec![],
            spec_version: "3.5.1".into(),
            recorded: Default::default(),
            retired: Default::default(),
            probes: vec![],
            deletable: vec![],
        });
        assert!(matches!(advance_of(&obs), Some(Plan::Wait(w)) if w.contains("takeover")));
        obs.ca_rotation.requested = None;
        assert_eq!(advance_of(&obs), None);
    }

    #[test]
    fn the_policy_rolls_each_phase_before_the_next_and_cancels_mid_roll() {
        let mut obs = rotating(phase::TRUSTING, true, false);
        obs.stale_objects = vec![ObjectKind::ServerTlsSecret, ObjectKind::StatefulSet];
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(obs.stale_objects.clone()))
        );
        obs.stale_objects.clear();
        obs.pods.get_mut(&1).unwrap().image = "etcd:v3.4.0".into();
        assert!(matches!(
            plan_next_step(&obs),
            Plan::Act(Step::RestartMember { ordinal: 1, .. })
        ));
        obs.ca_rotation.requested = None;
        assert_eq!(plan_next_step(&obs), Plan::Act(Step::CancelCaRotation));
    }

    #[test]
    fn a_phase_waits_for_every_member_to_settle() {
        let mut obs = rotating(phase::TRUSTING, true, false);
        obs.pods.get_mut(&1).unwrap().ready = false;
        assert!(matches!(advance_of(&obs), Some(Plan::Wait(w)) if w.contains("c-etcd-1")));
    }

    #[test]
    fn cancelling_is_possible_until_reissuing_only() {
        let mut obs = rotating(phase::TRUSTING, true, false);
        assert_eq!(cancel(&obs), None, "still asked for");
        obs.ca_rotation.requested = None;
        assert_eq!(cancel(&obs), Some(Plan::Act(Step::CancelCaRotation)));
        obs.ca_rotation.cancel_asked = true;
        assert_eq!(cancel(&obs), Some(Plan::Act(Step::CancelCaRotation)));
        let mut late = rotating(phase::REISSUING, false, true);
        late.ca_rotation.cancel_asked = true;
        assert_eq!(cancel(&late), None, "certificates were reissued");
        assert_eq!(advance_of(&late), Some(Plan::Act(Step::DropPreviousCa)));
    }

    #[test]
    fn a_lost_ca_is_recovered_only_when_asked_and_never_cancelled() {
        let mut obs = converged(3, 3);
        obs.pki_lost = true;
        assert_eq!(recover(&obs), None, "not asked: the refusal stands");
        obs.ca_rotation.recover_asked = Some("recover-r1".into());
        assert_eq!(
            recover(&obs),
            Some(Plan::Act(Step::RecoverCa {
                request_id: "recover-r1".into()
            }))
        );
        obs.pki_lost = false;
        assert_eq!(recover(&obs), None, "nothing lost");
        obs.ca_rotation.next_ca = true;
        assert_eq!(
            advance_of(&obs),
            Some(Plan::Act(Step::StartCaRotation {
                request_id: "recover-r1".into()
            })),
            "rebuilt, not recorded: recorded now"
        );
        let mut recovering = rotating(phase::TRUSTING, true, false);
        let record = recovering.ca_rotation.record.as_mut().unwrap();
        record.request_id = "recover-r1".into();
        recovering.ca_rotation.cancel_asked = true;
        assert_eq!(cancel(&recovering), None);
    }

    #[test]
    fn an_expiry_rotation_is_cancelled_only_by_cancel() {
        let mut obs = rotating(phase::PREPARING, false, false);
        let record = obs.ca_rotation.record.as_mut().unwrap();
        record.request_id = "expiry-abc".into();
        obs.ca_rotation.requested = None;
        assert_eq!(cancel(&obs), None);
        obs.ca_rotation.cancel_asked = true;
        assert_eq!(cancel(&obs), Some(Plan::Act(Step::CancelCaRotation)));
    }
}
