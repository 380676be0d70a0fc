//! Where a move to another StorageClass could run its spare member
//! ([`crate::etcdcluster::plan::storage::moves`]): a move adds a member
//! before it removes one, so when the pods require a node each (required
//! pod anti-affinity on `kubernetes.io/hostname`, as the shipped `ha-3`
//! and `ha-5` templates set), it needs one more node a member can run on
//! than the cluster has members. Read only when a move is to start and the
//! pods require a node each; the Nodes need the optional cluster reads
//! (`config/workload-rbac-nodes`), without which the move is not checked
//! up front.

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::super::plan::observation::SpareNodes;
use crate::connector::WorkloadCluster;
use etcdfleet_api::PodTemplateOverrides;

const HOSTNAME: &str = "kubernetes.io/hostname";

/// The pods require a node each.
pub fn one_node_each(pod: &PodTemplateOverrides) -> bool {
    let anti = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref());
    let required = anti.and_then(|a| {
        a.required_during_scheduling_ignored_during_execution
            .as_ref()
    });
    required.is_some_and(|terms| terms.iter().any(|t| t.topology_key == HOSTNAME))
}

/// The Nodes a member pod could be placed on.
pub async fn read(workload: &WorkloadCluster, pod: &PodTemplateOverrides) -> SpareNodes {
    let nodes: Api<Node> = Api::all(workload.client.clone());
    match nodes.list(&ListParams::default()).await {
        Ok(list) => SpareNodes::Known {
            eligible: (list.items.iter())
                .filter(|n| can_host(n, pod))
                .map(ResourceExt::name_any)
                .collect(),
        },
        Err(e) => SpareNodes::Unreadable(e.to_string()),
    }
}

/// Whether a member pod could run on `node`: Ready, schedulable, its labels
/// match the pods' `nodeSelector`, and every taint that keeps pods off
/// (`NoSchedule`, `NoExecute`) is tolerated. (The scheduler weighs more,
/// such as free resources; a spare it still cannot place waits, named by
/// the learner's rule.)
pub fn can_host(node: &Node, pod: &PodTemplateOverrides) -> bool {
    let spec = node.spec.as_ref();
    let ready = (node.status.as_ref().and_then(|s| s.conditions.as_ref()))
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let schedulable = !spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let labels = node.labels();
    let selected = (pod.node_selector.iter().flatten()).all(|(k, v)| labels.get(k) == Some(v));
    let tolerations = pod.tolerations.as_deref().unwrap_or_default();
    let tolerated = (spec.and_then(|s| s.taints.as_ref()).into_iter().flatten())
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)));
    ready && schedulable && selected && tolerated
}

/// Kubernetes' toleration match: the key (or any key with `Exists` and no
/// key), the value under `Equal` (the default operator), the effect (or any).
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = toleration.operator.as_deref() == Some("Exists");
    let key = match toleration.key.as_deref() {
        None | Some("") => exists,
        Some(k) => k == taint.key,
    };
    let value = exists
        || toleration.value.as_deref().unwrap_or_default()
            == taint.value.as_deref().unwrap_or_default();
    effect && key && value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(extra: serde_json::Value) -> Node {
        let mut n = serde_json::json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        json_patch(&mut n, extra);
        serde_json::from_value(n).unwrap()
    }

    fn json_patch(base: &mut serde_json::Value, extra: serde_json::Value) {
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                match b.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        json_patch(existing, v.clone())
                    }
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }

    fn pod(extra: serde_json::Value) -> PodTemplateOverrides {
        serde_json::from_value(extra).unwrap()
    }

    #[test]
    fn a_node_hosts_a_member_when_ready_schedulable_selected_and_its_taints_tolerated() {
        let any = pod(serde_json::json!({}));
        assert!(can_host(&node(serde_json::json!({})), &any));
        let not_ready = node(serde_json::json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}]}}));
        assert!(!can_host(&not_ready, &any));
        let cordoned = node(serde_json::json!({"spec": {"unschedulable": true}}));
        assert!(!can_host(&cordoned, &any));
        let zone_b = pod(serde_json::json!({"nodeSelector": {"zone": "b"}}));
        assert!(!can_host(&node(serde_json::json!({})), &zone_b));
        let tainted = node(serde_json::json!({"spec": {"taints": [
            {"key": "dedicated", "value": "etcd", "effect": "NoSchedule"}]}}));
        assert!(!can_host(&tainted, &any));
        let tolerating = pod(serde_json::json!({"tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "etcd", "effect": "NoSchedule"}]}));
        assert!(can_host(&tainted, &tolerating));
        let everything = pod(serde_json::json!({"tolerations": [{"operator": "Exists"}]}));
        assert!(can_host(&tainted, &everything));
        let prefer = node(serde_json::json!({"spec": {"taints": [
            {"key": "dedicated", "value": "etcd", "effect": "PreferNoSchedule"}]}}));
        assert!(can_host(&prefer, &any), "a preference keeps no pod off");
    }

    #[test]
    fn only_a_required_anti_affinity_on_the_hostname_asks_for_a_node_each() {
        let required = pod(serde_json::json!({"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname",
                 "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "etcd"}}}]}}}));
        assert!(one_node_each(&required));
        let zone = pod(serde_json::json!({"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "topology.kubernetes.io/zone"}]}}}));
        assert!(!one_node_each(&zone));
        assert!(!one_node_each(&pod(serde_json::json!({}))));
    }
}
