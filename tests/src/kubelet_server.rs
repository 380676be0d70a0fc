//! The kubelet API of the test world's process kubelet, as far as a real
//! kube-apiserver needs it for `pods/portforward`: HTTPS (a self-signed
//! certificate; API servers started without `--kubelet-certificate-authority`
//! do not verify it) serving `/portForward/{namespace}/{pod}[/{uid}]`, GET or
//! POST. Every other path answers 404. The pod UID, when given, is not
//! checked.
//!
//! What a kube-apiserver (1.37) sends here, by what its client asked:
//! - kube-rs and the controller (`v4.channel.k8s.io` WebSocket): the upgrade
//!   passed through unchanged (`Upgrade: websocket`, the client's
//!   `Sec-WebSocket-*` headers), the client's `?ports=` renamed `?port=`
//!   with the ports comma-joined (`port=2379%2C2380`). Served by
//!   [`crate::portforward_ws`]: ports as given, one pod connection each,
//!   the tunnel ending once every one of them has ended (as the kubelet).
//! - kubectl and client-go (a WebSocket asking for
//!   `SPDY/3.1+portforward.k8s.io`): the API server ends that WebSocket
//!   itself and sends here `POST` with `Connection: Upgrade`,
//!   `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version: portforward.k8s.io`,
//!   no query and no `Sec-WebSocket-*`; then it carries the SPDY bytes
//!   between its client and here. The answer is 101 with `Upgrade: SPDY/3.1`
//!   and `X-Stream-Protocol-Version: portforward.k8s.io` (without it the API
//!   server's WebSocket to the client has no subprotocol and the client
//!   gives up). A client speaking SPDY itself (kubectl with
//!   `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`) arrives the same way, its
//!   upgrade passed through.
//!
//! Use: [`KubeletServer::start`] with a [`PodResolver`] ([`runtime_pods`]
//! for a workload runtime); a Node then names the server by an `InternalIP`
//! address (the bind address) and [`KubeletServer::port`] as
//! `status.daemonEndpoints.kubeletEndpoint.Port`.
//!
//! SPDY port-forward, the kubelet's way: the client opens streams in pairs
//! sharing a `requestID` header, one with `streamType: error` and one with
//! `streamType: data`, each with a `port` header. Each stream is replied to
//! at once (or reset, without a reply, when its headers are invalid). A
//! complete pair gets one TCP connection to the pod's port: bytes both ways,
//! each direction half-closed on its own, then the error stream closes
//! empty. If the connection cannot be made, the error stream carries the
//! message and both streams are reset. A pair still incomplete after
//! [`STREAM_CREATION_TIMEOUT`] gets a timeout message on its error stream.
//!
//! An unknown pod is answered 404 before any upgrade, as the kubelet does;
//! a pod that disappears later fails its next forwarded connection.
//!
//! The server counts tunnels (upgraded requests, either protocol) and can
//! break every open one at once, like a lost connection; dropping it stops
//! it and breaks its tunnels.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::portforward_ws::{
    Closing, Handshake, Target, forwarding_error, is_websocket, ports_from_query, spawn_tunnel,
};
use crate::spdy::{self, Connection, Headers, Role, Stream};

/// Where a pod listens: `(namespace, pod)` → its IP, if it exists and has one.
pub type PodResolver = Arc<dyn Fn(&str, &str) -> Option<IpAddr> + Send + Sync>;

/// The pods of a workload runtime, at their runtime IPs.
pub fn runtime_pods(runtime: std::sync::Weak<crate::runtime::WorkloadRuntime>) -> PodResolver {
    Arc::new(move |ns: &str, pod: &str| runtime.upgrade()?.pod_ip(ns, pod).map(IpAddr::V4))
}

/// The SPDY subprotocol of port-forward (`X-Stream-Protocol-Version`).
pub const SPDY_PROTOCOL: &str = "portforward.k8s.io";
/// How long the first stream of a pair waits for the second (the kubelet's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

const PROTOCOL_VERSION: &str = "x-stream-protocol-version";

/// A kubelet API serving port-forward to the pods its resolver knows.
pub struct KubeletServer {
    addr: SocketAddr,
    forwarding: Arc<Forwarding>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// What every request shares: the pods, the tunnel count, the breaker.
struct Forwarding {
    resolve: PodResolver,
    opened: AtomicU64,
    /// Bumped to cut every open tunnel.
    breaker: watch::Sender<u64>,
}

impl KubeletServer {
    /// Listens on `bind` (port 0 picks one) for the pods `resolve` knows;
    /// needs a Tokio runtime.
    pub fn start(bind: SocketAddr, resolve: PodResolver) -> anyhow::Result<KubeletServer> {
        let config = serving_config(bind.ip()).context("the kubelet's serving certificate")?;
        let listener = std::net::TcpListener::bind(bind)
            .with_context(|| format!("binding the kubelet API to {bind}"))?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let forwarding = Arc::new(Forwarding {
            resolve,
            opened: AtomicU64::new(0),
            breaker: watch::channel(0).0,
        });
        let shutdown = watch::channel(false).0;
        let task = tokio::spawn(accept_connections(
            listener,
            TlsAcceptor::from(Arc::new(config)),
            forwarding.clone(),
            shutdown.subscribe(),
        ));
        Ok(KubeletServer {
            addr,
            forwarding,
            shutdown,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port for the Node's `status.daemonEndpoints.kubeletEndpoint.Port`.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Tunnels (upgraded requests, WebSocket or SPDY) served so far.
    pub fn tunnels_opened(&self) -> u64 {
        self.forwarding.opened.load(Ordering::SeqCst)
    }

    /// Cuts every open tunnel without a goodbye, as a lost connection or a
    /// kubelet restart would.
    pub fn break_tunnels(&self) {
        self.forwarding.breaker.send_modify(|g| *g += 1);
    }
}

impl Drop for KubeletServer {
    fn drop(&mut self) {
        self.task.abort();
        self.shutdown.send_replace(true);
        self.break_tunnels();
    }
}

fn serving_config(ip: IpAddr) -> anyhow::Result<rustls::ServerConfig> {
    let names = vec![ip.to_string(), "localhost".to_string()];
    let certified = rcgen::generate_simple_self_signed(names)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = certified.signing_key.serialize_der();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![certified.cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
        )?;
    // Upgrades are HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

async fn accept_connections(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    forwarding: Arc<Forwarding>,
    shutdown: watch::Receiver<bool>,
) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::debug!(error = %e, "kubelet API: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Go's servers set TCP_NODELAY on every connection.
        let _ = tcp.set_nodelay(true);
        let (acceptor, forwarding) = (acceptor.clone(), forwarding.clone());
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = serve_connection(tcp, acceptor, forwarding) => {}
                _ = shutdown.wait_for(|stopped| *stopped) => {}
            }
        });
    }
}

async fn serve_connection(tcp: TcpStream, acceptor: TlsAcceptor, forwarding: Arc<Forwarding>) {
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    let service = hyper::service::service_fn(move |req| {
        let forwarding = forwarding.clone();
        async move { Ok::<_, std::convert::Infallible>(forwarding.route(req)) }
    });
    // Upgraded tunnels live on in their own tasks.
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades()
        .await;
}

/// `/portForward/{namespace}/{pod}` or `.../{uid}` → `(namespace, pod)`.
fn portforward_target(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/portForward/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [ns, pod] | [ns, pod, _] if !ns.is_empty() && !pod.is_empty() => {
            Some((ns.to_string(), pod.to_string()))
        }
        _ => None,
    }
}

/// A plain-text answer, as the kubelet's Go handlers write errors.
fn text(code: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        "text/plain; charset=utf-8".parse().expect("static"),
    );
    response
}

impl Forwarding {
    fn route(self: &Arc<Self>, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let Some((ns, pod)) = portforward_target(req.uri().path()) else {
            return text(StatusCode::NOT_FOUND, "404 page not found");
        };
        if req.method() != Method::GET && req.method() != Method::POST {
            return text(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed");
        }
        if is_websocket(req.headers()) {
            self.websocket(req, ns, pod)
        } else {
            self.spdy(req, ns, pod)
        }
    }

    fn websocket(&self, req: Request<Incoming>, ns: String, pod: String) -> Response<Full<Bytes>> {
        let ports = match ports_from_query(req.uri(), "port") {
            Ok(ports) => ports,
            Err(message) => return text(StatusCode::BAD_REQUEST, &message),
        };
        let Some(ip) = (self.resolve)(&ns, &pod) else {
            return text(StatusCode::NOT_FOUND, "pod does not exist");
        };
        let handshake = match Handshake::check(req.headers()) {
            Ok(handshake) => handshake,
            Err(message) => return text(StatusCode::BAD_REQUEST, &message),
        };
        self.opened.fetch_add(1, Ordering::SeqCst);
        let target = Target {
            pod: format!("{ns}/{pod}"),
            ip,
            ports,
            closing: Closing::LastPodConnection,
        };
        spawn_tunnel(req, target, self.breaker.subscribe());
        handshake.switching_protocols()
    }

    fn spdy(
        self: &Arc<Self>,
        req: Request<Incoming>,
        ns: String,
        pod: String,
    ) -> Response<Full<Bytes>> {
        if (self.resolve)(&ns, &pod).is_none() {
            return text(StatusCode::NOT_FOUND, "pod does not exist");
        }
        if let Err(refusal) = check_spdy_upgrade(req.headers()) {
            return refusal.response();
        }
        self.opened.fetch_add(1, Ordering::SeqCst);
        let pod = PodName { ns, pod };
        tokio::spawn(serve_spdy(self.clone(), req, pod));
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, "Upgrade".parse().expect("static"));
        headers.insert(header::UPGRADE, "SPDY/3.1".parse().expect("static"));
        headers.insert(PROTOCOL_VERSION, SPDY_PROTOCOL.parse().expect("static"));
        response
    }
}

/// Why a SPDY upgrade is refused, with the kubelet's status for it.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn bad_request(message: &str) -> Refusal {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            message: message.to_string(),
        }
    }

    fn response(self) -> Response<Full<Bytes>> {
        let mut response = text(self.status, &self.message);
        if self.status == StatusCode::FORBIDDEN {
            response.headers_mut().insert(
                "x-accepted-stream-protocol-versions",
                SPDY_PROTOCOL.parse().expect("static"),
            );
        }
        response
    }
}

/// The protocol handshake, then the upgrade headers, refused as the
/// kubelet refuses them (400 for what is missing, 403 for a protocol it
/// does not speak).
fn check_spdy_upgrade(headers: &HeaderMap) -> Result<(), Refusal> {
    let offered: Vec<&str> = headers
        .get_all(PROTOCOL_VERSION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return Err(Refusal::bad_request(
            "unable to upgrade: header X-Stream-Protocol-Version names no protocol",
        ));
    }
    if !offered.contains(&SPDY_PROTOCOL) {
        return Err(Refusal {
            status: StatusCode::FORBIDDEN,
            message: format!(
                "unable to upgrade: unable to negotiate protocol: client supports \
                 {offered:?}, server accepts [\"{SPDY_PROTOCOL}\"]"
            ),
        });
    }
    let has = |name: header::HeaderName, wanted: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains(wanted))
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, "spdy/3.1") {
        return Err(Refusal::bad_request(
            "unable to upgrade: missing upgrade headers in request",
        ));
    }
    Ok(())
}

#[derive(Debug, Clone)]
struct PodName {
    ns: String,
    pod: String,
}

impl std::fmt::Display for PodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ns, self.pod)
    }
}

/// One SPDY connection: pairs its streams and forwards each pair until the
/// client goes away or the tunnel is broken.
async fn serve_spdy(forwarding: Arc<Forwarding>, req: Request<Incoming>, pod: PodName) {
    let upgraded = match hyper::upgrade::on(req).await {
        Ok(upgraded) => upgraded,
        Err(e) => {
            tracing::debug!(error = %e, %pod, "SPDY upgrade failed");
            return;
        }
    };
    let (connection, mut incoming) = Connection::new(TokioIo::new(upgraded), Role::Server);
    let mut broken = forwarding.breaker.subscribe();
    let mut pairs = StreamPairs::new(forwarding, pod);
    loop {
        tokio::select! {
            _ = broken.changed() => {
                connection.abort();
                return;
            }
            stream = incoming.accept() => match stream {
                Some(stream) => pairs.add(&connection, stream).await,
                None => return,
            },
            Some((request, serial)) = pairs.expired.recv() => pairs.expire(&request, serial).await,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamType {
    Data,
    Error,
}

/// The type and port of a new stream, or why it is refused.
fn stream_type_and_port(headers: &Headers) -> Result<(StreamType, u16), String> {
    let port = headers.get("port").ok_or("\"port\" header is required")?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("unable to parse {port:?} as a port"))?;
    let kind = match headers.get("streamType") {
        Some("data") => StreamType::Data,
        Some("error") => StreamType::Error,
        Some(other) => return Err(format!("invalid stream type {other:?}")),
        None => return Err("\"streamType\" header is required".into()),
    };
    Ok((kind, port))
}

/// The pair a stream belongs to. Clients too old to send `requestID`
/// open error then data streams back to back: the kubelet names their
/// pair after the error stream's id, and so does this.
fn request_id(stream: &Stream, kind: StreamType) -> String {
    match stream.headers().get("requestID") {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => match kind {
            StreamType::Error => stream.id().to_string(),
            StreamType::Data => stream.id().saturating_sub(2).to_string(),
        },
    }
}

/// Streams of one connection waiting for the other stream of their pair.
struct StreamPairs {
    forwarding: Arc<Forwarding>,
    pod: PodName,
    waiting: HashMap<String, Waiting>,
    serial: u64,
    expire: mpsc::UnboundedSender<(String, u64)>,
    expired: mpsc::UnboundedReceiver<(String, u64)>,
}

struct Waiting {
    /// Tells this pair from a later one with the same request id.
    serial: u64,
    data: Option<(Stream, u16)>,
    error: Option<Stream>,
}

impl StreamPairs {
    fn new(forwarding: Arc<Forwarding>, pod: PodName) -> StreamPairs {
        let (expire, expired) = mpsc::unbounded_channel();
        StreamPairs {
            forwarding,
            pod,
            waiting: HashMap::new(),
            serial: 0,
            expire,
            expired,
        }
    }

    async fn add(&mut self, connection: &Connection, mut stream: Stream) {
        let (kind, port) = match stream_type_and_port(stream.headers()) {
            Ok(found) => found,
            Err(why) => {
                tracing::debug!(%why, pod = %self.pod, "SPDY stream refused");
                let _ = stream.reset(spdy::status::CANCEL).await;
                return;
            }
        };
        if stream.reply().await.is_err() {
            return;
        }
        let request = request_id(&stream, kind);
        let waiting = self.waiting_for(&request);
        let taken = match kind {
            StreamType::Data => waiting.data.is_some(),
            StreamType::Error => waiting.error.is_some(),
        };
        if taken {
            let message = format!(
                "error processing stream for request {request}: {} stream already assigned",
                if kind == StreamType::Data {
                    "data"
                } else {
                    "error"
                }
            );
            if let Some(error) = waiting.error.as_mut() {
                let _ = error.write(message.as_bytes()).await;
            }
            return; // dropping the duplicate resets it
        }
        match kind {
            StreamType::Data => waiting.data = Some((stream, port)),
            StreamType::Error => waiting.error = Some(stream),
        }
        if waiting.data.is_some() && waiting.error.is_some() {
            let waiting = self.waiting.remove(&request).expect("just seen");
            let (Some((data, port)), Some(error)) = (waiting.data, waiting.error) else {
                unreachable!("both streams are there");
            };
            let forward = ForwardedPort {
                forwarding: self.forwarding.clone(),
                pod: self.pod.clone(),
                port,
            };
            let closed = connection.closed();
            tokio::spawn(forward.run(data, error, closed));
        }
    }

    /// The pair waiting under `request`, created (with its timeout) if new.
    fn waiting_for(&mut self, request: &str) -> &mut Waiting {
        if !self.waiting.contains_key(request) {
            self.serial += 1;
            let (serial, expire, key) = (self.serial, self.expire.clone(), request.to_string());
            tokio::spawn(async move {
                tokio::time::sleep(STREAM_CREATION_TIMEOUT).await;
                let _ = expire.send((key, serial));
            });
            let waiting = Waiting {
                serial,
                data: None,
                error: None,
            };
            self.waiting.insert(request.to_string(), waiting);
        }
        self.waiting.get_mut(request).expect("just inserted")
    }

    async fn expire(&mut self, request: &str, serial: u64) {
        if self.waiting.get(request).is_none_or(|w| w.serial != serial) {
            return; // completed in time, or a later pair under the same id
        }
        let waiting = self.waiting.remove(request).expect("just seen");
        if let Some(mut error) = waiting.error {
            let message = format!("timed out waiting for streams of request {request}");
            let _ = error.write(message.as_bytes()).await;
            let _ = error.close().await;
        }
    }
}

/// One complete pair's port on its pod.
struct ForwardedPort {
    forwarding: Arc<Forwarding>,
    pod: PodName,
    port: u16,
}

impl ForwardedPort {
    /// Forwards until both directions end, the connection closes, or the
    /// tunnel is broken.
    async fn run(self, data: Stream, error: Stream, closed: impl Future<Output = ()>) {
        let mut broken = self.forwarding.breaker.subscribe();
        tokio::select! {
            _ = self.forward(data, error) => {}
            _ = closed => {}
            _ = broken.changed() => {}
        }
    }

    async fn forward(&self, mut data: Stream, mut error: Stream) {
        match self.connect().await {
            Ok(tcp) => {
                pump(data, tcp).await;
                let _ = error.close().await;
            }
            Err(message) => {
                // As the kubelet: the message, then both streams reset.
                let _ = error.write(message.as_bytes()).await;
                let _ = data.reset(spdy::status::CANCEL).await;
                let _ = error.reset(spdy::status::CANCEL).await;
            }
        }
    }

    async fn connect(&self) -> Result<TcpStream, String> {
        let Some(ip) = (self.forwarding.resolve)(&self.pod.ns, &self.pod.pod) else {
            return Err(format!(
                "error forwarding port {} to pod {}: the pod has no address",
                self.port, self.pod
            ));
        };
        let tcp = TcpStream::connect((ip, self.port))
            .await
            .map_err(|e| forwarding_error(self.port, &self.pod.to_string(), ip, &e))?;
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }
}

/// Bytes both ways between a data stream and the pod, each direction ending
/// on its own: the client's FIN half-closes the pod connection, the pod's
/// end is the stream's FIN. A reset by the client ends both.
async fn pump(stream: Stream, tcp: TcpStream) {
    let (mut from_client, mut to_client) = stream.into_split();
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let client_reset = to_client.peer_reset();
    let upstream = async {
        while let Some(data) = from_client.read().await {
            if to_pod.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = to_pod.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        let mut reset = std::pin::pin!(client_reset.wait());
        loop {
            let n = tokio::select! {
                read = from_pod.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
                _ = &mut reset => return,
            };
            if to_client.write(&buf[..n]).await.is_err() {
                return;
            }
        }
        let _ = to_client.close().await;
    };
    tokio::join!(upstream, downstream);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_portforward_paths_are_served() {
        let target = |ns: &str, pod: &str| Some((ns.to_string(), pod.to_string()));
        assert_eq!(
            portforward_target("/portForward/ns/etcd-0"),
            target("ns", "etcd-0")
        );
        assert_eq!(
            portforward_target("/portForward/ns/etcd-0/5f0e-uid"),
            target("ns", "etcd-0")
        );
        assert_eq!(portforward_target("/portForward/ns"), None);
        assert_eq!(portforward_target("/portForward/ns//"), None);
        assert_eq!(portforward_target("/exec/ns/etcd-0/etcd"), None);
        assert_eq!(portforward_target("/portforward/ns/etcd-0"), None);
    }

    #[test]
    fn ports_come_from_the_port_parameter_as_the_api_server_encodes_it() {
        let uri: http::Uri = "/portForward/ns/p?port=2379%2C2380".parse().unwrap();
        assert_eq!(ports_from_query(&uri, "port").unwrap(), vec![2379, 2380]);
        let uri: http::Uri = "/portForward/ns/p?port=1&port=2".parse().unwrap();
        assert_eq!(ports_from_query(&uri, "port").unwrap(), vec![1, 2]);
        let uri: http::Uri = "/portForward/ns/p?ports=2379".parse().unwrap();
        assert!(ports_from_query(&uri, "port").is_err());
    }

    #[test]
    fn stream_headers_name_a_type_and_a_port() {
        let headers =
            |kind: &str, port: &str| Headers::new().with("streamType", kind).with("port", port);
        assert_eq!(
            stream_type_and_port(&headers("data", "2379")),
            Ok((StreamType::Data, 2379))
        );
        assert_eq!(
            stream_type_and_port(&headers("error", "1")),
            Ok((StreamType::Error, 1))
        );
        assert!(stream_type_and_port(&headers("stdin", "2379")).is_err());
        assert!(stream_type_and_port(&headers("data", "0")).is_err());
        assert!(stream_type_and_port(&headers("data", "http")).is_err());
        assert!(stream_type_and_port(&Headers::new().with("port", "1")).is_err());
    }

    #[test]
    fn unknown_protocols_are_forbidden_and_missing_headers_bad_requests() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, value.parse().unwrap());
            }
            map
        };
        let upgrade = [("connection", "Upgrade"), ("upgrade", "SPDY/3.1")];
        let ok = headers(&[
            upgrade[0],
            upgrade[1],
            (PROTOCOL_VERSION, "portforward.k8s.io"),
        ]);
        assert!(check_spdy_upgrade(&ok).is_ok());
        let status = |h: HeaderMap| check_spdy_upgrade(&h).unwrap_err().status;
        assert_eq!(status(headers(&upgrade)), StatusCode::BAD_REQUEST);
        let other = headers(&[
            upgrade[0],
            upgrade[1],
            (PROTOCOL_VERSION, "v4.channel.k8s.io"),
        ]);
        assert_eq!(status(other), StatusCode::FORBIDDEN);
        let no_upgrade = headers(&[(PROTOCOL_VERSION, "portforward.k8s.io")]);
        assert_eq!(status(no_upgrade), StatusCode::BAD_REQUEST);
    }
}
