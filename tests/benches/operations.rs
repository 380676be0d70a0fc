//! How close the controller's operations come to etcd's own floor: a
//! rolling upgrade 3.4 → 3.5 of 3 members and a scale-out 3 → 5, each done
//! once by the controller in the test world (its own requeue policy decides
//! when it looks again; the runtime syncs every 100 ms like a kubelet) and
//! once by this bench directly with the etcd binaries (same restarts, same
//! order: followers first, leader last after a leadership move; learners
//! added, started and promoted one by one; mutual TLS on client and peer
//! ports and the same heartbeat and election timeouts as the pods, since
//! etcd's shutdown and joins differ with TLS).
//!
//! `cargo bench -p etcdfleet-tests --bench operations`. Prints
//! `upgrade controller_s=<s> floor_s=<s> ratio=<r>` and the same for
//! `scale_out`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::etcdcluster::{Outcome, ReconcilerSettings, in_flight_requeue};
use etcdfleet_tests::driver::TestController;
use etcdfleet_tests::etcd_harness::{ClusterOptions, EtcdVersion, LocalEtcdCluster, require_etcd};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::scenario::{NS, cluster, converge_all, create, get, patch_spec};

/// Reconciles `name` the way the controller's loop would (its in-flight
/// requeue delays, 5 s after an error as `error_policy`) until converged
/// with `done` true; returns the time taken.
async fn drive(
    fleet: &Fleet,
    ctl: &TestController,
    name: &str,
    done: impl Fn(&EtcdCluster) -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(300) {
        let outcome = ctl.reconcile(NS, name).await;
        let current = get(fleet, name).await?;
        if std::env::var_os("ETCDFLEET_BENCH_TRACE").is_some() {
            eprintln!("{:>7.3}s {outcome:?}", started.elapsed().as_secs_f64());
        }
        let delay = match &outcome {
            Ok(Outcome::Converged) if done(&current) => return Ok(started.elapsed()),
            Ok(o) => in_flight_requeue(o, &ctl.ctx, &current)
                .unwrap_or(ctl.ctx.settings.requeue_progress),
            Err(e) => {
                eprintln!("reconcile failed: {e}");
                Duration::from_secs(5)
            }
        };
        tokio::time::sleep(delay).await;
    }
    bail!("{name} did not converge within 300 s")
}

fn production_like() -> ReconcilerSettings {
    ReconcilerSettings {
        // The test world's etcd answers in milliseconds; keep the
        // production requeue policy and the production deadlines.
        ..ReconcilerSettings::default()
    }
}

async fn controller_upgrade() -> Result<Duration> {
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        production_like(),
    );
    create(&fleet, &cluster("up", "a", 3, "3.4.23")).await?;
    converge_all(&fleet, &mut ctl, &["up"]).await?;
    let _sync = fleet.spawn_background_sync(Duration::from_millis(100));
    patch_spec(&fleet, "up", serde_json::json!({ "version": "3.5.1" })).await?;
    let took = drive(&fleet, &ctl, "up", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.current_version.as_deref() == Some("3.5.1") && s.ready_members == 3)
    })
    .await;
    fleet.shutdown().await;
    took
}

async fn controller_scale_out() -> Result<Duration> {
    let fleet = Fleet::new(&["b"]).await?;
    let mut ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        production_like(),
    );
    create(&fleet, &cluster("wide", "b", 3, "3.5.1")).await?;
    converge_all(&fleet, &mut ctl, &["wide"]).await?;
    let _sync = fleet.spawn_background_sync(Duration::from_millis(100));
    patch_spec(&fleet, "wide", serde_json::json!({ "replicas": 5 })).await?;
    let took = drive(&fleet, &ctl, "wide", |c| {
        c.status.as_ref().is_some_and(|s| s.ready_members == 5)
    })
    .await;
    fleet.shutdown().await;
    took
}

/// Followers restarted onto 3.5 one at a time (each healthy before the
/// next), leadership moved to an upgraded member, the old leader last.
async fn floor_upgrade() -> Result<Duration> {
    let old = require_etcd(EtcdVersion::V3_4).context("etcd 3.4")?;
    let new = require_etcd(EtcdVersion::V3_5).context("etcd 3.5")?;
    let mut etcd = LocalEtcdCluster::start(ClusterOptions::new(3, old).with_tls(true)).await?;
    let started = Instant::now();
    let (_, leader) = etcd.cluster_client().await?.leader().await?;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(etcd.member_id(i).await?);
    }
    let leader_slot = ids
        .iter()
        .position(|id| *id == leader.member_id)
        .context("leader is not a member")?;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader_slot).collect();
    for &i in &followers {
        etcd.restart(i, Some(new.clone())).await?;
    }
    etcd.cluster_client()
        .await?
        .move_leader(ids[followers[0]])
        .await?;
    etcd.restart(leader_slot, Some(new.clone())).await?;
    Ok(started.elapsed())
}

/// Two learners added, started and promoted one after the other.
async fn floor_scale_out() -> Result<Duration> {
    let binary = require_etcd(EtcdVersion::V3_5).context("etcd 3.5")?;
    let mut etcd =
        LocalEtcdCluster::start(ClusterOptions::new(3, binary.clone()).with_tls(true)).await?;
    let started = Instant::now();
    for _ in 0..2 {
        etcd.scale_out_with_module(binary.clone()).await?;
    }
    Ok(started.elapsed())
}

fn line(what: &str, controller: Duration, floor: Duration) -> String {
    format!(
        "{what} controller_s={:.2} floor_s={:.2} ratio={:.2}",
        controller.as_secs_f64(),
        floor.as_secs_f64(),
        controller.as_secs_f64() / floor.as_secs_f64()
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return Ok(());
    }
    if !args.iter().any(|a| a == "--bench") {
        eprintln!(
            "operations: benchmark only; run `cargo bench -p etcdfleet-tests --bench operations`"
        );
        return Ok(());
    }
    if require_etcd(EtcdVersion::V3_4).is_none() || require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    // `ETCDFLEET_BENCH_ONLY=upgrade|scale_out` runs one of the two.
    let only = std::env::var("ETCDFLEET_BENCH_ONLY").ok();
    let wanted = |what: &str| only.as_deref().is_none_or(|o| o == what);
    let mut lines = Vec::new();
    if wanted("upgrade") {
        let upgrade = (controller_upgrade().await?, floor_upgrade().await?);
        lines.push(line("upgrade", upgrade.0, upgrade.1));
    }
    if wanted("scale_out") {
        let scale_out = (controller_scale_out().await?, floor_scale_out().await?);
        lines.push(line("scale_out", scale_out.0, scale_out.1));
    }
    for l in lines {
        println!("{l}");
    }
    Ok(())
}
