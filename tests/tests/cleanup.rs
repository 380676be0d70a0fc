//! A test that panics, or aborts without running any destructor, leaves no
//! etcd process behind. This test plays two roles: run by nextest it is the
//! parent, which re-runs its own binary as a child that starts a real etcd
//! cluster and then dies; afterwards no process may still use that cluster's
//! data directories.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use etcdfleet_tests::etcd_harness::{ClusterOptions, EtcdVersion, LocalEtcdCluster, require_etcd};

const ROLE: &str = "ETCDFLEET_CLEANUP_CHILD";
const OUT: &str = "ETCDFLEET_CLEANUP_OUT";

/// Processes (pid, cmdline) whose command line mentions `needle`.
fn processes_using(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|s| {
            s.split(") ")
                .nth(1)
                .is_some_and(|rest| rest.starts_with('Z'))
        });
        if !zombie && cmdline.contains(needle) {
            found.push((pid, cmdline));
        }
    }
    found
}

async fn child(mode: &str, out: &Path) -> Result<()> {
    let binary = require_etcd(EtcdVersion::V3_5).context("etcd 3.5 is required")?;
    let cluster = LocalEtcdCluster::start(ClusterOptions::new(3, binary)).await?;
    let dirs: Vec<String> = (0..3)
        .map(|i| cluster.member(i).data_dir.display().to_string())
        .collect();
    // The detector must see the running members, or the parent's check proves nothing.
    for d in &dirs {
        ensure!(!processes_using(d).is_empty(), "no process found for {d}");
    }
    std::fs::write(out, dirs.join("\n"))?;
    match mode {
        "abort" => std::process::abort(),
        _ => panic!("the child test dies with its etcd cluster running"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_or_aborting_tests_leave_no_etcd_behind() -> Result<()> {
    if let Ok(mode) = std::env::var(ROLE) {
        let out = std::env::var(OUT)?;
        return child(&mode, Path::new(&out)).await;
    }
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    for mode in ["panic", "abort"] {
        let out = dir.path().join(format!("{mode}.dirs"));
        // A child whose cluster did not come up in time on a loaded machine
        // proves nothing either way: it is run again (at most three times).
        for _attempt in 0..3 {
            let status = Command::new(std::env::current_exe()?)
                .args([
                    "--exact",
                    "panicking_or_aborting_tests_leave_no_etcd_behind",
                    "--nocapture",
                ])
                .env(ROLE, mode)
                .env(OUT, &out)
                .status()?;
            ensure!(!status.success(), "the {mode} child must fail");
            if out.exists() {
                break;
            }
        }
        let dirs = std::fs::read_to_string(&out)
            .with_context(|| format!("the {mode} child started no cluster in three attempts"))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        for data_dir in dirs.lines() {
            loop {
                let left = processes_using(data_dir);
                if left.is_empty() {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "after a {mode}: still running: {left:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // A panic unwinds and removes the cluster's directory; an abort runs
        // no destructor, so the parent removes what its child left (367 MiB
        // of preallocated WAL in /tmp per run otherwise).
        let first = dirs.lines().next().context("the child named no data dir")?;
        let cluster_dir = Path::new(first)
            .parent()
            .context("a data dir has a parent")?;
        if mode == "abort" {
            std::fs::remove_dir_all(cluster_dir)?;
        }
        ensure!(
            !cluster_dir.exists(),
            "after a {mode}: {cluster_dir:?} is left"
        );
    }
    Ok(())
}
