//! The restore reader: for a cluster that restores (`spec.bootstrap.restore`)
//! and was never bootstrapped, the check of its snapshot before the first
//! workload write. No member volume may exist yet, and the object must
//! verify (`crate::restore::gate`). The planner's restore gate
//! (`plan::guards::restore_gate`) decides from what this reads; the verified
//! record is what the seeder is rendered from, this reconcile and, once in
//! `status.restore`, after it.

use std::collections::BTreeMap;

use etcdfleet_api::EtcdCluster;
use etcdfleet_api::restore::RestoreRecord;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use tracing::{Instrument, info_span};

use super::super::context::{Context, Error, Result};
use super::super::plan::observation::RestoreGate;

/// What the restore reader found.
#[derive(Debug, Clone, Default)]
pub struct RestoreReading {
    pub gate: RestoreGate,
    /// The snapshot, once it verified.
    pub record: Option<RestoreRecord>,
}

/// Checks the snapshot of a restoring cluster that was never bootstrapped
/// (`bootstrapped`: a StatefulSet exists or voters were recorded); `None`
/// for any other cluster.
pub async fn read(
    cluster: &EtcdCluster,
    requested_version: &str,
    bootstrapped: bool,
    pvcs: &BTreeMap<u32, PersistentVolumeClaim>,
    ctx: &Context,
) -> Result<Option<RestoreReading>> {
    if !crate::restore::needed(cluster, bootstrapped) {
        return Ok(None);
    }
    let kept: Vec<String> = pvcs.values().map(|p| p.name_any()).collect();
    if let Some(refused) = crate::restore::kept_volumes(&kept) {
        return Ok(Some(RestoreReading {
            gate: RestoreGate::Refused(refused.into()),
            record: None,
        }));
    }
    let verdict = crate::restore::gate(
        (&ctx.management, &*ctx.fence),
        cluster,
        requested_version,
        &ctx.settings.seeder_image,
    )
    .instrument(info_span!("restore"))
    .await
    .map_err(Error::ManagementApi)?;
    Ok(Some(match verdict {
        Some(Ok(record)) => RestoreReading {
            gate: RestoreGate::Verified,
            record: Some(record),
        },
        Some(Err(refused)) => RestoreReading {
            gate: RestoreGate::Refused(refused.into()),
            record: None,
        },
        None => RestoreReading::default(),
    }))
}
