//! The Identity and Controller services: a volume is created as a
//! directory with a recorded size, deleted with its directory, and grown by
//! recording the new size (the node finishes the growth when
//! `node_expansion` is on, as a block device's file system would need).

use tonic::{Request, Response, Status};

use super::proto::controller_server::Controller;
use super::proto::identity_server::Identity;
use super::proto::{self as csi, controller_service_capability, plugin_capability};
use super::{DRIVER_NAME, Store, internal, requested};

/// The Identity service, shared by both sockets.
#[derive(Debug, Clone)]
pub struct IdentityService;

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::{Service, VolumeExpansion, service, volume_expansion};
        let service = Service {
            r#type: service::Type::ControllerService as i32,
        };
        let expansion = VolumeExpansion {
            r#type: volume_expansion::Type::Online as i32,
        };
        let capabilities = vec![
            csi::PluginCapability {
                r#type: Some(plugin_capability::Type::Service(service)),
            },
            csi::PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(expansion)),
            },
        ];
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

/// The Controller service over a [`Store`].
#[derive(Debug, Clone)]
pub struct ControllerService {
    pub store: Store,
    /// Whether a growth needs the node's `NodeExpandVolume` to finish.
    pub node_expansion: bool,
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = request.name;
        let dir = self.store.dir(&id)?;
        // Idempotent: a volume created before keeps its recorded size.
        let bytes = match self.store.size(&id) {
            Ok(bytes) => bytes,
            Err(_) => {
                std::fs::create_dir_all(&dir).map_err(internal)?;
                let bytes = requested(request.capacity_range.as_ref());
                self.store.set_size(&id, bytes)?;
                bytes
            }
        };
        eprintln!("csi: created volume {id} ({bytes} bytes)");
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: bytes,
                volume_id: id,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        let dir = self.store.dir(&id)?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(internal)?;
        }
        let _ = std::fs::remove_file(self.store.bytes_file(&id)?);
        eprintln!("csi: deleted volume {id}");
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::{Rpc, Type, rpc};
        let capability = |t: rpc::Type| csi::ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                capability(rpc::Type::CreateDeleteVolume),
                capability(rpc::Type::ExpandVolume),
            ],
        }))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let request = request.into_inner();
        self.store.size(&request.volume_id)?;
        Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context,
                volume_capabilities: request.volume_capabilities,
                parameters: request.parameters,
                mutable_parameters: Default::default(),
            }),
            message: String::new(),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        let id = request.volume_id;
        let before = self.store.size(&id)?;
        // CSI volumes never shrink: a smaller request keeps the size.
        let bytes = requested(request.capacity_range.as_ref()).max(before);
        self.store.set_size(&id, bytes)?;
        eprintln!("csi: expanded volume {id} from {before} to {bytes} bytes");
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: bytes,
            node_expansion_required: self.node_expansion,
        }))
    }
}
