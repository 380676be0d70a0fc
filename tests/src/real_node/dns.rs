//! Cluster DNS of one plane: CoreDNS (built by the test command from its Go
//! module with the `kubernetes` plugin) as a process of the test, answering
//! `cluster.local` from the plane's API server (Services and the
//! EndpointSlices of kube-controller-manager's `endpointslice` controller) on
//! the plane's DNS address, which its kubelets write into every pod's
//! `resolv.conf`. It also answers the reverse zone, as a cluster's DNS does:
//! etcd checks a connecting peer's certificate against the names a reverse
//! lookup of the peer's address gives (the members' certificates name
//! `*.<cluster>-etcd-peer.<ns>.svc`, never a pod IP). Other names are
//! refused: nothing outside is reachable.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::etcd_harness::{EtcdProcess, ProcessSpec};

/// The zone the kubelets are configured with (`clusterDomain`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// A running CoreDNS.
pub struct ClusterDns {
    process: EtcdProcess,
    address: Ipv4Addr,
}

impl ClusterDns {
    /// Starts `coredns` on `address:53` for the plane whose admin kubeconfig
    /// is `kubeconfig`; its files go into `dir`.
    pub async fn start(
        coredns: &Path,
        address: Ipv4Addr,
        kubeconfig: &Path,
        dir: &Path,
    ) -> Result<ClusterDns> {
        let corefile = dir.join("Corefile");
        std::fs::write(
            &corefile,
            format!(
                "{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{\n  bind {address}\n  errors\n  \
                 kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{\n    kubeconfig {}\n    ttl 1\n  }}\n}}\n",
                kubeconfig.display()
            ),
        )?;
        let process = EtcdProcess::spawn(&ProcessSpec {
            binary: coredns.to_path_buf(),
            args: vec!["-conf".into(), corefile.display().to_string()],
            env: vec![],
            log_file: dir.join("coredns.log"),
            hosts_file: None,
        })?;
        let dns = ClusterDns { process, address };
        dns.wait_serving(Duration::from_secs(30)).await?;
        Ok(dns)
    }

    async fn wait_serving(&self, timeout: Duration) -> Result<()> {
        let addr = SocketAddr::from((self.address, 53));
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if !self.process.is_running() {
                bail!("CoreDNS exited:\n{}", self.process.log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "CoreDNS not serving on {addr}:\n{}",
            self.process.log_tail(20)
        )
    }

    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}
