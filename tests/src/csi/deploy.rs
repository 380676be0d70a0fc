//! What a real-node world runs for the test CSI driver on one workload
//! plane: the driver's controller socket with `csi-provisioner` and
//! `csi-resizer` (processes of the test, as a controller Deployment's
//! containers would be), the `CSIDriver` object, and a StorageClass that
//! allows expansion. The node half runs inside each node
//! (`crate::real_node::node`, [`NodeCsi`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::Client;
use kube::api::{Api, PostParams};

use super::DRIVER_NAME;
use crate::etcd_harness::workspace_root;
use crate::etcd_harness::{EtcdProcess, ProcessSpec};

/// The StorageClass of the driver every world with CSI gets (expandable).
pub const CSI_CLASS: &str = "csi-hostpath";

/// The driver binary and the sidecars `hack/upstream/build.sh csi-sidecars`
/// built.
#[derive(Debug, Clone)]
pub struct CsiTools {
    /// `csi_hostpath` (`env!("CARGO_BIN_EXE_csi_hostpath")` of a test).
    pub driver: PathBuf,
    /// `.tools/csi-sidecars`: `csi-provisioner`, `csi-resizer`.
    pub sidecars: PathBuf,
}

impl CsiTools {
    /// The driver named by a test, with the sidecars the test command built;
    /// fails naming what is missing.
    pub fn locate(driver: &str) -> Result<CsiTools> {
        let tools = CsiTools {
            driver: PathBuf::from(driver),
            sidecars: workspace_root().join(".tools/csi-sidecars"),
        };
        for bin in [
            tools.driver.clone(),
            tools.sidecars.join("csi-provisioner"),
            tools.sidecars.join("csi-resizer"),
        ] {
            if !bin.is_file() {
                bail!(
                    "{} is missing (hack/upstream/build.sh csi-sidecars, cargo build -p etcdfleet-tests)",
                    bin.display()
                );
            }
        }
        Ok(tools)
    }
}

/// What one node runs of the driver: written into the node's directory and
/// started by the node script in the node's namespaces.
#[derive(Debug, Clone)]
pub struct NodeCsi {
    pub driver: PathBuf,
    /// The plane's volume store (shared by its nodes).
    pub store: PathBuf,
}

impl NodeCsi {
    /// The node driver's command line, one argument per line (the node
    /// script reads it with `mapfile`), for a kubelet whose root is
    /// `kubelet_root`.
    pub fn command(&self, node: &str, kubelet_root: &Path) -> String {
        // Short names: a unix socket's path has at most 107 bytes, and the
        // node directory's name is long already.
        let socket = kubelet_root.join("plugins/etcdfleet-csi/csi.sock");
        // The kubelet dials this socket with its path as the HTTP/2
        // authority, percent-encoded (grpc-go's `encodeAuthority`: `/`
        // becomes `%2F`). The `http` crate under tonic accepts `%` in an
        // authority only in its user-info part, before an `@`, and refuses
        // the stream otherwise (RST_STREAM PROTOCOL_ERROR): the name's `@`
        // makes the encoded directories user-info and the rest a host name.
        let registration = kubelet_root.join("plugins_registry/reg@csi.sock");
        let args = [
            self.driver.display().to_string(),
            "node".into(),
            "--store".into(),
            self.store.display().to_string(),
            "--socket".into(),
            socket.display().to_string(),
            "--node-id".into(),
            node.into(),
            "--registration".into(),
            registration.display().to_string(),
            "--node-expansion".into(),
        ];
        args.join("\n") + "\n"
    }
}

/// The controller half of the driver on one plane.
pub struct CsiDeployment {
    processes: Vec<EtcdProcess>,
}

impl CsiDeployment {
    /// Starts the driver's controller socket and both sidecars against the
    /// plane's API server (`kubeconfig`), and creates the `CSIDriver`
    /// (no attach: volumes are published where the pod runs) and
    /// [`CSI_CLASS`].
    pub async fn start(
        tools: &CsiTools,
        store: &Path,
        dir: &Path,
        kubeconfig: &Path,
        client: &Client,
    ) -> Result<CsiDeployment> {
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("controller.sock");
        let driver = EtcdProcess::spawn(&ProcessSpec {
            binary: tools.driver.clone(),
            args: vec![
                "controller".into(),
                "--store".into(),
                store.display().to_string(),
                "--socket".into(),
                socket.display().to_string(),
                "--node-expansion".into(),
            ],
            env: vec![],
            log_file: dir.join("driver.log"),
            hosts_file: None,
        })?;
        let sidecar = |name: &str| {
            EtcdProcess::spawn(&ProcessSpec {
                binary: tools.sidecars.join(name),
                args: vec![
                    format!("--csi-address={}", socket.display()),
                    format!("--kubeconfig={}", kubeconfig.display()),
                    "--leader-election=false".into(),
                    "--timeout=30s".into(),
                    "--v=2".into(),
                ],
                env: vec![],
                log_file: dir.join(format!("{name}.log")),
                hosts_file: None,
            })
        };
        let processes = vec![driver, sidecar("csi-provisioner")?, sidecar("csi-resizer")?];
        create_objects(client).await?;
        Ok(CsiDeployment { processes })
    }

    /// The last lines of the driver's and the sidecars' logs.
    pub fn log_tails(&self, lines: usize) -> String {
        self.processes
            .iter()
            .map(|p| {
                format!(
                    "\n--- {} ---\n{}",
                    p.log_file().display(),
                    p.log_tail(lines)
                )
            })
            .collect()
    }
}

async fn create_objects(client: &Client) -> Result<()> {
    let driver: CSIDriver = serde_json::from_value(serde_json::json!({
        "metadata": {"name": DRIVER_NAME},
        "spec": {
            "attachRequired": false,
            "podInfoOnMount": false,
            "fsGroupPolicy": "None",
            "volumeLifecycleModes": ["Persistent"],
        },
    }))?;
    Api::<CSIDriver>::all(client.clone())
        .create(&PostParams::default(), &driver)
        .await
        .context("creating the CSIDriver")?;
    let class: StorageClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": CSI_CLASS},
        "provisioner": DRIVER_NAME,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": true,
    }))?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .context("creating the CSI StorageClass")?;
    Ok(())
}

/// Waits until every node's kubelet registered the driver (its `CSINode`
/// names it): before that a pod's volume cannot be published there.
pub async fn wait_registered(client: &Client, nodes: &[String], timeout: Duration) -> Result<()> {
    let api: Api<CSINode> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        let mut missing = vec![];
        for node in nodes {
            let drivers = api.get_opt(node).await?.map(|n| n.spec.drivers);
            if !drivers.is_some_and(|d| d.iter().any(|d| d.name == DRIVER_NAME)) {
                missing.push(node.clone());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the kubelets of {missing:?} did not register {DRIVER_NAME} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
