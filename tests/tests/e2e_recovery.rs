//! End to end on real etcd: recovery from a permanent loss of quorum
//! (`spec.recovery.quorumLoss`, issue 36). Two of three members are lost
//! with their volumes (processes killed, data wiped, pods and PVCs
//! deleted; the StatefulSet makes new, empty ones), a writer running
//! before the loss:
//!
//! - `FromSurvivors` recovers from the survivor with every write it
//!   acknowledged, through a controller restarted after every recovery
//!   step, forcing the new cluster exactly once, and grows back;
//! - `Manual` takes no step;
//! - members the controller cannot reach while their pods are Ready are
//!   never lost, whatever the policy;
//! - a kept claim counts as lost with its data only when its volume is
//!   local to a node that is gone.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::conditions::{self, AVAILABLE};
use etcdfleet_api::recovery::{QuorumLossPolicy, RECOVERING, RecoverySpec, phase};
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_tests::driver::{TestController, converge};
use etcdfleet_tests::etcd_harness::{AckedWriter, EtcdVersion, require_etcd, verify_acknowledged};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, controller, etcd_of, get, put, read_everywhere, running,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams};

/// The shortest `lostAfterSeconds` the API takes.
const LOST_AFTER: Duration = Duration::from_secs(30);

fn recovering(policy: QuorumLossPolicy) -> EtcdCluster {
    let mut c = cluster("etcd-a", "a", 3, "3.5.1");
    c.spec.config.recovery = Some(RecoverySpec {
        quorum_loss: Some(policy),
        lost_after_seconds: Some(LOST_AFTER.as_secs() as i32),
    });
    c
}

/// Makes member 0 the leader: every write acknowledged from then on was
/// applied on it (a leader acknowledges what it applied).
async fn lead_from_member_0(fleet: &Fleet) -> Result<()> {
    let (endpoints, config) = etcd_of(fleet, "a", "etcd-a", 3).await?;
    let client = ClusterClient::connect(&endpoints, &config).await?;
    let id = client
        .member(&endpoints[0])
        .await?
        .status()
        .await?
        .member_id;
    client.move_leader(id).await?;
    let (_, leader) = client.leader().await?;
    ensure!(leader.member_id == id, "member 0 does not lead");
    Ok(())
}

/// Members 1 and 2 lost with their volumes: their processes killed, their
/// data wiped, their pods and PVCs deleted.
async fn lose_members_1_and_2(fleet: &Fleet) -> Result<()> {
    let runtime = fleet.runtime("a");
    let client = fleet.workload_client("a");
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NS);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, WORKLOAD_NS);
    for o in [1, 2] {
        let pvc = format!("data-etcd-a-etcd-{o}");
        runtime.wipe_pvc(WORKLOAD_NS, &pvc).await?;
        pvcs.delete(&pvc, &DeleteParams::default()).await?;
        pods.delete(
            &format!("etcd-a-etcd-{o}"),
            &DeleteParams::default().grace_period(0),
        )
        .await?;
    }
    Ok(())
}

/// Reconciles (syncing the runtime between rounds) for `how_long`,
/// returning every outcome.
async fn reconcile_for(
    fleet: &Fleet,
    ctl: &TestController,
    how_long: Duration,
) -> Result<Vec<Result<Outcome, String>>> {
    let until = Instant::now() + how_long;
    let mut outcomes = Vec::new();
    while Instant::now() < until {
        fleet.sync_all().await?;
        outcomes.push(ctl.reconcile(NS, "etcd-a").await.map_err(|e| e.to_string()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(outcomes)
}

fn acted(outcomes: &[Result<Outcome, String>]) -> Vec<Step> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Ok(Outcome::Acted(step)) => Some(step.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_loss_recovers_from_the_survivor_once_through_controller_restarts() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = Box::pin(running(
        &["a"],
        &[recovering(QuorumLossPolicy::FromSurvivors)],
    ))
    .await?;
    lead_from_member_0(&fleet).await?;
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The controller sees the cluster once more with the writes going on.
    ctl.reconcile(NS, "etcd-a").await?;
    let seen = get(&fleet, "etcd-a").await?;
    lose_members_1_and_2(&fleet).await?;
    let report = writer.stop().await?;
    ensure!(!report.acknowledged.is_empty(), "no write acknowledged");

    // Until the lost members are down for lostAfter, nothing is done.
    let early = reconcile_for(&fleet, &ctl, LOST_AFTER / 3).await?;
    assert!(acted(&early).is_empty(), "acted early: {early:?}");

    // Then the recovery, with a fresh controller (nothing in memory) after
    // every recovery step.
    let mut restarts = 0;
    let log = Box::pin(converge(
        &mut ctl,
        &[(NS, "etcd-a")],
        Duration::from_secs(180),
        || fleet.sync_all(),
        |_, step, ctl| {
            if matches!(step, Step::Recovery(_)) {
                *ctl = controller(&fleet);
                restarts += 1;
            }
            Ok(())
        },
    ))
    .await
    .with_context(|| fleet.runtime("a").all_pod_logs(30))?;
    let recovery = log.recovery_kinds();
    assert_eq!(
        recovery,
        [
            "BeginRecovery",
            "FenceLostMembers",
            "WriteForcingTemplate",
            "RestartRecoveringMember",
            "EndForceNewCluster",
            "CompleteRecovery"
        ],
        "{:?}",
        log.steps
    );
    assert_eq!(restarts, recovery.len());
    let forced = fleet
        .runtime("a")
        .pod_log_tail(WORKLOAD_NS, "etcd-a-etcd-0", 100_000)
        .matches("force-new-cluster: Forced")
        .count();
    assert_eq!(forced, 1, "--force-new-cluster ran {forced} times");
    assert_recovered(&fleet, &seen, &report, &endpoints, &config).await
}

/// Every write the survivor acknowledged is there, on all three members;
/// the status records the recovery; writes go on.
async fn assert_recovered(
    fleet: &Fleet,
    seen_before: &EtcdCluster,
    report: &etcdfleet_tests::etcd_harness::WriteReport,
    endpoints: &[String],
    config: &etcdfleet_controllers::etcd::EtcdConfig,
) -> Result<()> {
    let checked = verify_acknowledged(report, endpoints, config, "acked").await?;
    assert_eq!(checked, report.acknowledged.len());
    put(fleet, "a", "etcd-a", 3, "after-the-recovery").await?;
    read_everywhere(fleet, "a", "etcd-a", 3, "after-the-recovery").await?;
    let status = get(fleet, "etcd-a").await?.status.context("no status")?;
    let record = status.last_recovery.context("no lastRecovery")?;
    assert_eq!(record.phase, phase::COMPLETED);
    assert_eq!(record.member, "etcd-a-etcd-0");
    let lost: Vec<&str> = record.lost.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lost, ["etcd-a-etcd-1", "etcd-a-etcd-2"]);
    assert!(
        record.lost.iter().all(|l| l.evidence.len() >= 3),
        "{:?}",
        record.lost
    );
    assert!(record.kept_revision > 0, "{record:?}");
    assert!(!record.loss_window.is_empty());
    let before = seen_before.status.as_ref().context("no status before")?;
    assert_eq!(before.members.len(), 3);
    let recovering = conditions::find(&status.conditions, RECOVERING).context("no Recovering")?;
    assert_eq!(
        (recovering.status.as_str(), recovering.reason.as_str()),
        ("False", "Completed")
    );
    let available = conditions::find(&status.conditions, AVAILABLE).context("no Available")?;
    assert_eq!(available.status, "True", "{available:?}");
    assert_eq!(status.members.iter().filter(|m| !m.learner).count(), 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_loss_under_the_manual_policy_takes_no_step() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, ctl) = Box::pin(running(&["a"], &[recovering(QuorumLossPolicy::Manual)])).await?;
    lose_members_1_and_2(&fleet).await?;
    let outcomes = reconcile_for(&fleet, &ctl, LOST_AFTER + Duration::from_secs(10)).await?;
    assert!(acted(&outcomes).is_empty(), "acted: {outcomes:?}");
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    let available = conditions::find(&status.conditions, AVAILABLE).context("no Available")?;
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("False", "QuorumLost"),
        "{available:?}"
    );
    assert!(status.last_recovery.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_unreachable_from_the_controller_with_ready_pods_are_never_recovered() -> Result<()>
{
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, _) = Box::pin(running(
        &["a"],
        &[recovering(QuorumLossPolicy::FromSurvivors)],
    ))
    .await?;
    // The tunnels to members 1 and 2 break; etcd is whole, their pods Ready.
    let dialer = fleet.dialer();
    dialer.block("etcd-a-etcd-1");
    dialer.block("etcd-a-etcd-2");
    let ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        dialer.clone(),
        etcdfleet_tests::driver::fast_settings(),
    );
    let outcomes = reconcile_for(&fleet, &ctl, LOST_AFTER + Duration::from_secs(10)).await?;
    let steps = acted(&outcomes);
    assert!(
        !steps.iter().any(|s| matches!(s, Step::Recovery(_))),
        "recovered a reachable cluster: {steps:?}"
    );
    assert!(
        !steps.iter().any(Step::is_destructive),
        "destructive while cut off: {steps:?}"
    );
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    assert!(status.last_recovery.is_none());
    dialer.unblock_all();
    assert_eq!(ctl.reconcile(NS, "etcd-a").await?, Outcome::Converged);
    Ok(())
}

/// A copy of member 1's data directory (its process stopped first), as a
/// node that comes back later would still hold it.
async fn keep_member_1_data(fleet: &Fleet, into: &std::path::Path) -> Result<()> {
    let runtime = fleet.runtime("a");
    runtime
        .kill_pod_process(WORKLOAD_NS, "etcd-a-etcd-1")
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let from = runtime.pvc_dir(WORKLOAD_NS, "data-etcd-a-etcd-1");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&from)
        .arg(into)
        .status()?;
    ensure!(copied.success(), "copying {}", from.display());
    Ok(())
}

/// Member 1 of the old cluster, back on its old data: etcd on loopback
/// ports, resolving the members' names as the pods do, with the cluster's
/// peer and server certificates.
async fn old_member_1(
    fleet: &Fleet,
    data: &std::path::Path,
) -> Result<(etcdfleet_tests::etcd_harness::EtcdProcess, String)> {
    use etcdfleet_controllers::render::Names;
    use etcdfleet_tests::etcd_harness::{EtcdBinary, EtcdProcess, ProcessSpec, free_ports};
    use k8s_openapi::api::core::v1::Secret;
    let names = Names::new("etcd-a", WORKLOAD_NS);
    let secrets: Api<Secret> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    let tls = data.join("tls");
    std::fs::create_dir_all(&tls)?;
    for (kind, secret) in [
        ("peer", names.peer_tls_secret()),
        ("server", names.server_tls_secret()),
    ] {
        let secret = secrets.get(&secret).await?;
        for key in ["tls.crt", "tls.key", "ca.crt"] {
            let bytes = (secret.data.as_ref())
                .and_then(|d| d.get(key))
                .with_context(|| format!("{key} of the {kind} TLS Secret"))?;
            std::fs::write(tls.join(format!("{kind}-{key}")), &bytes.0)?;
        }
    }
    let ports = free_ports(3)?;
    let client = format!("https://127.0.0.1:{}", ports[0]);
    let file = |name: &str| tls.join(name).display().to_string();
    let args = vec![
        format!("--name={}", names.pod(1)),
        format!("--data-dir={}", data.join("data").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls=https://127.0.0.1:{}", ports[1]),
        format!("--listen-metrics-urls=http://127.0.0.1:{}", ports[2]),
        "--heartbeat-interval=50".into(),
        "--election-timeout=500".into(),
        "--client-cert-auth=true".into(),
        format!("--trusted-ca-file={}", file("server-ca.crt")),
        format!("--cert-file={}", file("server-tls.crt")),
        format!("--key-file={}", file("server-tls.key")),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-trusted-ca-file={}", file("peer-ca.crt")),
        format!("--peer-cert-file={}", file("peer-tls.crt")),
        format!("--peer-key-file={}", file("peer-tls.key")),
    ];
    let process = EtcdProcess::spawn(&ProcessSpec {
        binary: EtcdBinary::locate(EtcdVersion::V3_5).etcd,
        args,
        env: vec![],
        log_file: data.join("old-member-1.log"),
        hosts_file: Some(fleet.runtime("a").hosts_file()),
    })?;
    Ok((process, client))
}

/// Puts `key` through `endpoint` alone, within two seconds.
async fn put_through(
    endpoint: &str,
    config: &etcdfleet_controllers::etcd::EtcdConfig,
    key: &str,
) -> Result<()> {
    let mut kv = ClusterClient::connect(&[endpoint.to_string()], config)
        .await?
        .kv();
    tokio::time::timeout(Duration::from_secs(2), kv.put(key, "v", None)).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_loss_a_lost_member_back_on_its_old_data_never_rejoins_and_no_two_clusters_take_writes()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = Box::pin(running(
        &["a"],
        &[recovering(QuorumLossPolicy::FromSurvivors)],
    ))
    .await?;
    lead_from_member_0(&fleet).await?;
    put(&fleet, "a", "etcd-a", 3, "before-the-loss").await?;
    let kept = tempfile::tempdir()?;
    keep_member_1_data(&fleet, kept.path()).await?;
    let data = kept.path().join("data-etcd-a-etcd-1");
    lose_members_1_and_2(&fleet).await?;
    Box::pin(converge(
        &mut ctl,
        &[(NS, "etcd-a")],
        Duration::from_secs(180),
        || fleet.sync_all(),
        etcdfleet_tests::driver::no_hook,
    ))
    .await?;

    // Member 1's node comes back with its old data, and a writer on each
    // side: the old member finds itself removed and stops; it takes no
    // write, while the recovered cluster takes every one.
    let (_, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let (old, old_endpoint) = old_member_1(&fleet, &data).await?;
    let (mut old_side, mut new_side) = (0, 0);
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until && old.is_running() {
        old_side += usize::from(
            put_through(&old_endpoint, &config, "old-side")
                .await
                .is_ok(),
        );
        new_side += usize::from(put(&fleet, "a", "etcd-a", 3, "new-side").await.is_ok());
    }
    let log = old.log_tail(200);
    assert!(!old.is_running(), "the old member still runs:\n{log}");
    assert_eq!(old_side, 0, "the old member took writes:\n{log}");
    assert!(new_side > 0, "the recovered cluster took no write");
    assert!(
        log.contains("permanently removed"),
        "the old member did not stop as removed:\n{log}"
    );
    read_everywhere(&fleet, "a", "etcd-a", 3, "before-the-loss").await?;
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    assert_eq!(status.members.iter().filter(|m| !m.learner).count(), 3);
    Ok(())
}

/// Applies the shipped optional `config/workload-rbac-nodes` to workload
/// `a`, as a cluster that recovers on node evidence is given it.
fn grant_node_rbac(fleet: &Fleet) -> Result<()> {
    let dir = etcdfleet_tests::apiserver::kinds::config_dir().join("workload-rbac-nodes");
    for file in ["cluster_role.yaml", "cluster_role_binding.yaml"] {
        let text = std::fs::read_to_string(dir.join(file))?;
        fleet.workload_api("a").add_rbac_yaml(&text)?;
    }
    Ok(())
}

/// Makes `name` (in workload `a`) a Ready Node.
async fn node_ready(fleet: &Fleet, name: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))?;
    Api::<Node>::all(fleet.workload_client("a"))
        .create(&Default::default(), &node)
        .await?;
    Ok(())
}

/// Makes the volume member `ordinal`'s claim is bound to a local volume of
/// node `node` (a PersistentVolume whose required affinity names it).
async fn local_volume(fleet: &Fleet, ordinal: u32, node: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::PersistentVolume;
    let client = fleet.workload_client("a");
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), WORKLOAD_NS)
        .get(&format!("data-etcd-a-etcd-{ordinal}"))
        .await?;
    let volume = (claim.spec.as_ref())
        .and_then(|s| s.volume_name.clone())
        .context("the claim is not bound")?;
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "local": {"path": format!("/mnt/disks/{volume}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            ]}]}}
        }
    }))?;
    Api::<PersistentVolume>::all(client)
        .create(&Default::default(), &pv)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_loss_counts_kept_volumes_lost_only_with_the_node_they_are_local_to() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let (fleet, mut ctl) = Box::pin(running(
        &["a"],
        &[recovering(QuorumLossPolicy::FromSurvivors)],
    ))
    .await?;
    lead_from_member_0(&fleet).await?;
    grant_node_rbac(&fleet)?;
    // Member 0's volume is local to node-0, which stays; members 1 and 2's
    // to node-1 and node-2.
    node_ready(&fleet, "node-0").await?;
    for (o, node) in [(0, "node-0"), (1, "node-1"), (2, "node-2")] {
        local_volume(&fleet, o, node).await?;
    }
    let (endpoints, config) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ctl.reconcile(NS, "etcd-a").await?;
    // Nodes 1 and 2 never registered: gone, with the data on them. Their
    // claims stay, recorded for their members; the pods made again start
    // on volumes with nothing of it.
    let runtime = fleet.runtime("a");
    let pods: Api<Pod> = Api::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    for o in [1, 2] {
        runtime
            .wipe_pvc(WORKLOAD_NS, &format!("data-etcd-a-etcd-{o}"))
            .await?;
        pods.delete(
            &format!("etcd-a-etcd-{o}"),
            &DeleteParams::default().grace_period(0),
        )
        .await?;
    }
    let report = writer.stop().await?;
    ensure!(!report.acknowledged.is_empty(), "no write acknowledged");

    let log = Box::pin(converge(
        &mut ctl,
        &[(NS, "etcd-a")],
        Duration::from_secs(180),
        || fleet.sync_all(),
        etcdfleet_tests::driver::no_hook,
    ))
    .await
    .with_context(|| fleet.runtime("a").all_pod_logs(30))?;
    let fenced = log.recovery_kinds().contains(&"FenceLostMembers");
    assert!(fenced, "{:?}", log.steps);
    let status = get(&fleet, "etcd-a").await?.status.context("no status")?;
    let record = status.last_recovery.context("no lastRecovery")?;
    for lost in &record.lost {
        let evidence = lost.evidence.join("; ");
        let node = format!("node-{}", &lost.name[lost.name.len() - 1..]);
        assert!(
            evidence.contains(&format!("is local to node {node}, which is gone")),
            "{evidence}"
        );
    }
    assert_eq!(record.lost.len(), 2);
    let checked = verify_acknowledged(&report, &endpoints, &config, "acked").await?;
    assert_eq!(checked, report.acknowledged.len());
    put(&fleet, "a", "etcd-a", 3, "after-the-recovery").await?;
    read_everywhere(&fleet, "a", "etcd-a", 3, "after-the-recovery").await
}
