//! A management cluster and workload clusters on real control planes, with a
//! process kubelet per cluster, or real nodes (`KubeWorld::start_real_nodes`:
//! kubelet and containerd per Node): the world the `real_*` suites run in.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{ControlPlane, Controllers, KubeBinaries, StorageEtcd, User, nodes};
use crate::controller_process::repo;
use crate::driver::{TestController, fast_settings};
use crate::etcd_harness::newest_built_etcd;
use crate::kubelet_server::{KubeletServer, runtime_pods};
use crate::real_node::{LocalRegistry, PodNetwork, RealNodes};
use crate::runtime::{BackgroundSync, ImageTable, WorkloadRuntime};
use etcdfleet_controllers::connector::KubeconfigClientFactory;
use etcdfleet_controllers::dialer::DialerKind;
use etcdfleet_controllers::etcdcluster::ReconcilerSettings;

/// The user the shipped workload RBAC (`config/workload-rbac`) binds, whose
/// token the kubeconfig Secrets carry.
pub const WORKLOAD_USER: &str = "etcdfleet-controller";
/// The controller's ServiceAccount on the management cluster (`config/rbac`).
pub const CONTROLLER_NAMESPACE: &str = "etcdfleet-system";
pub const CONTROLLER_SERVICE_ACCOUNT: &str = "etcdfleet-controller";
/// Nodes per workload cluster: the controller's preferred anti-affinity
/// spreads three members over three Nodes.
pub const NODES_PER_CLUSTER: usize = 3;
/// Nodes of the management cluster (the controller's Deployment runs there
/// when a test installs it as shipped; two replicas spread over two).
pub const MANAGEMENT_NODES: usize = 2;
/// How often each process kubelet syncs.
const KUBELET_SYNC: Duration = Duration::from_millis(250);

/// Reconciler settings of the real tier: the test's short deadlines and
/// failure grace, with the production read memo (`reread_after` at its
/// default), because that is what users run, and the production wait for a
/// file system to grow online before its member is restarted for it
/// (`resize_restart_after`): a real kubelet grows a published volume at its
/// next pod sync (the real nodes sync every 10 s).
pub fn real_settings() -> ReconcilerSettings {
    let production = ReconcilerSettings::default();
    ReconcilerSettings {
        reread_after: production.reread_after,
        resize_restart_after: production.resize_restart_after,
        ..fast_settings()
    }
}

/// The failure grace of controllers on real nodes. A pod restarted there
/// comes back in seconds, not at once as under the process kubelet (a new
/// sandbox, network and IP, then etcd's start): with the 4 s grace of the
/// fast settings, each member a roll restarted was taken for failed and
/// replaced with fresh storage. Production's default is 120 s.
pub const REAL_NODE_FAILURE_GRACE: Duration = Duration::from_secs(30);

/// The process kubelet of one cluster's Nodes: the workload runtime in node
/// mode, its kubelet API, and its background sync.
pub struct Kubelet {
    pub runtime: Arc<WorkloadRuntime>,
    pub nodes: Vec<String>,
    pub api: KubeletServer,
    _sync: BackgroundSync,
}

/// What runs a cluster's pods.
pub enum Nodes {
    /// The process kubelet ([`crate::runtime`]).
    Process(Kubelet),
    /// Real kubelets and containerd ([`crate::real_node`]).
    Real(RealNodes),
}

impl Nodes {
    /// The process kubelet; a world of real nodes has none.
    pub fn process(&self) -> &Kubelet {
        match self {
            Nodes::Process(kubelet) => kubelet,
            Nodes::Real(_) => panic!("this world runs real nodes, not the process kubelet"),
        }
    }

    /// The real nodes; a world of the process kubelet has none.
    pub fn real(&self) -> &RealNodes {
        match self {
            Nodes::Real(nodes) => nodes,
            Nodes::Process(_) => panic!("this world runs the process kubelet, not real nodes"),
        }
    }
}

/// One workload cluster: its control plane and what runs its pods.
pub struct WorkloadPlane {
    pub plane: ControlPlane,
    pub nodes: Nodes,
}

/// A management plane and named workload planes on one storage etcd.
pub struct KubeWorld {
    pub binaries: KubeBinaries,
    /// `Kubernetes v1.37.2`.
    pub version: String,
    pub management: ControlPlane,
    /// Runs the controller's Deployment when a test installs it as shipped.
    pub management_nodes: Nodes,
    pub(super) workloads: BTreeMap<String, WorkloadPlane>,
    pub(super) _storage: StorageEtcd,
    /// The pod network and the registry of a world of real nodes (dropped
    /// after the nodes: fields drop in declaration order).
    pub(super) _real: Option<(LocalRegistry, PodNetwork)>,
}

impl KubeWorld {
    /// Starts the planes (concurrently) and the kubelets, and prints the
    /// Kubernetes version so every suite log names it.
    pub async fn start(binaries: KubeBinaries, workload_names: &[&str]) -> Result<KubeWorld> {
        Self::start_with_images(binaries, workload_names, ImageTable::installed()).await
    }

    /// As [`KubeWorld::start`], with every kubelet (management and workload)
    /// mapping images through `images` (e.g. another release's controller
    /// image beside this build's).
    pub async fn start_with_images(
        binaries: KubeBinaries,
        workload_names: &[&str],
        images: ImageTable,
    ) -> Result<KubeWorld> {
        let version = binaries.version()?;
        eprintln!("real control planes: {version}");
        let storage = StorageEtcd::start(&newest_built_etcd()?.etcd).await?;
        let workload_user = [User {
            name: WORKLOAD_USER.into(),
            groups: vec![],
        }];
        let management = ControlPlane::start(
            &binaries,
            &storage,
            "management",
            Controllers::Management,
            &[],
        );
        let workloads = futures::future::try_join_all(workload_names.iter().map(|name| {
            ControlPlane::start(
                &binaries,
                &storage,
                name,
                Controllers::Workload,
                &workload_user,
            )
        }));
        let (management, planes) = futures::try_join!(management, workloads)?;
        let kubelet_version = version.trim_start_matches("Kubernetes ").to_string();
        let management_kubelet = Kubelet::start(
            &management,
            "management",
            MANAGEMENT_NODES,
            &kubelet_version,
            images.clone(),
        )
        .await?;
        let mut workloads = BTreeMap::new();
        for (name, plane) in workload_names.iter().zip(planes) {
            let kubelet = Kubelet::start(
                &plane,
                name,
                NODES_PER_CLUSTER,
                &kubelet_version,
                images.clone(),
            )
            .await?;
            workloads.insert(
                name.to_string(),
                WorkloadPlane {
                    plane,
                    nodes: Nodes::Process(kubelet),
                },
            );
        }
        Ok(KubeWorld {
            binaries,
            version,
            management,
            management_nodes: Nodes::Process(management_kubelet),
            workloads,
            _storage: storage,
            _real: None,
        })
    }

    /// The last lines of every log of what runs the management cluster's
    /// pods (the controller's, when a test installs it as shipped).
    pub fn management_pod_logs(&self, lines: usize) -> String {
        match &self.management_nodes {
            Nodes::Process(kubelet) => kubelet.runtime.all_pod_logs(lines),
            Nodes::Real(nodes) => nodes.log_tails(lines),
        }
    }

    /// The management cluster's process kubelet (see [`Nodes::process`]).
    pub fn management_kubelet(&self) -> &Kubelet {
        self.management_nodes.process()
    }

    pub fn workload(&self, name: &str) -> &WorkloadPlane {
        self.workloads
            .get(name)
            .unwrap_or_else(|| panic!("no workload cluster {name:?} in this world"))
    }

    /// The client URL of the etcd every API server of this world stores
    /// its objects in (each under [`ControlPlane::etcd_prefix`]).
    pub fn storage_url(&self) -> &str {
        self._storage.url()
    }

    pub fn workload_names(&self) -> Vec<String> {
        self.workloads.keys().cloned().collect()
    }

    /// `kubectl <args>` as the management admin, run from the repository
    /// root; fails with its output unless it exits 0. Returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        run_kubectl(self.management.kubectl(&self.binaries), args)
    }

    /// Every object of `resource` (e.g. `etcdclusters.v1beta1.etcdfleet.dev`)
    /// in every namespace, keyed `<kind>/<namespace>/<name>`, as
    /// `kubectl get -A -o json` lists them.
    pub fn list_all(
        &self,
        kind: &str,
        resource: &str,
    ) -> Result<BTreeMap<String, serde_json::Value>> {
        let list: serde_json::Value =
            serde_json::from_str(&self.kubectl(&["get", resource, "-A", "-o", "json"])?)?;
        let items = list["items"]
            .as_array()
            .context("kubectl listed no items")?;
        Ok(items
            .iter()
            .map(|item| {
                let m = &item["metadata"];
                let key = format!(
                    "{kind}/{}/{}",
                    m["namespace"].as_str().unwrap_or(""),
                    m["name"].as_str().unwrap_or("")
                );
                (key, item.clone())
            })
            .collect())
    }

    /// `kubectl <args>` as the admin of workload cluster `name`.
    pub fn kubectl_workload(&self, name: &str, args: &[&str]) -> Result<String> {
        run_kubectl(self.workload(name).plane.kubectl(&self.binaries), args)
    }

    /// Installs what a platform team applies to a management cluster: the
    /// CRDs first (and waits until they are established), then the overlay
    /// `overlay` (a directory under `config/`), both with `kubectl apply
    /// --server-side -k`.
    pub fn install(&self, overlay: &str) -> Result<()> {
        install(&self.management, &self.binaries, overlay)
    }

    /// Applies the CRDs of kustomization `dir` on the management cluster
    /// and waits until every CRD is established.
    pub fn install_crds(&self, dir: &str) -> Result<()> {
        self.kubectl(&["apply", "--server-side", "-k", dir])?;
        self.wait_crds_established()
    }

    /// Waits until every CRD of the management cluster is established.
    pub fn wait_crds_established(&self) -> Result<()> {
        self.kubectl(&CRDS_ESTABLISHED).map(drop)
    }

    /// Applies `config/workload-rbac` to every workload cluster.
    pub fn install_workload_rbac(&self) -> Result<()> {
        for name in self.workloads.keys() {
            self.kubectl_workload(
                name,
                &["apply", "--server-side", "-k", "config/workload-rbac"],
            )?;
        }
        Ok(())
    }

    /// The controller configuration as installed: the file the shipped
    /// Deployment mounts from its (generated, hash-suffixed) ConfigMap.
    pub fn installed_controller_config(&self) -> Result<String> {
        let config_map = self.kubectl(&[
            "get",
            "deployment",
            "etcdfleet-controller",
            "-n",
            CONTROLLER_NAMESPACE,
            "-o",
            "jsonpath={.spec.template.spec.volumes[?(@.configMap)].configMap.name}",
        ])?;
        self.kubectl(&[
            "get",
            "configmap",
            config_map.trim(),
            "-n",
            CONTROLLER_NAMESPACE,
            "-o",
            "jsonpath={.data.config\\.yaml}",
        ])
    }

    /// A token of the controller's ServiceAccount (`TokenRequest`, as a pod
    /// would mount it), once the shipped RBAC created it.
    pub async fn controller_token(&self) -> Result<String> {
        controller_token(&self.management).await
    }

    /// A management client as the controller's ServiceAccount.
    pub async fn controller_client(&self) -> Result<Client> {
        let token = self.controller_token().await?;
        super::client_from_kubeconfig(&self.management.kubeconfig_with_token(&token)).await
    }

    /// An in-process controller as production builds it: the controller's
    /// ServiceAccount under the shipped RBAC, workload clients from the
    /// kubeconfig Secrets, etcd reached through `pods/portforward` of each
    /// workload API server, [`real_settings`].
    /// On real nodes the failure grace is [`REAL_NODE_FAILURE_GRACE`].
    pub async fn controller(&self) -> Result<TestController> {
        let mut settings = real_settings();
        if self
            .workloads
            .values()
            .any(|w| matches!(w.nodes, Nodes::Real(_)))
        {
            settings.member_failure_grace = REAL_NODE_FAILURE_GRACE;
        }
        self.controller_with(settings).await
    }

    /// [`Self::controller`] with other settings.
    pub async fn controller_with(&self, settings: ReconcilerSettings) -> Result<TestController> {
        Ok(TestController::new(
            self.controller_client().await?,
            Arc::new(KubeconfigClientFactory::default()),
            DialerKind::PortForward.build(),
            settings,
        ))
    }

    /// `kubectl apply --server-side -f -` of `yaml` on the management cluster.
    pub fn apply(&self, yaml: &str) -> Result<String> {
        run_kubectl_with_input(
            self.management.kubectl(&self.binaries),
            &["apply", "--server-side", "-f", "-"],
            yaml,
        )
    }

    /// Creates namespace `ns` on the management cluster (if missing) and the
    /// kubeconfig Secret `<workload>-kubeconfig` (key `value`) there, holding
    /// a kubeconfig of the workload user for workload cluster `workload`.
    pub async fn put_kubeconfig_secret(&self, ns: &str, workload: &str) -> Result<()> {
        let client = self.management.admin_client().await?;
        create_namespace(&client, ns).await?;
        // Read by the controller, a process of the test or a pod.
        let kubeconfig = self
            .workload(workload)
            .plane
            .kubeconfig_for_pods(WORKLOAD_USER);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": format!("{workload}-kubeconfig"), "namespace": ns },
            "stringData": { "value": kubeconfig },
        }))?;
        Api::<Secret>::namespaced(client, ns)
            .create(&PostParams::default(), &secret)
            .await?;
        Ok(())
    }
}

/// The host-path provisioner of kube-controller-manager writes each
/// volume under this directory of the machine, and never removes one whose
/// claim outlives its cluster (the members' claims are retained).
const HOST_PATH_VOLUMES: &str = "/tmp/hostpath_pv/";

impl Drop for KubeWorld {
    /// Removes the data of the workload planes' volumes (etcd's WAL alone
    /// preallocates 64 MiB per member) once their pods are gone, unless the
    /// test failed or `ETCDFLEET_KEEP_PODS` asks to keep them.
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("ETCDFLEET_KEEP_PODS").is_some() {
            return;
        }
        let volumes: Vec<String> = self
            .workloads
            .keys()
            .filter_map(|name| {
                self.kubectl_workload(
                    name,
                    &["get", "pv", "-o", "jsonpath={.items[*].spec.hostPath.path}"],
                )
                .ok()
            })
            .flat_map(|paths| {
                paths
                    .split_whitespace()
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .collect();
        // Stops every workload plane and its nodes first.
        self.workloads.clear();
        for path in volumes {
            if path.starts_with(HOST_PATH_VOLUMES) && !path.contains("..") {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
}

impl Kubelet {
    /// Registers `count` Nodes named `<name>-node-<i>` on `plane` and runs
    /// their pods, with images mapped through `images`.
    async fn start(
        plane: &ControlPlane,
        name: &str,
        count: usize,
        version: &str,
        images: ImageTable,
    ) -> Result<Kubelet> {
        let admin = plane.admin_client().await?;
        let nodes: Vec<String> = (0..count).map(|i| format!("{name}-node-{i}")).collect();
        let runtime = Arc::new(WorkloadRuntime::for_nodes(
            plane.url(),
            admin.clone(),
            images,
            &nodes,
        )?);
        let api = KubeletServer::start(
            "127.0.0.1:0".parse()?,
            runtime_pods(Arc::downgrade(&runtime)),
        )?;
        nodes::register(&admin, &nodes, api.port(), version).await?;
        let sync = runtime.spawn_background(KUBELET_SYNC);
        Ok(Kubelet {
            runtime,
            nodes,
            api,
            _sync: sync,
        })
    }
}

impl WorkloadPlane {
    /// The process kubelet's runtime (see [`Nodes::process`]).
    pub fn runtime(&self) -> &Arc<WorkloadRuntime> {
        &self.nodes.process().runtime
    }

    /// An admin client of this workload cluster.
    pub async fn admin_client(&self) -> Result<Client> {
        self.plane.admin_client().await
    }
}

/// See [`KubeWorld::install`]: the CRDs, then `overlay`, on `plane`.
pub(super) fn install(plane: &ControlPlane, binaries: &KubeBinaries, overlay: &str) -> Result<()> {
    let kubectl = |args: &[&str]| run_kubectl(plane.kubectl(binaries), args);
    kubectl(&["apply", "--server-side", "-k", "config/crd"])?;
    kubectl(&CRDS_ESTABLISHED)?;
    kubectl(&["apply", "--server-side", "-k", overlay])?;
    Ok(())
}

/// kubectl's wait until every CRD is established.
const CRDS_ESTABLISHED: [&str; 5] = [
    "wait",
    "--for=condition=Established",
    "--timeout=60s",
    "crd",
    "--all",
];

/// See [`KubeWorld::controller_token`].
pub(super) async fn controller_token(plane: &ControlPlane) -> Result<String> {
    service_account_token(plane, CONTROLLER_SERVICE_ACCOUNT).await
}

/// A token of ServiceAccount `name` in the controller's namespace.
pub(super) async fn service_account_token(plane: &ControlPlane, name: &str) -> Result<String> {
    let api: Api<ServiceAccount> =
        Api::namespaced(plane.admin_client().await?, CONTROLLER_NAMESPACE);
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": { "audiences": [], "expirationSeconds": 86400 }
    }))?;
    let token = api
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for ServiceAccount {name}"))?;
    token
        .status
        .and_then(|s| s.token)
        .context("TokenRequest answered without a token")
}

/// Creates namespace `ns`; one that exists already is fine.
pub async fn create_namespace(client: &Client, ns: &str) -> Result<()> {
    let namespace: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } }))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => other.map(|_| ()).map_err(Into::into),
    }
}

pub(super) fn run_kubectl(cmd: Command, args: &[&str]) -> Result<String> {
    run_kubectl_with_input(cmd, args, "")
}

fn run_kubectl_with_input(mut cmd: Command, args: &[&str], input: &str) -> Result<String> {
    use std::io::Write as _;
    let mut child = cmd
        .args(args)
        .current_dir(repo())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running kubectl {}", args.join(" ")))?;
    child
        .stdin
        .take()
        .context("kubectl stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "kubectl {} failed ({}):\n{stdout}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}
