//! The test world of the end-to-end suites: one management API server and
//! several workload clusters, each with its own API server
//! ([`crate::apiserver`], served in-process and over HTTPS) and a
//! [`WorkloadRuntime`] running its etcd pods as real processes.
//!
//! The API servers enforce what a real one enforces where the controller
//! depends on it (RBAC from the shipped `config/rbac` and
//! `config/workload-rbac`, server-side apply, immutable fields,
//! preconditions, watch). The fleet owns how the controller reaches
//! everything:
//! - [`management`](Fleet::management) is the controller's identity (the
//!   ServiceAccount the shipped ClusterRoleBinding names): RBAC enforced;
//! - each workload's kubeconfig Secret `<name>-kubeconfig` points at that
//!   workload's HTTPS URL with a token of [`WORKLOAD_USER`] (bound by the
//!   shipped `config/workload-rbac`), and [`FleetClientFactory`] builds the
//!   client from it the way the controller does in production
//!   (`KubeconfigClientFactory`);
//! - each workload API serves `pods/<pod>/portforward` (RBAC enforced,
//!   recorded), bridged to the pod in its runtime, so the production
//!   [`PortForwardDialer`](etcdfleet_controllers::dialer::PortForwardDialer)
//!   reaches etcd through the workload API exactly as in a real fleet;
//!   [`FleetDialer`] is the `direct` alternative: it maps an etcd member's
//!   advertised URL onto its pod IP, through the names of the runtime;
//! - every request of a non-admin identity is **recorded** server-side, so
//!   tests can assert exactly which API calls a reconcile made (e.g. no
//!   Secret list/watch, zero writes in steady state);
//! - fault injection: [`set_unreachable`](Fleet::set_unreachable) makes the
//!   controller's calls to a workload API answer `503 ServiceUnavailable`
//!   (the runtime keeps running: kubelets do not need the management
//!   network); [`break_kubeconfig`](Fleet::break_kubeconfig) corrupts,
//!   replaces with an exec-plugin config, or deletes a kubeconfig Secret.
//!
//! Tests read and write as the admin
//! ([`management_direct`](Fleet::management_direct),
//! [`workload_client`](Fleet::workload_client)): no RBAC, not recorded.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use etcdfleet_controllers::connector::{
    KubeconfigClientFactory, WorkloadClientFactory, WorkloadCluster,
};
use etcdfleet_controllers::dialer::EtcdDialer;
use etcdfleet_controllers::etcd::{EtcdStream, Transport};
use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};
use serde_json::json;

pub use crate::apiserver::MANAGEMENT;
pub use crate::apiserver::recorder::{ApiOp, OpRecorder};

use crate::apiserver::{ApiServer, CONTROLLER_USER};
use crate::control_plane::world::create_namespace;
use crate::portforward::PortForwardServer;
use crate::runtime::{BackgroundSync, ImageTable, WorkloadRuntime};

/// The namespace of the controller's ServiceAccount and leader Lease.
pub const CONTROLLER_NAMESPACE: &str = "etcdfleet-system";

/// The management namespace tests use unless they pick another.
pub const DEFAULT_NAMESPACE: &str = "team-a";

/// How [`Fleet::break_kubeconfig`] breaks a kubeconfig Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeconfigFault {
    /// The value is not YAML at all.
    Garbage,
    /// A well-formed kubeconfig whose user runs an exec credential plugin.
    ExecPlugin,
    /// The Secret is deleted.
    Missing,
}

struct Workload {
    api: ApiServer,
    server: String,
    kubeconfig: String,
    direct: Client,
    recorded: Client,
    runtime: Arc<WorkloadRuntime>,
    /// Serves `pods/<pod>/portforward` on this workload's API server,
    /// bridged to the runtime's pods (what the kubelet does).
    portforward: Arc<PortForwardServer>,
}

/// The identity of the workload kubeconfigs the fleet hands the controller;
/// `config/workload-rbac` binds it.
pub const WORKLOAD_USER: &str = "etcdfleet-controller";

/// A management cluster and its workload clusters. See the module docs.
pub struct Fleet {
    namespace: String,
    /// `None` when the management cluster is a real API server
    /// ([`Fleet::with_real_management`]).
    management_api: Option<ApiServer>,
    management_direct: Client,
    management: Client,
    workloads: BTreeMap<String, Workload>,
    recorder: OpRecorder,
}

fn exec_plugin_kubeconfig(name: &str, server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server}
    insecure-skip-tls-verify: true
users:
- name: {name}-exec
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /bin/sh
      args: [\"-c\", \"echo pwned\"]
      interactiveMode: Never
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}-exec
current-context: {name}
"
    )
}

impl Fleet {
    /// A fleet in namespace [`DEFAULT_NAMESPACE`] with the installed etcd images.
    pub async fn new(workload_names: &[&str]) -> Result<Fleet> {
        Self::with_namespace(DEFAULT_NAMESPACE, workload_names).await
    }

    /// A fleet whose kubeconfig Secrets live in `namespace`.
    pub async fn with_namespace(namespace: &str, workload_names: &[&str]) -> Result<Fleet> {
        Self::with_management_api(ApiServer::management().await?, namespace, workload_names).await
    }

    /// A fleet whose management API is `management_api` (e.g. one with a
    /// stage's rendered RBAC instead of the all-namespaces rules).
    pub async fn with_management_api(
        management_api: ApiServer,
        namespace: &str,
        workload_names: &[&str],
    ) -> Result<Fleet> {
        Self::with_images(
            management_api,
            namespace,
            workload_names,
            ImageTable::installed(),
        )
        .await
    }

    /// Like [`with_management_api`](Self::with_management_api), the pods
    /// of every workload cluster run from `images` (e.g. the etcd stand-in
    /// of the fleet benchmark).
    pub async fn with_images(
        management_api: ApiServer,
        namespace: &str,
        workload_names: &[&str],
        images: ImageTable,
    ) -> Result<Fleet> {
        let recorder = OpRecorder::default();
        management_api.set_recorder(recorder.clone());
        let management_direct = management_api.admin_client();
        let management = management_api.client_as(CONTROLLER_USER);
        let mut fleet = Fleet::empty(namespace, management_direct, management, recorder).await?;
        fleet.management_api = Some(management_api);
        fleet.add_workloads(workload_names, images).await?;
        Ok(fleet)
    }

    /// A fleet whose management cluster is a real API server (the fleet
    /// benchmark's `fleet_real_api` run): `admin` sets it up and reads it,
    /// `controller` is the controller's identity there. Only the workload
    /// clusters' calls are recorded; count the management cluster's from
    /// its audit log.
    pub async fn with_real_management(
        admin: Client,
        controller: Client,
        namespace: &str,
        workload_names: &[&str],
        images: ImageTable,
    ) -> Result<Fleet> {
        let mut fleet = Fleet::empty(namespace, admin, controller, OpRecorder::default()).await?;
        fleet.add_workloads(workload_names, images).await?;
        Ok(fleet)
    }

    async fn empty(
        namespace: &str,
        management_direct: Client,
        management: Client,
        recorder: OpRecorder,
    ) -> Result<Fleet> {
        for ns in [namespace, CONTROLLER_NAMESPACE] {
            create_namespace(&management_direct, ns).await?;
        }
        Ok(Fleet {
            namespace: namespace.to_string(),
            management_api: None,
            management_direct,
            management,
            workloads: BTreeMap::new(),
            recorder,
        })
    }

    /// Starts a workload cluster (API server, runtime, port-forward) per
    /// name and writes its kubeconfig Secret.
    async fn add_workloads(&mut self, workload_names: &[&str], images: ImageTable) -> Result<()> {
        for &name in workload_names {
            let api = ApiServer::workload(name).await?;
            api.set_recorder(self.recorder.clone());
            let server = api.url();
            let direct = api.admin_client();
            let recorded = api.client_as(WORKLOAD_USER);
            let runtime = Arc::new(WorkloadRuntime::try_new(
                &server,
                direct.clone(),
                images.clone(),
            )?);
            // The production dialer reaches members through this API server.
            let portforward = PortForwardServer::for_runtime(Arc::downgrade(&runtime));
            api.set_portforward_handler(portforward.handler());
            let kubeconfig = api.kubeconfig(&api.issue_token(WORKLOAD_USER));
            // Keep the fixture honest: it must parse as a kubeconfig.
            Kubeconfig::from_yaml(&kubeconfig)
                .context("the generated kubeconfig does not parse")?;
            self.workloads.insert(
                name.to_string(),
                Workload {
                    api,
                    server,
                    kubeconfig: kubeconfig.clone(),
                    direct,
                    recorded,
                    runtime,
                    portforward,
                },
            );
            self.put_kubeconfig(name, &kubeconfig).await?;
        }
        Ok(())
    }

    /// The management API server itself (tokens, watch history, ...).
    /// Panics when the management cluster is a real API server.
    pub fn management_api(&self) -> &ApiServer {
        self.management_api
            .as_ref()
            .expect("this fleet's management cluster is a real API server")
    }

    /// Workload cluster `name`'s API server itself.
    pub fn workload_api(&self, name: &str) -> &ApiServer {
        &self.workload(name).api
    }

    fn workload(&self, name: &str) -> &Workload {
        self.workloads
            .get(name)
            .unwrap_or_else(|| panic!("no workload cluster {name:?} in this fleet"))
    }

    /// The management namespace of the test.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The management API as the controller sees it: its ServiceAccount,
    /// RBAC enforced, recorded.
    pub fn management(&self) -> Client {
        self.management.clone()
    }

    /// The management API as the admin (no RBAC, not recorded), for test
    /// setup and assertions.
    pub fn management_direct(&self) -> Client {
        self.management_direct.clone()
    }

    /// Workload cluster `name`'s API without recording or faults (the
    /// test's `kubectl`).
    pub fn workload_client(&self, name: &str) -> Client {
        self.workload(name).direct.clone()
    }

    /// Workload cluster `name`'s API as the controller sees it: its
    /// kubeconfig identity (RBAC enforced), recorded, and failing while
    /// [`set_unreachable`](Self::set_unreachable).
    pub fn controller_workload_client(&self, name: &str) -> Client {
        self.workload(name).recorded.clone()
    }

    /// Workload cluster `name`'s API over HTTPS, built from its kubeconfig
    /// exactly as the controller builds it (port-forward needs a real
    /// connection to upgrade).
    pub async fn served_workload_client(&self, name: &str) -> Result<Client> {
        let kubeconfig = Kubeconfig::from_yaml(&self.kubeconfig(name))?;
        self.client_factory()
            .build(&kubeconfig, &self.server_url(name))
            .await
            .map_err(|e| anyhow!(e))
    }

    pub fn runtime(&self, name: &str) -> &WorkloadRuntime {
        &self.workload(name).runtime
    }

    /// A handle on workload `name`'s runtime that does not keep it alive.
    pub fn runtime_handle(&self, name: &str) -> Weak<WorkloadRuntime> {
        Arc::downgrade(&self.workload(name).runtime)
    }

    /// The port-forward service of workload `name`'s API server (tunnel
    /// count, breaking every open tunnel).
    pub fn portforward(&self, name: &str) -> &Arc<PortForwardServer> {
        &self.workload(name).portforward
    }

    pub fn server_url(&self, name: &str) -> String {
        self.workload(name).server.clone()
    }

    pub fn workload_names(&self) -> Vec<String> {
        self.workloads.keys().cloned().collect()
    }

    /// The name of the kubeconfig Secret of workload `name`.
    pub fn kubeconfig_secret_name(name: &str) -> String {
        format!("{name}-kubeconfig")
    }

    /// The working kubeconfig of workload `name`.
    pub fn kubeconfig(&self, name: &str) -> String {
        self.workload(name).kubeconfig.clone()
    }

    pub fn client_factory(&self) -> Arc<FleetClientFactory> {
        Arc::new(FleetClientFactory {
            inner: KubeconfigClientFactory::default(),
            servers: self.workloads.values().map(|w| w.server.clone()).collect(),
        })
    }

    pub fn dialer(&self) -> Arc<FleetDialer> {
        Arc::new(FleetDialer {
            runtimes: Arc::new(
                self.workloads
                    .values()
                    .map(|w| (w.server.clone(), Arc::downgrade(&w.runtime)))
                    .collect(),
            ),
            opened: Arc::default(),
            blocked: Arc::default(),
        })
    }

    /// Every recorded operation, in order.
    pub fn ops(&self) -> Vec<ApiOp> {
        self.recorder.ops()
    }

    pub fn clear_ops(&self) {
        self.recorder.clear();
    }

    /// Recorded operations that are not get/list/watch.
    pub fn writes(&self) -> Vec<ApiOp> {
        self.ops().into_iter().filter(ApiOp::is_write).collect()
    }

    /// Recorded lists or watches of Secrets (the controller must only GET them).
    pub fn secret_lists_or_watches(&self) -> Vec<ApiOp> {
        self.ops()
            .into_iter()
            .filter(|op| op.resource == "secrets" && (op.verb == "list" || op.verb == "watch"))
            .collect()
    }

    /// Makes every controller call to workload `name`'s API fail with 503.
    pub fn set_unreachable(&self, name: &str, unreachable: bool) {
        self.workload(name)
            .api
            .set_unavailable(WORKLOAD_USER, unreachable);
    }

    /// Breaks the kubeconfig Secret of workload `name`.
    pub async fn break_kubeconfig(&self, name: &str, fault: KubeconfigFault) -> Result<()> {
        let server = self.server_url(name);
        match fault {
            KubeconfigFault::Garbage => {
                self.put_kubeconfig(name, "{{{ this is: not [ a kubeconfig")
                    .await
            }
            KubeconfigFault::ExecPlugin => {
                self.put_kubeconfig(name, &exec_plugin_kubeconfig(name, &server))
                    .await
            }
            KubeconfigFault::Missing => {
                let api =
                    Api::<Secret>::namespaced(self.management_direct.clone(), &self.namespace);
                match api
                    .delete(
                        &Self::kubeconfig_secret_name(name),
                        &DeleteParams::default(),
                    )
                    .await
                {
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    other => other.map(|_| ()).map_err(Into::into),
                }
            }
        }
    }

    /// Puts the working kubeconfig back.
    pub async fn restore_kubeconfig(&self, name: &str) -> Result<()> {
        let text = self.kubeconfig(name);
        self.put_kubeconfig(name, &text).await
    }

    /// Creates or updates Secret `<name>-kubeconfig` with key `value` = `text`.
    pub async fn put_kubeconfig(&self, name: &str, text: &str) -> Result<()> {
        let api = Api::<Secret>::namespaced(self.management_direct.clone(), &self.namespace);
        let secret_name = Self::kubeconfig_secret_name(name);
        let data = BTreeMap::from([("value".to_string(), ByteString(text.as_bytes().to_vec()))]);
        if api.get_opt(&secret_name).await?.is_some() {
            api.patch(
                &secret_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "data": data })),
            )
            .await?;
        } else {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(secret_name),
                    namespace: Some(self.namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        "cluster.x-k8s.io/cluster-name".to_string(),
                        name.to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                type_: Some("cluster.x-k8s.io/secret".into()),
                data: Some(data),
                ..Secret::default()
            };
            api.create(&PostParams::default(), &secret).await?;
        }
        Ok(())
    }

    /// One [`WorkloadRuntime::sync`] of every workload cluster.
    pub async fn sync_all(&self) -> Result<()> {
        let results =
            futures::future::join_all(self.workloads.iter().map(|(name, w)| async move {
                w.runtime
                    .sync()
                    .await
                    .with_context(|| format!("syncing workload runtime {name}"))
            }))
            .await;
        results.into_iter().collect()
    }

    /// Background syncs of every runtime; they stop when the handles drop.
    pub fn spawn_background_sync(&self, interval: Duration) -> Vec<BackgroundSync> {
        self.workloads
            .values()
            .map(|w| w.runtime.spawn_background(interval))
            .collect()
    }

    /// Background syncs of every runtime that skip ticks while its workload
    /// API has not changed and its pods are ready (see
    /// [`WorkloadRuntime::spawn_background_on_change`]): for large fleets.
    pub fn spawn_background_sync_on_change(
        &self,
        interval: Duration,
        idle: Duration,
    ) -> Vec<BackgroundSync> {
        self.workloads
            .values()
            .map(|w| {
                let api = w.api.clone();
                w.runtime
                    .spawn_background_on_change(interval, idle, move || api.resource_version())
            })
            .collect()
    }

    /// Stops every pod process of every workload cluster.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.workloads.values().map(|w| w.runtime.shutdown())).await;
    }

    /// A readable dump of the recorded operations, for assertion messages.
    pub fn ops_report(&self) -> String {
        self.ops()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The names of a workload's objects of kind `K` in `namespace`.
    pub async fn object_names<K>(&self, name: &str, namespace: &str) -> Result<Vec<String>>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api = Api::<K>::namespaced(self.workload_client(name), namespace);
        Ok(api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .map(|o| o.name_any())
            .collect())
    }
}

/// Builds workload clients from the kubeconfig Secrets exactly as the
/// controller does in production ([`KubeconfigClientFactory`]): over HTTPS to
/// the workload's API server, with the kubeconfig's CA and token.
pub struct FleetClientFactory {
    inner: KubeconfigClientFactory,
    /// The fleet's workload API URLs: a kubeconfig naming another server is
    /// refused (it would reach nothing of this test world).
    servers: Vec<String>,
}

impl WorkloadClientFactory for FleetClientFactory {
    fn build<'a>(
        &'a self,
        kubeconfig: &'a Kubeconfig,
        server: &'a str,
    ) -> BoxFuture<'a, Result<Client, String>> {
        if !self.servers.iter().any(|s| s == server) {
            let known = self.servers.join(", ");
            return Box::pin(async move {
                Err(format!(
                    "no workload cluster of the test fleet serves {server:?} (known: {known})"
                ))
            });
        }
        self.inner.build(kubeconfig, server)
    }
}

/// Dials etcd members at their pod IPs, resolving names through the
/// workload runtime of the cluster they belong to.
pub struct FleetDialer {
    runtimes: Arc<BTreeMap<String, Weak<WorkloadRuntime>>>,
    opened: Arc<std::sync::atomic::AtomicU64>,
    /// Member hosts (prefixes) the controller cannot reach: a partition
    /// between the controller and those members only.
    blocked: Arc<Mutex<Vec<String>>>,
}

impl FleetDialer {
    /// Where a member's advertised URL points in the test world: its pod IP.
    pub fn dial_url(&self, workload: &str, advertised: &str) -> Result<String, String> {
        let runtime = self
            .runtimes
            .get(workload)
            .ok_or_else(|| format!("no workload cluster of the test fleet serves {workload:?}"))?
            .upgrade()
            .ok_or_else(|| format!("the workload runtime of {workload} is gone"))?;
        let (scheme, rest) = advertised
            .split_once("://")
            .ok_or_else(|| format!("{advertised:?} is not a URL"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| format!("{advertised:?} has no port"))?;
        let ip = match host.parse::<Ipv4Addr>() {
            Ok(ip) => ip,
            Err(_) => runtime
                .resolve(host)
                .ok_or_else(|| anyhow!("{host} does not resolve in workload cluster {workload}"))
                .map_err(|e| e.to_string())?,
        };
        Ok(format!("{scheme}://{ip}:{port}{path}"))
    }

    /// From now on, dials of members whose host starts with `prefix` (e.g. a
    /// pod name) fail as if the network between the controller and them
    /// were cut; the members themselves keep running and talking to each other.
    pub fn block(&self, prefix: &str) {
        self.blocked.lock().expect("lock").push(prefix.to_string());
    }

    /// Lifts every [`block`](Self::block).
    pub fn unblock_all(&self) {
        self.blocked.lock().expect("lock").clear();
    }

    /// TCP connections opened so far.
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}

impl EtcdDialer for FleetDialer {
    fn kind(&self) -> &'static str {
        "fleet"
    }

    fn dial(
        &self,
        workload: &WorkloadCluster,
        member: &http::Uri,
    ) -> BoxFuture<'static, std::io::Result<EtcdStream>> {
        let host = member.host().unwrap_or_default().to_string();
        let blocked = self
            .blocked
            .lock()
            .expect("lock")
            .iter()
            .any(|prefix| host.starts_with(prefix.as_str()));
        let mapped = self.dial_url(&workload.server, &member.to_string());
        let opened = self.opened.clone();
        Box::pin(async move {
            if blocked {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("{host}: unreachable from the controller (test partition)"),
                ));
            }
            let mapped: http::Uri = mapped
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e))?
                .parse()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let stream = Transport::tcp().dial(mapped).await?;
            opened.fetch_add(1, Ordering::Relaxed);
            Ok(stream)
        })
    }
}

/// Port-forward for every workload of `fleet`: the controller's production
/// [`PortForwardDialer`](etcdfleet_controllers::dialer::PortForwardDialer),
/// which port-forwards through each workload's own API server (built from
/// its kubeconfig Secret, RBAC enforced), and those servers' port-forward
/// services.
pub struct FleetPortForward {
    pub dialer: Arc<etcdfleet_controllers::dialer::PortForwardDialer>,
    pub servers: std::collections::BTreeMap<String, Arc<PortForwardServer>>,
}

impl FleetPortForward {
    pub async fn new(fleet: &Fleet) -> anyhow::Result<Self> {
        Self::start(fleet)
    }

    /// [`new`](Self::new) from synchronous code.
    pub fn start(fleet: &Fleet) -> anyhow::Result<Self> {
        let servers = fleet
            .workload_names()
            .into_iter()
            .map(|name| {
                let server = fleet.portforward(&name).clone();
                (name, server)
            })
            .collect();
        Ok(FleetPortForward {
            dialer: Arc::new(etcdfleet_controllers::dialer::PortForwardDialer::default()),
            servers,
        })
    }

    /// Tunnels opened by all workloads' API servers.
    pub fn tunnels_opened(&self) -> u64 {
        self.servers.values().map(|s| s.tunnels_opened()).sum()
    }

    pub fn break_tunnels(&self) {
        for s in self.servers.values() {
            s.break_tunnels();
        }
    }
}
