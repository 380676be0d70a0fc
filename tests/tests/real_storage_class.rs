//! Storage that changes on real Kubernetes (issue 37, docs/storage.md): the
//! real StatefulSet controller adopts the pods of a StatefulSet deleted with
//! `propagationPolicy: Orphan` (the real garbage collector orphans them),
//! the real PV controller and the in-tree host-path provisioner bind the
//! claims of a new StorageClass, and the real API server's admission is
//! never reached by a growth the class does not allow:
//! - a move from one StorageClass to another, member by member, through a
//!   controller restart, with a writer running;
//! - a growth on a class without `allowVolumeExpansion`, and a shrink:
//!   refused, nothing written (counted from the workload audit log).

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::conditions;
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_tests::control_plane::KubeWorld;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_manifest, converge_real, etcd_of, get, installed_world,
};
use etcdfleet_tests::control_plane::world::WORKLOAD_USER;
use etcdfleet_tests::driver::{TestController, converge};
use etcdfleet_tests::etcd_harness::{AckedWriter, verify_acknowledged};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, PostParams};

const SPEC: &str = "  clusterRef:
    name: w1
  version: 3.5.1
  replicas: 3
  storage:
    storageClassName: standard
    size: 1Gi
  etcd:
    heartbeatIntervalMillis: 50
    electionTimeoutMillis: 500
";

/// A second class of the in-tree host-path provisioner, and the optional
/// cluster-scoped reads (StorageClasses) a storage change needs.
async fn second_class_and_reads(world: &KubeWorld) -> Result<()> {
    let class: StorageClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "standard-b"},
        "provisioner": "kubernetes.io/host-path",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }))?;
    Api::<StorageClass>::all(world.workload("w1").admin_client().await?)
        .create(&PostParams::default(), &class)
        .await?;
    world.kubectl_workload(
        "w1",
        &["apply", "--server-side", "-k", "config/workload-rbac-nodes"],
    )?;
    Ok(())
}

/// (claim, class) of every claim of `shop` not being deleted, by name.
async fn claim_classes(world: &KubeWorld) -> Result<Vec<(String, String)>> {
    let client = world.workload("w1").admin_client().await?;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client, WORKLOAD_NS);
    let mut out: Vec<(String, String)> = (api.list(&Default::default()).await?.items.iter())
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let class = p.spec.as_ref().and_then(|s| s.storage_class_name.clone());
            (p.name_any(), class.unwrap_or_default())
        })
        .collect();
    out.sort();
    Ok(out)
}

/// A real world with a second host-path class, the cluster-scoped reads,
/// and `shop` converged on `standard`.
async fn converged_shop() -> Result<Option<(KubeWorld, TestController)>> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(None);
    };
    second_class_and_reads(&world).await?;
    let mut ctl = world.controller().await?;
    world.apply(&cluster_manifest("shop", SPEC))?;
    converge_real(&mut ctl, &["shop"]).await?;
    Ok(Some((world, ctl)))
}

fn storage_kinds(steps: &[(String, Step)]) -> Vec<String> {
    (steps.iter())
        .filter_map(|(_, s)| match s {
            Step::Storage(s) => Some(s.kind().to_string()),
            Step::AddLearner { ordinal } => Some(format!("AddLearner {ordinal}")),
            Step::RemoveMember { ordinal, cause, .. } => {
                Some(format!("Remove {} {cause:?}", ordinal.unwrap_or(99)))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_storage_class_move_adopts_the_pods_and_moves_every_member_through_a_restart()
-> Result<()> {
    let Some((world, mut ctl)) = converged_shop().await? else {
        return Ok(());
    };
    let (endpoints, config) = etcd_of(&world, "w1", "shop", 3).await?;
    let id = ClusterClient::connect(&endpoints, &config)
        .await?
        .leader()
        .await?
        .1
        .cluster_id;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;

    world.kubectl(&[
        "patch",
        "-n",
        NS,
        "etcdcluster/shop",
        "--type=merge",
        "-p",
        r#"{"spec":{"storage":{"storageClassName":"standard-b"}}}"#,
    ])?;
    // A fresh controller (nothing in memory) after the re-creation and
    // after every member removed.
    let mut restarts = 0;
    let restart = |_: &str, step: &Step, ctl: &mut TestController| {
        if matches!(step, Step::Storage(_) | Step::RemoveMember { .. }) {
            restarts += 1;
            ctl.restart();
        }
        Ok(())
    };
    let keys = [(NS, "shop")];
    let log = converge(
        &mut ctl,
        &keys,
        std::time::Duration::from_secs(300),
        || async { Ok(()) },
        restart,
    )
    .await
    .with_context(|| world.workload("w1").runtime().all_pod_logs(30))?;
    let report = writer.stop().await?;

    assert_eq!(
        storage_kinds(&log.steps),
        [
            "RecreateStatefulSet",
            "AddLearner 3",
            "Remove 2 StorageClassMove",
            "AddLearner 2",
            "Remove 1 StorageClassMove",
            "AddLearner 1",
            "Remove 0 StorageClassMove",
            "AddLearner 0",
            "Remove 3 ScaleDown"
        ],
        "{:?}",
        log.steps
    );
    assert_eq!(restarts, 5);
    let b = |o: u32| (format!("data-shop-etcd-{o}"), "standard-b".to_string());
    assert_eq!(claim_classes(&world).await?, vec![b(0), b(1), b(2)]);
    // The real StatefulSet controller owns every member pod again.
    let client = world.workload("w1").admin_client().await?;
    let sts = Api::<StatefulSet>::namespaced(client.clone(), WORKLOAD_NS)
        .get("shop-etcd")
        .await?;
    for o in 0..3 {
        let pod = Api::<Pod>::namespaced(client.clone(), WORKLOAD_NS)
            .get(&format!("shop-etcd-{o}"))
            .await?;
        let owner = pod
            .owner_references()
            .iter()
            .find(|r| r.controller == Some(true));
        assert_eq!(owner.map(|r| r.uid.clone()), sts.uid(), "shop-etcd-{o}");
    }
    let after = ClusterClient::connect(&endpoints, &config)
        .await?
        .leader()
        .await?
        .1;
    assert_eq!(after.cluster_id, id, "the same etcd cluster");
    ensure!(!report.acknowledged.is_empty(), "no write acknowledged");
    verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    Ok(())
}

/// Writes the controller's workload identity made after `skip` audited
/// requests (port-forward tunnels aside).
fn controller_writes_since(world: &KubeWorld, skip: usize) -> Result<Vec<String>> {
    let log = world.workload("w1").plane.audit()?;
    Ok((log.by_since(WORKLOAD_USER, skip).into_iter())
        .filter(|e| e.is_write() && e.resource() != "pods/portforward")
        .map(|e| e.to_string())
        .collect())
}

/// Reconciles three times; each must refuse.
async fn refused_three_times(ctl: &mut TestController) -> Result<()> {
    for _ in 0..3 {
        let outcome = ctl.reconcile(NS, "shop").await?;
        ensure!(matches!(&outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_expand_on_a_class_without_expansion_and_a_shrink_are_refused_writing_nothing()
-> Result<()> {
    let Some((world, mut ctl)) = converged_shop().await? else {
        return Ok(());
    };

    for (size, reason, says) in [
        (
            "2Gi",
            "StorageNotExpandable",
            "StorageClass \"standard\" does not set allowVolumeExpansion: true",
        ),
        (
            "512Mi",
            "StorageShrink",
            "512Mi is smaller than the members' volumes",
        ),
    ] {
        let skip = world.workload("w1").plane.audit()?.len();
        world.kubectl(&[
            "patch",
            "-n",
            NS,
            "etcdcluster/shop",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"storage":{{"size":"{size}"}}}}}}"#),
        ])?;
        refused_three_times(&mut ctl).await?;
        let status = get(&world, "shop").await?.status.context("no status")?;
        let c =
            conditions::find(&status.conditions, conditions::CONFLICT).context("no Conflict")?;
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", reason));
        assert!(c.message.contains(says), "{}", c.message);
        let writes = controller_writes_since(&world, skip)?;
        assert!(
            writes.is_empty(),
            "the refusal wrote to the workload cluster: {writes:#?}"
        );
    }
    let class = |o: u32| (format!("data-shop-etcd-{o}"), "standard".to_string());
    assert_eq!(
        claim_classes(&world).await?,
        vec![class(0), class(1), class(2)]
    );
    Ok(())
}
