//! The test world of the end-to-end suites: one fake management API and
//! several fake workload clusters, each with a [`WorkloadRuntime`] running
//! its etcd pods as real processes.
//!
//! The fleet owns how the controller reaches everything:
//! - [`FleetClientFactory`] maps a workload API server URL (from the real
//!   kubeconfig Secret `<name>-kubeconfig` in the test namespace) onto that
//!   workload's fake API;
//! - [`FleetDialer`] maps an etcd member's advertised URL onto its pod IP,
//!   through the names of the matching workload runtime;
//! - an **operation recorder** sits at the HTTP layer of the clients the
//!   controller uses (the [`management`](Fleet::management) client and the
//!   clients the factory returns), so tests can assert exactly which API
//!   calls a reconcile made (e.g. no Secret list/watch, zero writes in steady
//!   state). It is an HTTP wrapper rather than kube-fake-client interceptors
//!   because interceptors see neither the resource of a get/list/delete nor
//!   the difference between a list and a watch.
//! - fault injection: [`set_unreachable`](Fleet::set_unreachable) makes the
//!   controller's calls to a workload API fail with `503 ServiceUnavailable`
//!   (the runtime keeps running: kubelets do not need the management
//!   network); [`break_kubeconfig`](Fleet::break_kubeconfig) corrupts,
//!   replaces with an exec-plugin config, or deletes a kubeconfig Secret.
//!
//! Tests read and write with the unrecorded clients
//! ([`management_direct`](Fleet::management_direct),
//! [`workload_client`](Fleet::workload_client)) so their own calls never
//! show up among the controller's operations.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use etcdfleet_api::{ClusterEtcdTemplate, EtcdCluster, EtcdTemplate};
use etcdfleet_controllers::connector::WorkloadClientFactory;
use etcdfleet_controllers::connector::WorkloadCluster;
use etcdfleet_controllers::dialer::EtcdDialer;
use etcdfleet_controllers::etcd::{EtcdStream, Transport};
use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::client::Body;
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};
use kube_fake_client::ClientBuilder;
use serde_json::{Value, json};

use crate::runtime::{BackgroundSync, ImageTable, WorkloadRuntime};

/// The management namespace tests use unless they pick another.
pub const DEFAULT_NAMESPACE: &str = "team-a";

/// The `cluster` of operations on the management API.
pub const MANAGEMENT: &str = "management";

/// One API call, as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiOp {
    /// `"management"` or the workload cluster's name.
    pub cluster: String,
    /// get, list, watch, create, replace, patch, delete, delete_collection,
    /// or `<verb>_<subresource>` (get_status, patch_status, replace_status,
    /// patch_scale, ...).
    pub verb: String,
    /// API group, empty for the core group.
    pub group: String,
    pub version: String,
    /// Plural resource name (`secrets`, `statefulsets`, `etcdclusters`).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The raw query string (label/field selectors, fieldManager, dryRun, ...).
    pub query: Option<String>,
    /// For patches: `merge`, `json`, `strategic` or `apply`.
    pub patch_type: Option<String>,
    /// The request body (create/replace/patch objects, delete options with
    /// their preconditions), if any.
    pub body: Option<Value>,
    /// Refused by an injected outage (never reached the fake API).
    pub rejected: bool,
    /// The request's bearer token, if any: tells apart processes that share
    /// one identity (replicas of the controller).
    pub token: Option<String>,
}

impl ApiOp {
    pub fn is_read(&self) -> bool {
        ["get", "list", "watch"]
            .iter()
            .any(|v| self.verb == *v || self.verb.starts_with(&format!("{v}_")))
    }

    pub fn is_write(&self) -> bool {
        !self.is_read()
    }

    /// The value of a query parameter, e.g. `fieldManager`.
    pub fn query_param(&self, key: &str) -> Option<String> {
        self.query.as_deref()?.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k == key).then(|| v.to_string())
        })
    }

    pub(crate) fn from_request(
        cluster: &str,
        parts: &http::request::Parts,
        body: &[u8],
        rejected: bool,
    ) -> ApiOp {
        let segments: Vec<&str> = parts
            .uri
            .path()
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let (group, rest) = match segments.first() {
            Some(&"api") => ("", &segments[1..]),
            Some(&"apis") if segments.len() > 1 => (segments[1], &segments[2..]),
            _ => ("", &segments[..0]),
        };
        let version = rest.first().copied().unwrap_or_default();
        let rest = rest.get(1..).unwrap_or_default();
        let (namespace, resource, name, subresource) = if rest.len() >= 3 && rest[0] == "namespaces"
        {
            (
                Some(rest[1]),
                rest[2],
                rest.get(3).copied(),
                rest.get(4).copied(),
            )
        } else {
            (
                None,
                rest.first().copied().unwrap_or_default(),
                rest.get(1).copied(),
                rest.get(2).copied(),
            )
        };
        let query = parts.uri.query().map(str::to_string);
        let watch = query
            .as_deref()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let base = match (parts.method.as_str(), name.is_some()) {
            ("GET", true) => "get",
            ("GET", false) if watch => "watch",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "replace",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "delete_collection",
            (other, _) => other,
        };
        let verb = match subresource {
            Some(sub) => format!("{base}_{sub}"),
            None => base.to_string(),
        };
        let patch_type = (parts.method == http::Method::PATCH).then(|| {
            let ct = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            match ct {
                "application/apply-patch+yaml" => "apply",
                "application/json-patch+json" => "json",
                "application/strategic-merge-patch+json" => "strategic",
                _ => "merge",
            }
            .to_string()
        });
        ApiOp {
            cluster: cluster.to_string(),
            verb,
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            query,
            patch_type,
            body: (!body.is_empty()).then(|| {
                serde_json::from_slice(body)
                    .unwrap_or_else(|_| json!(String::from_utf8_lossy(body)))
            }),
            rejected,
            token: parts
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_string),
        }
    }
}

impl std::fmt::Display for ApiOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} {}", self.cluster, self.verb, self.resource)?;
        if let Some(ns) = &self.namespace {
            write!(f, " -n {ns}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        Ok(())
    }
}

/// Shared log of [`ApiOp`]s.
#[derive(Debug, Clone, Default)]
pub struct OpRecorder {
    ops: Arc<Mutex<Vec<ApiOp>>>,
}

impl OpRecorder {
    pub(crate) fn push(&self, op: ApiOp) {
        self.ops.lock().expect("lock").push(op);
    }

    pub fn ops(&self) -> Vec<ApiOp> {
        self.ops.lock().expect("lock").clone()
    }

    pub fn clear(&self) {
        self.ops.lock().expect("lock").clear();
    }
}

/// A `kube::Client` that records every request into `recorder` and, while
/// `outage` is set, answers `503 ServiceUnavailable` instead of forwarding.
fn recorded_client(
    cluster: &str,
    inner: Client,
    recorder: OpRecorder,
    outage: Arc<AtomicBool>,
) -> Client {
    let cluster = cluster.to_string();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let (inner, recorder, cluster, outage) = (
            inner.clone(),
            recorder.clone(),
            cluster.clone(),
            outage.clone(),
        );
        async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await?;
            let rejected = outage.load(Ordering::SeqCst);
            recorder.push(ApiOp::from_request(&cluster, &parts, &bytes, rejected));
            if rejected {
                return Ok(service_unavailable(&cluster));
            }
            inner
                .send(http::Request::from_parts(parts, Body::from(bytes.to_vec())))
                .await
        }
    });
    Client::new(service, "default")
}

/// Cluster-scoped custom resources of the management API, as
/// `(group, version, plural)`.
const CLUSTER_SCOPED_CRDS: [(&str, &str, &str); 1] =
    [("etcdfleet.dev", "v1alpha1", "clusteretcdtemplates")];

/// The namespace the fake API keeps cluster-scoped custom resources in.
const CLUSTER_SCOPE_NAMESPACE: &str = "fleet-cluster-scope";

/// kube-fake-client registers every custom resource as namespaced, so it
/// refuses `ClusterEtcdTemplate`s at their cluster-scoped paths. This
/// wrapper serves them there as an API server would: requests to
/// `/apis/<group>/<version>/<plural>[/...]` go to a hidden namespace of the
/// fake API, and `metadata.namespace` is removed from what comes back.
fn cluster_scoped_crds(inner: Client) -> Client {
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let inner = inner.clone();
        async move {
            let (mut parts, body) = request.into_parts();
            let path = parts.uri.path().to_string();
            let rewritten = CLUSTER_SCOPED_CRDS.iter().find_map(|(g, v, plural)| {
                let prefix = format!("/apis/{g}/{v}/{plural}");
                let rest = path.strip_prefix(&prefix)?;
                (rest.is_empty() || rest.starts_with('/')).then(|| {
                    format!("/apis/{g}/{v}/namespaces/{CLUSTER_SCOPE_NAMESPACE}/{plural}{rest}")
                })
            });
            let Some(new_path) = rewritten else {
                return inner.send(http::Request::from_parts(parts, body)).await;
            };
            let path_and_query = match parts.uri.query() {
                Some(q) => format!("{new_path}?{q}"),
                None => new_path,
            };
            parts.uri = path_and_query
                .parse()
                .expect("a rewritten path of a valid URI is valid");
            let response = inner.send(http::Request::from_parts(parts, body)).await?;
            let (parts, body) = response.into_parts();
            let bytes = body.collect_bytes().await?;
            let bytes = match serde_json::from_slice::<Value>(&bytes) {
                Ok(mut value) => {
                    let strip = |o: &mut Value| {
                        if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                            meta.remove("namespace");
                        }
                    };
                    if let Some(items) = value.get_mut("items").and_then(Value::as_array_mut) {
                        items.iter_mut().for_each(strip);
                    } else if value.get("kind").and_then(Value::as_str) != Some("Status") {
                        strip(&mut value);
                    }
                    value.to_string().into_bytes()
                }
                Err(_) => bytes.to_vec(),
            };
            Ok(http::Response::from_parts(parts, Body::from(bytes)))
        }
    });
    Client::new(service, "default")
}

fn service_unavailable(cluster: &str) -> http::Response<Body> {
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("the server is currently unable to handle the request (injected outage of {cluster})"),
        "reason": "ServiceUnavailable",
        "code": 503,
    });
    http::Response::builder()
        .status(http::StatusCode::SERVICE_UNAVAILABLE)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(status.to_string().into_bytes()))
        .expect("static response")
}

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
    server: String,
    kubeconfig: String,
    direct: Client,
    recorded: Client,
    runtime: Arc<WorkloadRuntime>,
    outage: Arc<AtomicBool>,
}

/// A management cluster and its workload clusters. See the module docs.
pub struct Fleet {
    namespace: String,
    management_direct: Client,
    management: Client,
    workloads: BTreeMap<String, Workload>,
    recorder: OpRecorder,
}

/// The workload API server URL of workload cluster `name`.
pub fn server_url_for(name: &str) -> String {
    format!("https://{name}.workload.test:6443")
}

fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:016x}", h.finish())
}

pub(crate) fn base64(bytes: &[u8]) -> String {
    // k8s-openapi's ByteString serializes as base64: no extra crate needed.
    match serde_json::to_value(ByteString(bytes.to_vec())) {
        Ok(Value::String(s)) => s,
        _ => unreachable!("ByteString serializes to a string"),
    }
}

/// A real kubeconfig for workload `name`: token user, inline CA data.
fn kubeconfig_yaml(name: &str, server: &str) -> Result<String> {
    let ca = rcgen::generate_simple_self_signed(vec![format!("{name}.workload.test")])?;
    let ca_data = base64(ca.cert.pem().as_bytes());
    let token = random_hex();
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server}
    certificate-authority-data: {ca_data}
users:
- name: {name}-admin
  user:
    token: {token}
contexts:
- name: {name}-admin@{name}
  context:
    cluster: {name}
    user: {name}-admin
current-context: {name}-admin@{name}
"
    );
    // Keep the fixture honest: it must parse as a kubeconfig.
    Kubeconfig::from_yaml(&text).context("the generated kubeconfig does not parse")?;
    Ok(text)
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

/// Stands in for `EtcdCluster` where kube-fake-client wants a `Default`
/// instance only to learn the group/version/kind (status subresource).
#[derive(serde::Serialize)]
pub struct EtcdClusterKind {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    #[serde(skip)]
    metadata: ObjectMeta,
}

impl Default for EtcdClusterKind {
    fn default() -> Self {
        EtcdClusterKind {
            api_version: <EtcdCluster as kube::Resource>::api_version(&()).into_owned(),
            kind: <EtcdCluster as kube::Resource>::kind(&()).into_owned(),
            metadata: ObjectMeta::default(),
        }
    }
}

impl kube::Resource for EtcdClusterKind {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// [`EtcdClusterKind`] for any custom resource (backups register their
/// status subresource through it).
#[derive(serde::Serialize)]
pub struct KindOf<K> {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    #[serde(skip)]
    metadata: ObjectMeta,
    #[serde(skip)]
    _kind: std::marker::PhantomData<K>,
}

impl<K: kube::Resource<DynamicType = ()>> Default for KindOf<K> {
    fn default() -> Self {
        KindOf {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            metadata: ObjectMeta::default(),
            _kind: std::marker::PhantomData,
        }
    }
}

impl<K: kube::Resource<DynamicType = ()>> kube::Resource for KindOf<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

async fn management_api(namespace: &str) -> Result<Client> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Ok(ClientBuilder::new()
        .with_resource::<EtcdCluster>()
        .with_status_subresource::<EtcdClusterKind>()
        .with_resource::<EtcdTemplate>()
        .with_resource::<ClusterEtcdTemplate>()
        .with_resource::<etcdfleet_api::EtcdBackup>()
        .with_status_subresource::<KindOf<etcdfleet_api::EtcdBackup>>()
        .with_resource::<etcdfleet_api::EtcdBackupSchedule>()
        .with_status_subresource::<KindOf<etcdfleet_api::EtcdBackupSchedule>>()
        .with_resource::<Secret>()
        .with_resource::<k8s_openapi::api::events::v1::Event>()
        .with_resource::<k8s_openapi::api::core::v1::Event>()
        .with_resource::<Lease>()
        .with_resource::<Namespace>()
        .with_object(ns)
        .build()
        .await?)
}

async fn workload_api() -> Result<Client> {
    Ok(ClientBuilder::new()
        .with_resource::<StatefulSet>()
        .with_status_subresource::<StatefulSet>()
        .with_resource::<Pod>()
        .with_status_subresource::<Pod>()
        .with_resource::<PersistentVolumeClaim>()
        .with_resource::<Service>()
        .with_resource::<ConfigMap>()
        .with_resource::<Secret>()
        .with_resource::<PodDisruptionBudget>()
        .with_resource::<Namespace>()
        .build()
        .await?)
}

impl Fleet {
    /// A fleet in namespace [`DEFAULT_NAMESPACE`] with the installed etcd images.
    pub async fn new(workload_names: &[&str]) -> Result<Fleet> {
        Self::with_namespace(DEFAULT_NAMESPACE, workload_names).await
    }

    /// A fleet whose kubeconfig Secrets live in `namespace`.
    pub async fn with_namespace(namespace: &str, workload_names: &[&str]) -> Result<Fleet> {
        let recorder = OpRecorder::default();
        let management_direct = cluster_scoped_crds(management_api(namespace).await?);
        let management = recorded_client(
            MANAGEMENT,
            management_direct.clone(),
            recorder.clone(),
            Arc::new(AtomicBool::new(false)),
        );
        let mut fleet = Fleet {
            namespace: namespace.to_string(),
            management_direct,
            management,
            workloads: BTreeMap::new(),
            recorder,
        };
        for &name in workload_names {
            let server = server_url_for(name);
            let direct =
                crate::namespaces::ClusterScopedStore::default().in_front_of(workload_api().await?);
            let outage = Arc::new(AtomicBool::new(false));
            let recorded =
                recorded_client(name, direct.clone(), fleet.recorder.clone(), outage.clone());
            let runtime = Arc::new(WorkloadRuntime::try_new(
                &server,
                direct.clone(),
                ImageTable::installed(),
            )?);
            let kubeconfig = kubeconfig_yaml(name, &server)?;
            fleet.workloads.insert(
                name.to_string(),
                Workload {
                    server,
                    kubeconfig: kubeconfig.clone(),
                    direct,
                    recorded,
                    runtime,
                    outage,
                },
            );
            fleet.put_kubeconfig(name, &kubeconfig).await?;
        }
        Ok(fleet)
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

    /// The management API as the controller sees it (recorded).
    pub fn management(&self) -> Client {
        self.management.clone()
    }

    /// The management API without recording, for test setup and assertions.
    pub fn management_direct(&self) -> Client {
        self.management_direct.clone()
    }

    /// Workload cluster `name`'s API without recording or faults (the
    /// test's `kubectl`).
    pub fn workload_client(&self, name: &str) -> Client {
        self.workload(name).direct.clone()
    }

    /// Workload cluster `name`'s API as the controller sees it: recorded, and
    /// failing while [`set_unreachable`](Self::set_unreachable).
    pub fn controller_workload_client(&self, name: &str) -> Client {
        self.workload(name).recorded.clone()
    }

    pub fn runtime(&self, name: &str) -> &WorkloadRuntime {
        &self.workload(name).runtime
    }

    /// A handle on workload `name`'s runtime that does not keep it alive.
    pub fn runtime_handle(&self, name: &str) -> Weak<WorkloadRuntime> {
        Arc::downgrade(&self.workload(name).runtime)
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
            clients: Arc::new(
                self.workloads
                    .values()
                    .map(|w| (w.server.clone(), w.recorded.clone()))
                    .collect(),
            ),
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
            .outage
            .store(unreachable, Ordering::SeqCst);
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

/// Builds workload clients by server URL from the fleet's fake APIs.
pub struct FleetClientFactory {
    clients: Arc<BTreeMap<String, Client>>,
}

impl WorkloadClientFactory for FleetClientFactory {
    fn build<'a>(
        &'a self,
        _kubeconfig: &'a Kubeconfig,
        server: &'a str,
    ) -> BoxFuture<'a, Result<Client, String>> {
        Box::pin(async move {
            self.clients.get(server).cloned().ok_or_else(|| {
                format!(
                    "no workload cluster of the test fleet serves {server:?} (known: {})",
                    self.clients.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })
        })
    }
}

/// Dials etcd members at their pod IPs, resolving names through the
/// workload runtime of the cluster they belong to.
pub struct FleetDialer {
    runtimes: Arc<BTreeMap<String, Weak<WorkloadRuntime>>>,
    opened: Arc<std::sync::atomic::AtomicU64>,
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
        let mapped = self.dial_url(&workload.server, &member.to_string());
        let opened = self.opened.clone();
        Box::pin(async move {
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
