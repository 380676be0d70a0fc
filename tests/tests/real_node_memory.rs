//! Memory on real nodes: a member with the shipped `ha-3` template's
//! requests, limits and backend quota, written to until its backend holds
//! 80 % of that quota, under the real kubelet's cgroup limits.
//!
//! The values are 1 MiB each, as large as Kubernetes objects grow (Helm
//! release Secrets reach it): the member keeps every raft entry since its
//! last snapshot in memory, so its anonymous memory grows past the data its
//! backend holds. On etcd 3.5.35 that was 5.7 GiB for 3.2 GiB of data, above
//! the 4Gi limit `ha-3` first shipped: the template now limits memory to
//! twice its quota (`templates.rs` keeps every template so).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::ClusterEtcdTemplate;
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, MemberClient};
use etcdfleet_tests::apiserver::immutable::quantity_bytes;
use etcdfleet_tests::control_plane::KubeWorld;
use etcdfleet_tests::control_plane::scenario::{
    cluster_manifest, converge_real, etcd_of, in_real_world, member_pods, node_of,
    wait_ready_members,
};
use etcdfleet_tests::etcd_harness::{EtcdVersion, require_etcd};
use etcdfleet_tests::real_node::node::ContainerMemory;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// How full the backend gets, in percent of its quota.
const FILL_PERCENT: i64 = 80;

fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

/// A one-member cluster of the shipped `ha-3` template: its resources,
/// quota, version and raft settings, one member (one volume of data, not
/// three, for the same memory on each).
fn ha_3_cluster(name: &str) -> String {
    let spec = "  clusterRef: {name: w1}
  templateRef: {kind: ClusterEtcdTemplate, name: ha-3}
  replicas: 1
";
    cluster_manifest(name, spec)
}

/// The status of `pod`'s etcd container.
fn etcd_status(pod: &Pod) -> Result<ContainerStatus> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone());
    (statuses.context("no container statuses")?.into_iter())
        .find(|c| c.name == "etcd")
        .context("no etcd container status")
}

/// The memory of the member container of `pod`, read on its node.
struct MemberMemory<'w> {
    world: &'w KubeWorld,
    node: String,
    container_id: String,
}

impl<'w> MemberMemory<'w> {
    fn of(world: &'w KubeWorld, pod: &Pod) -> Result<Self> {
        let id = etcd_status(pod)?
            .container_id
            .context("etcd container without an id")?;
        let container_id = (id.strip_prefix("containerd://"))
            .with_context(|| format!("not a containerd container: {id}"))?
            .to_string();
        Ok(MemberMemory {
            world,
            node: node_of(pod)?,
            container_id,
        })
    }

    fn now(&self) -> Result<ContainerMemory> {
        let real = self.world.workload("w1").nodes.real();
        let node = (real.nodes.iter())
            .find(|n| n.name() == self.node)
            .with_context(|| format!("no node {}", self.node))?;
        node.container_memory(&self.container_id)
            .with_context(|| format!("no memory cgroup for container {}", self.container_id))
    }
}

/// Puts keys `fill/<i>` of 1 MiB until the member's backend holds `target`
/// bytes; returns its size and the highest anonymous memory seen (sampled
/// every 32 puts).
async fn fill_to(
    endpoint: &str,
    config: &EtcdConfig,
    target: i64,
    memory: &MemberMemory<'_>,
) -> Result<(i64, u64)> {
    let endpoints = [endpoint.to_string()];
    let mut kv = ClusterClient::connect(&endpoints, config).await?.kv();
    let member = MemberClient::connect(endpoint, config).await?;
    let value = vec![b'x'; 1 << 20];
    let mut peak = 0;
    for i in 0u64.. {
        let put = kv.put(format!("fill/{i:05}"), value.clone(), None);
        let done = tokio::time::timeout(Duration::from_secs(10), put).await;
        done.with_context(|| format!("put {i} of 1 MiB timed out"))?
            .with_context(|| format!("put {i} of 1 MiB"))?;
        if i % 32 == 31 {
            peak = peak.max(memory.now()?.anonymous);
            let size = member.status().await?.db_size;
            if size >= target {
                return Ok((size, peak));
            }
        }
    }
    bail!("more than 2^64 puts")
}

/// The member's container states once its kubelet had time to see an end
/// (an OOM kill shows as `lastState.terminated.reason: OOMKilled`).
async fn what_the_member_says(world: &KubeWorld) -> Result<String> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pod = member_pods(world, "shop").await?.remove(&0);
    let statuses = pod
        .and_then(|p| p.status)
        .and_then(|s| s.container_statuses);
    Ok(format!("member 0's containers: {statuses:?}"))
}

#[test]
fn real_node_member_filled_to_80_percent_of_its_quota_under_the_shipped_ha_3_limits_is_not_oom_killed()
 {
    in_real_world(async |world| {
        let text = std::fs::read_to_string(repo_path("templates/ha-3.yaml"))?;
        let template: ClusterEtcdTemplate = etcdfleet_api::yaml::from_str(&text)?;
        let shipped = template
            .spec
            .config
            .version
            .clone()
            .context("ha-3 has no version")?;
        let tested = require_etcd(EtcdVersion::V3_5Latest).context("etcd 3.5")?;
        ensure!(
            shipped == tested.release,
            "ha-3 ships {shipped}, the nodes hold {}",
            tested.release
        );
        let quota = (template.spec.config.etcd.as_ref())
            .and_then(|e| e.quota_backend_bytes)
            .context("ha-3 sets no quota")?;
        world.apply(&text)?;
        let mut ctl = world.controller().await?;
        world.apply(&ha_3_cluster("shop"))?;
        converge_real(&mut ctl, &["shop"]).await?;
        wait_ready_members(world, "shop", 1)?;
        let before = member_pods(world, "shop")
            .await?
            .remove(&0)
            .context("no member 0")?;
        let limit = (before.spec.as_ref())
            .and_then(|s| s.containers.iter().find(|c| c.name == "etcd"))
            .and_then(|c| {
                c.resources
                    .as_ref()?
                    .limits
                    .as_ref()?
                    .get("memory")
                    .cloned()
            })
            .context("the member has no memory limit")?;
        let template_limit = (template.spec.config.resources.as_ref())
            .and_then(|r| r.limits.as_ref()?.get("memory").cloned());
        ensure!(
            Some(&limit) == template_limit.as_ref(),
            "pod limit {limit:?}, template {template_limit:?}"
        );
        let memory = MemberMemory::of(world, &before)?;
        let (endpoints, config) = etcd_of(world, "w1", "shop", 1).await?;
        let target = quota * FILL_PERCENT / 100;
        let started = Instant::now();
        let filled = fill_to(&endpoints[0], &config, target, &memory).await;
        let (size, peak) = match filled {
            Ok(filled) => filled,
            Err(e) => bail!("{e:#}\n{}", what_the_member_says(world).await?),
        };
        let filled_in = started.elapsed();
        let after = memory.now()?;
        eprintln!(
            "real-node memory: backend {} MiB of a {} MiB quota in {:.1} s, \
             peak anonymous memory {} MiB under a {} limit, {} OOM kills",
            size >> 20,
            quota >> 20,
            filled_in.as_secs_f64(),
            peak >> 20,
            limit.0,
            after.oom_kills
        );
        // The load is the one the limit must hold: the member kept its data
        // in memory, more than the backend held.
        ensure!(
            peak as i64 >= target,
            "peak anonymous memory {peak} below the data {target}"
        );
        let limit_bytes = quantity_bytes(&limit.0).context("limit quantity")?;
        ensure!(
            (peak as f64) < limit_bytes,
            "peak {peak} reached the limit {limit_bytes}"
        );
        ensure!(after.oom_kills == 0, "the member was OOM-killed: {after:?}");
        let alarms = ClusterClient::connect(&endpoints, &config)
            .await?
            .alarms()
            .await?;
        ensure!(
            alarms.is_empty(),
            "alarms at {FILL_PERCENT} % of the quota: {alarms:?}"
        );
        let now = member_pods(world, "shop")
            .await?
            .remove(&0)
            .context("member 0 is gone")?;
        ensure!(
            now.metadata.uid == before.metadata.uid,
            "the member's pod was replaced"
        );
        let etcd = etcd_status(&now)?;
        ensure!(
            etcd.restart_count == 0 && etcd.last_state.and_then(|s| s.terminated).is_none(),
            "the member restarted: {:?}",
            now.status
        );
        Ok(())
    });
}
