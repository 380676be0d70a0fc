//! Act stage: executes the one step the planner chose. Every action is
//! idempotent: names are deterministic, creates and applies tolerate an
//! existing object, deletes carry UID and resourceVersion preconditions, and
//! optimistic-lock patches carry the resourceVersion that was observed.
//!
//! [`execute`] hands each step to one function: the workload objects and
//! bootstrap in [`objects`], the management-side PKI in [`pki`], the members
//! (etcd membership, volumes, restarts, maintenance) here; deletion of the
//! whole cluster is [`finalize`].

mod finalize;
mod objects;
mod pki;

use etcdfleet_api::{EtcdCluster, FIELD_MANAGER};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use finalize::finalize;

use super::context::{Context, Error, Result};
use super::observe::{
    Observed, PVC_MEMBER_ANNOTATION, PVC_OWNER_ANNOTATION, PVC_VERSION_ANNOTATION,
};
use super::plan::Step;
use super::resolve::Resolved;
use crate::connector::WorkloadCluster;
use crate::etcd::ClusterClient;
use crate::render::{self, Names, RenderInputs};

/// Certificates are valid this long; rotation is a later feature.
const CERT_VALIDITY_DAYS: u32 = 365;

/// What every step acts on: the cluster, its inputs, what was observed, and
/// the workload cluster.
struct Target<'a> {
    cluster: &'a EtcdCluster,
    inputs: &'a RenderInputs,
    observed: &'a Observed,
    workload: &'a WorkloadCluster,
    ctx: &'a Context,
}

impl Target<'_> {
    fn names(&self) -> &Names {
        self.observed.names()
    }

    /// The namespaced API of `K` in the workload namespace.
    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(
            self.workload.client.clone(),
            self.inputs.workload_namespace.as_str(),
        )
    }

    /// A workload API failure, naming the server.
    fn err(&self, source: kube::Error) -> Error {
        Error::WorkloadApi {
            server: self.workload.server.clone(),
            source,
        }
    }
}

/// Executes one step.
pub async fn execute(
    step: &Step,
    cluster: &EtcdCluster,
    resolved: &Resolved,
    observed: &Observed,
    workload: &WorkloadCluster,
    ctx: &Context,
) -> Result<()> {
    let on = &Target {
        cluster,
        inputs: &resolved.inputs,
        observed,
        workload,
        ctx,
    };
    match step {
        Step::WriteObjects(kinds) => objects::write_objects(on, kinds).await,
        Step::Bootstrap { replicas } => objects::bootstrap(on, *replicas).await,
        Step::ScaleStatefulSet { replicas } => scale_statefulset(on, *replicas).await,
        Step::RecordPvcMember {
            ordinal,
            member_id,
            version,
        } => record_pvc_member(on, *ordinal, *member_id, version.as_deref()).await,
        Step::DeleteStaleStorage { ordinal } => delete_stale_storage(on, *ordinal).await,
        Step::AddLearner { ordinal } => add_learner(on, *ordinal).await,
        Step::PromoteLearner { member_id, .. } => promote_learner(on, *member_id).await,
        Step::MoveLeader { to, .. } => move_leader(on, *to).await,
        Step::RemoveMember { member_id, .. } => remove_member(on, *member_id).await,
        Step::DeletePvc { ordinal } => delete_pvc(on, *ordinal).await,
        Step::RecoverFromNoSpace => recover_from_nospace(on.inputs, on.observed).await,
        Step::Defragment { ordinal, .. } => defragment(on, *ordinal).await,
        Step::RestartMember { ordinal, .. } => restart_member(on, *ordinal).await,
    }
}

async fn scale_statefulset(on: &Target<'_>, replicas: u32) -> Result<()> {
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

async fn record_pvc_member(
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

async fn delete_stale_storage(on: &Target<'_>, ordinal: u32) -> Result<()> {
    if let Some(pvc) = on.observed.pvcs.get(&ordinal) {
        delete_exact(&on.api::<PersistentVolumeClaim>(), pvc)
            .await
            .map_err(|e| on.err(e))?;
    }
    if let Some(pod) = on.observed.pods.get(&ordinal) {
        delete_exact(&on.api::<Pod>(), pod)
            .await
            .map_err(|e| on.err(e))?;
    }
    Ok(())
}

/// Points the members ConfigMap at the grown cluster, then `member add --learner`.
async fn add_learner(on: &Target<'_>, ordinal: u32) -> Result<()> {
    let (inputs, names) = (on.inputs, on.names());
    let health = (on.observed.health.as_ref())
        .ok_or_else(|| Error::Invalid("no etcd observation".into()))?;
    let mut ordinals: Vec<u32> = health
        .members()
        .iter()
        .filter_map(|m| m.member.peer_urls.first())
        .filter_map(|u| names.ordinal_of_peer_url(u))
        .collect();
    ordinals.push(ordinal);
    ordinals.sort();
    ordinals.dedup();
    let initial = render::initial_cluster(names, inputs.tls, ordinals);
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

async fn promote_learner(on: &Target<'_>, member_id: u64) -> Result<()> {
    etcd_client(on.observed)
        .await?
        .promote_learner(member_id)
        .await?;
    Ok(())
}

async fn move_leader(on: &Target<'_>, to: u64) -> Result<()> {
    etcd_client(on.observed).await?.move_leader(to).await?;
    Ok(())
}

async fn remove_member(on: &Target<'_>, member_id: u64) -> Result<()> {
    etcd_client(on.observed)
        .await?
        .remove_member(member_id)
        .await?;
    Ok(())
}

async fn delete_pvc(on: &Target<'_>, ordinal: u32) -> Result<()> {
    if let Some(pvc) = on.observed.pvcs.get(&ordinal) {
        delete_exact(&on.api::<PersistentVolumeClaim>(), pvc)
            .await
            .map_err(|e| on.err(e))?;
    }
    Ok(())
}

async fn defragment(on: &Target<'_>, ordinal: u32) -> Result<()> {
    member_client(on.observed, ordinal, on.inputs.tls)
        .await?
        .defragment()
        .await?;
    Ok(())
}

/// Deletes a member's pod so the StatefulSet recreates it from the current template.
async fn restart_member(on: &Target<'_>, ordinal: u32) -> Result<()> {
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
/// raise `spec.etcd.quotaBackendBytes`.
async fn recover_from_nospace(inputs: &RenderInputs, observed: &Observed) -> Result<()> {
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
             and defragmentation; raise spec.etcd.quotaBackendBytes",
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
async fn etcd_client(observed: &Observed) -> Result<ClusterClient> {
    match &observed.etcd {
        Some(client) => Ok(client.clone()),
        None => Ok(ClusterClient::connect(&observed.endpoints, &observed.etcd_config).await?),
    }
}

/// Server-side apply with this controller's field manager.
pub(super) async fn apply<K>(api: &Api<K>, obj: &K) -> kube::Result<K>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let mut value = serde_json::to_value(obj).expect("objects serialize");
    value["apiVersion"] = K::api_version(&Default::default()).into();
    value["kind"] = K::kind(&Default::default()).into();
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
}

/// Deletes exactly the object that was observed (UID and resourceVersion
/// preconditions); an object already gone is fine.
pub(super) async fn delete_exact<K>(api: &Api<K>, obj: &K) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: obj.meta().uid.clone(),
            resource_version: obj.meta().resource_version.clone(),
        }),
        ..Default::default()
    };
    match api.delete(&obj.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
