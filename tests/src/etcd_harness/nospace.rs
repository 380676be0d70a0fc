//! A cluster at NOSPACE that compaction and defragmentation cannot cure: the
//! premise of every test of the "NOSPACE persists" path.
//!
//! Writing until etcd answers NOSPACE is not enough: the database file then
//! holds free pages and bbolt's own overhead too, so after a compaction and a
//! defragmentation the live data can sit below 90 % of the quota (the
//! controller's test for "persists", `recover_from_nospace`) and the recovery
//! then succeeds. [`fill_with_live_data`] writes, compacts, defragments every
//! member and disarms, round after round, until live data alone stays above
//! 90 % of the quota on every member; it returns with the alarm raised.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use etcdfleet_controllers::etcd::{ClusterClient, EtcdConfig};

/// What [`fill_with_live_data`] left behind.
#[derive(Debug, Clone, Copy)]
pub struct LiveFill {
    /// Keys `live/0 … live/{written-1}` were acknowledged. The put answered
    /// NOSPACE may be stored too (etcd's quota applier applies a put, then
    /// reports ErrNoSpace: `quotaApplierV3.Put` in server/etcdserver/apply),
    /// so `live/{written}` may exist.
    pub written: i64,
    /// The smallest `dbSizeInUse` of any member after the last
    /// defragmentation.
    pub in_use: i64,
}

/// Fills the cluster at `endpoints` with distinct keys of `value_size` bytes
/// until, after compaction and defragmentation of every member, live data
/// uses more than 90 % of `quota` on each; the NOSPACE alarm stays raised.
pub async fn fill_with_live_data(
    endpoints: &[String],
    config: &EtcdConfig,
    quota: i64,
    value_size: usize,
) -> Result<LiveFill> {
    let cluster = ClusterClient::connect(endpoints, config).await?;
    let mut kv = cluster.kv();
    let value = vec![b'x'; value_size];
    let limit = 4 * quota / value_size as i64 + 10;
    let mut written = 0;
    for _round in 0..10 {
        loop {
            match kv.put(format!("live/{written}"), value.clone(), None).await {
                Ok(_) => written += 1,
                Err(e) if e.to_string().contains("space exceeded") => break,
                Err(e) => return Err(e.into()),
            }
            ensure!(written < limit, "etcd never raised NOSPACE");
        }
        cluster.compact_to_current().await?;
        let in_use = smallest_live_data(&cluster, endpoints).await?;
        if in_use * 10 > quota * 9 {
            return Ok(LiveFill { written, in_use });
        }
        for alarm in cluster.alarms().await? {
            cluster.disarm_alarm(alarm).await?;
        }
    }
    bail!("live data stayed under 90 % of the quota after 10 rounds of NOSPACE")
}

/// Defragments every member and returns the smallest `dbSizeInUse`. A
/// follower applies the compaction when raft delivers it: each member is
/// defragmented again after a moment, so the figure is the one the
/// controller's recovery will see.
async fn smallest_live_data(cluster: &ClusterClient, endpoints: &[String]) -> Result<i64> {
    let mut smallest = i64::MAX;
    for endpoint in endpoints {
        let member = cluster.member(endpoint).await?;
        member.defragment().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        member.defragment().await?;
        smallest = smallest.min(member.status().await?.db_size_in_use);
    }
    Ok(smallest)
}
