//! The members' pods and volumes reader: the pods and PVCs at this
//! cluster's ordinals, which member's data each volume holds, and the pods
//! and volumes another EtcdCluster holds. Read only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use super::super::context::Result;
use super::super::plan::observation::ClaimSize;
use super::super::plan::observation::{
    ForeignObject, PodObservation, PvcObservation, STUCK_DELETING_AFTER,
};
use super::objects::Workload;
use crate::render;

/// Annotation on a member PVC naming the etcd member id (hex) whose data it holds.
pub const PVC_MEMBER_ANNOTATION: &str = "etcdfleet.dev/member-id";
/// Annotation on a member PVC naming the EtcdCluster whose data it holds
/// (the owner label's value; a claim template's labels cannot change, so the
/// owner is recorded here once the member runs).
pub const PVC_OWNER_ANNOTATION: &str = "etcdfleet.dev/owner";
/// Annotation on a member PVC: the etcd version that last ran on its data.
pub const PVC_VERSION_ANNOTATION: &str = "etcdfleet.dev/etcd-version";

/// The member pods and volumes, by ordinal.
pub struct PodsAndVolumes {
    pub pods: BTreeMap<u32, Pod>,
    pub pvcs: BTreeMap<u32, PersistentVolumeClaim>,
    /// Pods and PVCs at our names that another EtcdCluster holds.
    pub conflicts: Vec<ForeignObject>,
}

/// Reads the member pods and PVCs (every reconcile).
pub async fn read(w: &Workload<'_>) -> Result<PodsAndVolumes> {
    let (names, err) = (&w.names, w.err());
    let selector = ListParams::default().labels(&render::selector_string(names));
    let pods: Api<Pod> = w.api();
    let pods: BTreeMap<u32, Pod> = pods
        .list(&selector)
        .await
        .map_err(&err)?
        .items
        .into_iter()
        .filter_map(|p| names.ordinal_of(&p.name_any()).map(|o| (o, p)))
        .collect();
    let pvcs: Api<PersistentVolumeClaim> = w.api();
    let pvcs: BTreeMap<u32, PersistentVolumeClaim> = pvcs
        .list(&selector)
        .await
        .map_err(&err)?
        .items
        .into_iter()
        .filter_map(|p| {
            p.name_any()
                .strip_prefix("data-")
                .and_then(|pod| names.ordinal_of(pod))
                .map(|o| (o, p))
        })
        .collect();
    let conflicts = foreign_pods_and_volumes(w, &pods, &pvcs);
    Ok(PodsAndVolumes {
        pods,
        pvcs,
        conflicts,
    })
}

/// Pods and PVCs at our names that another EtcdCluster holds (the selector
/// labels are the same for one name in two namespaces): never restarted,
/// deleted or reused. Unlabelled pods and unrecorded PVCs are this
/// cluster's StatefulSet's (older releases did not mark them).
fn foreign_pods_and_volumes(
    w: &Workload<'_>,
    pods: &BTreeMap<u32, Pod>,
    pvcs: &BTreeMap<u32, PersistentVolumeClaim>,
) -> Vec<ForeignObject> {
    let (ns, owner) = (w.ns(), &w.owner);
    let mut conflicts = Vec::new();
    for (kind, name, theirs) in pods
        .values()
        .map(|p| {
            (
                "Pod",
                p.name_any(),
                render::owner_of(p.meta()).map(str::to_string),
            )
        })
        .chain(pvcs.values().map(|p| {
            (
                "PersistentVolumeClaim",
                p.name_any(),
                p.annotations().get(PVC_OWNER_ANNOTATION).cloned(),
            )
        }))
    {
        if let Some(theirs) = theirs
            && &theirs != owner
        {
            conflicts.push(ForeignObject {
                object: format!("{kind}/{ns}/{name}"),
                owner: Some(theirs),
            });
        }
    }
    conflicts
}

/// A member pod as the planner sees it, at `now`.
pub fn pod_observation(pod: &Pod, now: Timestamp) -> PodObservation {
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    PodObservation {
        image: pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default(),
        template_hash: pod.annotations().get(render::TEMPLATE_HASH).cloned(),
        running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
        ready: container.is_some_and(|c| c.ready) && ready_condition(pod).unwrap_or(true),
        restart_count: container.map_or(0, |c| c.restart_count),
        deleting: pod.meta().deletion_timestamp.is_some(),
        stuck_deleting: stuck_deleting(pod, now),
        ready_means_etcd_healthy: pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.readiness_probe.as_ref())
            .and_then(|p| p.http_get.as_ref())
            .is_some_and(|g| g.path.as_deref().is_some_and(|p| p.starts_with("/health"))),
        last_exit: container.and_then(last_exit),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        forcing: pod.spec.as_ref().and_then(crate::recovery::forced_by),
    }
}

/// The pod's `Ready` condition. On a node that stopped, the node lifecycle
/// controller sets it False while the container statuses keep the last
/// word of the gone kubelet (`ready: true`), so both are read.
fn ready_condition(pod: &Pod) -> Option<bool> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some(ready.status == "True")
}

/// The pod was deleted and is still there [`STUCK_DELETING_AFTER`] past the
/// end of its grace period (`deletionTimestamp` is when the grace ends).
fn stuck_deleting(pod: &Pod, now: Timestamp) -> bool {
    pod.meta().deletion_timestamp.as_ref().is_some_and(|t| {
        let after = SignedDuration::try_from(STUCK_DELETING_AFTER).unwrap_or(SignedDuration::MAX);
        now.duration_since(t.0) > after
    })
}

/// How the container last ended, if it ended since its pod started (a
/// crash loop runs for a moment between its exits, so a running container
/// reports its last exit too): its exit code, the kubelet's reason
/// (`Error`, `OOMKilled`) and the first line of its termination message.
/// No restart count: the sentence goes into a condition, which must not
/// change on every restart.
fn last_exit(c: &ContainerStatus) -> Option<String> {
    let ended = (c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| c.last_state.as_ref()?.terminated.as_ref())?;
    let mut why = format!("exited with code {}", ended.exit_code);
    if let Some(reason) = ended.reason.as_deref().filter(|r| !r.is_empty()) {
        why.push_str(&format!(" ({reason})"));
    }
    let message = ended.message.as_deref().and_then(|m| m.lines().next());
    if let Some(line) = message.map(str::trim).filter(|l| !l.is_empty()) {
        let line: String = line.chars().take(200).collect();
        why.push_str(&format!(": {line}"));
    }
    Some(why)
}

/// A member volume as the planner sees it: which member's data, whose, and
/// which etcd last ran on it.
/// A member PVC as the planner sees it, with its size ([`super::storage`]).
pub fn pvc_observation(
    pvc: &PersistentVolumeClaim,
    owner: &String,
    size: Option<ClaimSize>,
) -> PvcObservation {
    PvcObservation {
        member_id: pvc
            .annotations()
            .get(PVC_MEMBER_ANNOTATION)
            .and_then(|s| u64::from_str_radix(s, 16).ok()),
        owner_recorded: pvc.annotations().get(PVC_OWNER_ANNOTATION) == Some(owner),
        etcd_version: pvc.annotations().get(PVC_VERSION_ANNOTATION).cloned(),
        deleting: pvc.metadata.deletion_timestamp.is_some(),
        size: size.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(value: serde_json::Value) -> ContainerStatus {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_pod_on_a_lost_node_is_not_ready_though_its_container_said_so() {
        let pod = |condition: Option<&str>| -> Pod {
            let mut status = serde_json::json!({
                "phase": "Running",
                "containerStatuses": [{"name": "etcd", "ready": true, "restartCount": 0,
                    "image": "etcd", "imageID": "", "state": {"running": {}}}],
            });
            if let Some(c) = condition {
                status["conditions"] = serde_json::json!([{"type": "Ready", "status": c}]);
            }
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "c-0"}, "status": status}),
            )
            .unwrap()
        };
        let now = Timestamp::now();
        assert!(pod_observation(&pod(Some("True")), now).ready);
        assert!(!pod_observation(&pod(Some("False")), now).ready);
        assert!(pod_observation(&pod(None), now).ready);
    }

    #[test]
    fn a_pod_is_stuck_deleting_only_past_the_end_of_its_grace_and_the_slack() {
        let pod = |grace_ends_secs_ago: i64| -> Pod {
            let at = Timestamp::now() - SignedDuration::from_secs(grace_ends_secs_ago);
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "c-0", "deletionTimestamp": at.to_string()}
            }))
            .unwrap()
        };
        let slack = STUCK_DELETING_AFTER.as_secs() as i64;
        let now = Timestamp::now();
        assert!(!pod_observation(&pod(-30), now).stuck_deleting);
        assert!(!pod_observation(&pod(slack - 5), now).stuck_deleting);
        assert!(pod_observation(&pod(slack + 5), now).stuck_deleting);
        assert!(!pod_observation(&Pod::default(), now).stuck_deleting);
    }

    #[test]
    fn the_last_exit_of_a_crash_loop_is_read_while_waiting_and_while_running() {
        let ended = serde_json::json!({
            "terminated": {"exitCode": 2, "reason": "Error",
                           "message": "panic: cannot start\ngoroutine 1"}
        });
        let waiting = status(serde_json::json!({
            "name": "etcd", "image": "etcd:v3.5.99", "imageID": "", "ready": false,
            "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": ended,
        }));
        let said = "exited with code 2 (Error): panic: cannot start";
        assert_eq!(last_exit(&waiting).as_deref(), Some(said));
        let mut running = waiting.clone();
        running.state = Some(serde_json::from_value(serde_json::json!({"running": {}})).unwrap());
        assert_eq!(last_exit(&running).as_deref(), Some(said));
        let fresh = status(serde_json::json!({
            "name": "etcd", "image": "etcd:v3.5.1", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {}},
        }));
        assert_eq!(last_exit(&fresh), None);
    }
}
