//! Condition types and reasons of `EtcdCluster.status.conditions`, and the one
//! function that merges a new condition into a list (keeping
//! `lastTransitionTime` unless the status really changed).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
pub const REMOTE_REACHABLE: &str = "RemoteReachable";
pub const TEMPLATE_RESOLVED: &str = "TemplateResolved";
pub const VERSION_ACCEPTED: &str = "VersionAccepted";
/// Whether the etcd project still supports the version the cluster runs (or
/// moves to): `False` with `EndOfSupport` or `NotRecommended` and the upgrade
/// path. A warning only: nothing is refused for it.
pub const VERSION_SUPPORTED: &str = "VersionSupported";
/// True while the controller refuses to act because acting would harm data or
/// another owner: a workload object owned by someone else, a changed identity
/// (workload cluster, namespace, TLS), lost PKI, an untakeable storage change.
pub const CONFLICT: &str = "Conflict";

/// `Available` reason: a quorum of voting members is healthy.
pub const QUORUM_HEALTHY: &str = "QuorumHealthy";
/// `Available=False` reason: the members' own health (their answers to the
/// controller and etcd's health check in their pods) says fewer than a
/// quorum are healthy.
pub const QUORUM_LOST: &str = "QuorumLost";
/// `Available=Unknown` (and `Degraded=Unknown`) reason: the controller
/// cannot reach enough members to see a quorum, but their pods pass etcd's
/// own health check: a network problem between the controller and the
/// workload cluster, not an etcd outage.
pub const MEMBERS_UNREACHABLE_FROM_CONTROLLER: &str = "MembersUnreachableFromController";

/// Sets `new` in `conditions`: replaces the condition of the same type, keeping
/// its `lastTransitionTime` when the status did not change. Returns whether
/// anything observable (status, reason, message, generation) changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            let changed = old.status != new.status
                || old.reason != new.reason
                || old.message != new.message
                || old.observed_generation != new.observed_generation;
            *old = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// Builds a condition; `now` is its transition time if it is new or changed status.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: now,
    }
}

/// Builds a condition whose status is `Unknown`: the controller cannot tell.
pub fn unknown_condition(
    type_: &str,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        status: "Unknown".to_string(),
        ..condition(type_, false, reason, message, generation, now)
    }
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a condition of this type is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}
