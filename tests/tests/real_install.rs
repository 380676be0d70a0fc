//! Installing as a platform team does, on real Kubernetes: the CRDs, then a
//! stage overlay, with `kubectl apply --server-side -k`; the controller runs
//! as the shipped Deployment (its image mapped to this build's binary by the
//! process kubelet, its ServiceAccount token mounted, its ConfigMap as its
//! config file) and converges a cluster in a workload cluster.

use anyhow::{Context as _, Result};
use etcdfleet_tests::control_plane::scenario::{
    cluster_yaml, installed_world_running, put, read_everywhere, wait_ready_members,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_install_of_the_dev_stage_runs_the_controller_deployment_which_converges_a_cluster()
-> Result<()> {
    let Some(world) = installed_world_running(&["w1"]).await? else {
        return Ok(());
    };
    let logs = || world.management_kubelet.runtime.all_pod_logs(30);
    world
        .kubectl(&[
            // Not `rollout status`: with one replica and maxUnavailable 1 it
            // is satisfied by a pod that never turns Ready.
            "wait",
            "-n",
            "etcdfleet-system",
            "--for=jsonpath={.status.readyReplicas}=1",
            "deployment/etcdfleet-controller",
            "--timeout=120s",
        ])
        .with_context(logs)?;
    world.apply(&cluster_yaml("shop", "w1", 3, "3.5.1"))?;
    wait_ready_members(&world, "shop", 3).with_context(logs)?;
    put(&world, "w1", "shop", 3, "k").await?;
    read_everywhere(&world, "w1", "shop", 3, "k").await?;
    // The controller that did it ran in the Deployment's pod.
    let pods = world.kubectl(&[
        "get",
        "pods",
        "-n",
        "etcdfleet-system",
        "-o",
        "jsonpath={.items[*].status.containerStatuses[0].ready}",
    ])?;
    assert_eq!(pods.trim(), "true", "one ready controller pod");
    Ok(())
}
