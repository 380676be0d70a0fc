//! The controller's HTTP endpoints: `/metrics` (Prometheus text), `/healthz`
//! (the process is alive) and `/readyz` (the controllers run and, with leader
//! election, this replica leads). A deliberately tiny HTTP/1.1 server: one
//! request per connection, nothing else.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::metrics::Metrics;

/// Liveness and readiness as the HTTP endpoints report them.
#[derive(Default)]
pub struct Health {
    /// The controllers run (and, with leader election, this replica leads).
    pub ready: AtomicBool,
}

/// A minimal HTTP/1.1 server for `/metrics`, `/healthz` and `/readyz`: one
/// request per connection, nothing else.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut len = 0;
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while len < buf.len() {
                    match stream.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => len += n,
                    }
                    if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let request = String::from_utf8_lossy(&buf[..len]);
            let path = request
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .unwrap_or("/");
            let path = path.split('?').next().unwrap_or(path);
            let (status, content_type, body) = match path {
                "/metrics" => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    metrics.encode(),
                ),
                "/healthz" | "/livez" => ("200 OK", "text/plain", "ok\n".to_string()),
                "/readyz" if health.ready.load(Ordering::SeqCst) => {
                    ("200 OK", "text/plain", "ready\n".to_string())
                }
                "/readyz" => (
                    "503 Service Unavailable",
                    "text/plain",
                    "not ready (not running or not the leader)\n".to_string(),
                ),
                _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_string(), body.to_string())
    }

    #[tokio::test]
    async fn endpoints_answer_over_tcp() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        metrics.observe_reconcile(Duration::from_millis(1), None);
        let health = Arc::new(Health::default());
        tokio::spawn(serve_http(listener, metrics, health.clone()));

        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.contains("etcdfleet_reconciles_total 1"), "{body}");
        assert_eq!(get(addr, "/healthz").await.0, "HTTP/1.1 200 OK");
        assert_eq!(
            get(addr, "/readyz").await.0,
            "HTTP/1.1 503 Service Unavailable"
        );
        health.ready.store(true, Ordering::SeqCst);
        assert_eq!(get(addr, "/readyz?verbose").await.0, "HTTP/1.1 200 OK");
        assert_eq!(get(addr, "/nope").await.0, "HTTP/1.1 404 Not Found");
    }
}
