//! What a member's data is at one revision, as etcd itself tells it: the
//! hash its members compare with each other to find corruption (`HashKV`:
//! a CRC-32 of every key revision above the compacted one, up to the
//! revision asked) and how many keys there were. Recorded with every
//! backup; a restore drill asks the restored etcd the same, after
//! compacting it to the same revision, and compares
//! (`etcdfleet_api::drill::judge`).

use etcd_client::{Client, CompactionOptions, GetOptions};

use super::client::{MemberClient, Result};
use super::error::EtcdError;

/// `HashKV` and a key count at one revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub revision: i64,
    /// The compacted revision the hash was computed above.
    pub compact_revision: i64,
    pub hash: u32,
    pub key_count: i64,
}

impl MemberClient {
    /// This member's fingerprint at `revision` (hashing reads the whole
    /// key space: it gets the defragmentation deadline). Fails when
    /// `revision` was compacted away.
    pub async fn fingerprint(&self, revision: i64) -> Result<Fingerprint> {
        let hash = |mut c: Client| async move { c.hash_kv(revision).await };
        let hashed = self.ask("hash kv", |d| d.defragment, None, hash).await?;
        let options = || {
            GetOptions::new()
                .with_from_key()
                .with_count_only()
                .with_revision(revision)
        };
        let count = |mut c: Client| async move { c.get("\0", Some(options())).await };
        let counted = self
            .ask("count keys", |d| d.defragment, None, count)
            .await?;
        Ok(Fingerprint {
            revision,
            compact_revision: hashed.compact_version(),
            hash: hashed.hash(),
            key_count: counted.count(),
        })
    }

    /// Compacts this member's history up to `revision` (a restored scratch
    /// etcd, made to hash above the same revision as the member it came
    /// from). Compacting at or below the compacted revision is not an error.
    pub async fn compact_to(&self, revision: i64) -> Result<()> {
        let physical = || Some(CompactionOptions::new().with_physical());
        let compact = |mut c: Client| async move { c.compact(revision, physical()).await };
        match self.ask("compact", |d| d.defragment, None, compact).await {
            Ok(_) => Ok(()),
            Err(EtcdError::Rpc { message, .. }) if message.contains("compacted") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads up to `limit` keys whole (values included) at `revision`:
    /// how many came back.
    pub async fn read_sample(&self, revision: i64, limit: i64) -> Result<u64> {
        let options = || {
            GetOptions::new()
                .with_from_key()
                .with_limit(limit)
                .with_revision(revision)
        };
        let read = |mut c: Client| async move { c.get("\0", Some(options())).await };
        let resp = self.ask("read keys", |d| d.request, None, read).await?;
        Ok(resp.kvs().len() as u64)
    }
}
