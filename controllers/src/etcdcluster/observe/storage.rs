//! What a storage change reads ([`crate::etcdcluster::plan::storage`]):
//! each member claim's size, the StatefulSet's claim template and, only
//! while a claim asks for less than the spec, the members' StorageClass.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;

use super::super::plan::observation::{ClaimSize, Expansion, StorageObservation};
use crate::connector::WorkloadCluster;
use crate::render::{self, RenderInputs};

/// A member claim's size as its spec and status say, at `now`; a file
/// system resize pending for `restart_after` waits for a restart.
pub fn claim_size(
    pvc: &PersistentVolumeClaim,
    now: Timestamp,
    restart_after: Duration,
) -> ClaimSize {
    let storage = |m: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { m.and_then(|m| m.get("storage")).map(|q| q.0.clone()) };
    let spec = pvc.spec.as_ref();
    let status = pvc.status.as_ref();
    let conditions = status.and_then(|s| s.conditions.as_ref());
    let condition = |kind: &str| {
        conditions
            .into_iter()
            .flatten()
            .find(|c| c.type_ == kind && c.status == "True")
    };
    let pending_since = condition("FileSystemResizePending")
        .map(|c| c.last_transition_time.as_ref().map_or(now, |t| t.0));
    let infeasible = status
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .and_then(|m| m.get("storage"))
        .filter(|s| s.ends_with("Infeasible"))
        .map(|s| format!("Kubernetes reports {s}"));
    let error = ["ControllerResizeError", "NodeResizeError"]
        .iter()
        .find_map(|k| condition(k))
        .map(|c| c.message.clone().unwrap_or_else(|| c.type_.clone()))
        .or(infeasible);
    ClaimSize {
        class: spec.and_then(|s| s.storage_class_name.clone()),
        requested: storage(spec.and_then(|s| s.resources.as_ref()?.requests.as_ref())),
        capacity: storage(status.and_then(|s| s.capacity.as_ref())),
        restart_pending: pending_since.is_some_and(|t| {
            SignedDuration::try_from(restart_after)
                .is_ok_and(|after| now.duration_since(t) >= after)
        }),
        error,
    }
}

/// Each member claim's size (at `now`, a resize pending for `restart_after`
/// waiting for a restart), and the storage the spec asks for, the
/// StatefulSet's claim template and the StorageClass when a claim must grow.
pub async fn read(
    workload: &WorkloadCluster,
    inputs: &RenderInputs,
    statefulset: Option<&StatefulSet>,
    pvcs: &BTreeMap<u32, PersistentVolumeClaim>,
    (now, restart_after): (Timestamp, Duration),
) -> (BTreeMap<u32, ClaimSize>, StorageObservation) {
    let claims: BTreeMap<u32, ClaimSize> = (pvcs.iter())
        .map(|(o, p)| (*o, claim_size(p, now, restart_after)))
        .collect();
    let want = etcdfleet_api::quantity::bytes(&inputs.storage_size).ok();
    let short = |c: &ClaimSize| {
        let requested = c
            .requested
            .as_deref()
            .and_then(|q| etcdfleet_api::quantity::bytes(q).ok());
        matches!((requested, want), (Some(r), Some(w)) if r < w)
    };
    let expansion = match claims.values().find(|c| short(c)) {
        None => Expansion::NotRead,
        Some(claim) => expansion(workload, claim.class.as_deref()).await,
    };
    let storage = StorageObservation {
        size: inputs.storage_size.clone(),
        class: inputs.storage_class.clone(),
        template: statefulset.and_then(render::statefulset_storage),
        expansion,
    };
    (claims, storage)
}

async fn expansion(workload: &WorkloadCluster, class: Option<&str>) -> Expansion {
    let Some(class) = class.filter(|c| !c.is_empty()) else {
        return Expansion::NoClass;
    };
    let classes: Api<StorageClass> = Api::all(workload.client.clone());
    match classes.get_opt(class).await {
        Ok(Some(sc)) if sc.allow_volume_expansion == Some(true) => Expansion::Allowed(class.into()),
        Ok(Some(_)) => Expansion::NotAllowed(class.into()),
        Ok(None) => Expansion::Missing(class.into()),
        Err(e) => Expansion::Unreadable {
            class: class.into(),
            error: match &e {
                kube::Error::Api(s) if s.code == 403 => format!(
                    "{e}; the controller's identity needs get on storageclasses \
                     (config/workload-rbac-nodes)"
                ),
                _ => e.to_string(),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(status: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data-c-etcd-0"},
            "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "2Gi"}}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_file_system_waiting_for_a_restart_is_restarted_only_after_a_while() {
        let now: Timestamp = "2026-11-27T12:00:40Z".parse().unwrap();
        let pending = |since: &str| {
            claim(serde_json::json!({
                "capacity": {"storage": "1Gi"},
                "conditions": [{"type": "FileSystemResizePending", "status": "True",
                    "lastTransitionTime": since}],
            }))
        };
        let after = Duration::from_secs(30);
        let size = claim_size(&pending("2026-11-27T12:00:00Z"), now, after);
        assert_eq!(size.class.as_deref(), Some("fast"));
        assert_eq!(size.requested.as_deref(), Some("2Gi"));
        assert_eq!(size.capacity.as_deref(), Some("1Gi"));
        assert!(size.restart_pending, "pending for 40 s");
        let size = claim_size(&pending("2026-11-27T12:00:30Z"), now, after);
        assert!(
            !size.restart_pending,
            "pending for 10 s: the kubelet may still grow it"
        );
        assert_eq!(size.error, None);
    }

    #[test]
    fn a_resize_error_or_an_infeasible_size_is_reported() {
        let now = Timestamp::now();
        let failed = claim(serde_json::json!({
            "capacity": {"storage": "1Gi"},
            "conditions": [{"type": "ControllerResizeError", "status": "True",
                "message": "quota exceeded"}],
        }));
        let size = claim_size(&failed, now, Duration::from_secs(30));
        assert_eq!(size.error.as_deref(), Some("quota exceeded"));
        let infeasible = claim(serde_json::json!({
            "capacity": {"storage": "1Gi"},
            "allocatedResourceStatuses": {"storage": "ControllerResizeInfeasible"},
        }));
        let size = claim_size(&infeasible, now, Duration::from_secs(30));
        assert_eq!(
            size.error.as_deref(),
            Some("Kubernetes reports ControllerResizeInfeasible")
        );
    }
}
