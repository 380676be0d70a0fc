//! Act step of a backup: reach etcd the way every reconciler does (`access`),
//! then take the snapshot into the backup's destination (`crate::snapshot`:
//! streamed from a chosen member, verified, its metadata stored beside it).

use etcdfleet_api::EtcdBackup;
use etcdfleet_api::EtcdCluster;
use etcdfleet_api::backup::{BackupConfigError, resolve_destination};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::Context;
use crate::access::{AccessError, reach_etcd};
use crate::connector::{ConnectError, KubeconfigLocation};
use crate::render::Names;
pub use crate::snapshot::Taken;
use crate::snapshot::{SnapshotError, take_from};
use crate::store::{StoreError, open_for};

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    Config(#[from] BackupConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("{0}")]
    Access(#[from] AccessError),
    #[error("no healthy voting member to take a snapshot from: {0}")]
    NoHealthyMember(String),
}

impl BackupError {
    pub fn reason(&self) -> &'static str {
        match self {
            BackupError::Config(BackupConfigError::NoDestination) => "NoDestination",
            BackupError::Config(_) => "InvalidBackupConfig",
            BackupError::Store(e) => e.reason(),
            BackupError::Snapshot(e) => e.reason(),
            BackupError::Connect(e) => e.reason(),
            BackupError::Access(e) => e.reason(),
            BackupError::NoHealthyMember(_) => "NoHealthyMember",
        }
    }
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
    let (store, _) = open_for(&access.management, &access.fence, &ns, &destination).await?;

    // Reach etcd exactly as the cluster reconciler does (same PKI, same
    // dialer, same pooled connections); nothing here writes to the cluster.
    let (names, tls) = members_of(cluster)
        .ok_or_else(|| BackupError::NoHealthyMember("template resolution failed".into()))?;
    let location = KubeconfigLocation::of(cluster).ok_or(ConnectError::NoClusterReference)?;
    let workload = access.connector.connect(&location).await?;
    let reached = reach_etcd(access, cluster, &workload, &names, tls)
        .await?
        .map_err(|_| BackupError::NoHealthyMember("etcd did not answer".into()))?;
    let taken = take_from(
        &store,
        destination,
        cluster,
        &reached.health,
        &reached.config,
        now,
        &backup.name_any(),
    )
    .await?;
    Ok(taken)
}

/// Where the cluster's members run and whether they speak TLS, as its own
/// spec resolves (a cluster is backed up only once its template values are
/// in its spec: see `cluster_not_ready`).
pub(super) fn members_of(cluster: &EtcdCluster) -> Option<(Names, bool)> {
    let mut own = cluster.spec.clone();
    own.template_ref = None;
    let resolved = etcdfleet_api::template::resolve(None, None, &own)
        .ok()?
        .spec;
    let names = Names::new(&cluster.name_any(), &resolved.workload_namespace);
    Some((names, resolved.tls_enabled))
}
