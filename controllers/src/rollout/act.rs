//! Act step of a rollout: write the change into one cluster, or remove the
//! resume annotation a person set.
//!
//! **How a cluster is written.** Server-side apply of exactly the fields the
//! rollout changes (`spec.version`, `spec.templateRef` and the rebase
//! annotation) and two annotations that say who changed it, under the field
//! manager `etcdfleet-rollout-<name>`, with the cluster's `resourceVersion`
//! as the planner saw it in the apply body: the API server refuses the
//! write (409) if the cluster changed since it was judged, so the rollout
//! never overrides what it did not look at, and a second write of a
//! cluster (a stale cache after a restart) fails instead of landing.
//!
//! The apply is forced. Every cluster's `spec.version` is already owned by
//! whoever wrote it first (its creator, a GitOps tool, the controller's
//! template materialization), so an unforced apply would conflict on every
//! cluster of the fleet; the decision that the rollout may take the field
//! over is the planner's: it leaves alone (Skipped) any cluster whose field
//! someone else changed after the rollout started, and never writes a
//! cluster twice, so a person's later edit is never overridden (it is
//! reported from `managedFields` instead).

use etcdfleet_api::rollout::{RESUME_ANNOTATION, ROLLOUT_ANNOTATION, ROLLOUT_CHANGE_ANNOTATION};
use etcdfleet_api::template::REBASE_ANNOTATION;
use etcdfleet_api::{EtcdCluster, EtcdFleetRollout};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use super::plan::manager_of;
use crate::access::Access;

/// The apply configuration that writes `rollout`'s change into `cluster`,
/// conditional on `resource_version`.
pub fn change_body(
    rollout: &EtcdFleetRollout,
    cluster: &EtcdCluster,
    resource_version: Option<&str>,
) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    annotations.insert(ROLLOUT_ANNOTATION.into(), rollout.name_any().into());
    annotations.insert(
        ROLLOUT_CHANGE_ANNOTATION.into(),
        rollout.spec.change_summary().into(),
    );
    let mut spec = serde_json::Map::new();
    if let Some(version) = &rollout.spec.version {
        spec.insert("version".into(), version.clone().into());
    }
    if let Some(template) = &rollout.spec.template_ref {
        spec.insert(
            "templateRef".into(),
            serde_json::to_value(template).unwrap_or_default(),
        );
        annotations.insert(REBASE_ANNOTATION.into(), "true".into());
    }
    let mut metadata = serde_json::json!({
        "name": cluster.name_any(),
        "annotations": annotations,
    });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = rv.into();
    }
    serde_json::json!({
        "apiVersion": EtcdCluster::api_version(&()),
        "kind": EtcdCluster::kind(&()),
        "metadata": metadata,
        "spec": spec,
    })
}

/// What became of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    Yes,
    /// 409: the cluster changed since the planner judged it (or the cache
    /// was behind); nothing was written, the next reconcile judges it again.
    Conflict(String),
}

/// Writes the change into one cluster.
pub async fn apply_change(
    rollout: &EtcdFleetRollout,
    cluster: &EtcdCluster,
    resource_version: Option<&str>,
    access: &Access,
) -> Result<Written, kube::Error> {
    let api: Api<EtcdCluster> = Api::namespaced(
        access.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let body = change_body(rollout, cluster, resource_version);
    let params = PatchParams::apply(&manager_of(&rollout.name_any())).force();
    match api
        .patch(&cluster.name_any(), &params, &Patch::Apply(&body))
        .await
    {
        Ok(_) => Ok(Written::Yes),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Written::Conflict(e.message)),
        Err(e) => Err(e),
    }
}

/// Removes the resume annotation once acted on (the value acted on is in
/// `status.lastResume`, so a removal that fails is not a second resume).
pub async fn acknowledge_resume(
    rollout: &EtcdFleetRollout,
    access: &Access,
) -> Result<(), kube::Error> {
    let api: Api<EtcdFleetRollout> = Api::all(access.management.clone());
    let patch = serde_json::json!({ "metadata": { "annotations": { RESUME_ANNOTATION: null } } });
    api.patch(
        &rollout.name_any(),
        &crate::controller_patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdfleet_api::{EtcdFleetRolloutSpec, TemplateKind, TemplateRef};

    #[test]
    fn the_apply_carries_only_the_change_who_made_it_and_the_resource_version() {
        let rollout = EtcdFleetRollout::new(
            "to-3-5-35",
            EtcdFleetRolloutSpec {
                version: Some("3.5.35".into()),
                template_ref: Some(TemplateRef {
                    kind: TemplateKind::ClusterEtcdTemplate,
                    name: "ha-3".into(),
                }),
                ..Default::default()
            },
        );
        let mut cluster = EtcdCluster::new("shop", Default::default());
        cluster.metadata.namespace = Some("team-a".into());
        let body = change_body(&rollout, &cluster, Some("42"));
        assert_eq!(
            body,
            serde_json::json!({
                "apiVersion": EtcdCluster::api_version(&()),
                "kind": "EtcdCluster",
                "metadata": {
                    "name": "shop",
                    "resourceVersion": "42",
                    "annotations": {
                        "etcdfleet.dev/rollout": "to-3-5-35",
                        "etcdfleet.dev/rollout-change":
                            "version 3.5.35, template ClusterEtcdTemplate/ha-3",
                        "etcdfleet.dev/rebase-template": "true",
                    },
                },
                "spec": {
                    "version": "3.5.35",
                    "templateRef": { "kind": "ClusterEtcdTemplate", "name": "ha-3" },
                },
            })
        );
    }
}
