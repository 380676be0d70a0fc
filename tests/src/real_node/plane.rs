//! One plane's real Nodes with its cluster DNS and addresses: what a world
//! holds per plane (`crate::control_plane::Nodes::Real`), and what a test
//! reads from them (logs, a container's memory).

use super::dns::ClusterDns;
use super::network::PlaneAddresses;
use super::node::RealNode;

/// One plane's real Nodes and its cluster DNS.
pub struct RealNodes {
    pub nodes: Vec<RealNode>,
    pub dns: ClusterDns,
    pub addresses: PlaneAddresses,
    /// The test CSI driver's controller half, when the world runs it.
    pub csi: Option<crate::csi::deploy::CsiDeployment>,
}

impl RealNodes {
    /// The peak memory of a container (its pod status' `containerID`) on
    /// whichever node runs it; see [`RealNode::container_memory_peak`].
    pub fn container_memory_peak(&self, container_id: &str) -> Option<u64> {
        let id = container_id.trim_start_matches("containerd://");
        self.nodes.iter().find_map(|n| n.container_memory_peak(id))
    }

    /// The last lines of every node's logs and of CoreDNS's.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out: String = self.nodes.iter().map(|n| n.log_tails(lines)).collect();
        out.push_str(&format!("\n--- coredns ---\n{}", self.dns.log_tail(lines)));
        if let Some(csi) = &self.csi {
            out.push_str(&csi.log_tails(lines));
        }
        out
    }
}
