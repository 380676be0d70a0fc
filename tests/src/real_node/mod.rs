//! Real nodes for the real control-plane tier: each Node of a plane is a real
//! kubelet (built from the Kubernetes pin, `hack/upstream/build.sh`) with a
//! containerd of its own (Debian's 1.6, runc under it), running the pods the
//! scheduler binds to it from OCI images pulled from a registry the test runs
//! on loopback. Nothing in a pod spec is rewritten: images keep the names the
//! product writes (`gcr.io/etcd-development/etcd:v3.6.16`,
//! `etcdfleet/controller:v0.2.0`) because every node's containerd uses the
//! test's registry as the mirror of every registry.
//!
//! This module owns what a real node needs beyond the control planes
//! (`crate::control_plane`):
//!
//! - [`isolation`]: [`run_isolated`], a test's network namespace of its
//!   own. Every address a real-node world uses (the bridge, node and pod IPs,
//!   the API servers' service IPs, cluster DNS) lives there, and the kernel
//!   removes the bridge, its addresses and every iptables rule when the test
//!   process ends, however it ends.
//! - [`tools`]: the binaries and images real nodes run
//!   ([`require_real_nodes`]).
//! - [`network`]: the pod network (one bridge, a pod range per node, the CNI
//!   configuration), the per-plane service addresses.
//! - [`registry`]: the distribution registry on loopback, and the images the
//!   test command built (`hack/upstream/node-images.sh`, `make image`) pushed
//!   into it.
//! - [`node`]: one Node: containerd and kubelet in a PID and mount namespace
//!   of their own, so the node, its shims, containers and mounts die together
//!   (with the test, or when a test stops the node).
//! - [`dns`]: CoreDNS per plane, answering `cluster.local` from that plane's
//!   API server (etcd peers resolve `<pod>.<cluster>-etcd-peer.<ns>.svc`).
//! - [`plane`]: [`RealNodes`], one plane's Nodes with its cluster DNS, as a
//!   world holds them.

pub mod dns;
pub mod isolation;
pub mod network;
pub mod node;
pub mod plane;
pub mod registry;
pub mod tools;

pub use dns::ClusterDns;
pub use isolation::{in_own_network, run_isolated};
pub use network::{PlaneAddresses, PodNetwork};
pub use node::{NodeSpec, RealNode};
pub use plane::RealNodes;
pub use registry::{LocalRegistry, NodeImage};
pub use tools::{NodeTools, require_real_nodes};
