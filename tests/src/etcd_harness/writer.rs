//! Writers that prove no acknowledged write is lost across an operation:
//! they write keys continuously while a test upgrades, scales or breaks a
//! cluster, record which writes etcd acknowledged, and read them all back
//! afterwards.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig};
use k8s_openapi::jiff::Timestamp;

/// What an [`AckedWriter`] did.
#[derive(Debug, Default, Clone)]
pub struct WriteReport {
    /// Writes etcd acknowledged: key → value.
    pub acknowledged: BTreeMap<String, String>,
    /// Writes that failed or timed out (their outcome is unknown).
    pub failed: u64,
    /// The longest time between two acknowledged writes (a
    /// [`FollowingWriter`]'s; zero for an [`AckedWriter`]).
    pub longest_pause: Duration,
    /// When the longest pause began and ended (the two acknowledgements
    /// around it), to set beside the controller's steps.
    pub longest_pause_between: Option<(Timestamp, Timestamp)>,
    /// What each failed write of a [`FollowingWriter`] met, the first
    /// [`FAILURES_KEPT`] of them: when a pause is too long, these say
    /// where the time went.
    pub failures: Vec<WriteFailure>,
}

/// Failed writes a [`WriteReport`] describes one by one.
pub const FAILURES_KEPT: usize = 64;

/// One failed write (or connection) of a [`FollowingWriter`].
#[derive(Debug, Clone)]
pub struct WriteFailure {
    /// When it began.
    pub at: Timestamp,
    /// The endpoint it went to.
    pub endpoint: String,
    /// How long it took to fail.
    pub took: Duration,
    /// What it met: the error, or the put timeout.
    pub error: String,
}

impl WriteReport {
    fn record_failure(&mut self, endpoint: &str, started: (Timestamp, Instant), error: String) {
        self.failed += 1;
        if self.failures.len() < FAILURES_KEPT {
            self.failures.push(WriteFailure {
                at: started.0,
                endpoint: endpoint.to_string(),
                took: started.1.elapsed(),
                error,
            });
        }
    }

    /// The longest pause and the failures met during it, for a message.
    pub fn pause_story(&self) -> String {
        let Some((from, to)) = self.longest_pause_between else {
            return format!("longest pause {:?}", self.longest_pause);
        };
        let during: Vec<String> = (self.failures.iter())
            .filter(|f| f.at >= from && f.at <= to)
            .map(|f| {
                format!(
                    "{} {} failed after {:?}: {}",
                    f.at, f.endpoint, f.took, f.error
                )
            })
            .collect();
        format!(
            "longest pause {:?}, from the acknowledgement at {from} to the one at {to}; \
             failures in it: {during:#?}",
            self.longest_pause
        )
    }
}

/// Writes keys `<prefix>/<seq>` continuously, like [`AckedWriter`], through
/// whichever member answers: endpoints (each with its own TLS) can be added
/// while it runs, and a failed write moves on to the next one, as a client
/// given every member's URL does. Records the longest pause between two
/// acknowledged writes: how long clients could not write.
pub struct FollowingWriter {
    stop: Arc<AtomicBool>,
    endpoints: Arc<Mutex<Vec<(String, EtcdConfig)>>>,
    task: tokio::task::JoinHandle<Result<WriteReport>>,
}

impl FollowingWriter {
    pub fn start(endpoints: Vec<(String, EtcdConfig)>, prefix: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let endpoints = Arc::new(Mutex::new(endpoints));
        let task = tokio::spawn(follow_writes(
            stop.clone(),
            endpoints.clone(),
            prefix.to_string(),
        ));
        FollowingWriter {
            stop,
            endpoints,
            task,
        }
    }

    /// Adds an endpoint (once).
    pub fn add(&self, endpoint: String, config: EtcdConfig) {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        if !endpoints.iter().any(|(e, _)| *e == endpoint) {
            endpoints.push((endpoint, config));
        }
    }

    /// Drops an endpoint whose member left the membership, as a client
    /// that follows the membership does (etcd's clients sync their
    /// endpoints from the member list): a removed etcd 3.5 member keeps its
    /// client port open, and every request sent to it waits for the
    /// client's deadline. The last endpoint is never dropped.
    pub fn remove(&self, endpoint: &str) {
        let mut endpoints = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        if endpoints.len() > 1 {
            endpoints.retain(|(e, _)| e != endpoint);
        }
    }

    /// Stops writing and returns what was acknowledged.
    pub async fn stop(self) -> Result<WriteReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

async fn follow_writes(
    stop: Arc<AtomicBool>,
    endpoints: Arc<Mutex<Vec<(String, EtcdConfig)>>>,
    prefix: String,
) -> Result<WriteReport> {
    let mut clients: BTreeMap<String, etcd_client::Client> = BTreeMap::new();
    let mut report = WriteReport::default();
    let (mut seq, mut at) = (0u64, 0usize);
    let mut last_ack: Option<(Timestamp, Instant)> = None;
    while !stop.load(Ordering::Relaxed) {
        let (endpoint, config) = {
            let list = endpoints.lock().unwrap_or_else(|p| p.into_inner());
            list[at % list.len()].clone()
        };
        let started = (Timestamp::now(), Instant::now());
        if !clients.contains_key(&endpoint) {
            // A member gone for good (a pod recreated at another IP) is
            // passed over, as a client given every member's URL does.
            match ClusterClient::connect(std::slice::from_ref(&endpoint), &config).await {
                Ok(client) => {
                    clients.insert(endpoint.clone(), client.kv());
                }
                Err(e) => {
                    report.record_failure(&endpoint, started, format!("connect: {e:#}"));
                    at += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        }
        let kv = clients.get_mut(&endpoint).expect("just inserted");
        seq += 1;
        let (key, value) = (format!("{prefix}/{seq:08}"), format!("value-{seq}"));
        let started = (Timestamp::now(), Instant::now());
        let put = tokio::time::timeout(
            Duration::from_secs(2),
            kv.put(key.as_str(), value.as_str(), None),
        )
        .await;
        match put {
            Ok(Ok(_)) => {
                report.acknowledged.insert(key, value);
                let now = (Timestamp::now(), Instant::now());
                if let Some(last) = last_ack
                    && now.1 - last.1 > report.longest_pause
                {
                    report.longest_pause = now.1 - last.1;
                    report.longest_pause_between = Some((last.0, now.0));
                }
                last_ack = Some(now);
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => format!("put: {e}"),
                    _ => "put: no answer within 2s".to_string(),
                };
                report.record_failure(&endpoint, started, error);
                at += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(report)
}

/// Writes keys `<prefix>/<seq>` continuously through a client balanced over
/// all endpoints and records which writes etcd acknowledged; afterwards,
/// [`verify_acknowledged`] proves every one of them is readable.
pub struct AckedWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<WriteReport>>,
}

impl AckedWriter {
    pub async fn start(endpoints: Vec<String>, config: EtcdConfig, prefix: &str) -> Result<Self> {
        let client = ClusterClient::connect(&endpoints, &config).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let prefix = prefix.to_string();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut kv = client.kv();
                let mut report = WriteReport::default();
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let key = format!("{prefix}/{seq:08}");
                    let value = format!("value-{seq}");
                    let put = tokio::time::timeout(
                        Duration::from_secs(2),
                        kv.put(key.as_str(), value.as_str(), None),
                    )
                    .await;
                    match put {
                        Ok(Ok(_)) => {
                            report.acknowledged.insert(key, value);
                        }
                        _ => {
                            report.failed += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(report)
            }
        });
        Ok(AckedWriter { stop, task })
    }

    /// Stops writing and returns what was acknowledged.
    pub async fn stop(self) -> Result<WriteReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// The acknowledged writes of `report` that `stored` (what was read back)
/// lacks or holds with another value.
pub fn lost_writes<'a>(
    report: &'a WriteReport,
    stored: &BTreeMap<String, String>,
) -> Vec<&'a String> {
    report
        .acknowledged
        .iter()
        .filter(|(k, v)| stored.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect()
}

/// Reads `prefix` back (linearizably, through `endpoints`) and checks every
/// acknowledged write is there with its value. Returns how many were checked.
pub async fn verify_acknowledged(
    report: &WriteReport,
    endpoints: &[String],
    config: &EtcdConfig,
    prefix: &str,
) -> Result<usize> {
    let mut kv = ClusterClient::connect(endpoints, config).await?.kv();
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        kv.get(
            format!("{prefix}/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        ),
    )
    .await
    .context("reading back acknowledged writes timed out")??;
    let stored: BTreeMap<String, String> = resp
        .kvs()
        .iter()
        .map(|kv| Ok((kv.key_str()?.to_string(), kv.value_str()?.to_string())))
        .collect::<Result<_, etcd_client::Error>>()?;
    let lost = lost_writes(report, &stored);
    ensure!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost, first: {:?}",
        lost.len(),
        report.acknowledged.len(),
        lost.iter().take(5).collect::<Vec<_>>()
    );
    Ok(report.acknowledged.len())
}
