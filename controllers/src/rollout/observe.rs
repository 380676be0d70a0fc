//! Observe step of a rollout: the selected clusters, read from the
//! controller's EtcdCluster cache (the reflectors of the cluster
//! controllers: a rollout adds no list or watch of clusters, whatever the
//! fleet's size), and the generation of the template a rebase targets (one
//! GET per template, not per cluster). [`view_of`] turns one cluster into
//! what the planner reads; the offline preview uses it too.

use std::collections::BTreeMap;
use std::sync::Arc;

use etcdfleet_api::template::REBASE_ANNOTATION;
use etcdfleet_api::{
    ClusterEtcdTemplate, EtcdCluster, EtcdFleetRollout, EtcdTemplate, TemplateKind, TemplateRef,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::plan::{ClusterView, FieldOwner, ReportedState};
use crate::access::Access;

/// The owners of `spec.<field>` among a cluster's managedFields.
fn owners_of(entries: &[ManagedFieldsEntry], field: &str) -> Vec<FieldOwner> {
    let key = format!("f:{field}");
    entries
        .iter()
        .filter(|e| e.subresource.as_deref().unwrap_or_default().is_empty())
        .filter(|e| {
            e.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:spec"))
                .and_then(|spec| spec.get(&key))
                .is_some()
        })
        .map(|e| FieldOwner {
            manager: e.manager.clone().unwrap_or_default(),
            operation: e.operation.clone().unwrap_or_default(),
            time: e.time.as_ref().map(|t| t.0),
        })
        .collect()
}

/// `namespace/name` of a cluster.
pub fn key_of(cluster: &EtcdCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// What the planner reads of one cluster. `template_generation`: the
/// current generation of the template a rebase targets, as this cluster
/// resolves it.
pub fn view_of(cluster: &EtcdCluster, template_generation: Option<i64>) -> ClusterView {
    let entries = cluster
        .metadata
        .managed_fields
        .as_deref()
        .unwrap_or_default();
    ClusterView {
        key: key_of(cluster),
        resource_version: cluster.metadata.resource_version.clone(),
        generation: cluster.metadata.generation,
        created: cluster.metadata.creation_timestamp.as_ref().map(|t| t.0),
        deleting: cluster.metadata.deletion_timestamp.is_some(),
        paused: cluster.spec.paused == Some(true),
        version: cluster.spec.config.version.clone(),
        template_ref: cluster.spec.template_ref.clone(),
        rebase_pending: cluster.annotations().contains_key(REBASE_ANNOTATION),
        version_owners: owners_of(entries, "version"),
        template_owners: owners_of(entries, "templateRef"),
        target_template_generation: template_generation,
        reported: ReportedState::from_status(cluster.status.as_ref()),
    }
}

/// Whether a rollout's selector takes a cluster.
pub fn selected(rollout: &EtcdFleetRollout, cluster: &EtcdCluster) -> bool {
    rollout.spec.selector.selects(
        &cluster.namespace().unwrap_or_default(),
        &cluster.name_any(),
        cluster.labels(),
    )
}

/// Where the cluster reconcilers' cache is read: every cached EtcdCluster
/// (the reflectors' stores), cloned as `Arc`s.
pub type ClusterCache = Arc<dyn Fn() -> Vec<Arc<EtcdCluster>> + Send + Sync>;

/// The selected clusters of this controller's scope (sharded: whichever
/// replica reconciles them), as the cache shows them,
/// with the generations of a rebase's template.
pub async fn observe(
    rollout: &EtcdFleetRollout,
    cache: &ClusterCache,
    access: &Access,
) -> Result<(Vec<Arc<EtcdCluster>>, Vec<ClusterView>), kube::Error> {
    let clusters: Vec<Arc<EtcdCluster>> = cache()
        .into_iter()
        .filter(|c| access.in_scope(c) && selected(rollout, c))
        .collect();
    let generations = match &rollout.spec.template_ref {
        Some(target) => template_generations(&access.management, target, &clusters).await?,
        None => BTreeMap::new(),
    };
    let views = clusters
        .iter()
        .map(|c| {
            let ns = c.namespace().unwrap_or_default();
            view_of(c, generations.get(&ns).copied().flatten())
        })
        .collect();
    Ok((clusters, views))
}

/// The current generation of the rebase target, per cluster namespace (a
/// `ClusterEtcdTemplate` is one object; an `EtcdTemplate` is the one of
/// that name in each cluster's namespace). One GET per object.
async fn template_generations(
    client: &Client,
    target: &TemplateRef,
    clusters: &[Arc<EtcdCluster>],
) -> Result<BTreeMap<String, Option<i64>>, kube::Error> {
    let namespaces: std::collections::BTreeSet<String> = clusters
        .iter()
        .map(|c| c.namespace().unwrap_or_default())
        .collect();
    let mut out = BTreeMap::new();
    match target.kind {
        TemplateKind::ClusterEtcdTemplate => {
            let api: Api<ClusterEtcdTemplate> = Api::all(client.clone());
            let generation = api
                .get_opt(&target.name)
                .await?
                .and_then(|t| t.metadata.generation);
            for ns in namespaces {
                out.insert(ns, generation);
            }
        }
        TemplateKind::EtcdTemplate => {
            for ns in namespaces {
                let api: Api<EtcdTemplate> = Api::namespaced(client.clone(), &ns);
                let generation = api
                    .get_opt(&target.name)
                    .await?
                    .and_then(|t| t.metadata.generation);
                out.insert(ns, generation);
            }
        }
    }
    Ok(out)
}
