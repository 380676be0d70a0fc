//! Volume expansion in emulated mode (the external resizer and the
//! kubelet's file system resize, played together): a claim whose request
//! grew past its capacity grows ([`ResizeMode`]). The volume is a host
//! directory, so only the claim's status changes. The API server's own
//! refusal of a claim whose StorageClass does not allow expansion is not
//! played: the controller must not ask (the tests count its writes).

use anyhow::Result;
use etcdfleet_api::quantity;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::state::{Inner, ResizeMode, now_rfc3339};

const PENDING: &str = "FileSystemResizePending";

impl Inner {
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
            Api::<PersistentVolumeClaim>::namespaced(
                self.client.clone(),
                &claim.namespace().unwrap_or_default(),
            )
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
