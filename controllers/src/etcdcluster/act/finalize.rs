//! Deletion of an EtcdCluster: what it created in the workload cluster is
//! removed (never the PVCs), then the finalizer is released.

use etcdfleet_api::EtcdCluster;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::super::cluster_object::ClusterObject;
use super::super::context::{Context, Error, FINALIZER, Outcome, Result};
use super::target::delete_exact;
use crate::connector::{ConnectError, KubeconfigLocation};
use crate::render::{self, Names};

/// Deletion: remove what this cluster created in the workload cluster
/// (everything but the PVCs, which outlive an accidental delete), then
/// release the finalizer. A workload cluster whose kubeconfig Secret is gone
/// is gone for good: nothing to clean. One that stays unreachable is given up
/// on after `deletion_timeout`, with a warning event naming what was left.
pub async fn finalize(
    cluster: &EtcdCluster,
    ctx: &Context,
    object: &mut ClusterObject,
) -> Result<Outcome> {
    if !cluster.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Outcome::Deleted);
    }
    let cleanup = cleanup_workload(cluster, ctx).await;
    match cleanup {
        Ok(()) => {}
        // A name no Secret can have never reached a workload cluster.
        Err(Error::Connect(
            ConnectError::SecretNotFound(_)
            | ConnectError::NoClusterReference
            | ConnectError::InvalidReference(_),
        )) => {
            ctx.publish(
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
            ctx.publish(
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
    let finalizers: Vec<String> = cluster
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if let Some(location) = KubeconfigLocation::of(cluster) {
        ctx.connector.forget(&location);
    }
    let key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    ctx.metrics.forget_cluster(&key);
    ctx.recovery.forget(&key);
    let released = object
        .merge(serde_json::json!({ "metadata": { "finalizers": finalizers } }))
        .await;
    match released {
        Ok(_) => Ok(Outcome::Deleted),
        Err(Error::ManagementApi(kube::Error::Api(s))) if s.code == 404 => Ok(Outcome::Deleted),
        Err(e) => Err(e),
    }
}

async fn cleanup_workload(cluster: &EtcdCluster, ctx: &Context) -> Result<()> {
    let location = KubeconfigLocation::of(cluster).ok_or(ConnectError::NoClusterReference)?;
    let workload = ctx.connector.connect(&location).await?;
    // The workload namespace this resource manages: the recorded identity,
    // else the spec as last resolved.
    let ns = match cluster.status.as_ref().and_then(|s| s.identity.as_ref()) {
        Some(identity) => identity.workload_namespace.clone(),
        None => etcdfleet_api::template::resolve_own_spec(&cluster.spec)
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
    // A restore drill running as the cluster goes (its Secret goes with it).
    delete_named::<Pod>(&client, &ns, owner, &names.drill_pod())
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
