//! An etcd that something else runs, for the adoption suites: a plain
//! StatefulSet of etcd with its own headless Service and TLS Secret in a
//! real-tier workload cluster, written by the test as its owner (no
//! etcdfleet label anywhere), with its own CA (or two: one for clients and
//! servers, another for peers). The process kubelet runs its pods like any
//! other, so etcdfleet's members and these reach each other by their DNS
//! names as pods of one cluster network do.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig, EtcdStream, TlsMaterial, Transport};
use etcdfleet_controllers::pki::{CertUsage, CertificateAuthority, LeafSpec};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret, Service};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::control_plane::KubeWorld;
use crate::driver::fast_settings;
use crate::runtime::WorkloadRuntime;
use crate::scenario::WORKLOAD_NS;

/// The old cluster's StatefulSet and Service name.
pub const LEGACY: &str = "legacy-etcd";
/// Its members.
pub const LEGACY_MEMBERS: u32 = 3;

/// How the old cluster's certificates are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyTrust {
    /// One CA signs server, peer and client certificates (kubeadm's way).
    OneCa,
    /// Servers and clients on one CA, peers on another.
    SeparatePeerCa,
}

/// The old cluster: where it runs and the CA(s) it trusts.
pub struct LegacyEtcd {
    pub workload: String,
    /// The workload cluster's pod network, as the test reaches it.
    pub network: Transport,
    /// Signs the server and client certificates (and the peers' with `OneCa`).
    pub ca: CertificateAuthority,
    /// Signs the peer certificates.
    pub peer_ca: CertificateAuthority,
}

/// Dials a URL as a pod of the workload cluster would: a member's
/// advertised host (`<pod>.<service>.<namespace>.svc`) resolved through the
/// process kubelet's names, an IP as it is. A member list names members by
/// those hosts, which the test process cannot resolve otherwise.
pub fn pod_network(runtime: Arc<WorkloadRuntime>) -> Transport {
    Transport::new("pod network", move |uri: http::Uri| {
        let runtime = runtime.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default();
            let ip = (runtime.resolve(host).map(IpAddr::V4))
                .or_else(|| host.parse().ok())
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{host} does not resolve in the pod network"),
                    )
                })?;
            let stream =
                tokio::net::TcpStream::connect((ip, uri.port_u16().unwrap_or(2379))).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as EtcdStream)
        })
    })
}

fn host(pod: &str) -> String {
    format!("{pod}.{LEGACY}.{WORKLOAD_NS}.svc")
}

/// `legacy-etcd-<ordinal>`.
pub fn legacy_pod(ordinal: u32) -> String {
    format!("{LEGACY}-{ordinal}")
}

/// The old members' client URLs, as they advertise them.
pub fn legacy_client_urls() -> Vec<String> {
    (0..LEGACY_MEMBERS)
        .map(|o| format!("https://{}:2379", host(&legacy_pod(o))))
        .collect()
}

fn leaf(ca: &CertificateAuthority, cn: &str, usage: CertUsage) -> Result<(String, String)> {
    let cert = ca.issue(&LeafSpec {
        common_name: cn.into(),
        dns_names: vec![format!("*.{LEGACY}.{WORKLOAD_NS}.svc"), "localhost".into()],
        ip_addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        usage,
        validity_days: 30,
    })?;
    Ok((cert.cert_pem, cert.key_pem))
}

impl LegacyEtcd {
    /// Deploys the old cluster (etcd `version`) in `workload` and waits
    /// until its three members are healthy.
    pub async fn deploy(
        world: &KubeWorld,
        workload: &str,
        trust: LegacyTrust,
        version: &str,
    ) -> Result<LegacyEtcd> {
        let ca = CertificateAuthority::generate("legacy etcd CA")?;
        let peer_ca = match trust {
            LegacyTrust::OneCa => ca.clone(),
            LegacyTrust::SeparatePeerCa => CertificateAuthority::generate("legacy etcd peer CA")?,
        };
        let legacy = LegacyEtcd {
            workload: workload.to_string(),
            network: pod_network(world.workload(workload).runtime().clone()),
            ca,
            peer_ca,
        };
        let client = world.workload(workload).admin_client().await?;
        legacy.write_objects(&client, version).await?;
        legacy.wait_healthy(world, Duration::from_secs(120)).await?;
        Ok(legacy)
    }

    async fn write_objects(&self, client: &Client, version: &str) -> Result<()> {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": WORKLOAD_NS}}))?;
        match Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => {
                other?;
            }
        }
        let (server, server_key) = leaf(&self.ca, "legacy-server", CertUsage::Server)?;
        let (peer, peer_key) = leaf(&self.peer_ca, "legacy-peer", CertUsage::Peer)?;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": format!("{LEGACY}-tls"), "namespace": WORKLOAD_NS },
            "stringData": {
                "ca.crt": self.ca.cert_pem(), "tls.crt": server, "tls.key": server_key,
                "peer-ca.crt": self.peer_ca.cert_pem(), "peer.crt": peer, "peer.key": peer_key,
            },
        }))?;
        Api::<Secret>::namespaced(client.clone(), WORKLOAD_NS)
            .create(&PostParams::default(), &secret)
            .await?;
        let service: Service = serde_json::from_value(json!({
            "metadata": { "name": LEGACY, "namespace": WORKLOAD_NS },
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": { "app": LEGACY },
                "ports": [{ "name": "client", "port": 2379 }, { "name": "peer", "port": 2380 }],
            },
        }))?;
        Api::<Service>::namespaced(client.clone(), WORKLOAD_NS)
            .create(&PostParams::default(), &service)
            .await?;
        Api::<StatefulSet>::namespaced(client.clone(), WORKLOAD_NS)
            .create(&PostParams::default(), &statefulset(version)?)
            .await?;
        Ok(())
    }

    /// A client configuration for the old members (pod IPs, a client
    /// identity of the old CA, verified against their DNS names).
    pub fn config(&self) -> Result<EtcdConfig> {
        let client = self.ca.issue(&LeafSpec::client("legacy-client", 2))?;
        Ok(EtcdConfig {
            tls: Some(TlsMaterial {
                ca_pem: self.ca.cert_pem().to_string(),
                client_cert_pem: Some(client.cert_pem),
                client_key_pem: Some(client.key_pem),
                server_name: Some(host(&legacy_pod(0))),
            }),
            deadlines: fast_settings().etcd_deadlines,
            transport: Some(self.network.clone()),
        })
    }

    /// `https://<pod IP>:2379` of each old member the kubelet runs.
    pub fn endpoints(&self, world: &KubeWorld) -> Vec<String> {
        let runtime = world.workload(&self.workload).runtime();
        (0..LEGACY_MEMBERS)
            .filter_map(|o| runtime.pod_ip(WORKLOAD_NS, &legacy_pod(o)))
            .map(|ip| format!("https://{ip}:2379"))
            .collect()
    }

    /// A client over every old member.
    pub async fn cluster(&self, world: &KubeWorld) -> Result<ClusterClient> {
        Ok(ClusterClient::connect(&self.endpoints(world), &self.config()?).await?)
    }

    async fn wait_healthy(&self, world: &KubeWorld, within: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let last = match self.endpoints(world).len() as u32 {
                LEGACY_MEMBERS => match self.cluster(world).await?.observe().await {
                    Ok(h) if h.healthy_voter_count() == LEGACY_MEMBERS as usize => return Ok(()),
                    Ok(h) => format!("{} healthy", h.healthy_voter_count()),
                    Err(e) => e.to_string(),
                },
                n => format!("{n} pods have an IP"),
            };
            ensure!(
                std::time::Instant::now() < deadline,
                "the old cluster did not become healthy: {last}\n{}",
                world.workload(&self.workload).runtime().all_pod_logs(20)
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The old objects as their owner knows them, by `Kind/name`: UID,
    /// generation and spec, to prove later nothing else wrote them.
    pub async fn objects(&self, world: &KubeWorld) -> Result<BTreeMap<String, String>> {
        let client = world.workload(&self.workload).admin_client().await?;
        let mut objects = BTreeMap::new();
        let sts = Api::<StatefulSet>::namespaced(client.clone(), WORKLOAD_NS)
            .get(LEGACY)
            .await?;
        objects.insert(
            format!("StatefulSet/{LEGACY}"),
            fingerprint(&sts.metadata, &sts.spec)?,
        );
        let svc = Api::<Service>::namespaced(client.clone(), WORKLOAD_NS)
            .get(LEGACY)
            .await?;
        objects.insert(
            format!("Service/{LEGACY}"),
            fingerprint(&svc.metadata, &svc.spec)?,
        );
        let secret = Api::<Secret>::namespaced(client.clone(), WORKLOAD_NS)
            .get(&format!("{LEGACY}-tls"))
            .await?;
        objects.insert(
            format!("Secret/{LEGACY}-tls"),
            fingerprint(&secret.metadata, &secret.data)?,
        );
        let by_app = ListParams::default().labels(&format!("app={LEGACY}"));
        for pod in Api::<Pod>::namespaced(client.clone(), WORKLOAD_NS)
            .list(&by_app)
            .await?
        {
            let key = format!("Pod/{}", pod.name_any());
            objects.insert(key, fingerprint(&pod.metadata, &pod.spec)?);
        }
        for pvc in Api::<PersistentVolumeClaim>::namespaced(client, WORKLOAD_NS)
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| p.name_any().starts_with(&format!("data-{LEGACY}-")))
        {
            let key = format!("PersistentVolumeClaim/{}", pvc.name_any());
            objects.insert(key, fingerprint(&pvc.metadata, &pvc.spec)?);
        }
        Ok(objects)
    }
}

/// UID, generation, labels and annotations, and the object's spec (or data).
fn fingerprint<T: serde::Serialize>(meta: &kube::api::ObjectMeta, spec: &T) -> Result<String> {
    serde_json::to_string(&json!({
        "uid": meta.uid, "generation": meta.generation,
        "labels": meta.labels, "annotations": meta.annotations,
        "spec": spec,
    }))
    .context("fingerprint")
}

/// The old cluster's StatefulSet: three etcd members bootstrapping a new
/// cluster from a static `--initial-cluster`, mutual TLS on both ports.
fn statefulset(version: &str) -> Result<StatefulSet> {
    let initial: Vec<String> = (0..LEGACY_MEMBERS)
        .map(|o| {
            let pod = legacy_pod(o);
            format!("{pod}=https://{}:2380", host(&pod))
        })
        .collect();
    let me = format!("$(POD_NAME).{LEGACY}.{WORKLOAD_NS}.svc");
    let args = [
        "--name=$(POD_NAME)".to_string(),
        "--data-dir=/var/lib/etcd/data".into(),
        "--listen-peer-urls=https://0.0.0.0:2380".into(),
        "--listen-client-urls=https://0.0.0.0:2379".into(),
        format!("--advertise-client-urls=https://{me}:2379"),
        format!("--initial-advertise-peer-urls=https://{me}:2380"),
        format!("--initial-cluster={}", initial.join(",")),
        "--initial-cluster-state=new".into(),
        "--initial-cluster-token=legacy".into(),
        "--heartbeat-interval=50".into(),
        "--election-timeout=500".into(),
        "--client-cert-auth=true".into(),
        "--trusted-ca-file=/tls/ca.crt".into(),
        "--cert-file=/tls/tls.crt".into(),
        "--key-file=/tls/tls.key".into(),
        "--peer-client-cert-auth=true".into(),
        "--peer-trusted-ca-file=/tls/peer-ca.crt".into(),
        "--peer-cert-file=/tls/peer.crt".into(),
        "--peer-key-file=/tls/peer.key".into(),
    ];
    Ok(serde_json::from_value(json!({
        "metadata": { "name": LEGACY, "namespace": WORKLOAD_NS },
        "spec": {
            "serviceName": LEGACY,
            "replicas": LEGACY_MEMBERS,
            "podManagementPolicy": "Parallel",
            "selector": { "matchLabels": { "app": LEGACY } },
            "template": {
                "metadata": { "labels": { "app": LEGACY } },
                "spec": {
                    "containers": [{
                        "name": "etcd",
                        "image": format!("quay.io/coreos/etcd:v{version}"),
                        "command": ["etcd"],
                        "args": args,
                        "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                        "volumeMounts": [
                            { "name": "data", "mountPath": "/var/lib/etcd" },
                            { "name": "tls", "mountPath": "/tls", "readOnly": true },
                        ],
                    }],
                    "volumes": [{ "name": "tls", "secret": { "secretName": format!("{LEGACY}-tls") } }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "1Gi" } } },
            }],
        },
    }))?)
}

/// The join credentials Secret (`ca.crt`, `ca.key`) in the management cluster.
pub async fn put_join_secret(
    world: &KubeWorld,
    namespace: &str,
    name: &str,
    ca: &CertificateAuthority,
) -> Result<()> {
    let client = world.management.admin_client().await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": namespace },
        "stringData": { "ca.crt": ca.cert_pem(), "ca.key": ca.key_pem() },
    }))?;
    let api = Api::<Secret>::namespaced(client, namespace);
    api.patch(
        name,
        &kube::api::PatchParams::apply("test").force(),
        &kube::api::Patch::Apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": secret.metadata, "stringData": secret.string_data,
        })),
    )
    .await?;
    Ok(())
}
