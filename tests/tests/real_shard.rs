//! Sharded mode (docs/sharding.md) on a real management API server: three
//! `etcdfleet run` replicas share four three-member real-etcd clusters (the
//! workload clusters are the in-memory API servers), each cluster with a
//! writer. All clusters roll 3.4 → 3.5; a replica that owns a cluster in
//! the middle of its roll is killed. Its clusters move within the
//! documented bound, the roll finishes with every member restarted exactly
//! once (no step repeated by the new owner), no acknowledged write is
//! lost, and the API server's audit log shows no two replicas writing one
//! cluster's objects in overlapping windows. Then a fourth replica joins:
//! it gets its share, and no member restarts for it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::etcd::EtcdConfig;
use etcdfleet_controllers::shard::SHARD_LABEL;
use etcdfleet_controllers::shard::assign::{cluster_key, owner};
use etcdfleet_controllers::shard::run::FIELD_MANAGER;
use etcdfleet_tests::control_plane::{RealManagement, require_kubernetes};
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::etcd_harness::{AckedWriter, EtcdVersion, require_etcd, verify_acknowledged};
use etcdfleet_tests::fleet::{Fleet, MANAGEMENT};
use etcdfleet_tests::runtime::ImageTable;
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, create, etcd_of, patch_spec};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

const LEASE_S: u64 = 4;
/// The documented bound (lease + two rounds of 2 s), and slack for two
/// cores carrying twelve etcd members, four controllers and the API server.
const TAKEOVER: Duration = Duration::from_secs(LEASE_S + 4 + 6);
const CLUSTERS: usize = 4;

struct Replica {
    process: ControllerProcess,
    /// The audit log's user name of this replica.
    user: String,
}

async fn start(management: &RealManagement, shard: &str) -> Result<Replica> {
    let (kubeconfig, user) = management
        .controller_identity(&format!("etcdfleet-{shard}"))
        .await?;
    let lease = LEASE_S.to_string();
    let args = [
        "--leader-elect",
        "true",
        "--lease-duration-seconds",
        lease.as_str(),
        "--sharding",
        "true",
        "--shard-name",
        shard,
    ];
    Ok(Replica {
        process: ControllerProcess::start(shard, &kubeconfig, &args),
        user,
    })
}

fn names() -> Vec<(String, String)> {
    (0..CLUSTERS)
        .map(|i| (format!("c{i}"), format!("w{i}")))
        .collect()
}

/// Every cluster labelled as the hash says among `live`, `members` ready,
/// at `version` when given.
async fn settled(
    fleet: &Fleet,
    live: &[&str],
    version: Option<&str>,
    within: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    loop {
        let clusters = api.list(&ListParams::default()).await?.items;
        let wrong: Vec<String> = clusters
            .iter()
            .filter(|c| {
                let key = cluster_key(NS, &c.name_any());
                let status = c.status.clone().unwrap_or_default();
                c.labels().get(SHARD_LABEL).map(String::as_str) != owner(&key, live)
                    || status.ready_members != 3
                    || version.is_some_and(|v| status.current_version.as_deref() != Some(v))
            })
            .map(|c| format!("{} {:?}", c.name_any(), c.labels().get(SHARD_LABEL)))
            .collect();
        if clusters.len() == CLUSTERS && wrong.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!("not settled among {live:?} after {within:?}: {wrong:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Member pods deleted by the controller (a restart), by `<workload>/<pod>`.
fn pod_deletes(fleet: &Fleet) -> BTreeMap<String, usize> {
    let mut deletes = BTreeMap::new();
    for op in fleet.ops() {
        if op.cluster != MANAGEMENT && op.resource == "pods" && op.verb == "delete" {
            let pod = op.name.clone().unwrap_or_default();
            *deletes.entry(format!("{}/{pod}", op.cluster)).or_insert(0) += 1;
        }
    }
    deletes
}

/// A cluster owned by `shard` whose members run two versions: mid-roll.
async fn mid_roll(fleet: &Fleet, shard: &str) -> Result<Option<String>> {
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    for (name, workload) in names() {
        let c = api.get(&name).await?;
        if c.labels().get(SHARD_LABEL).map(String::as_str) != Some(shard) {
            continue;
        }
        let pods: Api<Pod> = Api::namespaced(fleet.workload_client(&workload), WORKLOAD_NS);
        let images: std::collections::BTreeSet<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|p| p.spec?.containers.first()?.image.clone())
            .collect();
        if images.len() > 1 {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// One replica's writes to one cluster's objects: the replica, its first
/// write's arrival and its last write's answer (RFC 3339, microseconds).
type Window = (String, String, String);

/// For each cluster, each replica's first and last write to its objects
/// (the EtcdCluster, its status, its Secrets `<cluster>-etcd-*`), from the
/// audit log; the windows of different replicas must not overlap.
fn write_windows(
    management: &RealManagement,
    replicas: &BTreeMap<String, Replica>,
) -> Result<BTreeMap<String, Vec<Window>>> {
    let audit = management.audit()?;
    let users: BTreeMap<&str, &str> = replicas
        .iter()
        .map(|(s, r)| (r.user.as_str(), s.as_str()))
        .collect();
    let mut windows: BTreeMap<String, BTreeMap<String, (String, String)>> = BTreeMap::new();
    // Shard label moves (the sharder moves a lapsed shard's clusters after
    // it stopped) are not work on the cluster.
    let moves = format!("fieldManager={FIELD_MANAGER}");
    let writes = audit
        .events
        .iter()
        .filter(|e| e.is_write() && e.code() < 400 && !e.request_uri.contains(&moves));
    for e in writes {
        let Some(shard) = users.get(e.user.username.as_str()) else {
            continue;
        };
        let Some(object) = &e.object_ref else {
            continue;
        };
        let cluster = match (object.resource.as_str(), object.name.split_once("-etcd-")) {
            ("etcdclusters", _) => object.name.clone(),
            ("secrets", Some((cluster, _))) => cluster.to_string(),
            _ => continue,
        };
        let at = e.request_received_timestamp.clone();
        let end = e.stage_timestamp.clone();
        let w = windows.entry(cluster).or_default();
        let entry = w
            .entry(shard.to_string())
            .or_insert((at.clone(), end.clone()));
        entry.0 = entry.0.clone().min(at);
        entry.1 = entry.1.clone().max(end);
    }
    let mut out = BTreeMap::new();
    for (cluster, by_shard) in windows {
        let mut list: Vec<Window> = by_shard.into_iter().map(|(s, (a, b))| (s, a, b)).collect();
        list.sort_by(|x, y| x.1.cmp(&y.1));
        for pair in list.windows(2) {
            ensure!(
                pair[0].2 < pair[1].1,
                "{cluster}: {} wrote until {} after {} began at {}",
                pair[0].0,
                pair[0].2,
                pair[1].0,
                pair[1].1
            );
        }
        out.insert(cluster, list);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_shard_takeover_mid_roll_loses_no_write_and_a_joining_replica_restarts_nothing()
-> Result<()> {
    let Some(binaries) = require_kubernetes() else {
        return Ok(());
    };
    if require_etcd(EtcdVersion::V3_4).is_none() || require_etcd(EtcdVersion::V3_5).is_none() {
        return Ok(());
    }
    let management = RealManagement::start(binaries).await?;
    let admin = management.admin_client().await?;
    let workloads: Vec<String> = names().into_iter().map(|(_, w)| w).collect();
    let refs: Vec<&str> = workloads.iter().map(String::as_str).collect();
    let fleet =
        Fleet::with_real_management(admin.clone(), admin, NS, &refs, ImageTable::installed())
            .await?;
    let _kubelets = fleet.spawn_background_sync(Duration::from_millis(250));
    for (name, workload) in names() {
        create(&fleet, &cluster(&name, &workload, 3, "3.4.23")).await?;
    }
    let mut replicas = BTreeMap::new();
    for shard in ["r-0", "r-1", "r-2"] {
        replicas.insert(shard.to_string(), start(&management, shard).await?);
    }
    let logs = |rs: &BTreeMap<String, Replica>| {
        rs.iter()
            .map(|(s, r)| format!("--- {s}\n{}", r.process.log()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    settled(
        &fleet,
        &["r-0", "r-1", "r-2"],
        Some("3.4.23"),
        Duration::from_secs(240),
    )
    .await
    .with_context(|| logs(&replicas))?;
    ensure!(
        names()
            .iter()
            .any(|(n, _)| owner(&cluster_key(NS, n), &["r-0", "r-1", "r-2"]) == Some("r-1")),
        "the hash gives r-1 none of the clusters: pick other names"
    );

    // A writer on every cluster, then the roll.
    let mut writers: Vec<(String, AckedWriter, Vec<String>, EtcdConfig)> = Vec::new();
    for (name, workload) in names() {
        let (endpoints, config) = etcd_of(&fleet, &workload, &name, 3).await?;
        let writer = AckedWriter::start(endpoints.clone(), config.clone(), "acked").await?;
        writers.push((name, writer, endpoints, config));
    }
    fleet.clear_ops();
    for (name, _) in names() {
        patch_spec(&fleet, &name, serde_json::json!({ "version": "3.5.1" })).await?;
    }

    // r-1 dies in the middle of one of its clusters' rolls.
    let deadline = Instant::now() + Duration::from_secs(180);
    let rolling = loop {
        if let Some(name) = mid_roll(&fleet, "r-1").await? {
            break name;
        }
        ensure!(
            Instant::now() < deadline,
            "r-1 never rolled a cluster:\n{}",
            logs(&replicas)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let killed = Instant::now();
    let dead = replicas.remove("r-1").context("r-1")?;
    dead.process.signal(libc::SIGKILL);
    // Moved as the hash says among the live ones, whatever their version.
    settled(&fleet, &["r-0", "r-2"], None, TAKEOVER * 3)
        .await
        .with_context(|| logs(&replicas))?;
    let took = killed.elapsed();
    eprintln!("killed r-1 while {rolling} rolled; its clusters moved in {took:?}");
    ensure!(
        took <= TAKEOVER,
        "takeover took {took:?} > {TAKEOVER:?}:\n{}",
        logs(&replicas)
    );
    settled(
        &fleet,
        &["r-0", "r-2"],
        Some("3.5.1"),
        Duration::from_secs(300),
    )
    .await
    .with_context(|| logs(&replicas))?;

    // Every member restarted exactly once: no step was repeated.
    let deletes = pod_deletes(&fleet);
    eprintln!("member restarts during the roll: {deletes:?}");
    ensure!(
        deletes.len() == CLUSTERS * 3,
        "not every member restarted: {deletes:?}"
    );
    ensure!(
        deletes.values().all(|n| *n == 1),
        "a member restarted twice: {deletes:?}"
    );
    for (name, writer, endpoints, config) in writers {
        let report = writer.stop().await?;
        let checked = verify_acknowledged(&report, &endpoints, &config, "acked").await?;
        eprintln!(
            "{name}: {checked} acknowledged writes verified ({} failed)",
            report.failed
        );
        ensure!(checked > 0, "{name}: no write was acknowledged");
    }

    // A fourth replica joins: it takes its share; nothing restarts.
    let joined = ["r-0", "r-2", "r-3"];
    ensure!(
        names()
            .iter()
            .any(|(n, _)| owner(&cluster_key(NS, n), &joined) == Some("r-3")),
        "the hash gives r-3 none of the clusters: pick other names"
    );
    fleet.clear_ops();
    replicas.insert("r-3".into(), start(&management, "r-3").await?);
    settled(&fleet, &joined, Some("3.5.1"), Duration::from_secs(60))
        .await
        .with_context(|| logs(&replicas))?;
    let restarted = pod_deletes(&fleet);
    ensure!(
        restarted.is_empty(),
        "members restarted by the rebalance: {restarted:?}"
    );

    replicas.insert("r-1".into(), dead);
    let windows = write_windows(&management, &replicas)?;
    eprintln!("write windows by cluster: {windows:#?}");
    Ok(())
}
