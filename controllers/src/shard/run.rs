//! One replica's shard duties, each round (every [`ROUND`]): list the
//! group's Leases (which shards are live), reopen the gates of clusters
//! that left or came back, hand over this shard's clusters that now hash
//! to another live shard, and, on the replica that is the group's sharder,
//! label the clusters with no live owner. The decisions are
//! [`super::plan`]'s; this file does the I/O.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcdfleet_api::EtcdCluster;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::SHARD_LABEL;
use super::assign::cluster_key;
use super::gate::Gate;
use super::lease::{LeaseState, LiveShards};
use super::plan::{Move, Seen, Shards, next_move};
use crate::metrics::Metrics;

/// How often a replica looks at the Leases and its clusters.
pub const ROUND: Duration = Duration::from_secs(2);

/// How many times a cluster's shard label was written: each move writes
/// the next count, so a replica tells a cluster that came back to it from
/// a stale cached copy of the one it handed over.
pub const MOVES_ANNOTATION: &str = "etcdfleet.dev/shard-moves";

/// The field manager of shard label writes.
pub const FIELD_MANAGER: &str = "etcdfleet-shard";

/// This replica's shard and what it knows of the group.
pub struct Shard {
    pub me: String,
    prefix: String,
    leases: Api<Lease>,
    client: Client,
    pub gate: Arc<Gate>,
    live: Mutex<LiveShards>,
    /// Clusters handed over: their move count ([`MOVES_ANNOTATION`]) while
    /// they were this shard's (`None` while the release waits for work to
    /// leave). A cached copy with that count is a stale one.
    released: Mutex<BTreeMap<String, Option<u64>>>,
    metrics: Arc<Metrics>,
}

impl Shard {
    pub fn new(
        client: Client,
        me: &str,
        prefix: &str,
        lease_namespace: &str,
        metrics: Arc<Metrics>,
    ) -> Self {
        Shard {
            me: me.to_string(),
            prefix: prefix.to_string(),
            leases: Api::namespaced(client.clone(), lease_namespace),
            client,
            gate: Arc::new(Gate::default()),
            live: Mutex::new(LiveShards::default()),
            released: Mutex::new(BTreeMap::new()),
            metrics,
        }
    }

    /// The live shards now (one list of the lease namespace's Leases).
    pub async fn live_shards(&self) -> Result<Vec<String>, kube::Error> {
        let leases: Vec<LeaseState> = self
            .leases
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|l| LeaseState {
                resource_version: l.resource_version(),
                holder: l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
                duration: Duration::from_secs(
                    l.spec
                        .as_ref()
                        .and_then(|s| s.lease_duration_seconds)
                        .unwrap_or(15)
                        .max(1) as u64,
                ),
                name: l.name_any(),
            })
            .collect();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        Ok(live.observe(&self.prefix, &leases, Instant::now()))
    }

    /// One round over `own` (this shard's cache) and, on the sharder,
    /// `group` (every cluster of the group).
    pub async fn round(
        self: &Arc<Self>,
        own: &[Store<EtcdCluster>],
        group: Option<&[Store<EtcdCluster>]>,
    ) -> Result<(), kube::Error> {
        let live = self.live_shards().await?;
        let own: Vec<Arc<EtcdCluster>> = own.iter().flat_map(Store::state).collect();
        self.reopen_gates(&own);
        self.metrics.set_shard(own.len(), live.len());
        let mine = Shards {
            me: &self.me,
            live: &live,
            sharder: false,
        };
        for cluster in &own {
            let key = key_of(cluster);
            let seen = Seen {
                key: &key,
                label: cluster.labels().get(SHARD_LABEL).map(String::as_str),
            };
            if let Some((rule, Move::Release { to })) = next_move(&mine, &seen)
                && self.start_release(&key)
            {
                tokio::spawn(self.clone().release(cluster.clone(), key, to, rule));
            }
        }
        let Some(group) = group else {
            return Ok(());
        };
        let sharder = Shards {
            sharder: true,
            ..mine
        };
        for cluster in group.iter().flat_map(Store::state) {
            let key = key_of(&cluster);
            let label = cluster.labels().get(SHARD_LABEL).cloned();
            let seen = Seen {
                key: &key,
                label: label.as_deref(),
            };
            if let Some((rule, Move::Assign { from, to })) = next_move(&sharder, &seen) {
                self.assign(&cluster, from.as_deref(), &to, rule).await;
            }
        }
        Ok(())
    }

    /// Reopens the gate of every released cluster that left this shard's
    /// cache, or is back in it after another move (labelled with this
    /// shard again: the watch is filtered by the label).
    fn reopen_gates(&self, own: &[Arc<EtcdCluster>]) {
        let counts: BTreeMap<String, u64> = own.iter().map(|c| (key_of(c), moves(c))).collect();
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        released.retain(|key, ours| {
            let Some(ours) = ours else {
                return true; // still releasing
            };
            let gone = counts.get(key) != Some(ours);
            if gone {
                self.gate.open(key);
            }
            !gone
        });
    }

    /// Marks `key` as being released; false when it already is.
    fn start_release(&self, key: &str) -> bool {
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        if released.contains_key(key) {
            return false;
        }
        released.insert(key.to_string(), None);
        true
    }

    /// Stops work on the cluster, then writes its move to shard `to`, on
    /// the cluster as read after the last reconcile left (its own status
    /// writes changed the resourceVersion the decision was made on).
    async fn release(
        self: Arc<Self>,
        cluster: Arc<EtcdCluster>,
        key: String,
        to: String,
        rule: &'static str,
    ) {
        self.gate.close(&key).await;
        let api = self.api_of(&cluster);
        let result = match api.get_opt(&cluster.name_any()).await {
            Ok(Some(fresh)) if fresh.labels().get(SHARD_LABEL) == Some(&self.me) => {
                let count = moves(&fresh);
                self.write_label(&fresh, &to).await.map(|()| (true, count))
            }
            // Deleted, or no longer ours: nothing to write.
            Ok(_) => Ok((false, moves(&cluster))),
            Err(e) => Err(e),
        };
        match result {
            Ok((moved, count)) => {
                if moved {
                    info!(cluster = %key, from = %self.me, %to, rule, "handed the cluster over");
                    self.metrics.count_shard_move(rule);
                }
                // The gate reopens once the cache holds no copy from
                // before the move.
                let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
                released.insert(key, Some(count));
            }
            Err(e) => {
                // Not moved (it changed meanwhile, or the API failed): ours
                // still; the next round decides again.
                warn!(cluster = %key, %to, error = %e, "could not hand the cluster over");
                self.released
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
                self.gate.open(&key);
            }
        }
    }

    fn api_of(&self, cluster: &EtcdCluster) -> Api<EtcdCluster> {
        Api::namespaced(
            self.client.clone(),
            &cluster.namespace().unwrap_or_default(),
        )
    }

    /// Labels a cluster without a live owner for shard `to`.
    async fn assign(&self, cluster: &EtcdCluster, from: Option<&str>, to: &str, rule: &str) {
        let key = key_of(cluster);
        match self.write_label(cluster, to).await {
            Ok(()) => {
                info!(cluster = %key, from = from.unwrap_or("none"), %to, rule, "assigned the cluster");
                self.metrics.count_shard_move(rule);
            }
            Err(e) => warn!(cluster = %key, %to, error = %e, "could not assign the cluster"),
        }
    }

    /// A merge patch of the shard label carrying the resourceVersion the
    /// decision was made on: a cluster changed since is not moved (409).
    async fn write_label(&self, cluster: &EtcdCluster, to: &str) -> Result<(), kube::Error> {
        let api = self.api_of(cluster);
        let patch = json!({
            "metadata": {
                "resourceVersion": cluster.resource_version(),
                "labels": { SHARD_LABEL: to },
                "annotations": { MOVES_ANNOTATION: (moves(cluster) + 1).to_string() },
            }
        });
        api.patch(
            &cluster.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }
}

/// How many times the cluster's shard label was written (0: never).
pub fn moves(cluster: &EtcdCluster) -> u64 {
    cluster
        .annotations()
        .get(MOVES_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn key_of(cluster: &EtcdCluster) -> String {
    cluster_key(
        &cluster.namespace().unwrap_or_default(),
        &cluster.name_any(),
    )
}
