//! Claims in emulated mode: provisioning (a claim left unbound on a class
//! that does not provision gets a `ProvisioningFailed` event, and is bound
//! once its class provisions again), and volume expansion (the external
//! resizer and the kubelet's file system resize, played together): a claim
//! whose request grew past its capacity grows ([`ResizeMode`]). The volume is a host
//! directory, so only the claim's status changes. The API server's own
//! refusal of a claim whose StorageClass does not allow expansion is not
//! played: the controller must not ask (the tests count its writes).

use anyhow::{Context, Result};
use etcdfleet_api::quantity;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::state::{Inner, ResizeMode, now_rfc3339};

const PENDING: &str = "FileSystemResizePending";

impl Inner {
    /// Whether claims of `class` get a volume.
    pub(super) fn provisions(&self, class: Option<&str>) -> bool {
        let unprovisioned = self.unprovisioned.lock().expect("lock");
        class.is_none_or(|c| !unprovisioned.contains(c))
    }

    /// Unbound claims: bound once their class provisions, else an event
    /// says why (once).
    pub(super) async fn run_provisioner(&self) -> Result<()> {
        let claims = Api::<PersistentVolumeClaim>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        for (claim, spec) in (claims.iter())
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| Some((c, c.spec.clone()?)))
            .filter(|(_, s)| s.volume_name.is_none())
        {
            let ns = claim_namespace(claim)?;
            let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns);
            if !self.provisions(spec.storage_class_name.as_deref()) {
                self.provisioning_failed(claim).await?;
                continue;
            }
            let volume = format!(
                "pv-{ns}-{}-{}",
                claim.name_any(),
                super::statefulset::next_volume()
            );
            let patch = json!({ "spec": { "volumeName": volume } });
            api.patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await?;
            let requests = spec.resources.and_then(|r| r.requests);
            let status = json!({ "status": {
                "phase": "Bound", "accessModes": spec.access_modes, "capacity": requests,
            } });
            api.patch_status(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status),
            )
            .await?;
        }
        Ok(())
    }

    /// The `ProvisioningFailed` event of an unbound claim, made once.
    async fn provisioning_failed(&self, claim: &PersistentVolumeClaim) -> Result<()> {
        let ns = claim_namespace(claim)?;
        let name = format!("{}.provisioning", claim.name_any());
        let event: Event = serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": ns },
            "involvedObject": {
                "kind": "PersistentVolumeClaim", "namespace": ns,
                "name": claim.name_any(), "uid": claim.uid(),
            },
            "reason": "ProvisioningFailed",
            "message": "no volume can be provisioned for this class",
            "type": "Warning",
            "lastTimestamp": now_rfc3339(),
        }))?;
        match Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &event)
            .await
        {
            Err(e) if !super::state::is_status_code(&e, 409) => Err(e.into()),
            _ => Ok(()),
        }
    }

    pub(super) async fn run_resizer(&self) -> Result<()> {
        let mode = *self.resize.lock().expect("lock");
        let lp = ListParams::default();
        let claims = Api::<PersistentVolumeClaim>::all(self.client.clone())
            .list(&lp)
            .await?
            .items;
        let pods = Api::<Pod>::all(self.client.clone()).list(&lp).await?.items;
        for claim in &claims {
            let size = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                q.and_then(|q| quantity::bytes(&q.0).ok())
            };
            let spec = claim.spec.as_ref();
            let requested = spec.and_then(|s| {
                s.resources
                    .as_ref()?
                    .requests
                    .as_ref()?
                    .get("storage")
                    .cloned()
            });
            let status = claim.status.as_ref();
            let capacity = status.and_then(|s| s.capacity.as_ref()?.get("storage").cloned());
            if !matches!((size(requested.as_ref()), size(capacity.as_ref())), (Some(r), Some(c)) if r > c)
            {
                continue;
            }
            let pending_since = (status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten())
            .find(|c| c.type_ == PENDING)
            .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0));
            let grown = match (mode, pending_since) {
                (ResizeMode::Online, _) => true,
                (ResizeMode::AtPodStart, None) => false,
                (ResizeMode::AtPodStart, Some(since)) => !pods
                    .iter()
                    .any(|p| uses(p, claim) && p.creation_timestamp().is_none_or(|t| t.0 <= since)),
            };
            let status = match (grown, pending_since) {
                (true, _) => json!({ "capacity": { "storage": requested }, "conditions": [] }),
                (false, None) => json!({ "conditions": [{
                    "type": PENDING, "status": "True", "lastTransitionTime": now_rfc3339(),
                    "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
                }] }),
                (false, Some(_)) => continue,
            };
            Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &claim_namespace(claim)?)
                .patch_status(
                    &claim.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await?;
        }
        Ok(())
    }
}

/// A claim's namespace (claims are namespaced: one without is a bug).
fn claim_namespace(claim: &PersistentVolumeClaim) -> Result<String> {
    claim
        .namespace()
        .with_context(|| format!("claim {} has no namespace", claim.name_any()))
}

/// `pod` mounts `claim`.
fn uses(pod: &Pod, claim: &PersistentVolumeClaim) -> bool {
    pod.namespace() == claim.namespace()
        && (pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .any(|c| c.claim_name == claim.name_any())
}
