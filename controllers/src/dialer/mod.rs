//! How the controller reaches an etcd member's client port.
//!
//! Members advertise client URLs with their in-cluster DNS names
//! (`https://<pod>.<peer-service>.<namespace>.svc:2379`). An [`EtcdDialer`]
//! opens a byte stream to the member such a URL names; the etcd client runs
//! gRPC and TLS over that stream (see [`crate::etcd::transport`]), verifying
//! the server certificate against the client Service name, which every
//! member's certificate carries, so the path the bytes take never has to
//! appear in a certificate.
//!
//! - [`PortForwardDialer`] (the default) opens one `pods/portforward` stream
//!   ([`Tunnel`]) through the workload API server per connection: the
//!   management cluster needs no route to workload pod networks, only the API
//!   server access it already has. The kubeconfig's identity needs `create`
//!   (and `get` on API servers before 1.30) on `pods/portforward` in the
//!   workload namespace.
//! - [`DirectDialer`] connects over TCP to the advertised host and port, for
//!   management clusters whose network reaches workload pods and resolves
//!   their names.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use http::Uri;

mod tunnel;

pub use tunnel::Tunnel;

pub use crate::config::DialerKind;
use crate::connector::WorkloadCluster;
use crate::etcd::{EtcdStream, Transport};

/// Opens byte streams to etcd members of workload clusters.
pub trait EtcdDialer: Send + Sync {
    /// Short name of the way this dialer reaches members (logs, cache keys).
    fn kind(&self) -> &'static str;

    /// One stream to the member behind `member` (its advertised client URL)
    /// in `workload`.
    fn dial(
        &self,
        workload: &WorkloadCluster,
        member: &Uri,
    ) -> BoxFuture<'static, io::Result<EtcdStream>>;
}

/// The transport the etcd client of one workload cluster uses.
pub fn transport(dialer: Arc<dyn EtcdDialer>, workload: &WorkloadCluster) -> Transport {
    let label = format!("{} via {}", dialer.kind(), workload.server);
    let workload = workload.clone();
    Transport::new(label, move |uri: Uri| dialer.dial(&workload, &uri))
}

/// The dialer a [`DialerKind`] names.
impl DialerKind {
    pub fn build(self) -> Arc<dyn EtcdDialer> {
        match self {
            DialerKind::Direct => Arc::new(DirectDialer),
            DialerKind::PortForward => Arc::new(PortForwardDialer::default()),
        }
    }
}

/// The pod and port a member's client URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberAddress {
    pub pod: String,
    pub namespace: String,
    pub port: u16,
}

impl MemberAddress {
    /// Parses `<pod>.<service>.<namespace>.svc[.<domain>]:<port>`.
    pub fn of(uri: &Uri) -> io::Result<Self> {
        let invalid = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{uri} does not name a member pod: {why}"),
            )
        };
        let host = uri.host().ok_or_else(|| invalid("no host"))?;
        let labels: Vec<&str> = host.split('.').collect();
        if labels.len() < 4 || labels[3] != "svc" || labels[..3].iter().any(|l| l.is_empty()) {
            return Err(invalid(
                "expected <pod>.<service>.<namespace>.svc as the host",
            ));
        }
        Ok(MemberAddress {
            pod: labels[0].to_string(),
            namespace: labels[2].to_string(),
            port: uri.port_u16().ok_or_else(|| invalid("no port"))?,
        })
    }
}

/// Connects over TCP to the advertised host and port.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectDialer;

impl EtcdDialer for DirectDialer {
    fn kind(&self) -> &'static str {
        "direct"
    }

    fn dial(
        &self,
        _workload: &WorkloadCluster,
        member: &Uri,
    ) -> BoxFuture<'static, io::Result<EtcdStream>> {
        Transport::tcp().dial(member.clone())
    }
}

/// Picks the API client that serves `pods/portforward` for a workload
/// cluster (tests whose workload API serves only part of the protocol).
pub type PortForwardApi = Arc<dyn Fn(&WorkloadCluster) -> Option<kube::Client> + Send + Sync>;

/// Reaches members through the workload API server's `pods/portforward`
/// (websocket), one stream per connection.
#[derive(Default)]
pub struct PortForwardDialer {
    opened: Arc<AtomicU64>,
    api: Option<PortForwardApi>,
}

impl std::fmt::Debug for PortForwardDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortForwardDialer")
            .field("opened", &self.opened)
            .finish_non_exhaustive()
    }
}

impl PortForwardDialer {
    /// Port-forwards through the client `api` picks instead of the workload
    /// cluster's own (falling back to it when `api` picks none).
    pub fn with_api(api: PortForwardApi) -> Self {
        PortForwardDialer {
            opened: Arc::default(),
            api: Some(api),
        }
    }

    /// Tunnels opened so far (a metric, and how tests see reuse).
    pub fn tunnels_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}

impl EtcdDialer for PortForwardDialer {
    fn kind(&self) -> &'static str {
        "portForward"
    }

    fn dial(
        &self,
        workload: &WorkloadCluster,
        member: &Uri,
    ) -> BoxFuture<'static, io::Result<EtcdStream>> {
        let client = self
            .api
            .as_ref()
            .and_then(|api| api(workload))
            .unwrap_or_else(|| workload.client.clone());
        let server = workload.server.clone();
        let member = member.clone();
        let opened = self.opened.clone();
        Box::pin(async move {
            let address = MemberAddress::of(&member)?;
            let tunnel = Tunnel::open(&client, &address.namespace, &address.pod, address.port)
                .await
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "port-forward to pod {}/{} port {} through {server}: {e}",
                            address.namespace, address.pod, address.port
                        ),
                    )
                })?;
            opened.fetch_add(1, Ordering::Relaxed);
            Ok(Box::new(tunnel) as EtcdStream)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_address_is_read_from_the_advertised_client_url() {
        let uri: Uri = "https://c-etcd-2.c-etcd-peer.etcd-ns.svc:2379"
            .parse()
            .unwrap();
        assert_eq!(
            MemberAddress::of(&uri).unwrap(),
            MemberAddress {
                pod: "c-etcd-2".into(),
                namespace: "etcd-ns".into(),
                port: 2379
            }
        );
        let long: Uri = "http://p.s.n.svc.cluster.local:2379".parse().unwrap();
        assert_eq!(MemberAddress::of(&long).unwrap().namespace, "n");
    }

    #[test]
    fn urls_that_name_no_member_pod_are_refused() {
        for url in [
            "https://10.0.0.3:2379",
            "https://c-etcd-0.c-etcd-peer.ns.svc",
            "https://c-etcd-client.ns.svc:2379",
        ] {
            let uri: Uri = url.parse().unwrap();
            assert!(MemberAddress::of(&uri).is_err(), "{url}");
        }
    }

    #[test]
    fn dialer_kind_parses_the_config_spelling() {
        assert_eq!("direct".parse::<DialerKind>(), Ok(DialerKind::Direct));
        assert_eq!(
            "portForward".parse::<DialerKind>(),
            Ok(DialerKind::PortForward)
        );
        assert!("port-forward".parse::<DialerKind>().is_err());
        assert_eq!(DialerKind::default(), DialerKind::PortForward);
    }
}
