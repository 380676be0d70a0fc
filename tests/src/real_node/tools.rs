//! What real nodes run, as the test command installs it
//! (`hack/install-tools.sh`): kubelet from the Kubernetes pin, Debian's
//! containerd, runc, CNI plugins and registry, CoreDNS, and the images
//! `hack/upstream/node-images.sh` built; and the suites' gate on them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::registry::NodeImage;
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
