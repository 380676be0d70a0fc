//! Keeps one [`ClusterClient`] (and so one connection per member) per etcd
//! cluster between reconciles while an operation is in flight, so the polls
//! of a roll or a scale-out (every 100–500 ms) do not open new connections
//! (or port-forward tunnels) each time. A cluster at rest (converged,
//! paused, blocked) lets go of its client after each reconcile: its next
//! look is a minute away, and a held tunnel costs about 0.1 MiB, so a
//! replica's memory follows the clusters in flight rather than the fleet
//! (`make bench-fleet`).
//!
//! A client is reused only while what it was built from is unchanged: the
//! endpoints (members added or removed), the TLS material (rotated
//! certificates), deadlines and transport (another workload API server). It
//! is dropped when its cluster's etcd cannot be observed (the next reconcile
//! starts from fresh connections), after `idle_ttl` without use, and, least
//! recently used first, when more than `capacity` clusters are held.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::client::{ClusterClient, Result};
use super::transport::EtcdConfig;

/// Bounds of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    pub capacity: usize,
    pub idle_ttl: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            capacity: 2000,
            idle_ttl: Duration::from_secs(5 * 60),
        }
    }
}

struct Entry {
    endpoints: Vec<String>,
    config: EtcdConfig,
    client: ClusterClient,
    last_used: Instant,
}

/// Cluster clients by cluster key (any string naming one etcd cluster).
pub struct ClientPool {
    settings: PoolSettings,
    entries: Mutex<HashMap<String, Entry>>,
    built: AtomicU64,
}

impl Default for ClientPool {
    fn default() -> Self {
        ClientPool::new(PoolSettings::default())
    }
}

impl ClientPool {
    pub fn new(settings: PoolSettings) -> Self {
        ClientPool {
            settings,
            entries: Mutex::new(HashMap::new()),
            built: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock leaves only a cache behind: use it.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The held client of `key` if it was built from exactly these endpoints
    /// and config; otherwise a new one, which replaces it.
    pub async fn get(
        &self,
        key: &str,
        endpoints: &[String],
        config: &EtcdConfig,
    ) -> Result<ClusterClient> {
        {
            let mut entries = self.lock();
            if let Some(entry) = entries.get_mut(key) {
                if entry.endpoints == endpoints && &entry.config == config {
                    entry.last_used = Instant::now();
                    return Ok(entry.client.clone());
                }
                entries.remove(key);
            }
        }
        let client = ClusterClient::connect(endpoints, config).await?;
        self.built.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.lock();
        if entries.len() >= self.settings.capacity && !entries.contains_key(key) {
            let oldest = entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
        entries.insert(
            key.to_string(),
            Entry {
                endpoints: endpoints.to_vec(),
                config: config.clone(),
                client: client.clone(),
                last_used: Instant::now(),
            },
        );
        Ok(client)
    }

    /// Drops the client of `key` (its connections close once no reconcile
    /// holds a clone).
    pub fn evict(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Drops clients unused for `idle_ttl`; returns how many.
    pub fn evict_idle(&self) -> usize {
        let ttl = self.settings.idle_ttl;
        let mut entries = self.lock();
        let before = entries.len();
        entries.retain(|_, e| e.last_used.elapsed() < ttl);
        before - entries.len()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cluster clients built so far (each a new set of connections).
    pub fn clients_built(&self) -> u64 {
        self.built.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Transport;

    fn config(label: &str) -> EtcdConfig {
        EtcdConfig {
            transport: Some(Transport::new(label.to_string(), |_| {
                Box::pin(async { Err(std::io::Error::other("never dialed in these tests")) })
            })),
            ..EtcdConfig::default()
        }
    }

    fn urls(n: u32) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://m-{i}.p.ns.svc:2379"))
            .collect()
    }

    #[tokio::test]
    async fn same_inputs_reuse_the_client_and_changed_inputs_rebuild_it() {
        let pool = ClientPool::default();
        pool.get("a", &urls(3), &config("t1")).await.unwrap();
        pool.get("a", &urls(3), &config("t1")).await.unwrap();
        assert_eq!(pool.clients_built(), 1, "unchanged inputs reuse");
        pool.get("a", &urls(4), &config("t1")).await.unwrap();
        assert_eq!(pool.clients_built(), 2, "a new member rebuilds");
        pool.get("a", &urls(4), &config("t2")).await.unwrap();
        assert_eq!(pool.clients_built(), 3, "another transport rebuilds");
        assert_eq!(pool.len(), 1);
        pool.evict("a");
        pool.get("a", &urls(4), &config("t2")).await.unwrap();
        assert_eq!(pool.clients_built(), 4, "an evicted client is rebuilt");
    }

    #[tokio::test]
    async fn the_pool_holds_at_most_capacity_clusters_dropping_the_least_recently_used() {
        let pool = ClientPool::new(PoolSettings {
            capacity: 2,
            idle_ttl: Duration::from_secs(60),
        });
        pool.get("a", &urls(1), &config("t")).await.unwrap();
        pool.get("b", &urls(1), &config("t")).await.unwrap();
        pool.get("a", &urls(1), &config("t")).await.unwrap();
        pool.get("c", &urls(1), &config("t")).await.unwrap();
        assert_eq!(pool.len(), 2);
        pool.get("a", &urls(1), &config("t")).await.unwrap();
        assert_eq!(pool.clients_built(), 3, "a stayed, b was dropped");
    }

    #[tokio::test]
    async fn idle_clients_are_evicted() {
        let pool = ClientPool::new(PoolSettings {
            capacity: 10,
            idle_ttl: Duration::ZERO,
        });
        pool.get("a", &urls(1), &config("t")).await.unwrap();
        assert_eq!(pool.evict_idle(), 1);
        assert!(pool.is_empty());
    }
}
