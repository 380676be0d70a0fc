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
//! - [`run_isolated`]: a test's network namespace of its own. Every address
//!   a real-node world uses (the bridge, node and pod IPs, the API servers'
//!   service IPs, cluster DNS) lives there, and the kernel removes the bridge,
//!   its addresses and every iptables rule when the test process ends, however
//!   it ends.
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

pub mod dns;
pub mod network;
pub mod node;
pub mod registry;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

pub use dns::ClusterDns;
pub use network::{PlaneAddresses, PodNetwork};
pub use node::{NodeSpec, RealNode};
pub use registry::{LocalRegistry, NodeImage};

use crate::control_plane::KubeBinaries;
use crate::etcd_harness::workspace_root;

/// Where the Debian packages install the node runtime.
const CONTAINERD: &str = "/usr/bin/containerd";
const RUNC: &str = "/usr/sbin/runc";
const CNI_DIR: &str = "/usr/lib/cni";
const REGISTRY: &str = "/usr/bin/docker-registry";

/// The binaries and images real nodes run, as the test command installs
/// them (`hack/install-tools.sh`).
#[derive(Debug, Clone)]
pub struct NodeTools {
    pub kubelet: PathBuf,
    pub containerd: PathBuf,
    pub runc: PathBuf,
    pub cni_dir: PathBuf,
    pub registry: PathBuf,
    pub coredns: PathBuf,
    /// `.tools/node-images`: one OCI layout per image.
    pub images_dir: PathBuf,
}

impl NodeTools {
    pub fn locate(binaries: &KubeBinaries) -> NodeTools {
        NodeTools {
            kubelet: binaries.dir.join("kubelet"),
            containerd: CONTAINERD.into(),
            runc: RUNC.into(),
            cni_dir: CNI_DIR.into(),
            registry: REGISTRY.into(),
            coredns: workspace_root().join(".tools/coredns/coredns"),
            images_dir: workspace_root().join(".tools/node-images"),
        }
    }

    fn missing(&self) -> Option<PathBuf> {
        let cni = ["bridge", "host-local", "loopback"].map(|p| self.cni_dir.join(p));
        [
            &self.kubelet,
            &self.containerd,
            &self.runc,
            &self.registry,
            &self.coredns,
        ]
        .into_iter()
        .cloned()
        .chain(cni)
        .find(|p| !p.is_file())
    }

    /// Every image `hack/upstream/node-images.sh` built.
    pub fn images(&self) -> Result<Vec<NodeImage>> {
        NodeImage::all_in(&self.images_dir)
    }

    /// The one-line versions of kubelet, containerd and runc, for the suite log.
    pub fn versions(&self) -> Result<String> {
        let first_line = |bin: &Path, arg: &str| -> Result<String> {
            let out = Command::new(bin)
                .arg(arg)
                .output()
                .with_context(|| format!("{} {arg}", bin.display()))?;
            let text = String::from_utf8_lossy(&out.stdout);
            Ok(text.lines().next().unwrap_or_default().trim().to_string())
        };
        Ok(format!(
            "kubelet {}; {}; {}",
            first_line(&self.kubelet, "--version")?,
            first_line(&self.containerd, "--version")?,
            first_line(&self.runc, "--version")?,
        ))
    }
}

/// The node tools, or `None` after a loud `SKIPPED:` line when one is
/// missing; under `ETCDFLEET_REQUIRE_ETCD=1` a missing tool panics.
pub fn require_real_nodes(binaries: &KubeBinaries) -> Option<NodeTools> {
    let tools = NodeTools::locate(binaries);
    let Some(missing) = tools.missing() else {
        return Some(tools);
    };
    let message = format!(
        "real node tool {} not found (run hack/install-tools.sh)",
        missing.display()
    );
    if std::env::var("ETCDFLEET_REQUIRE_ETCD").as_deref() == Ok("1") {
        panic!("ETCDFLEET_REQUIRE_ETCD=1 but {message}");
    }
    eprintln!("SKIPPED: {message}");
    None
}

/// Runs `test` in a network namespace of its own: this thread leaves the
/// machine's network namespace (`unshare(CLONE_NEWNET)`, which moves the
/// calling thread only), brings up its loopback, then builds the tokio
/// runtime, whose threads (and every process they spawn) start inside it.
/// Panics when the test fails, like a `#[tokio::test]`.
pub fn run_isolated<F, Fut>(test: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    enter_own_network().expect("a network namespace for the test");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(test()) {
        panic!("{e:?}");
    }
}

/// The network namespace the test process started in (read before it left).
static MACHINE_NETWORK: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn enter_own_network() -> Result<()> {
    let machine = std::fs::read_link("/proc/thread-self/ns/net").context("own netns")?;
    let _ = MACHINE_NETWORK.set(machine);
    // SAFETY: a plain syscall on the calling thread.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        bail!(
            "unshare(CLONE_NEWNET) (real nodes need root): {}",
            std::io::Error::last_os_error()
        );
    }
    network::ip(&["link", "set", "lo", "up"])?;
    ensure!(
        in_own_network()?,
        "the thread is still in the machine's network namespace"
    );
    Ok(())
}

/// Whether the calling thread runs in a network namespace [`run_isolated`]
/// made (not the one the test process started in): the pod network is only
/// ever made there.
pub fn in_own_network() -> Result<bool> {
    let own = std::fs::read_link("/proc/thread-self/ns/net").context("own netns")?;
    Ok(MACHINE_NETWORK.get().is_some_and(|machine| *machine != own))
}
