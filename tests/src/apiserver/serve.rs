//! HTTPS on 127.0.0.1:<random port>: an rcgen CA signs the serving
//! certificate, and every request goes to the server's handler (which reads
//! the identity from the bearer token). Knows nothing of the API it serves.

use std::future::Future;
use std::sync::Arc;

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// The listener of one server; stops accepting when dropped.
pub(crate) struct Serving {
    pub url: String,
    pub ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn certificates() -> Result<(String, rustls::ServerConfig)> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "etcdfleet test API CA");
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_pem = ca_cert.pem();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    let cert = params.signed_by(&key, &issuer)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((ca_pem, config))
}

impl Serving {
    /// Serves `handler` on a new listener until dropped.
    pub async fn start<H, F, B>(handler: H) -> Result<Serving>
    where
        H: Fn(http::Request<hyper::body::Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = http::Response<B>> + Send + 'static,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (ca_pem, config) = certificates().context("generating the test API certificates")?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("https://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                // As a real API server's: Go sets TCP_NODELAY on every connection.
                let _ = tcp.set_nodelay(true);
                let (acceptor, handler) = (acceptor.clone(), handler.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let answer = handler(req);
                        async move { Ok::<_, std::convert::Infallible>(answer.await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Ok(Serving { url, ca_pem, task })
    }
}
