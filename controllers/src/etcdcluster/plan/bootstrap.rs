//! The rules before etcd answers: the workload objects exist and match
//! their inputs (the render contract), the StatefulSet is created by
//! bootstrap, and while no member answers only ever add, never remove.

use super::observation::{EtcdObservation, Observation, StatefulSetObservation};
use super::quorum::{QUORUM_LOSS_HELP, QuorumView, quorum_view};
use super::step::{ObjectKind, Plan, Step};

/// Rule: workload objects missing or out of date are written first. The
/// StatefulSet itself is created by bootstrap, and without a StatefulSet
/// bootstrap writes the members ConfigMap too.
pub(super) fn stale_objects(obs: &Observation) -> Option<Plan> {
    let others: Vec<_> = obs
        .stale_objects
        .iter()
        .copied()
        .filter(|k| !(*k == ObjectKind::StatefulSet && obs.statefulset.is_none()))
        .filter(|k| *k != ObjectKind::MembersConfigMap || obs.statefulset.is_some())
        .collect();
    (!others.is_empty()).then_some(Plan::Act(Step::WriteObjects(others)))
}

/// Rule: no StatefulSet, so bootstrap creates it. A StatefulSet lost while
/// PVCs remain is recreated wide enough to start every member that has
/// data, never narrower.
pub(super) fn bootstrap(obs: &Observation) -> Option<Plan> {
    if obs.statefulset.is_some() {
        return None;
    }
    let replicas = obs.pvcs.keys().max().map_or(1, |o| o + 1);
    Some(Plan::Act(Step::Bootstrap { replicas }))
}

/// Rule: bootstrap mode, nobody answers: only ever add (see
/// [`plan_without_answers`]).
pub(super) fn no_member_answers(obs: &Observation) -> Option<Plan> {
    let EtcdObservation::Unreachable(why) = &obs.etcd else {
        return None;
    };
    let sts = obs.statefulset.as_ref()?;
    Some(plan_without_answers(obs, sts, why))
}

/// No member answers the controller: the StatefulSet is grown to cover
/// every volume with data (no etcd needed), else nothing is done; what is
/// said depends on whether the members' pods are healthy.
fn plan_without_answers(obs: &Observation, sts: &StatefulSetObservation, why: &str) -> Plan {
    let wanted = obs.pvcs.keys().max().map_or(1, |o| o + 1);
    if sts.replicas < wanted {
        return Plan::Act(Step::ScaleStatefulSet { replicas: wanted });
    }
    match quorum_view(obs) {
        QuorumView::Unreachable(cut) => Plan::Hold(cut.describe(Some(why))),
        QuorumView::Lost { .. } | QuorumView::Healthy { .. } => Plan::Hold(format!(
            "quorum lost: none of the {} known voting members answers ({why}) and their pods do \
             not pass etcd's health check either; {QUORUM_LOSS_HELP}",
            obs.known_voters
        )),
        QuorumView::NotStarted => Plan::Wait(format!(
            "no etcd member answers yet ({why}); waiting for {} to start",
            describe_pods(obs)
        )),
    }
}

fn describe_pods(obs: &Observation) -> String {
    if obs.pods.is_empty() {
        return "the first member pod".to_string();
    }
    obs.pods
        .iter()
        .map(|(o, p)| {
            format!(
                "{} ({})",
                obs.names.pod(*o),
                if p.ready {
                    "ready".to_string()
                } else if p.running {
                    format!("running, not ready, {} restarts", p.restart_count)
                } else {
                    "not running".to_string()
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::tests::converged;
    use super::*;

    #[test]
    fn without_a_statefulset_objects_come_first_then_bootstrap_writes_the_rest() {
        let mut obs = converged(0, 3);
        obs.statefulset = None;
        obs.stale_objects = vec![ObjectKind::MembersConfigMap, ObjectKind::StatefulSet];
        assert_eq!(stale_objects(&obs), None, "bootstrap writes these two");
        assert_eq!(
            bootstrap(&obs),
            Some(Plan::Act(Step::Bootstrap { replicas: 1 }))
        );
        obs.stale_objects.push(ObjectKind::ClientService);
        assert_eq!(
            stale_objects(&obs),
            Some(Plan::Act(Step::WriteObjects(vec![
                ObjectKind::ClientService
            ])))
        );
    }

    #[test]
    fn a_running_cluster_is_not_bootstrapped_and_its_answers_go_to_the_later_rules() {
        let obs = converged(3, 3);
        assert_eq!(bootstrap(&obs), None);
        assert_eq!(no_member_answers(&obs), None);
        let mut silent = obs.clone();
        silent.etcd = EtcdObservation::Unreachable("refused".into());
        assert!(matches!(no_member_answers(&silent), Some(Plan::Hold(_))));
    }
}
