//! Building blocks of the end-to-end scenarios: EtcdClusters for the test
//! fleet, spec edits, and clients that reach the etcd members the way the
//! controller does (the cluster's own CA and the controller's identity).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use etcdfleet_api::{ClusterRef, EtcdCluster, EtcdClusterSpec, EtcdConfig, EtcdTuning};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig as EtcdClientConfig, TlsMaterial};
use etcdfleet_controllers::etcdcluster::observe::read_pki;
use etcdfleet_controllers::render::Names;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::driver::{ConvergeLog, TestController, converge, fast_settings, no_hook};
use crate::fleet::Fleet;

/// Management namespace of the scenarios.
pub const NS: &str = "team-a";
/// Workload namespace (the default of `spec.workloadNamespace`).
pub const WORKLOAD_NS: &str = "etcd-system";

/// An EtcdCluster with fast raft timing (50/500 ms), TLS on (the default).
pub fn cluster(name: &str, workload: &str, replicas: i32, version: &str) -> EtcdCluster {
    let mut c = EtcdCluster::new(
        name,
        EtcdClusterSpec {
            cluster_ref: Some(ClusterRef {
                name: workload.to_string(),
            }),
            config: EtcdConfig {
                version: Some(version.to_string()),
                replicas: Some(replicas),
                etcd: Some(fast_raft()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    c.metadata.namespace = Some(NS.to_string());
    c
}

/// Raft timing for tests: elections in half a second.
pub fn fast_raft() -> EtcdTuning {
    EtcdTuning {
        heartbeat_interval_millis: Some(50),
        election_timeout_millis: Some(500),
        ..Default::default()
    }
}

pub async fn create(fleet: &Fleet, cluster: &EtcdCluster) -> Result<()> {
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    api.create(&PostParams::default(), cluster).await?;
    Ok(())
}

/// Merge-patches `spec` of a cluster (what `kubectl edit` does).
pub async fn patch_spec(fleet: &Fleet, name: &str, spec: serde_json::Value) -> Result<()> {
    let api: Api<EtcdCluster> = Api::namespaced(fleet.management_direct(), NS);
    let patch = serde_json::json!({ "spec": spec });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

pub async fn set_replicas(fleet: &Fleet, name: &str, replicas: i32) -> Result<()> {
    patch_spec(fleet, name, serde_json::json!({ "replicas": replicas })).await
}

pub async fn get(fleet: &Fleet, name: &str) -> Result<EtcdCluster> {
    Ok(
        Api::<EtcdCluster>::namespaced(fleet.management_direct(), NS)
            .get(name)
            .await?,
    )
}

/// A controller with the test settings, talking to the fleet as the real one
/// would. With `ETCDFLEET_DIALER=portForward` it reaches etcd only through
/// port-forward tunnels served by the fleet's workload APIs (`make
/// test-portforward` runs the lifecycle and version suites so).
pub fn controller(fleet: &Fleet) -> TestController {
    controller_with(fleet, fast_settings())
}

/// [`controller`] with other settings.
pub fn controller_with(
    fleet: &Fleet,
    settings: etcdfleet_controllers::etcdcluster::ReconcilerSettings,
) -> TestController {
    let dialer: Arc<dyn etcdfleet_controllers::dialer::EtcdDialer> =
        match std::env::var("ETCDFLEET_DIALER").as_deref() {
            Ok("portForward") => match crate::fleet::FleetPortForward::start(fleet) {
                Ok(pf) => pf.dialer,
                Err(e) => panic!("ETCDFLEET_DIALER=portForward: cannot serve port-forward: {e}"),
            },
            _ => fleet.dialer(),
        };
    TestController::new(fleet.management(), fleet.client_factory(), dialer, settings)
}

/// Reconciles `clusters` (in [`NS`]) until converged, syncing the runtimes between rounds.
pub async fn converge_all(
    fleet: &Fleet,
    ctl: &mut TestController,
    clusters: &[&str],
) -> Result<ConvergeLog> {
    let keys: Vec<(&str, &str)> = clusters.iter().map(|c| (NS, *c)).collect();
    converge(
        ctl,
        &keys,
        Duration::from_secs(120),
        || fleet.sync_all(),
        no_hook,
    )
    .await
}

/// Client URLs (dialed) of members `0..members` of a TLS cluster, and the
/// client configuration the controller uses for it.
pub async fn etcd_of(
    fleet: &Fleet,
    workload: &str,
    name: &str,
    members: u32,
) -> Result<(Vec<String>, EtcdClientConfig)> {
    let names = Names::new(name, WORKLOAD_NS);
    let cluster = get(fleet, name).await?;
    let pki = read_pki(&fleet.management_direct(), &cluster, &names)
        .await?
        .context("no PKI secret")?;
    let runtime = fleet.runtime(workload);
    let endpoints = (0..members)
        .map(|o| {
            let ip = runtime
                .resolve(&names.member_host(o))
                .with_context(|| format!("{} has no IP", names.pod(o)))?;
            Ok(format!("https://{ip}:2379"))
        })
        .collect::<Result<_>>()?;
    let config = EtcdClientConfig {
        tls: Some(TlsMaterial {
            ca_pem: pki.ca.cert_pem().to_string(),
            client_cert_pem: Some(pki.client_cert_pem.clone()),
            client_key_pem: Some(pki.client_key_pem.clone()),
            server_name: Some(names.client_service_host()),
        }),
        deadlines: fast_settings().etcd_deadlines,
        transport: None,
    };
    Ok((endpoints, config))
}

pub async fn put(fleet: &Fleet, workload: &str, name: &str, members: u32, key: &str) -> Result<()> {
    let (endpoints, config) = etcd_of(fleet, workload, name, members).await?;
    let mut kv = ClusterClient::connect(&endpoints, &config).await?.kv();
    tokio::time::timeout(Duration::from_secs(5), kv.put(key, "v", None)).await??;
    Ok(())
}

/// Reads `key` from every member on its own (a serializable read answered
/// by that member), each waited for ([`crate::etcd_harness::get_from_member`]).
pub async fn read_everywhere(
    fleet: &Fleet,
    workload: &str,
    name: &str,
    members: u32,
    key: &str,
) -> Result<()> {
    let (_, config) = etcd_of(fleet, workload, name, 0).await?;
    let names = Names::new(name, WORKLOAD_NS);
    let runtime = fleet.runtime(workload);
    for o in 0..members {
        let endpoint = || async {
            let ip = (runtime.resolve(&names.member_host(o)))
                .with_context(|| format!("{} has no IP", names.pod(o)))?;
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

/// The cluster version (MAJOR.MINOR) member `ordinal` reports on its plain
/// metrics listener (`etcd_cluster_version` gauge).
pub fn cluster_version(fleet: &Fleet, workload: &str, name: &str, ordinal: u32) -> Result<String> {
    let names = Names::new(name, WORKLOAD_NS);
    let ip = fleet
        .runtime(workload)
        .resolve(&names.member_host(ordinal))
        .context("pod has no IP")?;
    let body = crate::etcd_harness::http_get(&format!("{ip}:2381"), "/metrics")?;
    body.lines()
        .filter(|l| l.starts_with("etcd_cluster_version{") && l.ends_with("} 1"))
        .find_map(|l| {
            let label = l.split("cluster_version=\"").nth(1)?;
            Some(label.split('"').next()?.to_string())
        })
        .context("no etcd_cluster_version metric")
}

/// [`cluster_version`] once it starts with `prefix` (etcd sets the cluster
/// version a moment after the members agree; under load, seconds), or the
/// last answer after 20 s.
pub async fn wait_cluster_version(
    fleet: &Fleet,
    workload: &str,
    name: &str,
    ordinal: u32,
    prefix: &str,
) -> Result<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let answer = cluster_version(fleet, workload, name, ordinal);
        let done = answer.as_ref().is_ok_and(|v| v.starts_with(prefix));
        if done || std::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A fleet of `workloads` with `clusters` created and converged, and the
/// controller that converged them.
pub async fn running(
    workloads: &[&str],
    clusters: &[EtcdCluster],
) -> Result<(Fleet, TestController)> {
    let fleet = Fleet::new(workloads).await?;
    let mut ctl = controller(&fleet);
    for c in clusters {
        create(&fleet, c).await?;
    }
    let names: Vec<String> = clusters.iter().map(kube::ResourceExt::name_any).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    converge_all(&fleet, &mut ctl, &names).await?;
    Ok((fleet, ctl))
}
