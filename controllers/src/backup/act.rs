//! Act step of a backup: reach etcd the way every reconciler does (`access`),
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
use crate::access::{AccessError, reach_etcd};
use crate::connector::{ConnectError, KubeconfigLocation};
use crate::etcd::{EtcdError, MemberClient};
use crate::render::Names;
use crate::store::{Store, StoreError, read_credentials};

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
    Access(#[from] AccessError),
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
            BackupError::Access(e) => e.reason(),
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
    let access = ctx.access();
    let ns = backup.namespace().unwrap_or_default();
    let destination = resolve_destination(
        backup.spec.destination.as_ref(),
        cluster.spec.config.backup.as_ref(),
    )?;
    let credentials = read_credentials(&access.management, &ns, &destination).await?;
    let store = Store::open(&destination, credentials.as_ref())?;

    // Reach etcd exactly as the cluster reconciler does (same PKI, same
    // dialer, same pooled connections); nothing here writes to the cluster.
    let (names, tls) = members_of(cluster)
        .ok_or_else(|| BackupError::NoHealthyMember("template resolution failed".into()))?;
    let location = KubeconfigLocation::of(cluster).ok_or(ConnectError::NoClusterReference)?;
    let workload = access.connector.connect(&location).await?;
    let reached = reach_etcd(access, cluster, &workload, &names, tls)
        .await?
        .map_err(|_| BackupError::NoHealthyMember("etcd did not answer".into()))?;
    let health = &reached.health;
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
    let chosen = choose_source(&sources)
        .map(|i| &health.members()[i])
        .ok_or_else(|| BackupError::NoHealthyMember(format!("{} members", sources.len())))?;
    let advertised = chosen
        .member
        .client_urls
        .first()
        .ok_or_else(|| BackupError::NoHealthyMember("member has no client URL".into()))?;
    // The etcd config carries the cluster's transport (port-forward or
    // direct), which reaches the member behind its advertised URL.
    let member = MemberClient::connect(advertised, &reached.config).await?;
    let revision = member.revision().await?;
    let etcd_version = chosen
        .status
        .as_ref()
        .map(|s| s.version.clone())
        .unwrap_or_default();

    let key = object_key(
        destination.prefix.as_deref(),
        &ns,
        &cluster.name_any(),
        now,
        revision,
        &backup.name_any(),
    );
    let info = stream_to(&store, &key, &member).await?;
    // Read back what the store holds: a short or altered object is caught here.
    store.verify(&key, info.0, &info.1).await?;

    let meta_key = metadata_key(&key);
    let metadata = SnapshotMetadata {
        namespace: ns,
        cluster: cluster.name_any(),
        cluster_uid: cluster.meta().uid.clone().unwrap_or_default(),
        etcd_version: etcd_version.clone(),
        revision,
        size_bytes: info.0,
        sha256: info.1.clone(),
        object_key: key.clone(),
        taken_at: now.to_string(),
    };
    let json =
        serde_json::to_vec_pretty(&metadata).map_err(|e| BackupError::Metadata(e.to_string()))?;
    store.put_small(&meta_key, json).await?;
    Ok(Taken {
        destination,
        object_key: key,
        metadata_key: meta_key,
        size_bytes: info.0,
        sha256: info.1,
        revision,
        etcd_version,
        member: chosen.member.name.clone(),
    })
}

/// Where the cluster's members run and whether they speak TLS, as its own
/// spec resolves (a cluster is backed up only once its template values are
/// in its spec: see `cluster_not_ready`).
fn members_of(cluster: &EtcdCluster) -> Option<(Names, bool)> {
    let mut own = cluster.spec.clone();
    own.template_ref = None;
    let resolved = etcdfleet_api::template::resolve(None, None, &own)
        .ok()?
        .spec;
    let names = Names::new(&cluster.name_any(), &resolved.workload_namespace);
    Some((names, resolved.tls_enabled))
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
