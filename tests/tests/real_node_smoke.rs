//! Real nodes, first light: a workload cluster whose three Nodes are real
//! kubelets, each with its own containerd, pulling the etcd image the
//! controller names from the test's registry. The controller (a process of
//! the test, as in the other real suites) creates a 3-member EtcdCluster; it
//! becomes Available, the members spread over the three Nodes, run in
//! containerd containers, resolve each other through cluster DNS and serve
//! writes; everything the nodes made is gone once the world is dropped.
//! Then the dev stage as shipped: the controller's Deployment runs the image
//! `make image` built on real management nodes and converges a cluster.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, installed_real_world, put, read_everywhere, wait_available,
    wait_ready_members,
};
use etcdfleet_tests::control_plane::{KubeWorld, RealWorldSpec, require_kubernetes};
use etcdfleet_tests::etcd_harness::newest_built_etcd;
use etcdfleet_tests::image::require_image;
use etcdfleet_tests::real_node::{NodeImage, require_real_nodes, run_isolated};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

#[test]
fn real_node_smoke_three_members_on_three_real_nodes() {
    let Some(binaries) = require_kubernetes() else {
        return;
    };
    let Some(tools) = require_real_nodes(&binaries) else {
        return;
    };
    run_isolated(|| async move {
        let version = newest_built_etcd()?.version_string();
        let world = installed_real_world(binaries, &tools, &["w1"], None).await?;
        let node_logs = || world.workload("w1").nodes.real().log_tails(25);
        let cgroups: Vec<PathBuf> = world
            .workload("w1")
            .nodes
            .real()
            .nodes
            .iter()
            .map(|n| n.cgroup_dir())
            .collect();
        if let Err(e) = create_cluster(&world, &version).await {
            bail!("{e:?}\nnodes:{}", node_logs());
        }
        check_pods(&world, &version).await?;
        drop(world);
        for dir in cgroups {
            ensure!(!dir.exists(), "{} outlived its node", dir.display());
        }
        Ok(())
    });
}

/// The test's own controller converging a 3-member cluster that serves a
/// write.
async fn create_cluster(world: &KubeWorld, version: &str) -> Result<()> {
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("shop", "w1", 3, version))?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(world, "shop")?;
    wait_ready_members(world, "shop", 3)?;
    put(world, "w1", "shop", 3, "on-real-nodes").await?;
    read_everywhere(world, "w1", "shop", 3, "on-real-nodes").await?;
    Ok(())
}

/// Each member is a containerd container of the etcd image as the
/// controller names it, on a Node of its own.
async fn check_pods(world: &KubeWorld, version: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    let list = pods.list(&ListParams::default()).await?;
    ensure!(list.items.len() == 3, "{} pods", list.items.len());
    let mut nodes = BTreeSet::new();
    for pod in &list.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let status = pod.status.as_ref().context("pod without status")?;
        for container in status.container_statuses.iter().flatten() {
            let id = container.container_id.as_deref().unwrap_or_default();
            ensure!(
                id.starts_with("containerd://"),
                "{name}/{}: container ID {id:?}",
                container.name
            );
            ensure!(
                container.image == format!("gcr.io/etcd-development/etcd:v{version}"),
                "{name}: image {}",
                container.image
            );
            let peak = world.workload("w1").nodes.real().container_memory_peak(id);
            eprintln!(
                "{name}: {} {id} on {:?}, peak memory {} MiB",
                container.image,
                pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                peak.map_or(-1, |b| (b >> 20) as i64)
            );
        }
        nodes.extend(pod.spec.as_ref().and_then(|s| s.node_name.clone()));
    }
    ensure!(nodes.len() == 3, "members on {nodes:?}");
    Ok(())
}

#[test]
fn real_node_smoke_the_dev_stage_runs_the_controller_as_a_pod() {
    let Some(binaries) = require_kubernetes() else {
        return;
    };
    let Some(tools) = require_real_nodes(&binaries) else {
        return;
    };
    let Some(image) = require_image() else {
        return;
    };
    run_isolated(|| async move {
        let version = newest_built_etcd()?.version_string();
        let spec = RealWorldSpec {
            tools: &tools,
            workload_names: &["w1"],
            management_nodes: 0,
            extra_images: vec![],
            csi: None,
        }
        .with_controller_pod(NodeImage::controller(&image.layout(), &image.tag));
        let world = KubeWorld::start_real_nodes(binaries, spec).await?;
        let node_logs = || {
            let management = world.management_nodes.real().log_tails(30);
            format!(
                "{management}{}",
                world.workload("w1").nodes.real().log_tails(10)
            )
        };
        if let Err(e) = controller_pod_converges(&world, &version).await {
            bail!("{e:?}\nnodes:{}", node_logs());
        }
        Ok(())
    });
}

/// The dev stage installed as the README says; its controller pod turns
/// Ready, converges a 3-member cluster, and runs in containerd.
async fn controller_pod_converges(world: &KubeWorld, version: &str) -> Result<()> {
    world.install("config/stages/dev")?;
    world.install_workload_rbac()?;
    world.put_kubeconfig_secret(NS, "w1").await?;
    world.kubectl(&[
        "wait",
        "-n",
        "etcdfleet-system",
        "--for=jsonpath={.status.readyReplicas}=1",
        "deployment/etcdfleet-controller",
        "--timeout=180s",
    ])?;
    world.apply(&cluster_yaml("shop", "w1", 3, version))?;
    wait_ready_members(world, "shop", 3)?;
    put(world, "w1", "shop", 3, "by-the-pod").await?;
    read_everywhere(world, "w1", "shop", 3, "by-the-pod").await?;
    let ids = world.kubectl(&[
        "get",
        "pods",
        "-n",
        "etcdfleet-system",
        "-o",
        "jsonpath={.items[*].status.containerStatuses[0].containerID}",
    ])?;
    let peak = world
        .management_nodes
        .real()
        .container_memory_peak(ids.trim());
    eprintln!(
        "controller pod: {ids}, peak memory {} MiB (limit 512 MiB)",
        peak.map_or(-1, |b| (b >> 20) as i64)
    );
    ensure!(
        ids.trim().starts_with("containerd://"),
        "controller container {ids:?}"
    );
    Ok(())
}
