//! The etcd version a restore reads from a snapshot while it verifies it
//! (`restore::snapshot`), on snapshots taken from real etcd 3.4 and 3.5:
//! small ones, and ones whose database has many pages, values larger than a
//! page (overflow pages) and pages freed by earlier transactions (stale
//! copies of the root bucket). Fed in chunks of odd sizes, as a stream
//! arrives. Bytes that are not etcd's database are unreadable, never a
//! version.

use std::time::Duration;

use anyhow::{Result, ensure};
use etcdfleet_api::restore::SnapshotVersion;
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::restore::snapshot::SnapshotScanner;
use etcdfleet_tests::etcd_harness::{
    ClusterOptions, EtcdBinary, EtcdVersion, LocalEtcdCluster, require_etcd,
};

/// A snapshot (what `etcdctl snapshot save` writes) of a one-member cluster
/// holding one key, or (`big`) a database of many pages.
async fn snapshot_of(binary: &EtcdBinary, big: bool) -> Result<Vec<u8>> {
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(1, binary.clone())).await?;
    let url = cluster.member(0).client_url();
    let mut kv = ClusterClient::connect(std::slice::from_ref(&url), &cluster.etcd_config())
        .await?
        .kv();
    if big {
        // Thousands of keys (many leaf and branch pages), values larger
        // than a page (overflow), and rewrites that free pages.
        for round in 0..3 {
            for i in 0..1500 {
                kv.put(format!("k/{i:05}"), format!("{round}-{i}"), None)
                    .await?;
            }
        }
        for i in 0..8 {
            kv.put(format!("large/{i}"), vec![b'x'; 200_000], None)
                .await?;
        }
        kv.delete("large/3", None).await?;
    } else {
        kv.put("a", "b", None).await?;
    }
    // etcd records the cluster version once its members agreed on one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let file = cluster.dir().join("snapshot.db");
    let out = std::process::Command::new(&binary.etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={url}"))
        .args(["snapshot", "save"])
        .arg(&file)
        .output()?;
    ensure!(
        out.status.success(),
        "snapshot save: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(std::fs::read(&file)?)
}

fn scan(bytes: &[u8], chunk: usize) -> SnapshotVersion {
    let mut scanner = SnapshotScanner::default();
    for part in bytes.chunks(chunk) {
        scanner.feed(part);
    }
    scanner.finish()
}

async fn reads_the_cluster_version(version: EtcdVersion, want: &str) -> Result<()> {
    let Some(binary) = require_etcd(version) else {
        return Ok(());
    };
    for big in [false, true] {
        let snapshot = snapshot_of(&binary, big).await?;
        for chunk in [7, 4096, 65_536, 1 << 20] {
            assert_eq!(
                scan(&snapshot, chunk),
                SnapshotVersion::Recorded(want.into()),
                "{} bytes (big: {big}) in chunks of {chunk}",
                snapshot.len()
            );
        }
        // Cut short before its root page: unreadable, not a version.
        let cut = scan(&snapshot[..4096 * 2 + 100], 4096);
        assert!(matches!(cut, SnapshotVersion::Unreadable(_)), "{cut:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_4_snapshot_says_3_4() -> Result<()> {
    reads_the_cluster_version(EtcdVersion::V3_4, "3.4.0").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_5_snapshot_says_3_5() -> Result<()> {
    reads_the_cluster_version(EtcdVersion::V3_5, "3.5.0").await
}

#[test]
fn bytes_that_are_not_an_etcd_database_are_unreadable() {
    for bytes in [
        Vec::new(),
        b"SQLite format 3\0".repeat(1000),
        (0..100_000u32).map(|i| (i * 7919 % 251) as u8).collect(),
    ] {
        let seen = scan(&bytes, 1000);
        assert!(
            matches!(seen, SnapshotVersion::Unreadable(_)),
            "{} bytes: {seen:?}",
            bytes.len()
        );
    }
}
