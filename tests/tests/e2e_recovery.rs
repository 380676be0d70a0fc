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
//!   never lost, whatever the policy.

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
    let recovery: Vec<&str> = log
        .steps
        .iter()
        .filter_map(|(_, s)| match s {
            Step::Recovery(r) => Some(r.kind()),
            _ => None,
        })
        .collect();
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
