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
//! within 10 s, and B's and A's peak RSS (A's includes creating the
//! fleet) within 300 MiB; the bench fails after printing when one is
//! exceeded.
//!
//! Prints, last, `fleet clusters=<n> resync_s=<s> rss_mib=<controller peak RSS>
//! reads_per_converged=<r> writes_per_converged=<w> ...` (the real-etcd run
//! prints `fleet_real members=<m> clusters=<n> ...`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use etcdfleet_api::rollout::{FleetSelector, RolloutStrategy};
use etcdfleet_api::{EtcdCluster, EtcdFleetRollout, EtcdFleetRolloutSpec, EtcdFleetRolloutStatus};
use etcdfleet_tests::apiserver::{ApiServer, CONTROLLER_USER};
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::{Fleet, MANAGEMENT};
use etcdfleet_tests::runtime::ImageTable;
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, create};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

/// Converged requeue of the controllers under test: longer than the resync,
/// so each cluster's first converged reconcile is counted once.
const REQUEUE_CONVERGED_S: u64 = 30;
/// The steady-state window (a bit more than one converged requeue).
const WINDOW: Duration = Duration::from_secs(40);
/// Clusters per wave after the canary of the bench's rollout.
const ROLLOUT_WAVE: i32 = 10;
/// Waves the bench's rollout runs before it is aborted.
const ROLLOUT_WAVES: usize = 3;
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

/// CPU time (user + system) a process has used so far, in milliseconds.
fn cpu_ms(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) end with ')'.
    let rest = stat.rsplit_once(')').context("no ')' in stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: the 14th and 15th fields, 12th and 13th after ')'.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks * 1000.0 / per_second)
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
    let n = setting("ETCDFLEET_BENCH_CLUSTERS", if real { 20 } else { 2000 });
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
    let cpu_before = cpu_ms(second.pid())?;
    fleet.clear_ops();
    tokio::time::sleep(WINDOW).await;
    let cpu_window = cpu_ms(second.pid())? - cpu_before;
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
        "fleet: window {:?}: {converged} converged reconciles, {reads} reads ({management_reads} management), {writes} writes, {cpu_window:.0} ms of controller CPU",
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

    // 5. A rollout over the whole fleet (stand-in only: it changes clusters).
    let rollout = if real {
        None
    } else {
        Some(rollout_cost(&fleet, &second, &tokens).await?)
    };
    let rss_rollout = peak_rss_mib(second.pid())?;

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
    if let Some(r) = &rollout {
        println!("{r}");
    }
    println!(
        "{} clusters={n} resync_s={:.2} rss_mib={rss_rollout:.1} create_rss_mib={rss_create:.1} reads_per_converged={:.2} writes_per_converged={:.2} cpu_ms_per_converged={:.2}{}",
        if real {
            format!("fleet_real members={members}")
        } else {
            "fleet".to_string()
        },
        resync.as_secs_f64(),
        per(reads),
        per(writes),
        cpu_window / converged as f64,
        rollout
            .as_ref()
            .map_or_else(String::new, RolloutCost::summary)
    );
    drop(second);
    fleet.shutdown().await;
    if !real {
        within_budget(resync, rss_create.max(rss_rollout))?;
    }
    Ok(())
}

/// The stand-in fleet's budget per replica.
fn within_budget(resync: Duration, peak_rss_mib: f64) -> Result<()> {
    let mut over = Vec::new();
    if resync.as_secs_f64() > BUDGET_RESYNC_S {
        over.push(format!(
            "resync {:.2}s > {BUDGET_RESYNC_S}s",
            resync.as_secs_f64()
        ));
    }
    if peak_rss_mib > BUDGET_RSS_MIB {
        over.push(format!(
            "peak RSS {peak_rss_mib:.1} MiB > {BUDGET_RSS_MIB} MiB"
        ));
    }
    if !over.is_empty() {
        bail!("fleet over budget: {}", over.join("; "));
    }
    Ok(())
}

/// What the bench's rollout cost the controller.
struct RolloutCost {
    waves: usize,
    clusters_changed: usize,
    took: Duration,
    plan_mean_ms: f64,
    plan_max_ms: f64,
    plans: u64,
    /// B's management API calls about the rollout: GETs and status writes
    /// of the rollout, writes of clusters under its field manager.
    rollout_calls: usize,
    cluster_writes: usize,
    /// Lists or watches of EtcdClusters opened during the rollout.
    cluster_lists_or_watches: usize,
}

impl RolloutCost {
    fn summary(&self) -> String {
        format!(
            " rollout_plan_ms={:.2} rollout_calls_per_wave={:.1}",
            self.plan_mean_ms,
            self.rollout_calls as f64 / self.waves as f64
        )
    }
}

impl std::fmt::Display for RolloutCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fleet_rollout waves={} clusters_changed={} took_s={:.1} plans={} plan_mean_ms={:.2} plan_max_ms<={:.2} calls={} calls_per_wave={:.1} cluster_writes={} cluster_lists_or_watches={}",
            self.waves,
            self.clusters_changed,
            self.took.as_secs_f64(),
            self.plans,
            self.plan_mean_ms,
            self.plan_max_ms,
            self.rollout_calls,
            self.rollout_calls as f64 / self.waves as f64,
            self.cluster_writes,
            self.cluster_lists_or_watches
        )
    }
}

/// One Prometheus sample of a controller's /metrics (`name` with its labels).
fn sample(process: &ControllerProcess, name: &str) -> Option<f64> {
    let (_, body) = process.get("/metrics")?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The upper bound of the lowest bucket of a histogram holding all samples.
fn histogram_max(process: &ControllerProcess, name: &str) -> Option<f64> {
    let (_, body) = process.get("/metrics")?;
    let count = sample(process, &format!("{name}_count"))?;
    body.lines()
        .filter_map(|l| l.strip_prefix(&format!("{name}_bucket{{le=\"")))
        .filter_map(|rest| {
            let (le, value) = rest.split_once("\"} ")?;
            Some((le.parse::<f64>().ok()?, value.trim().parse::<f64>().ok()?))
        })
        .find(|(_, v)| *v >= count)
        .map(|(le, _)| le)
}

async fn rollout_status(api: &Api<EtcdFleetRollout>) -> Result<EtcdFleetRolloutStatus> {
    Ok(api.get("bench").await?.status.unwrap_or_default())
}

/// Step 5: a rollout over the fleet, for [`ROLLOUT_WAVES`] waves, then
/// aborted; what it cost controller B.
async fn rollout_cost(
    fleet: &Fleet,
    controller: &ControllerProcess,
    tokens: &BTreeSet<String>,
) -> Result<RolloutCost> {
    let api: Api<EtcdFleetRollout> = Api::all(fleet.management_direct());
    let mut rollout = EtcdFleetRollout::new(
        "bench",
        EtcdFleetRolloutSpec {
            selector: FleetSelector {
                namespaces: vec![NS.to_string()],
                ..Default::default()
            },
            version: Some("3.5.21".into()),
            strategy: RolloutStrategy {
                canary: Some(1),
                wave_size: Some(ROLLOUT_WAVE),
                max_in_flight: Some(ROLLOUT_WAVE),
                soak: Some("1s".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    rollout.metadata.labels = cluster("x", "x", 1, "3.5.1").metadata.labels;
    fleet.clear_ops();
    let started = Instant::now();
    api.create(&PostParams::default(), &rollout).await?;
    let deadline = started
        + Duration::from_secs(
            std::env::var("ETCDFLEET_BENCH_ROLLOUT_TIMEOUT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(300),
        );
    let status = loop {
        let status = rollout_status(&api).await?;
        let done = status
            .waves
            .iter()
            .take(ROLLOUT_WAVES)
            .all(|w| w.state == "Done");
        if status.waves.len() >= ROLLOUT_WAVES && done {
            break status;
        }
        if Instant::now() > deadline {
            let log = controller.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            bail!(
                "the bench's rollout did not finish {ROLLOUT_WAVES} waves: {:?} {:?}; controller log (last lines first):\n{}",
                status.phase,
                status.waves,
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let took = started.elapsed();
    let patch = serde_json::json!({ "spec": { "abort": true } });
    api.patch("bench", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let ops: Vec<_> = fleet
        .ops()
        .into_iter()
        .filter(|op| op.cluster == MANAGEMENT)
        .filter(|op| op.token.as_ref().is_some_and(|t| tokens.contains(t)))
        .collect();
    let cluster_writes = ops
        .iter()
        .filter(|o| o.resource == "etcdclusters" && o.is_write())
        .filter(|o| {
            o.query_param("fieldManager")
                .is_some_and(|m| m.starts_with(etcdfleet_api::rollout::FIELD_MANAGER_PREFIX))
        })
        .count();
    let rollout_calls = ops
        .iter()
        .filter(|o| o.resource == "etcdfleetrollouts")
        .count()
        + cluster_writes;
    let cluster_lists_or_watches = ops
        .iter()
        .filter(|o| o.resource == "etcdclusters" && (o.verb == "list" || o.verb == "watch"))
        .count();
    let metric = "etcdfleet_rollout_plan_duration_seconds";
    let plans = sample(controller, &format!("{metric}_count")).unwrap_or(0.0);
    let sum = sample(controller, &format!("{metric}_sum")).unwrap_or(0.0);
    Ok(RolloutCost {
        waves: ROLLOUT_WAVES,
        clusters_changed: status
            .clusters
            .iter()
            .filter(|c| c.changed_at.is_some())
            .count(),
        took,
        plan_mean_ms: if plans > 0.0 {
            sum / plans * 1000.0
        } else {
            0.0
        },
        plan_max_ms: histogram_max(controller, metric).unwrap_or(f64::NAN) * 1000.0,
        plans: plans as u64,
        rollout_calls,
        cluster_writes,
        cluster_lists_or_watches,
    })
}
