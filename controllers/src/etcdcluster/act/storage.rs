//! The steps of a storage change ([`super::super::plan::storage`]): a
//! member's claim asks for the new size, a member restarts so its file
//! system grows, the StatefulSet is deleted around its running pods so it
//! can be created again with the new claim template.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, Preconditions, PropagationPolicy};

use super::super::context::{Error, Result};
use super::super::plan::step::StorageStep;
use super::members::restart_member;
use super::target::Target;

pub(super) async fn execute(step: &StorageStep, on: &Target<'_>) -> Result<()> {
    match step {
        StorageStep::ExpandVolume { ordinal, size } => expand_volume(on, *ordinal, size).await,
        StorageStep::RestartForResize { ordinal, .. } => restart_member(on, *ordinal).await,
        StorageStep::RecreateStatefulSet { .. } => orphan_statefulset(on).await,
    }
}

/// Asks for `size` on the member's claim: a merge patch conditional on the
/// resourceVersion observed this reconcile, so a claim that changed (or
/// changed hands) since is re-read, never overwritten.
async fn expand_volume(on: &Target<'_>, ordinal: u32, size: &str) -> Result<()> {
    let pvc = (on.observed.pvcs.get(&ordinal))
        .ok_or_else(|| Error::Invalid(format!("the claim of ordinal {ordinal} vanished")))?;
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": pvc.resource_version() },
        "spec": { "resources": { "requests": { "storage": size } } },
    });
    on.api::<PersistentVolumeClaim>()
        .patch(
            &pvc.name_any(),
            &crate::controller_patch_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| on.err(e))?;
    Ok(())
}

/// Deletes exactly the StatefulSet observed (UID and resourceVersion
/// preconditions) with `propagationPolicy: Orphan`: its pods and claims
/// keep running, and the StatefulSet written next adopts them.
async fn orphan_statefulset(on: &Target<'_>) -> Result<()> {
    let sts = (on.observed.statefulset.as_ref())
        .ok_or_else(|| Error::Invalid("StatefulSet vanished".into()))?;
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        preconditions: Some(Preconditions {
            uid: sts.uid(),
            resource_version: sts.resource_version(),
        }),
        ..Default::default()
    };
    match on
        .api::<StatefulSet>()
        .delete(&sts.name_any(), &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(on.err(e)),
    }
}
