//! Where a cluster's drill runs (its workload cluster, the pod's name and
//! namespace, the owner label), and what every stage of a drill shares:
//! the report, the removal of the pod, the result it starts from.

use etcdfleet_api::EtcdBackup;
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::backup::{DrillResult, drill_result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};

use super::pod::DRILL_LABEL;
use crate::backup::context::Context;
use crate::connector::{KubeconfigLocation, WorkloadCluster};
use crate::render::OWNER_LABEL;

/// What the drill part of a schedule reconcile reports in its status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrillReport {
    pub in_progress: Option<DrillResult>,
    /// The drill that finished in this reconcile (its backup's status was
    /// read before it).
    pub finished: Option<DrillResult>,
    pub next: Option<String>,
    /// Something moved: look again soon.
    pub busy: bool,
}

impl DrillReport {
    pub(super) fn next(why: impl Into<String>) -> Self {
        DrillReport {
            next: Some(why.into()),
            ..Default::default()
        }
    }
}

/// The newest drill result among `backups` (the schedule's `lastDrill`).
pub fn last_drill(backups: &[EtcdBackup]) -> Option<DrillResult> {
    backups
        .iter()
        .filter_map(|b| b.status.as_ref()?.last_drill.clone())
        .max_by_key(|d| d.completed_at.as_ref().map(|t| t.0))
}

/// Where a cluster's drill runs: its workload cluster, the pod's name and
/// namespace, the owner label its objects carry.
pub(super) struct Site {
    pub(super) workload: WorkloadCluster,
    pub(super) namespace: String,
    pub(super) pod_name: String,
    pub(super) owner: String,
    /// `namespace/name` of the EtcdCluster.
    pub(super) key: String,
}

impl Site {
    pub(super) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.workload.client.clone(), &self.namespace)
    }
}

/// The workload cluster of `cluster` and where its drill pod lives.
pub(super) async fn reach(
    ctx: &Context,
    cluster: &EtcdCluster,
) -> std::result::Result<Site, String> {
    let (names, _) = crate::backup::act::members_of(cluster)
        .ok_or_else(|| "the cluster's template does not resolve".to_string())?;
    let location = KubeconfigLocation::of(cluster)
        .ok_or_else(|| "the cluster names no workload cluster".to_string())?;
    let workload = (ctx.access().connector.connect(&location).await)
        .map_err(|e| format!("workload cluster unreachable: {e}"))?;
    let ns = cluster.namespace().unwrap_or_default();
    Ok(Site {
        workload,
        pod_name: names.drill_pod(),
        namespace: names.namespace.clone(),
        owner: format!("{ns}.{}", cluster.name_any()),
        key: format!("{ns}/{}", cluster.name_any()),
    })
}

/// Removes the drill pod (its credentials Secret goes with it: the pod
/// owns it) and frees the slot once it is gone.
pub(super) async fn remove(site: &Site, pod: &Pod) -> std::result::Result<(), String> {
    let api = site.pods();
    let uid = pod.uid();
    let params = DeleteParams {
        preconditions: uid.map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            ..Default::default()
        }),
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    match api.delete(&site.pod_name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(format!("deleting drill pod {}: {e}", site.pod_name)),
    }
}

/// Whether `pod` is this cluster's drill pod (made by etcdfleet for it).
pub(super) fn ours(site: &Site, pod: &Pod) -> bool {
    pod.labels().get(OWNER_LABEL) == Some(&site.owner) && pod.labels().contains_key(DRILL_LABEL)
}

/// A drill result of `backup`, started at `started`.
pub(super) fn result(backup: &str, started: Option<Timestamp>, now: Timestamp) -> DrillResult {
    DrillResult {
        backup: backup.to_string(),
        started_at: started.map(Time),
        completed_at: Some(Time(now)),
        result: drill_result::ERROR.to_string(),
        ..Default::default()
    }
}
