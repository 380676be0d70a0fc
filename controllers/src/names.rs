//! How the objects of one etcd cluster are named, in the management and the
//! workload cluster: deterministic names (`<cluster>-etcd-<ordinal>`), the
//! members' DNS names and URLs, and the labels that select their pods.

use std::collections::BTreeMap;

pub const CLIENT_PORT: u16 = 2379;
pub const PEER_PORT: u16 = 2380;

/// Deterministic names of everything one EtcdCluster owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub cluster: String,
    pub namespace: String,
}

impl Names {
    pub fn new(cluster: &str, namespace: &str) -> Self {
        Names {
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
        }
    }
    pub fn statefulset(&self) -> String {
        format!("{}-etcd", self.cluster)
    }
    pub fn peer_service(&self) -> String {
        format!("{}-etcd-peer", self.cluster)
    }
    pub fn client_service(&self) -> String {
        format!("{}-etcd-client", self.cluster)
    }
    pub fn members_configmap(&self) -> String {
        format!("{}-etcd-members", self.cluster)
    }
    /// The CAs the cluster's clients should trust (workload namespace).
    pub fn ca_bundle_configmap(&self) -> String {
        format!("{}-etcd-ca-bundle", self.cluster)
    }
    pub fn pdb(&self) -> String {
        format!("{}-etcd", self.cluster)
    }
    pub fn server_tls_secret(&self) -> String {
        format!("{}-etcd-server-tls", self.cluster)
    }
    pub fn peer_tls_secret(&self) -> String {
        format!("{}-etcd-peer-tls", self.cluster)
    }
    /// Management-cluster Secret with the CA and the controller's client identity.
    /// Object-store credentials the restore seeder of member 0 reads.
    pub fn restore_secret(&self) -> String {
        format!("{}-etcd-restore", self.cluster)
    }
    /// A restore drill's pod, and its credentials Secret (workload
    /// namespace; `ordinal_of` never takes it for a member).
    pub fn drill_pod(&self) -> String {
        format!("{}-etcd-drill", self.cluster)
    }
    pub fn pki_secret(&self) -> String {
        format!("{}-etcd-pki", self.cluster)
    }
    pub fn pod(&self, ordinal: u32) -> String {
        format!("{}-etcd-{ordinal}", self.cluster)
    }
    pub fn pvc(&self, ordinal: u32) -> String {
        format!("data-{}", self.pod(ordinal))
    }
    /// Ordinal of a pod or member name of this cluster.
    pub fn ordinal_of(&self, pod_name: &str) -> Option<u32> {
        pod_name
            .strip_prefix(&format!("{}-etcd-", self.cluster))
            .and_then(|s| s.parse().ok())
    }
    /// In-cluster DNS name of a member.
    pub fn member_host(&self, ordinal: u32) -> String {
        format!(
            "{}.{}.{}.svc",
            self.pod(ordinal),
            self.peer_service(),
            self.namespace
        )
    }
    /// DNS name of the client Service; every member's server certificate carries it,
    /// and the controller verifies TLS against it.
    pub fn client_service_host(&self) -> String {
        format!("{}.{}.svc", self.client_service(), self.namespace)
    }
    pub fn peer_url(&self, ordinal: u32, tls: bool) -> String {
        format!(
            "{}://{}:{PEER_PORT}",
            scheme(tls),
            self.member_host(ordinal)
        )
    }
    pub fn client_url(&self, ordinal: u32, tls: bool) -> String {
        format!(
            "{}://{}:{CLIENT_PORT}",
            scheme(tls),
            self.member_host(ordinal)
        )
    }
    /// Ordinal of the member whose peer URL this is.
    pub fn ordinal_of_peer_url(&self, url: &str) -> Option<u32> {
        let host = url.split("://").nth(1)?.split(':').next()?;
        let pod = host.split('.').next()?;
        if host != format!("{pod}.{}.{}.svc", self.peer_service(), self.namespace) {
            return None;
        }
        self.ordinal_of(pod)
    }
    /// SANs of the server/peer certificate shared by all members.
    pub fn member_dns_names(&self) -> Vec<String> {
        vec![
            format!("*.{}.{}.svc", self.peer_service(), self.namespace),
            format!(
                "*.{}.{}.svc.cluster.local",
                self.peer_service(),
                self.namespace
            ),
            self.client_service_host(),
            format!("{}.cluster.local", self.client_service_host()),
            "localhost".to_string(),
        ]
    }
}

/// `https` with TLS, else `http`.
pub fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// Labels selecting the pods of one cluster.
pub fn selector_labels(names: &Names) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "etcd".to_string()),
        (
            "app.kubernetes.io/instance".to_string(),
            names.cluster.clone(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "etcdfleet".to_string(),
        ),
    ])
}

/// `app.kubernetes.io/...=...` selector string for list calls and `/scale`.
pub fn selector_string(names: &Names) -> String {
    selector_labels(names)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
