//! The workload cluster connector against a fake management API: kubeconfig
//! checks, the client cache (reuse, rotation, auth eviction, idle eviction),
//! per-cluster backoff, and that Secrets are only ever read by name.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use etcdfleet_controllers::connector::{
    ConnectError, ConnectorSettings, KubeconfigLocation, WorkloadClientFactory,
    WorkloadClusterConnector, check_kubeconfig,
};
use etcdfleet_tests::fleet::{Fleet, KubeconfigFault};
use futures::future::BoxFuture;
use kube::Client;
use kube::config::Kubeconfig;

/// Counts how often a client is built, delegating to the fleet's factory.
struct CountingFactory {
    inner: Arc<dyn WorkloadClientFactory>,
    builds: AtomicUsize,
}

impl WorkloadClientFactory for CountingFactory {
    fn build<'a>(
        &'a self,
        kubeconfig: &'a Kubeconfig,
        server: &'a str,
    ) -> BoxFuture<'a, Result<Client, String>> {
        self.builds.fetch_add(1, Ordering::SeqCst);
        self.inner.build(kubeconfig, server)
    }
}

fn location(fleet: &Fleet, name: &str) -> KubeconfigLocation {
    KubeconfigLocation {
        namespace: fleet.namespace().to_string(),
        secret_name: Fleet::kubeconfig_secret_name(name),
        key: "value".into(),
    }
}

fn connector(
    fleet: &Fleet,
    settings: ConnectorSettings,
) -> (WorkloadClusterConnector, Arc<CountingFactory>) {
    let factory = Arc::new(CountingFactory {
        inner: fleet.client_factory(),
        builds: AtomicUsize::new(0),
    });
    (
        WorkloadClusterConnector::new(fleet.management(), factory.clone(), settings),
        factory,
    )
}

#[tokio::test]
async fn clients_are_cached_per_secret_version_and_rebuilt_on_rotation() -> Result<()> {
    let fleet = Fleet::new(&["a", "b"]).await?;
    let (conn, factory) = connector(&fleet, ConnectorSettings::default());
    let a = conn.connect(&location(&fleet, "a")).await?;
    assert_eq!(a.server, fleet.server_url("a"));
    conn.connect(&location(&fleet, "a")).await?;
    conn.connect(&location(&fleet, "b")).await?;
    assert_eq!(
        factory.builds.load(Ordering::SeqCst),
        2,
        "one client per cluster, reused"
    );
    assert_eq!(conn.cached(), 2);

    // Rotation (a new token): a new resourceVersion of the Secret rebuilds
    // the client. (Writing the same content again is a no-op on a real API
    // server: no new resourceVersion.)
    let api = fleet.workload_api("a");
    let rotated = api.kubeconfig(&api.issue_token(etcdfleet_tests::fleet::WORKLOAD_USER));
    fleet.put_kubeconfig("a", &rotated).await?;
    conn.connect(&location(&fleet, "a")).await?;
    assert_eq!(factory.builds.load(Ordering::SeqCst), 3);

    // Every read of a kubeconfig was a GET by name.
    let secret_ops: Vec<_> = fleet
        .ops()
        .into_iter()
        .filter(|o| o.resource == "secrets")
        .collect();
    assert!(!secret_ops.is_empty());
    assert!(
        secret_ops
            .iter()
            .all(|o| o.verb == "get" && o.name.is_some()),
        "{secret_ops:?}"
    );
    assert!(fleet.secret_lists_or_watches().is_empty());
    Ok(())
}

#[tokio::test]
async fn authentication_failures_evict_and_failures_back_off_per_cluster() -> Result<()> {
    let fleet = Fleet::new(&["a", "b"]).await?;
    let settings = ConnectorSettings {
        idle_ttl: Duration::from_millis(200),
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_millis(350),
    };
    let (conn, factory) = connector(&fleet, settings);
    let (la, lb) = (location(&fleet, "a"), location(&fleet, "b"));
    conn.connect(&la).await?;
    conn.connect(&lb).await?;

    let unauthorized = ConnectError::Unauthorized {
        server: "https://a.workload.test:6443".into(),
        detail: "Unauthorized (401)".into(),
    };
    let first = conn.record_failure(&la, &unauthorized);
    let second = conn.record_failure(&la, &unauthorized);
    let third = conn.record_failure(&la, &unauthorized);
    assert_eq!(
        (first, second, third),
        (
            Duration::from_millis(100),
            Duration::from_millis(200),
            Duration::from_millis(350)
        ),
        "doubling, capped"
    );
    assert!(conn.backoff_remaining(&la).is_some());
    assert!(
        conn.backoff_remaining(&lb).is_none(),
        "b is not affected by a's failures"
    );
    assert_eq!(
        conn.cached(),
        1,
        "a's client was evicted on the auth failure"
    );
    conn.connect(&la).await?;
    assert_eq!(
        factory.builds.load(Ordering::SeqCst),
        3,
        "rebuilt after eviction"
    );
    conn.record_success(&la);
    assert!(conn.backoff_remaining(&la).is_none());

    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(conn.evict_idle(), 2, "idle clients are dropped");
    assert_eq!(conn.cached(), 0);
    Ok(())
}

#[tokio::test]
async fn broken_kubeconfigs_get_specific_errors_without_secret_content() -> Result<()> {
    let fleet = Fleet::new(&["a"]).await?;
    let (conn, factory) = connector(&fleet, ConnectorSettings::default());
    let la = location(&fleet, "a");
    for (fault, reason) in [
        (KubeconfigFault::Garbage, "KubeconfigInvalid"),
        (KubeconfigFault::ExecPlugin, "KubeconfigNotAllowed"),
        (KubeconfigFault::Missing, "KubeconfigSecretNotFound"),
    ] {
        fleet.break_kubeconfig("a", fault).await?;
        let err = match conn.connect(&la).await {
            Err(e) => e,
            Ok(_) => panic!("{fault:?} must be refused"),
        };
        assert_eq!(err.reason(), reason, "{err}");
        let message = err.to_string();
        assert!(message.contains("a-kubeconfig"), "{message}");
        assert!(
            !message.contains("echo pwned"),
            "no Secret content: {message}"
        );
    }
    assert_eq!(
        factory.builds.load(Ordering::SeqCst),
        0,
        "nothing built from a bad kubeconfig"
    );
    Ok(())
}

fn check(text: &str) -> Result<String, ConnectError> {
    let location = KubeconfigLocation {
        namespace: "ns".into(),
        secret_name: "c-kubeconfig".into(),
        key: "value".into(),
    };
    check_kubeconfig(&location, text).map(|(_, server)| server)
}

const GOOD: &str = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://c.example:6443
    certificate-authority-data: Zm9v
users:
- name: u
  user:
    token: secret-token
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
";

#[test]
fn kubeconfig_checks_allow_only_inline_credentials() {
    assert_eq!(check(GOOD).unwrap(), "https://c.example:6443");
    let cases = [
        (
            GOOD.replace(
                "certificate-authority-data: Zm9v",
                "certificate-authority: /etc/ca.crt",
            ),
            "KubeconfigNotAllowed",
            "certificate-authority",
        ),
        (
            GOOD.replace("token: secret-token", "tokenFile: /var/run/token"),
            "KubeconfigNotAllowed",
            "tokenFile",
        ),
        (
            GOOD.replace(
                "token: secret-token",
                "client-certificate: /c.crt\n    client-key: /c.key",
            ),
            "KubeconfigNotAllowed",
            "local files",
        ),
        (
            GOOD.replace("token: secret-token", "auth-provider: {name: gcp}"),
            "KubeconfigNotAllowed",
            "auth-provider",
        ),
        (
            GOOD.replace(
                "token: secret-token",
                "exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}",
            ),
            "KubeconfigNotAllowed",
            "exec",
        ),
        (
            GOOD.replace("current-context: ctx", "current-context: other"),
            "KubeconfigInvalid",
            "\"other\" is not defined",
        ),
        (
            GOOD.replace("    server: https://c.example:6443\n", ""),
            "KubeconfigInvalid",
            "has no server",
        ),
        (
            GOOD.replace("https://c.example:6443", "ftp://c.example"),
            "KubeconfigInvalid",
            "not an http(s) URL",
        ),
        (
            "{{{ not yaml".to_string(),
            "KubeconfigInvalid",
            "cannot parse",
        ),
    ];
    for (text, reason, words) in cases {
        let err = check(&text).expect_err(words);
        assert_eq!(err.reason(), reason, "{err}");
        assert!(err.to_string().contains(words), "{err}");
        assert!(!err.to_string().contains("secret-token"), "{err}");
    }
}

#[tokio::test]
async fn a_trusted_client_skips_the_secret_read_until_its_trust_expires() -> Result<()> {
    let fleet = Fleet::new(&["a"]).await?;
    let (conn, _) = connector(&fleet, ConnectorSettings::default());
    let la = location(&fleet, "a");
    let secret_gets = |fleet: &Fleet| {
        fleet
            .ops()
            .iter()
            .filter(|o| o.resource == "secrets" && o.verb == "get")
            .count()
    };
    conn.connect(&la).await?;
    fleet.clear_ops();
    let trust = Duration::from_millis(300);
    conn.connect_trusting(&la, trust).await?;
    conn.connect_trusting(&la, trust).await?;
    assert_eq!(secret_gets(&fleet), 0, "trusted: no read");
    tokio::time::sleep(trust).await;
    conn.connect_trusting(&la, trust).await?;
    assert_eq!(secret_gets(&fleet), 1, "trust expired: read again");
    conn.connect_trusting(&la, Duration::ZERO).await?;
    assert_eq!(secret_gets(&fleet), 2, "no trust: always read");
    Ok(())
}

#[tokio::test]
async fn a_deleted_cluster_is_forgotten_by_the_connector() -> Result<()> {
    let fleet = Fleet::new(&["a", "b"]).await?;
    let settings = ConnectorSettings {
        idle_ttl: Duration::from_secs(60),
        backoff_base: Duration::from_secs(10),
        backoff_max: Duration::from_secs(60),
    };
    let (conn, _) = connector(&fleet, settings);
    let (la, lb) = (location(&fleet, "a"), location(&fleet, "b"));
    conn.connect(&la).await?;
    conn.connect(&lb).await?;
    let unreachable = ConnectError::Unauthorized {
        server: "https://a.workload.test:6443".into(),
        detail: "Unauthorized (401)".into(),
    };
    conn.record_failure(&la, &unreachable);
    conn.connect(&la).await?;
    assert!(conn.backoff_remaining(&la).is_some());
    assert_eq!(conn.cached(), 2);
    // What finalization does once the EtcdCluster is gone.
    conn.forget(&la);
    assert!(conn.backoff_remaining(&la).is_none());
    assert_eq!(conn.cached(), 1, "only b's client remains");
    Ok(())
}

/// A workload API server a tenant could name: to every request it answers
/// 200 with a body of `body_bytes` bytes, as fast as it can (`every` zero)
/// or one byte per `every`. Counts the bytes it sent.
struct HostileServer {
    url: String,
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl HostileServer {
    async fn start(body_bytes: u64, every: Duration) -> Result<HostileServer> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = stream.read(&mut buf).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {body_bytes}\r\n\r\n"
                    );
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = if every.is_zero() {
                        vec![b' '; 64 * 1024]
                    } else {
                        vec![b' ']
                    };
                    let mut left = body_bytes;
                    while left > 0 {
                        let n = left.min(chunk.len() as u64) as usize;
                        if stream.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        counted.fetch_add(n as u64, Ordering::SeqCst);
                        left -= n as u64;
                        tokio::time::sleep(every).await;
                    }
                });
            }
        });
        Ok(HostileServer { url, sent })
    }

    fn kubeconfig(&self) -> Kubeconfig {
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters: [{{name: t, cluster: {{server: '{}'}}}}]\n\
             users: [{{name: t, user: {{token: tenant}}}}]\ncontexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n",
            self.url
        );
        Kubeconfig::from_yaml(&text).expect("a kubeconfig")
    }
}

/// This process's resident set, in KiB; a test that bounds it fails,
/// rather than passes, when it cannot be read.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    assert!(kib > 0, "VmRSS is 0");
    kib
}

/// Every message in an error's chain.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Issue 52: a workload API server is named by a tenant's kubeconfig. One
/// that answers a 512 MiB body costs the controller at most the cap it
/// reads (RSS grows by less than 64 MiB), and one that trickles its answer
/// a byte a second ends the call at the deadline; neither holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_hostile_workload_api_server_gets_a_bounded_read_and_a_deadline() -> Result<()> {
    use etcdfleet_controllers::connector::KubeconfigClientFactory;
    use etcdfleet_controllers::connector::bounded::{BoundedLayer, MAX_RESPONSE_BYTES};
    use k8s_openapi::api::core::v1::Pod;
    // As `run` does: ring, the provider kube's feature names.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let factory = KubeconfigClientFactory {
        bounds: BoundedLayer {
            max_bytes: MAX_RESPONSE_BYTES,
            deadline: Duration::from_secs(3),
        },
        ..Default::default()
    };
    let huge = HostileServer::start(512 << 20, Duration::ZERO).await?;
    let before = rss_kib();
    let client = factory
        .build(&huge.kubeconfig(), &huge.url)
        .await
        .map_err(anyhow::Error::msg)?;
    let err = kube::Api::<Pod>::namespaced(client, "etcd-system")
        .list(&Default::default())
        .await
        .expect_err("a 512 MiB answer is not read");
    let grew_kib = rss_kib().saturating_sub(before);
    let why = chain(&err);
    assert!(
        why.contains(&format!("over {MAX_RESPONSE_BYTES} bytes")),
        "{why}"
    );
    let sent = huge.sent.load(Ordering::SeqCst);
    assert!(
        sent > MAX_RESPONSE_BYTES,
        "the server sent only {sent} bytes"
    );
    assert!(grew_kib < 64 * 1024, "RSS grew by {grew_kib} KiB");
    eprintln!("512 MiB answer: refused after {sent} bytes sent, RSS grew by {grew_kib} KiB");

    let trickle = HostileServer::start(1000, Duration::from_secs(1)).await?;
    let client = factory
        .build(&trickle.kubeconfig(), &trickle.url)
        .await
        .map_err(anyhow::Error::msg)?;
    let started = std::time::Instant::now();
    let err = kube::Api::<Pod>::namespaced(client, "etcd-system")
        .list(&Default::default())
        .await
        .expect_err("a trickled answer is not waited for");
    let took = started.elapsed();
    let why = chain(&err);
    assert!(why.contains("within 3s"), "{why}");
    assert!(took < Duration::from_secs(8), "the call took {took:?}");
    eprintln!("trickled answer: ended after {took:?}");
    Ok(())
}
