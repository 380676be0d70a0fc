//! The pod network of a real-node world, inside the test's own network
//! namespace ([`super::isolation::run_isolated`]):
//!
//! - one Linux bridge, `10.244.0.1/16` on it: the gateway every pod routes
//!   through to reach the test's processes (API servers, cluster DNS);
//! - each Node's address on the same bridge (`10.244.0.<10+k>`): what the Node
//!   reports as its InternalIP, where its kubelet serves (the API server
//!   dials it there for logs and port-forward);
//! - each Node's pod range `10.244.<1+k>.2-254` (CNI `host-local`), with the
//!   whole `/16` as the pods' subnet, so pods of different nodes reach each
//!   other on the bridge directly (no routing between node subnets);
//! - per plane `j`, a service range `10.96.<j>.0/24` (`--service-cluster-ip-
//!   range`): the `kubernetes` Service's IP `10.96.<j>.1:443` is translated to
//!   that plane's API server (the one rule kube-proxy would write; there is no
//!   kube-proxy), and `10.96.<j>.10` is on the bridge for its CoreDNS.
//!
//! No address here exists outside the test's namespace: the kernel removes
//! the bridge, the addresses and the rule when the test process ends.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, Result, ensure};
use serde_json::json;

use super::isolation::{in_own_network, ip};

/// The bridge every pod of the world is attached to.
pub const BRIDGE: &str = "etcdfleet0";
/// The pods' gateway and the address pods reach the test's processes at.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The CNI network's name (and its `host-local` data directory's).
const NETWORK_NAME: &str = "etcdfleet";
/// At most this many Nodes per world (each has its own /24 of pod addresses).
const MAX_NODES: u8 = 200;

/// The addresses of one plane, `j`-th of its world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaneAddresses {
    /// `--service-cluster-ip-range`.
    pub service_cidr: String,
    /// The `kubernetes` Service's ClusterIP (port 443).
    pub api_service_ip: Ipv4Addr,
    /// The cluster DNS address the plane's kubelets write into pods.
    pub dns_ip: Ipv4Addr,
}

impl PlaneAddresses {
    pub fn of_plane(j: u8) -> PlaneAddresses {
        PlaneAddresses {
            service_cidr: format!("10.96.{j}.0/24"),
            api_service_ip: Ipv4Addr::new(10, 96, j, 1),
            dns_ip: Ipv4Addr::new(10, 96, j, 10),
        }
    }
}

/// The pod network: the bridge, and which node and plane numbers are taken.
pub struct PodNetwork {
    next: Mutex<(u8, u8)>,
}

impl PodNetwork {
    /// Creates the bridge with the gateway address. Refuses to run in the
    /// machine's own network namespace.
    pub fn create() -> Result<PodNetwork> {
        ensure!(
            in_own_network()?,
            "the pod network is made only inside a test's own network namespace (run_isolated)"
        );
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{GATEWAY}/16"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        Ok(PodNetwork {
            next: Mutex::new((0, 0)),
        })
    }

    /// The next Node's number `k` and address (added to the bridge).
    pub fn add_node(&self) -> Result<(u8, Ipv4Addr)> {
        let k = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            ensure!(
                next.0 < MAX_NODES,
                "more than {MAX_NODES} nodes in one world"
            );
            next.0 += 1;
            next.0 - 1
        };
        let address = Ipv4Addr::new(10, 244, 0, 10 + k);
        ip(&["addr", "add", &format!("{address}/16"), "dev", BRIDGE])?;
        Ok((k, address))
    }

    /// The next plane's addresses; its DNS address is put on the bridge.
    pub fn add_plane(&self) -> Result<PlaneAddresses> {
        let j = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            next.1 += 1;
            next.1 - 1
        };
        let addresses = PlaneAddresses::of_plane(j);
        ip(&[
            "addr",
            "add",
            &format!("{}/32", addresses.dns_ip),
            "dev",
            BRIDGE,
        ])?;
        Ok(addresses)
    }

    /// Routes the plane's `kubernetes` Service (`api_service_ip:443`) to its
    /// API server, which listens on every address of the test's namespace.
    pub fn route_api_service(&self, addresses: &PlaneAddresses, api_port: u16) -> Result<()> {
        let status = Command::new("iptables")
            .args(["-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-d"])
            .arg(format!("{}/32", addresses.api_service_ip))
            .args(["--dport", "443", "-j", "DNAT", "--to-destination"])
            .arg(format!("{GATEWAY}:{api_port}"))
            .status()
            .context("running iptables (Debian package iptables)")?;
        ensure!(
            status.success(),
            "iptables DNAT for the kubernetes Service: {status}"
        );
        Ok(())
    }
}

/// The CNI configuration of Node `k`: the world's bridge, `host-local`
/// addresses from the node's own range (state in `ipam_dir`), a default
/// route through the gateway. No masquerading: nothing leaves the namespace.
pub fn cni_config(k: u8, ipam_dir: &std::path::Path) -> String {
    let third = k + 1;
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                "ranges": [[{
                    "subnet": "10.244.0.0/16",
                    "rangeStart": format!("10.244.{third}.2"),
                    "rangeEnd": format!("10.244.{third}.254"),
                    "gateway": GATEWAY.to_string(),
                }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
            },
        }],
    })
    .to_string()
}
