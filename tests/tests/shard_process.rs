//! Sharded mode (docs/sharding.md) with `etcdfleet run` processes on the
//! in-memory management API server and real etcd clusters: the replicas
//! share the fleet as the hash says, a killed replica's clusters move to the
//! others within the documented bound, a joining replica takes its share,
//! no member is restarted by a move, and no cluster's objects are written
//! by one replica after another replica has written them (each cluster's
//! writers come one after the other, never back).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::render::Names;
use etcdfleet_controllers::shard::SHARD_LABEL;
use etcdfleet_controllers::shard::assign::{cluster_key, owner};
use etcdfleet_controllers::shard::run::FIELD_MANAGER;
use etcdfleet_tests::apiserver::CONTROLLER_USER;
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::fleet::{Fleet, MANAGEMENT};
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, create};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

/// The shard Leases' duration in this test (production: 15 s).
const LEASE_S: u64 = 3;
/// The documented takeover bound: the lease duration and two rounds of
/// 2 s after the last renewal; plus slack for a loaded machine.
const TAKEOVER: Duration = Duration::from_secs(LEASE_S + 4 + 4);
const CLUSTERS: usize = 6;

struct Replica {
    process: ControllerProcess,
    token: String,
}

fn start(fleet: &Fleet, shard: &str) -> Replica {
    let token = fleet.management_api().issue_token(CONTROLLER_USER);
    let kubeconfig = fleet.management_api().kubeconfig(&token);
    let lease = LEASE_S.to_string();
    let args = [
        "--leader-elect",
        "true",
        "--lease-namespace",
        "etcdfleet-system",
        "--lease-duration-seconds",
        lease.as_str(),
        "--sharding",
        "true",
        "--shard-name",
        shard,
    ];
    Replica {
        process: ControllerProcess::start(shard, &kubeconfig, &args),
        token,
    }
}

fn available(c: &EtcdCluster) -> bool {
    c.status.as_ref().is_some_and(|s| {
        s.ready_members == 1
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
    })
}

/// Waits until every cluster carries the label the hash gives it among
/// `live` and is Available; returns how long that took.
async fn settled(fleet: &Fleet, live: &[&str], within: Duration) -> Result<Duration> {
    let started = Instant::now();
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    loop {
        let clusters = api.list(&ListParams::default()).await?.items;
        let wrong: Vec<String> = clusters
            .iter()
            .filter(|c| {
                let key = cluster_key(NS, &c.name_any());
                c.labels().get(SHARD_LABEL).map(String::as_str) != owner(&key, live)
                    || !available(c)
            })
            .map(|c| format!("{} ({:?})", c.name_any(), c.labels().get(SHARD_LABEL)))
            .collect();
        if clusters.len() == CLUSTERS && wrong.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!("after {within:?} among {live:?}, not settled: {wrong:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each member pod's uid, by cluster.
async fn member_pods(fleet: &Fleet) -> Result<BTreeMap<String, String>> {
    let mut uids = BTreeMap::new();
    for i in 0..CLUSTERS {
        let name = format!("c{i}");
        let pods: Api<Pod> = Api::namespaced(fleet.workload_client(&format!("w{i}")), WORKLOAD_NS);
        let pod = pods.get(&Names::new(&name, WORKLOAD_NS).pod(0)).await?;
        uids.insert(name, pod.uid().context("a pod without uid")?);
    }
    Ok(uids)
}

/// For each cluster, the replicas (by token) that wrote its objects on
/// the management API, in order, each run of one replica counted once.
fn writers(fleet: &Fleet, replicas: &BTreeMap<String, Replica>) -> BTreeMap<String, Vec<String>> {
    let by_token: BTreeMap<&str, &str> = replicas
        .iter()
        .map(|(shard, r)| (r.token.as_str(), shard.as_str()))
        .collect();
    let mut runs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // A shard label's move (the sharder's or the owner's, under its own
    // field manager) is not work on the cluster: the sharder moves the
    // clusters of a shard whose Lease lapsed, after that shard stopped.
    let moves = Some(FIELD_MANAGER.to_string());
    for op in fleet
        .ops()
        .into_iter()
        .filter(|o| o.cluster == MANAGEMENT && o.is_write())
    {
        if is_move(&op, &moves) {
            continue;
        }
        let Some(shard) = op.token.as_deref().and_then(|t| by_token.get(t)) else {
            continue;
        };
        let Some(name) = op.name.as_deref() else {
            continue;
        };
        // The cluster itself, its PKI Secret (`<cluster>-etcd-pki`).
        let cluster = match (op.resource.as_str(), name.split_once("-etcd-")) {
            ("etcdclusters", _) => name.to_string(),
            ("secrets", Some((cluster, _))) => cluster.to_string(),
            _ => continue,
        };
        let run = runs.entry(cluster).or_default();
        if run.last().map(String::as_str) != Some(*shard) {
            run.push(shard.to_string());
        }
    }
    runs
}

/// A write of a shard label (under the shard's field manager).
fn is_move(op: &etcdfleet_tests::fleet::ApiOp, moves: &Option<String>) -> bool {
    op.query_param("fieldManager") == *moves
}

/// No cluster written by a replica after another replica wrote it, then
/// by the first again (owners only ever change forward here: a shard
/// that leaves gives its clusters away, one that joins only takes).
fn no_writer_came_back(runs: &BTreeMap<String, Vec<String>>) -> Result<()> {
    for (cluster, run) in runs {
        let distinct: BTreeSet<&String> = run.iter().collect();
        ensure!(
            distinct.len() == run.len(),
            "{cluster} was written by {run:?}: a replica wrote it again after another"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shard_replicas_share_the_fleet_take_over_a_killed_one_and_give_a_new_one_its_share()
-> Result<()> {
    if require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let workloads: Vec<String> = (0..CLUSTERS).map(|i| format!("w{i}")).collect();
    let names: Vec<&str> = workloads.iter().map(String::as_str).collect();
    let fleet = Fleet::new(&names).await?;
    let _kubelets = fleet.spawn_background_sync(Duration::from_millis(200));
    for (i, w) in workloads.iter().enumerate() {
        create(&fleet, &cluster(&format!("c{i}"), w, 1, "3.5.1")).await?;
    }
    let mut replicas = BTreeMap::new();
    for shard in ["r-0", "r-1", "r-2"] {
        replicas.insert(shard.to_string(), start(&fleet, shard));
    }
    let took = settled(&fleet, &["r-0", "r-1", "r-2"], Duration::from_secs(120)).await;
    let logs = |rs: &BTreeMap<String, Replica>| {
        rs.iter()
            .map(|(s, r)| format!("--- {s}\n{}", r.process.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    took.with_context(|| logs(&replicas))?;
    let before = member_pods(&fleet).await?;

    // A replica dies without a word: its clusters move within the bound.
    let killed = Instant::now();
    let dead = replicas.remove("r-1").context("r-1")?;
    dead.process.signal(libc::SIGKILL);
    let moved = settled(&fleet, &["r-0", "r-2"], TAKEOVER * 2)
        .await
        .with_context(|| logs(&replicas))?;
    let took = killed.elapsed();
    eprintln!("takeover of a killed replica's clusters: {took:?} (settled check {moved:?})");
    ensure!(
        took <= TAKEOVER,
        "took {took:?} > {TAKEOVER:?}:\n{}",
        logs(&replicas)
    );

    // A replica joins: it gets its share, and no member restarts for it.
    replicas.insert("r-3".into(), start(&fleet, "r-3"));
    settled(&fleet, &["r-0", "r-2", "r-3"], Duration::from_secs(60))
        .await
        .with_context(|| logs(&replicas))?;
    let after = member_pods(&fleet).await?;
    ensure!(
        before == after,
        "members restarted: {before:?} -> {after:?}"
    );
    let gained = (0..CLUSTERS)
        .filter(|i| {
            owner(&cluster_key(NS, &format!("c{i}")), &["r-0", "r-2", "r-3"]) == Some("r-3")
        })
        .count();
    ensure!(
        gained > 0,
        "the hash gave r-3 nothing of {CLUSTERS}: pick other names"
    );

    replicas.insert("r-1".into(), dead);
    let runs = writers(&fleet, &replicas);
    eprintln!("writers by cluster: {runs:?}");
    no_writer_came_back(&runs)?;
    Ok(())
}
