//! HTTPS on 127.0.0.1:<random port>: an rcgen CA signs the serving
//! certificate; each request's bearer token names its identity.

use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use super::store::status;
use super::{Inner, ResponseBody, body, error_response};

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

fn unauthorized() -> http::Response<ResponseBody> {
    error_response(status(
        401,
        "Unauthorized",
        "Unauthorized".into(),
        json!({}),
    ))
}

/// `pods/<name>/portforward` of namespace `<ns>`, if the path is one.
fn portforward_target(path: &str) -> Option<(String, String)> {
    let s: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match s.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", pod, "portforward"] => {
            Some((ns.to_string(), pod.to_string()))
        }
        _ => None,
    }
}

async fn serve_request(
    inner: Arc<Inner>,
    request: http::Request<hyper::body::Incoming>,
) -> http::Response<ResponseBody> {
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let user = token.and_then(|t| inner.tokens.lock().expect("tokens lock").get(&t).cloned());
    let Some(user) = user else {
        return unauthorized();
    };
    if let Some((ns, pod)) = portforward_target(request.uri().path()) {
        let attrs = super::rbac::Attributes {
            user: user.clone(),
            verb: "create".into(),
            group: String::new(),
            resource: "pods".into(),
            subresource: Some("portforward".into()),
            namespace: Some(ns.clone()),
            name: Some(pod.clone()),
        };
        if user != super::ADMIN && !inner.rbac.lock().expect("rbac lock").allows(&attrs) {
            return error_response(inner.deny(&attrs));
        }
        let handler = inner.portforward.lock().expect("lock").clone();
        return match handler {
            Some(handler) => handler(request, ns, pod).await.map(|b| b.boxed_unsync()),
            None => error_response(status(
                501,
                "NotImplemented",
                "port-forward is not served by this test API server (no handler set)".into(),
                json!({}),
            )),
        };
    }
    let (parts, incoming) = request.into_parts();
    let bytes = match incoming.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return http::Response::builder()
                .status(400)
                .body(body(Bytes::from(e.to_string())))
                .expect("static response parts");
        }
    };
    inner.handle(&user, &parts, bytes).await
}

impl Serving {
    pub async fn start(inner: Arc<Inner>) -> Result<Serving> {
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
                let (acceptor, inner) = (acceptor.clone(), inner.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let inner = inner.clone();
                        async move { Ok::<_, std::convert::Infallible>(serve_request(inner, req).await) }
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
