//! Reaching workload clusters: the kubeconfig Secret of each cluster is read by
//! a direct GET (never a list or watch of Secrets), checked against what a
//! controller may safely run (no exec plugins, no auth providers, no local
//! file references), turned into a `kube::Client` and cached per cluster.
//!
//! The cache key is the Secret (namespace/name); an entry is reused only while
//! the Secret's UID and resourceVersion are unchanged, so a rotated kubeconfig
//! takes effect on the next reconcile. Authentication failures evict the entry;
//! idle entries are evicted after `idle_ttl`. Failures open a per-cluster
//! backoff window that the reconciler turns into its requeue delay, so one
//! broken cluster costs the others nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcdfleet_api::EtcdCluster;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

/// Where an EtcdCluster's kubeconfig lives, in the management cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KubeconfigLocation {
    pub namespace: String,
    pub secret_name: String,
    pub key: String,
}

impl KubeconfigLocation {
    /// `clusterRef` → Secret `<name>-kubeconfig`, key `value`; or the explicit
    /// `kubeconfigSecretRef` (key default `value`). `None` when neither is set
    /// (the CRD's CEL rule makes that impossible on a real API server).
    pub fn of(cluster: &EtcdCluster) -> Option<Self> {
        let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
        if let Some(r) = &cluster.spec.kubeconfig_secret_ref {
            return Some(KubeconfigLocation {
                namespace,
                secret_name: r.name.clone(),
                key: r.key.clone().unwrap_or_else(|| "value".into()),
            });
        }
        cluster
            .spec
            .cluster_ref
            .as_ref()
            .map(|r| KubeconfigLocation {
                namespace,
                secret_name: format!("{}-kubeconfig", r.name),
                key: "value".into(),
            })
    }
}

impl KubeconfigLocation {
    /// Why the Secret's name or key may not be used, if it may not.
    pub fn problem(&self) -> Option<String> {
        use etcdfleet_api::names::{reference_problem, secret_key_problem};
        reference_problem("the kubeconfig Secret's name", &self.secret_name)
            .or_else(|| secret_key_problem("the kubeconfig Secret's key", &self.key))
    }
}

impl std::fmt::Display for KubeconfigLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secret {}/{} key {:?}",
            self.namespace, self.secret_name, self.key
        )
    }
}

/// Why a workload cluster could not be reached. Messages never contain Secret data.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    #[error("the EtcdCluster names no workload cluster (set clusterRef or kubeconfigSecretRef)")]
    NoClusterReference,
    #[error("the kubeconfig Secret is not named as a Secret can be: {0}")]
    InvalidReference(String),
    #[error("kubeconfig {0} not found")]
    SecretNotFound(KubeconfigLocation),
    #[error("kubeconfig {0}: the key is missing from the Secret")]
    SecretKeyMissing(KubeconfigLocation),
    #[error("kubeconfig {location} is not a usable kubeconfig: {detail}")]
    KubeconfigInvalid {
        location: KubeconfigLocation,
        detail: String,
    },
    #[error("kubeconfig {location} is not allowed: {detail}")]
    KubeconfigNotAllowed {
        location: KubeconfigLocation,
        detail: String,
    },
    #[error("reading kubeconfig {location} from the management cluster failed: {detail}")]
    ManagementApi {
        location: KubeconfigLocation,
        detail: String,
    },
    #[error("workload cluster {server} is unreachable: {detail}")]
    Unreachable { server: String, detail: String },
    #[error("workload cluster {server} rejected the credentials: {detail}")]
    Unauthorized { server: String, detail: String },
}

impl ConnectError {
    /// Short stable reason, used as condition reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ConnectError::NoClusterReference => "NoClusterReference",
            ConnectError::InvalidReference(_) => "InvalidReference",
            ConnectError::SecretNotFound(_) => "KubeconfigSecretNotFound",
            ConnectError::SecretKeyMissing(_) => "KubeconfigKeyMissing",
            ConnectError::KubeconfigInvalid { .. } => "KubeconfigInvalid",
            ConnectError::KubeconfigNotAllowed { .. } => "KubeconfigNotAllowed",
            ConnectError::ManagementApi { .. } => "ManagementAPIError",
            ConnectError::Unreachable { .. } => "WorkloadAPIUnreachable",
            ConnectError::Unauthorized { .. } => "WorkloadAPIUnauthorized",
        }
    }

    /// Classifies an error returned by a workload-cluster API call.
    pub fn from_workload(server: &str, err: &kube::Error) -> Self {
        match err {
            kube::Error::Api(s) if s.code == 401 || s.code == 403 => ConnectError::Unauthorized {
                server: server.to_string(),
                detail: format!("{} ({})", s.message, s.code),
            },
            other => ConnectError::Unreachable {
                server: server.to_string(),
                detail: other.to_string(),
            },
        }
    }
}

/// Builds a client from a checked kubeconfig. Production uses
/// [`KubeconfigClientFactory`]; tests map the server URL onto an in-memory API.
pub trait WorkloadClientFactory: Send + Sync {
    fn build<'a>(
        &'a self,
        kubeconfig: &'a Kubeconfig,
        server: &'a str,
    ) -> BoxFuture<'a, Result<Client, String>>;
}

/// The real factory: a `kube::Client` from the kubeconfig, with short
/// timeouts so an unreachable cluster fails fast.
#[derive(Debug, Clone)]
pub struct KubeconfigClientFactory {
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// The most of an answer read, and the longest a call may take
    /// ([`bounded`]).
    pub bounds: bounded::BoundedLayer,
}

impl Default for KubeconfigClientFactory {
    fn default() -> Self {
        KubeconfigClientFactory {
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(20),
            bounds: bounded::BoundedLayer::default(),
        }
    }
}

impl WorkloadClientFactory for KubeconfigClientFactory {
    fn build<'a>(
        &'a self,
        kubeconfig: &'a Kubeconfig,
        _server: &'a str,
    ) -> BoxFuture<'a, Result<Client, String>> {
        Box::pin(async move {
            let mut config = kube::Config::from_custom_kubeconfig(
                kubeconfig.clone(),
                &KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
            config.connect_timeout = Some(self.connect_timeout);
            config.read_timeout = Some(self.read_timeout);
            // The read timeout counts from each request's write (kube 5),
            // not from when its pooled connection went idle: otherwise a
            // connection idle for 9 s leaves its next request 11 s of 20.
            config.reset_reader_on_write = true;
            // kube's default retry answers a 503/429/504 with up to 15
            // retries on a doubling backoff (minutes in all), stalling the
            // reconcile of a cluster whose API is down; the connector's own
            // per-cluster backoff handles an unavailable workload API.
            config.default_retry = false;
            workload_client(config, self.bounds).map_err(|e| e.to_string())
        })
    }
}

/// TLS sessions a workload client remembers for resumption: it talks to one
/// API server.
const TLS_SESSIONS: usize = 4;

/// How long an idle connection to a workload API server stays open. Long
/// enough for one reconcile's requests to share it; shorter than the
/// converged poll, so a fleet does not hold an idle TLS connection per
/// cluster between polls (the port-forward tunnel to etcd is a connection of
/// its own, kept by the etcd client pool).
const IDLE_CONNECTION: Duration = Duration::from_secs(10);

/// A workload API client: kube's layers (base URI, credentials, extra
/// headers, an `HTTP` span per request named by its verb) and timeouts, over
/// a connector of its own that differs from kube's default in three ways:
///
/// - TCP_NODELAY: a request's last segment leaves at once instead of waiting
///   behind Nagle's algorithm for the API server's delayed ACK (tens of ms);
/// - a TLS config that remembers a few sessions: the default one allocates
///   a 256-entry cache, about 14 KiB held for every workload cluster;
/// - an idle connection closes after [`IDLE_CONNECTION`], not 90 s;
///
/// and under kube's layers, the bounds of every call ([`bounded`]).
///
/// A kubeconfig with a proxy gets kube's own builder (and its answer),
/// under the same bounds.
fn workload_client(
    config: kube::Config,
    bounds: bounded::BoundedLayer,
) -> Result<Client, kube::Error> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;

    if config.proxy_url.is_some() {
        return Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(&bounds)
            .build());
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let mut tls = config.rustls_client_config()?;
    tls.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| kube::Error::Service(format!("tls-server-name {name:?}: {e}").into()))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let mut connector =
        hyper_timeout::TimeoutConnector::new(https.enable_http1().wrap_connector(http));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(IDLE_CONNECTION)
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(bounds)
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_body_chunk(())
                .on_eos(())
                .on_response(
                    |res: &http::Response<hyper::body::Incoming>,
                     _: Duration,
                     span: &tracing::Span| {
                        let status = res.status();
                        span.record("http.status_code", status.as_u16());
                        if status.is_client_error() || status.is_server_error() {
                            span.record("otel.status_code", "ERROR");
                        }
                    },
                )
                .on_failure(
                    |_: tower_http::classify::ServerErrorsFailureClass,
                     _: Duration,
                     span: &tracing::Span| {
                        span.record("otel.status_code", "ERROR");
                    },
                ),
        )
        .map_err(tower::BoxError::from)
        .service(client);
    Ok(kube::client::ClientBuilder::new(service, config.default_namespace).build())
}

/// One span per workload API request (OpenTelemetry's HTTP client
/// attributes); kube puts the verb of the call in the request's extensions,
/// which names the span.
fn request_span<B>(req: &http::Request<B>) -> tracing::Span {
    tracing::debug_span!(
        target: crate::telemetry::HTTP_SPAN_TARGET,
        "HTTP",
        http.method = %req.method(),
        http.url = %req.uri(),
        http.status_code = tracing::field::Empty,
        otel.name = req.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
    )
}

/// Parses and checks a kubeconfig: exactly one usable context, inline
/// credentials only. Returns the kubeconfig and its server URL.
pub fn check_kubeconfig(
    location: &KubeconfigLocation,
    text: &str,
) -> Result<(Kubeconfig, String), ConnectError> {
    let invalid = |detail: String| ConnectError::KubeconfigInvalid {
        location: location.clone(),
        detail,
    };
    let not_allowed = |detail: &str| ConnectError::KubeconfigNotAllowed {
        location: location.clone(),
        detail: detail.to_string(),
    };
    // The YAML error text can quote input; keep only its position.
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| {
        let msg = e.to_string();
        let position = msg
            .find(" at line ")
            .map(|i| msg[i..].to_string())
            .unwrap_or_default();
        invalid(format!("cannot parse it as a kubeconfig{position}"))
    })?;
    let context_name = kubeconfig
        .current_context
        .clone()
        .or_else(|| (kubeconfig.contexts.len() == 1).then(|| kubeconfig.contexts[0].name.clone()))
        .ok_or_else(|| invalid("it has no current-context".into()))?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| invalid(format!("context {context_name:?} is not defined")))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| invalid(format!("cluster {:?} is not defined", context.cluster)))?;
    let server = cluster
        .server
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid(format!("cluster {:?} has no server", context.cluster)))?;
    let url: http::Uri = server
        .parse()
        .map_err(|_| invalid(format!("server {server:?} is not a URL")))?;
    if url.scheme_str() != Some("https") && url.scheme_str() != Some("http") {
        return Err(invalid(format!("server {server:?} is not an http(s) URL")));
    }
    if cluster.certificate_authority.is_some() {
        return Err(not_allowed(
            "cluster.certificate-authority refers to a local file; use certificate-authority-data",
        ));
    }
    if let Some(user_name) = &context.user {
        let auth = kubeconfig
            .auth_infos
            .iter()
            .find(|a| &a.name == user_name)
            .and_then(|a| a.auth_info.as_ref())
            .ok_or_else(|| invalid(format!("user {user_name:?} is not defined")))?;
        if auth.exec.is_some() {
            return Err(not_allowed(
                "user.exec runs a credential plugin; the controller runs no programs named by a kubeconfig",
            ));
        }
        if auth.auth_provider.is_some() {
            return Err(not_allowed(
                "user.auth-provider is not supported; use a token or client certificate",
            ));
        }
        if auth.token_file.is_some() {
            return Err(not_allowed(
                "user.tokenFile refers to a local file; use token",
            ));
        }
        if auth.client_certificate.is_some() || auth.client_key.is_some() {
            return Err(not_allowed(
                "user.client-certificate/client-key refer to local files; use the -data fields",
            ));
        }
    }
    Ok((kubeconfig, server))
}

/// A connected workload cluster.
#[derive(Clone)]
pub struct WorkloadCluster {
    /// The API server URL, which also identifies the cluster to the [`crate::dialer::EtcdDialer`].
    pub server: String,
    pub client: Client,
}

struct CacheEntry {
    uid: String,
    resource_version: String,
    cluster: WorkloadCluster,
    last_used: Instant,
    /// When the Secret was last read and found unchanged.
    verified: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    until: Instant,
}

/// Tunables of the connector.
#[derive(Debug, Clone, Copy)]
pub struct ConnectorSettings {
    pub idle_ttl: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for ConnectorSettings {
    fn default() -> Self {
        ConnectorSettings {
            idle_ttl: Duration::from_secs(15 * 60),
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(5 * 60),
        }
    }
}

/// Builds and caches workload-cluster clients from kubeconfig Secrets.
pub struct WorkloadClusterConnector {
    management: Client,
    factory: Arc<dyn WorkloadClientFactory>,
    settings: ConnectorSettings,
    cache: Mutex<HashMap<KubeconfigLocation, CacheEntry>>,
    backoff: Mutex<HashMap<KubeconfigLocation, Backoff>>,
}

impl WorkloadClusterConnector {
    pub fn new(
        management: Client,
        factory: Arc<dyn WorkloadClientFactory>,
        settings: ConnectorSettings,
    ) -> Self {
        WorkloadClusterConnector {
            management,
            factory,
            settings,
            cache: Mutex::new(HashMap::new()),
            backoff: Mutex::new(HashMap::new()),
        }
    }

    /// Like [`connect`](Self::connect), but a client whose Secret was read
    /// less than `trust_for` ago is returned without reading it again. Safe
    /// because a rotated kubeconfig shows up as an authentication failure
    /// (which evicts the client, see [`record_failure`](Self::record_failure))
    /// and is picked up within `trust_for` otherwise.
    pub async fn connect_trusting(
        &self,
        location: &KubeconfigLocation,
        trust_for: Duration,
    ) -> Result<WorkloadCluster, ConnectError> {
        if !trust_for.is_zero() {
            let mut cache = self.cache.lock().expect("connector cache poisoned");
            if let Some(entry) = cache.get_mut(location)
                && entry.verified.elapsed() < trust_for
            {
                entry.last_used = Instant::now();
                return Ok(entry.cluster.clone());
            }
        }
        self.connect(location).await
    }

    /// Reads the kubeconfig Secret (one GET) and returns a client for its
    /// cluster, reusing the cached one while the Secret is unchanged.
    pub async fn connect(
        &self,
        location: &KubeconfigLocation,
    ) -> Result<WorkloadCluster, ConnectError> {
        // The name and key go into a request path and a lookup: checked
        // again here, whatever admission let through before its rule.
        if let Some(problem) = location.problem() {
            return Err(ConnectError::InvalidReference(problem));
        }
        let secrets: Api<Secret> = Api::namespaced(self.management.clone(), &location.namespace);
        let secret = match secrets.get_opt(&location.secret_name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                self.evict(location);
                return Err(ConnectError::SecretNotFound(location.clone()));
            }
            Err(e) => {
                return Err(ConnectError::ManagementApi {
                    location: location.clone(),
                    detail: e.to_string(),
                });
            }
        };
        let uid = secret.metadata.uid.clone().unwrap_or_default();
        let resource_version = secret.metadata.resource_version.clone().unwrap_or_default();
        {
            let mut cache = self.cache.lock().expect("connector cache poisoned");
            if let Some(entry) = cache.get_mut(location)
                && entry.uid == uid
                && entry.resource_version == resource_version
            {
                entry.last_used = Instant::now();
                entry.verified = Instant::now();
                return Ok(entry.cluster.clone());
            }
        }
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&location.key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&location.key))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| ConnectError::SecretKeyMissing(location.clone()))?;
        let text = String::from_utf8(bytes).map_err(|_| ConnectError::KubeconfigInvalid {
            location: location.clone(),
            detail: "it is not UTF-8 text".into(),
        })?;
        let (kubeconfig, server) = check_kubeconfig(location, &text)?;
        let client = self
            .factory
            .build(&kubeconfig, &server)
            .await
            .map_err(|detail| ConnectError::KubeconfigInvalid {
                location: location.clone(),
                detail: format!("cannot build a client from it: {detail}"),
            })?;
        let cluster = WorkloadCluster { server, client };
        self.cache.lock().expect("connector cache poisoned").insert(
            location.clone(),
            CacheEntry {
                uid,
                resource_version,
                cluster: cluster.clone(),
                last_used: Instant::now(),
                verified: Instant::now(),
            },
        );
        Ok(cluster)
    }

    /// Records a failure of this cluster: opens (or widens) its backoff
    /// window, and drops the cached client on an authentication failure.
    /// Returns how long to wait before trying it again.
    pub fn record_failure(&self, location: &KubeconfigLocation, err: &ConnectError) -> Duration {
        if matches!(err, ConnectError::Unauthorized { .. }) {
            self.evict(location);
        }
        let mut backoff = self.backoff.lock().expect("connector backoff poisoned");
        let entry = backoff.entry(location.clone()).or_insert(Backoff {
            failures: 0,
            until: Instant::now(),
        });
        entry.failures = entry.failures.saturating_add(1);
        let delay = self
            .settings
            .backoff_base
            .saturating_mul(1u32 << (entry.failures - 1).min(16))
            .min(self.settings.backoff_max);
        entry.until = Instant::now() + delay;
        delay
    }

    /// Clears the backoff of a cluster after a successful reconcile.
    pub fn record_success(&self, location: &KubeconfigLocation) {
        self.backoff
            .lock()
            .expect("connector backoff poisoned")
            .remove(location);
    }

    /// Forgets a cluster that is gone (its backoff and cached client), so
    /// maps keyed by cluster do not grow with every cluster ever deleted.
    pub fn forget(&self, location: &KubeconfigLocation) {
        self.backoff
            .lock()
            .expect("connector backoff poisoned")
            .remove(location);
        self.cache
            .lock()
            .expect("connector cache poisoned")
            .remove(location);
    }

    /// Remaining backoff of a cluster, if it is in one.
    pub fn backoff_remaining(&self, location: &KubeconfigLocation) -> Option<Duration> {
        let backoff = self.backoff.lock().expect("connector backoff poisoned");
        backoff
            .get(location)
            .and_then(|b| b.until.checked_duration_since(Instant::now()))
    }

    /// Forgets the cached client of a cluster.
    pub fn evict(&self, location: &KubeconfigLocation) {
        self.cache
            .lock()
            .expect("connector cache poisoned")
            .remove(location);
    }

    /// Drops clients unused for longer than the idle TTL. Returns how many.
    pub fn evict_idle(&self) -> usize {
        let ttl = self.settings.idle_ttl;
        let mut cache = self.cache.lock().expect("connector cache poisoned");
        let before = cache.len();
        cache.retain(|_, e| e.last_used.elapsed() < ttl);
        before - cache.len()
    }

    /// Number of cached clients.
    pub fn cached(&self) -> usize {
        self.cache.lock().expect("connector cache poisoned").len()
    }
}

pub mod bounded;

#[cfg(test)]
mod tests;
