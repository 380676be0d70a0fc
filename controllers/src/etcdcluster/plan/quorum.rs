//! What can be said about quorum from the controller's two vantage points,
//! and the rule that takes no step without one.

use super::members::Members;
use super::observation::{EtcdObservation, Observation, PodObservation};
use super::step::Plan;

/// What a person can do when quorum is lost (no automatic action is safe:
/// only a person knows whether the missing members' disks are coming back).
pub const QUORUM_LOSS_HELP: &str = "if the missing members' pods and volumes can come back, \
     bring them back and the cluster recovers by itself; otherwise restore from a backup \
     snapshot (an EtcdBackup, or `etcdutl snapshot restore` into a new EtcdCluster, \
     following etcd's disaster-recovery guide); the controller removes or restarts nothing \
     while quorum is lost";

/// What can be said about quorum from the controller's two vantage points:
/// the members that answer it, and the pods whose readiness is etcd's own
/// health check in the pod (the kubelet's view from inside the workload
/// cluster). `QuorumLost` is said only when both agree that members are down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuorumView {
    /// A quorum of the voting members answers the controller, healthy.
    Healthy { healthy: u32, voters: u32 },
    /// Fewer than a quorum answer the controller, but counting the members
    /// whose pods pass etcd's own health check there is one: the controller
    /// is cut off from etcd (a network path, the port-forward through the
    /// workload API server), which is not etcd losing its quorum.
    Unreachable(CutOff),
    /// Fewer than a quorum are healthy by what the members themselves say
    /// (their answers, and the health checks in their pods).
    Lost { healthy: u32, voters: u32 },
    /// No voting member is known yet: nothing to say about quorum.
    NotStarted,
}

/// The controller cannot reach enough members to see a quorum, and their
/// pods say they are healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutOff {
    /// Voting members that answered the controller, healthy.
    pub answering: u32,
    /// Voting members that did not answer the controller but whose pods are
    /// Ready by etcd's own health check.
    pub ready_in_pods: u32,
    pub voters: u32,
}

impl CutOff {
    /// What a person reads: what each vantage point says and where to look.
    /// No restore advice: nothing says etcd lost anything.
    pub fn describe(&self, why: Option<&str>) -> String {
        let (answering, ready, voters) = (self.answering, self.ready_in_pods, self.voters);
        let who = if answering == 0 {
            format!("no voting member answers the controller{}", in_parens(why))
        } else {
            format!("only {answering} of {voters} voting members answer the controller")
        };
        format!(
            "{who}, but {} of {voters} pass etcd's own health check in their pods: the \
             controller is cut off from the members, which says nothing about etcd's quorum \
             (that cannot be told from here). Check the network between the controller and the \
             workload cluster (the port-forward through its API server, or the pod network); \
             nothing that needs etcd is done until the members answer again",
            answering + ready
        )
    }
}

fn in_parens(why: Option<&str>) -> String {
    why.map(|w| format!(" ({w})")).unwrap_or_default()
}

/// A pod whose Ready condition is etcd's own health check, passing.
fn ready_by_etcd_health(pod: &PodObservation) -> bool {
    pod.ready && pod.running && !pod.deleting && pod.ready_means_etcd_healthy
}

/// Quorum as the controller can tell it (see [`QuorumView`]). Pure.
pub fn quorum_view(obs: &Observation) -> QuorumView {
    let (answering, silent_ready, voters) = match &obs.etcd {
        EtcdObservation::Unreachable(_) => {
            let ready = obs
                .pods
                .values()
                .filter(|p| ready_by_etcd_health(p))
                .count() as u32;
            (0, ready.min(obs.known_voters), obs.known_voters)
        }
        EtcdObservation::Observed(health) => {
            let ready = health
                .voters()
                .filter(|m| !m.healthy && m.status.is_none())
                .filter_map(|m| m.member.peer_urls.first())
                .filter_map(|u| obs.names.ordinal_of_peer_url(u))
                .filter(|o| obs.pods.get(o).is_some_and(ready_by_etcd_health))
                .count() as u32;
            let healthy = health.healthy_voter_count() as u32;
            (healthy, ready, health.voter_count() as u32)
        }
    };
    let quorum = crate::etcd::quorum(voters as usize) as u32;
    if voters == 0 {
        QuorumView::NotStarted
    } else if answering >= quorum {
        QuorumView::Healthy {
            healthy: answering,
            voters,
        }
    } else if answering + silent_ready >= quorum {
        QuorumView::Unreachable(CutOff {
            answering,
            ready_in_pods: silent_ready,
            voters,
        })
    } else {
        QuorumView::Lost {
            healthy: answering,
            voters,
        }
    }
}

/// Without quorum etcd can change nothing, and only a person can tell
/// whether the missing members come back: no step at all. Said as quorum
/// loss only when the members' own health says so.
fn quorum_hold(obs: &Observation) -> Option<Plan> {
    match quorum_view(obs) {
        QuorumView::Unreachable(cut) => Some(Plan::Hold(cut.describe(None))),
        QuorumView::Lost { healthy, voters } => Some(Plan::Hold(format!(
            "quorum lost: only {healthy} of {voters} voting members are healthy; {QUORUM_LOSS_HELP}"
        ))),
        QuorumView::Healthy { .. } | QuorumView::NotStarted => None,
    }
}

/// Rule: without quorum in sight nothing is done (see [`quorum_hold`]).
pub(super) fn quorum(m: &Members) -> Option<Plan> {
    quorum_hold(m.obs)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{converged, member, with_members};
    use super::*;

    #[test]
    fn the_quorum_rule_answers_only_without_a_quorum() {
        let obs = converged(3, 3);
        assert_eq!(quorum(&Members::of(&obs).unwrap()), None);
        let obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, false, false, false),
                member(2, false, false, false),
            ],
        );
        assert!(
            matches!(quorum(&Members::of(&obs).unwrap()), Some(Plan::Hold(why)) if why.contains("quorum lost"))
        );
    }
}
