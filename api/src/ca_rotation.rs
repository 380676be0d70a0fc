//! CA rotation: replacing the CA of a cluster (the one that signs its
//! members' server and peer certificates and the controller's client
//! identity) without downtime, in phases, each a roll of the members:
//!
//! 1. `Preparing`: the new CA is generated beside the old one.
//! 2. `Trusting`: members and the controller trust both CAs (a bundle).
//! 3. `Reissuing`: server, peer and client certificates come from the new CA.
//! 4. `Completing`: the old CA leaves the bundle.
//! 5. `Completed`.
//!
//! A rotation is asked for with the annotation [`ROTATE_CA_ANNOTATION`]
//! (its value names the request, so a request is seen once and never
//! repeated), or starts on its own when the CA nears its expiry. Until
//! `Reissuing` it can be cancelled (the annotation removed, or set to
//! [`CANCEL`]): the cluster returns to the old CA alone. This module holds
//! the types, the phase names and the pure functions over them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// Annotation asking for a rotation: its value is the request id.
pub const ROTATE_CA_ANNOTATION: &str = "etcdfleet.dev/rotate-ca";
/// Annotation value that cancels a rotation (as removing the annotation does).
pub const CANCEL: &str = "cancel";
/// Annotation asking to recover a lost CA Secret from the members' current
/// trust (see the README): its value names the request.
pub const RECOVER_CA_ANNOTATION: &str = "etcdfleet.dev/recover-ca";
/// Prefix of the request id of a recovery (never cancellable: the old CA's
/// key is gone).
pub const RECOVER_REQUEST_PREFIX: &str = "recover-";
/// Prefix of the request id of a rotation started because the CA nears its expiry.
pub const EXPIRY_REQUEST_PREFIX: &str = "expiry-";
/// Condition type: `True` while a rotation is in progress, `False` once done or cancelled.
pub const CA_ROTATING: &str = "CARotating";

/// Phases of a rotation, in order (plus `Cancelled`).
pub mod phase {
    pub const PREPARING: &str = "Preparing";
    pub const TRUSTING: &str = "Trusting";
    pub const REISSUING: &str = "Reissuing";
    pub const COMPLETING: &str = "Completing";
    pub const COMPLETED: &str = "Completed";
    pub const CANCELLED: &str = "Cancelled";
    /// Every phase, for the phase gauge.
    pub const ALL: [&str; 6] = [
        PREPARING, TRUSTING, REISSUING, COMPLETING, COMPLETED, CANCELLED,
    ];
}

/// `status.caRotation`: the last (or current) rotation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaRotationStatus {
    /// The request: the annotation's value, or `expiry-…` for one started
    /// because the CA nears its expiry.
    pub request_id: String,
    /// `Preparing`, `Trusting`, `Reissuing`, `Completing`, `Completed` or `Cancelled`.
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_time: Option<Time>,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_time: Option<Time>,
    /// The roll stamp the members' pod template carried before this
    /// rotation (what a cancelled rotation returns to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior_roll_stamp: Option<String>,
}

impl CaRotationStatus {
    /// Whether the rotation is under way (neither completed nor cancelled).
    pub fn in_progress(&self) -> bool {
        !matches!(self.phase.as_str(), phase::COMPLETED | phase::CANCELLED)
    }

    /// Whether it can still be cancelled (nothing was reissued yet).
    pub fn cancellable(&self) -> bool {
        matches!(self.phase.as_str(), phase::PREPARING | phase::TRUSTING)
            && !self.request_id.starts_with(RECOVER_REQUEST_PREFIX)
    }
}

/// The stamp the members' pod template carries for a rotation's state: each
/// phase that changes what members trust or present rolls them once.
/// `None` when no rotation ever changed the members.
pub fn roll_stamp(record: Option<&CaRotationStatus>) -> Option<String> {
    let r = record?;
    let suffix = match r.phase.as_str() {
        phase::TRUSTING => "trust",
        phase::REISSUING => "reissue",
        phase::COMPLETING | phase::COMPLETED => "complete",
        _ => return r.prior_roll_stamp.clone(),
    };
    Some(format!("{}/{suffix}", r.request_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(phase: &str, prior: Option<&str>) -> CaRotationStatus {
        CaRotationStatus {
            request_id: "r1".into(),
            phase: phase.into(),
            prior_roll_stamp: prior.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn each_rolling_phase_has_its_stamp_and_others_keep_the_prior_one() {
        assert_eq!(roll_stamp(None), None);
        assert_eq!(roll_stamp(Some(&record(phase::PREPARING, None))), None);
        let trusting = record(phase::TRUSTING, None);
        assert_eq!(roll_stamp(Some(&trusting)).as_deref(), Some("r1/trust"));
        let reissuing = record(phase::REISSUING, None);
        assert_eq!(roll_stamp(Some(&reissuing)).as_deref(), Some("r1/reissue"));
        let done = record(phase::COMPLETED, None);
        assert_eq!(roll_stamp(Some(&done)).as_deref(), Some("r1/complete"));
        let cancelled = record(phase::CANCELLED, Some("r0/complete"));
        assert_eq!(roll_stamp(Some(&cancelled)).as_deref(), Some("r0/complete"));
        assert!(trusting.cancellable() && !reissuing.cancellable());
        let recovering = CaRotationStatus {
            request_id: "recover-r1".into(),
            ..trusting.clone()
        };
        assert!(!recovering.cancellable());
        assert!(!done.in_progress() && !cancelled.in_progress() && trusting.in_progress());
    }
}
