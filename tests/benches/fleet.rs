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
//!    `writes_per_converged`, and B's CPU time over the window divided the
//!    same way `cpu_ms_per_converged` (a converged cluster reconnects to
//!    etcd at each poll: this is what that costs).
//! 4. Secrets: 200 unrelated Secrets of 500 KB each are added to the watched
//!    namespace; the controller's peak RSS before and after shows whether it
//!    holds them (it must only ever GET Secrets by name).
//!
//! 5. Rollout (stand-in fleet only): an `EtcdFleetRollout` over the whole
//!    fleet to 3.5.21, canary 1 then waves of [`ROLLOUT_WAVE`], run for
//!    [`ROLLOUT_WAVES`] waves and aborted. `rollout_plan_ms` is the mean
//!    (and `rollout_plan_max_ms` the largest histogram bucket reached) of
//!    one planning pass over every cluster, from B's
//!    `etcdfleet_rollout_plan_duration_seconds`; `rollout_calls_per_wave`
//!    counts B's management API calls about the rollout (its GETs, status
//!    writes, the clusters' writes) per wave; lists or watches of
//!    EtcdClusters opened meanwhile must be none.
//!
//! The budget of the stand-in fleet (2,000 clusters per replica): resync
//! within 10 s, B's and A's peak RSS (A's includes creating the fleet)
//! within 300 MiB, and no write in a converged reconcile.
//!
//! The management cluster, chosen by `ETCDFLEET_BENCH_MANAGEMENT`:
//! - `inmemory` (default): the project's in-memory API server, whose request
//!   recorder counts the controller's calls;
//! - `real`: a real kube-apiserver (with kube-controller-manager and
//!   kube-scheduler, from the real tier's builds) on its own storage etcd,
//!   the CRDs and the controller's RBAC applied as shipped; the
//!   controller's management calls are counted from its audit log, and the
//!   API server's peak RSS and CPU time over the steady-state window are
//!   measured too. The workload clusters stay in-memory API servers.
//!
//! Prints, last, `fleet clusters=<n> resync_s=<s> rss_mib=<controller peak RSS>
//! reads_per_converged=<r> writes_per_converged=<w> ...` (the real-etcd run
//! prints `fleet_real members=<m> clusters=<n> ...`, the real management
//! API's run `fleet_real_api clusters=<n> ... apiserver_rss_mib=<peak>
//! apiserver_cpu_s_per_min=<steady state> ...`). Every stand-in run fails
//! after printing when it is over the budget, or writes in a converged
//! reconcile.

#[path = "fleet/management.rs"]
mod management;
#[path = "fleet/measure.rs"]
mod measure;
#[path = "fleet/rollout.rs"]
mod rollout;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::EtcdCluster;
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::{Fleet, MANAGEMENT};
use etcdfleet_tests::runtime::ImageTable;
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, create};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};

use management::Management;
use measure::{converged_reconciles, cpu_ms, peak_rss_mib, token_of};
use rollout::{RolloutCost, rollout_cost};

/// Converged requeue of the controllers under test: longer than the resync,
/// so each cluster's first converged reconcile is counted once.
const REQUEUE_CONVERGED_S: u64 = 30;
/// The steady-state window (a bit more than one converged requeue).
const WINDOW: Duration = Duration::from_secs(40);
/// The stand-in fleet's budget per replica.
const BUDGET_RESYNC_S: f64 = 10.0;
const BUDGET_RSS_MIB: f64 = 300.0;

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

/// One run's choices, from the environment (see the module docs).
struct Setup {
    real_etcd: bool,
    real_api: bool,
    n: usize,
    members: i32,
}

impl Setup {
    fn from_env() -> Result<Setup> {
        let real_etcd = match std::env::var("ETCDFLEET_BENCH_ETCD").as_deref() {
            Ok("real") => true,
            Ok("standin") | Err(_) => false,
            Ok(other) => bail!("ETCDFLEET_BENCH_ETCD={other:?}: expected real or standin"),
        };
        let real_api = match std::env::var("ETCDFLEET_BENCH_MANAGEMENT").as_deref() {
            Ok("real") => true,
            Ok("inmemory") | Err(_) => false,
            Ok(other) => bail!("ETCDFLEET_BENCH_MANAGEMENT={other:?}: expected real or inmemory"),
        };
        let setting = |name: &str, default: usize| -> Result<usize> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .with_context(|| format!("{name}={v:?}: not a count")),
                Err(_) => Ok(default),
            }
        };
        Ok(Setup {
            real_etcd,
            real_api,
            n: setting(
                "ETCDFLEET_BENCH_CLUSTERS",
                if real_etcd { 20 } else { 2000 },
            )?,
            members: setting("ETCDFLEET_BENCH_MEMBERS", if real_etcd { 3 } else { 1 })? as i32,
        })
    }

    /// The images of the members: real etcd, or the stand-in written into
    /// `dir`; `None` (after saying why) when real etcd is not installed.
    fn images(&self, dir: &std::path::Path) -> Result<Option<ImageTable>> {
        if !self.real_etcd {
            let binary = std::path::Path::new(env!("CARGO_BIN_EXE_etcd_standin"));
            return Ok(Some(ImageTable::standin(binary, dir)?));
        }
        if require_etcd(EtcdVersion::V3_5).is_none() {
            println!("SKIPPED: bench-fleet with real etcd needs etcd 3.5 (make tools)");
            return Ok(None);
        }
        Ok(Some(ImageTable::installed()))
    }

    /// The result line's name.
    fn line(&self) -> String {
        match (self.real_api, self.real_etcd) {
            (false, false) => "fleet".into(),
            (false, true) => format!("fleet_real members={}", self.members),
            (true, false) => "fleet_real_api".into(),
            (true, true) => format!("fleet_real_api members={}", self.members),
        }
    }
}

/// How the controller under test is counted.
struct Counting<'a> {
    fleet: &'a Fleet,
    management: &'a Management,
    /// Its tokens: the management one and each workload kubeconfig's.
    tokens: BTreeSet<String>,
    management_token: String,
    controller: &'a ControllerProcess,
}

async fn bench() -> Result<()> {
    let setup = Setup::from_env()?;
    let standin_dir = tempfile::tempdir()?;
    let Some(images) = setup.images(standin_dir.path())? else {
        return Ok(());
    };
    let management = Management::start(setup.real_api).await?;
    let workloads: Vec<String> = (0..setup.n).map(|i| format!("w{i:04}")).collect();
    let names: Vec<&str> = workloads.iter().map(String::as_str).collect();
    let started = Instant::now();
    let fleet = management.fleet(&names, images).await?;
    // Every runtime syncs when its API changed (or its pods are not all
    // ready yet), else once a minute: the test world shares the two cores
    // with the controller it measures.
    let _kubelets =
        fleet.spawn_background_sync_on_change(Duration::from_millis(200), Duration::from_secs(60));
    eprintln!(
        "fleet: {} workload API servers and runtimes up in {:.1}s",
        setup.n,
        started.elapsed().as_secs_f64()
    );
    let (kubeconfig, management_token) = management.controller_kubeconfig(&fleet).await?;
    let requeue = REQUEUE_CONVERGED_S.to_string();
    let args = ["--requeue-converged-seconds", requeue.as_str()];
    let created = create_fleet(&setup, &fleet, &kubeconfig, &args).await?;
    let (second, resync) = resync(setup.n, &kubeconfig, &args).await?;
    let mut tokens = BTreeSet::from([management_token.clone()]);
    tokens.extend(
        workloads
            .iter()
            .filter_map(|w| token_of(&fleet.kubeconfig(w))),
    );
    let counting = Counting {
        fleet: &fleet,
        management: &management,
        tokens,
        management_token,
        controller: &second,
    };
    let steady = steady_state(&counting).await?;
    let rss_fleet = peak_rss_mib(second.pid())?;
    let secret_lists = unrelated_secrets(&counting).await?;
    let rss_secrets = peak_rss_mib(second.pid())?;
    // A rollout over the whole fleet (stand-in only: it changes clusters).
    let rollout = if setup.real_etcd {
        None
    } else {
        let c = &counting;
        Some(
            rollout_cost(
                c.fleet,
                c.management,
                c.controller,
                &c.tokens,
                &c.management_token,
            )
            .await?,
        )
    };
    let rss_rollout = peak_rss_mib(second.pid())?;
    let apiserver_rss = management.apiserver_pid().map(peak_rss_mib).transpose()?;
    let etcd = if setup.real_etcd {
        "real etcd 3.5"
    } else {
        "etcd stand-in"
    };
    println!(
        "fleet_create clusters={} members={} create_s={:.1} rss_mib={:.1} ({etcd}, TLS, port-forward)",
        setup.n, setup.members, created.seconds, created.peak_rss_mib
    );
    println!(
        "fleet_secrets secrets=200 size_kib=500 rss_mib_before={rss_fleet:.1} rss_mib_after={rss_secrets:.1} secret_lists_or_watches={secret_lists}"
    );
    if let Some(r) = &rollout {
        println!("{r}");
    }
    let figures = Figures {
        setup: &setup,
        resync,
        rss_mib: rss_rollout,
        create_rss_mib: created.peak_rss_mib,
        steady: &steady,
        apiserver_rss_mib: apiserver_rss,
        rollout: rollout.as_ref(),
    };
    println!("{figures}");
    drop(second);
    fleet.shutdown().await;
    if !setup.real_etcd {
        within_budget(&figures)?;
    }
    Ok(())
}

fn available(c: &EtcdCluster, members: i32) -> bool {
    c.status.as_ref().is_some_and(|s| {
        s.ready_members == members
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
    })
}

/// Step 1: what creating and converging the fleet took controller A.
struct Created {
    seconds: f64,
    peak_rss_mib: f64,
}

/// Step 1: controller A creates and converges the fleet, then stops.
async fn create_fleet(
    setup: &Setup,
    fleet: &Fleet,
    kubeconfig: &str,
    args: &[&str],
) -> Result<Created> {
    let (n, members) = (setup.n, setup.members);
    let mut first = ControllerProcess::start("bench-a", kubeconfig, args);
    let created = Instant::now();
    for i in 0..n {
        let w = format!("w{i:04}");
        create(fleet, &cluster(&format!("c{i:04}"), &w, members, "3.5.1")).await?;
    }
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    let limit = Duration::from_secs(120 + n as u64 * if setup.real_etcd { 10 } else { 1 });
    loop {
        let clusters = api.list(&ListParams::default()).await?.items;
        let ready = clusters.iter().filter(|c| available(c, members)).count();
        if ready == n {
            break;
        }
        if created.elapsed() > limit {
            let stuck = clusters.into_iter().find(|c| !available(c, members));
            bail!(
                "only {ready} of {n} clusters available after {:?}; {}",
                created.elapsed(),
                not_available(fleet, stuck, &first)?
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let seconds = created.elapsed().as_secs_f64();
    let peak_rss_mib = peak_rss_mib(first.pid())?;
    eprintln!(
        "fleet: {n} clusters created and available in {seconds:.1}s (controller A peak RSS {peak_rss_mib:.1} MiB)"
    );
    first.signal(libc::SIGTERM);
    first
        .wait_exit(Duration::from_secs(15))
        .context("controller A did not exit on SIGTERM")?;
    Ok(Created {
        seconds,
        peak_rss_mib,
    })
}

/// What a cluster that did not become available shows: its status, its
/// pod 0's log and the controller's.
fn not_available(
    fleet: &Fleet,
    stuck: Option<EtcdCluster>,
    controller: &ControllerProcess,
) -> Result<String> {
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
    let log = controller.log();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    Ok(format!(
        "a cluster not available: {}\nits pod 0's log:\n{pod_log}\ncontroller log (tail):\n{}",
        serde_json::to_string_pretty(&stuck.map(|c| c.status))?,
        tail.join("\n")
    ))
}

/// Step 2: a fresh controller B resyncs the converged fleet; returns it
/// and the time from its start to as many converged reconciles as clusters.
async fn resync(
    n: usize,
    kubeconfig: &str,
    args: &[&str],
) -> Result<(ControllerProcess, Duration)> {
    let resync_start = Instant::now();
    let second = ControllerProcess::start("bench-b", kubeconfig, args);
    let resync = loop {
        let converged = converged_reconciles(&second).unwrap_or(0);
        if converged >= n as u64 {
            break resync_start.elapsed();
        }
        if resync_start.elapsed() > Duration::from_secs(REQUEUE_CONVERGED_S) {
            bail!(
                "controller B reported {:?} converged reconciles of {n} within {REQUEUE_CONVERGED_S}s; log:\n{}",
                converged_reconciles(&second),
                second.log()
            );
        }
        // B's /metrics carries series per cluster (2.3 MB at 2,000
        // clusters): scraped every 50 ms throughout, it cost B and the
        // bench a share of the resync they measure. Every second until 90 %
        // of the fleet is done, then every 50 ms for the figure's precision.
        let pause = if converged * 10 < n as u64 * 9 {
            1000
        } else {
            50
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    };
    eprintln!(
        "fleet: resync of {n} clusters by a fresh controller in {:.2}s",
        resync.as_secs_f64()
    );
    Ok((second, resync))
}

/// Step 3: B's calls and CPU (and the real API server's CPU) over the
/// steady-state window.
struct Steady {
    converged: u64,
    reads: usize,
    writes: usize,
    cpu_ms: f64,
    apiserver_cpu_ms: Option<f64>,
}

impl Steady {
    fn per(&self, x: f64) -> f64 {
        x / self.converged as f64
    }
}

async fn steady_state(c: &Counting<'_>) -> Result<Steady> {
    let before = converged_reconciles(c.controller).context("controller B's /metrics")?;
    let pid = c.controller.pid();
    let apiserver = c.management.apiserver_pid();
    let cpu_before = cpu_ms(pid)?;
    let apiserver_before = apiserver.map(cpu_ms).transpose()?;
    let mark = c.management.mark(c.fleet)?;
    tokio::time::sleep(WINDOW).await;
    let cpu = cpu_ms(pid)? - cpu_before;
    let apiserver_cpu_ms = match (apiserver, apiserver_before) {
        (Some(pid), Some(before)) => Some(cpu_ms(pid)? - before),
        _ => None,
    };
    let ops = c
        .management
        .calls_since(c.fleet, mark, &c.tokens, &c.management_token)?;
    let after = converged_reconciles(c.controller).context("controller B's /metrics")?;
    let converged = after - before;
    if converged == 0 {
        bail!("no converged reconcile in the {WINDOW:?} window");
    }
    let reads = ops.iter().filter(|o| o.is_read()).count();
    let writes = ops.iter().filter(|o| o.is_write()).count();
    let management_reads = ops
        .iter()
        .filter(|o| o.is_read() && o.cluster == MANAGEMENT)
        .count();
    eprintln!(
        "fleet: window {WINDOW:?}: {converged} converged reconciles, {reads} reads ({management_reads} management), {writes} writes, {cpu:.0} ms of controller CPU{}",
        apiserver_cpu_ms.map_or_else(String::new, |ms| format!(
            ", {ms:.0} ms of kube-apiserver CPU"
        ))
    );
    for op in ops.iter().filter(|o| o.is_write()).take(5) {
        eprintln!(
            "fleet: write {} {} {:?} {:?}",
            op.cluster, op.verb, op.resource, op.name
        );
    }
    Ok(Steady {
        converged,
        reads,
        writes,
        cpu_ms: cpu,
        apiserver_cpu_ms,
    })
}

/// Step 4: 200 unrelated Secrets of 500 KB in the watched namespace; the
/// lists or watches of Secrets B made meanwhile (it must only GET them).
async fn unrelated_secrets(c: &Counting<'_>) -> Result<usize> {
    let mark = c.management.mark(c.fleet)?;
    let secrets: Api<Secret> = Api::namespaced(c.fleet.management_direct(), NS);
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
    let ops = c
        .management
        .calls_since(c.fleet, mark, &c.tokens, &c.management_token)?;
    Ok(ops
        .iter()
        .filter(|op| op.resource == "secrets" && (op.verb == "list" || op.verb == "watch"))
        .count())
}

/// The result line's figures.
struct Figures<'a> {
    setup: &'a Setup,
    resync: Duration,
    /// B's peak RSS, at the end.
    rss_mib: f64,
    /// A's peak RSS (creating the fleet).
    create_rss_mib: f64,
    steady: &'a Steady,
    apiserver_rss_mib: Option<f64>,
    rollout: Option<&'a RolloutCost>,
}

impl std::fmt::Display for Figures<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.steady;
        write!(
            f,
            "{} clusters={} resync_s={:.2} rss_mib={:.1} create_peak_rss_mib={:.1}",
            self.setup.line(),
            self.setup.n,
            self.resync.as_secs_f64(),
            self.rss_mib,
            self.create_rss_mib
        )?;
        if let (Some(rss), Some(cpu)) = (self.apiserver_rss_mib, s.apiserver_cpu_ms) {
            let per_min = cpu / 1000.0 / (WINDOW.as_secs_f64() / 60.0);
            write!(
                f,
                " apiserver_rss_mib={rss:.1} apiserver_cpu_s_per_min={per_min:.2}"
            )?;
        }
        write!(
            f,
            " reads_per_converged={:.2} writes_per_converged={:.2} cpu_ms_per_converged={:.2}{}",
            s.per(s.reads as f64),
            s.per(s.writes as f64),
            s.per(s.cpu_ms),
            self.rollout.map_or_else(String::new, RolloutCost::summary)
        )
    }
}

/// The stand-in fleet's budget per replica.
fn within_budget(figures: &Figures<'_>) -> Result<()> {
    let mut over = Vec::new();
    let resync = figures.resync.as_secs_f64();
    if resync > BUDGET_RESYNC_S {
        over.push(format!("resync {resync:.2}s > {BUDGET_RESYNC_S}s"));
    }
    let peak = figures.rss_mib.max(figures.create_rss_mib);
    if peak > BUDGET_RSS_MIB {
        over.push(format!("peak RSS {peak:.1} MiB > {BUDGET_RSS_MIB} MiB"));
    }
    if figures.steady.writes > 0 {
        over.push(format!(
            "{} writes in {} converged reconciles",
            figures.steady.writes, figures.steady.converged
        ));
    }
    if !over.is_empty() {
        bail!("fleet over budget: {}", over.join("; "));
    }
    Ok(())
}
