//! The rollout planner: a pure function from the rollout (its spec and the
//! status it last wrote), the selected clusters as the controller's cache
//! shows them, and the time, to at most ONE action and the new status.
//! Like the EtcdCluster planner it looks at everything every time and
//! never at what changed, so a controller that restarts at any point plans
//! again from the same inputs: the per-cluster records (when each was
//! changed, when it converged) are in the rollout's status, and what a
//! status write lost is found again in the clusters' `managedFields`.
//!
//! The actions: write the change into one cluster ([`Action::Apply`]),
//! remove the resume annotation a person set ([`Action::AcknowledgeResume`]),
//! or nothing (wait, halt, complete: the status says which).
//!
//! The policy is [`RULES`], most urgent first; the first rule that answers
//! decides. Everything the rules read is judged once, before the first of
//! them, into a [`Work`]; a rule only reads it, and the records a rule's
//! answer changes travel in the answer (its marks). Rooms: [`work`] (input,
//! action, answer, the judged records), [`view`] (what the planner reads of
//! a cluster, and the gates), [`records`] (each cluster's state), [`waves`],
//! [`turn`] (what the current wave would do next), [`rules`], [`summary`]
//! (the status a person reads).

pub mod records;
pub mod rules;
pub mod summary;
pub mod turn;
pub mod view;
pub mod waves;
pub mod work;

use etcdfleet_api::EtcdFleetRolloutStatus;

pub use records::{Judge, Mark};
pub use view::{ClusterView, ConditionView, FieldOwner, ReportedState, RolloutField};
pub use waves::Wave;
pub use work::{Action, Outcome, RolloutInput, Rule, Work, manager_of};

/// The planner's answer: the new status and the one action.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub status: EtcdFleetRolloutStatus,
    pub outcome: Outcome,
    /// The rule that answered (for logs and the preview).
    pub rule: &'static str,
}

/// The policy, most urgent first. Each rule reads the judged [`Work`]
/// alone: a changed cluster of the current wave that stopped being healthy
/// already failed when the records were judged (so `halted` answers for
/// it), and the wave's version gate and its turn were judged then too.
pub const RULES: &[(&str, Rule)] = &[
    ("invalid strategy", rules::invalid_strategy),
    ("complete stays complete", rules::stays_complete),
    ("aborted", rules::aborted),
    ("resume after a halt", rules::resume),
    ("halted", rules::halted),
    ("no clusters", rules::no_clusters),
    ("complete", rules::complete),
    ("paused", rules::paused),
    ("soaking", rules::soaking),
    // Before a wave's first write: a refused cluster halts the rollout
    // before the wave touches any other.
    ("version gate of the wave", rules::wave_gate),
    ("maintenance window", rules::window),
    ("clusters in flight", rules::in_flight),
    ("next cluster", rules::next_cluster),
];

/// Decides what the rollout does next. Pure.
pub fn plan_rollout(input: &RolloutInput) -> Decision {
    let work = Work::new(input);
    let (rule, outcome) = RULES
        .iter()
        .find_map(|(name, rule)| rule(&work).map(|outcome| (*name, outcome)))
        .unwrap_or_else(|| ("waiting", rules::waiting(&work)));
    let status = summary::status(&work, &outcome);
    Decision {
        status,
        outcome,
        rule,
    }
}

#[cfg(test)]
mod tests;
