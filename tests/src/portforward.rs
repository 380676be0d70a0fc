//! `pods/portforward` as the test world's API servers serve it: the
//! websocket protocol kube's client speaks (`v4.channel.k8s.io`, framed by
//! [`crate::portforward_ws`]), bridged to the pod's address in the workload
//! runtime. One TCP connection to the pod is opened per port per request,
//! as the kubelet does; the tunnel closes when the first of them does.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::portforward_ws::{Closing, Handshake, Target, ports_from_query, spawn_tunnel};

/// What the test API server calls for `.../pods/<pod>/portforward`
/// (arguments: the request, the namespace, the pod).
pub type UpgradeHandler = Arc<
    dyn Fn(Request<Incoming>, String, String) -> BoxFuture<'static, Response<Full<Bytes>>>
        + Send
        + Sync,
>;

/// Where a pod listens: `(namespace, pod)` → its IP, if it has one.
pub type PodAddresses = Arc<dyn Fn(&str, &str) -> Option<Ipv4Addr> + Send + Sync>;

pub use crate::portforward_ws::PROTOCOL;

/// Serves port-forward to the pods `addresses` knows; counts tunnels and can
/// break every open one (to test that the controller recovers).
pub struct PortForwardServer {
    addresses: PodAddresses,
    opened: AtomicU64,
    /// Bumped to cut every open tunnel.
    breaker: watch::Sender<u64>,
}

impl PortForwardServer {
    pub fn new(addresses: PodAddresses) -> Arc<Self> {
        Arc::new(PortForwardServer {
            addresses,
            opened: AtomicU64::new(0),
            breaker: watch::channel(0).0,
        })
    }

    /// For a workload runtime: pods at their runtime IPs.
    pub fn for_runtime(runtime: std::sync::Weak<crate::runtime::WorkloadRuntime>) -> Arc<Self> {
        Self::new(Arc::new(move |ns: &str, pod: &str| {
            runtime.upgrade()?.pod_ip(ns, pod)
        }))
    }

    /// Tunnels (upgraded requests) served so far.
    pub fn tunnels_opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }

    /// Closes every open tunnel, as an API server restart or a dropped
    /// connection would.
    pub fn break_tunnels(&self) {
        self.breaker.send_modify(|g| *g += 1);
    }

    /// The handler to plug into a served API.
    pub fn handler(self: &Arc<Self>) -> UpgradeHandler {
        let server = self.clone();
        Arc::new(move |req, ns, pod| {
            let server = server.clone();
            Box::pin(async move { server.serve(req, ns, pod) })
        })
    }

    fn serve(
        self: Arc<Self>,
        req: Request<Incoming>,
        ns: String,
        pod: String,
    ) -> Response<Full<Bytes>> {
        let ports = match ports_of(req.uri()) {
            Ok(p) => p,
            Err(message) => return status(StatusCode::BAD_REQUEST, &message),
        };
        let handshake = match Handshake::check(req.headers()) {
            Ok(handshake) => handshake,
            Err(message) => return status(StatusCode::BAD_REQUEST, &message),
        };
        let Some(ip) = (self.addresses)(&ns, &pod) else {
            return status(
                StatusCode::NOT_FOUND,
                &format!("pods \"{pod}\" not found or has no IP in namespace {ns}"),
            );
        };
        self.opened.fetch_add(1, Ordering::SeqCst);
        let target = Target {
            pod: format!("{ns}/{pod}"),
            ip: IpAddr::V4(ip),
            ports,
            closing: Closing::FirstPodConnection,
        };
        spawn_tunnel(req, target, self.breaker.subscribe());
        handshake.switching_protocols()
    }
}

fn status(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code.as_u16(),
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        "application/json".parse().expect("static"),
    );
    response
}

/// The `ports` query parameter (`ports=2379` or `ports=80%2C1234`, possibly
/// repeated).
pub fn ports_of(uri: &http::Uri) -> Result<Vec<u16>, String> {
    ports_from_query(uri, "ports")
}

/// A plain-HTTP server answering only `pods/<pod>/portforward` with
/// `server`'s handler (everything else is 404), and a kube client for it.
/// For tests whose workload API is in-process (no served HTTP API): the
/// controller's port-forward dialer then goes through it.
pub struct ServedPortForward {
    pub url: String,
    pub client: kube::Client,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ServedPortForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `/api/v1/namespaces/<ns>/pods/<pod>/portforward` → `(ns, pod)`.
pub fn portforward_target(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let mut parts = rest.split('/');
    let (ns, kind, pod, sub) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    (kind == "pods" && sub == "portforward" && parts.next().is_none())
        .then(|| (ns.to_string(), pod.to_string()))
}

pub async fn serve(handler: UpgradeHandler) -> anyhow::Result<ServedPortForward> {
    serve_now(handler)
}

/// [`serve`] from synchronous code (inside a Tokio runtime).
pub fn serve_now(handler: UpgradeHandler) -> anyhow::Result<ServedPortForward> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let _ = tcp.set_nodelay(true);
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let handler = handler.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            match portforward_target(req.uri().path()) {
                                Some((ns, pod)) => handler(req, ns, pod).await,
                                None => status(
                                    StatusCode::NOT_FOUND,
                                    "only port-forward is served here",
                                ),
                            },
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    // Plain HTTP, so no TLS stack is involved in the test client.
    let config = kube::Config::new(url.parse()?);
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<kube::client::Body>();
    let service = tower::ServiceBuilder::new()
        .layer(kube::client::ConfigExt::base_uri_layer(&config))
        .service(http);
    let client = kube::Client::new(service, "default");
    Ok(ServedPortForward { url, client, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_from_the_query_as_kube_encodes_them() {
        let uri: http::Uri = "/api/v1/namespaces/ns/pods/foo/portforward?&ports=80%2C1234"
            .parse()
            .unwrap();
        assert_eq!(ports_of(&uri).unwrap(), vec![80, 1234]);
        let uri: http::Uri = "/x?ports=2379".parse().unwrap();
        assert_eq!(ports_of(&uri).unwrap(), vec![2379]);
        let uri: http::Uri = "/x?ports=http".parse().unwrap();
        assert!(ports_of(&uri).is_err());
        let uri: http::Uri = "/x".parse().unwrap();
        assert!(ports_of(&uri).is_err());
    }

    #[test]
    fn only_pod_portforward_paths_are_targets() {
        assert_eq!(
            portforward_target("/api/v1/namespaces/ns/pods/p-0/portforward"),
            Some(("ns".into(), "p-0".into()))
        );
        assert_eq!(portforward_target("/api/v1/namespaces/ns/pods/p-0"), None);
        assert_eq!(
            portforward_target("/api/v1/namespaces/ns/services/p/portforward"),
            None
        );
    }
}
