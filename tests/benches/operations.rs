//! How close the controller's operations come to etcd's own floor: every
//! version path the policy allows (3.4 → 3.5, an old 3.5 patch → the
//! newest, 3.5 → 3.6, 3.6 → 3.7, and the online downgrades 3.6 → 3.5 and
//! 3.7 → 3.6) on 3 members, and a scale-out 3 → 5.
//!
//! Each version path is done twice in worlds alike: a cluster the
//! controller created in the test world (its pods run by the runtime, which
//! syncs every 100 ms like a kubelet, mutual TLS on client and peer ports),
//! left to settle for [`SETTLE`] under a writer, then changed once by the
//! controller (its own requeue policy decides when
//! it looks again) and once by hand on a fresh world of the same kind
//! (`etcdfleet_tests::by_hand`: the StatefulSet edited, pods deleted in
//! etcd's order, followers first and the leader last after a leadership
//! move, etcd polled every 50 ms; for a downgrade `validate`, `enable` and
//! the wait for every member's storage version first). A writer runs
//! through every version path, both ways; each acknowledged write is read
//! back afterwards. The scale-out's floor is learners added, started and
//! promoted one by one on a local TLS cluster of the same binary and flags.
//!
//! `cargo bench -p etcdfleet-tests --bench operations`. Each path runs
//! `ETCDFLEET_BENCH_RUNS` times (default 10), the controller then the floor
//! in each run. Prints, per path, `<path> controller_s=<median>
//! floor_s=<median> ratio=<r> runs=<n> controller_range=<min>-<max>
//! floor_range=<min>-<max> net_controller_s=<median> net_floor_s=<median>
//! net_ratio=<r> acknowledged=<n> lost=0` (a lost write fails the bench,
//! naming it). `net_` is the wall time less the time etcd took to exit after
//! SIGTERM, which the controller cannot shorten and which varies from 20 ms
//! to 3.7 s per restart on either side. `ETCDFLEET_BENCH_ONLY=<path>` runs
//! one path (`scale_out` for the scale-out); `ETCDFLEET_BENCH_TRACE=1`
//! prints the controller's outcome at each reconcile and how long the
//! reconcile took.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::version::DOWNGRADE_ANNOTATION;
use etcdfleet_controllers::etcd::EtcdConfig;
use etcdfleet_controllers::etcdcluster::{Outcome, ReconcilerSettings, in_flight_requeue};
use etcdfleet_tests::by_hand::ByHand;
use etcdfleet_tests::driver::TestController;
use etcdfleet_tests::etcd_harness::{
    AckedWriter, ClusterOptions, EtcdBinary, EtcdVersion, LocalEtcdCluster, require_etcd,
    verify_acknowledged,
};
use etcdfleet_tests::fleet::Fleet;
use etcdfleet_tests::runtime::BackgroundSync;
use etcdfleet_tests::scenario::{NS, cluster, converge_all, create, etcd_of, get, patch_spec};
use etcdfleet_tests::versions::annotate;

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
        let reconcile_started = Instant::now();
        let outcome = ctl.reconcile(NS, name).await;
        let reconciled_in = reconcile_started.elapsed();
        let current = get(fleet, name).await?;
        if std::env::var_os("ETCDFLEET_BENCH_TRACE").is_some() {
            eprintln!(
                "{:>7.3}s (reconciled in {:>3} ms) {outcome:?}",
                started.elapsed().as_secs_f64(),
                reconciled_in.as_millis()
            );
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

/// The controller the bench drives, with [`production_like`] settings.
fn production_controller(fleet: &Fleet) -> TestController {
    TestController::new(
        fleet.management(),
        fleet.client_factory(),
        fleet.dialer(),
        production_like(),
    )
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
    /// Of `took`, how long etcd processes of deleted pods took to exit
    /// after SIGTERM (the runtime's count over the same window).
    exiting: Duration,
    acknowledged: usize,
}

/// How long a new cluster runs under its writer before either side starts.
/// Users upgrade clusters that have run for a while. Within a second of its
/// creation, the members' peer connections are still being dialled (a new
/// member's name resolves only once its pod is up). A member stopped then
/// often exits in 20 ms, where a settled one takes about a second: its
/// peers redial at once and etcd's peer server waits up to a second for
/// those connections. The person, who starts a few reconciles sooner than
/// the controller, got most of those fast exits (`SIGTERM took=`).
const SETTLE: Duration = Duration::from_secs(3);

/// A fleet of one workload cluster with EtcdCluster `up` created and
/// converged on `from`, pods synced every 100 ms like a kubelet, and a
/// writer on its members.
struct World {
    fleet: Fleet,
    ctl: TestController,
    _sync: Vec<BackgroundSync>,
    endpoints: Vec<String>,
    config: EtcdConfig,
    writer: AckedWriter,
}

impl World {
    async fn start(from: &EtcdBinary) -> Result<World> {
        let fleet = Fleet::new(&["a"]).await?;
        let mut ctl = production_controller(&fleet);
        create(&fleet, &cluster("up", "a", 3, &from.release)).await?;
        converge_all(&fleet, &mut ctl, &["up"]).await?;
        let sync = fleet.spawn_background_sync(Duration::from_millis(100));
        let (endpoints, config) = etcd_of(&fleet, "a", "up", 3).await?;
        let writer = AckedWriter::start(endpoints.clone(), config.clone(), "/bench").await?;
        tokio::time::sleep(SETTLE).await;
        Ok(World {
            fleet,
            ctl,
            _sync: sync,
            endpoints,
            config,
            writer,
        })
    }

    /// How long deleted pods' etcd took to exit so far.
    fn exiting(&self) -> Duration {
        self.fleet.runtime("a").time_spent_exiting()
    }

    /// Stops the writer, reads every acknowledged write back and tears the
    /// world down; the count of writes verified.
    async fn finish(self) -> Result<usize> {
        let report = self.writer.stop().await?;
        let verified = verify_acknowledged(&report, &self.endpoints, &self.config, "/bench").await;
        self.fleet.shutdown().await;
        verified
    }
}

async fn controller_path(
    path: &VersionPath,
    from: &EtcdBinary,
    to: &EtcdBinary,
) -> Result<Measured> {
    let world = World::start(from).await?;
    if path.downgrade {
        annotate(&world.fleet, "up", DOWNGRADE_ANNOTATION, Some(&to.release)).await?;
    }
    patch_spec(
        &world.fleet,
        "up",
        serde_json::json!({ "version": to.release }),
    )
    .await?;
    let exited_before = world.exiting();
    let want = to.release.clone();
    let took = drive(&world.fleet, &world.ctl, "up", |c| {
        c.status.as_ref().is_some_and(|s| {
            s.current_version.as_deref() == Some(want.as_str()) && s.ready_members == 3
        })
    })
    .await;
    let exiting = world.exiting() - exited_before;
    let acknowledged = world.finish().await?;
    Ok(Measured {
        took: took?,
        exiting,
        acknowledged,
    })
}

/// The same path by hand on the same kind of world: a cluster the
/// controller created, then left alone (see `etcdfleet_tests::by_hand`).
async fn floor_path(path: &VersionPath, from: &EtcdBinary, to: &EtcdBinary) -> Result<Measured> {
    let world = World::start(from).await?;
    let person = ByHand::connect(&world.fleet, "a", "up", 3, &from.release).await?;
    let exited_before = world.exiting();
    let started = Instant::now();
    let done = if path.downgrade {
        person.downgrade(to).await
    } else {
        person.upgrade(to).await
    };
    let took = started.elapsed();
    let exiting = world.exiting() - exited_before;
    let acknowledged = world.finish().await?;
    done?;
    Ok(Measured {
        took,
        exiting,
        acknowledged,
    })
}

async fn controller_scale_out() -> Result<Duration> {
    let fleet = Fleet::new(&["b"]).await?;
    let mut ctl = production_controller(&fleet);
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
            sides.push_measured(&controller, &floor);
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
/// Runs per side and path when `ETCDFLEET_BENCH_RUNS` is unset. etcd's exit
/// after SIGTERM (about 0.1, 1 or up to 5 s per restart) moves a run by more
/// than the controller's own cost: one path gave ratios from 1.07 to 1.98
/// in runs of three, and 1.09 over ten.
const DEFAULT_RUNS: usize = 10;

fn runs() -> Result<usize> {
    match std::env::var("ETCDFLEET_BENCH_RUNS") {
        Err(_) => Ok(DEFAULT_RUNS),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("ETCDFLEET_BENCH_RUNS={v:?}: expected a positive count"),
        },
    }
}

/// The runs of one path: the controller's and the floor's times, and of
/// each the time etcd spent exiting.
#[derive(Default)]
struct Sides {
    controller: Vec<Duration>,
    floor: Vec<Duration>,
    controller_net: Vec<Duration>,
    floor_net: Vec<Duration>,
    acknowledged: usize,
}

impl Sides {
    fn push(&mut self, controller: Duration, floor: Duration) {
        self.controller.push(controller);
        self.floor.push(floor);
    }

    /// A version path's run: wall times, and wall times less etcd's exits.
    fn push_measured(&mut self, controller: &Measured, floor: &Measured) {
        self.push(controller.took, floor.took);
        self.controller_net
            .push(controller.took.saturating_sub(controller.exiting));
        self.floor_net
            .push(floor.took.saturating_sub(floor.exiting));
        self.acknowledged += controller.acknowledged + floor.acknowledged;
    }

    /// `<what> controller_s=<median> floor_s=<median> ratio=<of the medians>
    /// runs=<n> controller_range=<min>-<max> floor_range=<min>-<max>`, then
    /// for a version path `net_controller_s=<median> net_floor_s=<median>
    /// net_ratio=<r>`: the same less the time etcd took to exit after
    /// SIGTERM, which varies from 20 ms to 3.7 s per restart on either side.
    fn line(&self, what: &str) -> String {
        let range = |v: &[Duration]| {
            let secs = v.iter().map(Duration::as_secs_f64);
            let min = secs.clone().fold(f64::INFINITY, f64::min);
            let max = secs.fold(0.0, f64::max);
            format!("{min:.2}-{max:.2}")
        };
        let mut text = format!(
            "{} runs={} controller_range={} floor_range={}",
            line(what, median(&self.controller), median(&self.floor)),
            self.controller.len(),
            range(&self.controller),
            range(&self.floor)
        );
        if !self.controller_net.is_empty() {
            let (c, f) = (median(&self.controller_net), median(&self.floor_net));
            text += &format!(
                " net_controller_s={:.2} net_floor_s={:.2} net_ratio={:.2}",
                c.as_secs_f64(),
                f.as_secs_f64(),
                c.as_secs_f64() / f.as_secs_f64()
            );
        }
        text
    }
}

fn median(v: &[Duration]) -> Duration {
    let mut sorted = v.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}
