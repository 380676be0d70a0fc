//! The cost of watching a fleet: how long one reconcile of a converged
//! cluster takes (kubeconfig and PKI Secret reads, 10 workload reads, member
//! list, status and a linearizable health read per member, no writes), for
//! clusters of 1 and 3 members side by side in one run, and what that means
//! for one controller polling many clusters.
//!
//! `cargo bench -p etcdfleet-tests --bench reconcile` (`ROUNDS=n`, default 40).

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use etcdfleet_controllers::etcdcluster::Outcome;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::scenario::{NS, cluster, running};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return Ok(());
    }
    if !args.iter().any(|a| a == "--bench") {
        eprintln!(
            "reconcile: benchmark only; run `cargo bench -p etcdfleet-tests --bench reconcile`"
        );
        return Ok(());
    }
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let (fleet, ctl) = running(
        &["a"],
        &[
            cluster("one", "a", 1, "3.5.1"),
            cluster("three", "a", 3, "3.5.1"),
        ],
    )
    .await?;
    fleet.sync_all().await?;
    // Settle: the first reconciles after convergence may still record status.
    for _ in 0..3 {
        for name in ["one", "three"] {
            ctl.reconcile(NS, name).await?;
        }
    }
    let (mut one, mut three) = (Vec::new(), Vec::new());
    fleet.clear_ops();
    for _ in 0..rounds {
        for (name, times) in [("one", &mut one), ("three", &mut three)] {
            let started = Instant::now();
            let outcome = ctl.reconcile(NS, name).await?;
            times.push(started.elapsed());
            ensure!(outcome == Outcome::Converged, "{name}: {outcome:?}");
        }
    }
    let writes = fleet.writes().len();
    let reads = fleet.ops().len() / (2 * rounds);
    let (m1, m3) = (median(one), median(three));
    println!("converged reconcile, {rounds} rounds each, side by side:");
    println!(
        "  1-member cluster: median {:.1} ms",
        m1.as_secs_f64() * 1e3
    );
    println!(
        "  3-member cluster: median {:.1} ms",
        m3.as_secs_f64() * 1e3
    );
    println!(
        "  ratio 3-member / 1-member: {:.2}",
        m3.as_secs_f64() / m1.as_secs_f64()
    );
    println!("  API calls per reconcile: {reads} reads, {writes} writes in total");
    println!(
        "  one reconcile worker polls about {:.0} 3-member clusters a minute",
        60.0 / m3.as_secs_f64()
    );
    Ok(())
}
