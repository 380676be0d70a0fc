//! The steps of a recovery from a lost quorum on the workload cluster:
//! fencing the lost members, the StatefulSet's pod template with and
//! without the `force-new-cluster` init containers, and the restart of
//! the chosen member onto it; from a backup, clearing the lost members'
//! objects and creating the StatefulSet again around a seeded member 0.
//! `Begin` and `Complete` write only the status. Each is idempotent: taken
//! again after a crash, it finds its work done.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::super::context::Result;
use super::super::plan::step::RecoveryStep;
use super::members::scale_statefulset;
use super::objects::{bootstrap, write_statefulset_at};
use super::target::{Target, apply, delete_exact, delete_same};
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
        RecoveryStep::ClearForRestore => clear(on).await,
        RecoveryStep::Reseed => reseed(on).await,
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
            delete_same(&on.api::<Pod>(), pod, Some(0))
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

/// From a backup, nothing of the old membership may start again: the
/// members ConfigMap announces no one, the StatefulSet goes (its pods with
/// it, at once), and every member's volume. The PKI, the Services and the
/// restore credentials stay.
async fn clear(on: &Target<'_>) -> Result<()> {
    let closed = render::closed_members_configmap(on.inputs);
    apply(&on.api(), &closed).await.map_err(|e| on.err(e))?;
    // apps/v1 deletes in the background by default: the object goes at
    // once, its pods after it (and below, at once).
    if let Some(sts) = &on.observed.statefulset {
        delete_same(&on.api::<StatefulSet>(), sts, None)
            .await
            .map_err(|e| on.err(e))?;
    }
    for pod in on.observed.pods.values() {
        delete_same(&on.api::<Pod>(), pod, Some(0))
            .await
            .map_err(|e| on.err(e))?;
    }
    for pvc in on.observed.pvcs.values() {
        delete_same(&on.api::<PersistentVolumeClaim>(), pvc, None)
            .await
            .map_err(|e| on.err(e))?;
    }
    Ok(())
}

/// Member 0 alone, bootstrapping a new cluster: the members ConfigMap
/// announces it with state `new`, and the StatefulSet is created with one
/// replica; its seeder restores the backup (the render inputs carry the
/// recovery's snapshot while it is under way).
async fn reseed(on: &Target<'_>) -> Result<()> {
    let (inputs, names) = (on.inputs, on.names());
    let initial = render::initial_cluster(names, inputs.tls, [0]);
    let cm = render::members_configmap(inputs, &initial, "new");
    apply(&on.api(), &cm).await.map_err(|e| on.err(e))?;
    bootstrap(on, 1).await
}
