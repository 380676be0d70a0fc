//! One scale-out step on a 3-member etcd 3.5 cluster (add learner → start
//! with `--initial-cluster-state=existing` → promote once caught up), done
//! through `controllers::etcd` and done with `etcdctl` commands, alternated in
//! one run. After each step the new member is removed and stopped, so every
//! step starts from the same 3 voters. Prints per-step times, medians and the
//! ratio module / etcdctl.
//!
//! `cargo bench -p etcdfleet-tests --bench scale_out` (`STEPS=n` to change
//! the number of steps per side, default 5).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use etcdfleet_tests::etcd_harness::{ClusterOptions, EtcdVersion, LocalEtcdCluster, require_etcd};

/// Removes the member in `slot` through the module and stops its process.
async fn reset(cluster: &mut LocalEtcdCluster, slot: usize) -> Result<()> {
    let id = cluster.member_id(slot).await?;
    cluster.cluster_client().await?.remove_member(id).await?;
    cluster.mark_removed(slot).await;
    // Let the survivors settle before the next measured step.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

async fn step_with_module(cluster: &mut LocalEtcdCluster) -> Result<(Duration, usize)> {
    let binary = cluster.member(0).binary.clone();
    let started = Instant::now();
    let (slot, _) = cluster.scale_out_with_module(binary).await?;
    Ok((started.elapsed(), slot))
}

async fn step_with_etcdctl(cluster: &mut LocalEtcdCluster) -> Result<(Duration, usize)> {
    let binary = cluster.member(0).binary.clone();
    let endpoints = cluster.client_urls();
    let started = Instant::now();
    let slot = cluster.allocate_member(binary.clone())?;
    let m = cluster.member(slot);
    let out = cluster
        .etcdctl(&binary, &endpoints)
        .args(["member", "add", &m.name, "--learner"])
        .arg(format!("--peer-urls={}", m.peer_url()))
        .arg("-w=json")
        .output()?;
    ensure!(
        out.status.success(),
        "member add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let added: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let id = added["member"]["ID"]
        .as_u64()
        .context("member id in etcdctl output")?;
    cluster.start_joining(slot)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster
            .etcdctl(&binary, &endpoints)
            .args(["member", "promote", &format!("{id:x}")])
            .output()?;
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if Instant::now() > deadline || !err.contains("in sync with leader") {
            bail!("member promote: {err}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Same finish line as the module step: the new member serves a
    // linearizable read.
    loop {
        let out = cluster
            .etcdctl(&binary, &[cluster.member(slot).client_url()])
            .args(["endpoint", "health"])
            .output()?;
        if out.status.success() {
            break;
        }
        ensure!(Instant::now() < deadline, "new member never became healthy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((started.elapsed(), slot))
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    // `cargo bench` passes `--bench`. Test runners also start bench targets
    // (`cargo test --all-targets`, and nextest with `--list`): this target
    // holds no tests, so it lists none and runs nothing for them.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return Ok(());
    }
    if !args.iter().any(|a| a == "--bench") {
        eprintln!(
            "scale_out: benchmark only; run `cargo bench -p etcdfleet-tests --bench scale_out`"
        );
        return Ok(());
    }
    let Some(v35) = require_etcd(EtcdVersion::V3_5) else {
        return Ok(());
    };
    let steps: usize = std::env::var("STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mut cluster = LocalEtcdCluster::start(ClusterOptions::new(3, v35)).await?;
    // Past etcd's strict-reconfiguration window after bootstrap.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let mut module = Vec::new();
    let mut etcdctl = Vec::new();
    for n in 0..steps {
        let (took, slot) = step_with_module(&mut cluster).await?;
        reset(&mut cluster, slot).await?;
        module.push(took);
        let (took_ctl, slot) = step_with_etcdctl(&mut cluster).await?;
        reset(&mut cluster, slot).await?;
        etcdctl.push(took_ctl);
        println!("step {n}: module {took:>8.3?}   etcdctl {took_ctl:>8.3?}");
    }
    let (m, c) = (median(&mut module), median(&mut etcdctl));
    println!(
        "scale-out step on 3-member etcd 3.5.1, median of {steps}: module {m:.3?}, etcdctl {c:.3?}, ratio module/etcdctl {:.2}",
        m.as_secs_f64() / c.as_secs_f64()
    );
    Ok(())
}
