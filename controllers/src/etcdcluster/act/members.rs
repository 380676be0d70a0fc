//! The steps on members: etcd membership (add a learner, promote, move
//! leadership, remove), their volumes, restarts onto the current template,
//! and maintenance (defragmentation, NOSPACE recovery).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::Patch;

use super::super::context::{Error, Result};
use super::super::observe::{
    Observed, PVC_MEMBER_ANNOTATION, PVC_OWNER_ANNOTATION, PVC_VERSION_ANNOTATION,
};
use super::target::{Target, apply, delete_exact, delete_same};
use crate::etcd::{ClusterClient, ClusterHealth};
use crate::render::{self, Names, RenderInputs};

pub(super) async fn scale_statefulset(on: &Target<'_>, replicas: u32) -> Result<()> {
    let sts = (on.observed.statefulset.as_ref())
        .ok_or_else(|| Error::Invalid("StatefulSet vanished".into()))?;
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": sts.resource_version() },
        "spec": { "replicas": replicas },
    });
    on.api::<StatefulSet>()
        .patch(
            &on.names().statefulset(),
            &crate::controller_patch_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| on.err(e))?;
    Ok(())
}

pub(super) async fn record_pvc_member(
    on: &Target<'_>,
    ordinal: u32,
    member_id: u64,
    version: Option<&str>,
) -> Result<()> {
    let mut annotations = serde_json::json!({
        PVC_MEMBER_ANNOTATION: format!("{member_id:x}"),
        PVC_OWNER_ANNOTATION: on.inputs.owner_label(),
    });
    if let Some(version) = version {
        annotations[PVC_VERSION_ANNOTATION] = serde_json::json!(version);
    }
    // A merge patch of our own annotations only, on the PVC the
    // observation listed (its owner was checked there).
    let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
    on.api::<PersistentVolumeClaim>()
        .patch(
            &on.names().pvc(ordinal),
            &crate::controller_patch_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| on.err(e))?;
    Ok(())
}

/// `force_pod`: the pod goes without a grace period (a delete of it is
/// stuck; its member was removed, so nothing of it can rejoin).
pub(super) async fn delete_stale_storage(
    on: &Target<'_>,
    ordinal: u32,
    force_pod: bool,
) -> Result<()> {
    if let Some(pvc) = on.observed.pvcs.get(&ordinal)
        && pvc.metadata.deletion_timestamp.is_none()
    {
        delete_exact(&on.api::<PersistentVolumeClaim>(), pvc)
            .await
            .map_err(|e| on.err(e))?;
    }
    // By UID alone: the pod of a removed member crash-loops, and a
    // resourceVersion precondition would fail on each of its status updates.
    if let Some(pod) = on.observed.pods.get(&ordinal) {
        let grace = force_pod.then_some(0);
        delete_same(&on.api::<Pod>(), pod, grace)
            .await
            .map_err(|e| on.err(e))?;
    }
    Ok(())
}

/// `--initial-cluster` of every member etcd lists (those of other names,
/// an adopted etcd's old members, with their own names), plus `ordinal`.
pub(super) fn initial_cluster_of(
    names: &Names,
    tls: bool,
    health: &ClusterHealth,
    ordinal: Option<u32>,
) -> String {
    let mut ordinals: Vec<u32> = health
        .members()
        .iter()
        .filter_map(|m| m.member.peer_urls.first())
        .filter_map(|u| names.ordinal_of_peer_url(u))
        .chain(ordinal)
        .collect();
    ordinals.sort();
    ordinals.dedup();
    let others: Vec<(String, String)> = health
        .members()
        .iter()
        .filter(|m| m.member.is_started())
        .filter(|m| {
            (m.member.peer_urls.first()).is_some_and(|u| names.ordinal_of_peer_url(u).is_none())
        })
        .flat_map(|m| (m.member.peer_urls.iter()).map(|u| (m.member.name.clone(), u.clone())))
        .collect();
    render::initial_cluster_with(names, tls, ordinals, &others)
}

/// Points the members ConfigMap at the grown cluster, then `member add --learner`.
pub(super) async fn add_learner(on: &Target<'_>, ordinal: u32) -> Result<()> {
    let (inputs, names) = (on.inputs, on.names());
    let health = (on.observed.health.as_ref())
        .ok_or_else(|| Error::Invalid("no etcd observation".into()))?;
    let initial = initial_cluster_of(names, inputs.tls, health, Some(ordinal));
    apply(
        &on.api(),
        &render::members_configmap(inputs, &initial, "existing"),
    )
    .await
    .map_err(|e| on.err(e))?;
    etcd_client(on.observed)
        .await?
        .add_learner(&[names.peer_url(ordinal, inputs.tls)])
        .await?;
    Ok(())
}

/// Closes the members ConfigMap (the learner has joined: its data
/// directory holds the cluster, so it no longer reads the announcement),
/// then promotes the learner.
pub(super) async fn promote_learner(on: &Target<'_>, member_id: u64) -> Result<()> {
    close_members_configmap(on).await?;
    etcd_client(on.observed)
        .await?
        .promote_learner(member_id)
        .await?;
    Ok(())
}

/// Announces no member to join (see [`render::closed_members_configmap`]):
/// a member whose volume comes back empty cannot start under its old
/// identity with none of its data.
pub(super) async fn close_members_configmap(on: &Target<'_>) -> Result<()> {
    apply(&on.api(), &render::closed_members_configmap(on.inputs))
        .await
        .map_err(|e| on.err(e))?;
    Ok(())
}

pub(super) async fn move_leader(on: &Target<'_>, to: u64) -> Result<()> {
    etcd_client(on.observed).await?.move_leader(to).await?;
    Ok(())
}

pub(super) async fn remove_member(on: &Target<'_>, member_id: u64) -> Result<()> {
    etcd_client(on.observed)
        .await?
        .remove_member(member_id)
        .await?;
    Ok(())
}

pub(super) async fn delete_pvc(on: &Target<'_>, ordinal: u32) -> Result<()> {
    if let Some(pvc) = on.observed.pvcs.get(&ordinal) {
        delete_exact(&on.api::<PersistentVolumeClaim>(), pvc)
            .await
            .map_err(|e| on.err(e))?;
    }
    Ok(())
}

pub(super) async fn defragment(on: &Target<'_>, ordinal: u32) -> Result<()> {
    member_client(on.observed, ordinal, on.inputs.tls)
        .await?
        .defragment()
        .await?;
    Ok(())
}

/// Deletes a member's pod so the StatefulSet recreates it from the current template.
pub(super) async fn restart_member(on: &Target<'_>, ordinal: u32) -> Result<()> {
    let Some(pod) = on.observed.pods.get(&ordinal) else {
        return Ok(());
    };
    // Leave first: etcd stops only after its clients have.
    if let Some(etcd) = &on.observed.etcd {
        let url = on.observed.names().client_url(ordinal, on.inputs.tls);
        if let Err(e) = etcd.disconnect(&url).await {
            tracing::debug!(error = %e, member = %url, "could not close the connection before the restart");
        }
    }
    delete_exact(&on.api::<Pod>(), pod)
        .await
        .map_err(|e| on.err(e))?;
    Ok(())
}

/// A client for exactly one member, reached through the dialer.
async fn member_client(
    observed: &Observed,
    ordinal: u32,
    tls: bool,
) -> Result<crate::etcd::MemberClient> {
    let url = observed.names().client_url(ordinal, tls);
    Ok(etcd_client(observed).await?.member(&url).await?)
}

/// NOSPACE recovery (etcd's maintenance guide): compact the history,
/// defragment every member one at a time (followers first, leader last) so
/// the freed pages return to the filesystem, then disarm the alarm. If live
/// data alone still fills the quota, the alarm stays and the error says to
/// raise `spec.etcd.quotaBackendBytes` (or grow the volumes the quota follows).
pub(super) async fn recover_from_nospace(inputs: &RenderInputs, observed: &Observed) -> Result<()> {
    let health = observed
        .health
        .as_ref()
        .ok_or_else(|| Error::Invalid("no etcd observation".into()))?;
    let names = observed.names();
    let cluster = etcd_client(observed).await?;
    cluster.compact_to_current().await?;
    let leader = health.leader();
    let mut members: Vec<(bool, u32)> = health
        .members()
        .iter()
        .filter_map(|m| {
            let ordinal = names.ordinal_of_peer_url(m.member.peer_urls.first()?)?;
            Some((leader == Some(m.member.id), ordinal))
        })
        .collect();
    members.sort();
    let mut in_use = 0;
    for (_, ordinal) in &members {
        let member = member_client(observed, *ordinal, inputs.tls).await?;
        member.defragment().await?;
        let mut used = member.status().await?.db_size_in_use;
        // A follower applies the compaction when raft delivers it, which can
        // be after its defragmentation started: give it a moment and
        // defragment once more before judging that live data fills the quota.
        if used * 10 > inputs.quota_backend_bytes * 9 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            member.defragment().await?;
            used = member.status().await?.db_size_in_use;
        }
        in_use = in_use.max(used);
    }
    if in_use * 10 > inputs.quota_backend_bytes * 9 {
        return Err(Error::Invalid(format!(
            "NOSPACE persists: live data uses {in_use} bytes of the {} byte quota after compaction \
             and defragmentation; raise spec.etcd.quotaBackendBytes, or grow spec.storage.size \
             when the quota is a percentage of it (quotaBackendPercentOfStorage, docs/storage.md)",
            inputs.quota_backend_bytes
        )));
    }
    for alarm in cluster.alarms().await? {
        if alarm.kind == crate::etcd::AlarmKind::NoSpace {
            cluster.disarm_alarm(alarm).await?;
        }
    }
    Ok(())
}

/// The client observe used (pooled), or a new one when etcd did not answer
/// then (the steps that need etcd only run after it answered).
pub(super) async fn etcd_client(observed: &Observed) -> Result<ClusterClient> {
    match &observed.etcd {
        Some(client) => Ok(client.clone()),
        None => Ok(ClusterClient::connect(&observed.endpoints, &observed.etcd_config).await?),
    }
}
