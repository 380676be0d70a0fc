//! Restore (`spec.bootstrap.restore`) against real etcd and a real
//! S3-compatible server (moto):
//! - a cluster created from a backup serves every key of it on every member
//!   (3.4 and 3.5): member 0 is seeded by the rendered init containers (the
//!   etcdfleet binary copied from the seeder image, run in the etcd image
//!   with its restore tool), the others join as learners;
//! - a snapshot that is missing, corrupt or truncated is refused before the
//!   controller writes anything to the workload cluster, with a
//!   `RestoreFailed` condition naming the object;
//! - a restore over volumes kept from a deleted cluster of the same name is
//!   refused until they are deleted, and never mixes their data in.

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::restore::{BootstrapSpec, RESTORE_FAILED, RestoreSource, reason};
use etcdfleet_api::{EtcdCluster, ObjectStoreDestination};
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::etcdcluster::ReconcilerSettings;
use etcdfleet_controllers::restore::KEPT_VOLUMES;
use etcdfleet_controllers::store::{Credentials, Store};
use etcdfleet_tests::driver::TestController;
use etcdfleet_tests::driver::fast_settings;
use etcdfleet_tests::etcd_harness::{
    EtcdVersion, MEMBER_ANSWER_BOUND, get_from_member, require_etcd,
};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::s3::{
    ACCESS_KEY_ID, CREDENTIALS, S3Server, SECRET_ACCESS_KEY, back_up, put_credentials,
};
use etcdfleet_tests::scenario::{
    NS, WORKLOAD_NS, cluster, controller_with, converge_all, create, etcd_of, get, put, running,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use kube::api::{Api, DeleteParams};
use std::time::Duration;

fn open(destination: &ObjectStoreDestination) -> Result<Store> {
    let creds = Credentials {
        access_key_id: ACCESS_KEY_ID.into(),
        secret_access_key: SECRET_ACCESS_KEY.into(),
        session_token: None,
    };
    Ok(Store::open(destination, Some(&creds))?)
}

fn restoring(name: &str, workload: &str, source: RestoreSource) -> EtcdCluster {
    restoring_version(name, workload, 1, "3.5.1", source)
}

fn restoring_version(
    name: &str,
    workload: &str,
    replicas: i32,
    version: &str,
    source: RestoreSource,
) -> EtcdCluster {
    let mut c = cluster(name, workload, replicas, version);
    c.spec.bootstrap = Some(BootstrapSpec {
        restore: Some(source),
        join: None,
    });
    c
}

/// Reconciles `name` a few times and checks that it is refused with
/// `want_reason`, naming `key`, and that nothing was written to `workload`.
async fn assert_refused_before_any_write(
    fleet: &Fleet,
    ctl: &TestController,
    name: &str,
    workload: &str,
    key: &str,
    want_reason: &str,
) -> Result<()> {
    for _ in 0..3 {
        let outcome = ctl.reconcile(NS, name).await?;
        let Outcome::Blocked(why) = &outcome else {
            anyhow::bail!("{name}: expected a refusal, got {outcome:?}");
        };
        ensure!(why.contains(key), "{name}: {why}");
    }
    let c = get(fleet, name).await?;
    let conds = &c.status.as_ref().context("no status")?.conditions;
    let failed = conds
        .iter()
        .find(|c| c.type_ == RESTORE_FAILED)
        .with_context(|| format!("{name}: no {RESTORE_FAILED} in {conds:?}"))?;
    ensure!(failed.status == "True", "{failed:?}");
    ensure!(failed.reason == want_reason, "{failed:?}");
    ensure!(failed.message.contains(key), "{failed:?}");
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|op| op.cluster == workload)
        .collect();
    ensure!(writes.is_empty(), "{name}: workload writes: {writes:?}");
    ensure!(
        fleet
            .object_names::<StatefulSet>(workload, WORKLOAD_NS)
            .await?
            .is_empty()
    );
    ensure!(
        fleet
            .object_names::<Service>(workload, WORKLOAD_NS)
            .await?
            .is_empty()
    );
    ensure!(
        fleet
            .object_names::<ConfigMap>(workload, WORKLOAD_NS)
            .await?
            .is_empty()
    );
    ensure!(
        fleet
            .object_names::<Secret>(workload, WORKLOAD_NS)
            .await?
            .is_empty()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_corrupt_and_truncated_snapshots_are_refused_before_any_workload_write()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("restore")?;
    let destination = s3.destination("restore", CREDENTIALS);
    let (fleet, ctl) = running(&["a", "b"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    put_credentials(&fleet).await?;
    let good = back_up(
        (fleet.management_direct(), NS),
        &ctl,
        "good",
        "etcd-a",
        destination.clone(),
    )
    .await?;
    // A write between the two backups gives the second its own object key
    // (keys are `<cluster>/<time>-<revision>.db`; same second, same revision
    // would share one).
    put(&fleet, "a", "etcd-a", 1, "between").await?;
    let corrupt = back_up(
        (fleet.management_direct(), NS),
        &ctl,
        "corrupt",
        "etcd-a",
        destination.clone(),
    )
    .await?;
    let gs = good.status.clone().context("status")?;
    let sha = gs.sha256.clone().context("sha")?;
    let store = open(&destination)?;

    // Flip bytes in the middle of the second backup's object (same size).
    let corrupt_key = corrupt
        .status
        .as_ref()
        .and_then(|s| s.object_key.clone())
        .context("key")?;
    let mut bytes = store.get_small(&corrupt_key).await?;
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 16] {
        *b ^= 0xff;
    }
    store.put_small(&corrupt_key, bytes.clone()).await?;
    // A truncated copy of the good one, named directly with the full size.
    let truncated_key = "backups/truncated.db";
    store
        .put_small(truncated_key, bytes[..bytes.len() / 3].to_vec())
        .await?;

    fleet.clear_ops();
    let cases = [
        (
            restoring(
                "from-corrupt",
                "b",
                RestoreSource {
                    backup_name: Some("corrupt".into()),
                    ..Default::default()
                },
            ),
            corrupt_key.clone(),
            reason::CHECKSUM_MISMATCH,
        ),
        (
            restoring(
                "from-missing",
                "b",
                RestoreSource {
                    destination: Some(destination.clone()),
                    object_key: Some("backups/gone.db".into()),
                    sha256: Some(sha.clone()),
                    ..Default::default()
                },
            ),
            "backups/gone.db".to_string(),
            reason::OBJECT_NOT_FOUND,
        ),
        (
            restoring(
                "from-truncated",
                "b",
                RestoreSource {
                    destination: Some(destination.clone()),
                    object_key: Some(truncated_key.into()),
                    sha256: Some(sha.clone()),
                    size_bytes: gs.size_bytes,
                    ..Default::default()
                },
            ),
            truncated_key.to_string(),
            reason::SIZE_MISMATCH,
        ),
    ];
    for (c, key, want) in &cases {
        create(&fleet, c).await?;
        let name = kube::ResourceExt::name_any(c);
        assert_refused_before_any_write(&fleet, &ctl, &name, "b", key, want).await?;
    }
    // A missing EtcdBackup is refused by name.
    let c = restoring(
        "from-nothing",
        "b",
        RestoreSource {
            backup_name: Some("never-made".into()),
            ..Default::default()
        },
    );
    create(&fleet, &c).await?;
    assert_refused_before_any_write(
        &fleet,
        &ctl,
        "from-nothing",
        "b",
        "never-made",
        reason::BACKUP_NOT_FOUND,
    )
    .await?;
    fleet.shutdown().await;
    Ok(())
}

/// Writes `n` keys `/restore/NNNN` = `value-NNNN` into `name` (1 member).
async fn write_keys(fleet: &Fleet, workload: &str, name: &str, n: usize) -> Result<()> {
    let (endpoints, config) = etcd_of(fleet, workload, name, 1).await?;
    let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
    for i in 0..n {
        tokio::time::timeout(
            Duration::from_secs(5),
            kv.put(format!("/restore/{i:04}"), format!("value-{i:04}"), None),
        )
        .await??;
    }
    Ok(())
}

/// Every member of `name` on its own (serializable reads) holds exactly the
/// `n` keys under `/restore/` with their values, and etcd lists `members`
/// voting members.
async fn every_member_holds(
    fleet: &Fleet,
    workload: &str,
    name: &str,
    members: u32,
    n: usize,
) -> Result<()> {
    let (endpoints, config) = etcd_of(fleet, workload, name, members).await?;
    let list = ClusterClient::connect(&endpoints, &config)
        .await?
        .list_members()
        .await?;
    ensure!(
        list.iter().filter(|m| !m.is_learner).count() == members as usize,
        "{name}: members {list:?}"
    );
    for (o, ep) in endpoints.iter().enumerate() {
        let endpoint = || async { Ok(ep.clone()) };
        let read = ("/restore/", etcd_client::GetOptions::new().with_prefix());
        let member = format!("{name}-etcd-{o}");
        let resp = get_from_member(&member, endpoint, &config, read, MEMBER_ANSWER_BOUND).await?;
        ensure!(
            resp.kvs().len() == n,
            "{name}: {} of {n} keys on {ep}",
            resp.kvs().len()
        );
        for (i, kv) in resp.kvs().iter().enumerate() {
            ensure!(kv.key_str()? == format!("/restore/{i:04}"), "{ep}: {kv:?}");
            ensure!(kv.value_str()? == format!("value-{i:04}"), "{ep}: {kv:?}");
        }
    }
    Ok(())
}

/// Writes keys into a cluster of `version`, backs it up to S3, creates a
/// three-member cluster from the backup in another workload cluster and
/// reads every key back from every member.
async fn restore_round_trip(version: EtcdVersion, tag: &str) -> Result<()> {
    if require_etcd(version).is_none() {
        return Ok(());
    }
    // The seeder runs the etcdfleet binary of this build: a stale one would
    // prove nothing.
    etcdfleet_tests::controller_process::etcdfleet_binary();
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("restore")?;
    let destination = s3.destination("restore", CREDENTIALS);
    const KEYS: usize = 300;
    let (fleet, ctl) = running(&["a", "b"], &[cluster("source", "a", 1, tag)]).await?;
    put_credentials(&fleet).await?;
    write_keys(&fleet, "a", "source", KEYS).await?;
    let backup = back_up(
        (fleet.management_direct(), NS),
        &ctl,
        "nightly",
        "source",
        destination,
    )
    .await?;
    let key = backup
        .status
        .as_ref()
        .and_then(|s| s.object_key.clone())
        .context("backup key")?;
    // Written after the backup: must not show up in the restore.
    put(&fleet, "a", "source", 1, "/restore/after-the-backup").await?;

    create(
        &fleet,
        &restoring_version(
            "restored",
            "b",
            3,
            tag,
            RestoreSource {
                backup_name: Some("nightly".into()),
                ..Default::default()
            },
        ),
    )
    .await?;
    // A learner of a restored cluster needs the leader to dial it for the
    // database snapshot (a raft snapshot: the restored log starts after
    // it); the dial resolves the new pod's name, which the test world's
    // hosts file (like cluster DNS) serves to etcd's resolver only after
    // its cache of up to 5 s. The 4 s failure grace of the other tests
    // would replace such a learner before it was ever reachable.
    let mut ctl = controller_with(
        &fleet,
        ReconcilerSettings {
            member_failure_grace: Duration::from_secs(20),
            ..fast_settings()
        },
    );
    converge_all(&fleet, &mut ctl, &["restored"]).await?;
    every_member_holds(&fleet, "b", "restored", 3, KEYS).await?;

    // What the seeder was rendered from is recorded, with the default
    // seeder image of this controller.
    let c = get(&fleet, "restored").await?;
    let record = c
        .status
        .as_ref()
        .and_then(|s| s.restore.clone())
        .context("no status.restore")?;
    ensure!(record.object_key == key, "{record:?}");
    ensure!(
        record.seeder_image == fast_settings().seeder_image,
        "{record:?}"
    );
    ensure!(record.backup_name.as_deref() == Some("nightly"));
    // Member 0 was seeded; members 1 and 2 joined and fetched nothing.
    let runtime = fleet.runtime("b");
    let log0 = std::fs::read_to_string(
        runtime
            .log_dir()
            .join(format!("{WORKLOAD_NS}_restored-etcd-0.log")),
    )
    .unwrap_or_default();
    let log1 = std::fs::read_to_string(
        runtime
            .log_dir()
            .join(format!("{WORKLOAD_NS}_restored-etcd-1.log")),
    )
    .unwrap_or_default();
    ensure!(
        log0.contains("restore-seed: Restored"),
        "pod 0 log:\n{log0}"
    );
    ensure!(
        log1.contains("restore-seed: JoiningExisting"),
        "pod 1 log:\n{log1}"
    );
    // The credentials were copied into the workload namespace for the seeder.
    let copied = Api::<Secret>::namespaced(fleet.workload_client("b"), WORKLOAD_NS)
        .get("restored-etcd-restore")
        .await?;
    ensure!(
        copied.data.as_ref().is_some_and(
            |d| d.get("accessKeyId").map(|v| v.0.as_slice()) == Some(ACCESS_KEY_ID.as_bytes())
        ),
        "{:?}",
        copied.data.as_ref().map(|d| d.keys().collect::<Vec<_>>())
    );
    fleet.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_created_from_a_3_5_backup_serves_every_key_on_every_member() -> Result<()> {
    restore_round_trip(EtcdVersion::V3_5, "3.5.1").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_created_from_a_3_4_backup_serves_every_key_on_every_member() -> Result<()> {
    restore_round_trip(EtcdVersion::V3_4, "3.4.23").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_over_kept_volumes_is_refused_until_they_are_deleted_and_never_mixes_data()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    etcdfleet_tests::controller_process::etcdfleet_binary();
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("restore")?;
    let destination = s3.destination("restore", CREDENTIALS);
    let (fleet, mut ctl) = running(&["a"], &[cluster("etcd-a", "a", 1, "3.5.1")]).await?;
    put_credentials(&fleet).await?;
    write_keys(&fleet, "a", "etcd-a", 20).await?;
    back_up(
        (fleet.management_direct(), NS),
        &ctl,
        "before",
        "etcd-a",
        destination,
    )
    .await?;
    put(&fleet, "a", "etcd-a", 1, "/restore/only-on-the-old-volume").await?;

    // Deleted: its PVC is kept (retention Retain) with the newer key on it.
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    api.delete("etcd-a", &DeleteParams::default()).await?;
    ensure!(ctl.reconcile(NS, "etcd-a").await? == Outcome::Deleted);
    fleet.sync_all().await?;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(fleet.workload_client("a"), WORKLOAD_NS);
    ensure!(
        pvcs.get_opt("data-etcd-a-etcd-0").await?.is_some(),
        "PVC kept"
    );

    // Recreated under the same name from the backup: refused, no writes.
    create(
        &fleet,
        &restoring(
            "etcd-a",
            "a",
            RestoreSource {
                backup_name: Some("before".into()),
                ..Default::default()
            },
        ),
    )
    .await?;
    fleet.clear_ops();
    for _ in 0..3 {
        let outcome = ctl.reconcile(NS, "etcd-a").await?;
        ensure!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
    }
    let writes: Vec<_> = fleet
        .writes()
        .into_iter()
        .filter(|op| op.cluster == "a")
        .collect();
    ensure!(writes.is_empty(), "workload writes: {writes:#?}");
    let c = get(&fleet, "etcd-a").await?;
    let failed = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == RESTORE_FAILED))
        .context("no RestoreFailed")?;
    ensure!(
        failed.status == "True" && failed.reason == KEPT_VOLUMES,
        "{failed:?}"
    );
    ensure!(failed.message.contains("data-etcd-a-etcd-0"), "{failed:?}");
    ensure!(
        c.status.as_ref().and_then(|s| s.restore.as_ref()).is_none(),
        "nothing recorded as restored"
    );

    // The operator deletes the old volume: the restore proceeds, and the
    // cluster holds the snapshot's keys and nothing of the old volume.
    pvcs.delete("data-etcd-a-etcd-0", &DeleteParams::default())
        .await?;
    fleet.sync_all().await?;
    converge_all(&fleet, &mut ctl, &["etcd-a"]).await?;
    every_member_holds(&fleet, "a", "etcd-a", 1, 20).await?;
    fleet.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_that_would_downgrade_the_snapshot_is_refused_before_any_workload_write()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_4).is_none() || require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("restore")?;
    let destination = s3.destination("restore", CREDENTIALS);
    let (fleet, ctl) = running(&["a", "b"], &[cluster("source", "a", 1, "3.5.1")]).await?;
    put_credentials(&fleet).await?;
    write_keys(&fleet, "a", "source", 10).await?;
    let backup = back_up(
        (fleet.management_direct(), NS),
        &ctl,
        "taken-by-3-5",
        "source",
        destination.clone(),
    )
    .await?;
    let status = backup.status.clone().context("backup status")?;
    ensure!(
        status.etcd_version.as_deref() == Some("3.5.1"),
        "{status:?}"
    );
    let key = status.object_key.clone().context("key")?;
    let sha = status.sha256.clone().context("sha")?;

    fleet.clear_ops();
    // By its EtcdBackup, which records the etcd version it was taken from.
    create(
        &fleet,
        &restoring_version(
            "by-backup",
            "b",
            1,
            "3.4.23",
            RestoreSource {
                backup_name: Some("taken-by-3-5".into()),
                ..Default::default()
            },
        ),
    )
    .await?;
    assert_refused_before_any_write(
        &fleet,
        &ctl,
        "by-backup",
        "b",
        &key,
        reason::SNAPSHOT_VERSION_TOO_NEW,
    )
    .await?;
    // By destination, key and checksum alone: the version is read from the
    // snapshot itself while it is verified.
    create(
        &fleet,
        &restoring_version(
            "by-object",
            "b",
            1,
            "3.4.23",
            RestoreSource {
                destination: Some(destination.clone()),
                object_key: Some(key.clone()),
                sha256: Some(sha.clone()),
                ..Default::default()
            },
        ),
    )
    .await?;
    assert_refused_before_any_write(
        &fleet,
        &ctl,
        "by-object",
        "b",
        &key,
        reason::SNAPSHOT_VERSION_TOO_NEW,
    )
    .await?;
    for name in ["by-backup", "by-object"] {
        let c = get(&fleet, name).await?;
        let failed = c
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == RESTORE_FAILED))
            .context("no RestoreFailed")?;
        ensure!(
            failed.message.contains("3.5") && failed.message.contains("3.4.23"),
            "{name}: the message names both versions: {failed:?}"
        );
        ensure!(
            c.status.as_ref().and_then(|s| s.restore.as_ref()).is_none(),
            "{name}: nothing recorded as restored"
        );
    }
    fleet.shutdown().await;
    Ok(())
}
