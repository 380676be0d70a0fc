//! A TLS probe of one etcd port (client or peer): the controller opens a
//! stream to the URL through the transport, shakes hands presenting a given
//! certificate and verifying the server's against a given CA, and asks
//! `GET /version` (both ports serve it). What comes back says which side's
//! trust is missing: the controller could not verify the server
//! ([`ProbeError::Untrusted`]), the server refused the certificate it was
//! shown ([`ProbeError::Rejected`]), or nothing answered
//! ([`ProbeError::Unreachable`]). It also tells whether the server asked for
//! a client certificate at all (a peer port that does not authenticate its
//! peers cannot show whether it would trust a new one).
//!
//! Used before a running cluster is joined: the peer certificate the new
//! members will present, shown to each existing member's peer port, proves
//! both directions of peer trust without starting anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::Uri;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::transport::{TlsMaterial, Transport};

/// How the probed port answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// The body of `/version`.
    pub version: String,
    /// Whether the server asked for a client certificate.
    pub asked_for_certificate: bool,
}

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// Nothing answered at the URL (or the material is unusable).
    #[error("{0}")]
    Unreachable(String),
    /// The server's certificate does not verify against the given CA (or
    /// not for the URL's name).
    #[error("its certificate is not trusted: {0}")]
    Untrusted(String),
    /// The server refused the certificate it was shown (or asked for one
    /// and got none).
    #[error("it refused the certificate shown to it: {0}")]
    Rejected(String),
}

/// A client certificate that remembers whether the server asked for it.
#[derive(Debug)]
struct Recorded {
    key: Option<Arc<CertifiedKey>>,
    asked: AtomicBool,
}

impl ResolvesClientCert for Recorded {
    fn resolve(
        &self,
        _hints: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::Relaxed);
        self.key.clone()
    }

    fn has_certs(&self) -> bool {
        self.key.is_some()
    }
}

fn unusable(what: &str, e: impl std::fmt::Display) -> ProbeError {
    ProbeError::Unreachable(format!("{what}: {e}"))
}

/// The rustls config of a probe: `tls.ca_pem` as roots, `tls`'s client
/// certificate behind a recording resolver, no ALPN (plain HTTP/1.1).
fn probe_config(tls: &TlsMaterial) -> Result<(rustls::ClientConfig, Arc<Recorded>), ProbeError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(tls.ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| unusable("the CA bundle", e))?;
        roots
            .add(cert)
            .map_err(|e| unusable("a CA certificate", e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = match (&tls.client_cert_pem, &tls.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unusable("the client certificate", e))?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| unusable("the client key", e))?;
            let signing = provider
                .key_provider
                .load_private_key(key)
                .map_err(|e| unusable("the client key", e))?;
            Some(Arc::new(CertifiedKey::new(chain, signing)))
        }
        _ => None,
    };
    let recorded = Arc::new(Recorded {
        key,
        asked: AtomicBool::new(false),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| unusable("TLS versions", e))?
        .with_root_certificates(roots)
        .with_client_cert_resolver(recorded.clone());
    Ok((config, recorded))
}

/// Sorts a TLS failure into whose trust is missing.
fn classify(e: std::io::Error) -> ProbeError {
    let text = e.to_string();
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => ProbeError::Untrusted(text),
        Some(rustls::Error::AlertReceived(_)) => ProbeError::Rejected(text),
        _ => ProbeError::Unreachable(text),
    }
}

/// Probes the `https` URL `url` (see the module docs), within `within`.
/// The server's certificate must be valid for the URL's host.
pub async fn probe_tls(
    url: &str,
    tls: &TlsMaterial,
    transport: &Transport,
    within: Duration,
) -> Result<ProbeAnswer, ProbeError> {
    match tokio::time::timeout(within, probe(url, tls, transport)).await {
        Ok(answer) => answer,
        Err(_) => Err(ProbeError::Unreachable(format!(
            "{url} did not answer within {within:?}"
        ))),
    }
}

async fn probe(
    url: &str,
    tls: &TlsMaterial,
    transport: &Transport,
) -> Result<ProbeAnswer, ProbeError> {
    let uri: Uri = url.parse().map_err(|e| unusable(url, e))?;
    let host = uri.host().unwrap_or_default().to_string();
    let name = ServerName::try_from(tls.server_name.clone().unwrap_or(host.clone()))
        .map_err(|e| unusable("server name", e))?;
    let (config, recorded) = probe_config(tls)?;
    let stream = transport
        .dial(uri)
        .await
        .map_err(|e| ProbeError::Unreachable(format!("{url}: {e}")))?;
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(classify)?;
    let request = format!("GET /version HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(classify)?;
    stream.flush().await.map_err(classify)?;
    // A server that refuses the client certificate after the handshake
    // (TLS 1.3) says so here, as an alert instead of an answer.
    let response = read_response(&mut stream).await?;
    let asked = recorded.asked.load(Ordering::Relaxed);
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        return Err(ProbeError::Unreachable(format!(
            "{url} answered no HTTP response"
        )));
    };
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(ProbeError::Unreachable(format!(
            "{url} answered {status} to GET /version"
        )));
    }
    Ok(ProbeAnswer {
        version: body.trim().to_string(),
        asked_for_certificate: asked,
    })
}

/// Reads one HTTP/1.1 response: until its body is complete by its
/// `Content-Length`, or the stream ends. A tunnelled stream (port-forward)
/// need not end when the server closes its side, so the end of the stream
/// is not waited for once the answer is in.
async fn read_response(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Result<String, ProbeError> {
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
            Err(e) if response.is_empty() => return Err(classify(e)),
            // Some servers close without close_notify once they answered.
            Err(_) => break,
        }
        if response_complete(&response) {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// Whether `response` holds a whole head and a body of its `Content-Length`.
fn response_complete(response: &[u8]) -> bool {
    let text = String::from_utf8_lossy(response);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    length.is_some_and(|n| body.len() >= n)
}

#[cfg(test)]
mod tests {
    use super::response_complete;

    #[test]
    fn a_response_is_complete_once_its_content_length_is_in() {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\n";
        assert!(!response_complete(b"HTTP/1.1 200 OK\r\nContent-Le"));
        assert!(!response_complete(format!("{head}{{}}").as_bytes()));
        assert!(response_complete(format!("{head}{{\"\"}}").as_bytes()));
        // Without a length, only the end of the stream ends it.
        assert!(!response_complete(b"HTTP/1.1 200 OK\r\n\r\nbody"));
    }
}
