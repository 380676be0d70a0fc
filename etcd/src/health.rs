//! The cluster-health view: a pure function of what was observed (member list
//! plus per-member status and health) that answers "is this membership change
//! or restart safe right now?" with a reason a person can act on. No I/O, so
//! every rule is unit-tested here.
//!
//! The rules (etcd op-guide, runtime-configuration and recovery):
//! - quorum of N voters is N/2+1; learners never count;
//! - a membership change is committed under the *current* configuration, so
//!   it needs a quorum of the current voters healthy now;
//! - removing voter X from N voters must leave healthy voters (other than X)
//!   of at least quorum(N-1);
//! - restarting X needs healthy voters other than X of at least quorum(N);
//! - one learner at a time; promote only a learner that has caught up, and
//!   only if the promoted cluster still has a healthy quorum;
//! - never remove the leader: move leadership away first (in a 2-member
//!   cluster removing the leader can leave the survivor without a quorum).

use std::fmt;

use super::member::{Member, MemberStatus};

/// Quorum (majority) of `voters` voting members.
pub const fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

/// What was observed about one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberObservation {
    pub member: Member,
    /// `None` when the member did not answer `Status`.
    pub status: Option<MemberStatus>,
    /// Voters: answered a linearizable read in time. Learners (which refuse
    /// linearizable reads): answered `Status` and know a leader.
    pub healthy: bool,
    /// Why it is unhealthy (or what partly failed), for conditions.
    pub error: Option<String>,
}

impl MemberObservation {
    pub fn unreachable(member: Member, error: &str) -> Self {
        MemberObservation {
            member,
            status: None,
            healthy: false,
            error: Some(error.to_string()),
        }
    }
}

/// Why a change is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnsafeReason {
    UnknownMember {
        member_id: u64,
    },
    LastMember {
        member_id: u64,
    },
    RemovingLeader {
        member_id: u64,
    },
    /// The change itself cannot be committed: too few healthy voters now.
    NoQuorum {
        healthy_voters: usize,
        voters: usize,
    },
    /// After the change, too few healthy voters would remain.
    WouldLoseQuorum {
        member_id: u64,
        remaining_healthy: usize,
        required: usize,
        new_voters: usize,
    },
    /// A single-member cluster has no one to keep serving during a restart.
    SingleMemberDowntime {
        member_id: u64,
    },
    LearnerPresent {
        learner_id: u64,
    },
    NotALearner {
        member_id: u64,
    },
    LearnerNotObserved {
        member_id: u64,
    },
    LearnerBehind {
        member_id: u64,
        learner_index: u64,
        leader_index: u64,
    },
    NoLeader,
}

impl UnsafeReason {
    /// A short, stable label for metrics and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            UnsafeReason::UnknownMember { .. } => "UnknownMember",
            UnsafeReason::LastMember { .. } => "LastMember",
            UnsafeReason::RemovingLeader { .. } => "RemovingLeader",
            UnsafeReason::NoQuorum { .. } => "NoQuorum",
            UnsafeReason::WouldLoseQuorum { .. } => "WouldLoseQuorum",
            UnsafeReason::SingleMemberDowntime { .. } => "SingleMemberDowntime",
            UnsafeReason::LearnerPresent { .. } => "LearnerPresent",
            UnsafeReason::NotALearner { .. } => "NotALearner",
            UnsafeReason::LearnerNotObserved { .. } => "LearnerNotObserved",
            UnsafeReason::LearnerBehind { .. } => "LearnerBehind",
            UnsafeReason::NoLeader => "NoLeader",
        }
    }
}

impl fmt::Display for UnsafeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnsafeReason::UnknownMember { member_id } => {
                write!(f, "member {member_id:x} is not in the member list")
            }
            UnsafeReason::LastMember { member_id } => write!(
                f,
                "member {member_id:x} is the only voting member; removing it would destroy the cluster"
            ),
            UnsafeReason::RemovingLeader { member_id } => write!(
                f,
                "member {member_id:x} is the leader; move leadership to another member first"
            ),
            UnsafeReason::NoQuorum {
                healthy_voters,
                voters,
            } => write!(
                f,
                "only {healthy_voters} of {voters} voting members are healthy, fewer than the quorum of {}; no membership change can be committed",
                quorum(*voters)
            ),
            UnsafeReason::WouldLoseQuorum {
                member_id,
                remaining_healthy,
                required,
                new_voters,
            } => write!(
                f,
                "without member {member_id:x} only {remaining_healthy} healthy voting members would remain, fewer than the quorum of {required} for {new_voters} members"
            ),
            UnsafeReason::SingleMemberDowntime { member_id } => write!(
                f,
                "member {member_id:x} is the only voting member; restarting it makes the cluster unavailable"
            ),
            UnsafeReason::LearnerPresent { learner_id } => write!(
                f,
                "learner {learner_id:x} is still pending; etcd allows one learner at a time: promote or remove it first"
            ),
            UnsafeReason::NotALearner { member_id } => {
                write!(f, "member {member_id:x} is already a voting member")
            }
            UnsafeReason::LearnerNotObserved { member_id } => write!(
                f,
                "learner {member_id:x} has not answered status yet (not started or unreachable)"
            ),
            UnsafeReason::LearnerBehind {
                member_id,
                learner_index,
                leader_index,
            } => write!(
                f,
                "learner {member_id:x} is at raft index {learner_index}, leader at {leader_index}: not caught up yet"
            ),
            UnsafeReason::NoLeader => write!(f, "no healthy member reports itself as leader"),
        }
    }
}

impl std::error::Error for UnsafeReason {}

/// The health of one etcd cluster as observed at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterHealth {
    members: Vec<MemberObservation>,
}

impl ClusterHealth {
    pub fn new(members: Vec<MemberObservation>) -> Self {
        ClusterHealth { members }
    }

    pub fn members(&self) -> &[MemberObservation] {
        &self.members
    }

    pub fn member(&self, member_id: u64) -> Option<&MemberObservation> {
        self.members.iter().find(|m| m.member.id == member_id)
    }

    pub fn voters(&self) -> impl Iterator<Item = &MemberObservation> {
        self.members.iter().filter(|m| !m.member.is_learner)
    }

    pub fn learners(&self) -> impl Iterator<Item = &MemberObservation> {
        self.members.iter().filter(|m| m.member.is_learner)
    }

    pub fn voter_count(&self) -> usize {
        self.voters().count()
    }

    pub fn healthy_voter_count(&self) -> usize {
        self.voters().filter(|m| m.healthy).count()
    }

    /// Quorum of the current voting membership.
    pub fn quorum(&self) -> usize {
        quorum(self.voter_count())
    }

    /// Quorum of a proposed number of voting members.
    pub fn quorum_of(&self, voters: usize) -> usize {
        quorum(voters)
    }

    /// Whether a quorum of voters is healthy (the cluster can serve writes).
    pub fn has_quorum(&self) -> bool {
        self.voter_count() > 0 && self.healthy_voter_count() >= self.quorum()
    }

    /// The leader: a healthy voter whose own status says it leads.
    pub fn leader(&self) -> Option<u64> {
        self.leader_status().map(|s| s.member_id)
    }

    fn leader_status(&self) -> Option<&MemberStatus> {
        self.voters()
            .filter(|m| m.healthy)
            .filter_map(|m| m.status.as_ref())
            .find(|s| s.is_leader())
    }

    /// How many raft entries `member_id` is behind the leader (0 for the
    /// leader itself); `None` without a leader or a status of that member.
    pub fn lag(&self, member_id: u64) -> Option<u64> {
        let leader = self.leader_status()?;
        let member = self.member(member_id)?.status.as_ref()?;
        Some(leader.raft_index.saturating_sub(member.raft_index))
    }

    fn find(&self, member_id: u64) -> Result<&MemberObservation, UnsafeReason> {
        self.member(member_id)
            .ok_or(UnsafeReason::UnknownMember { member_id })
    }

    fn require_committable(&self) -> Result<(), UnsafeReason> {
        if self.has_quorum() {
            Ok(())
        } else {
            Err(UnsafeReason::NoQuorum {
                healthy_voters: self.healthy_voter_count(),
                voters: self.voter_count(),
            })
        }
    }

    /// Whether `member_id` may be removed now.
    pub fn can_remove(&self, member_id: u64) -> Result<(), UnsafeReason> {
        let target = self.find(member_id)?;
        if target.member.is_learner {
            // Learners do not vote: removing one never changes the quorum.
            return Ok(());
        }
        let voters = self.voter_count();
        if voters == 1 {
            return Err(UnsafeReason::LastMember { member_id });
        }
        if self.leader() == Some(member_id) {
            return Err(UnsafeReason::RemovingLeader { member_id });
        }
        self.require_committable()?;
        let remaining_healthy = self
            .voters()
            .filter(|m| m.healthy && m.member.id != member_id)
            .count();
        let required = quorum(voters - 1);
        if remaining_healthy < required {
            return Err(UnsafeReason::WouldLoseQuorum {
                member_id,
                remaining_healthy,
                required,
                new_voters: voters - 1,
            });
        }
        Ok(())
    }

    /// Whether `member_id` may be stopped and started again now (binary
    /// upgrade, configuration change): the others must keep a quorum.
    pub fn can_restart(&self, member_id: u64) -> Result<(), UnsafeReason> {
        let target = self.find(member_id)?;
        if target.member.is_learner {
            return Ok(());
        }
        let voters = self.voter_count();
        if voters == 1 {
            return Err(UnsafeReason::SingleMemberDowntime { member_id });
        }
        let others_healthy = self
            .voters()
            .filter(|m| m.healthy && m.member.id != member_id)
            .count();
        if others_healthy < quorum(voters) {
            return Err(UnsafeReason::WouldLoseQuorum {
                member_id,
                remaining_healthy: others_healthy,
                required: quorum(voters),
                new_voters: voters,
            });
        }
        Ok(())
    }

    /// Whether a new learner may be added now: none pending, and a healthy
    /// quorum to commit the change.
    pub fn can_add_learner(&self) -> Result<(), UnsafeReason> {
        if let Some(learner) = self.learners().next() {
            return Err(UnsafeReason::LearnerPresent {
                learner_id: learner.member.id,
            });
        }
        self.require_committable()?;
        if self.leader().is_none() {
            return Err(UnsafeReason::NoLeader);
        }
        Ok(())
    }

    /// Whether learner `member_id` may be promoted now: it answers, it has
    /// caught up with the leader (etcd's own rule: at least 90% of the
    /// leader's index), and the bigger cluster keeps a healthy quorum.
    pub fn can_promote(&self, member_id: u64) -> Result<(), UnsafeReason> {
        let target = self.find(member_id)?;
        if !target.member.is_learner {
            return Err(UnsafeReason::NotALearner { member_id });
        }
        self.require_committable()?;
        let leader = self.leader_status().ok_or(UnsafeReason::NoLeader)?;
        let learner = match (&target.status, target.healthy) {
            (Some(s), true) => s,
            _ => return Err(UnsafeReason::LearnerNotObserved { member_id }),
        };
        if u128::from(learner.raft_index) * 10 < u128::from(leader.raft_index) * 9 {
            return Err(UnsafeReason::LearnerBehind {
                member_id,
                learner_index: learner.raft_index,
                leader_index: leader.raft_index,
            });
        }
        let new_voters = self.voter_count() + 1;
        let healthy_after = self.healthy_voter_count() + 1;
        if healthy_after < quorum(new_voters) {
            return Err(UnsafeReason::WouldLoseQuorum {
                member_id,
                remaining_healthy: healthy_after,
                required: quorum(new_voters),
                new_voters,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEADER_INDEX: u64 = 1000;

    /// A voter; `leader` is the id every member reports as leader.
    fn voter(id: u64, healthy: bool, leader: u64) -> MemberObservation {
        observation(id, false, healthy, leader, LEADER_INDEX)
    }

    fn learner(id: u64, raft_index: u64, leader: u64) -> MemberObservation {
        observation(id, true, true, leader, raft_index)
    }

    fn observation(
        id: u64,
        is_learner: bool,
        healthy: bool,
        leader: u64,
        raft_index: u64,
    ) -> MemberObservation {
        let member = Member {
            id,
            name: format!("m{id}"),
            peer_urls: vec![format!("http://10.0.0.{id}:2380")],
            client_urls: vec![format!("http://10.0.0.{id}:2379")],
            is_learner,
        };
        if !healthy {
            return MemberObservation::unreachable(member, "connection refused");
        }
        MemberObservation {
            member,
            status: Some(MemberStatus {
                member_id: id,
                cluster_id: 1,
                version: "3.5.1".into(),
                leader,
                raft_index,
                raft_term: 2,
                raft_applied_index: raft_index,
                revision: raft_index as i64,
                db_size: 20480,
                db_size_in_use: 16384,
                is_learner,
                errors: vec![],
                storage_version: String::new(),
                downgrade_target: None,
            }),
            healthy: true,
            error: None,
        }
    }

    fn cluster(members: Vec<MemberObservation>) -> ClusterHealth {
        ClusterHealth::new(members)
    }

    #[test]
    fn quorum_sizes() {
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(quorum), [1, 2, 2, 3, 3, 4, 4]);
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, false, 1),
        ]);
        assert_eq!(h.quorum(), 2);
        assert_eq!(h.quorum_of(5), 3);
        assert_eq!(h.voter_count(), 3);
        assert_eq!(h.healthy_voter_count(), 2);
        assert!(h.has_quorum());
    }

    #[test]
    fn leader_and_lag() {
        let mut behind = voter(3, true, 1);
        behind.status.as_mut().unwrap().raft_index = 940;
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            behind,
            learner(4, 10, 1),
        ]);
        assert_eq!(h.leader(), Some(1));
        assert_eq!(h.lag(1), Some(0));
        assert_eq!(h.lag(2), Some(0));
        assert_eq!(h.lag(3), Some(60));
        assert_eq!(h.lag(4), Some(990));
        assert_eq!(h.lag(99), None);
        assert_eq!(h.learners().map(|m| m.member.id).collect::<Vec<_>>(), [4]);
        assert_eq!(h.voters().count(), 3);
    }

    #[test]
    fn no_leader_when_the_leader_is_down() {
        let h = cluster(vec![
            voter(1, false, 0),
            voter(2, true, 0),
            voter(3, true, 0),
        ]);
        assert_eq!(h.leader(), None);
        assert_eq!(h.lag(2), None);
    }

    #[test]
    fn refuses_removing_a_healthy_member_of_three_with_one_already_down() {
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, false, 1),
        ]);
        let err = h.can_remove(2).unwrap_err();
        assert_eq!(
            err,
            UnsafeReason::WouldLoseQuorum {
                member_id: 2,
                remaining_healthy: 1,
                required: 2,
                new_voters: 2
            }
        );
        assert!(
            err.to_string()
                .contains("only 1 healthy voting members would remain")
        );
    }

    #[test]
    fn allows_removing_a_dead_member_when_the_rest_keep_the_new_quorum() {
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, false, 1),
        ]);
        assert_eq!(h.can_remove(3), Ok(()));
        // 5 members, 2 dead: removing one dead leaves 3 healthy of 4 (quorum 3).
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, true, 1),
            voter(4, false, 1),
            voter(5, false, 1),
        ]);
        assert_eq!(h.can_remove(5), Ok(()));
        // ...but removing a healthy one leaves 2 healthy of 4.
        assert_eq!(h.can_remove(2).unwrap_err().reason(), "WouldLoseQuorum");
    }

    #[test]
    fn refuses_removing_the_last_member() {
        let h = cluster(vec![voter(1, true, 1)]);
        assert_eq!(
            h.can_remove(1),
            Err(UnsafeReason::LastMember { member_id: 1 })
        );
        // A pending learner does not make the voter any less the last one.
        let h = cluster(vec![voter(1, true, 1), learner(2, 1000, 1)]);
        assert_eq!(h.can_remove(1).unwrap_err().reason(), "LastMember");
        assert_eq!(h.can_remove(2), Ok(()));
    }

    #[test]
    fn refuses_removing_the_leader_and_unknown_members() {
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, true, 1),
        ]);
        assert_eq!(h.can_remove(1).unwrap_err().reason(), "RemovingLeader");
        assert_eq!(h.can_remove(2), Ok(()));
        assert_eq!(
            h.can_remove(42),
            Err(UnsafeReason::UnknownMember { member_id: 42 })
        );
    }

    #[test]
    fn two_member_cluster() {
        // Both healthy: the follower may go (1 of 1 remains); the leader must
        // hand over leadership first.
        let h = cluster(vec![voter(1, true, 1), voter(2, true, 1)]);
        assert_eq!(h.can_remove(2), Ok(()));
        assert_eq!(h.can_remove(1).unwrap_err().reason(), "RemovingLeader");
        // One down: the removal could never commit (needs 2 of 2).
        let h = cluster(vec![voter(1, true, 1), voter(2, false, 1)]);
        assert_eq!(
            h.can_remove(2),
            Err(UnsafeReason::NoQuorum {
                healthy_voters: 1,
                voters: 2
            })
        );
        // And neither member may be restarted: quorum of 2 is 2.
        let h = cluster(vec![voter(1, true, 1), voter(2, true, 1)]);
        assert_eq!(h.can_restart(2).unwrap_err().reason(), "WouldLoseQuorum");
    }

    #[test]
    fn refuses_everything_without_quorum() {
        let h = cluster(vec![
            voter(1, true, 0),
            voter(2, false, 0),
            voter(3, false, 0),
        ]);
        assert_eq!(h.can_remove(3).unwrap_err().reason(), "NoQuorum");
        assert_eq!(h.can_add_learner().unwrap_err().reason(), "NoQuorum");
        assert!(!h.has_quorum());
    }

    #[test]
    fn restart_needs_a_quorum_among_the_others() {
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, true, 1),
        ]);
        assert_eq!(h.can_restart(3), Ok(()));
        assert_eq!(h.can_restart(1), Ok(()));
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, false, 1),
        ]);
        assert_eq!(h.can_restart(2).unwrap_err().reason(), "WouldLoseQuorum");
        // Restarting the dead member itself changes nothing.
        assert_eq!(h.can_restart(3), Ok(()));
        let h = cluster(vec![voter(1, true, 1)]);
        assert_eq!(
            h.can_restart(1).unwrap_err().reason(),
            "SingleMemberDowntime"
        );
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, true, 1),
            learner(4, 1, 1),
        ]);
        assert_eq!(h.can_restart(4), Ok(()));
    }

    #[test]
    fn refuses_a_second_learner() {
        let h = cluster(vec![voter(1, true, 1), learner(2, 10, 1)]);
        let err = h.can_add_learner().unwrap_err();
        assert_eq!(err, UnsafeReason::LearnerPresent { learner_id: 2 });
        assert!(err.to_string().contains("one learner at a time"));
        let h = cluster(vec![voter(1, true, 1)]);
        assert_eq!(h.can_add_learner(), Ok(()));
        let h = cluster(vec![
            voter(1, true, 0),
            voter(2, true, 0),
            voter(3, true, 0),
        ]);
        assert_eq!(h.can_add_learner(), Err(UnsafeReason::NoLeader));
    }

    #[test]
    fn promote_only_a_caught_up_observed_learner() {
        let h = cluster(vec![voter(1, true, 1), learner(2, 500, 1)]);
        assert_eq!(
            h.can_promote(2),
            Err(UnsafeReason::LearnerBehind {
                member_id: 2,
                learner_index: 500,
                leader_index: 1000
            })
        );
        let h = cluster(vec![voter(1, true, 1), learner(2, 900, 1)]);
        assert_eq!(h.can_promote(2), Ok(()));
        assert_eq!(h.can_promote(1).unwrap_err().reason(), "NotALearner");
        assert_eq!(h.can_promote(9).unwrap_err().reason(), "UnknownMember");

        let mut unstarted = learner(2, 0, 0);
        unstarted.status = None;
        unstarted.healthy = false;
        let h = cluster(vec![voter(1, true, 1), unstarted]);
        assert_eq!(h.can_promote(2).unwrap_err().reason(), "LearnerNotObserved");
    }

    #[test]
    fn promote_keeps_a_healthy_quorum_of_the_bigger_cluster() {
        // 2 voters, one down: already no quorum to commit the promotion.
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, false, 1),
            learner(3, 1000, 1),
        ]);
        assert_eq!(h.can_promote(3).unwrap_err().reason(), "NoQuorum");
        // 3 voters, one down, learner up: 4 voters with 3 healthy (quorum 3).
        let h = cluster(vec![
            voter(1, true, 1),
            voter(2, true, 1),
            voter(3, false, 1),
            learner(4, 1000, 1),
        ]);
        assert_eq!(h.can_promote(4), Ok(()));
    }

    #[test]
    fn reasons_are_stable_labels() {
        let all = [
            UnsafeReason::UnknownMember { member_id: 1 },
            UnsafeReason::LastMember { member_id: 1 },
            UnsafeReason::RemovingLeader { member_id: 1 },
            UnsafeReason::NoQuorum {
                healthy_voters: 1,
                voters: 3,
            },
            UnsafeReason::WouldLoseQuorum {
                member_id: 1,
                remaining_healthy: 1,
                required: 2,
                new_voters: 2,
            },
            UnsafeReason::SingleMemberDowntime { member_id: 1 },
            UnsafeReason::LearnerPresent { learner_id: 1 },
            UnsafeReason::NotALearner { member_id: 1 },
            UnsafeReason::LearnerNotObserved { member_id: 1 },
            UnsafeReason::LearnerBehind {
                member_id: 1,
                learner_index: 1,
                leader_index: 2,
            },
            UnsafeReason::NoLeader,
        ];
        let mut labels: Vec<_> = all.iter().map(UnsafeReason::reason).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), all.len());
        for r in &all {
            assert!(!r.to_string().is_empty());
        }
    }
}
