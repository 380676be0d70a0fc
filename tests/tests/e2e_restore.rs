//! Restore (`spec.bootstrap.restore`) against real etcd and a real
//! S3-compatible server (moto): a snapshot that is missing, corrupt or
//! truncated is refused before the controller writes anything to the
//! workload cluster, with a `RestoreFailed` condition naming the object.

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::backup::phase;
use etcdfleet_api::restore::{BootstrapSpec, RESTORE_FAILED, RestoreSource, reason};
use etcdfleet_api::{EtcdBackup, EtcdBackupSpec, EtcdCluster, ObjectStoreDestination};
use etcdfleet_controllers::backup::store::{Credentials, Store};
use etcdfleet_controllers::backup::{
    Context as BackupContext, Outcome as BackupOutcome, reconcile_backup,
};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_controllers::restore::SEEDING_UNAVAILABLE;
use etcdfleet_tests::driver::TestController;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::s3::{
    ACCESS_KEY_ID, CREDENTIALS, S3Server, SECRET_ACCESS_KEY, put_credentials,
};
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, create, get, put, running};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, PostParams};
use std::time::Duration;

fn open(destination: &ObjectStoreDestination) -> Result<Store> {
    let creds = Credentials {
        access_key_id: ACCESS_KEY_ID.into(),
        secret_access_key: SECRET_ACCESS_KEY.into(),
        session_token: None,
    };
    Ok(Store::open(destination, Some(&creds))?)
}

/// Takes one backup of `cluster` through the backup reconciler; returns it.
async fn back_up(
    fleet: &Fleet,
    ctl: &TestController,
    name: &str,
    cluster: &str,
    destination: ObjectStoreDestination,
) -> Result<EtcdBackup> {
    let mut b = EtcdBackup::new(
        name,
        EtcdBackupSpec {
            cluster_name: cluster.into(),
            destination: Some(destination),
        },
    );
    b.metadata.namespace = Some(NS.into());
    let api = Api::<EtcdBackup>::namespaced(fleet.management_direct(), NS);
    api.create(&PostParams::default(), &b).await?;
    let bctx = BackupContext::new(ctl.ctx.clone());
    for _ in 0..60 {
        let b = api.get(name).await?;
        if matches!(
            reconcile_backup(&b, &bctx).await?,
            BackupOutcome::Done
                | BackupOutcome::Succeeded { .. }
                | BackupOutcome::AttemptFailed { .. }
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let b = api.get(name).await?;
    let p = b.status.as_ref().and_then(|s| s.phase.clone());
    ensure!(
        p.as_deref() == Some(phase::SUCCEEDED),
        "backup {name}: {:?}",
        b.status
    );
    Ok(b)
}

fn restoring(name: &str, workload: &str, source: RestoreSource) -> EtcdCluster {
    let mut c = cluster(name, workload, 1, "3.5.1");
    c.spec.bootstrap = Some(BootstrapSpec {
        restore: Some(source),
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
    let good = back_up(&fleet, &ctl, "good", "etcd-a", destination.clone()).await?;
    // A write between the two backups gives the second its own object key
    // (keys are `<cluster>/<time>-<revision>.db`; same second, same revision
    // would share one).
    put(&fleet, "a", "etcd-a", 1, "between").await?;
    let corrupt = back_up(&fleet, &ctl, "corrupt", "etcd-a", destination.clone()).await?;
    let gs = good.status.clone().context("status")?;
    let good_key = gs.object_key.clone().context("key")?;
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
        // The intact backup verifies, and is still refused while members
        // cannot seed themselves: never an empty etcd under its name.
        (
            restoring(
                "from-good",
                "b",
                RestoreSource {
                    backup_name: Some("good".into()),
                    ..Default::default()
                },
            ),
            good_key.clone(),
            SEEDING_UNAVAILABLE,
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
