//! Act step: executes the one step the planner chose. Every action is
//! idempotent: names are deterministic, creates and applies tolerate an
//! existing object, deletes carry UID and resourceVersion preconditions, and
//! optimistic-lock patches carry the resourceVersion that was observed.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use etcdfleet_api::{EtcdCluster, FIELD_MANAGER};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::observe::{
    Observed, PKI_CA_CERT, PKI_CA_KEY, PKI_CLIENT_CERT, PKI_CLIENT_KEY, PVC_MEMBER_ANNOTATION,
    PVC_OWNER_ANNOTATION, PVC_VERSION_ANNOTATION,
};
use super::plan::{ObjectKind, Step};
use super::resolve::Resolved;
use super::{Context, Error, FINALIZER, Outcome, Result, publish};
use crate::connector::{ConnectError, KubeconfigLocation, WorkloadCluster};
use crate::etcd::ClusterClient;
use crate::pki::{CertUsage, CertificateAuthority, LeafSpec};
use crate::render::{self, Names, RenderInputs};

/// Certificates are valid this long; rotation is a later feature.
const CERT_VALIDITY_DAYS: u32 = 365;

/// Executes one step.
pub async fn execute(
    step: &Step,
    cluster: &EtcdCluster,
    resolved: &Resolved,
    observed: &Observed,
    workload: &WorkloadCluster,
    ctx: &Context,
) -> Result<()> {
    let inputs = &resolved.inputs;
    let names = observed.names();
    let ns = inputs.workload_namespace.as_str();
    let client = workload.client.clone();
    let err = |source| Error::WorkloadApi {
        server: workload.server.clone(),
        source,
    };
    match step {
        Step::WriteObjects(kinds) => {
            for kind in kinds {
                write_object(*kind, cluster, inputs, observed, workload, ctx).await?;
            }
            Ok(())
        }
        Step::Bootstrap { replicas } => {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            if cms
                .get_opt(&names.members_configmap())
                .await
                .map_err(err)?
                .is_none()
            {
                let (initial, state) = if *replicas == 1 {
                    (render::initial_cluster(names, inputs.tls, [0]), "new")
                } else {
                    (
                        render::initial_cluster(names, inputs.tls, 0..*replicas),
                        "existing",
                    )
                };
                apply(&cms, &render::members_configmap(inputs, &initial, state))
                    .await
                    .map_err(err)?;
            }
            if let Some(record) = &inputs.restore {
                write_restore_credentials(cluster, ctx, inputs, record, &client)
                    .await
                    .map_err(|e| match e {
                        RestoreSecretError::Workload(source) => err(source),
                        RestoreSecretError::Other(e) => e,
                    })?;
            }
            let sts = render::statefulset(inputs, &ctx.profile, *replicas as i32);
            let api = Api::<StatefulSet>::namespaced(client, ns);
            let stored = apply(&api, &sts).await.map_err(err)?;
            record_admitted_image(&api, &stored, &ctx.profile.statefulset_hash(inputs), inputs)
                .await
                .map_err(err)?;
            Ok(())
        }
        Step::ScaleStatefulSet { replicas } => {
            let sts = observed
                .statefulset
                .as_ref()
                .ok_or_else(|| Error::Invalid("StatefulSet vanished".into()))?;
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": sts.resource_version() },
                "spec": { "replicas": replicas },
            });
            Api::<StatefulSet>::namespaced(client, ns)
                .patch(
                    &names.statefulset(),
                    &crate::controller_patch_params(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(err)?;
            Ok(())
        }
        Step::RecordPvcMember {
            ordinal,
            member_id,
            version,
        } => {
            let mut annotations = serde_json::json!({
                PVC_MEMBER_ANNOTATION: format!("{member_id:x}"),
                PVC_OWNER_ANNOTATION: resolved.inputs.owner_label(),
            });
            if let Some(version) = version {
                annotations[PVC_VERSION_ANNOTATION] = serde_json::json!(version);
            }
            // A merge patch of our own annotations only, on the PVC the
            // observation listed (its owner was checked there).
            let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
            Api::<PersistentVolumeClaim>::namespaced(client, ns)
                .patch(
                    &names.pvc(*ordinal),
                    &crate::controller_patch_params(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(err)?;
            Ok(())
        }
        Step::DeleteStaleStorage { ordinal } => {
            if let Some(pvc) = observed.pvcs.get(ordinal) {
                delete_exact(
                    &Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns),
                    pvc,
                )
                .await
                .map_err(err)?;
            }
            if let Some(pod) = observed.pods.get(ordinal) {
                delete_exact(&Api::<Pod>::namespaced(client, ns), pod)
                    .await
                    .map_err(err)?;
            }
            Ok(())
        }
        Step::AddLearner { ordinal } => {
            let health = observed
                .health
                .as_ref()
                .ok_or_else(|| Error::Invalid("no etcd observation".into()))?;
            let mut ordinals: Vec<u32> = health
                .members()
                .iter()
                .filter_map(|m| m.member.peer_urls.first())
                .filter_map(|u| names.ordinal_of_peer_url(u))
                .collect();
            ordinals.push(*ordinal);
            ordinals.sort();
            ordinals.dedup();
            let initial = render::initial_cluster(names, inputs.tls, ordinals);
            apply(
                &Api::<ConfigMap>::namespaced(client, ns),
                &render::members_configmap(inputs, &initial, "existing"),
            )
            .await
            .map_err(err)?;
            etcd_client(observed)
                .await?
                .add_learner(&[names.peer_url(*ordinal, inputs.tls)])
                .await?;
            Ok(())
        }
        Step::PromoteLearner { member_id, .. } => {
            etcd_client(observed)
                .await?
                .promote_learner(*member_id)
                .await?;
            Ok(())
        }
        Step::MoveLeader { to, .. } => {
            etcd_client(observed).await?.move_leader(*to).await?;
            Ok(())
        }
        Step::RemoveMember { member_id, .. } => {
            etcd_client(observed)
                .await?
                .remove_member(*member_id)
                .await?;
            Ok(())
        }
        Step::DeletePvc { ordinal } => {
            if let Some(pvc) = observed.pvcs.get(ordinal) {
                delete_exact(&Api::<PersistentVolumeClaim>::namespaced(client, ns), pvc)
                    .await
                    .map_err(err)?;
            }
            Ok(())
        }
        Step::RecoverFromNoSpace => recover_from_nospace(inputs, observed).await,
        Step::Defragment { ordinal, .. } => {
            member_client(observed, *ordinal, inputs.tls)
                .await?
                .defragment()
                .await?;
            Ok(())
        }
        Step::RestartMember { ordinal, .. } => {
            if let Some(pod) = observed.pods.get(ordinal) {
                // Leave first: etcd stops only after its clients have.
                if let Some(etcd) = &observed.etcd {
                    let url = observed.names().client_url(*ordinal, inputs.tls);
                    if let Err(e) = etcd.disconnect(&url).await {
                        tracing::debug!(error = %e, member = %url, "could not close the connection before the restart");
                    }
                }
                delete_exact(&Api::<Pod>::namespaced(client, ns), pod)
                    .await
                    .map_err(err)?;
            }
            Ok(())
        }
    }
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

/// If the API server stored another image than the one written (an admission
/// webhook), records it (for the inputs hash `hash` the write carried) so the
/// next reconcile does not see drift and write again, forever. Conditional
/// on the stored object's resourceVersion.
async fn record_admitted_image(
    api: &Api<StatefulSet>,
    stored: &StatefulSet,
    hash: &str,
    inputs: &RenderInputs,
) -> kube::Result<()> {
    let Some(image) = render::statefulset_image(stored) else {
        return Ok(());
    };
    if image == inputs.image {
        return Ok(());
    }
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": stored.resource_version(),
            "annotations": {
                render::ADMITTED_IMAGE: render::admitted_image(hash, image)
            }
        }
    });
    api.patch(
        &stored.name_any(),
        &crate::controller_patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

enum RestoreSecretError {
    Workload(kube::Error),
    Other(Error),
}

/// Copies the object-store credentials of a restore into the workload
/// namespace (`<cluster>-etcd-restore`), where member 0's seeder reads them
/// through `secretKeyRef`. Read from the management cluster by direct GET;
/// a Secret of that name owned by anyone else is never overwritten.
async fn write_restore_credentials(
    cluster: &EtcdCluster,
    ctx: &Context,
    inputs: &RenderInputs,
    record: &etcdfleet_api::restore::RestoreRecord,
    client: &kube::Client,
) -> Result<(), RestoreSecretError> {
    if record.destination.credentials_secret_name.is_none() {
        return Ok(());
    }
    let names = inputs.names();
    let credentials = crate::backup::store::read_credentials(
        &ctx.management,
        &cluster.namespace().unwrap_or_default(),
        &record.destination,
    )
    .await
    .map_err(|e| match e {
        crate::backup::store::StoreError::Api(e) => {
            RestoreSecretError::Other(Error::ManagementApi(e))
        }
        other => RestoreSecretError::Other(Error::Invalid(format!("restore credentials: {other}"))),
    })?;
    let Some(credentials) = credentials else {
        return Ok(());
    };
    let api = Api::<Secret>::namespaced(client.clone(), &inputs.workload_namespace);
    let name = names.restore_secret();
    if let Some(existing) = api
        .get_opt(&name)
        .await
        .map_err(RestoreSecretError::Workload)?
    {
        let owner = render::owner_of(existing.meta());
        if owner != Some(inputs.owner_label().as_str()) {
            return Err(RestoreSecretError::Other(Error::Invalid(format!(
                "Secret {}/{name} exists and belongs to {}; not overwritten",
                inputs.workload_namespace,
                owner.unwrap_or("nobody (no etcdfleet.dev/owner label)")
            ))));
        }
    }
    let mut labels = render::selector_labels(&names);
    labels.insert(render::OWNER_LABEL.into(), inputs.owner_label());
    let mut data = BTreeMap::new();
    let values = [
        Some(credentials.access_key_id),
        Some(credentials.secret_access_key),
        credentials.session_token,
    ];
    for ((key, _), value) in render::RESTORE_CREDENTIAL_KEYS.iter().zip(values) {
        if let Some(v) = value {
            data.insert(key.to_string(), ByteString(v.into_bytes()));
        }
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(inputs.workload_namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    };
    apply(&api, &secret)
        .await
        .map(|_| ())
        .map_err(RestoreSecretError::Workload)
}

/// Server-side apply with this controller's field manager.
async fn apply<K>(api: &Api<K>, obj: &K) -> kube::Result<K>
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
async fn delete_exact<K>(api: &Api<K>, obj: &K) -> kube::Result<()>
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

fn tls_secret(
    inputs: &RenderInputs,
    name: String,
    kind: ObjectKind,
    ca_pem: &str,
    cert: &crate::pki::IssuedCert,
) -> Secret {
    let names = inputs.names();
    let mut labels = render::selector_labels(&names);
    labels.insert(render::OWNER_LABEL.into(), inputs.owner_label());
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(inputs.workload_namespace.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                render::INPUTS_HASH.to_string(),
                inputs.identity_hash(&format!("{kind:?}")),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("ca.crt".to_string(), ByteString(ca_pem.as_bytes().to_vec())),
            (
                "tls.crt".to_string(),
                ByteString(cert.cert_pem.as_bytes().to_vec()),
            ),
            (
                "tls.key".to_string(),
                ByteString(cert.key_pem.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    }
}

async fn write_object(
    kind: ObjectKind,
    cluster: &EtcdCluster,
    inputs: &RenderInputs,
    observed: &Observed,
    workload: &WorkloadCluster,
    ctx: &Context,
) -> Result<()> {
    let names = observed.names();
    let ns = inputs.workload_namespace.as_str();
    let client = workload.client.clone();
    let err = |source| Error::WorkloadApi {
        server: workload.server.clone(),
        source,
    };
    match kind {
        ObjectKind::Pki => match &observed.pki {
            Some(pki) => renew_client_identity(cluster, ctx, names, pki).await,
            None => create_pki(cluster, ctx, names).await,
        },
        ObjectKind::Namespace => {
            match Api::<Namespace>::all(client)
                .create(&PostParams::default(), &render::namespace(inputs))
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(err(e)),
            }
        }
        ObjectKind::ServerTlsSecret | ObjectKind::PeerTlsSecret => {
            // The Pki step comes first in the same WriteObjects; read it back.
            let pki = match &observed.pki {
                Some(p) => p.clone(),
                None => super::observe::read_pki(&ctx.management, cluster, names)
                    .await?
                    .ok_or_else(|| Error::Invalid("PKI Secret missing".into()))?,
            };
            let (name, usage, cn) = if kind == ObjectKind::ServerTlsSecret {
                (names.server_tls_secret(), CertUsage::Server, "etcd-server")
            } else {
                (names.peer_tls_secret(), CertUsage::Peer, "etcd-peer")
            };
            let cert = pki.ca.issue(&LeafSpec {
                common_name: cn.to_string(),
                dns_names: names.member_dns_names(),
                ip_addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
                usage,
                validity_days: CERT_VALIDITY_DAYS,
            })?;
            let secret = tls_secret(inputs, name, kind, pki.ca.cert_pem(), &cert);
            apply(&Api::<Secret>::namespaced(client, ns), &secret)
                .await
                .map_err(err)?;
            Ok(())
        }
        ObjectKind::PeerService => apply(
            &Api::<Service>::namespaced(client, ns),
            &render::peer_service(inputs),
        )
        .await
        .map(|_| ())
        .map_err(err),
        ObjectKind::ClientService => apply(
            &Api::<Service>::namespaced(client, ns),
            &render::client_service(inputs),
        )
        .await
        .map(|_| ())
        .map_err(err),
        ObjectKind::PodDisruptionBudget => apply(
            &Api::<PodDisruptionBudget>::namespaced(client, ns),
            &render::pdb(inputs),
        )
        .await
        .map(|_| ())
        .map_err(err),
        ObjectKind::MembersConfigMap => {
            // Lost after bootstrap: members start with existing data, or join
            // as learners that AddLearner announces again.
            let ordinals: Vec<u32> = match &observed.health {
                Some(h) => h
                    .members()
                    .iter()
                    .filter_map(|m| m.member.peer_urls.first())
                    .filter_map(|u| names.ordinal_of_peer_url(u))
                    .collect(),
                None => observed.pvcs.keys().copied().collect(),
            };
            let initial = render::initial_cluster(names, inputs.tls, ordinals);
            apply(
                &Api::<ConfigMap>::namespaced(client, ns),
                &render::members_configmap(inputs, &initial, "existing"),
            )
            .await
            .map(|_| ())
            .map_err(err)
        }
        ObjectKind::StatefulSet => {
            let replicas = observed
                .planner
                .statefulset
                .as_ref()
                .map_or(1, |s| s.replicas as i32);
            // The members keep the token they were bootstrapped with (etcd
            // ignores it on a data directory, but the template stays true).
            let inputs = &RenderInputs {
                initial_cluster_token: observed
                    .statefulset
                    .as_ref()
                    .and_then(render::statefulset_cluster_token),
                ..inputs.clone()
            };
            let api = Api::<StatefulSet>::namespaced(client, ns);
            let stored = apply(&api, &render::statefulset(inputs, &ctx.profile, replicas))
                .await
                .map_err(err)?;
            record_admitted_image(&api, &stored, &ctx.profile.statefulset_hash(inputs), inputs)
                .await
                .map_err(err)
        }
    }
}

/// Reissues the controller's client certificate (same CA) in the PKI Secret.
async fn renew_client_identity(
    cluster: &EtcdCluster,
    ctx: &Context,
    names: &Names,
    pki: &super::observe::Pki,
) -> Result<()> {
    let client = pki.ca.issue(&LeafSpec::client(
        "etcdfleet-controller",
        CERT_VALIDITY_DAYS,
    ))?;
    let patch = serde_json::json!({
        "data": {
            PKI_CLIENT_CERT: ByteString(client.cert_pem.into_bytes()),
            PKI_CLIENT_KEY: ByteString(client.key_pem.into_bytes()),
        }
    });
    Api::<Secret>::namespaced(
        ctx.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    )
    .patch(
        &names.pki_secret(),
        &crate::controller_patch_params(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(Error::ManagementApi)?;
    Ok(())
}

/// Creates the management-side PKI Secret: a CA for this etcd cluster and the
/// controller's client identity. Owned by the EtcdCluster (same cluster).
async fn create_pki(cluster: &EtcdCluster, ctx: &Context, names: &Names) -> Result<()> {
    let ca = CertificateAuthority::generate(&format!("etcdfleet {}", names.cluster))?;
    let client = ca.issue(&LeafSpec::client(
        "etcdfleet-controller",
        CERT_VALIDITY_DAYS,
    ))?;
    let owner = OwnerReference {
        api_version: EtcdCluster::api_version(&()).into_owned(),
        kind: "EtcdCluster".into(),
        name: cluster.name_any(),
        uid: cluster.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(names.pki_secret()),
            namespace: cluster.namespace(),
            owner_references: Some(vec![owner]),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "etcdfleet".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (
                PKI_CA_CERT.to_string(),
                ByteString(ca.cert_pem().as_bytes().to_vec()),
            ),
            (
                PKI_CA_KEY.to_string(),
                ByteString(ca.key_pem().as_bytes().to_vec()),
            ),
            (
                PKI_CLIENT_CERT.to_string(),
                ByteString(client.cert_pem.as_bytes().to_vec()),
            ),
            (
                PKI_CLIENT_KEY.to_string(),
                ByteString(client.key_pem.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    };
    let api: Api<Secret> = Api::namespaced(
        ctx.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        // Another reconcile created it first: keep theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::ManagementApi(e)),
    }
}

/// Deletion: remove what this cluster created in the workload cluster
/// (everything but the PVCs, which outlive an accidental delete), then
/// release the finalizer. A workload cluster whose kubeconfig Secret is gone
/// is gone for good: nothing to clean. One that stays unreachable is given up
/// on after `deletion_timeout`, with a warning event naming what was left.
pub async fn finalize(cluster: &EtcdCluster, ctx: &Context) -> Result<Outcome> {
    if !cluster.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Outcome::Deleted);
    }
    let cleanup = cleanup_workload(cluster, ctx).await;
    match cleanup {
        Ok(()) => {}
        Err(Error::Connect(ConnectError::SecretNotFound(_) | ConnectError::NoClusterReference)) => {
            publish(
                ctx,
                cluster,
                EventType::Normal,
                "WorkloadClusterGone",
                "the kubeconfig Secret is gone; nothing left to clean up in the workload cluster",
            )
            .await;
        }
        Err(e) => {
            let deleted_at = cluster
                .meta()
                .deletion_timestamp
                .as_ref()
                .map(|t| t.0)
                .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
            let waited = k8s_openapi::jiff::Timestamp::now().duration_since(deleted_at);
            let waited = std::time::Duration::try_from(waited).unwrap_or_default();
            if waited < ctx.settings.deletion_timeout {
                return Ok(Outcome::Waiting(format!(
                    "deletion waits for the workload cluster ({e}); gives up after {:?}",
                    ctx.settings.deletion_timeout
                )));
            }
            publish(
                ctx,
                cluster,
                EventType::Warning,
                "CleanupAbandoned",
                &format!(
                    "workload cluster unreachable for {:?} ({e}); etcd objects were left in it",
                    ctx.settings.deletion_timeout
                ),
            )
            .await;
        }
    }
    let api: Api<EtcdCluster> = Api::namespaced(
        ctx.management.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let finalizers: Vec<String> = cluster
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let patch = serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": cluster.resource_version() }
    });
    if let Some(location) = KubeconfigLocation::of(cluster) {
        ctx.connector.forget(&location);
    }
    ctx.metrics.forget_cluster(&format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    ));
    match api
        .patch(
            &cluster.name_any(),
            &crate::controller_patch_params(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(Outcome::Deleted),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Outcome::Deleted),
        Err(e) => Err(Error::ManagementApi(e)),
    }
}

async fn cleanup_workload(cluster: &EtcdCluster, ctx: &Context) -> Result<()> {
    let location = KubeconfigLocation::of(cluster).ok_or(ConnectError::NoClusterReference)?;
    let workload = ctx.connector.connect(&location).await?;
    // The workload namespace this resource manages: the recorded identity,
    // else the spec as last resolved.
    let ns = match cluster.status.as_ref().and_then(|s| s.identity.as_ref()) {
        Some(identity) => identity.workload_namespace.clone(),
        None => super::resolve::resolve_own_spec(&cluster.spec)
            .map(|r| r.spec.workload_namespace)
            .unwrap_or_else(|_| etcdfleet_api::template::DEFAULT_WORKLOAD_NAMESPACE.to_string()),
    };
    let names = Names::new(&cluster.name_any(), &ns);
    // Only objects carrying this cluster's owner label are deleted.
    let owner = format!(
        "{}.{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let owner = owner.as_str();
    let client = workload.client.clone();
    let err = |source| Error::WorkloadApi {
        server: workload.server.clone(),
        source,
    };
    delete_named::<StatefulSet>(&client, &ns, owner, &names.statefulset())
        .await
        .map_err(err)?;
    delete_named::<PodDisruptionBudget>(&client, &ns, owner, &names.pdb())
        .await
        .map_err(err)?;
    delete_named::<Service>(&client, &ns, owner, &names.client_service())
        .await
        .map_err(err)?;
    delete_named::<Service>(&client, &ns, owner, &names.peer_service())
        .await
        .map_err(err)?;
    delete_named::<ConfigMap>(&client, &ns, owner, &names.members_configmap())
        .await
        .map_err(err)?;
    delete_named::<Secret>(&client, &ns, owner, &names.server_tls_secret())
        .await
        .map_err(err)?;
    delete_named::<Secret>(&client, &ns, owner, &names.peer_tls_secret())
        .await
        .map_err(err)?;
    delete_named::<Secret>(&client, &ns, owner, &names.restore_secret())
        .await
        .map_err(err)?;
    Ok(())
}

/// Deletes an object of ours if it exists and carries our owner label, with
/// UID/resourceVersion preconditions taken from a fresh read, so only the
/// object that was seen is deleted. Another owner's object is left alone.
async fn delete_named<K>(
    client: &kube::Client,
    ns: &str,
    owner: &str,
    name: &str,
) -> kube::Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await? {
        Some(obj) if render::owner_of(obj.meta()) == Some(owner) => delete_exact(&api, &obj).await,
        _ => Ok(()),
    }
}
