//! `etcdfleet restore-seed` (the seeder of a restoring cluster's first
//! member) against real etcd 3.4 and 3.5: it restores a snapshot from an
//! object store into a member's data directory, etcd starts on it with every
//! key, a restarted seeder leaves its own work alone, and a data directory
//! holding other data (a PVC kept from a deleted cluster) or a corrupt or
//! truncated object is refused without touching anything, with the exit
//! code a restore drill reads as the backup's failure.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::ObjectStoreDestination;
use etcdfleet_api::restore::reason;
use etcdfleet_controllers::etcd::ClusterClient;
use etcdfleet_controllers::restore::seed::{
    OBJECT_CHANGED_EXIT, SeedError, SeedOutcome, SeedRequest, seed,
};
use etcdfleet_controllers::store::Store;
use etcdfleet_tests::etcd_harness::{
    ClusterOptions, EtcdBinary, EtcdVersion, LocalEtcdCluster, SeedTarget, require_etcd,
};

const N: usize = 200;

/// A snapshot of a fresh cluster holding `restore/00000..` = `value-i`,
/// stored in a directory store under `snap/1.db`; returns the destination,
/// key, size and SHA-256.
async fn stored_snapshot(
    binary: &EtcdBinary,
    store_dir: &Path,
) -> Result<(ObjectStoreDestination, String, u64, String)> {
    let source = LocalEtcdCluster::start(ClusterOptions::new(1, binary.clone())).await?;
    let mut kv = ClusterClient::connect(&[source.member(0).client_url()], &source.etcd_config())
        .await?
        .kv();
    for i in 0..N {
        kv.put(format!("restore/{i:05}"), format!("value-{i}"), None)
            .await?;
    }
    let key = "snap/1.db";
    let file = store_dir.join(key);
    std::fs::create_dir_all(file.parent().context("parent")?)?;
    let out = std::process::Command::new(&binary.etcdctl)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", source.member(0).client_url()))
        .args(["snapshot", "save"])
        .arg(&file)
        .output()?;
    ensure!(
        out.status.success(),
        "snapshot save: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let destination = ObjectStoreDestination {
        path: Some(store_dir.display().to_string()),
        ..Default::default()
    };
    let (size, sha) = Store::open(&destination, None)?
        .read_through::<tokio::io::Sink>(key, None)
        .await?;
    Ok((destination, key.to_string(), size, sha))
}

fn request(
    binary: &EtcdBinary,
    destination: &ObjectStoreDestination,
    key: &str,
    size: u64,
    sha: &str,
    t: &SeedTarget,
) -> SeedRequest {
    SeedRequest {
        destination: destination.clone(),
        credentials: None,
        object_key: key.to_string(),
        sha256: sha.to_string(),
        size_bytes: Some(size),
        data_dir: t.data_dir.clone(),
        name: t.name.clone(),
        initial_cluster: t.initial_cluster.clone(),
        initial_advertise_peer_urls: t.peer_url.clone(),
        initial_cluster_token: t.token.clone(),
        initial_cluster_state: Some("new".into()),
        restore_tool: binary
            .etcdutl
            .clone()
            .unwrap_or_else(|| binary.etcdctl.clone()),
    }
}

async fn seeded_member_serves_every_key(version: EtcdVersion) -> Result<()> {
    let Some(binary) = require_etcd(version) else {
        return Ok(());
    };
    let store_dir = tempfile::tempdir()?;
    let (destination, key, size, sha) = stored_snapshot(&binary, store_dir.path()).await?;
    let seen: std::sync::Arc<std::sync::Mutex<Option<SeedRequest>>> = Default::default();
    let keep = seen.clone();
    let restored = LocalEtcdCluster::seeded_single(binary.clone(), |t| {
        let req = request(&binary, &destination, &key, size, &sha, &t);
        async move {
            let outcome = seed(&req).await?;
            ensure!(outcome == SeedOutcome::Restored { size }, "{outcome:?}");
            *keep.lock().expect("lock") = Some(req);
            Ok(())
        }
    })
    .await?;
    let mut kv =
        ClusterClient::connect(&[restored.member(0).client_url()], &restored.etcd_config())
            .await?
            .kv();
    let resp = kv
        .get(
            "restore/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    ensure!(resp.kvs().len() == N, "{} keys restored", resp.kvs().len());
    for (i, kv) in resp.kvs().iter().enumerate() {
        ensure!(kv.key_str()? == format!("restore/{i:05}"));
        ensure!(kv.value_str()? == format!("value-{i}"));
    }

    // A restarted init container finds its own restore and leaves it.
    let req = seen.lock().expect("lock").clone().context("seeded")?;
    ensure!(seed(&req).await? == SeedOutcome::AlreadyRestored);

    // Another snapshot into the same (now used) volume: refused, untouched.
    let other = SeedRequest {
        sha256: "0".repeat(64),
        ..req.clone()
    };
    let before = list(&req.data_dir);
    match seed(&other).await {
        Err(SeedError::ForeignData(dir)) => ensure!(dir == req.data_dir),
        other => bail!("expected ForeignData, got {other:?}"),
    }
    ensure!(
        list(&req.data_dir) == before,
        "the data directory was touched"
    );
    Ok(())
}

fn list(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(dir);
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_etcd_3_5_member_serves_every_key_and_refuses_other_data() -> Result<()> {
    seeded_member_serves_every_key(EtcdVersion::V3_5).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_etcd_3_4_member_serves_every_key_and_refuses_other_data() -> Result<()> {
    seeded_member_serves_every_key(EtcdVersion::V3_4).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_volume_with_another_clusters_data_is_refused() -> Result<()> {
    let Some(binary) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    let store_dir = tempfile::tempdir()?;
    let (destination, key, size, sha) = stored_snapshot(&binary, store_dir.path()).await?;
    // A data directory as a deleted cluster leaves it on a kept PVC: etcd
    // data, no restore marker.
    let old = LocalEtcdCluster::start(ClusterOptions::new(1, binary.clone())).await?;
    let data_dir = old.member(0).data_dir.clone();
    let before = list(&data_dir);
    let t = SeedTarget {
        data_dir: data_dir.clone(),
        name: "m0".into(),
        initial_cluster: "m0=http://127.0.0.1:1".into(),
        peer_url: "http://127.0.0.1:1".into(),
        token: "t".into(),
    };
    match seed(&request(&binary, &destination, &key, size, &sha, &t)).await {
        Err(SeedError::ForeignData(dir)) => ensure!(dir == data_dir),
        other => bail!("expected ForeignData, got {other:?}"),
    }
    ensure!(list(&data_dir) == before, "the kept data was touched");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_is_not_restored_and_its_drill_fails_the_backup() -> Result<()> {
    changed_object_is_refused(reason::CHECKSUM_MISMATCH, |bytes| {
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x01;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_snapshot_is_not_restored_and_its_drill_fails_the_backup() -> Result<()> {
    changed_object_is_refused(reason::SIZE_MISMATCH, |bytes| {
        bytes.truncate(bytes.len() / 2)
    })
    .await
}

/// The stored object changed after its backup succeeded (`change`): the
/// seeder refuses it with `expected`, writes nothing, and exits with
/// `OBJECT_CHANGED_EXIT`, which a restore drill records as the backup's
/// failure (`ObjectChanged`), not as a drill that could not run.
async fn changed_object_is_refused(expected: &str, change: fn(&mut Vec<u8>)) -> Result<()> {
    let Some(binary) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    let store_dir = tempfile::tempdir()?;
    let (destination, key, size, sha) = stored_snapshot(&binary, store_dir.path()).await?;
    let file = store_dir.path().join(&key);
    let mut bytes = std::fs::read(&file)?;
    change(&mut bytes);
    std::fs::write(&file, &bytes)?;
    let target = tempfile::tempdir()?;
    let t = SeedTarget {
        data_dir: target.path().join("data"),
        name: "m0".into(),
        initial_cluster: "m0=http://127.0.0.1:1".into(),
        peer_url: "http://127.0.0.1:1".into(),
        token: "t".into(),
    };
    let refused = seed(&request(&binary, &destination, &key, size, &sha, &t)).await;
    match &refused {
        Err(SeedError::Snapshot { reason: r, message }) => {
            ensure!(*r == expected, "{r}: {message}");
            ensure!(message.contains(&key), "{message}");
        }
        other => bail!("expected {expected}, got {other:?}"),
    }
    let code = refused.err().context("refused")?.exit_code();
    ensure!(code == OBJECT_CHANGED_EXIT, "exit code {code}");
    ensure!(list(target.path()).is_empty(), "{:?}", list(target.path()));
    Ok(())
}
