//! One error type for every etcd operation, classified from gRPC status codes,
//! etcd's own error strings (`rpctypes`) and transport failures, so callers can
//! match on what happened instead of parsing messages.

use std::time::Duration;

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no endpoint given")]
    NoEndpoints,
    #[error("invalid endpoint {endpoint:?}: {message}")]
    InvalidEndpoint { endpoint: String, message: String },
    #[error("TLS setup or handshake failed: {0}")]
    Tls(String),
    #[error("etcd unreachable: {0}")]
    Unreachable(String),
    #[error("{op} did not finish within {after:?}")]
    Timeout { op: &'static str, after: Duration },
    #[error("learner {member_id:x} is not in sync with the leader yet")]
    NotInSync { member_id: u64 },
    #[error("member {member_id:x} not found")]
    MemberNotFound { member_id: u64 },
    #[error("member {member_id:x} is not a learner")]
    NotALearner { member_id: u64 },
    #[error("the cluster already has a learner")]
    TooManyLearners,
    #[error("the member already exists: {0}")]
    MemberExists(String),
    #[error("etcd refused the membership change as unsafe: {0}")]
    UnhealthyCluster(String),
    #[error("no leader: {0}")]
    NoLeader(String),
    #[error("member {member_id:x} is not the leader")]
    NotLeader { member_id: u64 },
    #[error("snapshot integrity check failed: {0}")]
    SnapshotIntegrity(String),
    #[error("writing the snapshot failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("etcd answered {code}: {message}")]
    Rpc { code: String, message: String },
}

impl EtcdError {
    /// A short, stable label for metrics and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            EtcdError::NoEndpoints => "NoEndpoints",
            EtcdError::InvalidEndpoint { .. } => "InvalidEndpoint",
            EtcdError::Tls(_) => "TLSError",
            EtcdError::Unreachable(_) => "Unreachable",
            EtcdError::Timeout { .. } => "Timeout",
            EtcdError::NotInSync { .. } => "LearnerNotInSync",
            EtcdError::MemberNotFound { .. } => "MemberNotFound",
            EtcdError::NotALearner { .. } => "NotALearner",
            EtcdError::TooManyLearners => "TooManyLearners",
            EtcdError::MemberExists(_) => "MemberExists",
            EtcdError::UnhealthyCluster(_) => "UnhealthyCluster",
            EtcdError::NoLeader(_) => "NoLeader",
            EtcdError::NotLeader { .. } => "NotLeader",
            EtcdError::SnapshotIntegrity(_) => "SnapshotIntegrity",
            EtcdError::Io(_) => "IOError",
            EtcdError::Rpc { .. } => "RPCError",
        }
    }

    /// Whether trying the same call again later may succeed without anything
    /// else changing (network blips, elections, strict reconfiguration check).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            EtcdError::Unreachable(_)
                | EtcdError::Timeout { .. }
                | EtcdError::NotInSync { .. }
                | EtcdError::UnhealthyCluster(_)
                | EtcdError::NoLeader(_)
        )
    }

    /// Classifies an etcd-client error. `member_id` names the member the call
    /// was about, for the variants that carry one.
    pub(crate) fn from_client(err: etcd_client::Error, member_id: Option<u64>) -> Self {
        let id = member_id.unwrap_or_default();
        match err {
            etcd_client::Error::GRpcStatus(status) => {
                let code = format!("{:?}", status.code());
                match std::error::Error::source(&status) {
                    // Made by the client from a local failure (a connection
                    // or tunnel that broke), not sent by etcd.
                    Some(source) if code == "Unknown" || code == "Cancelled" => {
                        transport(&format!("{}: {}", status.message(), error_chain(source)))
                    }
                    _ => classify_status(&code, status.message(), id),
                }
            }
            etcd_client::Error::TransportError(e) => transport(&error_chain(&e)),
            etcd_client::Error::IoError(e) => transport(&e.to_string()),
            etcd_client::Error::InvalidUri(e) => EtcdError::InvalidEndpoint {
                endpoint: String::new(),
                message: e.to_string(),
            },
            etcd_client::Error::EndpointError(e) => EtcdError::InvalidEndpoint {
                endpoint: String::new(),
                message: e,
            },
            other => EtcdError::Rpc {
                code: "Client".into(),
                message: other.to_string(),
            },
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn transport(message: &str) -> EtcdError {
    if looks_like_tls(message) {
        EtcdError::Tls(message.to_string())
    } else {
        EtcdError::Unreachable(message.to_string())
    }
}

fn looks_like_tls(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "certificate",
        "tls",
        "handshake",
        "unknownissuer",
        "invalid peer",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// Maps a gRPC status to a variant. etcd's error strings are stable API
/// (`api/v3rpc/rpctypes`), shared by 3.4, 3.5 and 3.6.
pub(crate) fn classify_status(code: &str, message: &str, member_id: u64) -> EtcdError {
    let m = message.trim_start_matches("etcdserver: ");
    if m.starts_with("can only promote a learner member which is in sync with leader") {
        EtcdError::NotInSync { member_id }
    } else if m.starts_with("can only promote a learner member") {
        EtcdError::NotALearner { member_id }
    } else if m.starts_with("member not found") {
        EtcdError::MemberNotFound { member_id }
    } else if m.starts_with("too many learner members in cluster") {
        EtcdError::TooManyLearners
    } else if m.starts_with("Peer URLs already exists") || m.starts_with("member ID already exist")
    {
        // The second form: a retried add of the same peer URLs within the
        // same second computes the same member id.
        EtcdError::MemberExists(message.to_string())
    } else if m.starts_with("unhealthy cluster")
        || m.starts_with("re-configuration failed due to not enough started members")
    {
        EtcdError::UnhealthyCluster(message.to_string())
    } else if m.starts_with("no leader")
        || m.starts_with("leader changed")
        || m.starts_with("not leader")
    {
        EtcdError::NoLeader(message.to_string())
    } else if m.starts_with("request timed out") {
        EtcdError::Timeout {
            op: "etcd request",
            after: Duration::ZERO,
        }
    } else if code == "Unavailable" || code == "Unknown" && looks_like_tls(message) {
        transport(message)
    } else if code == "Cancelled" && message.contains("operation was canceled") {
        // The client's own words (not etcd's "context canceled") for a
        // connection that died under the request: a tunnel cut or refused.
        EtcdError::Unreachable(message.to_string())
    } else {
        EtcdError::Rpc {
            code: code.to_string(),
            message: message.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_lost_under_a_request_is_unreachable() {
        assert!(matches!(
            classify_status("Cancelled", "operation was canceled: connection closed", 0),
            EtcdError::Unreachable(_)
        ));
        assert!(matches!(
            classify_status("Cancelled", "context canceled", 0),
            EtcdError::Rpc { .. }
        ));
    }

    #[test]
    fn etcd_error_strings_map_to_variants() {
        let cases = [
            (
                "FailedPrecondition",
                "etcdserver: can only promote a learner member which is in sync with leader",
                "LearnerNotInSync",
            ),
            (
                "FailedPrecondition",
                "etcdserver: can only promote a learner member",
                "NotALearner",
            ),
            ("NotFound", "etcdserver: member not found", "MemberNotFound"),
            (
                "FailedPrecondition",
                "etcdserver: too many learner members in cluster",
                "TooManyLearners",
            ),
            (
                "FailedPrecondition",
                "etcdserver: Peer URLs already exists",
                "MemberExists",
            ),
            (
                "FailedPrecondition",
                "etcdserver: member ID already exist",
                "MemberExists",
            ),
            (
                "Unavailable",
                "etcdserver: unhealthy cluster",
                "UnhealthyCluster",
            ),
            (
                "FailedPrecondition",
                "etcdserver: re-configuration failed due to not enough started members",
                "UnhealthyCluster",
            ),
            ("Unavailable", "etcdserver: no leader", "NoLeader"),
            ("Unavailable", "etcdserver: request timed out", "Timeout"),
            (
                "Unavailable",
                "error trying to connect: tcp connect error",
                "Unreachable",
            ),
            (
                "Unknown",
                "transport error: invalid peer certificate: UnknownIssuer",
                "TLSError",
            ),
            (
                "PermissionDenied",
                "etcdserver: permission denied",
                "RPCError",
            ),
        ];
        for (code, message, reason) in cases {
            assert_eq!(
                classify_status(code, message, 7).reason(),
                reason,
                "{message}"
            );
        }
    }

    #[test]
    fn transient_errors_are_the_retryable_ones() {
        assert!(EtcdError::UnhealthyCluster(String::new()).is_transient());
        assert!(EtcdError::NotInSync { member_id: 1 }.is_transient());
        assert!(!EtcdError::TooManyLearners.is_transient());
        assert!(!EtcdError::MemberNotFound { member_id: 1 }.is_transient());
    }
}
