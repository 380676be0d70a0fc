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

/// The longest message, in bytes, a condition, an operation or a member
/// carries in a status: a message with a remote answer in it (a workload
/// API server's or an object store's error body) is cut to it.
pub const MESSAGE_LIMIT: usize = 4096;
/// The longest message, in bytes, one cluster's record carries in a fleet
/// rollout's status (which holds one record per cluster).
pub const ROLLOUT_MESSAGE_LIMIT: usize = 512;
/// The longest note of an event, in bytes (the events API's own limit).
pub const EVENT_NOTE_LIMIT: usize = 1024;

/// `message` cut to at most `limit` bytes, on a character boundary, its end
/// saying how much was cut.
pub fn bounded(mut message: String, limit: usize) -> String {
    if message.len() <= limit {
        return message;
    }
    // Room for the marker: " … (" and ")" with " bytes cut" and 20 digits.
    let mut end = limit.saturating_sub(40);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let cut = message.len() - end;
    message.truncate(end);
    message.push_str(&format!(" … ({cut} bytes cut)"));
    message
}

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
        message: bounded(message.into(), MESSAGE_LIMIT),
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

#[cfg(test)]
mod bounded_tests {
    use super::*;

    #[test]
    fn a_long_remote_answer_is_cut_within_the_limit_on_a_character_boundary() {
        assert_eq!(bounded("short".into(), 64), "short");
        let body = "é".repeat(10_000);
        let cut = bounded(body.clone(), MESSAGE_LIMIT);
        assert!(cut.len() <= MESSAGE_LIMIT, "{}", cut.len());
        assert!(
            cut.starts_with("éé") && cut.ends_with(" bytes cut)"),
            "{cut}"
        );
        let kept = cut.split(" … (").next().unwrap().len();
        assert!(
            cut.contains(&format!("({} bytes cut)", body.len() - kept)),
            "{cut}"
        );
        let made = condition(
            "Ready",
            false,
            "X",
            body,
            None,
            Time(k8s_openapi::jiff::Timestamp::now()),
        );
        assert!(made.message.len() <= MESSAGE_LIMIT);
    }
}
