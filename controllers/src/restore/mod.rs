//! Restore: the check an `EtcdCluster` with `spec.bootstrap.restore` passes
//! before its first workload write. Observes (the `EtcdBackup`, the
//! credentials Secret, the object streamed through SHA-256 in bounded
//! memory); the judgement is `etcdfleet_api::restore`'s, the decision the
//! cluster planner's ([`RestoreGate`]).

use etcdfleet_api::restore::{self as api, ObjectCheck};
use etcdfleet_api::{EtcdBackup, EtcdCluster};
use kube::ResourceExt;
use kube::api::Api;
use tracing::info;

use crate::backup::store::{Store, StoreError, read_credentials};
use crate::etcdcluster::plan::{Observation, Refusal, RestoreGate};

pub mod seed;

/// Whether rendered members can seed themselves from the snapshot (the
/// `restore-seed` init container). Until they can, a verified restore is
/// refused rather than bootstrapped empty.
pub const SEEDING_AVAILABLE: bool = false;
/// `RestoreFailed` reason while [`SEEDING_AVAILABLE`] is false.
pub const SEEDING_UNAVAILABLE: &str = "SeedingUnavailable";

/// Whether the gate applies: the cluster restores and has never been
/// bootstrapped (no StatefulSet, no voter ever recorded). A cluster that
/// runs is never held back by its snapshot being pruned later.
pub fn needed(cluster: &EtcdCluster, obs: &Observation) -> bool {
    let restores = cluster
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.restore.is_some());
    restores && obs.statefulset.is_none() && obs.known_voters == 0
}

/// Resolves the restore source of `cluster` and reads its object back.
/// A failure to reach the management API is an error (retried); everything
/// about the snapshot itself is a verdict.
pub async fn gate(
    management: &kube::Client,
    cluster: &EtcdCluster,
) -> Result<RestoreGate, kube::Error> {
    let Some(source) = cluster
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.restore.as_ref())
    else {
        return Ok(RestoreGate::NotNeeded);
    };
    let ns = cluster.namespace().unwrap_or_default();
    let backup = match &source.backup_name {
        Some(name) => Api::<EtcdBackup>::namespaced(management.clone(), &ns)
            .get_opt(name)
            .await?
            .map(|b| b.status),
        None => None,
    };
    let resolved = match api::resolve_source(source, backup.as_ref().map(|s| s.as_ref())) {
        Ok(r) => r,
        Err(refusal) => return Ok(refused(refusal)),
    };
    let check = match read_object(management, &ns, &resolved).await {
        Ok((size, sha256)) => ObjectCheck::Read { size, sha256 },
        Err(StoreError::NotFound(_)) => ObjectCheck::NotFound,
        Err(StoreError::Api(e)) => return Err(e),
        Err(e) => ObjectCheck::Unreadable(e.to_string()),
    };
    Ok(match api::judge_object(&resolved, &check) {
        Ok(()) => {
            info!(cluster = %cluster.name_any(), object = %resolved.object_key, "restore snapshot verified");
            if SEEDING_AVAILABLE {
                RestoreGate::Verified
            } else {
                // Bootstrapping now would start an EMPTY etcd under a name
                // that promises the snapshot's data: refuse instead.
                RestoreGate::Refused(Refusal {
                    reason: SEEDING_UNAVAILABLE,
                    message: format!(
                        "snapshot object {} verified (size and SHA-256 match), but this build                          cannot seed members from a snapshot yet; nothing is created. Restore                          by hand (etcdutl snapshot restore) until seeding is available",
                        resolved.object_key
                    ),
                })
            }
        }
        Err(refusal) => refused(refusal),
    })
}

async fn read_object(
    management: &kube::Client,
    ns: &str,
    resolved: &api::ResolvedRestore,
) -> Result<(u64, String), StoreError> {
    let credentials = read_credentials(management, ns, &resolved.destination).await?;
    let store = Store::open(&resolved.destination, credentials.as_ref())?;
    store
        .read_through::<tokio::io::Sink>(&resolved.object_key, None)
        .await
}

fn refused(r: api::Refusal) -> RestoreGate {
    RestoreGate::Refused(Refusal {
        reason: r.reason,
        message: format!(
            "restore refused before any workload object was written: {}. Fix or replace the \
             backup (spec.bootstrap.restore can only be set at creation: delete and recreate \
             the EtcdCluster to point it elsewhere)",
            r.message
        ),
    })
}
