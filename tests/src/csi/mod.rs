//! A CSI driver for the real tier whose volumes are directories of one host
//! directory every node of a world shares (as a network file system would),
//! so a volume follows its pod to any node. It is what the real tier's volume
//! growth needs and no served Go module offers (`hack/upstream/csi-sidecars`
//! builds the sidecars; the upstream host-path driver is not on the module
//! proxy): dynamic provisioning through `csi-provisioner`, online expansion
//! through `csi-resizer` and the kubelet's `NodeExpandVolume`, and the
//! kubelet's plugin registration, so real kubelets publish its volumes.
//!
//! - [`controller`]: the Identity and Controller services (`csi-provisioner`
//!   and `csi-resizer` call them on the controller socket).
//! - [`node`]: the Node service (bind mounts) and the kubelet's plugin
//!   registration, run inside a real node's mount namespace.
//! - [`deploy`]: what a world runs for the driver (processes, CSIDriver,
//!   StorageClass).
//!
//! A volume's size is a number the driver records (`<id>.bytes`); directories
//! have no size of their own. What the tests check is what Kubernetes
//! reports from the driver's answers: the claim's `status.capacity`.

pub mod controller;
pub mod deploy;
pub mod node;

use std::path::{Path, PathBuf};

use tonic::Status;

/// The generated CSI services (`tests/build.rs`).
#[allow(clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// The generated kubelet plugin registration service (`tests/build.rs`).
#[allow(clippy::all, clippy::pedantic)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// The driver's name (CSIDriver, StorageClass provisioner, PV `spec.csi.driver`).
pub const DRIVER_NAME: &str = "hostpath.csi.etcdfleet.dev";

/// A volume's size when a request names none.
const DEFAULT_BYTES: i64 = 1 << 30;

/// The shared directory holding every volume (`<id>/`) and its recorded
/// size (`<id>.bytes`).
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    /// The directory of volume `id`, refusing ids that are not one path segment.
    pub fn dir(&self, id: &str) -> Result<PathBuf, Status> {
        let plain = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
            && id != "."
            && id != "..";
        if !plain {
            return Err(Status::invalid_argument(format!("volume id {id:?}")));
        }
        Ok(self.root.join(id))
    }

    fn bytes_file(&self, id: &str) -> Result<PathBuf, Status> {
        Ok(self.root.join(format!("{}.bytes", self.dir(id)?.display())))
    }

    /// The recorded size of an existing volume; `NotFound` otherwise.
    pub fn size(&self, id: &str) -> Result<i64, Status> {
        if !self.dir(id)?.is_dir() {
            return Err(Status::not_found(format!("no volume {id}")));
        }
        let text = std::fs::read_to_string(self.bytes_file(id)?).map_err(internal)?;
        text.trim()
            .parse()
            .map_err(|e| Status::internal(format!("size of volume {id}: {e}")))
    }

    /// Records `bytes` as the size of `id`.
    pub fn set_size(&self, id: &str, bytes: i64) -> Result<(), Status> {
        write_atomic(&self.bytes_file(id)?, &bytes.to_string())
    }
}

/// The bytes a request asks for: its required size, else its limit, else
/// [`DEFAULT_BYTES`].
pub fn requested(range: Option<&proto::CapacityRange>) -> i64 {
    match range {
        Some(r) if r.required_bytes > 0 => r.required_bytes,
        Some(r) if r.limit_bytes > 0 => r.limit_bytes,
        _ => DEFAULT_BYTES,
    }
}

fn write_atomic(path: &Path, text: &str) -> Result<(), Status> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(internal)?;
    std::fs::rename(&tmp, path).map_err(internal)
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// Serves `router` on the unix socket `path` (replacing a stale socket file)
/// until the process ends.
pub async fn serve_unix(
    router: tonic::transport::server::Router,
    path: &Path,
) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let next = listener.accept().await.map(|(stream, _)| stream);
        Some((next, listener))
    });
    router.serve_with_incoming(incoming).await?;
    Ok(())
}
