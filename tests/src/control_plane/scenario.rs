//! Building blocks of the `real_*` suites: EtcdClusters applied with kubectl,
//! the controller driven until converged, and etcd clients that reach the
//! members the way a test can on this machine (their pod IPs, the cluster's
//! own CA and the controller's client identity).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use etcdfleet_api::EtcdCluster;
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig as EtcdClientConfig, TlsMaterial};
use etcdfleet_controllers::etcdcluster::observe::read_pki;
use etcdfleet_controllers::render::Names;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::{KubeWorld, Nodes};
use crate::driver::{ConvergeLog, TestController, converge, fast_settings, no_hook};
use crate::scenario::WORKLOAD_NS;

/// Management namespace of the real suites.
pub const NS: &str = "team-a";
/// The stage label the shipped dev stage selects.
pub const STAGE_LABEL: &str = "etcdfleet.dev/stage";

/// An EtcdCluster manifest (fast raft timing, TLS on), as a user writes it.
pub fn cluster_yaml(name: &str, workload: &str, replicas: i32, version: &str) -> String {
    cluster_manifest(
        name,
        &format!(
            "  clusterRef:
    name: {workload}
  version: {version}
  replicas: {replicas}
  etcd:
    heartbeatIntervalMillis: 50
    electionTimeoutMillis: 500
"
        ),
    )
}

/// An EtcdCluster `name` in [`NS`], of the shipped dev stage, with `spec`
/// (YAML lines indented under `spec:`).
pub fn cluster_manifest(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: etcdfleet.dev/v1alpha1
kind: EtcdCluster
metadata:
  name: {name}
  namespace: {NS}
  labels:
    {STAGE_LABEL}: dev
spec:
{spec}"
    )
}

/// Reconciles `names` (in [`NS`]) until converged; the kubelets run in the
/// background, so nothing runs between rounds.
pub async fn converge_real(ctl: &mut TestController, names: &[&str]) -> Result<ConvergeLog> {
    let keys: Vec<(&str, &str)> = names.iter().map(|n| (NS, *n)).collect();
    converge(
        ctl,
        &keys,
        Duration::from_secs(240),
        || async { Ok(()) },
        no_hook,
    )
    .await
}

pub async fn get(world: &KubeWorld, name: &str) -> Result<EtcdCluster> {
    let api: Api<EtcdCluster> = Api::namespaced(world.management.admin_client().await?, NS);
    Ok(api.get(name).await?)
}

/// `kubectl wait --for=condition=Available etcdcluster/<name>`.
pub fn wait_available(world: &KubeWorld, name: &str) -> Result<String> {
    world.kubectl(&[
        "wait",
        "--for=condition=Available",
        "--timeout=120s",
        "-n",
        NS,
        &format!("etcdcluster/{name}"),
    ])
}

/// `kubectl wait` until the status counts `members` ready members (a new
/// cluster is Available with its first member, before it has grown).
pub fn wait_ready_members(world: &KubeWorld, name: &str, members: u32) -> Result<String> {
    world.kubectl(&[
        "wait",
        &format!("--for=jsonpath={{.status.readyMembers}}={members}"),
        "--timeout=180s",
        "-n",
        NS,
        &format!("etcdcluster/{name}"),
    ])
}

/// Client URLs (pod IPs) of members `0..members` and the controller's
/// client configuration for the cluster.
pub async fn etcd_of(
    world: &KubeWorld,
    workload: &str,
    name: &str,
    members: u32,
) -> Result<(Vec<String>, EtcdClientConfig)> {
    let names = Names::new(name, WORKLOAD_NS);
    // Only its namespace is read: no GET at this build's API version, which
    // an older release's CRDs do not serve.
    let mut cluster = EtcdCluster::new(name, Default::default());
    cluster.metadata.namespace = Some(NS.into());
    let pki = read_pki(&world.management.admin_client().await?, &cluster, &names)
        .await?
        .context("no PKI secret")?;
    let endpoints = member_ips(world, workload, &names, members)
        .await?
        .into_iter()
        .map(|ip| format!("https://{ip}:2379"))
        .collect();
    let config = EtcdClientConfig {
        tls: Some(TlsMaterial {
            // Every CA trusted now (two while a CA rotation is under way).
            ca_pem: pki.trust_bundle(),
            client_cert_pem: Some(pki.client_cert_pem.clone()),
            client_key_pem: Some(pki.client_key_pem.clone()),
            server_name: Some(names.client_service_host()),
        }),
        deadlines: fast_settings().etcd_deadlines,
        transport: None,
    };
    Ok((endpoints, config))
}

/// The pod IPs of members `0..members`: from the process kubelet, or the
/// pods' status on real nodes (whose pod network the test shares).
async fn member_ips(
    world: &KubeWorld,
    workload: &str,
    names: &Names,
    members: u32,
) -> Result<Vec<String>> {
    let mut ips = Vec::new();
    for o in 0..members {
        ips.push(member_ip(world, workload, names, o).await?);
    }
    Ok(ips)
}

/// The client URL (pod IP) member `ordinal` of `name` has now.
pub async fn member_endpoint(
    world: &KubeWorld,
    workload: &str,
    name: &str,
    ordinal: u32,
) -> Result<String> {
    let names = Names::new(name, WORKLOAD_NS);
    let ip = member_ip(world, workload, &names, ordinal).await?;
    Ok(format!("https://{ip}:2379"))
}

/// The pod IP of member `ordinal`.
async fn member_ip(
    world: &KubeWorld,
    workload: &str,
    names: &Names,
    ordinal: u32,
) -> Result<String> {
    let plane = world.workload(workload);
    let pod = names.pod(ordinal);
    let ip = match &plane.nodes {
        Nodes::Process(kubelet) => kubelet
            .runtime
            .pod_ip(WORKLOAD_NS, &pod)
            .map(|ip| ip.to_string()),
        Nodes::Real(_) => {
            let pods: Api<Pod> = Api::namespaced(plane.admin_client().await?, WORKLOAD_NS);
            published_ip(&pods, &pod).await?
        }
    };
    ip.with_context(|| format!("{pod} has no IP"))
}

/// A real kubelet posts a pod's IP in a status update of its own, after the
/// container runs: etcd can already answer through port-forward (and the
/// cluster be Available) while `status.podIP` is still empty. Waits up to
/// 30 s for it (seen: kubelet 1.35.4, right after Available).
async fn published_ip(pods: &Api<Pod>, pod: &str) -> Result<Option<String>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ip = pods.get(pod).await?.status.and_then(|s| s.pod_ip);
        if ip.is_some() || Instant::now() > deadline {
            return Ok(ip);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn put(
    world: &KubeWorld,
    workload: &str,
    name: &str,
    members: u32,
    key: &str,
) -> Result<()> {
    let (endpoints, config) = etcd_of(world, workload, name, members).await?;
    let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
    tokio::time::timeout(Duration::from_secs(5), kv.put(key, "v", None)).await??;
    Ok(())
}

/// Reads `key` from every member on its own (serializable reads), each
/// waited for ([`crate::etcd_harness::get_from_member`]): `Available` counts
/// a quorum, not every member.
pub async fn read_everywhere(
    world: &KubeWorld,
    workload: &str,
    name: &str,
    members: u32,
    key: &str,
) -> Result<()> {
    let (_, config) = etcd_of(world, workload, name, 0).await?;
    let names = Names::new(name, WORKLOAD_NS);
    for o in 0..members {
        let endpoint = || async {
            let ip = member_ip(world, workload, &names, o).await?;
            Ok(format!("https://{ip}:2379"))
        };
        let read = (key, etcd_client::GetOptions::new());
        let bound = crate::etcd_harness::MEMBER_ANSWER_BOUND;
        let resp =
            crate::etcd_harness::get_from_member(&names.pod(o), endpoint, &config, read, bound)
                .await?;
        ensure!(resp.kvs().len() == 1, "{key} missing on {}", names.pod(o));
    }
    Ok(())
}

/// A world with `workloads`, the dev stage installed, the workload RBAC
/// applied and the kubeconfig Secrets in [`NS`], whose controller is the
/// test's own ([`KubeWorld::controller`] or an `etcdfleet run` process): the
/// installed Deployment is scaled to zero so no second controller acts.
/// `None` (after a loud SKIPPED line) without the Kubernetes binaries.
pub async fn installed_world(workloads: &[&str]) -> Result<Option<KubeWorld>> {
    let Some(world) = installed_world_running(workloads).await? else {
        return Ok(None);
    };
    stop_installed_controller(&world)?;
    Ok(Some(world))
}

/// Scales the installed controller Deployment to zero and waits until its
/// pod is gone, so the test's own controller is the only one acting.
pub fn stop_installed_controller(world: &KubeWorld) -> Result<()> {
    world.kubectl(&[
        "scale",
        "-n",
        super::world::CONTROLLER_NAMESPACE,
        "deployment/etcdfleet-controller",
        "--replicas=0",
    ])?;
    // Its pod may have started already: gone before the test acts.
    world.kubectl(&[
        "wait",
        "--for=delete",
        "pod",
        "-n",
        super::world::CONTROLLER_NAMESPACE,
        "-l",
        "app.kubernetes.io/component=controller",
        "--timeout=60s",
    ])?;
    Ok(())
}

/// [`installed_world`] on real nodes ([`KubeWorld::start_real_nodes`], no
/// management nodes: the controller is the test's own). Call it inside
/// [`crate::real_node::run_isolated`].
pub async fn installed_real_world(
    binaries: super::KubeBinaries,
    tools: &crate::real_node::NodeTools,
    workloads: &[&str],
    csi: Option<crate::csi::deploy::CsiTools>,
) -> Result<KubeWorld> {
    let spec = super::RealWorldSpec {
        tools,
        workload_names: workloads,
        management_nodes: 0,
        extra_images: vec![],
        csi,
    };
    let world = KubeWorld::start_real_nodes(binaries, spec).await?;
    world.install("config/stages/dev")?;
    world.install_workload_rbac()?;
    for w in workloads {
        world.put_kubeconfig_secret(NS, w).await?;
    }
    stop_installed_controller(&world)?;
    Ok(world)
}

/// Merges `spec` into EtcdCluster `name`'s spec with `kubectl patch
/// --type=merge`, as a user edits a cluster.
pub fn patch_spec(world: &KubeWorld, name: &str, spec: serde_json::Value) -> Result<String> {
    let patch = serde_json::json!({ "spec": spec }).to_string();
    world.kubectl(&[
        "patch",
        "-n",
        NS,
        &format!("etcdcluster/{name}"),
        "--type=merge",
        "-p",
        &patch,
    ])
}

/// Runs `test` in a real-node world ([`installed_real_world`]) with
/// workload plane `w1`; when it fails, the nodes' logs of that moment follow
/// its error.
pub fn in_real_world<F>(test: F)
where
    F: AsyncFnOnce(&KubeWorld) -> Result<()>,
{
    in_real_world_with(None, test)
}

/// [`in_real_world`], with the test CSI driver on `w1` when `csi` names it
/// ([`crate::csi::deploy`]).
pub fn in_real_world_with<F>(csi: Option<crate::csi::deploy::CsiTools>, test: F)
where
    F: AsyncFnOnce(&KubeWorld) -> Result<()>,
{
    let Some(binaries) = super::require_kubernetes() else {
        return;
    };
    let Some(tools) = crate::real_node::require_real_nodes(&binaries) else {
        return;
    };
    crate::real_node::run_isolated(|| async move {
        let world = installed_real_world(binaries, &tools, &["w1"], csi).await?;
        if let Err(e) = test(&world).await {
            let logs = world.workload("w1").nodes.real().log_tails(25);
            bail!("{e:?}\nnodes:{logs}");
        }
        Ok(())
    });
}

/// The pods of cluster `name` in workload plane `w1`, by ordinal.
pub async fn member_pods(world: &KubeWorld, name: &str) -> Result<BTreeMap<u32, Pod>> {
    let names = Names::new(name, WORKLOAD_NS);
    let pods: Api<Pod> = Api::namespaced(world.workload("w1").admin_client().await?, WORKLOAD_NS);
    let list = pods.list(&ListParams::default()).await?;
    let mut by_ordinal = BTreeMap::new();
    for pod in list.items {
        let pod_name = pod.metadata.name.clone().context("pod without a name")?;
        let ordinal = (0..16).find(|o| names.pod(*o) == pod_name);
        if let Some(o) = ordinal {
            by_ordinal.insert(o, pod);
        }
    }
    Ok(by_ordinal)
}

/// The Node `pod` is bound to.
pub fn node_of(pod: &Pod) -> Result<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("pod not scheduled")
}

/// Like [`installed_world`], with the installed controller Deployment left
/// running (the process kubelet of the management cluster runs its pod).
pub async fn installed_world_running(workloads: &[&str]) -> Result<Option<KubeWorld>> {
    let Some(binaries) = super::require_kubernetes() else {
        return Ok(None);
    };
    let world = KubeWorld::start(binaries, workloads).await?;
    world.install("config/stages/dev")?;
    world.install_workload_rbac()?;
    for w in workloads {
        world.put_kubeconfig_secret(NS, w).await?;
    }
    Ok(Some(world))
}
