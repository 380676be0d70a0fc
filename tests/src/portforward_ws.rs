//! Port-forward over a WebSocket with the `v4.channel.k8s.io` framing, as
//! the test world serves it in two places: the test API server's
//! `pods/portforward` ([`crate::portforward`]) and the kubelet's
//! `/portForward/{namespace}/{pod}` ([`crate::kubelet_server`]). This module
//! owns the handshake checks, the 101 answer and the bridge from channels
//! to connections into the pod.
//!
//! The protocol, per forwarded port `i` (in the order of the ports in the
//! query): channel `2i` carries data both ways, channel `2i+1` carries an
//! error message from the server. Each channel's first server frame is the
//! port number, little-endian (the client checks it). Every WebSocket
//! binary message starts with its channel byte. There is no half-close: a
//! tunnel ends as a whole.
//!
//! One TCP connection to the pod is opened per port per request, as the
//! kubelet does; if it cannot be opened, the port's error channel says so.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// The subprotocol answered (kube's client offers v5 and v4; v4 is what
/// API servers and kubelets answer for port-forward).
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// The ports of query parameter `name` (`ports` at the API server, `port`
/// at the kubelet): `name=2379`, `name=80%2C1234`, or repeated.
pub fn ports_from_query(uri: &http::Uri, name: &str) -> Result<Vec<u16>, String> {
    let prefix = format!("{name}=");
    let mut ports = Vec::new();
    for pair in uri.query().unwrap_or_default().split('&') {
        if let Some(value) = pair.strip_prefix(&prefix) {
            for p in value.replace("%2C", ",").replace("%2c", ",").split(',') {
                ports.push(
                    p.parse::<u16>()
                        .map_err(|_| format!("invalid port {p:?} in {name} parameter"))?,
                );
            }
        }
    }
    if ports.is_empty() {
        return Err(format!(
            "at least one port must be given in the {name} parameter"
        ));
    }
    Ok(ports)
}

/// Whether a request asks for a WebSocket (`Upgrade: websocket`).
pub fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// A WebSocket upgrade request that offers [`PROTOCOL`].
pub struct Handshake {
    accept: String,
}

impl Handshake {
    /// Checks `headers` for a WebSocket upgrade offering [`PROTOCOL`]; the
    /// error says what is missing.
    pub fn check(headers: &HeaderMap) -> Result<Handshake, String> {
        let key = headers.get(header::SEC_WEBSOCKET_KEY);
        let offers_v4 = headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|p| p.trim() == PROTOCOL));
        match key {
            Some(key) if is_websocket(headers) && offers_v4 => Ok(Handshake {
                accept: derive_accept_key(key.as_bytes()),
            }),
            _ => Err(format!(
                "port-forward needs a websocket upgrade offering {PROTOCOL}"
            )),
        }
    }

    /// The 101 answer choosing [`PROTOCOL`].
    pub fn switching_protocols(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, "Upgrade".parse().expect("static"));
        headers.insert(header::UPGRADE, "websocket".parse().expect("static"));
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            PROTOCOL.parse().expect("static"),
        );
        if let Ok(accept) = self.accept.parse() {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        response
    }
}

/// When a tunnel of several ports ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// When the first pod connection ends (the test API server's way).
    FirstPodConnection,
    /// When every pod connection has ended (the kubelet's way: it waits
    /// for the forwarding of every port).
    LastPodConnection,
}

/// Where a tunnel leads.
#[derive(Debug, Clone)]
pub struct Target {
    /// `namespace/pod`, for error messages.
    pub pod: String,
    pub ip: IpAddr,
    pub ports: Vec<u16>,
    pub closing: Closing,
}

/// What a port's error channel says when its pod connection cannot be made.
pub fn forwarding_error(port: u16, pod: &str, ip: IpAddr, error: &std::io::Error) -> String {
    format!("error forwarding port {port} to pod {pod} at {ip}: {error}")
}

/// Completes the upgrade of `req` (answered with
/// [`Handshake::switching_protocols`]) and runs the tunnel in a task until
/// it ends or `broken` changes.
pub fn spawn_tunnel(req: Request<Incoming>, target: Target, broken: watch::Receiver<u64>) {
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let io = TokioIo::new(upgraded);
                let ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
                if let Err(e) = bridge(ws, &target, broken).await {
                    tracing::debug!(error = %e, pod = %target.pod, "port-forward ended");
                }
            }
            Err(e) => tracing::debug!(error = %e, "port-forward upgrade failed"),
        }
    });
}

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Runs the tunnel: one TCP connection per port, bytes both ways, until the
/// client closes, the pods close (see [`Closing`]), or the tunnel is broken
/// on purpose.
async fn bridge(ws: Ws, target: &Target, mut broken: watch::Receiver<u64>) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    // Announce each port on its data and error channel, as the client expects.
    for (i, port) in target.ports.iter().enumerate() {
        let [lo, hi] = port.to_le_bytes();
        let ch = (2 * i) as u8;
        sink.send(Message::binary(vec![ch, lo, hi])).await?;
        sink.send(Message::binary(vec![ch + 1, lo, hi])).await?;
    }
    let (to_client, mut outgoing) = mpsc::channel::<Message>(16);
    let mut writers = open_pod_connections(target, &to_client).await?;
    drop(to_client);
    loop {
        tokio::select! {
            _ = broken.changed() => {
                // Cut without a close frame, like a lost connection.
                return Ok(());
            }
            out = outgoing.recv() => match out {
                Some(message) => {
                    let close = message.is_close();
                    sink.send(message).await?;
                    if close {
                        return Ok(());
                    }
                }
                None => {
                    // No port could be opened (the errors were sent), or every pod closed.
                    sink.send(Message::Close(None)).await?;
                    return Ok(());
                }
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Binary(data))) if !data.is_empty() => {
                    let ch = data[0] as usize;
                    if ch.is_multiple_of(2)
                        && let Some(Some(writer)) = writers.get_mut(ch / 2)
                        && writer.write_all(&data[1..]).await.is_err()
                    {
                        writers[ch / 2] = None;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return Ok(()),
                Some(Ok(_)) => {}
            },
        }
    }
}

type PodWriter = tokio::net::tcp::OwnedWriteHalf;

/// Connects to every port; each connection's reading half feeds `to_client`
/// in a task. A port that cannot be reached gets its error message instead
/// (and `None` in the returned writers).
async fn open_pod_connections(
    target: &Target,
    to_client: &mpsc::Sender<Message>,
) -> anyhow::Result<Vec<Option<PodWriter>>> {
    let live = Arc::new(AtomicUsize::new(target.ports.len()));
    let mut writers = Vec::with_capacity(target.ports.len());
    for (i, port) in target.ports.iter().enumerate() {
        let ch = (2 * i) as u8;
        match tokio::net::TcpStream::connect((target.ip, *port)).await {
            Ok(tcp) => {
                // The kubelet's streaming server is Go's: no Nagle delay.
                let _ = tcp.set_nodelay(true);
                let (read, write) = tcp.into_split();
                writers.push(Some(write));
                let ending = PodConnectionEnd {
                    closing: target.closing,
                    live: live.clone(),
                };
                tokio::spawn(pod_to_client(read, ch, to_client.clone(), ending));
            }
            Err(e) => {
                writers.push(None);
                live.fetch_sub(1, Ordering::SeqCst);
                let mut frame = vec![ch + 1];
                frame.extend_from_slice(
                    forwarding_error(*port, &target.pod, target.ip, &e).as_bytes(),
                );
                to_client.send(Message::binary(frame)).await?;
            }
        }
    }
    Ok(writers)
}

/// Whether the end of one pod connection ends the tunnel.
struct PodConnectionEnd {
    closing: Closing,
    /// Pod connections not yet ended (or never made).
    live: Arc<AtomicUsize>,
}

impl PodConnectionEnd {
    fn ends_tunnel(self) -> bool {
        let last = self.live.fetch_sub(1, Ordering::SeqCst) == 1;
        self.closing == Closing::FirstPodConnection || last
    }
}

async fn pod_to_client(
    mut read: tokio::net::tcp::OwnedReadHalf,
    ch: u8,
    to_client: mpsc::Sender<Message>,
    ending: PodConnectionEnd,
) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match read.read(&mut buf[1..]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf[0] = ch;
                let frame = Message::binary(buf[..=n].to_vec());
                if to_client.send(frame).await.is_err() {
                    return;
                }
            }
        }
    }
    if ending.ends_tunnel() {
        // v4 cannot half-close: the tunnel ends with the pod connection.
        let _ = to_client.send(Message::Close(None)).await;
    }
}
