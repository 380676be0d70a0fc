//! Memory of the backup path: a ≥ 512 MiB snapshot streams through the
//! controller's upload (`backup::act::stream_to`: etcd Snapshot →
//! SHA-256 → multipart upload, then read-back verification) in a process of
//! its own, whose peak RSS (`VmHWM` in /proc/<pid>/status) must stay under
//! [`BOUND_MIB`]. Ignored by default (it writes ~600 MiB into etcd); run by
//! `make bench-backup`.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::ObjectStoreDestination;
use etcdfleet_controllers::backup::act::stream_to;
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, MemberClient};
use etcdfleet_controllers::store::Store;
use etcdfleet_tests::etcd_harness::{ClusterOptions, EtcdVersion, LocalEtcdCluster, require_etcd};

/// The peak RSS the streaming process may reach, whatever the snapshot size:
/// the upload buffers (8 MiB parts, two in flight, one filling) plus the
/// gRPC stream's buffers and the runtime.
const BOUND_MIB: u64 = 96;
/// Database size to reach before the snapshot.
const TARGET_MIB: u64 = 560;

const CHILD_ENDPOINT: &str = "ETCDFLEET_BACKUP_MEMORY_ENDPOINT";
const CHILD_DIR: &str = "ETCDFLEET_BACKUP_MEMORY_DIR";

fn kib_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The child: streams one snapshot through the controller's backup path and
/// prints its peak RSS. Runs only when the parent sets the variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of streaming_a_large_snapshot_stays_within_the_memory_bound"]
async fn backup_memory_child() -> Result<()> {
    let (Ok(endpoint), Ok(dir)) = (std::env::var(CHILD_ENDPOINT), std::env::var(CHILD_DIR)) else {
        eprintln!("SKIPPED: backup_memory_child runs only under its parent test");
        return Ok(());
    };
    let mut config = EtcdConfig::default();
    config.deadlines.snapshot = Duration::from_secs(600);
    let member = MemberClient::connect(&endpoint, &config).await?;
    let store = Store::open(
        &ObjectStoreDestination {
            path: Some(dir),
            ..Default::default()
        },
        None,
    )?;
    let started = Instant::now();
    let (size, sha) = stream_to(&store, "memory/snapshot.db", &member).await?;
    let streamed = started.elapsed();
    store.verify("memory/snapshot.db", size, &sha).await?;
    let status = std::fs::read_to_string("/proc/self/status")?;
    println!(
        "BACKUP-MEMORY size={size} hwm_kib={} streamed_ms={}",
        kib_field(&status, "VmHWM:").unwrap_or_default(),
        streamed.as_millis()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes ~600 MiB into etcd; run with `make bench-backup`"]
async fn streaming_a_large_snapshot_stays_within_the_memory_bound() -> Result<()> {
    let Some(binary) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    let mut options = ClusterOptions::new(1, binary);
    options
        .extra_args
        .push(format!("--quota-backend-bytes={}", 4u64 << 30));
    let etcd = LocalEtcdCluster::start(options).await?;
    let endpoint = etcd.member(0).client_url();
    let mut kv = ClusterClient::connect(std::slice::from_ref(&endpoint), &etcd.etcd_config())
        .await?
        .kv();
    // 1 MiB values of distinct bytes, so the database really grows.
    for i in 0..TARGET_MIB {
        let value: Vec<u8> = (0..(1 << 20)).map(|j| ((i * 31 + j) % 251) as u8).collect();
        kv.put(format!("big/{i:05}"), value, None).await?;
    }
    let out_dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["--exact", "backup_memory_child", "--ignored", "--nocapture"])
        .env(CHILD_ENDPOINT, &endpoint)
        .env(CHILD_DIR, out_dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // Sample the child's RSS while it streams, as an outside observer would.
    let mut sampled_peak_kib = 0;
    let status_path = format!("/proc/{}/status", child.id());
    while child.try_wait()?.is_none() {
        if let Ok(s) = std::fs::read_to_string(&status_path) {
            sampled_peak_kib = sampled_peak_kib.max(kib_field(&s, "VmHWM:").unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "child failed: {stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("BACKUP-MEMORY"))
        .context("child printed no measurement")?;
    let field = |name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))?
            .parse()
            .ok()
    };
    let size = field("size").context("size")?;
    let hwm_kib = field("hwm_kib").context("hwm")?.max(sampled_peak_kib);
    eprintln!(
        "backup memory: streamed {} MiB in {} ms, peak RSS {} MiB (bound {BOUND_MIB} MiB)",
        size >> 20,
        field("streamed_ms").unwrap_or_default(),
        hwm_kib >> 10
    );
    ensure!(size >= 512 << 20, "snapshot only {size} bytes");
    ensure!(
        hwm_kib >> 10 <= BOUND_MIB,
        "peak RSS {} MiB exceeds {BOUND_MIB} MiB while streaming {} MiB",
        hwm_kib >> 10,
        size >> 20
    );
    Ok(())
}
