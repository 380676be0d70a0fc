//! Act step of a backup: reach etcd the way the cluster reconciler does,
//! stream a snapshot from the chosen member straight into a multipart upload,
//! read the object back to verify size and SHA-256, then store the metadata
//! object. Memory stays bounded by the upload's part buffers.

use etcdfleet_api::backup::{
    BackupConfigError, SnapshotMetadata, metadata_key, object_key, resolve_destination,
};
use etcdfleet_api::{EtcdBackup, EtcdCluster, ObjectStoreDestination};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::Context;
use super::plan::{SnapshotSource, choose_source};
use super::store::{Store, StoreError, read_credentials};
use crate::connector::{ConnectError, KubeconfigLocation};
use crate::etcd::{ClusterHealth, EtcdConfig, EtcdError, MemberClient, MemberObservation};
use crate::etcdcluster::{self, observe, resolve, status::Report};

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    Config(#[from] BackupConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("{0}")]
    Cluster(#[from] etcdcluster::Error),
    #[error("no healthy voting member to take a snapshot from: {0}")]
    NoHealthyMember(String),
    #[error("metadata: {0}")]
    Metadata(String),
}

impl BackupError {
    pub fn reason(&self) -> &'static str {
        match self {
            BackupError::Config(BackupConfigError::NoDestination) => "NoDestination",
            BackupError::Config(_) => "InvalidBackupConfig",
            BackupError::Store(e) => e.reason(),
            BackupError::Etcd(e) => e.reason(),
            BackupError::Connect(e) => e.reason(),
            BackupError::Cluster(e) => e.reason(),
            BackupError::NoHealthyMember(_) => "NoHealthyMember",
            BackupError::Metadata(_) => "MetadataError",
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
}

/// Takes one snapshot of `cluster` for `backup`, started at `now`.
pub async fn take(
    backup: &EtcdBackup,
    cluster: &EtcdCluster,
    ctx: &Context,
    now: Timestamp,
) -> Result<Taken, BackupError> {
    let cc = &ctx.cluster;
    let ns = backup.namespace().unwrap_or_default();
    let destination = resolve_destination(
        backup.spec.destination.as_ref(),
        cluster.spec.config.backup.as_ref(),
    )?;
    let credentials = read_credentials(&cc.management, &ns, &destination).await?;
    let store = Store::open(&destination, credentials.as_ref())?;

    // Reach etcd exactly as the cluster reconciler does (same resolution,
    // same PKI, same dialer); nothing here writes to the cluster.
    let mut report = Report::new(cluster);
    let resolved = resolve::resolve_cluster(cluster, cc, &mut report)
        .await?
        .ok_or_else(|| BackupError::NoHealthyMember("template resolution failed".into()))?;
    let location = KubeconfigLocation::of(cluster).ok_or(ConnectError::NoClusterReference)?;
    let workload = cc.connector.connect(&location).await?;
    let observed = observe::observe(cluster, &resolved, &workload, cc, &report).await?;
    let health = observed
        .health
        .as_ref()
        .ok_or_else(|| BackupError::NoHealthyMember("etcd did not answer".into()))?;
    take_from(
        &store,
        destination,
        cluster,
        health,
        &observed.etcd_config,
        now,
        &backup.name_any(),
    )
    .await
}

/// Takes one snapshot of `cluster` into `store` at `destination` from a
/// member [`choose_member`] picks in `health`, reached with `etcd_config`,
/// started at `now`; `name` ends the object key.
pub async fn take_from(
    store: &Store,
    destination: ObjectStoreDestination,
    cluster: &EtcdCluster,
    health: &ClusterHealth,
    etcd_config: &EtcdConfig,
    now: Timestamp,
    name: &str,
) -> Result<Taken, BackupError> {
    let chosen =
        choose_member(health).map_err(|n| BackupError::NoHealthyMember(format!("{n} members")))?;
    let advertised = chosen
        .member
        .client_urls
        .first()
        .ok_or_else(|| BackupError::NoHealthyMember("member has no client URL".into()))?;
    // The observed etcd config carries the cluster's transport (port-forward
    // or direct), which reaches the member behind its advertised URL.
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
    Ok(Taken {
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

/// The member a snapshot is taken from (see [`choose_source`]); `None`
/// when no member is fit, with how many there are.
pub fn choose_member(health: &ClusterHealth) -> Result<&MemberObservation, usize> {
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
    choose_source(&sources)
        .map(|i| &health.members()[i])
        .ok_or(sources.len())
}

/// Streams a snapshot of `member` into `metadata.object_key`, reads the
/// object back to verify it, and stores `metadata` (size and SHA-256 filled
/// in) next to it. Returns the metadata key and the metadata.
pub async fn store_snapshot(
    store: &Store,
    member: &MemberClient,
    mut metadata: SnapshotMetadata,
) -> Result<(String, SnapshotMetadata), BackupError> {
    let key = metadata.object_key.clone();
    let (size, sha256) = stream_to(store, &key, member).await?;
    // Read back what the store holds: a short or altered object is caught here.
    store.verify(&key, size, &sha256).await?;
    metadata.size_bytes = size;
    metadata.sha256 = sha256;
    let meta_key = metadata_key(&key);
    let json =
        serde_json::to_vec_pretty(&metadata).map_err(|e| BackupError::Metadata(e.to_string()))?;
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
) -> Result<(u64, String), BackupError> {
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
