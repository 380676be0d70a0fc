//! `make bench-fleet`: the `etcdfleet run` binary as a process carrying a
//! fleet of `EtcdCluster`s, each in its own workload cluster (its own served
//! API server with the workload RBAC enforced, its own runtime playing the
//! StatefulSet controller and kubelet), every member reached through
//! `pods/portforward` of its workload API (the default dialer, TLS on).
//!
//! Two kinds of member, chosen by `ETCDFLEET_BENCH_ETCD`:
//! - `standin` (default, 1,000 one-member clusters): the etcd stand-in
//!   (`etcdfleet_tests::etcd_standin`), a small gRPC server answering the
//!   calls a converged reconcile makes, for the controller's cost only;
//! - `real` (20 three-member clusters): real etcd 3.5 processes.
//!
//! `ETCDFLEET_BENCH_CLUSTERS` and `ETCDFLEET_BENCH_MEMBERS` override the size.
//!
//! 1. Create: controller A creates and converges the fleet.
//! 2. Resync: A is stopped (SIGTERM) and a fresh controller B starts, as on a
//!    restart or a leader failover; `resync_s` is the time from B's start
//!    until it reported as many converged reconciles as there are clusters
//!    (its converged requeue is longer than the resync, so no cluster is
//!    counted twice).
//! 3. Steady state: over a window, the API calls B makes (recognised by its
//!    bearer tokens, so the runtimes' calls do not count) divided by its
//!    converged reconciles give `reads_per_converged` and
//!    `writes_per_converged`.
//! 4. Secrets: 200 unrelated Secrets of 500 KB each are added to the watched
//!    namespace; the controller's peak RSS before and after shows whether it
//!    holds them (it must only ever GET Secrets by name).
//!
//! Prints, last, `fleet clusters=<n> resync_s=<s> rss_mib=<controller peak RSS>
//! reads_per_converged=<r> writes_per_converged=<w>` (the real-etcd run
//! prints `fleet_real members=<m> clusters=<n> ...`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_tests::apiserver::{ApiServer, CONTROLLER_USER};
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::{Fleet, MANAGEMENT};
use etcdfleet_tests::runtime::ImageTable;
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, create};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};

/// Converged requeue of the controllers under test: longer than the resync,
/// so each cluster's first converged reconcile is counted once.
const REQUEUE_CONVERGED_S: u64 = 30;
/// The steady-state window (a bit more than one converged requeue).
const WINDOW: Duration = Duration::from_secs(40);

fn main() -> Result<()> {
    // The test runner lists every target (`--list`) and runs benches
    // without `--bench`: this is a benchmark only.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return Ok(());
    }
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("fleet: benchmark only; run `make bench-fleet`");
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

fn available(c: &EtcdCluster, members: i32) -> bool {
    c.status.as_ref().is_some_and(|s| {
        s.ready_members == members
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
    })
}

/// `etcdfleet_plans_total{plan="Converged"}` of a controller, from /metrics.
fn converged_reconciles(process: &ControllerProcess) -> Option<u64> {
    let (_, body) = process.get("/metrics")?;
    body.lines()
        .find(|l| l.starts_with(r#"etcdfleet_plans_total{plan="Converged"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .or(Some(0))
}

/// `VmHWM` (peak resident set) of a process, in MiB.
fn peak_rss_mib(pid: i32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmHWM")?;
    Ok(kib / 1024.0)
}

/// The bearer token in a kubeconfig written by the test API.
fn token_of(kubeconfig: &str) -> Option<String> {
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().trim_matches('"').to_string())
}

async fn bench() -> Result<()> {
    let real = match std::env::var("ETCDFLEET_BENCH_ETCD").as_deref() {
        Ok("real") => true,
        Ok("standin") | Err(_) => false,
        Ok(other) => bail!("ETCDFLEET_BENCH_ETCD={other:?}: expected real or standin"),
    };
    let setting = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let n = setting("ETCDFLEET_BENCH_CLUSTERS", if real { 20 } else { 1000 });
    let members = setting("ETCDFLEET_BENCH_MEMBERS", if real { 3 } else { 1 }) as i32;
    let standin_dir = tempfile::tempdir()?;
    let images = if real {
        if require_etcd(EtcdVersion::V3_5).is_none() {
            println!("SKIPPED: bench-fleet with real etcd needs etcd 3.5 (make tools)");
            return Ok(());
        }
        ImageTable::installed()
    } else {
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_etcd_standin"));
        ImageTable::standin(binary, standin_dir.path())?
    };
    let workloads: Vec<String> = (0..n).map(|i| format!("w{i:04}")).collect();
    let names: Vec<&str> = workloads.iter().map(String::as_str).collect();
    let started = Instant::now();
    let fleet = Fleet::with_images(ApiServer::management().await?, NS, &names, images).await?;
    // Every runtime syncs when its API changed (or its pods are not all
    // ready yet), else once a minute: the test world shares the two cores
    // with the controller it measures.
    let _kubelets =
        fleet.spawn_background_sync_on_change(Duration::from_millis(200), Duration::from_secs(60));
    eprintln!(
        "fleet: {n} workload API servers and runtimes up in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let management_token = fleet.management_api().issue_token(CONTROLLER_USER);
    let kubeconfig = fleet.management_api().kubeconfig(&management_token);
    let requeue = REQUEUE_CONVERGED_S.to_string();
    let args = ["--requeue-converged-seconds", requeue.as_str()];

    // 1. Create and converge the fleet.
    let mut first = ControllerProcess::start("bench-a", &kubeconfig, &args);
    let created = Instant::now();
    for (i, w) in workloads.iter().enumerate() {
        create(&fleet, &cluster(&format!("c{i:04}"), w, members, "3.5.1")).await?;
    }
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    loop {
        let ready = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| available(c, members))
            .count();
        if ready == n {
            break;
        }
        if created.elapsed() > Duration::from_secs(120 + n as u64 * if real { 10 } else { 1 }) {
            let stuck = api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|c| !available(c, members));
            let pod_log = stuck
                .as_ref()
                .map(|c| {
                    let name = c.metadata.name.clone().unwrap_or_default();
                    let workload = name.replacen('c', "w", 1);
                    let names = etcdfleet_controllers::render::Names::new(&name, WORKLOAD_NS);
                    fleet
                        .runtime(&workload)
                        .pod_log_tail(WORKLOAD_NS, &names.pod(0), 20)
                })
                .unwrap_or_default();
            bail!(
                "only {ready} of {n} clusters available after {:?}; a cluster not available: {}\nits pod 0's log:\n{pod_log}\ncontroller log (tail):\n{}",
                created.elapsed(),
                serde_json::to_string_pretty(&stuck.map(|c| c.status))?,
                first
                    .log()
                    .lines()
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let create_s = created.elapsed().as_secs_f64();
    let rss_create = peak_rss_mib(first.pid())?;
    eprintln!(
        "fleet: {n} clusters created and available in {create_s:.1}s (controller A peak RSS {rss_create:.1} MiB)"
    );
    first.signal(libc::SIGTERM);
    first
        .wait_exit(Duration::from_secs(15))
        .context("controller A did not exit on SIGTERM")?;

    // 2. A fresh controller resyncs the converged fleet.
    let resync_start = Instant::now();
    let second = ControllerProcess::start("bench-b", &kubeconfig, &args);
    let resync = loop {
        if converged_reconciles(&second).unwrap_or(0) >= n as u64 {
            break resync_start.elapsed();
        }
        if resync_start.elapsed() > Duration::from_secs(REQUEUE_CONVERGED_S) {
            bail!(
                "controller B reported {:?} converged reconciles of {n} within {REQUEUE_CONVERGED_S}s; log:\n{}",
                converged_reconciles(&second),
                second.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "fleet: resync of {n} clusters by a fresh controller in {:.2}s",
        resync.as_secs_f64()
    );

    // 3. Steady state: B's API calls per converged reconcile.
    let mut tokens: BTreeSet<String> = BTreeSet::from([management_token.clone()]);
    tokens.extend(
        workloads
            .iter()
            .filter_map(|w| token_of(&fleet.kubeconfig(w))),
    );
    let before = converged_reconciles(&second).unwrap_or(0);
    fleet.clear_ops();
    tokio::time::sleep(WINDOW).await;
    let ops: Vec<_> = fleet
        .ops()
        .into_iter()
        .filter(|op| op.token.as_ref().is_some_and(|t| tokens.contains(t)))
        .collect();
    let converged = converged_reconciles(&second).unwrap_or(0) - before;
    let reads = ops.iter().filter(|o| o.is_read()).count();
    let writes = ops.iter().filter(|o| o.is_write()).count();
    let management_reads = ops
        .iter()
        .filter(|o| o.is_read() && o.cluster == MANAGEMENT)
        .count();
    if converged == 0 {
        bail!("no converged reconcile in the {WINDOW:?} window");
    }
    let per = |x: usize| x as f64 / converged as f64;
    eprintln!(
        "fleet: window {:?}: {converged} converged reconciles, {reads} reads ({management_reads} management), {writes} writes",
        WINDOW
    );
    for op in ops.iter().filter(|o| o.is_write()).take(5) {
        eprintln!(
            "fleet: write {} {} {:?} {:?}",
            op.cluster, op.verb, op.resource, op.name
        );
    }
    let rss_fleet = peak_rss_mib(second.pid())?;

    // 4. Large unrelated Secrets must not grow the controller.
    let secrets: Api<Secret> = Api::namespaced(fleet.management_direct(), NS);
    let payload = vec![b'x'; 500 * 1024];
    for i in 0..200 {
        let s = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("unrelated-{i:03}")),
                ..Default::default()
            },
            data: Some([("blob".to_string(), k8s_openapi::ByteString(payload.clone()))].into()),
            ..Default::default()
        };
        secrets.create(&PostParams::default(), &s).await?;
    }
    tokio::time::sleep(Duration::from_secs(REQUEUE_CONVERGED_S + 5)).await;
    let rss_secrets = peak_rss_mib(second.pid())?;
    let secret_lists = fleet.secret_lists_or_watches().len();

    let etcd = if real {
        "real etcd 3.5"
    } else {
        "etcd stand-in"
    };
    println!(
        "fleet_create clusters={n} members={members} create_s={create_s:.1} rss_mib={rss_create:.1} ({etcd}, TLS, port-forward)"
    );
    println!(
        "fleet_secrets secrets=200 size_kib=500 rss_mib_before={rss_fleet:.1} rss_mib_after={rss_secrets:.1} secret_lists_or_watches={secret_lists}"
    );
    println!(
        "{} clusters={n} resync_s={:.2} rss_mib={rss_secrets:.1} reads_per_converged={:.2} writes_per_converged={:.2}",
        if real {
            format!("fleet_real members={members}")
        } else {
            "fleet".to_string()
        },
        resync.as_secs_f64(),
        per(reads),
        per(writes)
    );
    drop(second);
    fleet.shutdown().await;
    Ok(())
}
