//! Installing as a platform team does, on real Kubernetes: the CRDs, then a
//! stage overlay, with `kubectl apply --server-side -k`; the controller runs
//! as the shipped Deployment (its image mapped to this build's binary by the
//! process kubelet, its ServiceAccount token mounted, its ConfigMap as its
//! config file) and converges a cluster in a workload cluster. And the
//! README's install section, run verbatim on an empty management cluster.

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
    let logs = || world.management_kubelet().runtime.all_pod_logs(30);
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

/// The README's "Installing on a management cluster" section, run
/// verbatim on an empty real management cluster: the CRDs, then the prod
/// stage, whose two controller replicas become ready (one leads through
/// the Lease, the other stands by).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_install_section_of_the_readme_runs_verbatim_on_an_empty_cluster() -> Result<()> {
    use etcdfleet_tests::control_plane::readme::{checkout, run_block, sh_blocks};
    let Some(binaries) = etcdfleet_tests::control_plane::require_kubernetes() else {
        return Ok(());
    };
    let blocks = sh_blocks("Installing on a management cluster")?;
    let world = etcdfleet_tests::control_plane::KubeWorld::start(binaries, &[]).await?;
    let crds = world.kubectl(&["get", "crd", "-o", "name"])?;
    assert!(!crds.contains("etcdfleet.dev"), "an empty cluster: {crds}");
    let dir = tempfile::tempdir()?;
    checkout(dir.path())?;
    for block in &blocks {
        run_block(&world, dir.path(), &[], block)?;
    }
    let ready = world.kubectl(&[
        "get",
        "deployment/etcdfleet-controller",
        "-n",
        "etcdfleet-system",
        "-o",
        "jsonpath={.status.readyReplicas}",
    ])?;
    assert_eq!(
        ready.trim(),
        "2",
        "both prod replicas ready; pods: {}\n{}",
        world.kubectl(&["get", "pods", "-n", "etcdfleet-system", "-o", "yaml"])?,
        world.management_kubelet().runtime.all_pod_logs(40)
    );
    // Ready is not leading: a replica is ready once it serves, and takes the
    // Lease a moment later (the first election, bounded here by 30 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let holder = loop {
        let holder = world.kubectl(&[
            "get",
            "lease/etcdfleet-controller",
            "-n",
            "etcdfleet-system",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        match holder {
            Ok(h) if !h.trim().is_empty() => break h,
            _ if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            other => panic!("no replica took the Lease within 30 s: {other:?}"),
        }
    };
    let pods = world.kubectl(&[
        "get",
        "pods",
        "-n",
        "etcdfleet-system",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    assert!(
        pods.split_whitespace()
            .any(|p| holder.trim().starts_with(p)),
        "the Lease is held by a controller pod: {holder:?} of {pods:?}"
    );
    let templates = world.kubectl(&["get", "clusteretcdtemplates", "-o", "name"])?;
    assert!(templates.contains("ha-3"), "{templates}");
    Ok(())
}
