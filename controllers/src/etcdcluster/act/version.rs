//! The steps of a version change (`plan::VersionStep`): the snapshot before
//! it (streamed to the cluster's backup destination as a backup is,
//! verified, and recorded in `status.versionChangeSnapshot`), etcd's
//! `downgrade validate`/`enable`/`cancel`, and the withdrawal of the
//! acknowledgement (an annotation on the EtcdCluster, removed through its
//! [`ClusterObject`]). The snapshot taken is returned for the status.

use etcdfleet_api::backup::resolve_destination;
use etcdfleet_api::version::DOWNGRADE_ANNOTATION;
use etcdfleet_api::{EtcdCluster, VersionChangeSnapshot};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::super::cluster_object::ClusterObject;
use super::super::context::{Context, Error, Result};
use super::super::observe::Observed;
use super::super::plan::step::VersionStep;
use super::target::Target;
use crate::snapshot::take_from;
use crate::store::open_for;

/// Takes `step` (see [`VersionStep`]); the snapshot it took, if any.
pub(super) async fn execute(
    step: &VersionStep,
    on: &Target<'_>,
    object: &mut ClusterObject,
) -> Result<Option<VersionChangeSnapshot>> {
    let (cluster, observed, ctx) = (on.cluster, on.observed, on.ctx);
    let no_etcd = || Error::Invalid("etcd did not answer".into());
    match step {
        VersionStep::SnapshotBefore { from, to } => {
            let snapshot = snapshot_before(cluster, observed, ctx, from, to).await?;
            Ok(Some(snapshot))
        }
        VersionStep::EnableDowngrade { target } => {
            let etcd = observed.etcd.as_ref().ok_or_else(no_etcd)?;
            etcd.validate_downgrade(target).await?;
            etcd.enable_downgrade(target).await?;
            Ok(None)
        }
        VersionStep::CancelDowngrade { .. } => {
            // The acknowledgement first: if that write fails, etcd's
            // downgrade is still enabled and this step comes again; if the
            // cancel fails after it, the planner asks for the cancel again
            // (it follows etcd's target, not the annotation).
            withdraw_acknowledgement(cluster, object).await?;
            let etcd = observed.etcd.as_ref().ok_or_else(no_etcd)?;
            etcd.cancel_downgrade().await?;
            Ok(None)
        }
        VersionStep::ForgetAcknowledgement { .. } => withdraw_acknowledgement(cluster, object)
            .await
            .map(|()| None),
    }
}

async fn snapshot_before(
    cluster: &EtcdCluster,
    observed: &Observed,
    ctx: &Context,
    from: &str,
    to: &str,
) -> Result<VersionChangeSnapshot> {
    let failed = |reason: &'static str, e: &dyn std::fmt::Display| Error::Snapshot {
        reason,
        message: e.to_string(),
    };
    let ns = cluster.namespace().unwrap_or_default();
    let destination = resolve_destination(None, cluster.spec.config.backup.as_ref())
        .map_err(|e| failed("NoDestination", &e))?;
    let (store, _) = open_for(&ctx.management, &ctx.fence, &ns, &destination)
        .await
        .map_err(|e| failed(e.reason(), &e))?;
    let health = (observed.health.as_ref())
        .ok_or_else(|| failed("NoHealthyMember", &"etcd did not answer"))?;
    let now = Timestamp::now();
    let name = format!("before-{to}");
    let taken = take_from(
        &store,
        destination,
        cluster,
        health,
        &observed.etcd_config,
        now,
        &name,
    )
    .await
    .map_err(|e| failed(e.reason(), &e))?;
    Ok(VersionChangeSnapshot {
        from: from.to_string(),
        to: to.to_string(),
        destination: taken.destination,
        object_key: taken.object_key,
        sha256: taken.sha256,
        size_bytes: i64::try_from(taken.size_bytes).unwrap_or(i64::MAX),
        revision: taken.revision,
        member: taken.member,
        taken_at: now.to_string(),
    })
}

/// Removes [`DOWNGRADE_ANNOTATION`] (conditional on the resourceVersion
/// this reconcile read or wrote last).
async fn withdraw_acknowledgement(cluster: &EtcdCluster, object: &mut ClusterObject) -> Result<()> {
    if !cluster.annotations().contains_key(DOWNGRADE_ANNOTATION) {
        return Ok(());
    }
    object.remove_annotation(DOWNGRADE_ANNOTATION).await
}
