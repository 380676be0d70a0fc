//! The end of a recovery: growing back is the membership rules'.

use super::super::observation::{EtcdObservation, Observation};
use super::super::step::{Plan, RecoveryStep, Step};

/// Growing back is the membership rules' (scale up through learners);
/// this rule takes the force out of the template and says when it is done.
pub(super) fn regrowing(obs: &Observation) -> Option<Plan> {
    if obs.statefulset.as_ref()?.forcing.is_some() {
        return Some(Plan::Act(Step::Recovery(RecoveryStep::EndForce)));
    }
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return None;
    };
    let whole = health.voter_count() as u32 >= obs.desired_replicas
        && health.learners().next().is_none()
        && health.voters().all(|v| v.healthy);
    whole.then_some(Plan::Act(Step::Recovery(RecoveryStep::Complete)))
}
