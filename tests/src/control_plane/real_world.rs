//! A [`KubeWorld`] whose Nodes are real ([`crate::real_node`]): each plane
//! gets its service range and cluster DNS, each Node a kubelet and a
//! containerd, all pulling from one registry the world runs. Must run inside
//! [`crate::real_node::run_isolated`] (the pod network is made only there).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::world::{
    KubeWorld, MANAGEMENT_NODES, NODES_PER_CLUSTER, Nodes, WORKLOAD_USER, WorkloadPlane,
};
use super::{ControlPlane, Controllers, KubeBinaries, StorageEtcd, User};
use crate::csi::deploy::{CsiDeployment, CsiTools, NodeCsi, wait_registered};
use crate::etcd_harness::newest_built_etcd;
use crate::real_node::node::SANDBOX_IMAGE_PREFIX;
use crate::real_node::{
    ClusterDns, LocalRegistry, NodeImage, NodeSpec, NodeTools, PlaneAddresses, PodNetwork,
    RealNode, RealNodes,
};

/// How long a Node may take from start to Ready.
const NODE_READY: Duration = Duration::from_secs(120);

/// What a real-node world is made of besides its planes.
pub struct RealWorldSpec<'a> {
    pub tools: &'a NodeTools,
    pub workload_names: &'a [&'a str],
    /// Nodes of the management plane (0: none; the controller then runs as
    /// a process of the test, as in most real suites).
    pub management_nodes: usize,
    /// Images pushed into the world's registry besides the sandbox image
    /// and every etcd image (e.g. the controller image `make image` built).
    pub extra_images: Vec<NodeImage>,
    /// The test CSI driver on every workload plane ([`crate::csi::deploy`]).
    pub csi: Option<CsiTools>,
}

impl RealWorldSpec<'_> {
    /// [`MANAGEMENT_NODES`] when the controller runs as a pod.
    pub fn with_controller_pod(mut self, controller: NodeImage) -> Self {
        self.management_nodes = MANAGEMENT_NODES;
        self.extra_images.push(controller);
        self
    }
}

impl KubeWorld {
    /// Starts the planes and, per plane, CoreDNS and real Nodes
    /// ([`NODES_PER_CLUSTER`] per workload plane), once every image is in
    /// the world's registry. Prints the Kubernetes, kubelet, containerd and
    /// runc versions so every suite log names them.
    pub async fn start_real_nodes(
        binaries: KubeBinaries,
        spec: RealWorldSpec<'_>,
    ) -> Result<KubeWorld> {
        let started = Instant::now();
        let version = binaries.version()?;
        eprintln!("real control planes: {version}");
        eprintln!("real nodes: {}", spec.tools.versions()?);
        let network = PodNetwork::create()?;
        let registry = LocalRegistry::start(&spec.tools.registry).await?;
        let mut images = spec.tools.images()?;
        images.extend(spec.extra_images.iter().cloned());
        futures::future::try_join_all(images.iter().map(|i| registry.push(i))).await?;
        let sandbox_image = images
            .iter()
            .find(|i| i.name.starts_with(SANDBOX_IMAGE_PREFIX))
            .context("no sandbox image (hack/upstream/node-images.sh)")?
            .name
            .clone();
        eprintln!(
            "real nodes: {} images in the registry after {:?}",
            images.len(),
            started.elapsed()
        );
        let storage = StorageEtcd::start(&newest_built_etcd()?.etcd).await?;
        let management_addresses = network.add_plane()?;
        let management = ControlPlane::start_with(
            &binaries,
            &storage,
            "management",
            Controllers::Management,
            &[],
            Some(&management_addresses),
        );
        let workload_user = [User {
            name: WORKLOAD_USER.into(),
            groups: vec![],
        }];
        let workload_addresses = spec
            .workload_names
            .iter()
            .map(|_| network.add_plane())
            .collect::<Result<Vec<_>>>()?;
        let workloads =
            futures::future::try_join_all(spec.workload_names.iter().zip(&workload_addresses).map(
                |(name, addresses)| {
                    ControlPlane::start_with(
                        &binaries,
                        &storage,
                        name,
                        Controllers::Workload,
                        &workload_user,
                        Some(addresses),
                    )
                },
            ));
        let (management, planes) = futures::try_join!(management, workloads)?;
        let context = NodeContext {
            tools: spec.tools,
            registry: &registry,
            network: &network,
            sandbox_image,
            csi: None,
        };
        let management_nodes = context
            .start_plane(
                &management,
                "management",
                spec.management_nodes,
                management_addresses,
            )
            .await?;
        let context = NodeContext {
            csi: spec.csi.as_ref(),
            ..context
        };
        let mut workloads = BTreeMap::new();
        for ((name, plane), addresses) in spec
            .workload_names
            .iter()
            .zip(planes)
            .zip(workload_addresses)
        {
            let nodes = context
                .start_plane(&plane, name, NODES_PER_CLUSTER, addresses)
                .await?;
            workloads.insert(
                name.to_string(),
                WorkloadPlane {
                    plane,
                    nodes: Nodes::Real(nodes),
                },
            );
        }
        eprintln!("real nodes: world up after {:?}", started.elapsed());
        Ok(KubeWorld {
            binaries,
            version,
            management,
            management_nodes: Nodes::Real(management_nodes),
            workloads,
            _storage: storage,
            _real: Some((registry, network)),
        })
    }
}

/// What every node of a world shares.
struct NodeContext<'a> {
    tools: &'a NodeTools,
    registry: &'a LocalRegistry,
    network: &'a PodNetwork,
    sandbox_image: String,
    /// The test CSI driver, on the planes started with it.
    csi: Option<&'a CsiTools>,
}

impl NodeContext<'_> {
    /// The plane's `kubernetes` Service route, its CoreDNS, and `count`
    /// Nodes named `<name>-node-<i>`, each Ready.
    async fn start_plane(
        &self,
        plane: &ControlPlane,
        name: &str,
        count: usize,
        addresses: PlaneAddresses,
    ) -> Result<RealNodes> {
        self.network.route_api_service(&addresses, plane.port())?;
        let dns = ClusterDns::start(
            &self.tools.coredns,
            addresses.dns_ip,
            &plane.admin_kubeconfig_file(),
            plane.dir(),
        )
        .await?;
        let client = plane.admin_client().await?;
        let store = plane.dir().join("csi-volumes");
        let csi = match self.csi {
            Some(tools) => Some(
                CsiDeployment::start(
                    tools,
                    &store,
                    &plane.dir().join("csi"),
                    &plane.admin_kubeconfig_file(),
                    &client,
                )
                .await?,
            ),
            None => None,
        };
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let spec = NodeSpec {
                name: format!("{name}-node-{i}"),
                kubeconfig: plane.admin_kubeconfig_file(),
                cluster_dns: addresses.dns_ip,
                sandbox_image: self.sandbox_image.clone(),
                registry: self.registry,
                network: self.network,
                tools: self.tools,
                csi: self.csi.map(|t| NodeCsi {
                    driver: t.driver.clone(),
                    store: store.clone(),
                }),
            };
            nodes.push(RealNode::start(&spec).await?);
        }
        for node in &nodes {
            node.wait_ready(&client, NODE_READY).await?;
        }
        if csi.is_some() {
            let names: Vec<String> = nodes.iter().map(|n| n.name().to_string()).collect();
            wait_registered(&client, &names, NODE_READY)
                .await
                .with_context(|| {
                    nodes
                        .iter()
                        .map(RealNode::csi_log_tails)
                        .collect::<String>()
                })?;
        }
        Ok(RealNodes {
            nodes,
            dns,
            addresses,
            csi,
        })
    }
}
