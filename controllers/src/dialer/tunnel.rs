//! One `pods/portforward` tunnel as a byte stream: the websocket upgrade
//! through the workload API client and the `v4.channel.k8s.io` framing of a
//! single forwarded port, read and written in place.
//!
//! The framing: every binary message starts with its channel byte; channel 0
//! carries the port's data both ways, channel 1 an error message from the
//! API server (nothing listens in the pod, the pod is gone). The first
//! message the server sends on each channel is the port number, two bytes
//! little-endian, and nothing else.
//!
//! The tunnel holds no task: reads take the data of the websocket message
//! just received; writes gather into one message that is sent on flush (or
//! when it reaches [`MAX_WRITE`]), so the gRPC frames of one request leave as
//! one websocket message and TCP segment. The workload client's own
//! connector sets TCP_NODELAY; a kubeconfig with a proxy gets kube's
//! connector, which does not, and there several small segments would wait
//! behind Nagle's algorithm for the peer's delayed acknowledgement (40 ms).
//! Its websocket read buffer is [`READ_BUFFER`] (the websocket library's
//! default, 128 KiB, is zero-filled on every read and stays resident for the
//! tunnel's life: with a tunnel per cluster kept between reconciles, that
//! alone was 128 MiB for 1,000 clusters).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use futures::{Sink, Stream};
use http::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

/// The subprotocol of port-forward over websockets.
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// The websocket read buffer of a tunnel, held for as long as the tunnel is
/// pooled. etcd's answers to the calls the controller makes are a few
/// hundred bytes; snapshots stream in 32 KiB messages, read in more than one
/// call.
pub const READ_BUFFER: usize = 4 * 1024;

/// The largest message sent: writes beyond it go out in the next message.
const MAX_WRITE: usize = 64 * 1024;

/// The largest message (and frame) a tunnel reads: 32 times the 32 KiB
/// messages snapshots stream in. The workload API server is a tenant's to
/// name; the websocket library's own bound, 64 MiB, would let one tunnel
/// hold that much of the controller's memory.
pub const MAX_MESSAGE: usize = 1024 * 1024;

const DATA: u8 = 0;
const ERROR: u8 = 1;

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// A tunnel to one port of one pod.
pub struct Tunnel {
    ws: Ws,
    port: u16,
    /// Data received and not yet read.
    pending: Bytes,
    /// Data written and not yet sent: its first byte is the data channel.
    outgoing: Vec<u8>,
    /// A flush of `outgoing` has yielded once (see `poll_flush`).
    yielded: bool,
    data_started: bool,
    error_started: bool,
    /// The API server's error for the port; every later read or write fails with it.
    failed: Option<String>,
    eof: bool,
}

fn upgrade_error(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionRefused, message)
}

fn ws_error(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        other => io::Error::new(io::ErrorKind::ConnectionReset, other.to_string()),
    }
}

impl Tunnel {
    /// Opens a tunnel to `port` of pod `namespace/pod` through `client`'s API server.
    pub async fn open(
        client: &kube::Client,
        namespace: &str,
        pod: &str,
        port: u16,
    ) -> io::Result<Tunnel> {
        let key = generate_key();
        let request = Request::get(format!(
            "/api/v1/namespaces/{namespace}/pods/{pod}/portforward?ports={port}"
        ))
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, &key)
        .header(header::SEC_WEBSOCKET_PROTOCOL, PROTOCOL)
        .body(kube::client::Body::empty())
        .map_err(|e| upgrade_error(e.to_string()))?;
        let response = client
            .send(request)
            .await
            .map_err(|e| upgrade_error(e.to_string()))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(upgrade_error(format!(
                "the API server answered {} instead of switching protocols",
                response.status()
            )));
        }
        let headers = response.headers();
        let accept = headers
            .get(header::SEC_WEBSOCKET_ACCEPT)
            .and_then(|v| v.to_str().ok());
        if accept != Some(derive_accept_key(key.as_bytes()).as_str()) {
            return Err(upgrade_error(
                "the API server's websocket accept key does not match".into(),
            ));
        }
        let protocol = headers
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok());
        if protocol != Some(PROTOCOL) {
            return Err(upgrade_error(format!(
                "the API server chose subprotocol {protocol:?}, not {PROTOCOL}"
            )));
        }
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|e| upgrade_error(format!("upgrading the connection: {e}")))?;
        let config = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(0)
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(config))
                .await;
        Ok(Tunnel {
            ws,
            port,
            pending: Bytes::new(),
            outgoing: Vec::new(),
            yielded: false,
            data_started: false,
            error_started: false,
            failed: None,
            eof: false,
        })
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(message) => Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("port-forward: {message}"),
            )),
            None => Ok(()),
        }
    }

    /// Handles one message from the server; data goes to `pending`.
    fn receive(&mut self, message: Message) -> io::Result<()> {
        let mut payload = match message {
            Message::Binary(b) => b,
            Message::Close(_) => {
                self.eof = true;
                return Ok(());
            }
            // Pings are answered by the websocket layer; nothing else is expected.
            _ => return Ok(()),
        };
        if payload.is_empty() {
            return Ok(());
        }
        let channel = payload[0];
        payload.advance(1);
        let started = match channel {
            DATA => &mut self.data_started,
            ERROR => &mut self.error_started,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("port-forward: message on unknown channel {other}"),
                ));
            }
        };
        if !*started {
            if payload.len() != 2 || payload.get_u16_le() != self.port {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "port-forward: channel {channel} did not start with port {}",
                        self.port
                    ),
                ));
            }
            *started = true;
            return Ok(());
        }
        if channel == DATA {
            self.pending = payload;
        } else if !payload.is_empty() {
            self.failed = Some(String::from_utf8_lossy(&payload).into_owned());
        }
        Ok(())
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            self.check()?;
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                None => self.eof = true,
                Some(Err(e)) => return Poll::Ready(Err(ws_error(e))),
                Some(Ok(message)) => self.receive(message)?,
            }
        }
    }
}

impl Tunnel {
    /// Hands the gathered data to the websocket as one message.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.outgoing.len() <= 1 {
            return Poll::Ready(Ok(()));
        }
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(ws_error)?;
        let frame = std::mem::take(&mut self.outgoing);
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(frame.into()))
            .map_err(ws_error)?;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        if self.outgoing.len() > MAX_WRITE {
            ready!(self.poll_send(cx))?;
        }
        if self.outgoing.is_empty() {
            self.outgoing.push(DATA);
        }
        let n = buf
            .len()
            .min(MAX_WRITE + 1 - self.outgoing.len().min(MAX_WRITE));
        self.outgoing.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check()?;
        // Yield once before sending: the HTTP/2 client flushes a request's
        // HEADERS as soon as they are written and its DATA (and the empty
        // end-of-stream DATA) from another task moments later. One turn of
        // the scheduler lets the rest join the same message. Sent apart on a
        // socket without TCP_NODELAY (kube's connector, used through a
        // proxy), the second segment would wait behind Nagle's algorithm for
        // the server's delayed ACK, 40 ms on Linux.
        if self.outgoing.len() > 1 && !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.yielded = false;
        ready!(self.poll_send(cx))?;
        Pin::new(&mut self.ws).poll_flush(cx).map_err(ws_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send(cx))?;
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(()) | Err(tungstenite::Error::ConnectionClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(ws_error(e))),
        }
    }
}
