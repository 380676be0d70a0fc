//! The controller's HTTP endpoints: `/metrics` (Prometheus text), `/healthz`
//! (the controller loop runs), `/readyz` (this replica is initialized and
//! reaches the API server) and `/leader` (this replica reconciles). A
//! deliberately tiny HTTP/1.1 server: one request per connection, nothing else.
//!
//! Ready means the same for a leader and a standby, so that a Deployment of
//! two replicas rolls out: without leader election, the first list of
//! EtcdClusters succeeded; with it, the leader has listed its EtcdClusters,
//! and a standby's last read of the Lease succeeded within the lease duration.
//! Which replica leads is `/leader` (200 leader, 503 standby), never readiness.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::metrics::Metrics;

/// Liveness, readiness and leadership as the HTTP endpoints report them.
#[derive(Default)]
pub struct Health {
    state: Mutex<HealthState>,
}

#[derive(Default)]
struct HealthState {
    /// The first list of EtcdClusters succeeded in every watched scope.
    listed: bool,
    /// `Some(lease duration)` when leader election is on.
    election: Option<Duration>,
    leader: bool,
    /// When this replica last read or wrote the Lease successfully.
    lease_seen: Option<Instant>,
    stopping: bool,
    /// Why the controller loop stopped on its own (liveness fails).
    dead: Option<String>,
}

impl Health {
    /// Health of a replica that takes part in leader election with this
    /// lease duration (standby readiness lapses after it).
    pub fn with_leader_election(lease_duration: Duration) -> Self {
        let health = Health::default();
        health.lock().election = Some(lease_duration);
        health
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        // The state is plain flags: a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first list of EtcdClusters succeeded.
    pub fn set_listed(&self) {
        self.lock().listed = true;
    }

    pub fn set_leader(&self, leader: bool) {
        self.lock().leader = leader;
    }

    /// The outcome of one attempt to read or renew the Lease.
    pub fn observe_lease(&self, answered: bool) {
        if answered {
            self.lock().lease_seen = Some(Instant::now());
        }
    }

    /// Shutdown began: stop taking traffic.
    pub fn set_stopping(&self) {
        self.lock().stopping = true;
    }

    /// The controller loop ended without a shutdown request.
    pub fn set_dead(&self, why: impl Into<String>) {
        self.lock().dead = Some(why.into());
    }

    pub fn is_leader(&self) -> bool {
        let s = self.lock();
        s.election.is_none() || s.leader
    }

    /// `Ok(what)` when alive; `Err(why)` when the controller loop stopped.
    pub fn liveness(&self) -> Result<String, String> {
        match &self.lock().dead {
            Some(why) => Err(format!("controller loop stopped: {why}")),
            None => Ok("ok".into()),
        }
    }

    /// `Ok(what)` when ready; `Err(why not)` otherwise.
    pub fn readiness(&self) -> Result<String, String> {
        let s = self.lock();
        if let Some(why) = &s.dead {
            return Err(format!("controller loop stopped: {why}"));
        }
        if s.stopping {
            return Err("shutting down".into());
        }
        match s.election {
            None if s.listed => Ok("ready".into()),
            None => Err("waiting for the first list of EtcdClusters".into()),
            Some(_) if s.leader && s.listed => Ok("ready (leader)".into()),
            Some(_) if s.leader => Err("leader; waiting for the first list of EtcdClusters".into()),
            Some(window) => match s.lease_seen {
                Some(at) if at.elapsed() <= window => Ok("ready (standby)".into()),
                Some(_) => Err(format!(
                    "standby; the Lease could not be read for {}s",
                    window.as_secs()
                )),
                None => Err("waiting for the first read of the leader Lease".into()),
            },
        }
    }
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
                "/healthz" | "/livez" => answer(health.liveness()),
                "/readyz" => answer(health.readiness()),
                "/leader" if health.is_leader() => ("200 OK", "text/plain", "leader\n".into()),
                "/leader" => ("503 Service Unavailable", "text/plain", "standby\n".into()),
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

fn answer(result: Result<String, String>) -> (&'static str, &'static str, String) {
    match result {
        Ok(what) => ("200 OK", "text/plain", format!("{what}\n")),
        Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
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
            get(addr, "/readyz").await,
            (
                "HTTP/1.1 503 Service Unavailable".to_string(),
                "waiting for the first list of EtcdClusters\n".to_string()
            )
        );
        health.set_listed();
        assert_eq!(get(addr, "/readyz?verbose").await.0, "HTTP/1.1 200 OK");
        assert_eq!(get(addr, "/leader").await.0, "HTTP/1.1 200 OK");
        assert_eq!(get(addr, "/nope").await.0, "HTTP/1.1 404 Not Found");
        health.set_dead("the EtcdCluster watch ended");
        assert_eq!(
            get(addr, "/healthz").await.0,
            "HTTP/1.1 503 Service Unavailable"
        );
        assert_eq!(
            get(addr, "/readyz").await.0,
            "HTTP/1.1 503 Service Unavailable"
        );
    }

    #[test]
    fn standby_is_ready_while_it_reads_the_lease_and_leader_once_listed() {
        let health = Health::with_leader_election(Duration::from_secs(15));
        assert!(health.readiness().is_err(), "nothing read yet");
        health.observe_lease(false);
        assert!(health.readiness().is_err(), "a failed read is not contact");
        health.observe_lease(true);
        assert_eq!(health.readiness(), Ok("ready (standby)".into()));
        assert!(!health.is_leader());
        health.set_leader(true);
        assert!(health.is_leader());
        assert!(
            health.readiness().is_err(),
            "a new leader is not ready before its first list"
        );
        health.set_listed();
        assert_eq!(health.readiness(), Ok("ready (leader)".into()));
        health.set_stopping();
        assert_eq!(health.readiness(), Err("shutting down".into()));
        assert!(health.liveness().is_ok(), "stopping is not dead");
    }

    #[test]
    fn standby_readiness_lapses_when_the_lease_goes_unread() {
        let health = Health::with_leader_election(Duration::from_millis(20));
        health.observe_lease(true);
        assert!(health.readiness().is_ok());
        std::thread::sleep(Duration::from_millis(40));
        let why = health.readiness().unwrap_err();
        assert!(why.contains("could not be read"), "{why}");
    }
}
