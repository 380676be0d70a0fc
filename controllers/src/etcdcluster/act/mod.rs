//! Act stage: executes the one step the planner chose. Every action is
//! idempotent: names are deterministic, creates and applies tolerate an
//! existing object, deletes carry UID and resourceVersion preconditions, and
//! optimistic-lock patches carry the resourceVersion that was observed.
//!
//! [`execute`] hands each step to one function: the workload objects and
//! bootstrap in `objects`, the management-side PKI in `pki`, the members
//! (etcd membership, volumes, restarts, maintenance) in `members`; the
//! takeover of a running etcd in `adopt`; the rotation of the CA in
//! `ca_rotation`; the steps of a version change in `version`; those of a
//! recovery from a lost quorum in `recovery`; volumes that grow in
//! `storage`; what every
//! step acts on in `target`; deletion of the whole cluster is [`finalize`].
//! Writes to the EtcdCluster itself go through its
//! [`ClusterObject`](super::cluster_object::ClusterObject).

mod adopt;
mod ca_rotation;
mod finalize;
mod members;
mod objects;
mod pki;
mod recovery;
mod storage;
mod target;
mod version;

use etcdfleet_api::{EtcdCluster, VersionChangeSnapshot};

pub use finalize::finalize;

use super::cluster_object::ClusterObject;
use super::context::{Context, Result};
use super::observe::Observed;
use super::plan::step::{RecoveryStep, Step};
use crate::connector::WorkloadCluster;
use crate::render::RenderInputs;
use members::{
    add_learner, defragment, delete_pvc, delete_stale_storage, move_leader, promote_learner,
    record_pvc_member, recover_from_nospace, remove_member, restart_member, scale_statefulset,
};
use target::Target;

/// What a step left to record in the status (besides its outcome).
#[derive(Debug, Default)]
pub struct ActRecord {
    /// The snapshot taken before a change of minor version.
    pub snapshot: Option<VersionChangeSnapshot>,
}

/// What every step runs with.
pub struct Acting<'a> {
    pub cluster: &'a EtcdCluster,
    /// The render inputs of the resolve stage.
    pub inputs: &'a RenderInputs,
    pub observed: &'a Observed,
    pub workload: &'a WorkloadCluster,
    pub ctx: &'a Context,
}

/// Executes one step, whatever it is.
pub async fn execute(
    step: &Step,
    acting: Acting<'_>,
    object: &mut ClusterObject,
) -> Result<ActRecord> {
    // A restoring cluster's seeder is rendered from the snapshot the observe
    // stage verified this reconcile.
    let mut inputs = match &acting.observed.restore_record {
        Some(record) => RenderInputs {
            restore: Some(record.clone()),
            ..acting.inputs.clone()
        },
        None => acting.inputs.clone(),
    };
    // A recovery that forces a new cluster renders the force into the pod
    // template until the chosen member has forced (whatever step writes it).
    // The step that ends the force renders without it.
    if !matches!(step, Step::Recovery(RecoveryStep::EndForce)) {
        inputs.force_new_cluster = forcing(acting.observed, &acting.ctx.settings.seeder_image);
    }
    let on = &Target {
        cluster: acting.cluster,
        inputs: &inputs,
        observed: acting.observed,
        workload: acting.workload,
        ctx: acting.ctx,
    };
    if let Step::Version(v) = step {
        let snapshot = version::execute(v, on, object).await?;
        return Ok(ActRecord { snapshot });
    }
    execute_on(step, on).await.map(|()| ActRecord::default())
}

/// The steps on the workload cluster and etcd.
async fn execute_on(step: &Step, on: &Target<'_>) -> Result<()> {
    match step {
        Step::WriteObjects(kinds) => objects::write_objects(on, kinds).await,
        Step::Bootstrap { replicas } => objects::bootstrap(on, *replicas).await,
        Step::ScaleStatefulSet { replicas } => scale_statefulset(on, *replicas).await,
        Step::RecordPvcMember {
            ordinal,
            member_id,
            version,
        } => record_pvc_member(on, *ordinal, *member_id, version.as_deref()).await,
        Step::DeleteStaleStorage { ordinal, force_pod } => {
            delete_stale_storage(on, *ordinal, *force_pod).await
        }
        Step::AddLearner { ordinal } => add_learner(on, *ordinal).await,
        Step::PromoteLearner { member_id, .. } => promote_learner(on, *member_id).await,
        Step::MoveLeader { to, .. } => move_leader(on, *to).await,
        Step::RemoveMember { member_id, .. } => remove_member(on, *member_id).await,
        Step::DeletePvc { ordinal } => delete_pvc(on, *ordinal).await,
        Step::RecoverFromNoSpace => recover_from_nospace(on.inputs, on.observed).await,
        Step::Defragment { ordinal, .. } => defragment(on, *ordinal).await,
        Step::RestartMember { ordinal, .. } => restart_member(on, *ordinal).await,
        Step::ImportCa => adopt::import_ca(on).await,
        Step::RetireMember { member_id } => adopt::retire_member(on, *member_id).await,
        // Status only: the report records the request and the end.
        Step::StartCaRotation { .. } | Step::CompleteCaRotation => Ok(()),
        Step::GenerateNextCa => ca_rotation::generate_next_ca(on).await,
        Step::PromoteNextCa => ca_rotation::promote_next_ca(on).await,
        Step::DropPreviousCa => ca_rotation::drop_previous_ca(on).await,
        Step::CancelCaRotation => ca_rotation::drop_next_ca(on).await,
        Step::RecoverCa { .. } => ca_rotation::recover_ca(on).await,
        Step::Recovery(step) => recovery::execute(step, on).await,
        Step::Storage(step) => storage::execute(step, on).await,
        // Taken above, with the EtcdCluster object.
        Step::Version(_) => Ok(()),
    }
}

/// The force a recovery renders into the pod template: while its record is
/// fencing or forcing.
fn forcing(observed: &Observed, tools_image: &str) -> Option<crate::recovery::ForceNewCluster> {
    use etcdfleet_api::recovery::phase;
    let record = observed.planner.recovery.record.as_ref()?;
    matches!(record.phase.as_str(), phase::FENCING | phase::FORCING).then(|| {
        crate::recovery::ForceNewCluster {
            recovery_id: record.id.clone(),
            member: record.member.clone(),
            tools_image: tools_image.to_string(),
        }
    })
}
