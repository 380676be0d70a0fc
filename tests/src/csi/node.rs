//! The Node service (a volume is published by bind-mounting its directory
//! onto the kubelet's target path) and the kubelet's plugin registration
//! (the kubelet finds the node socket through a socket in its
//! `plugins_registry` directory). It runs inside a real node's mount
//! namespace (`crate::real_node::node`), so its mounts are the ones the
//! node's kubelet and containerd see.

use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use super::proto::node_server::Node;
use super::proto::{self as csi, node_service_capability};
use super::registration::registration_server::Registration;
use super::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::{DRIVER_NAME, Store, internal, requested};

/// The Node service of one node.
#[derive(Debug, Clone)]
pub struct NodeService {
    pub store: Store,
    pub node_id: String,
    /// Whether the node finishes growths (`NodeExpandVolume`).
    pub node_expansion: bool,
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let source = self.store.dir(&request.volume_id)?;
        self.store.size(&request.volume_id)?;
        let target = PathBuf::from(&request.target_path);
        std::fs::create_dir_all(&target).map_err(internal)?;
        if !is_mount_point(&target)? {
            bind_mount(&source, &target, request.readonly)?;
        }
        eprintln!(
            "csi: published volume {} at {}",
            request.volume_id, request.target_path
        );
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let target = PathBuf::from(&request.target_path);
        while target.exists() && is_mount_point(&target)? {
            unmount(&target)?;
        }
        if target.exists() {
            std::fs::remove_dir(&target).map_err(internal)?;
        }
        eprintln!(
            "csi: unpublished volume {} from {}",
            request.volume_id, request.target_path
        );
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        let recorded = self.store.size(&request.volume_id)?;
        let bytes = requested(request.capacity_range.as_ref()).max(recorded);
        let mounted = is_mount_point(Path::new(&request.volume_path))?;
        eprintln!(
            "csi: node expansion of volume {} to {bytes} bytes at {} ({})",
            request.volume_id,
            request.volume_path,
            if mounted {
                "online, published"
            } else {
                "not published"
            }
        );
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: bytes,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::{Rpc, Type, rpc};
        let expand = csi::NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc {
                r#type: rpc::Type::ExpandVolume as i32,
            })),
        };
        let capabilities = if self.node_expansion {
            vec![expand]
        } else {
            vec![]
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            ..Default::default()
        }))
    }
}

/// The kubelet's plugin registration: names the driver and its node socket.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: DRIVER_NAME.into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            eprintln!("csi: the kubelet registered the driver");
        } else {
            eprintln!("csi: the kubelet refused the driver: {}", status.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Whether `path` is a mount point of this mount namespace
/// (`/proc/self/mountinfo`, field 5; the paths used here need no escapes).
fn is_mount_point(path: &Path) -> Result<bool, Status> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(internal)?;
    let wanted = path.display().to_string();
    Ok(mounts
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(wanted.as_str())))
}

/// Runs `mount` or `umount` (util-linux, as the node script does).
fn run(program: &str, args: &[&str]) -> Result<(), Status> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Status::internal(format!("{program}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Status::internal(format!(
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

fn bind_mount(source: &Path, target: &Path, readonly: bool) -> Result<(), Status> {
    let (src, dst) = (source.display().to_string(), target.display().to_string());
    run("mount", &["--bind", &src, &dst])?;
    if readonly {
        run("mount", &["-o", "remount,bind,ro", &dst])?;
    }
    Ok(())
}

fn unmount(target: &Path) -> Result<(), Status> {
    run("umount", &[&target.display().to_string()])
}
