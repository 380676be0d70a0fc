//! Backup and restore on real Kubernetes, driven as a user does: `etcdfleet
//! run` as a process under the shipped RBAC, an `EtcdBackup` applied with
//! kubectl streams a snapshot to S3 (moto on loopback), and a new
//! `EtcdCluster` restored from it (`spec.bootstrap.restore`) serves every key;
//! its first member is seeded by the seeder init containers the real
//! StatefulSet controller created.

use anyhow::{Context as _, Result};
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, installed_world, put, read_everywhere, wait_ready_members,
};
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::runtime::SEEDER_IMAGE;
use etcdfleet_tests::s3::{CREDENTIALS, S3Server, put_credentials_in};

fn destination_yaml(s3: &S3Server, indent: &str) -> String {
    [
        "bucket: backups".to_string(),
        "prefix: backups".into(),
        format!("endpoint: {}", s3.endpoint()),
        "region: us-east-1".into(),
        "forcePathStyle: true".into(),
        "allowHttp: true".into(),
        format!("credentialsSecretName: {CREDENTIALS}"),
    ]
    .iter()
    .map(|l| format!("{indent}{l}\n"))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_backup_to_s3_and_restore_into_a_new_cluster_keeps_every_key() -> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let Some(s3) = S3Server::start() else {
        return Ok(());
    };
    s3.create_bucket("backups")?;
    let Some(world) = installed_world(&["w1"]).await? else {
        return Ok(());
    };
    put_credentials_in(world.management.admin_client().await?, NS).await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, world.installed_controller_config()?)?;
    let kubeconfig = world
        .management
        .kubeconfig_with_token(&world.controller_token().await?);
    let config_arg = config.display().to_string();
    let p = ControllerProcess::start(
        "real-backup",
        &kubeconfig,
        &[
            "--config",
            &config_arg,
            "--log-format",
            "text",
            "--requeue-converged-seconds",
            "2",
            "--seeder-image",
            SEEDER_IMAGE,
        ],
    );
    world.apply(&cluster_yaml("shop", "w1", 3, "3.5.1"))?;
    wait_ready_members(&world, "shop", 3).with_context(|| p.log())?;
    for i in 0..20 {
        put(&world, "w1", "shop", 3, &format!("key-{i}")).await?;
    }

    world.apply(&format!(
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdBackup
metadata:
  name: shop-now
  namespace: {NS}
spec:
  clusterName: shop
  destination:
{}",
        destination_yaml(&s3, "    ")
    ))?;
    world
        .kubectl(&[
            "wait",
            "-n",
            NS,
            "--timeout=120s",
            "--for=jsonpath={.status.phase}=Succeeded",
            "etcdbackup/shop-now",
        ])
        .with_context(|| p.log())?;

    let mut restored = cluster_yaml("restored", "w1", 3, "3.5.1");
    restored.push_str("  bootstrap:\n    restore:\n      backupName: shop-now\n");
    world.apply(&restored)?;
    wait_ready_members(&world, "restored", 3)
        .with_context(|| format!("{}\n{}", p.log(), world.workload("w1").plane.log_tails(5)))?;
    for i in [0, 7, 19] {
        read_everywhere(&world, "w1", "restored", 3, &format!("key-{i}")).await?;
    }
    // The seeded member ran the seeder from the seeder image, inside etcd's.
    let logs =
        world
            .workload("w1")
            .runtime()
            .pod_log_tail("etcd-system", "restored-etcd-0", usize::MAX);
    assert!(logs.contains("restore-seed"), "no seeder run in:\n{logs}");
    Ok(())
}
