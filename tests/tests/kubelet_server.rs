//! The test kubelet's port-forward server with clients on loopback, to pods
//! that are TCP echo servers on their own loopback addresses: SPDY (the
//! project's SPDY client, speaking as client-go does through an API server)
//! and WebSocket (`v4.channel.k8s.io`, as kube-rs through an API server).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use etcdfleet_tests::kubelet_server::{KubeletServer, PodResolver};
use etcdfleet_tests::spdy::{Connection, Headers, Incoming, Role, Stream};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const WAIT: Duration = Duration::from_secs(10);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(WAIT, future)
        .await
        .with_context(|| format!("{what}: no answer within {WAIT:?}"))
}

/// A pod's address: loopback, but not 127.0.0.1, as the process kubelet's pods.
const POD_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A pod port that echoes every connection until the client half-closes.
async fn echo_port() -> Result<u16> {
    let listener = TcpListener::bind((POD_IP, 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = tcp.into_split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
                let _ = write.shutdown().await;
            });
        }
    });
    Ok(port)
}

/// A pod port that closes every connection at once.
async fn closing_port() -> Result<u16> {
    let listener = TcpListener::bind((POD_IP, 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            drop(tcp);
        }
    });
    Ok(port)
}

/// A pod port nothing listens on.
async fn dead_port() -> Result<u16> {
    let listener = TcpListener::bind((POD_IP, 0)).await?;
    Ok(listener.local_addr()?.port())
}

/// A kubelet whose one pod, `ns/etcd-0`, is at [`POD_IP`] while `present`.
fn kubelet(present: Arc<AtomicBool>) -> Result<KubeletServer> {
    let resolve: PodResolver = Arc::new(move |ns: &str, pod: &str| {
        (ns == "ns" && pod == "etcd-0" && present.load(Ordering::SeqCst)).then_some(POD_IP)
    });
    KubeletServer::start("127.0.0.1:0".parse()?, resolve)
}

fn always() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(true))
}

/// Trusts any certificate, as an API server started without
/// `--kubelet-certificate-authority` trusts its kubelets.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

async fn tls_to(addr: SocketAddr) -> Result<TlsStream<TcpStream>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    Ok(connector.connect("localhost".try_into()?, tcp).await?)
}

/// Sends `request` (head only) and reads the response head: status and the
/// head's text. The stream is left right after it.
async fn exchange(tls: &mut TlsStream<TcpStream>, request: &str) -> Result<(u16, String)> {
    tls.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tls.read_u8().await?);
    }
    let head = String::from_utf8(head)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status")?;
    Ok((status, head))
}

/// What a kube-apiserver sends a kubelet for kubectl's port-forward.
fn spdy_request(path: &str, protocol: Option<&str>) -> String {
    let protocol = protocol
        .map(|p| format!("X-Stream-Protocol-Version: {p}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: kubelet\r\nConnection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\n{protocol}Content-Length: 0\r\n\r\n"
    )
}

async fn spdy_connect(kubelet: &KubeletServer) -> Result<(Connection, Incoming)> {
    let mut tls = tls_to(kubelet.addr()).await?;
    let request = spdy_request("/portForward/ns/etcd-0", Some("portforward.k8s.io"));
    let (status, head) = exchange(&mut tls, &request).await?;
    if status != 101 {
        bail!("SPDY upgrade answered {head}");
    }
    let head = head.to_ascii_lowercase();
    assert!(head.contains("upgrade: spdy/3.1"), "{head}");
    assert!(
        head.contains("x-stream-protocol-version: portforward.k8s.io"),
        "{head}"
    );
    Ok(Connection::new(tls, Role::Client))
}

/// One forwarded connection, opened as client-go opens it: the error
/// stream first (closed for writing at once), then the data stream.
async fn forward(connection: &Connection, request: u32, port: u16) -> io::Result<(Stream, Stream)> {
    let headers = |kind: &str| {
        Headers::new()
            .with("streamType", kind)
            .with("port", &port.to_string())
            .with("requestID", &request.to_string())
    };
    let mut error = connection.open(headers("error")).await?;
    error.close().await?;
    let data = connection.open(headers("data")).await?;
    Ok((error, data))
}

async fn read_to_end(stream: &mut Stream) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(data) = stream.read().await {
        all.extend_from_slice(&data);
    }
    all
}

/// Sends `message` on the data stream, half-closes, and reads the echo.
async fn echo(data: &mut Stream, message: &[u8]) -> Result<Vec<u8>> {
    data.write(message).await?;
    data.close().await?;
    within("the echo", read_to_end(data)).await
}

#[tokio::test]
async fn spdy_forwards_many_requests_over_one_connection() -> Result<()> {
    let kubelet = kubelet(always())?;
    let port = echo_port().await?;
    let (connection, _) = spdy_connect(&kubelet).await?;

    for request in 0..3 {
        let (mut error, mut data) =
            within("streams", forward(&connection, request, port)).await??;
        let message = format!("request {request}");
        assert_eq!(
            echo(&mut data, message.as_bytes()).await?,
            message.as_bytes()
        );
        let errors = within("the error stream", read_to_end(&mut error)).await?;
        assert!(errors.is_empty(), "{:?}", String::from_utf8_lossy(&errors));
    }

    // Concurrent requests, bigger than a frame, each its own pod connection.
    let connection = Arc::new(connection);
    let mut echoes = Vec::new();
    for request in 3..11u32 {
        let connection = connection.clone();
        echoes.push(tokio::spawn(async move {
            let (_error, mut data) = forward(&connection, request, port).await?;
            let message = format!("{request:>4}").repeat(25_000);
            let got = echo(&mut data, message.as_bytes()).await?;
            anyhow::ensure!(got == message.as_bytes(), "request {request}: echo differs");
            anyhow::Ok(())
        }));
    }
    for echo in echoes {
        echo.await??;
    }
    within("a ping", connection.ping()).await??;
    assert_eq!(kubelet.tunnels_opened(), 1, "one upgraded connection");
    Ok(())
}

#[tokio::test]
async fn spdy_failures_go_on_the_error_stream_and_spare_the_connection() -> Result<()> {
    let present = always();
    let kubelet = kubelet(present.clone())?;
    let (live, dead) = (echo_port().await?, dead_port().await?);
    let (connection, _) = spdy_connect(&kubelet).await?;

    let (mut error, data) = within("streams", forward(&connection, 0, dead)).await??;
    let message = String::from_utf8(within("the error", read_to_end(&mut error)).await?)?;
    let expected = format!("error forwarding port {dead} to pod ns/etcd-0 at {POD_IP}");
    assert!(message.starts_with(&expected), "{message}");
    let (mut data, _) = data.into_split();
    assert_eq!(within("the data stream", data.read()).await?, None);
    assert!(
        data.was_reset(),
        "the data stream is reset, as the kubelet does"
    );

    // Streams without the headers port-forward needs are refused.
    let refused = connection
        .open(Headers::new().with("port", &live.to_string()))
        .await
        .err()
        .context("a stream without streamType was accepted")?;
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);

    // The connection still forwards.
    let (_, mut data) = within("streams", forward(&connection, 1, live)).await??;
    assert_eq!(echo(&mut data, b"still here").await?, b"still here");

    // A pod gone since the upgrade fails its next request.
    present.store(false, Ordering::SeqCst);
    let (mut error, _data) = within("streams", forward(&connection, 2, live)).await??;
    let message = String::from_utf8(within("the error", read_to_end(&mut error)).await?)?;
    assert!(message.contains("the pod has no address"), "{message}");
    Ok(())
}

#[tokio::test]
async fn spdy_upgrades_are_refused_as_the_kubelet_refuses_them() -> Result<()> {
    let kubelet = kubelet(always())?;
    let cases = [
        ("/portForward/ns/etcd-9", Some("portforward.k8s.io"), 404),
        ("/portForward/ns/etcd-0", None, 400),
        ("/portForward/ns/etcd-0", Some("v4.channel.k8s.io"), 403),
        ("/exec/ns/etcd-0/etcd", Some("portforward.k8s.io"), 404),
        ("/healthz", None, 404),
    ];
    for (path, protocol, expected) in cases {
        let mut tls = tls_to(kubelet.addr()).await?;
        let (status, head) = exchange(&mut tls, &spdy_request(path, protocol)).await?;
        assert_eq!(status, expected, "{path} {protocol:?}: {head}");
    }
    assert_eq!(kubelet.tunnels_opened(), 0);
    Ok(())
}

type Ws = tokio_tungstenite::WebSocketStream<TlsStream<TcpStream>>;

/// What a kube-apiserver passes on for kube-rs's port-forward.
async fn websocket(kubelet: &KubeletServer, pod: &str, query: &str) -> Result<Ws, u16> {
    let url = format!("wss://{}/portForward/ns/{pod}?{query}", kubelet.addr());
    let mut request = url.into_client_request().expect("a valid request");
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io, v4.channel.k8s.io"
            .parse()
            .expect("static"),
    );
    let tls = tls_to(kubelet.addr()).await.expect("TLS to the kubelet");
    match tokio_tungstenite::client_async(request, tls).await {
        Ok((ws, response)) => {
            let protocol = response.headers().get("Sec-WebSocket-Protocol");
            assert_eq!(
                protocol.and_then(|p| p.to_str().ok()),
                Some("v4.channel.k8s.io")
            );
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

/// The next binary message of `ws`.
async fn next_binary(ws: &mut Ws) -> Result<Vec<u8>> {
    loop {
        match within("a websocket message", ws.next()).await? {
            Some(Ok(Message::Binary(data))) => return Ok(data.to_vec()),
            Some(Ok(Message::Close(_))) | None => bail!("the tunnel closed"),
            Some(Err(e)) => bail!("the tunnel failed: {e}"),
            Some(Ok(_)) => {}
        }
    }
}

fn announcement(channel: u8, port: u16) -> Vec<u8> {
    let [lo, hi] = port.to_le_bytes();
    vec![channel, lo, hi]
}

#[tokio::test]
async fn websocket_tunnels_reach_the_pod_port_by_port() -> Result<()> {
    let kubelet = kubelet(always())?;
    let (live, dead, closing) = (
        echo_port().await?,
        dead_port().await?,
        closing_port().await?,
    );

    let query = format!("port={closing}%2C{live}%2C{dead}");
    let mut ws = websocket(&kubelet, "etcd-0", &query)
        .await
        .map_err(|s| anyhow::anyhow!("{s}"))?;
    for (i, port) in [closing, live, dead].into_iter().enumerate() {
        let channel = 2 * i as u8;
        assert_eq!(next_binary(&mut ws).await?, announcement(channel, port));
        assert_eq!(next_binary(&mut ws).await?, announcement(channel + 1, port));
    }
    let error = next_binary(&mut ws).await?;
    assert_eq!(error[0], 5, "the unreachable port's error channel");
    let message = String::from_utf8_lossy(&error[1..]).to_string();
    assert!(
        message.starts_with(&format!("error forwarding port {dead}")),
        "{message}"
    );

    // The first port's pod closed at once; as the kubelet, the tunnel stays
    // open while another port's connection lives.
    ws.send(Message::binary([&[2u8][..], b"over port two"].concat()))
        .await?;
    let echoed = next_binary(&mut ws).await?;
    assert_eq!(&echoed[..], &[&[2u8][..], b"over port two"].concat()[..]);
    assert_eq!(kubelet.tunnels_opened(), 1);
    Ok(())
}

#[tokio::test]
async fn websocket_requests_without_ports_or_pod_are_refused() -> Result<()> {
    let kubelet = kubelet(always())?;
    let port = echo_port().await?;
    assert_eq!(websocket(&kubelet, "etcd-0", "").await.err(), Some(400));
    // The API server's own parameter name, not the client's.
    let query = format!("ports={port}");
    assert_eq!(websocket(&kubelet, "etcd-0", &query).await.err(), Some(400));
    let query = format!("port={port}");
    assert_eq!(websocket(&kubelet, "etcd-9", &query).await.err(), Some(404));
    assert_eq!(kubelet.tunnels_opened(), 0);
    Ok(())
}

#[tokio::test]
async fn break_tunnels_cuts_every_open_tunnel_and_new_ones_work() -> Result<()> {
    let kubelet = kubelet(always())?;
    let port = echo_port().await?;
    let (connection, _) = spdy_connect(&kubelet).await?;
    let (_error, mut data) = within("streams", forward(&connection, 0, port)).await??;
    data.write(b"before").await?;
    assert_eq!(
        within("the echo", data.read()).await?.as_deref(),
        Some(&b"before"[..])
    );
    let mut ws = websocket(&kubelet, "etcd-0", &format!("port={port}"))
        .await
        .map_err(|s| anyhow::anyhow!("{s}"))?;
    next_binary(&mut ws).await?;
    next_binary(&mut ws).await?;
    assert_eq!(kubelet.tunnels_opened(), 2);

    kubelet.break_tunnels();
    assert_eq!(within("the cut SPDY stream", data.read()).await?, None);
    within("the SPDY connection's end", connection.closed()).await?;
    match within("the cut websocket", ws.next()).await? {
        Some(Ok(Message::Close(_))) => bail!("a broken tunnel says no goodbye"),
        Some(Ok(other)) => bail!("unexpected {other:?}"),
        Some(Err(_)) | None => {}
    }

    let (connection, _) = spdy_connect(&kubelet).await?;
    let (_, mut data) = within("streams", forward(&connection, 0, port)).await??;
    assert_eq!(echo(&mut data, b"after").await?, b"after");
    assert_eq!(kubelet.tunnels_opened(), 3);

    // Stopping the kubelet cuts the rest and refuses new connections.
    let addr = kubelet.addr();
    drop(kubelet);
    within("the SPDY connection's end", connection.closed()).await?;
    // The listener goes with its task, once the runtime has cancelled it.
    let mut listening = true;
    for _ in 0..100 {
        listening = TcpStream::connect(addr).await.is_ok();
        if !listening {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!listening, "nothing listens on {addr} any more");
    Ok(())
}
