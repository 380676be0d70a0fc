//! What a storage change reads ([`crate::etcdcluster::plan::storage`]):
//! each member claim's size, the StatefulSet's claim template and, only
//! while a claim asks for less than the spec, the members' StorageClass;
//! only while the claim template names another class, the class asked for;
//! only for a claim that stays unbound, its newest event.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::super::context::ReconcilerSettings;
use super::super::plan::observation::{
    ClaimSize, Expansion, SpareNodes, StorageObservation, TargetClass,
};
use crate::connector::WorkloadCluster;
use crate::render::{self, RenderInputs};

/// When a claim's waits are long enough to act on: a file system resize
/// pending for `restart_after` waits for a restart, a claim unbound for
/// `unbound_after` is reported.
#[derive(Clone, Copy)]
pub struct Waits {
    pub now: Timestamp,
    pub restart_after: Duration,
    pub unbound_after: Duration,
}

impl Waits {
    /// At `now`, with the reconciler's settings.
    pub fn of(now: Timestamp, settings: &ReconcilerSettings) -> Self {
        Waits {
            now,
            restart_after: settings.resize_restart_after,
            unbound_after: settings.unbound_after,
        }
    }
}

/// A member claim's size as its spec and status say, at `at.now`.
pub fn claim_size(pvc: &PersistentVolumeClaim, at: Waits) -> ClaimSize {
    let now = at.now;
    let storage = |m: Option<&BTreeMap<String, Quantity>>| {
        m.and_then(|m| m.get("storage")).map(|q| q.0.clone())
    };
    let spec = pvc.spec.as_ref();
    let status = pvc.status.as_ref();
    let conditions = status.and_then(|s| s.conditions.as_ref());
    let condition = |kind: &str| {
        (conditions.into_iter().flatten()).find(|c| c.type_ == kind && c.status == "True")
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
    let waited = |since: Timestamp, after: Duration| {
        SignedDuration::try_from(after).is_ok_and(|after| now.duration_since(since) >= after)
    };
    ClaimSize {
        class: spec.and_then(|s| s.storage_class_name.clone()),
        requested: storage(spec.and_then(|s| s.resources.as_ref()?.requests.as_ref())),
        capacity: storage(status.and_then(|s| s.capacity.as_ref())),
        restart_pending: pending_since.is_some_and(|t| waited(t, at.restart_after)),
        error,
        unprovisioned: unbound_since(pvc)
            .filter(|t| waited(*t, at.unbound_after))
            .map(|t| format!("unbound for {}s", now.duration_since(t).as_secs())),
    }
}

/// Since when `pvc` has been waiting for a volume, if it is.
fn unbound_since(pvc: &PersistentVolumeClaim) -> Option<Timestamp> {
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase.is_some_and(|p| p != "Pending") || pvc.metadata.deletion_timestamp.is_some() {
        return None;
    }
    Some(pvc.metadata.creation_timestamp.as_ref()?.0)
}

/// Each member claim's size (an unbound claim with its newest event), and
/// the storage the spec asks for, the StatefulSet's claim template, the
/// StorageClass when a claim must grow and the class a move goes to.
pub async fn read(
    workload: &WorkloadCluster,
    inputs: &RenderInputs,
    statefulset: Option<&StatefulSet>,
    pvcs: &BTreeMap<u32, PersistentVolumeClaim>,
    at: Waits,
) -> (BTreeMap<u32, ClaimSize>, StorageObservation) {
    let mut claims: BTreeMap<u32, ClaimSize> = (pvcs.iter())
        .map(|(o, p)| (*o, claim_size(p, at)))
        .collect();
    for (o, claim) in claims.iter_mut() {
        if let Some(unbound) = &claim.unprovisioned {
            let ns = &inputs.workload_namespace;
            let why = newest_event(workload, ns, &pvcs[o].name_any()).await;
            claim.unprovisioned = Some(format!("{unbound}; {}", why.unwrap_or_else(|e| e)));
        }
    }
    let want = etcdfleet_api::quantity::bytes(&inputs.storage_size).ok();
    let short = |c: &ClaimSize| {
        let requested =
            (c.requested.as_deref()).and_then(|q| etcdfleet_api::quantity::bytes(q).ok());
        matches!((requested, want), (Some(r), Some(w)) if r < w)
    };
    let expansion = match claims.values().find(|c| short(c)) {
        None => Expansion::NotRead,
        Some(claim) => expansion(workload, claim.class.as_deref()).await,
    };
    let template = statefulset.and_then(render::statefulset_storage);
    let target = match (&inputs.storage_class, &template) {
        (Some(class), Some((has, _))) if has.as_ref() != Some(class) => {
            target_class(workload, class).await
        }
        _ => TargetClass::NotRead,
    };
    let spare_nodes =
        match target == TargetClass::Exists && super::spare_nodes::one_node_each(&inputs.pod) {
            true => super::spare_nodes::read(workload, &inputs.pod).await,
            false => SpareNodes::NotRead,
        };
    let storage = StorageObservation {
        size: inputs.storage_size.clone(),
        class: inputs.storage_class.clone(),
        template,
        expansion,
        target,
        spare: None,
        spare_nodes,
    };
    (claims, storage)
}

/// The newest event about the claim `name`, as a person reads it.
async fn newest_event(workload: &WorkloadCluster, ns: &str, name: &str) -> Result<String, String> {
    let events: Api<Event> = Api::namespaced(workload.client.clone(), ns);
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    let list =
        (events.list(&lp).await).map_err(|e| format!("its events could not be read: {e}"))?;
    let when = |e: &&Event| {
        (e.last_timestamp.as_ref().map(|t| t.0)).or(e.event_time.as_ref().map(|t| t.0))
    };
    let newest = (list.items.iter())
        .filter(|e| e.involved_object.kind.as_deref() == Some("PersistentVolumeClaim"))
        .max_by_key(when);
    Ok(newest.map_or_else(
        || "no event about it".to_string(),
        |e| {
            let reason = e.reason.clone().unwrap_or_default();
            format!("{reason}: {}", e.message.clone().unwrap_or_default())
        },
    ))
}

/// Whether the StorageClass a move goes to exists.
async fn target_class(workload: &WorkloadCluster, class: &str) -> TargetClass {
    match Api::<StorageClass>::all(workload.client.clone())
        .get_opt(class)
        .await
    {
        Ok(Some(_)) => TargetClass::Exists,
        Ok(None) => TargetClass::Missing,
        Err(e) => TargetClass::Unreadable(forbidden_help(e)),
    }
}

/// A read error, with the RBAC that lets it through when it was refused.
fn forbidden_help(e: kube::Error) -> String {
    match &e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{e}; the controller's identity needs get on storageclasses \
             (config/workload-rbac-nodes)"
        ),
        _ => e.to_string(),
    }
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
            error: forbidden_help(e),
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
        let at = Waits {
            now,
            restart_after: Duration::from_secs(30),
            unbound_after: Duration::from_secs(60),
        };
        let size = claim_size(&pending("2026-11-27T12:00:00Z"), at);
        assert_eq!(size.class.as_deref(), Some("fast"));
        assert_eq!(size.requested.as_deref(), Some("2Gi"));
        assert_eq!(size.capacity.as_deref(), Some("1Gi"));
        assert!(size.restart_pending, "pending for 40 s");
        let size = claim_size(&pending("2026-11-27T12:00:30Z"), at);
        assert!(
            !size.restart_pending,
            "pending for 10 s: the kubelet may still grow it"
        );
        assert_eq!(size.error, None);
    }

    #[test]
    fn a_resize_error_or_an_infeasible_size_is_reported() {
        let at = Waits {
            now: Timestamp::now(),
            restart_after: Duration::from_secs(30),
            unbound_after: Duration::from_secs(60),
        };
        let failed = claim(serde_json::json!({
            "capacity": {"storage": "1Gi"},
            "conditions": [{"type": "ControllerResizeError", "status": "True",
                "message": "quota exceeded"}],
        }));
        let size = claim_size(&failed, at);
        assert_eq!(size.error.as_deref(), Some("quota exceeded"));
        let infeasible = claim(serde_json::json!({
            "capacity": {"storage": "1Gi"},
            "allocatedResourceStatuses": {"storage": "ControllerResizeInfeasible"},
        }));
        let size = claim_size(&infeasible, at);
        assert_eq!(
            size.error.as_deref(),
            Some("Kubernetes reports ControllerResizeInfeasible")
        );
    }
}
