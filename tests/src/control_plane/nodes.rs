//! The Node half of the process kubelet: registers a workload plane's Nodes
//! with what the scheduler and the API server read from them (Ready, no
//! taints, capacity, the kubelet's address and port).

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The address every Node reports: the kubelet API listens on loopback.
pub const NODE_ADDRESS: &str = "127.0.0.1";

/// Creates `names` as Ready Nodes whose kubelet API is `NODE_ADDRESS:port`.
pub async fn register(
    client: &Client,
    names: &[String],
    kubelet_port: u16,
    version: &str,
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for name in names {
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                }
            }
        }))?;
        match api.create(&PostParams::default(), &node).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => {
                other?;
            }
        }
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(status(name, kubelet_port, version)),
        )
        .await?;
    }
    Ok(())
}

fn status(name: &str, kubelet_port: u16, version: &str) -> serde_json::Value {
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({
            "type": type_, "status": status, "reason": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        })
    };
    let resources =
        json!({ "cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi" });
    json!({ "status": {
        "conditions": [
            condition("Ready", "True", "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [
            { "type": "InternalIP", "address": NODE_ADDRESS },
            { "type": "Hostname", "address": name },
        ],
        "daemonEndpoints": { "kubeletEndpoint": { "Port": kubelet_port } },
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {
            "machineID": name, "systemUUID": name, "bootID": name,
            "kernelVersion": "etcdfleet-test", "osImage": "etcdfleet process kubelet",
            "containerRuntimeVersion": "process://etcdfleet", "kubeletVersion": version,
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
    }})
}
