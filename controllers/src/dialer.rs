//! How the controller reaches an etcd member's client port.
//!
//! Members advertise client URLs with their in-cluster DNS names
//! (`https://<pod>.<peer-service>.<namespace>.svc:2379`). An [`EtcdDialer`]
//! turns such a URL into one the controller can connect to. The
//! [`DirectDialer`] uses the URL as it is, for management clusters whose
//! network reaches workload pods and resolves their names; tests use a dialer
//! that maps names onto loopback addresses. TLS is verified against the
//! client Service name, which every member's server certificate carries, so
//! the dialed address never has to appear in a certificate.

/// Maps a member's advertised client URL onto a reachable URL.
pub trait EtcdDialer: Send + Sync {
    /// `workload` is the workload API server URL (it identifies the cluster,
    /// since two clusters may use the same pod names).
    fn dial_url(&self, workload: &str, advertised: &str) -> Result<String, String>;
}

/// Uses advertised URLs unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectDialer;

impl EtcdDialer for DirectDialer {
    fn dial_url(&self, _workload: &str, advertised: &str) -> Result<String, String> {
        Ok(advertised.to_string())
    }
}
