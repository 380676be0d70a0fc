//! The workload client's connection handling, against a plain TCP server
//! that answers HTTP/1.1 by hand (so the test controls every delay).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn kubeconfig(addr: SocketAddr) -> Kubeconfig {
    Kubeconfig::from_yaml(&format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://{addr}'}}\n\
         contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n\
         users:\n- name: u\n  user: {{}}\n"
    ))
    .expect("a kubeconfig")
}

async fn read_request(stream: &mut TcpStream) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.expect("a request");
        assert!(n > 0, "the client closed the connection");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// One connection, two requests: the first answered at once, the second
/// after `delay`. A second connection fails the test (no pooling).
async fn serve_two(listener: TcpListener, delay: Duration) {
    let (mut stream, _) = listener.accept().await.expect("a connection");
    for wait in [Duration::ZERO, delay] {
        read_request(&mut stream).await;
        tokio::time::sleep(wait).await;
        let body = r#"{"major":"1","minor":"37"}"#;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("written");
        stream.write_all(body.as_bytes()).await.expect("written");
    }
}

#[tokio::test]
async fn a_pooled_connections_idle_time_does_not_count_against_the_next_read_timeout() {
    // As `run` does: ring, the provider kube's feature names.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let server = tokio::spawn(serve_two(listener, Duration::from_millis(1500)));
    let factory = KubeconfigClientFactory {
        connect_timeout: Duration::from_secs(1),
        read_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let client = factory
        .build(&kubeconfig(addr), "")
        .await
        .expect("a client");
    let get = || {
        http::Request::get("/version")
            .body(Vec::new())
            .expect("a request")
    };
    client.request_text(get()).await.expect("the first answer");
    // Idle in the pool for 1 s, then answered 1.5 s after it is sent:
    // within the 2 s read timeout of that request, not of the idle connection.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sent = Instant::now();
    let answer = client.request_text(get()).await;
    assert!(answer.is_ok(), "{answer:?} after {:?}", sent.elapsed());
    assert!(sent.elapsed() >= Duration::from_millis(1500));
    server
        .await
        .expect("the server answered both on one connection");
}
