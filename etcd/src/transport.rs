//! How a client reaches an etcd cluster's members: what it needs
//! ([`EtcdConfig`]: TLS material, deadlines, the transport), and how bytes
//! reach a member: a [`Transport`] opens one byte stream to
//! the member behind a client URL (a TCP socket, a port-forward tunnel, ...),
//! and [`channel`] runs gRPC over it with TLS on top, so TLS is verified end
//! to end whatever carries the bytes. The URL names the member; where the
//! bytes actually go is the transport's business.
//!
//! TLS is done here, not by tonic: one rustls config ([`TlsConfig`]) per
//! cluster serves all its members, with a small session cache. Each tonic
//! channel with its own TLS would build its own config, with a 256-entry
//! session cache, about 14 KiB per member held for as long as the
//! connection is pooled.

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

use super::error::EtcdError;

/// TLS material to reach etcd's client port: the CA that signed the server
/// certificates and, for mutual TLS, a client certificate and key. All PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsMaterial {
    pub ca_pem: String,
    pub client_cert_pem: Option<String>,
    pub client_key_pem: Option<String>,
    /// Name to verify the server certificate against, when the endpoint host
    /// is not one of its SANs (e.g. reached through a port-forward).
    pub server_name: Option<String>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("client_cert", &self.client_cert_pem.is_some())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// How long each kind of call may take, retries included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Establishing a connection (TCP + TLS).
    pub connect: Duration,
    /// One ordinary RPC (member list, status, alarms, remove, move-leader).
    pub request: Duration,
    /// The linearizable read that decides whether a member is healthy.
    pub health: Duration,
    /// A membership change, including retries on "unhealthy cluster" (etcd's
    /// strict reconfiguration check refuses for ~5 s after a member starts).
    pub reconfigure: Duration,
    /// Promoting a learner, including retries until it has caught up.
    pub promote: Duration,
    /// Defragmenting one member (blocks that member; grows with db size).
    pub defragment: Duration,
    /// Streaming a whole snapshot.
    pub snapshot: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(5),
            health: Duration::from_secs(3),
            reconfigure: Duration::from_secs(30),
            promote: Duration::from_secs(60),
            defragment: Duration::from_secs(120),
            snapshot: Duration::from_secs(600),
        }
    }
}

/// How to reach the members of one etcd cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdConfig {
    pub tls: Option<TlsMaterial>,
    pub deadlines: Deadlines,
    /// What carries the bytes to a member; `None` is plain TCP to the URL.
    pub transport: Option<Transport>,
}

/// The client side of TLS to one cluster's members (CA, client certificate,
/// ALPN `h2`), shared by the channels to all of them.
pub type TlsConfig = Arc<rustls::ClientConfig>;

/// Sessions a config remembers for resumption: each cluster's members are
/// verified against one server name, so a few tickets are plenty.
const TLS_SESSIONS: usize = 8;

/// Builds the rustls config for `tls` (ring, TLS 1.2 and 1.3).
pub fn tls_config(tls: &TlsMaterial) -> Result<TlsConfig, EtcdError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, e: &dyn std::fmt::Display| EtcdError::Tls(format!("{what}: {e}"));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(tls.ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| bad("the CA bundle", &e))?;
        roots.add(cert).map_err(|e| bad("a CA certificate", &e))?;
    }
    if roots.is_empty() {
        return Err(EtcdError::Tls("the CA bundle holds no certificate".into()));
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad("TLS versions", &e))?
    .with_root_certificates(roots);
    let mut config = match (&tls.client_cert_pem, &tls.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad("the client certificate", &e))?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| bad("the client key", &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad("the client certificate", &e))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(EtcdError::Tls(
                "a client certificate needs both cert and key".into(),
            ));
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS);
    Ok(Arc::new(config))
}

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

/// TLS on a connection: the config and the name the server's certificate
/// must carry.
#[derive(Clone)]
struct Tls {
    config: TlsConfig,
    server_name: rustls::pki_types::ServerName<'static>,
}

/// The tower connector tonic calls for every (re)connection: the
/// transport's stream, with TLS on it for `https` members.
#[derive(Clone)]
struct Connector {
    transport: Transport,
    tls: Option<Tls>,
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<EtcdStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dial = self.transport.dial(uri);
        let tls = self.tls.clone();
        Box::pin(async move {
            let stream = dial.await?;
            let Some(tls) = tls else {
                return Ok(TokioIo::new(stream));
            };
            let stream = tokio_rustls::TlsConnector::from(tls.config)
                .connect(tls.server_name, stream)
                .await?;
            Ok(TokioIo::new(Box::new(stream) as EtcdStream))
        })
    }
}

/// A lazy gRPC channel to the member at `endpoint`: nothing is dialed until
/// the first call, and a broken stream is redialed on the next call. An
/// `https` member gets TLS with `shared`, the config [`tls_config`] built from
/// `config.tls` for the whole cluster.
pub fn channel(
    endpoint: &str,
    config: &EtcdConfig,
    shared: Option<&TlsConfig>,
) -> Result<tonic::transport::Channel, EtcdError> {
    let invalid = |message: String| EtcdError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        message,
    };
    let https = endpoint.starts_with("https://");
    if !https && !endpoint.starts_with("http://") {
        return Err(invalid("expected an http:// or https:// URL".into()));
    }
    let tls = if https {
        let (Some(material), Some(shared)) = (&config.tls, shared) else {
            return Err(EtcdError::Tls(format!("{endpoint} needs TLS material")));
        };
        let uri: Uri = endpoint
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        let name = match &material.server_name {
            Some(name) => name.clone(),
            None => uri
                .host()
                .unwrap_or_default()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        };
        let server_name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| EtcdError::Tls(format!("server name {name:?}: {e}")))?;
        Some(Tls {
            config: shared.clone(),
            server_name,
        })
    } else {
        None
    };
    // tonic speaks HTTP/2 in the clear over what the connector returns; for
    // https the connector has put TLS on it already.
    let plain = match endpoint.strip_prefix("https://") {
        Some(rest) => format!("http://{rest}"),
        None => endpoint.to_string(),
    };
    let builder = Endpoint::from_shared(plain)
        .map_err(|e| invalid(e.to_string()))?
        .connect_timeout(config.deadlines.connect)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        // Pings while idle too: a tunnel through a workload API server carries
        // no bytes between polls, and the API client's read timeout would
        // end it, so every poll would open a new tunnel and TLS session.
        .keep_alive_while_idle(true);
    let transport = config.transport.clone().unwrap_or_else(Transport::tcp);
    Ok(builder.connect_with_connector_lazy(Connector { transport, tls }))
}
