//! Safety on real Kubernetes: two EtcdClusters of one name in two
//! management namespaces target one workload cluster, and the second never
//! writes into or deletes the first's objects (the real garbage collector
//! and finalizer paths run on delete); edits of a cluster's identity are
//! refused by the real API server with the CRD's own rule messages.

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::conditions::CONFLICT;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, installed_world, put, read_everywhere, wait_available,
};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;

const TEAM_B: &str = "team-b";
const WORKLOAD_USER: &str = "etcdfleet-controller";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_safety_same_name_in_two_namespaces_never_overwrites_or_deletes_the_other()
-> Result<()> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    world.put_kubeconfig_secret(TEAM_B, "w1").await?;
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("etcd", "w1", 1, "3.5.1"))?;
    converge_real(&mut ctl, &["etcd"]).await?;
    wait_available(&world, "etcd")?;
    put(&world, "w1", "etcd", 1, "team-a-data").await?;
    let sts: Api<StatefulSet> =
        Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    // The controller-manager writes the StatefulSet's status as its pod
    // turns Ready: compared once it has nothing left to report.
    let before = settled(&sts, "etcd-etcd").await?;

    world.apply(
        &cluster_yaml("etcd", "w1", 1, "3.5.1")
            .replace(&format!("namespace: {NS}"), &format!("namespace: {TEAM_B}")),
    )?;
    let workload = &world.workload("w1").plane;
    let mark = workload.audit()?.len();
    for _ in 0..3 {
        let outcome = ctl.reconcile(TEAM_B, "etcd").await?;
        assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    let api: Api<EtcdCluster> = Api::namespaced(world.management.admin_client().await?, TEAM_B);
    let b = api.get("etcd").await?;
    let conflict = b
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONFLICT))
        .context("no Conflict condition")?;
    assert_eq!(
        (conflict.status.as_str(), conflict.reason.as_str()),
        ("True", "ObjectOwnedElsewhere")
    );
    assert!(
        conflict
            .message
            .contains("StatefulSet/etcd-system/etcd-etcd (owned by team-a.etcd)"),
        "{}",
        conflict.message
    );

    // Deleting team-b's cluster (its finalizer runs) deletes nothing of team-a's.
    world.kubectl(&["delete", "-n", TEAM_B, "etcdcluster/etcd", "--wait=false"])?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while api.get_opt("etcd").await?.is_some() {
        if std::time::Instant::now() > deadline {
            bail!("team-b's EtcdCluster was not deleted");
        }
        let _ = ctl.reconcile(TEAM_B, "etcd").await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let writes: Vec<String> = workload
        .audit()?
        .by_since(WORKLOAD_USER, mark)
        .into_iter()
        .filter(|e| e.is_write() && e.resource() != "pods/portforward")
        .map(ToString::to_string)
        .collect();
    assert!(
        writes.is_empty(),
        "team-b wrote into team-a's objects: {writes:#?}"
    );
    let after = sts.get("etcd-etcd").await?;
    assert_eq!(before.metadata.uid, after.metadata.uid);
    assert_eq!(
        before.metadata.resource_version,
        after.metadata.resource_version
    );
    assert_eq!(ctl.reconcile(NS, "etcd").await?, Outcome::Converged);
    read_everywhere(&world, "w1", "etcd", 1, "team-a-data").await?;
    Ok(())
}

/// The StatefulSet once the controller-manager reports every replica
/// ready and available on the current revision of its current generation.
async fn settled(sts: &Api<StatefulSet>, name: &str) -> Result<StatefulSet> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let found = sts.get(name).await?;
        let replicas = found.spec.replicas;
        if let Some(st) = found.status.as_ref()
            && st.observed_generation == found.metadata.generation
            && Some(st.replicas) == replicas
            && st.ready_replicas == replicas
            && st.available_replicas == replicas
            && st.current_revision.is_some()
            && st.current_revision == st.update_revision
        {
            return Ok(found);
        }
        if std::time::Instant::now() > deadline {
            bail!("StatefulSet {name} never settled: {:?}", found.status);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_safety_identity_edits_are_refused_by_the_api_server() -> Result<()> {
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("etcd", "w1", 1, "3.5.1"))?;
    converge_real(&mut ctl, &["etcd"]).await?;
    for edit in [
        r#"{"spec":{"workloadNamespace":"elsewhere"}}"#,
        r#"{"spec":{"tls":{"enabled":false}}}"#,
        r#"{"spec":{"clusterRef":{"name":"w2"}}}"#,
    ] {
        let refused = world.kubectl(&[
            "patch",
            "-n",
            NS,
            "etcdcluster/etcd",
            "--type=merge",
            "-p",
            edit,
        ]);
        let message = refused.expect_err(edit).to_string();
        assert!(
            message.contains("Invalid") && message.contains("immutable"),
            "{edit}: {message}"
        );
    }
    assert_eq!(ctl.reconcile(NS, "etcd").await?, Outcome::Converged);
    Ok(())
}

/// The PodDisruptionBudget the controller renders (`maxUnavailable: 1`)
/// holds on a real API server with the real disruption controller: while
/// one member is down after an eviction, the Eviction API refuses a second
/// member's (429), so a node drain never takes two members at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_safety_a_second_member_eviction_is_refused_by_the_pdb_while_one_is_down() -> Result<()>
{
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    let mut ctl = world.controller().await?;
    world.apply(&cluster_yaml("shop", "w1", 3, "3.5.1"))?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(&world, "shop")?;
    put(&world, "w1", "shop", 3, "before-the-drain").await?;
    let workload = world.workload("w1").admin_client().await?;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(workload.clone(), WORKLOAD_NS);
    // The disruption controller has counted the three ready members.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let pdb = pdbs.get("shop-etcd").await?;
        let status = pdb.status.clone().context("PDB status")?;
        if status.disruptions_allowed == Some(1)
            && status.current_healthy == Some(3)
            && status.observed_generation >= pdb.metadata.generation
        {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the disruption controller never allowed one disruption: {status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The API server's own answer: kube's default client would retry a 429
    // after its Retry-After and succeed once the member is back.
    let evicting = world
        .workload("w1")
        .plane
        .admin_client_without_retries()
        .await?;
    let pods: Api<Pod> = Api::namespaced(evicting, WORKLOAD_NS);
    let evict = kube::api::EvictParams::default();
    pods.evict("shop-etcd-0", &evict)
        .await
        .context("the first eviction is allowed")?;
    let after_first = pdbs.get("shop-etcd").await?.status;
    let refused = pods.evict("shop-etcd-1", &evict).await;
    let after_second = pdbs.get("shop-etcd").await?.status;
    match &refused {
        Err(kube::Error::Api(s)) if s.code == 429 => {
            assert!(s.message.contains("disruption budget"), "{s:?}")
        }
        other => bail!(
            "a second eviction while one member is down: {other:?}; PDB after the first: \
             {after_first:?}; after the second: {after_second:?}"
        ),
    }
    let second = pods.get("shop-etcd-1").await?;
    assert!(
        second.metadata.deletion_timestamp.is_none(),
        "shop-etcd-1 stays"
    );
    // The evicted member comes back on its own volume; the cluster and its
    // data are whole.
    world.kubectl_workload(
        "w1",
        &[
            "wait",
            "-n",
            WORKLOAD_NS,
            "--timeout=120s",
            "--for=jsonpath={.status.readyReplicas}=3",
            "statefulset/shop-etcd",
        ],
    )?;
    converge_real(&mut ctl, &["shop"]).await?;
    wait_available(&world, "shop")?;
    read_everywhere(&world, "w1", "shop", 3, "before-the-drain").await?;
    Ok(())
}
