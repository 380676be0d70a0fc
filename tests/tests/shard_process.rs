//! Sharded mode (docs/sharding.md) with `etcdfleet run` processes on the
//! in-memory management API server and real etcd clusters: the replicas
//! share the fleet as the hash says, a killed replica's clusters move to the
//! others within the documented bound, a joining replica takes its share,
//! no member is restarted by a move, and no cluster's objects are written
//! by one replica after another replica has written them (each cluster's
//! writers come one after the other, never back); and an EtcdFleetRollout
//! over clusters on every shard, whose leader (the replica that runs the
//! rollouts) is killed between two waves, completes on the new leader with
//! each cluster's spec changed once and each member restarted once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::rollout::{FIELD_MANAGER_PREFIX, phase, wave_state};
use etcdfleet_api::{EtcdCluster, EtcdFleetRollout, EtcdFleetRolloutStatus};
use etcdfleet_controllers::render::Names;
use etcdfleet_controllers::shard::SHARD_LABEL;
use etcdfleet_controllers::shard::assign::{cluster_key, owner};
use etcdfleet_controllers::shard::run::FIELD_MANAGER;
use etcdfleet_tests::apiserver::CONTROLLER_USER;
use etcdfleet_tests::controller_process::ControllerProcess;
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_both, require_etcd};
use etcdfleet_tests::fleet::{ApiOp, Fleet, MANAGEMENT};
use etcdfleet_tests::runtime::BackgroundSync;
use etcdfleet_tests::scenario::{NS, WORKLOAD_NS, cluster, create};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

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

/// [`CLUSTERS`] one-member clusters `c<i>` at `version` on workloads
/// `w<i>`, kubelets syncing in the background, and replicas r-0, r-1 and
/// r-2 that have shared them as the hash says.
struct Sharded {
    fleet: Fleet,
    replicas: BTreeMap<String, Replica>,
    _kubelets: Vec<BackgroundSync>,
}

async fn sharded_fleet(version: &str) -> Result<Sharded> {
    let workloads: Vec<String> = (0..CLUSTERS).map(|i| format!("w{i}")).collect();
    let names: Vec<&str> = workloads.iter().map(String::as_str).collect();
    let fleet = Fleet::new(&names).await?;
    let _kubelets = fleet.spawn_background_sync(Duration::from_millis(200));
    for (i, w) in workloads.iter().enumerate() {
        create(&fleet, &cluster(&format!("c{i}"), w, 1, version)).await?;
    }
    let mut replicas = BTreeMap::new();
    for shard in ["r-0", "r-1", "r-2"] {
        replicas.insert(shard.to_string(), start(&fleet, shard));
    }
    settled(&fleet, &["r-0", "r-1", "r-2"], Duration::from_secs(120))
        .await
        .with_context(|| logs(&replicas))?;
    Ok(Sharded {
        fleet,
        replicas,
        _kubelets,
    })
}

/// Every replica's log, for a failure's message.
fn logs(replicas: &BTreeMap<String, Replica>) -> String {
    replicas
        .iter()
        .map(|(s, r)| format!("--- {s}\n{}", r.process.log()))
        .collect::<Vec<_>>()
        .join("\n")
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
    // clusters of a shard whose Lease lapsed, after that shard stopped. Nor
    // is a rollout's write of a cluster's version (the leader's, under the
    // rollout's field manager): it is the cluster's owner that acts on it.
    for op in fleet
        .ops()
        .into_iter()
        .filter(|o| o.cluster == MANAGEMENT && o.is_write())
    {
        if is_move_or_rollout(&op) {
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

/// A write of a shard label (under the shard's field manager) or of a
/// cluster's version by a rollout (under the rollout's).
fn is_move_or_rollout(op: &ApiOp) -> bool {
    op.query_param("fieldManager")
        .is_some_and(|m| m == FIELD_MANAGER || m.starts_with(FIELD_MANAGER_PREFIX))
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
    let Sharded {
        fleet,
        mut replicas,
        _kubelets,
    } = sharded_fleet("3.5.1").await?;
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

/// The shard whose replica holds the leader Lease: the sharder, which also
/// runs the fleet's rollouts.
async fn leader(fleet: &Fleet) -> Result<String> {
    let leases: Api<Lease> = Api::namespaced(fleet.management_direct(), "etcdfleet-system");
    let lease = leases.get("etcdfleet-controller").await?;
    lease
        .spec
        .and_then(|s| s.holder_identity)
        .context("the leader Lease has no holder")
}

/// An EtcdFleetRollout of every cluster in [`NS`] to `version`: a canary,
/// then waves of two, each wave soaking 4 s.
async fn start_rollout(fleet: &Fleet, name: &str, version: &str) -> Result<()> {
    let rollout: EtcdFleetRollout = serde_json::from_value(serde_json::json!({
        "apiVersion": "etcdfleet.dev/v1alpha1", "kind": "EtcdFleetRollout",
        "metadata": {"name": name},
        "spec": {
            "selector": {"namespaces": [NS]},
            "version": version,
            "strategy": {"canary": 1, "waveSize": 2, "maxInFlight": 2, "soak": "4s",
                         "progressDeadline": "3m"},
        },
    }))?;
    let api: Api<EtcdFleetRollout> = Api::all(fleet.management_direct());
    api.create(&PostParams::default(), &rollout).await?;
    Ok(())
}

/// Waits until the rollout's status satisfies `done`; returns it.
async fn rollout_until(
    fleet: &Fleet,
    name: &str,
    within: Duration,
    done: impl Fn(&EtcdFleetRolloutStatus) -> bool,
) -> Result<EtcdFleetRolloutStatus> {
    let api: Api<EtcdFleetRollout> = Api::all(fleet.management_direct());
    let deadline = Instant::now() + within;
    loop {
        // No status yet: the leader has not planned the rollout.
        let status = api.get(name).await?.status;
        if let Some(status) = status.as_ref().filter(|s| done(s)) {
            return Ok(status.clone());
        }
        ensure!(
            Instant::now() < deadline,
            "rollout {name} after {within:?}: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Per workload cluster `w<i>`, how many member pods the controllers
/// deleted (a roll's restart of a member).
fn pod_deletes(fleet: &Fleet) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = (0..CLUSTERS).map(|i| (format!("w{i}"), 0)).collect();
    for op in fleet.ops() {
        let delete = op.verb == "delete" && op.resource == "pods" && !op.rejected;
        if let (true, Some(n)) = (delete, out.get_mut(&op.cluster)) {
            *n += 1;
        }
    }
    out
}

/// The shard labels the clusters carry.
async fn shards_in_use(fleet: &Fleet) -> Result<BTreeSet<String>> {
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    let clusters = api.list(&ListParams::default()).await?.items;
    (clusters.iter())
        .map(|c| c.labels().get(SHARD_LABEL).cloned())
        .collect::<Option<_>>()
        .context("a cluster without a shard label")
}

/// The replicas that wrote the rollout's status, in order, each run of one
/// replica counted once.
fn rollout_status_writers(
    fleet: &Fleet,
    replicas: &BTreeMap<String, Replica>,
    rollout: &str,
) -> Vec<String> {
    let mut runs: Vec<String> = Vec::new();
    for op in fleet.ops() {
        let status = op.cluster == MANAGEMENT
            && op.is_write()
            && !op.rejected
            && op.resource == "etcdfleetrollouts"
            && op.verb.ends_with("_status")
            && op.name.as_deref() == Some(rollout);
        let shard = (replicas.iter())
            .find(|(_, r)| op.token.as_deref() == Some(r.token.as_str()))
            .map(|(s, _)| s.clone());
        if let (true, Some(shard)) = (status, shard)
            && runs.last() != Some(&shard)
        {
            runs.push(shard);
        }
    }
    runs
}

/// Each cluster's `metadata.generation` (bumped by every accepted change
/// of its spec).
async fn generations(fleet: &Fleet) -> Result<BTreeMap<String, i64>> {
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    (api.list(&ListParams::default()).await?.items.iter())
        .map(|c| {
            Ok((
                c.name_any(),
                c.metadata.generation.context("no generation")?,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shard_replicas_carry_a_fleet_rollout_through_the_loss_of_the_leader_between_waves()
-> Result<()> {
    let Some((from, to)) = require_both(EtcdVersion::V3_5, EtcdVersion::V3_5Old) else {
        return Ok(());
    };
    let Sharded {
        fleet,
        mut replicas,
        _kubelets,
    } = sharded_fleet(&from.release).await?;
    let before = member_pods(&fleet).await?;
    let generations_before = generations(&fleet).await?;
    let shards = shards_in_use(&fleet).await?;
    ensure!(shards.len() >= 2, "the clusters sit on {shards:?} only");
    start_rollout(&fleet, "to-new", &to.release).await?;

    // Between waves: the canary converged and soaks; the leader dies.
    let soaking = rollout_until(&fleet, "to-new", Duration::from_secs(90), |s| {
        s.waves
            .first()
            .is_some_and(|w| w.state == wave_state::SOAKING)
    })
    .await
    .with_context(|| logs(&replicas))?;
    ensure!(
        soaking
            .waves
            .iter()
            .skip(1)
            .all(|w| w.state == wave_state::PENDING),
        "a later wave started before the canary's soak ended: {soaking:#?}"
    );
    let dead_shard = leader(&fleet).await?;
    let dead = replicas
        .remove(&dead_shard)
        .context("the leader's replica")?;
    dead.process.signal(libc::SIGKILL);
    let killed = Instant::now();
    let live: Vec<&str> = replicas.keys().map(String::as_str).collect();

    let done = rollout_until(&fleet, "to-new", Duration::from_secs(180), |s| {
        s.phase.as_deref() == Some(phase::COMPLETE)
    })
    .await
    .with_context(|| logs(&replicas))?;
    let new_leader = leader(&fleet).await?;
    eprintln!(
        "clusters on {shards:?}; leader {dead_shard} killed while the canary soaked; \
         complete {:?} later under {new_leader}",
        killed.elapsed()
    );
    ensure!(
        new_leader != dead_shard && live.contains(&new_leader.as_str()),
        "the leader after the kill: {new_leader}"
    );
    settled(&fleet, &live, TAKEOVER * 2)
        .await
        .with_context(|| logs(&replicas))?;
    ensure!(
        done.waves.len() == 4 && done.waves.iter().all(|w| w.state == wave_state::DONE),
        "{done:#?}"
    );
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    for c in api.list(&ListParams::default()).await?.items {
        let current = c.status.as_ref().and_then(|s| s.current_version.clone());
        ensure!(
            current.as_deref() == Some(to.release.as_str()),
            "{} runs {current:?}",
            c.name_any()
        );
    }
    // No step repeated across the leader's loss: each cluster's spec was
    // changed once (the rollout's apply carries the resourceVersion it
    // read, so a request answered 409 is sent again on a fresh read; the
    // recorder logs requests, not answers: the generation counts what was
    // accepted), and each member restarted once.
    let after_generations = generations(&fleet).await?;
    let changed: BTreeMap<String, i64> = (after_generations.iter())
        .map(|(c, g)| (c.clone(), g - generations_before[c]))
        .collect();
    let once: BTreeMap<String, i64> = (0..CLUSTERS).map(|i| (format!("c{i}"), 1)).collect();
    ensure!(changed == once, "spec changes by cluster: {changed:?}");
    let restarts = pod_deletes(&fleet);
    ensure!(
        restarts.values().all(|n| *n == 1),
        "member pods deleted: {restarts:?}"
    );
    let after = member_pods(&fleet).await?;
    ensure!(
        before.iter().all(|(c, uid)| after.get(c) != Some(uid)),
        "a member kept its pod: {before:?} -> {after:?}"
    );
    replicas.insert(dead_shard.clone(), dead);
    // The rollout's status was carried by the old leader, then the new.
    let status_writers = rollout_status_writers(&fleet, &replicas, "to-new");
    ensure!(
        status_writers == [dead_shard, new_leader],
        "the rollout's status written by {status_writers:?}"
    );
    no_writer_came_back(&writers(&fleet, &replicas))
}
