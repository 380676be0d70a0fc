//! End to end on real etcd and a real S3 server (moto): recovery from a
//! permanent loss of quorum from a backup (`quorumLoss: FromBackup`, issue
//! 36). Every member of a three-member cluster is lost with its volume
//! (processes killed, data wiped, pods and PVCs deleted; the StatefulSet
//! makes new, empty ones), after a writer ran and a backup was taken. The
//! cluster comes back under the same name, PKI and Services with the
//! backup's data (a newer backup whose restore drill failed is passed over), through a controller restarted after every recovery step;
//! a client holding the old CA and client certificate reads it.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::conditions::{self, AVAILABLE};
use etcdfleet_api::recovery::{QuorumLossPolicy, RECOVERING, RecoverySpec, phase};
use etcdfleet_api::{EtcdBackup, EtcdCluster};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, MemberClient};
use etcdfleet_controllers::etcdcluster::ReconcilerSettings;
use etcdfleet_controllers::etcdcluster::context::Answer;
use etcdfleet_controllers::etcdcluster::plan::Step;
use etcdfleet_controllers::render::Names;
use etcdfleet_tests::driver::{TestController, converge, fast_settings};
use etcdfleet_tests::etcd_harness::{AckedWriter, EtcdVersion, require_etcd, verify_acknowledged};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::s3::{CREDENTIALS, S3Server, back_up, put_credentials};
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, controller_with, etcd_of, get, put, read_everywhere, running,
};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams};

/// The shortest `lostAfterSeconds` the API takes.
const LOST_AFTER: i32 = 30;

fn from_backup() -> EtcdCluster {
    let mut c = cluster("etcd-a", "a", 3, "3.5.1");
    c.spec.config.recovery = Some(RecoverySpec {
        quorum_loss: Some(QuorumLossPolicy::FromBackup),
        lost_after_seconds: Some(LOST_AFTER),
    });
    c
}

/// The restored member 0's learners need the leader to dial them for a
/// raft snapshot, through a name the test world's resolver caches for up
/// to 5 s (see e2e_restore): a 20 s failure grace lets them join.
fn settings() -> ReconcilerSettings {
    ReconcilerSettings {
        member_failure_grace: Duration::from_secs(20),
        ..fast_settings()
    }
}

/// Every member lost with its volume.
async fn lose_every_member(fleet: &Fleet) -> Result<()> {
    let runtime = fleet.runtime("a");
    let client = fleet.workload_client("a");
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOAD_NS);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, WORKLOAD_NS);
    for o in 0..3 {
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

/// What clients hold on to: the PKI Secret's data and the client Service.
async fn client_facing(fleet: &Fleet) -> Result<(Secret, Service)> {
    let names = Names::new("etcd-a", WORKLOAD_NS);
    let pki = Api::<Secret>::namespaced(fleet.management_direct(), NS)
        .get(&names.pki_secret())
        .await
        .context("the PKI Secret")?;
    let service = Api::<Service>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get(&names.client_service())
        .await
        .context("the client Service")?;
    Ok((pki, service))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_loss_of_every_member_restores_the_newest_backup_whose_drill_did_not_fail_as_a_new_identity_under_the_same_name_and_pki()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    // The seeder runs the etcdfleet binary of this build.
    etcdfleet_tests::controller_process::etcdfleet_binary();
    let s3 = S3Server::start().context("the S3 server (moto) did not start")?;
    s3.create_bucket("recovery")?;
    let (fleet, _) = Box::pin(running(&["a"], &[from_backup()])).await?;
    let mut ctl = controller_with(&fleet, settings());
    put_credentials(&fleet).await?;
    let (endpoints, old_client) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    let writer = AckedWriter::start(endpoints, old_client.clone(), "acked").await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let report = writer.stop().await?;
    ensure!(!report.acknowledged.is_empty(), "no write acknowledged");
    let destination = s3.destination("recovery", CREDENTIALS);
    let backup = back_up(
        (fleet.management_direct(), NS),
        &ctl,
        "nightly",
        "etcd-a",
        destination,
    )
    .await?;
    let backup_revision = backup.status.as_ref().and_then(|s| s.revision);
    // Written after the backup: lost with the members.
    put(&fleet, "a", "etcd-a", 3, "after-the-backup").await?;
    // A newer backup holds it, but its restore drill failed: never used.
    let destination = s3.destination("recovery", CREDENTIALS);
    back_up(
        (fleet.management_direct(), NS),
        &ctl,
        "newer",
        "etcd-a",
        destination,
    )
    .await?;
    fail_drill_of(&fleet, "newer").await?;
    ctl.reconcile(NS, "etcd-a").await?;
    let (pki_before, service_before) = client_facing(&fleet).await?;
    let identity_before = identity(&fleet).await?;
    remember_a_bootstrap_answer(&fleet, &ctl).await?;
    lose_every_member(&fleet).await?;

    let mut restarts = 0;
    let log = Box::pin(converge(
        &mut ctl,
        &[(NS, "etcd-a")],
        Duration::from_secs(240),
        || fleet.sync_all(),
        |_, step, ctl| {
            if matches!(step, Step::Recovery(_)) {
                *ctl = controller_with(&fleet, settings());
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
            "ClearForRestore",
            "ReseedFromBackup",
            "CompleteRecovery"
        ],
        "{:?}",
        log.steps
    );
    assert_eq!(restarts, recovery.len());

    // The same name, PKI and Services: a client with the old CA and
    // certificate reads every write acknowledged before the backup, and
    // none after it.
    let (pki_after, service_after) = client_facing(&fleet).await?;
    assert_eq!(pki_after.data, pki_before.data, "the PKI Secret changed");
    assert_eq!(pki_after.metadata.uid, pki_before.metadata.uid);
    assert_eq!(service_after.metadata.uid, service_before.metadata.uid);
    // A new cluster id and new member ids: no member of the lost cluster,
    // back on its old data, can be taken for one of the restored cluster.
    let (cluster_id, members) = identity(&fleet).await?;
    assert_ne!(cluster_id, identity_before.0, "the lost cluster's id");
    for id in &members {
        assert!(
            !identity_before.1.contains(id),
            "member id {id:x} of the lost cluster"
        );
    }
    let (endpoints, _) = etcd_of(&fleet, "a", "etcd-a", 3).await?;
    assert_old_client_reads(&report, &endpoints, &old_client).await?;
    put(&fleet, "a", "etcd-a", 3, "after-the-recovery").await?;
    read_everywhere(&fleet, "a", "etcd-a", 3, "after-the-recovery").await?;
    assert_recorded(
        &fleet,
        backup_revision.context("the backup has no revision")?,
    )
    .await
}

/// What a controller kept before this fix when member 0 answered it while
/// the cluster bootstrapped (a poll that found no quorum yet): its status,
/// and a membership of itself alone. That answer outlived the loss of every
/// member and stood in for a survivor ("etcd-a-etcd-0 answered, but its
/// volume does not record it"), so the recovery from the backup never
/// started, and the status listed one voter. An answer speaks only for the
/// volume it was read over: once the claims are made again, it is dropped.
async fn remember_a_bootstrap_answer(fleet: &Fleet, ctl: &TestController) -> Result<()> {
    let (endpoints, config) = etcd_of(fleet, "a", "etcd-a", 1).await?;
    let member = MemberClient::connect(&endpoints[0], &config).await?;
    let status = member.status().await?;
    let (_, listed) = member.local_members().await?;
    let alone: Vec<_> = listed
        .into_iter()
        .filter(|m| m.id == status.member_id)
        .collect();
    let pvc = Api::<PersistentVolumeClaim>::namespaced(fleet.workload_client("a"), WORKLOAD_NS)
        .get("data-etcd-a-etcd-0")
        .await?;
    let answer = Answer {
        status: status.clone(),
        members: alone,
        at: std::time::Instant::now(),
        volume: pvc.metadata.uid,
    };
    let mut memory = ctl
        .ctx
        .recovery
        .member_answers
        .lock()
        .expect("answer memory");
    let kept = memory.entry(format!("{NS}/etcd-a")).or_default();
    kept.insert(status.member_id, answer);
    Ok(())
}

/// The cluster id and the member ids of `etcd-a`'s 3 members.
async fn identity(fleet: &Fleet) -> Result<(u64, Vec<u64>)> {
    let (endpoints, config) = etcd_of(fleet, "a", "etcd-a", 3).await?;
    let client = ClusterClient::connect(&endpoints, &config).await?;
    let (_, leader) = client.leader().await?;
    let members = client.list_members().await?.iter().map(|m| m.id).collect();
    Ok((leader.cluster_id, members))
}

async fn assert_old_client_reads(
    report: &etcdfleet_tests::etcd_harness::WriteReport,
    endpoints: &[String],
    old_client: &EtcdConfig,
) -> Result<()> {
    let checked = verify_acknowledged(report, endpoints, old_client, "acked").await?;
    assert_eq!(checked, report.acknowledged.len());
    let mut kv = ClusterClient::connect(endpoints, old_client).await?.kv();
    let after = kv.get("after-the-backup", None).await?;
    assert!(after.kvs().is_empty(), "a write after the backup is back");
    Ok(())
}

/// `status.lastRecovery` names the backup, its revision and the loss
/// window; `Recovering` is over; three voters serve.
/// Records a failed restore drill on backup `name` (as the drill of a
/// schedule would: docs/backups.md).
async fn fail_drill_of(fleet: &Fleet, name: &str) -> Result<()> {
    let api = Api::<EtcdBackup>::namespaced(fleet.management_direct(), NS);
    let drill = serde_json::json!({
        "backup": name,
        "result": "Failed",
        "reason": "HashDiffers",
        "message": "the key space hashes differently restored",
    });
    let patch = serde_json::json!({ "status": { "lastDrill": drill } });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn assert_recorded(fleet: &Fleet, backup_revision: i64) -> Result<()> {
    let status = get(fleet, "etcd-a").await?.status.context("no status")?;
    let record = status.last_recovery.context("no lastRecovery")?;
    assert_eq!(record.phase, phase::COMPLETED);
    assert_eq!(record.policy, "FromBackup");
    let backup = record.backup.as_ref().context("no backup recorded")?;
    assert_eq!(backup.name, "nightly");
    assert_eq!(record.kept_revision, backup_revision);
    assert!(
        record
            .loss_window
            .contains(&format!("revision {backup_revision} is lost")),
        "{}",
        record.loss_window
    );
    let lost: Vec<&str> = record.lost.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lost, ["etcd-a-etcd-0", "etcd-a-etcd-1", "etcd-a-etcd-2"]);
    assert!(
        record.lost.iter().all(|l| l.evidence.len() >= 3),
        "{:?}",
        record.lost
    );
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
