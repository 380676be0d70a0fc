//! Restore: the check an `EtcdCluster` with `spec.bootstrap.restore` passes
//! before its first workload write. Observes (the `EtcdBackup`, the
//! credentials Secret, the object streamed through SHA-256 in bounded
//! memory); the judgement is `etcdfleet_api::restore`'s, the decision the
//! cluster planner's (its restore gate). Knows no reconciler: it answers
//! with a verified record or an [`api::Refusal`].

use etcdfleet_api::restore::{self as api, ObjectCheck, RestoreRecord, RestoreSource};
use etcdfleet_api::{EtcdBackup, EtcdCluster};
use kube::ResourceExt;
use kube::api::Api;
use tracing::info;

use crate::store::{Store, StoreError, read_credentials};
use crate::tenancy::Fence;
use snapshot::SnapshotScanner;

pub mod seed;
pub mod snapshot;

/// `RestoreFailed` reason when PVCs of the cluster's members already exist.
pub const KEPT_VOLUMES: &str = "KeptVolumes";

/// Whether the gate applies: the cluster restores and has never been
/// bootstrapped (`bootstrapped`: a StatefulSet exists or a voter was ever
/// recorded). A cluster that runs is never held back by its snapshot being
/// pruned later.
pub fn needed(cluster: &EtcdCluster, bootstrapped: bool) -> bool {
    let restores = cluster
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.restore.is_some());
    restores && !bootstrapped
}

/// Refuses a restore over member volumes that already exist (PVCs kept
/// from a deleted cluster of the same name): the snapshot and the old data
/// are never mixed, and the old data is never wiped by the controller.
pub fn kept_volumes(pvcs: &[String]) -> Option<api::Refusal> {
    if pvcs.is_empty() {
        return None;
    }
    Some(api::Refusal {
        reason: KEPT_VOLUMES,
        message: format!(
            "restore refused before any workload object was written: PVC {} already exists \
             (kept from an earlier cluster of this name?); a restore neither mixes the snapshot \
             with its data nor wipes it. Delete the PVC(s) once nothing on them is needed, or \
             restore under another name or workload namespace",
            pvcs.join(", ")
        ),
    })
}

/// Resolves the restore source of `cluster` and reads its object back,
/// reading on the way which etcd wrote it ([`snapshot`]): a snapshot that
/// `requested_version` (the spec's) may not run on is refused like a
/// corrupt one. A failure to reach the management API is an error
/// (retried); everything about the snapshot itself is a verdict. A verified
/// snapshot comes back as the record the seeder is rendered from
/// (`status.restore`). `None`: the cluster does not restore.
pub async fn gate(
    (management, fence): (&kube::Client, &Fence),
    cluster: &EtcdCluster,
    requested_version: &str,
    default_seeder_image: &str,
) -> Result<Option<Result<RestoreRecord, api::Refusal>>, kube::Error> {
    let Some(source) = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.restore.as_ref())
    else {
        return Ok(None);
    };
    let ns = cluster.namespace().unwrap_or_default();
    let verdict = verify(
        (management, fence),
        &ns,
        source,
        requested_version,
        default_seeder_image,
    )
    .await?;
    if let Ok(record) = &verdict {
        info!(cluster = %cluster.name_any(), object = %record.object_key, "restore snapshot verified");
    }
    Ok(Some(verdict.map_err(|(r, version)| {
        if version {
            version_refused(r)
        } else {
            refused(r)
        }
    })))
}

/// Resolves `source` (in namespace `ns`) and reads its object back: the
/// record a seeder is rendered from, or the refusal (`true`: the snapshot
/// is whole but `requested_version` may not run it). A failure to reach
/// the management API is an error.
pub async fn verify(
    (management, fence): (&kube::Client, &Fence),
    ns: &str,
    source: &RestoreSource,
    requested_version: &str,
    default_seeder_image: &str,
) -> Result<Result<RestoreRecord, (api::Refusal, bool)>, kube::Error> {
    let resolved = match resolve(management, ns, source).await? {
        Ok(r) => r,
        Err(refusal) => return Ok(Err((refusal, false))),
    };
    let mut scanner = SnapshotScanner::default();
    let check = match read_object((management, fence), ns, &resolved, &mut scanner).await {
        Ok((size, sha256)) => ObjectCheck::Read { size, sha256 },
        Err(StoreError::NotFound(_)) => ObjectCheck::NotFound,
        Err(StoreError::Api(e)) => return Err(e),
        Err(e) => ObjectCheck::Unreadable(e.to_string()),
    };
    if let Err(refusal) = api::judge_object(&resolved, &check) {
        return Ok(Err((refusal, false)));
    }
    let written_by = scanner.finish();
    if let Err(refusal) = api::judge_version(&resolved, &written_by, requested_version) {
        return Ok(Err((refusal, true)));
    }
    Ok(Ok(record(source, resolved, &check, default_seeder_image)))
}

/// The restore source resolved against its `EtcdBackup`, if it names one.
async fn resolve(
    management: &kube::Client,
    ns: &str,
    source: &RestoreSource,
) -> Result<Result<api::ResolvedRestore, api::Refusal>, kube::Error> {
    let problem = (source.backup_name.as_deref())
        .and_then(|name| etcdfleet_api::names::reference_problem("backupName", name));
    if let Some(message) = problem {
        return Ok(Err(api::Refusal {
            reason: api::reason::INVALID_REFERENCE,
            message,
        }));
    }
    let backup = match &source.backup_name {
        Some(name) => Api::<EtcdBackup>::namespaced(management.clone(), ns)
            .get_opt(name)
            .await?
            .map(|b| b.status),
        None => None,
    };
    Ok(api::resolve_source(
        source,
        backup.as_ref().map(|s| s.as_ref()),
    ))
}

/// What `status.restore` records of a verified snapshot.
fn record(
    source: &RestoreSource,
    resolved: api::ResolvedRestore,
    check: &ObjectCheck,
    default_seeder_image: &str,
) -> RestoreRecord {
    let size_bytes = match check {
        ObjectCheck::Read { size, .. } => i64::try_from(*size).ok(),
        _ => None,
    };
    RestoreRecord {
        backup_name: source.backup_name.clone(),
        destination: resolved.destination,
        object_key: resolved.object_key,
        sha256: resolved.sha256.to_ascii_lowercase(),
        size_bytes,
        seeder_image: source
            .seeder_image
            .clone()
            .unwrap_or_else(|| default_seeder_image.to_string()),
        verified_time: Some(
            k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string(),
        ),
    }
}

/// Streams the object through SHA-256 and `scanner` (bounded memory).
async fn read_object(
    (management, fence): (&kube::Client, &Fence),
    ns: &str,
    resolved: &api::ResolvedRestore,
    scanner: &mut SnapshotScanner,
) -> Result<(u64, String), StoreError> {
    // The keys the seeder will read it with: the controller's own workload
    // identity, if lent, does not reach the workload cluster's pod.
    let credentials = read_credentials(management, fence, ns, &resolved.destination).await?;
    let store = Store::open(&resolved.destination, credentials.as_ref())?;
    store
        .read_through(&resolved.object_key, Some(scanner))
        .await
}

/// A snapshot the spec's version may not run: the fix is in the spec
/// (`spec.version` can change until the cluster is bootstrapped), not in
/// the backup.
fn version_refused(r: api::Refusal) -> api::Refusal {
    api::Refusal {
        reason: r.reason,
        message: format!(
            "restore refused before any workload object was written: {}",
            r.message
        ),
    }
}

fn refused(r: api::Refusal) -> api::Refusal {
    api::Refusal {
        reason: r.reason,
        message: format!(
            "restore refused before any workload object was written: {}. Fix or replace the \
             backup (spec.bootstrap.restore can only be set at creation: delete and recreate \
             the EtcdCluster to point it elsewhere)",
            r.message
        ),
    }
}
