//! Adoption: `EtcdCluster.spec.bootstrap.join`, which takes over an etcd
//! cluster that runs already (made by hand, by a Helm chart, by another
//! operator) without downtime: etcdfleet's members join it as learners, are
//! promoted once caught up, leadership moves to one of them, and the old
//! members are removed from the membership one at a time. The data, the
//! cluster ID and the CA stay; the old members' pods, StatefulSets and
//! volumes are never touched (their owner deletes them; the status says
//! which ones are no longer used).
//!
//! Like a restore, a join is part of the cluster's identity: it is set only
//! at creation and immutable (the CEL rule lives on `EtcdClusterSpec`), and
//! it is honoured until the takeover is complete. This module holds the
//! types and the reasons; the checks are the cluster planner's, the
//! observations the controller's.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The running etcd cluster to join and take over.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinSpec {
    /// Client URLs of the existing members as they advertise them, e.g.
    /// `https://etcd-0.etcd.etcd-system.svc:2379`. This is how the members
    /// are reached: the controller reaches them as it reaches its own
    /// members (by default through the workload API server's
    /// `pods/portforward` to the pod the URL names, so each URL's host must
    /// be `<pod>.<service>.<namespace>.svc`; with the direct dialer, over
    /// the network). etcdfleet's members and the existing ones reach each
    /// other at their peer URLs, which must resolve and route both ways.
    // Bounded (items and length) so the rule stays within the API
    // server's CEL cost budget.
    #[schemars(length(min = 1, max = 7), inner(length(max = 253)))]
    #[x_kube(validation = Rule::new("self.all(u, u.matches('^https?://[^/:]+:[0-9]+$'))").message("endpoints must be client URLs http(s)://host:port, e.g. https://etcd-0.etcd.etcd-system.svc:2379"))]
    pub endpoints: Vec<String>,
    /// Secret in the EtcdCluster's namespace holding the existing cluster's
    /// CA: `ca.crt` (the CA that signed the existing members' server, peer
    /// and client certificates) and `ca.key`. etcdfleet becomes that CA's
    /// keeper: its members' certificates and its own client identity are
    /// issued from it, so the existing members accept them and the
    /// cluster's clients keep trusting the cluster. Required with TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("credentialsSecretName must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub credentials_secret_name: Option<String>,
}

/// Keys of the join credentials Secret.
pub const JOIN_CA_CERT: &str = "ca.crt";
pub const JOIN_CA_KEY: &str = "ca.key";

/// Condition type of an `EtcdCluster` that adopts: `False` with the reason
/// while it is refused, joins or retires the old members, or halted; `True`
/// once the takeover is complete.
pub const ADOPTED: &str = "Adopted";

/// Reasons of `Adopted`.
pub mod reason {
    /// The join credentials Secret is missing, lacks `ca.crt`/`ca.key`, or
    /// holds no usable CA.
    pub const CREDENTIALS_INVALID: &str = "JoinCredentialsInvalid";
    /// No existing member answers at the join endpoints.
    pub const UNREACHABLE: &str = "ExistingClusterUnreachable";
    /// The controller cannot trust the existing members' server
    /// certificates with the given CA, or they refuse a client certificate
    /// issued from it.
    pub const SERVER_TRUST_MISSING: &str = "ServerTrustMissing";
    /// The existing members' peer ports refuse a peer certificate issued
    /// from the given CA, present a certificate it does not verify, or do
    /// not authenticate peers at all (so their trust cannot be checked).
    pub const PEER_TRUST_MISSING: &str = "PeerTrustMissing";
    /// An existing member is not healthy.
    pub const MEMBER_UNHEALTHY: &str = "MemberUnhealthy";
    /// A learner is already in the existing cluster (etcd allows one).
    pub const LEARNER_SLOT_TAKEN: &str = "LearnerSlotTaken";
    /// `spec.version` and the existing members' version are not a change
    /// the version policy accepts.
    pub const VERSION_SKEW: &str = "VersionSkew";
    /// An existing member already uses a name or peer URL of this cluster's members.
    pub const NAMES_CLASH: &str = "MemberNamesClash";
    /// The endpoints' scheme does not match `spec.tls.enabled`.
    pub const TLS_MISMATCH: &str = "TlsMismatch";
    /// Preflight passed; etcdfleet's members are joining as learners.
    pub const JOINING: &str = "JoiningMembers";
    /// etcdfleet's members hold the cluster; the old ones are being removed.
    pub const RETIRING: &str = "RetiringOldMembers";
    /// The existing cluster's membership changed during the takeover: halted.
    pub const MEMBERSHIP_CHANGED: &str = "ExistingMembershipChanged";
    /// Every old member is removed: the cluster is etcdfleet's.
    pub const TAKEN_OVER: &str = "TakenOver";
}

/// Phases of `status.adoption.phase`.
pub mod phase {
    pub const JOINING: &str = "Joining";
    pub const RETIRING: &str = "Retiring";
    pub const HALTED: &str = "Halted";
    pub const COMPLETED: &str = "Completed";
}

/// The takeover as recorded in `status.adoption`: which members the
/// existing cluster had when it started (what "its old members" means, and
/// what a change underneath is judged against), and which of them
/// etcdfleet removed (each recorded before its removal).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionStatus {
    /// `Joining`, `Retiring`, `Halted` or `Completed`.
    pub phase: String,
    /// The etcd cluster ID (hexadecimal): the same before and after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// The existing members when the takeover started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub existing_members: Vec<AdoptedMember>,
    /// Ids (hexadecimal) of existing members etcdfleet removed, each
    /// recorded before its removal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<String>,
    /// When the first change was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_time: Option<Time>,
    /// When the last old member left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_time: Option<Time>,
    /// Workload objects of the old members that nothing uses any more
    /// (`Kind/namespace/name`): their owner may delete them. etcdfleet never does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deletable_objects: Vec<String>,
}

/// One member of the existing cluster, as found when the takeover started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptedMember {
    /// etcd member id, hexadecimal.
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_urls: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_urls: Vec<String>,
}

impl AdoptionStatus {
    /// The recorded existing members' ids.
    pub fn existing_ids(&self) -> Vec<u64> {
        self.existing_members
            .iter()
            .filter_map(|m| parse_id(&m.id))
            .collect()
    }

    /// The ids of the existing members etcdfleet removed.
    pub fn retired_ids(&self) -> Vec<u64> {
        self.retired.iter().filter_map(|id| parse_id(id)).collect()
    }

    pub fn is_completed(&self) -> bool {
        self.phase == phase::COMPLETED
    }
}

/// A member id as status writes it (hexadecimal).
pub fn parse_id(id: &str) -> Option<u64> {
    u64::from_str_radix(id.trim_start_matches("0x"), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_ids_read_back_from_hex() {
        let status = AdoptionStatus {
            phase: phase::RETIRING.into(),
            existing_members: vec![AdoptedMember {
                id: "8e9e05c52164694d".into(),
                name: "etcd-0".into(),
                ..Default::default()
            }],
            retired: vec!["0x10".into(), "not-hex".into()],
            ..Default::default()
        };
        assert_eq!(status.existing_ids(), vec![0x8e9e05c52164694d]);
        assert_eq!(status.retired_ids(), vec![16]);
        assert!(!status.is_completed());
    }
}
