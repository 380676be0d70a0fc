//! The EtcdCluster's `BackupsRestorable` condition, from the last drill of
//! its backups and the policy's freshness (`etcdfleet_api::drill`). Written
//! here, beside the cluster reconciler's conditions: that reconciler keeps
//! condition types it does not set, and both write with the resource
//! version they read, so neither overwrites the other's newer write (a
//! conflict is retried at the next reconcile).

use etcdfleet_api::EtcdCluster;
use etcdfleet_api::backup::DrillResult;
use etcdfleet_api::conditions::{condition, set_condition, unknown_condition};
use etcdfleet_api::drill::{Drills, RESTORABLE_CONDITION, condition_of, proof};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch};

use crate::backup::context::{Context, Error, Result};

/// Sets the condition on `cluster` when it changed.
pub(super) async fn report(
    ctx: &Context,
    cluster: &EtcdCluster,
    policy: &Drills,
    last: Option<&DrillResult>,
    now: Timestamp,
) -> Result<()> {
    let (status, reason, message) =
        condition_of(&proof(last, policy.fresh_for, now), policy.fresh_for);
    let generation = cluster.metadata.generation;
    let new = match status {
        Some(s) => condition(
            RESTORABLE_CONDITION,
            s,
            reason,
            message,
            generation,
            Time(now),
        ),
        None => unknown_condition(RESTORABLE_CONDITION, reason, message, generation, Time(now)),
    };
    let mut conditions = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    if !set_condition(&mut conditions, new) {
        return Ok(());
    }
    let api: Api<EtcdCluster> = Api::namespaced(
        ctx.access().management.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": cluster.resource_version() },
        "status": { "conditions": conditions },
    });
    match api
        .patch_status(
            &cluster.name_any(),
            &crate::controller_patch_params(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // The cluster changed since it was read: written at the next reconcile.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::ManagementApi(e)),
    }
}
