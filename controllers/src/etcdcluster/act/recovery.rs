//! The steps of a recovery from a lost quorum on the workload cluster:
//! fencing the lost members, the StatefulSet's pod template with and
//! without the `force-new-cluster` init containers, and the restart of
//! the chosen member onto it. `Begin` and `Complete` write only the status.
//! Each is idempotent: taken again after a crash, it finds its work done.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::super::context::Result;
use super::super::plan::step::RecoveryStep;
use super::members::scale_statefulset;
use super::objects::write_statefulset_at;
use super::target::{Target, apply, delete_exact, delete_exact_with_grace};
use crate::render;

pub(super) async fn execute(step: &RecoveryStep, on: &Target<'_>) -> Result<()> {
    match step {
        RecoveryStep::Begin(_) => {
            let key = super::super::context::cluster_key(on.cluster);
            on.ctx.metrics.observe_recovery_started(&key);
            Ok(())
        }
        RecoveryStep::Complete => Ok(()),
        RecoveryStep::Fence { chosen, lost } => fence(on, *chosen, lost).await,
        RecoveryStep::WriteForcingTemplate { chosen } => write_statefulset_at(on, chosen + 1).await,
        RecoveryStep::RestartChosen { ordinal } => restart(on, *ordinal).await,
        RecoveryStep::EndForce => {
            let replicas = (on.observed.planner.statefulset.as_ref()).map_or(1, |s| s.replicas);
            write_statefulset_at(on, replicas).await
        }
    }
}

/// No lost member comes back as the old cluster: a member that starts on
/// an empty volume finds the chosen member announced alone (and so cannot
/// join the old membership under its old id), no ordinal above the chosen
/// one runs, and the lost members' pods go at once with the volumes that
/// hold their data (a node that comes back finds neither, and its kubelet
/// stops what it still runs).
async fn fence(on: &Target<'_>, chosen: u32, lost: &[(u32, u64)]) -> Result<()> {
    let (inputs, names) = (on.inputs, on.names());
    let initial = render::initial_cluster(names, inputs.tls, [chosen]);
    apply(
        &on.api(),
        &render::members_configmap(inputs, &initial, "existing"),
    )
    .await
    .map_err(|e| on.err(e))?;
    let replicas = (on.observed.planner.statefulset.as_ref()).map_or(0, |s| s.replicas);
    if replicas > chosen + 1 {
        scale_statefulset(on, chosen + 1).await?;
    }
    for &(ordinal, id) in lost {
        if let Some(pod) = on.observed.pods.get(&ordinal) {
            delete_exact_with_grace(&on.api::<Pod>(), pod, Some(0))
                .await
                .map_err(|e| on.err(e))?;
        }
        let holds_its_data = (on.observed.planner.pvcs.get(&ordinal))
            .is_some_and(|p| p.member_id == Some(id) && !p.deleting);
        if let Some(pvc) = on.observed.pvcs.get(&ordinal).filter(|_| holds_its_data) {
            delete_exact(&on.api::<PersistentVolumeClaim>(), pvc)
                .await
                .map_err(|e| on.err(e))?;
        }
    }
    Ok(())
}

/// Deletes the chosen member's pod: the StatefulSet recreates it from the
/// forcing template.
async fn restart(on: &Target<'_>, ordinal: u32) -> Result<()> {
    if let Some(pod) = on.observed.pods.get(&ordinal) {
        delete_exact(&on.api::<Pod>(), pod)
            .await
            .map_err(|e| on.err(e))?;
    }
    Ok(())
}
