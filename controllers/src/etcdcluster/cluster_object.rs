//! The EtcdCluster itself, as one reconcile writes it. Every write this
//! reconciler makes to the object goes through [`ClusterObject`]: the
//! finalizer, the template values and the controller's defaults written
//! into the spec, the withdrawal of a downgrade acknowledgement, and the
//! status. Each is conditional on the resourceVersion this reconcile read
//! or last wrote, and advances it, in one place: a reconcile of a copy
//! older than the stored object is refused (409) rather than overwriting
//! newer status or spec. (The materialization apply is a server-side apply
//! of this controller's own fields, which carries no resourceVersion.)

use etcdfleet_api::{EtcdCluster, EtcdClusterStatus, FIELD_MANAGER};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::context::{Error, Result};

/// The EtcdCluster this reconcile works on, and what it last wrote of it.
pub struct ClusterObject {
    api: Api<EtcdCluster>,
    name: String,
    resource_version: Option<String>,
    /// The status as stored: what the reconcile started from, then what it
    /// last wrote (a status equal to it is not written again).
    stored_status: EtcdClusterStatus,
}

impl ClusterObject {
    pub fn new(management: &Client, cluster: &EtcdCluster) -> Self {
        ClusterObject {
            api: Api::namespaced(management.clone(), &cluster.namespace().unwrap_or_default()),
            name: cluster.name_any(),
            resource_version: cluster.meta().resource_version.clone(),
            stored_status: cluster.status.clone().unwrap_or_default(),
        }
    }

    /// The resourceVersion the next write of this reconcile is conditional on.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// A live read of the object (not the copy this reconcile started
    /// from): what its status says now.
    pub async fn read_live(&self) -> Result<EtcdCluster> {
        self.api.get(&self.name).await.map_err(Error::ManagementApi)
    }

    /// A merge patch of `body` (metadata, spec), conditional on the
    /// resourceVersion; the object's new resourceVersion is kept.
    pub async fn merge(&mut self, mut body: Value) -> Result<EtcdCluster> {
        body["metadata"]["resourceVersion"] = json!(self.resource_version);
        let written = self
            .api
            .patch(
                &self.name,
                &crate::controller_patch_params(),
                &Patch::Merge(&body),
            )
            .await
            .map_err(Error::ManagementApi)?;
        self.advance(&written);
        Ok(written)
    }

    /// Server-side apply of `spec` with this controller's field manager
    /// (forced: the fields it applies are its own).
    pub async fn apply_spec(&mut self, spec: Value) -> Result<()> {
        let apply = json!({
            "apiVersion": EtcdCluster::api_version(&()),
            "kind": "EtcdCluster",
            "metadata": { "name": self.name },
            "spec": spec,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let written = self
            .api
            .patch(&self.name, &params, &Patch::Apply(&apply))
            .await
            .map_err(Error::ManagementApi)?;
        self.advance(&written);
        Ok(())
    }

    /// Adds the finalizer to `finalizers` (the object's current list).
    pub async fn add_finalizer(&mut self, finalizers: &[String], finalizer: &str) -> Result<()> {
        let mut all = finalizers.to_vec();
        all.push(finalizer.to_string());
        self.merge(json!({ "metadata": { "finalizers": all } }))
            .await
            .map(|_| ())
    }

    /// Removes `annotation` (a merge patch with `null`).
    pub async fn remove_annotation(&mut self, annotation: &str) -> Result<()> {
        self.merge(json!({ "metadata": { "annotations": { annotation: null } } }))
            .await
            .map(|_| ())
    }

    /// Writes `status` if it differs from the stored one. Returns whether
    /// it wrote.
    pub async fn write_status(&mut self, status: &EtcdClusterStatus) -> Result<bool> {
        if *status == self.stored_status {
            return Ok(false);
        }
        let patch = match &self.resource_version {
            Some(rv) => json!({ "metadata": { "resourceVersion": rv }, "status": status }),
            None => json!({ "status": status }),
        };
        let written = self
            .api
            .patch_status(
                &self.name,
                &crate::controller_patch_params(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(Error::ManagementApi)?;
        self.advance(&written);
        self.stored_status = status.clone();
        Ok(true)
    }

    fn advance(&mut self, written: &EtcdCluster) {
        if written.metadata.resource_version.is_some() {
            self.resource_version = written.metadata.resource_version.clone();
        }
    }
}
