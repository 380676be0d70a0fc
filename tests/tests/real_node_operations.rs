//! Operations on real nodes: what a platform team does to a cluster whose
//! members run under real kubelets and containerd, each test in a world of
//! its own (one workload plane, three Nodes).
//!
//! - Scale 1 → 3 → 5 → 3, then a Node stopped as a machine stops (kubelet,
//!   containerd and its containers killed): the member on it is replaced
//!   under the quorum guard, on another Node, keeping every key.
//! - A rolling upgrade 3.5 → 3.6 under a writer that follows the members'
//!   new pod IPs: no acknowledged write lost, every container started once.
//! - A defragmentation of members holding at least 256 MiB, with the
//!   shipped probes: no container restarted, no pod replaced.

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, MemberClient};
use etcdfleet_controllers::etcdcluster::plan::{RemovalCause, Step};
use etcdfleet_controllers::render::Names;
use etcdfleet_tests::control_plane::KubeWorld;
use etcdfleet_tests::control_plane::readiness::ReadySampler;
use etcdfleet_tests::control_plane::scenario::{
    NS, cluster_yaml, converge_real, etcd_of, in_real_world, member_pods, node_of, patch_spec, put,
    read_everywhere, wait_available, wait_ready_members,
};
use etcdfleet_tests::driver::{TestController, converge};
use etcdfleet_tests::etcd_harness::{
    EtcdVersion, FollowingWriter, require_both, require_etcd, verify_acknowledged,
};
use etcdfleet_tests::scenario::WORKLOAD_NS;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// Every container of `pod` runs in containerd and never restarted.
fn started_once(pod: &Pod) -> Result<()> {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone());
    let statuses = statuses.with_context(|| format!("{name}: no container statuses"))?;
    for c in statuses {
        let id = c.container_id.unwrap_or_default();
        ensure!(id.starts_with("containerd://"), "{name}/{}: {id:?}", c.name);
        ensure!(
            c.restart_count == 0,
            "{name}/{} restarted {} times (last state {:?})",
            c.name,
            c.restart_count,
            c.last_state
        );
    }
    Ok(())
}

/// Each container's restart count.
fn restarts(pod: &Pod) -> Vec<i32> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    statuses.map_or_else(Vec::new, |c| c.iter().map(|c| c.restart_count).collect())
}

async fn scale(world: &KubeWorld, ctl: &mut TestController, replicas: u32) -> Result<()> {
    patch_spec(world, "shop", json!({ "replicas": replicas }))?;
    converge_real(ctl, &["shop"]).await?;
    wait_ready_members(world, "shop", replicas)?;
    let pods = member_pods(world, "shop").await?;
    ensure!(
        pods.keys().copied().collect::<Vec<_>>() == (0..replicas).collect::<Vec<_>>(),
        "pods of ordinals {:?} for {replicas} members",
        pods.keys()
    );
    Ok(())
}

#[test]
fn real_node_scale_1_3_5_3_then_a_member_on_a_stopped_node_is_replaced_under_the_quorum_guard() {
    in_real_world(async |world| {
        let version = require_etcd(EtcdVersion::V3_5Latest)
            .context("etcd 3.5 (hack/upstream/etcd-3.5)")?
            .release;
        let mut ctl = world.controller().await?;
        world.apply(&cluster_yaml("shop", "w1", 1, &version))?;
        converge_real(&mut ctl, &["shop"]).await?;
        wait_available(world, "shop")?;
        put(world, "w1", "shop", 1, "before-scaling").await?;
        for replicas in [3, 5, 3] {
            scale(world, &mut ctl, replicas).await?;
        }
        read_everywhere(world, "w1", "shop", 3, "before-scaling").await?;
        replace_the_member_of_a_stopped_node(world, &mut ctl).await
    });
}

/// Stops a Node holding exactly one member; that member is removed (it, and
/// only it), its pod deleted without a grace period once no kubelet
/// confirms its end, and a new member joins on another Node.
async fn replace_the_member_of_a_stopped_node(
    world: &KubeWorld,
    ctl: &mut TestController,
) -> Result<()> {
    let pods = member_pods(world, "shop").await?;
    let nodes: Vec<String> = pods.values().map(node_of).collect::<Result<_>>()?;
    let (ordinal, node) = (pods.keys().zip(&nodes))
        .find(|(_, n)| nodes.iter().filter(|m| m == n).count() == 1)
        .map(|(o, n)| (*o, n.clone()))
        .with_context(|| format!("no Node holds exactly one member: {nodes:?}"))?;
    let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
    let members = ClusterClient::connect(&endpoints, &config)
        .await?
        .list_members()
        .await?;
    let names = Names::new("shop", WORKLOAD_NS);
    let lost = members
        .iter()
        .find(|m| m.name == names.pod(ordinal))
        .with_context(|| format!("no member named {}: {members:?}", names.pod(ordinal)))?
        .id;
    let real = world.workload("w1").nodes.real();
    let stopped = real
        .nodes
        .iter()
        .find(|n| n.name() == node)
        .context("node")?;
    stopped.stop().await;
    let started = std::time::Instant::now();
    // The node lifecycle controller marks the pod not ready once the Node's
    // kubelet has been silent 20 s: from then on no reconcile can find the
    // cluster whole.
    world.kubectl_workload(
        "w1",
        &[
            "wait",
            "-n",
            WORKLOAD_NS,
            "--for=condition=Ready=false",
            "--timeout=120s",
            &format!("pod/{}", names.pod(ordinal)),
        ],
    )?;
    let log = converge_real(ctl, &["shop"]).await?;
    wait_ready_members(world, "shop", 3)?;
    eprintln!(
        "member {} on stopped node {node} replaced in {:.1} s",
        names.pod(ordinal),
        started.elapsed().as_secs_f64()
    );
    let steps = log.steps_of(&format!("{NS}/shop"));
    let removed: Vec<(Option<u32>, u64, RemovalCause)> = (steps.iter())
        .filter_map(|s| match s {
            Step::RemoveMember {
                ordinal,
                member_id,
                cause,
            } => Some((*ordinal, *member_id, *cause)),
            _ => None,
        })
        .collect();
    ensure!(
        removed == vec![(Some(ordinal), lost, RemovalCause::Failed)],
        "removed {removed:?}, expected only {lost:x} (ordinal {ordinal}) as failed; steps {steps:?}"
    );
    ensure!(
        steps.iter().any(|s| matches!(
            s,
            Step::DeleteStaleStorage { ordinal: o, force_pod: true } if *o == ordinal
        )),
        "the stuck pod was never deleted without a grace period: {steps:?}"
    );
    let pods = member_pods(world, "shop").await?;
    let replaced = pods.get(&ordinal).context("no replacement pod")?;
    ensure!(
        node_of(replaced)? != node,
        "the replacement runs on the stopped node"
    );
    // A new member's first start may come before its own name resolves
    // (etcd exits and the kubelet starts it again): its restarts are not
    // asserted, only that it runs in containerd.
    let statuses = replaced
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone());
    let id = statuses.and_then(|c| c.first().and_then(|c| c.container_id.clone()));
    ensure!(
        id.as_deref()
            .is_some_and(|id| id.starts_with("containerd://")),
        "replacement container {id:?}"
    );
    read_everywhere(world, "w1", "shop", 3, "before-scaling").await?;
    let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
    let members = ClusterClient::connect(&endpoints, &config)
        .await?
        .list_members()
        .await?;
    ensure!(
        members.len() == 3 && members.iter().all(|m| m.id != lost && !m.is_learner),
        "members after the replacement: {members:?}"
    );
    Ok(())
}

#[test]
fn real_node_rolling_upgrade_keeps_all_members_but_one_ready_and_loses_no_acknowledged_write() {
    in_real_world(async |world| {
        let Some((old, new)) = require_both(EtcdVersion::V3_5Latest, EtcdVersion::V3_6) else {
            bail!("etcd 3.5 and 3.6 (hack/upstream) are needed");
        };
        let mut ctl = world.controller().await?;
        world.apply(&cluster_yaml("shop", "w1", 3, &old.release))?;
        converge_real(&mut ctl, &["shop"]).await?;
        wait_ready_members(world, "shop", 3)?;
        let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
        let writer = FollowingWriter::start(
            endpoints
                .iter()
                .map(|e| (e.clone(), config.clone()))
                .collect(),
            "upgrade",
        );
        let client = world.workload("w1").admin_client().await?;
        let sampler = ReadySampler::start(client, WORKLOAD_NS, "shop", 3).await?;
        patch_spec(world, "shop", json!({ "version": new.release }))?;
        let started = std::time::Instant::now();
        let follow = || async {
            // Recreated pods come back at new IPs: the writer is told, as
            // a client that resolves the members' names would learn.
            if let Ok((endpoints, config)) = etcd_of(world, "w1", "shop", 3).await {
                for e in endpoints {
                    writer.add(e, config.clone());
                }
            }
            Ok(())
        };
        let log = converge(
            &mut ctl,
            &[(NS, "shop")],
            Duration::from_secs(300),
            follow,
            |_, _, _| Ok(()),
        )
        .await?;
        let steps = log.steps_of(&format!("{NS}/shop"));
        let mut restarted: Vec<u32> = (steps.iter())
            .filter_map(|s| match s {
                Step::RestartMember { ordinal, .. } => Some(*ordinal),
                _ => None,
            })
            .collect();
        restarted.sort_unstable();
        ensure!(
            restarted == vec![0, 1, 2]
                && !steps.iter().any(|s| matches!(s, Step::RemoveMember { .. })),
            "each member restarted once in place, none replaced: {steps:?}"
        );
        wait_ready_members(world, "shop", 3)?;
        let took = started.elapsed();
        let sampled = sampler.stop().await?;
        ensure!(
            sampled.most.len() <= 1 && sampled.samples > 50,
            "members not Ready at once during the roll ({} samples), at {:?}: {:?}",
            sampled.samples,
            sampled.most_at,
            sampled.most
        );
        let report = writer.stop().await?;
        let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
        let checked = verify_acknowledged(&report, &endpoints, &config, "upgrade").await?;
        eprintln!(
            "real-node upgrade {} -> {}: {:.1} s, {checked} acknowledged writes verified, \
             {} failed, longest pause {:?}",
            old.release,
            new.release,
            took.as_secs_f64(),
            report.failed,
            report.longest_pause
        );
        ensure!(checked > 10, "the writer kept writing: {report:?}");
        for (o, pod) in member_pods(world, "shop").await? {
            let image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers[0].image.clone());
            ensure!(
                image == Some(format!("gcr.io/etcd-development/etcd:v{}", new.release)),
                "member {o} runs {image:?}"
            );
            started_once(&pod)?;
        }
        Ok(())
    });
}

/// Keys `fill/<i>` of 1 MiB each, enough for every member's database to
/// hold at least `bytes`.
async fn fill(endpoints: &[String], config: &EtcdConfig, bytes: i64) -> Result<()> {
    let mut kv = ClusterClient::connect(endpoints, config).await?.kv();
    let value = vec![b'x'; 1 << 20];
    for i in 0..(bytes >> 20) + 16 {
        let put = kv.put(format!("fill/{i:05}"), value.clone(), None);
        tokio::time::timeout(Duration::from_secs(10), put).await??;
    }
    Ok(())
}

/// (database size, of it in use) of each member, in `endpoints` order.
async fn db_sizes(endpoints: &[String], config: &EtcdConfig) -> Result<Vec<(i64, i64)>> {
    let mut sizes = Vec::new();
    for e in endpoints {
        let status = MemberClient::connect(e, config).await?.status().await?;
        sizes.push((status.db_size, status.db_size_in_use));
    }
    Ok(sizes)
}

/// Waits until every member has applied the compaction: at most a quarter
/// of each database is in use. A member counts its freed pages when its
/// backend next commits, which a cluster without writes never does: one
/// small write every half second keeps the cluster as alive as one that
/// serves an API server.
async fn wait_compacted(endpoints: &[String], config: &EtcdConfig) -> Result<Vec<(i64, i64)>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut kv = ClusterClient::connect(endpoints, config).await?.kv();
    loop {
        kv.put("tick", "alive", None).await?;
        let sizes = db_sizes(endpoints, config).await?;
        if sizes.iter().all(|(size, used)| used * 4 <= *size) {
            return Ok(sizes);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "not compacted after 60 s: {sizes:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn real_node_defragmentation_of_256_mib_members_under_the_shipped_probes_restarts_nothing() {
    in_real_world(async |world| {
        let version = require_etcd(EtcdVersion::V3_5Latest)
            .context("etcd 3.5 (hack/upstream/etcd-3.5)")?
            .release;
        let mut ctl = world.controller().await?;
        world.apply(&cluster_yaml("shop", "w1", 3, &version))?;
        converge_real(&mut ctl, &["shop"]).await?;
        wait_ready_members(world, "shop", 3)?;
        let before = member_pods(world, "shop").await?;
        let (endpoints, config) = etcd_of(world, "w1", "shop", 3).await?;
        fill(&endpoints, &config, 256 << 20).await?;
        let cluster = ClusterClient::connect(&endpoints, &config).await?;
        let mut kv = cluster.kv();
        let prefix = etcd_client::DeleteOptions::new().with_prefix();
        kv.delete("fill/", Some(prefix)).await?;
        cluster.compact_to_current().await?;
        let sizes = wait_compacted(&endpoints, &config).await?;
        let held = sizes.iter().map(|(size, _)| *size).min().unwrap_or(0);
        ensure!(
            held >= 256 << 20,
            "the smallest member holds {held} bytes: {sizes:?}"
        );
        let started = std::time::Instant::now();
        let log = converge_real(&mut ctl, &["shop"]).await?;
        let defragmented: Vec<u32> = (log.steps_of(&format!("{NS}/shop")).iter())
            .filter_map(|s| match s {
                Step::Defragment { ordinal, .. } => Some(*ordinal),
                _ => None,
            })
            .collect();
        let mut sorted = defragmented.clone();
        sorted.sort_unstable();
        ensure!(sorted == vec![0, 1, 2], "defragmented {defragmented:?}");
        for e in &endpoints {
            let status = MemberClient::connect(e, &config).await?.status().await?;
            ensure!(
                status.db_size < 64 << 20,
                "{e} still holds {} bytes",
                status.db_size
            );
        }
        eprintln!(
            "real-node defragmentation of 3 members of {} MiB: {:.1} s",
            held >> 20,
            started.elapsed().as_secs_f64()
        );
        // No container restarted while the members defragmented: a new
        // member's first start may have been restarted once before (its own
        // name not resolving yet), so the counts are compared, not zeroed.
        let after = member_pods(world, "shop").await?;
        for (o, pod) in &after {
            let earlier = before.get(o).context("a member the test did not see")?;
            ensure!(
                pod.metadata.uid == earlier.metadata.uid,
                "member {o}'s pod was replaced"
            );
            ensure!(
                restarts(pod) == restarts(earlier),
                "member {o} restarted during the defragmentation: {:?} -> {:?}",
                restarts(earlier),
                pod.status.as_ref().map(|s| &s.container_statuses)
            );
        }
        Ok(())
    });
}
