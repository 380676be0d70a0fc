//! How close the controller's operations come to etcd's own floor: every
//! version path the policy allows (3.4 → 3.5, an old 3.5 patch → the
//! newest, 3.5 → 3.6, 3.6 → 3.7, and the online downgrades 3.6 → 3.5 and
//! 3.7 → 3.6) on 3 members, and a scale-out 3 → 5. Each is done once by the
//! controller in the test world (its own requeue policy decides when it
//! looks again; the runtime syncs every 100 ms like a kubelet) and once by
//! this bench by hand with etcd's own calls on the same binaries (same
//! restarts, same order: followers first, leader last after a leadership
//! move; for a downgrade `validate`, `enable` and the wait for every
//! member's storage version first; learners added, started and promoted one
//! by one; mutual TLS on client and peer ports, the heartbeat and election
//! timeouts of the pods and the flags the controller renders for each
//! release). A writer runs through every version path, both ways; each
//! acknowledged write is read back afterwards.
//!
//! `cargo bench -p etcdfleet-tests --bench operations`. Each path runs
//! `ETCDFLEET_BENCH_RUNS` times (default 3), the controller then the floor
//! in each run. Prints, per path, `<path> controller_s=<median>
//! floor_s=<median> ratio=<r> runs=<n> controller_range=<min>-<max>
//! floor_range=<min>-<max> acknowledged=<n> lost=0` (a lost write fails the
//! bench, naming it). `ETCDFLEET_BENCH_ONLY=<path>` runs one path
//! (`scale_out` for the scale-out).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::version::DOWNGRADE_ANNOTATION;
use etcdfleet_controllers::etcdcluster::{Outcome, ReconcilerSettings, in_flight_requeue};
use etcdfleet_tests::driver::TestController;
use etcdfleet_tests::etcd_harness::{
    AckedWriter, ClusterOptions, EtcdBinary, EtcdVersion, LocalEtcdCluster, require_etcd,
    verify_acknowledged,
};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::scenario::{NS, cluster, converge_all, create, etcd_of, get, patch_spec};
use etcdfleet_tests::versions::{annotate, downgrade_by_hand, roll_by_hand};

/// One version path.
struct VersionPath {
    name: &'static str,
    from: EtcdVersion,
    to: EtcdVersion,
    downgrade: bool,
}

const PATHS: &[VersionPath] = &[
    VersionPath {
        name: "upgrade_3_4_to_3_5",
        from: EtcdVersion::V3_4,
        to: EtcdVersion::V3_5Latest,
        downgrade: false,
    },
    VersionPath {
        name: "upgrade_3_5_patch",
        from: EtcdVersion::V3_5Old,
        to: EtcdVersion::V3_5Latest,
        downgrade: false,
    },
    VersionPath {
        name: "upgrade_3_5_to_3_6",
        from: EtcdVersion::V3_5Latest,
        to: EtcdVersion::V3_6,
        downgrade: false,
    },
    VersionPath {
        name: "upgrade_3_6_to_3_7",
        from: EtcdVersion::V3_6,
        to: EtcdVersion::V3_7,
        downgrade: false,
    },
    VersionPath {
        name: "downgrade_3_6_to_3_5",
        from: EtcdVersion::V3_6,
        to: EtcdVersion::V3_5Latest,
        downgrade: true,
    },
    VersionPath {
        name: "downgrade_3_7_to_3_6",
        from: EtcdVersion::V3_7,
        to: EtcdVersion::V3_6,
        downgrade: true,
    },
];

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

/// What one side of a path measured.
struct Measured {
    took: Duration,
    acknowledged: usize,
}

async fn controller_path(
    path: &VersionPath,
    from: &EtcdBinary,
    to: &EtcdBinary,
) -> Result<Measured> {
    let fleet = Fleet::new(&["a"]).await?;
    let mut ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        production_like(),
    );
    create(&fleet, &cluster("up", "a", 3, &from.release)).await?;
    converge_all(&fleet, &mut ctl, &["up"]).await?;
    let _sync = fleet.spawn_background_sync(Duration::from_millis(100));
    let (endpoints, config) = etcd_of(&fleet, "a", "up", 3).await?;
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "/bench").await?;
    if path.downgrade {
        annotate(&fleet, "up", DOWNGRADE_ANNOTATION, Some(&to.release)).await?;
    }
    patch_spec(&fleet, "up", serde_json::json!({ "version": to.release })).await?;
    let want = to.release.clone();
    let took = drive(&fleet, &ctl, "up", |c| {
        c.status.as_ref().is_some_and(|s| {
            s.current_version.as_deref() == Some(want.as_str()) && s.ready_members == 3
        })
    })
    .await;
    let report = writer.stop().await?;
    let acknowledged = verify_acknowledged(&report, &endpoints, &config, "/bench").await?;
    fleet.shutdown().await;
    Ok(Measured {
        took: took?,
        acknowledged,
    })
}

/// The same path by hand on a local TLS cluster of the same binaries.
async fn floor_path(path: &VersionPath, from: &EtcdBinary, to: &EtcdBinary) -> Result<Measured> {
    let options = ClusterOptions::new(3, from.clone())
        .with_tls(true)
        .with_version_flags();
    let mut etcd = LocalEtcdCluster::start(options).await?;
    let endpoints = etcd.client_urls();
    let config = etcd.etcd_config();
    let writer = AckedWriter::start(endpoints.clone(), config.clone(), "/bench").await?;
    let started = Instant::now();
    if path.downgrade {
        downgrade_by_hand(&mut etcd, to).await?;
    } else {
        roll_by_hand(&mut etcd, to).await?;
    }
    let took = started.elapsed();
    let report = writer.stop().await?;
    let acknowledged = verify_acknowledged(&report, &endpoints, &config, "/bench").await?;
    Ok(Measured { took, acknowledged })
}

async fn controller_scale_out() -> Result<Duration> {
    let fleet = Fleet::new(&["b"]).await?;
    let mut ctl = TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        production_like(),
    );
    let binary = require_etcd(EtcdVersion::V3_5Latest).context("etcd 3.5")?;
    create(&fleet, &cluster("wide", "b", 3, &binary.release)).await?;
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

/// Two learners added, started and promoted one after the other.
async fn floor_scale_out() -> Result<Duration> {
    let binary = require_etcd(EtcdVersion::V3_5Latest).context("etcd 3.5")?;
    let options = ClusterOptions::new(3, binary.clone())
        .with_tls(true)
        .with_version_flags();
    let mut etcd = LocalEtcdCluster::start(options).await?;
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
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let only = std::env::var("ETCDFLEET_BENCH_ONLY").ok();
    let wanted = |what: &str| only.as_deref().is_none_or(|o| o == what);
    let runs = runs()?;
    for path in PATHS.iter().filter(|p| wanted(p.name)) {
        let (Some(from), Some(to)) = (require_etcd(path.from), require_etcd(path.to)) else {
            continue;
        };
        let mut sides = Sides::default();
        for _ in 0..runs {
            // Side by side in each run: the controller, then the floor.
            let controller = controller_path(path, &from, &to).await?;
            let floor = floor_path(path, &from, &to).await?;
            sides.push(controller.took, floor.took);
            sides.acknowledged += controller.acknowledged + floor.acknowledged;
        }
        println!(
            "{} ({} -> {}) acknowledged={} lost=0",
            sides.line(path.name),
            from.release,
            to.release,
            sides.acknowledged,
        );
    }
    if wanted("scale_out") {
        let mut sides = Sides::default();
        for _ in 0..runs {
            sides.push(controller_scale_out().await?, floor_scale_out().await?);
        }
        println!("{}", sides.line("scale_out"));
    }
    Ok(())
}

/// `ETCDFLEET_BENCH_RUNS`: how many times each path is measured, both
/// sides each time (default 3). etcd's own restarts and elections vary by
/// seconds from one run to the next, so a single run's ratio says little.
fn runs() -> Result<usize> {
    match std::env::var("ETCDFLEET_BENCH_RUNS") {
        Err(_) => Ok(3),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("ETCDFLEET_BENCH_RUNS={v:?}: expected a positive count"),
        },
    }
}

/// The runs of one path: the controller's and the floor's times.
#[derive(Default)]
struct Sides {
    controller: Vec<Duration>,
    floor: Vec<Duration>,
    acknowledged: usize,
}

impl Sides {
    fn push(&mut self, controller: Duration, floor: Duration) {
        self.controller.push(controller);
        self.floor.push(floor);
    }

    /// `<what> controller_s=<median> floor_s=<median> ratio=<of the medians>
    /// runs=<n> controller_range=<min>-<max> floor_range=<min>-<max>`.
    fn line(&self, what: &str) -> String {
        let range = |v: &[Duration]| {
            let secs = v.iter().map(Duration::as_secs_f64);
            let min = secs.clone().fold(f64::INFINITY, f64::min);
            let max = secs.fold(0.0, f64::max);
            format!("{min:.2}-{max:.2}")
        };
        format!(
            "{} runs={} controller_range={} floor_range={}",
            line(what, median(&self.controller), median(&self.floor)),
            self.controller.len(),
            range(&self.controller),
            range(&self.floor)
        )
    }
}

fn median(v: &[Duration]) -> Duration {
    let mut sorted = v.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}
