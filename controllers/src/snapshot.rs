//! A snapshot of a running etcd cluster streamed into an object store,
//! shared by backups (`EtcdBackup`) and the EtcdCluster reconciler (the
//! snapshot before a change of minor version): pick a healthy member, stream
//! its snapshot into a multipart upload, read the object back to verify size
//! and SHA-256, then store the metadata object next to it. Memory stays
//! bounded by the upload's part buffers. Knows no reconciler.

use etcdfleet_api::backup::{SnapshotMetadata, metadata_key, object_key};
use etcdfleet_api::{EtcdCluster, ObjectStoreDestination};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use tracing::warn;

use crate::etcd::{
    ClusterHealth, EtcdConfig, EtcdError, Fingerprint, MemberClient, MemberObservation,
};
use crate::store::{Store, StoreError};

/// Why a snapshot could not be taken and stored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("no healthy voting member to take a snapshot from: {0}")]
    NoHealthyMember(String),
    #[error("metadata: {0}")]
    Metadata(String),
}

impl SnapshotError {
    /// A short, stable label for metrics and condition reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            SnapshotError::Store(e) => e.reason(),
            SnapshotError::Etcd(e) => e.reason(),
            SnapshotError::NoHealthyMember(_) => "NoHealthyMember",
            SnapshotError::Metadata(_) => "MetadataError",
        }
    }
}

/// A stored and verified snapshot.
#[derive(Debug, Clone)]
pub struct Taken {
    pub destination: ObjectStoreDestination,
    pub object_key: String,
    pub metadata_key: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub revision: i64,
    pub etcd_version: String,
    pub member: String,
    /// The member's fingerprint at `revision`, asked right after the
    /// snapshot was stored (`None`: it could not answer, said in the log;
    /// the backup stands, its drill compares less).
    pub fingerprint: Option<Fingerprint>,
}

/// Takes one snapshot of `cluster` into `store` at `destination` from a
/// member [`choose_member`] picks in `health`, reached with `etcd_config`
/// (which carries the cluster's transport, port-forward or direct, to the
/// member behind its advertised URL), started at `now`; `name` ends the
/// object key.
pub async fn take_from(
    store: &Store,
    destination: ObjectStoreDestination,
    cluster: &EtcdCluster,
    health: &ClusterHealth,
    etcd_config: &EtcdConfig,
    now: Timestamp,
    name: &str,
) -> Result<Taken, SnapshotError> {
    let chosen = choose_member(health).ok_or_else(|| {
        SnapshotError::NoHealthyMember(format!("{} members", health.members().len()))
    })?;
    let advertised = chosen
        .member
        .client_urls
        .first()
        .ok_or_else(|| SnapshotError::NoHealthyMember("member has no client URL".into()))?;
    let member = MemberClient::connect(advertised, etcd_config).await?;
    let revision = member.revision().await?;
    let etcd_version = chosen
        .status
        .as_ref()
        .map(|s| s.version.clone())
        .unwrap_or_default();
    let ns = cluster.namespace().unwrap_or_default();
    let key = object_key(
        destination.prefix.as_deref(),
        &ns,
        &cluster.name_any(),
        now,
        revision,
        name,
    );
    let metadata = SnapshotMetadata {
        namespace: ns,
        cluster: cluster.name_any(),
        cluster_uid: cluster.meta().uid.clone().unwrap_or_default(),
        etcd_version: etcd_version.clone(),
        revision,
        size_bytes: 0,
        sha256: String::new(),
        object_key: key.clone(),
        taken_at: now.to_string(),
    };
    let (metadata_key, stored) = store_snapshot(store, &member, metadata).await?;
    let fingerprint = match member.fingerprint(revision).await {
        Ok(f) => Some(f),
        Err(e) => {
            warn!(cluster = %cluster.name_any(), object = %key, error = %e,
                "the snapshot is stored, but its member could not fingerprint revision {revision}");
            None
        }
    };
    Ok(Taken {
        fingerprint,
        destination,
        object_key: key,
        metadata_key,
        size_bytes: stored.size_bytes,
        sha256: stored.sha256,
        revision,
        etcd_version,
        member: chosen.member.name.clone(),
    })
}

/// A member a snapshot could come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSource {
    pub name: String,
    pub healthy: bool,
    pub learner: bool,
    pub leader: bool,
}

/// The member to stream from: a healthy voting follower (the leader keeps
/// serving without the extra read load), else the healthy leader. Learners
/// are never used: they may lag. `None` when no voter is healthy.
pub fn choose_source(members: &[SnapshotSource]) -> Option<usize> {
    let eligible = |m: &SnapshotSource| m.healthy && !m.learner;
    members
        .iter()
        .position(|m| eligible(m) && !m.leader)
        .or_else(|| members.iter().position(eligible))
}

/// The member [`choose_source`] picks among `health`'s members.
pub fn choose_member(health: &ClusterHealth) -> Option<&MemberObservation> {
    let sources: Vec<SnapshotSource> = health
        .members()
        .iter()
        .map(|m| SnapshotSource {
            name: m.member.name.clone(),
            healthy: m.healthy,
            learner: m.member.is_learner,
            leader: m.status.as_ref().is_some_and(|s| s.is_leader()),
        })
        .collect();
    choose_source(&sources).map(|i| &health.members()[i])
}

/// Streams a snapshot of `member` into `metadata.object_key`, reads the
/// object back to verify it, and stores `metadata` (size and SHA-256 filled
/// in) next to it. Returns the metadata key and the metadata.
pub async fn store_snapshot(
    store: &Store,
    member: &MemberClient,
    mut metadata: SnapshotMetadata,
) -> Result<(String, SnapshotMetadata), SnapshotError> {
    let key = metadata.object_key.clone();
    let (size, sha256) = stream_to(store, &key, member).await?;
    // Read back what the store holds: a short or altered object is caught here.
    store.verify(&key, size, &sha256).await?;
    metadata.size_bytes = size;
    metadata.sha256 = sha256;
    let meta_key = metadata_key(&key);
    let json =
        serde_json::to_vec_pretty(&metadata).map_err(|e| SnapshotError::Metadata(e.to_string()))?;
    store.put_small(&meta_key, json).await?;
    Ok((meta_key, metadata))
}

/// Streams a snapshot of `member` into `key`; returns (bytes, hex SHA-256)
/// as computed while streaming. A failed stream aborts the upload. The only
/// writer the stream writes to is the upload: a write that fails is the
/// store's failure (an outage, a refused part), never etcd's.
pub async fn stream_to(
    store: &Store,
    key: &str,
    member: &MemberClient,
) -> Result<(u64, String), SnapshotError> {
    let mut upload = store.upload(key);
    match member.snapshot(upload.writer()).await {
        Ok(info) => {
            upload.finish().await?;
            Ok((info.bytes_written, info.sha256))
        }
        Err(EtcdError::Io(e)) => {
            upload.abort().await;
            Err(StoreError::upload(key, e).into())
        }
        Err(e) => {
            upload.abort().await;
            Err(e.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, healthy: bool, learner: bool, leader: bool) -> SnapshotSource {
        SnapshotSource {
            name: name.into(),
            healthy,
            learner,
            leader,
        }
    }

    #[test]
    fn snapshots_come_from_a_healthy_follower_when_there_is_one() {
        let cases = [
            (
                vec![m("0", true, false, true), m("1", true, false, false)],
                Some(1),
            ),
            (
                vec![m("0", true, false, true), m("1", false, false, false)],
                Some(0),
            ),
            (
                vec![m("0", true, false, true), m("1", true, true, false)],
                Some(0),
            ),
            (
                vec![m("0", false, false, false), m("1", true, true, false)],
                None,
            ),
            (vec![], None),
        ];
        for (members, want) in cases {
            assert_eq!(choose_source(&members), want, "{members:?}");
        }
    }
}
