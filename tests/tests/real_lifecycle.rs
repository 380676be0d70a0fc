//! The EtcdCluster lifecycle on real Kubernetes (kube-apiserver,
//! kube-controller-manager, kube-scheduler, the process kubelet): create,
//! scale 1 → 3 → 5 → 3 through `/scale`, a wiped member replaced, delete
//! with PVCs kept. The controller reaches etcd through the workload API
//! servers' `pods/portforward`, under the shipped RBAC, with the production
//! read memo.

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};
use etcdfleet_api::conditions;
use etcdfleet_controllers::etcdcluster::plan::{RemovalCause, Step};
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, get, installed_world, put, read_everywhere, wait_available,
};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

fn count(steps: &[&Step], pred: impl Fn(&Step) -> bool) -> usize {
    steps.iter().filter(|s| pred(s)).count()
}

async fn pvc_names(client: kube::Client) -> Result<BTreeSet<String>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client, WORKLOAD_NS);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_lifecycle_create_and_scale_1_3_5_3_through_the_scale_subresource() -> Result<()> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("shop", "w1", 1, "3.5.1"))?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(&world, "shop")?;
    put(&world, "w1", "shop", 1, "before-scale").await?;

    world.kubectl(&["scale", "-n", NS, "etcdcluster/shop", "--replicas=3"])?;
    let log = converge_real(&mut ctl, &["shop"]).await?;
    let steps = log.steps_of(&format!("{NS}/shop"));
    assert_eq!(
        count(&steps, |s| matches!(s, Step::AddLearner { .. })),
        2,
        "{steps:?}"
    );
    assert_eq!(
        count(&steps, |s| matches!(s, Step::PromoteLearner { .. })),
        2,
        "{steps:?}"
    );
    wait_available(&world, "shop")?;
    read_everywhere(&world, "w1", "shop", 3, "before-scale").await?;

    // The scheduler spread the three members over the three Nodes (the
    // controller's preferred anti-affinity).
    let workload = world.workload("w1").admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(workload.clone(), WORKLOAD_NS);
    let nodes: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(nodes.len(), 3, "members on {nodes:?}");

    world.kubectl(&["scale", "-n", NS, "etcdcluster/shop", "--replicas=5"])?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(&world, "shop")?;
    put(&world, "w1", "shop", 5, "at-five").await?;
    // The real StatefulSet controller counts the five pods Ready (the
    // kubelet's readiness probe may pass a moment after etcd converged).
    world.kubectl_workload(
        "w1",
        &[
            "wait",
            "-n",
            WORKLOAD_NS,
            "--timeout=60s",
            "--for=jsonpath={.status.readyReplicas}=5",
            "statefulset/shop-etcd",
        ],
    )?;

    world.kubectl(&["scale", "-n", NS, "etcdcluster/shop", "--replicas=3"])?;
    let log = converge_real(&mut ctl, &["shop"]).await?;
    let removed: Vec<u32> = log
        .steps_of(&format!("{NS}/shop"))
        .iter()
        .filter_map(|s| match s {
            Step::RemoveMember {
                ordinal,
                cause: RemovalCause::ScaleDown,
                ..
            } => *ordinal,
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![4, 3], "highest first");
    read_everywhere(&world, "w1", "shop", 3, "at-five").await?;
    // An intended scale-down deletes the removed members' PVCs (the real
    // PVC protection lets them go once the pods are gone).
    let want: BTreeSet<String> = (0..3).map(|o| format!("data-shop-etcd-{o}")).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while pvc_names(workload.clone()).await? != want {
        assert!(
            std::time::Instant::now() < deadline,
            "PVCs left: {:?}",
            pvc_names(workload.clone()).await?
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let cluster = get(&world, "shop").await?;
    let status = cluster.status.context("status")?;
    assert_eq!(status.ready_members, 3, "{status:#?}");
    assert!(conditions::is_true(
        &status.conditions,
        conditions::AVAILABLE
    ));
    // The printer columns a person reads, each under its header.
    let table = world.kubectl(&["get", "etcdclusters", "-n", NS])?;
    let row = printer_row(&table, "shop")?;
    for (column, want) in [
        ("NAME", "shop"),
        ("REPLICAS", "3"),
        ("READY", "3"),
        ("VERSION", "3.5.1"),
        ("AVAILABLE", "True"),
    ] {
        assert_eq!(
            row.get(column).map(String::as_str),
            Some(want),
            "{column}:\n{table}"
        );
    }
    Ok(())
}

/// The row of `name` in `kubectl get`'s table, by column header.
fn printer_row(table: &str, name: &str) -> Result<std::collections::BTreeMap<String, String>> {
    let mut lines = table.lines();
    let headers: Vec<&str> = lines
        .next()
        .context("no header")?
        .split_whitespace()
        .collect();
    let cells: Vec<&str> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .with_context(|| format!("no row {name}:\n{table}"))?;
    anyhow::ensure!(cells.len() == headers.len(), "a cell per column:\n{table}");
    Ok(headers
        .iter()
        .zip(cells)
        .map(|(h, c)| (h.to_string(), c.to_string()))
        .collect())
}

/// The member id of `ordinal` as the status reports it.
async fn member_id(
    world: &etcdfleet_tests::control_plane::KubeWorld,
    ordinal: u32,
) -> Result<String> {
    let status = get(world, "shop").await?.status.context("status")?;
    status
        .members
        .iter()
        .find(|m| m.name == format!("shop-etcd-{ordinal}"))
        .and_then(|m| m.id.clone())
        .with_context(|| format!("no member {ordinal} in {:?}", status.members))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_lifecycle_a_wiped_member_is_replaced_and_delete_keeps_the_pvcs() -> Result<()> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("shop", "w1", 3, "3.5.1"))?;
    converge_real(&mut ctl, &["shop"]).await?;
    put(&world, "w1", "shop", 3, "before-the-loss").await?;
    let lost = member_id(&world, 1).await?;

    // Member 1's disk is lost: the kubelet restarts it on an empty volume
    // (the PV's host path), where it cannot rejoin.
    world
        .workload("w1")
        .runtime()
        .wipe_pvc(WORKLOAD_NS, "data-shop-etcd-1")
        .await?;
    let log = converge_real(&mut ctl, &["shop"]).await?;
    let steps = log.steps_of(&format!("{NS}/shop"));
    let removed = count(&steps, |s| {
        matches!(
            s,
            Step::RemoveMember {
                ordinal: Some(1),
                cause: RemovalCause::Failed,
                ..
            }
        )
    });
    assert_eq!(removed, 1, "the wiped member was removed once: {steps:?}");
    assert_eq!(
        count(&steps, |s| matches!(s, Step::AddLearner { .. })),
        1,
        "and replaced: {steps:?}"
    );
    let replacement = member_id(&world, 1).await?;
    assert_ne!(replacement, lost, "ordinal 1 is a new member");
    read_everywhere(&world, "w1", "shop", 3, "before-the-loss").await?;

    // Deleting the cluster removes its workload objects and keeps the PVCs.
    world.kubectl(&["delete", "-n", NS, "etcdcluster/shop", "--wait=false"])?;
    let api: Api<etcdfleet_api::EtcdCluster> =
        Api::namespaced(world.management.admin_client().await?, NS);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while api.get_opt("shop").await?.is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the finalizer never finished"
        );
        let _ = ctl.reconcile(NS, "shop").await;
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let workload = world.workload("w1").admin_client().await?;
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(workload.clone(), WORKLOAD_NS);
    assert!(
        sts.get_opt("shop-etcd").await?.is_none(),
        "StatefulSet left behind"
    );
    let want: BTreeSet<String> = (0..3).map(|o| format!("data-shop-etcd-{o}")).collect();
    assert_eq!(
        pvc_names(workload.clone()).await?,
        want,
        "PVCs outlive the cluster"
    );
    // The real garbage collector removes the member pods (owned by the StatefulSet).
    let pods: Api<Pod> = Api::namespaced(workload, WORKLOAD_NS);
    while !pods.list(&ListParams::default()).await?.items.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "member pods left behind"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    Ok(())
}
