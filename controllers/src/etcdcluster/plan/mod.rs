//! The planner: a pure function from everything observed about one etcd
//! cluster to the single most urgent safe next step (or a reason to wait, or
//! nothing). It looks at the whole state every time, never at what changed,
//! so a controller that restarts at any point simply plans again.
//!
//! The policy is [`RULES`]: an ordered list of named rules, most urgent
//! first. Each rule is a small pure function that answers with a plan (a
//! step, a wait, a hold, a refusal) or `None`, "not mine"; the first answer
//! wins, and when no rule answers the cluster is converged. A new capability
//! adds a rule at its place in the list, with its tests beside it; it does
//! not add a branch inside another rule.
//!
//! Rooms: [`observation`] (what the planner reads), [`step`] (what it
//! answers), [`members`] (the running cluster as the membership rules see
//! it), [`quorum`]; the rules themselves in [`guards`], [`bootstrap`],
//! [`repair`], [`scale`], [`roll`], [`maintenance`], [`storage`] (volumes
//! that grow, changes they cannot take) and [`version`] (the
//! preflight of a change of minor version and etcd's online downgrade),
//! the takeover of a running etcd in [`adopt`], the rotation of the CA
//! in [`ca_rotation`], and the recovery from a lost quorum in [`recovery`].

pub mod adopt;
pub mod bootstrap;
pub mod ca_rotation;
pub mod guards;
pub mod maintenance;
pub mod members;
pub mod observation;
pub mod quorum;
pub mod recovery;
pub mod repair;
pub mod roll;
pub mod scale;
pub mod step;
pub mod storage;
pub mod version;

pub use adopt::{AdoptionState, adoption_state};
pub use guards::{RETRY_BASE, RETRY_MAX, identity_mismatch, retry_delay};
pub use maintenance::DEFRAG_MIN_FREE_BYTES;
pub use members::Members;
pub use observation::{
    AdoptionObservation, CaRotationObservation, EtcdObservation, FailedStep, ForeignObject,
    Observation, PodObservation, ProbedPort, PvcObservation, READY_POD_GRACE_FACTOR,
    RecoveryObservation, RestoreGate, StatefulSetObservation, TrustProbe, VersionObservation,
};
pub use observation::{ClaimSize, Expansion, StorageObservation, TargetClass};
pub use quorum::{CutOff, QUORUM_LOSS_HELP, QuorumView, quorum_view};
pub use step::{
    ObjectKind, Plan, RecoveryPlan, RecoveryStep, Refusal, RemovalCause, Step, StorageStep,
    VersionStep,
};

/// One rule of the policy: it decides from the observation alone, or (after
/// bootstrap, once a StatefulSet exists and members answer) from the running
/// cluster.
#[derive(Clone, Copy)]
pub enum Rule {
    Observation(fn(&Observation) -> Option<Plan>),
    Members(fn(&Members) -> Option<Plan>),
}

use Rule::{Members as M, Observation as O};

/// The whole policy, most urgent first.
pub const RULES: &[(&str, Rule)] = &[
    // Refusals: acting would harm data or another owner, one rule each.
    // A lost CA Secret that a person asked to recover is rebuilt from the
    // members' trust instead of refused.
    ("CA rotation: recover a lost CA", O(ca_rotation::recover)),
    (
        "objects owned elsewhere",
        O(guards::objects_owned_elsewhere),
    ),
    ("lost PKI", O(guards::pki_lost)),
    ("storage change refused", O(storage::refused)),
    (
        "a volume the new StorageClass does not provision",
        O(storage::moves::unprovisioned),
    ),
    (
        "a version the volumes' data forbids",
        O(guards::version_forbidden_by_volumes),
    ),
    (
        "a version the members forbid",
        O(guards::version_forbidden_by_members),
    ),
    ("restore gate", O(guards::restore_gate)),
    // Adoption of a running etcd: refused while a preflight check fails,
    // halted when its membership changes underneath the takeover.
    ("adoption gate", O(adopt::adoption_gate)),
    // A change of minor version: what must come before the StatefulSet
    // write that starts its roll (a snapshot, etcd's downgrade enable); a
    // failed snapshot refuses the change with its own reason.
    ("version change preflight", O(version::preflight)),
    ("failing step backs off", O(guards::failure_backoff)),
    // A lost quorum recovered from the survivor with the most data, once
    // the evidence says the lost members are lost for good; a recovery
    // under way takes its next step before anything else moves.
    ("quorum-loss recovery", O(recovery::recovery)),
    ("online downgrade", O(version::downgrade)),
    // A CA rotation cancelled before it reissued anything is undone at
    // once, even in the middle of its roll.
    ("CA rotation: cancel", O(ca_rotation::cancel)),
    ("adoption: the existing CA", O(adopt::import_ca)),
    // The workload objects exist and match their inputs: Services, PKI and
    // TLS Secrets (certificates are renewed here), ConfigMap, StatefulSet
    // (unless a change of minor version holds it).
    ("missing or stale objects", O(bootstrap::stale_objects)),
    // An adopting cluster's first member joins the running etcd; it never
    // bootstraps a new one.
    ("adoption: the first member", O(adopt::first_member)),
    ("bootstrap", O(bootstrap::bootstrap)),
    ("no member answers", O(bootstrap::no_member_answers)),
    // From here on a StatefulSet exists and members answer.
    ("quorum", M(quorum::quorum)),
    // Membership repair.
    ("record new volumes", M(repair::record_new_volumes)),
    ("learner in flight", M(repair::learner_in_flight)),
    (
        "close the members announcement",
        M(repair::close_announcement),
    ),
    // A member failing on a version its data never ran is kept: the
    // version, not the data, is the cause.
    (
        "member that cannot start on a new version",
        M(repair::cannot_start_on_new_version),
    ),
    ("failed members", M(repair::failed_members)),
    ("stale storage", M(repair::stale_storage)),
    // Volumes grow (before the alarms: growing is how NOSPACE is cured
    // when the quota follows the size), one member at a time.
    ("grow volumes", M(storage::grow)),
    // Alarms before any change of size or version.
    ("alarms", M(maintenance::alarms)),
    // Scale: down (shrink after a removal, then its volume, then the next
    // member), a foreign member reported, then up.
    ("shrink after a removal", M(scale::shrink_statefulset)),
    ("delete removed volumes", M(scale::delete_removed_volumes)),
    ("remove beyond the size", M(scale::remove_beyond_size)),
    // Adoption: the running etcd's old members are taken over before any
    // member this cluster does not own is reported as foreign.
    ("adoption: take over", M(adopt::take_over)),
    ("foreign members", M(scale::foreign_members)),
    ("scale up", M(scale::scale_up)),
    // A move to another StorageClass: the StatefulSet re-created, then one
    // member at a time replaced through the spare the scale rules add.
    (
        "move members to the new StorageClass",
        M(storage::moves::move_members),
    ),
    // Version and configuration. While the roll waits for a restarted
    // member, the records of those already restarted are written.
    (
        "volume records while a roll waits",
        M(maintenance::records_while_a_roll_waits),
    ),
    ("roll members onto the template", M(roll::roll_members)),
    // CA rotation: each phase once the cluster settled on the last one.
    ("CA rotation", M(ca_rotation::advance)),
    // Maintenance.
    ("defragment", M(maintenance::defragment)),
    ("unhealthy member", M(maintenance::unhealthy_member)),
    ("volume records", M(maintenance::refresh_volume_records)),
    // A scale-down's last volume waits for its pod to stop.
    (
        "removed volume waits for its pod",
        M(scale::removed_volume_waits_for_its_pod),
    ),
    // A change of minor version held, nothing else to do: wait, saying why;
    // converged on an acknowledged downgrade: forget the acknowledgement.
    ("version change held", O(version::held)),
    (
        "downgrade acknowledgement",
        O(version::forget_acknowledgement),
    ),
];

/// Decides the next step: the first rule of [`RULES`] that answers. Pure.
pub fn plan_next_step(obs: &Observation) -> Plan {
    // A move to another StorageClass counts its spare in the desired size.
    let spared = storage::moves::with_spare(obs);
    let obs = spared.as_ref().unwrap_or(obs);
    let members = Members::of(obs);
    for (_, rule) in RULES {
        let answer = match rule {
            Rule::Observation(decide) => decide(obs),
            // Before bootstrap the rules above always answer.
            Rule::Members(decide) => members.as_ref().and_then(decide),
        };
        if let Some(plan) = answer {
            return plan;
        }
    }
    Plan::Converged
}

#[cfg(test)]
pub(crate) mod tests;
