//! How bytes reach an etcd member: a [`Transport`] opens one byte stream to
//! the member behind a client URL (a TCP socket, a port-forward tunnel, ...),
//! and [`channel`] runs gRPC over it with TLS on top, so TLS is verified end
//! to end whatever carries the bytes. The URL names the member; where the
//! bytes actually go is the transport's business.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::Endpoint;

use super::client::EtcdConfig;
use super::error::EtcdError;

/// A byte stream to one member's client port.
pub trait EtcdIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> EtcdIo for T {}

pub type EtcdStream = Box<dyn EtcdIo>;

type DialFn = dyn Fn(Uri) -> BoxFuture<'static, io::Result<EtcdStream>> + Send + Sync;

/// Opens byte streams to members, given their client URL.
#[derive(Clone)]
pub struct Transport {
    dial: Arc<DialFn>,
    /// Names the transport in logs and tells configs apart (two clusters
    /// reached through different workload API servers differ here).
    label: String,
}

impl Transport {
    pub fn new(
        label: impl Into<String>,
        dial: impl Fn(Uri) -> BoxFuture<'static, io::Result<EtcdStream>> + Send + Sync + 'static,
    ) -> Self {
        Transport {
            dial: Arc::new(dial),
            label: label.into(),
        }
    }

    /// Plain TCP to the URL's host and port.
    pub fn tcp() -> Self {
        Transport::new("tcp", |uri: Uri| {
            Box::pin(async move {
                let host = uri.host().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("{uri} has no host"))
                })?;
                let port = uri.port_u16().unwrap_or(2379);
                let stream = tokio::net::TcpStream::connect((host, port)).await?;
                stream.set_nodelay(true)?;
                Ok(Box::new(stream) as EtcdStream)
            })
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn dial(&self, uri: Uri) -> BoxFuture<'static, io::Result<EtcdStream>> {
        (self.dial)(uri)
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Transport").field(&self.label).finish()
    }
}

impl PartialEq for Transport {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.dial, &other.dial) || self.label == other.label
    }
}

impl Eq for Transport {}

/// The tower connector tonic calls for every (re)connection.
#[derive(Clone)]
struct Connector(Transport);

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<EtcdStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dial = self.0.dial(uri);
        Box::pin(async move { dial.await.map(TokioIo::new) })
    }
}

/// A lazy gRPC channel to the member at `endpoint`: nothing is dialed until
/// the first call, and a broken stream is redialed on the next call.
pub fn channel(
    endpoint: &str,
    config: &EtcdConfig,
) -> Result<tonic::transport::Channel, EtcdError> {
    let invalid = |message: String| EtcdError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        message,
    };
    let https = endpoint.starts_with("https://");
    if !https && !endpoint.starts_with("http://") {
        return Err(invalid("expected an http:// or https:// URL".into()));
    }
    let mut builder = Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| invalid(e.to_string()))?
        .connect_timeout(config.deadlines.connect)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        // Pings while idle too: a tunnel through a workload API server carries
        // no bytes between polls, and the API client's read timeout would
        // end it, so every poll would open a new tunnel and TLS session.
        .keep_alive_while_idle(true);
    if https {
        let tls = config
            .tls
            .as_ref()
            .ok_or_else(|| EtcdError::Tls(format!("{endpoint} needs TLS material")))?;
        builder = builder
            .tls_config(tls.to_options()?)
            .map_err(|e| EtcdError::Tls(e.to_string()))?;
    }
    let transport = config.transport.clone().unwrap_or_else(Transport::tcp);
    Ok(builder.connect_with_connector_lazy(Connector(transport)))
}
