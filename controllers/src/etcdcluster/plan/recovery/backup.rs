//! Recovery from a backup (`quorumLoss: FromBackup`), when no member
//! answers at all: every voter the status lists must be lost by the same
//! evidence as a survivor's recovery asks for (its pod not Ready, down for
//! `lostAfter`, its data gone), and the newest backup of the cluster must
//! verify again now. Then, in the same cluster (its name, PKI and Services
//! stay): the lost members' StatefulSet, pods, volumes and members
//! ConfigMap go; the StatefulSet is created again with one member, which
//! the seeder restores from the backup as a new cluster; the membership
//! rules grow it back through learners.

use etcdfleet_api::recovery::{RecoveryStatus, phase};

use super::super::observation::{EtcdObservation, Observation};
use super::super::step::{Plan, RecoveryPlan, RecoveryStep, Step};
use super::lost::{NotYet, evidence};
use super::regrow::regrowing;

/// The recovery from the newest backup that verifies, or why there is
/// none (`why`: why no member answers).
pub(super) fn judge(obs: &Observation, why: &str) -> Result<RecoveryPlan, NotYet> {
    let voters = &obs.recovery.recorded_voters;
    if voters.is_empty() {
        return Err(NotYet::Hold(format!(
            "no member answers ({why}) and the status lists no voter that could be counted as \
             lost"
        )));
    }
    let mut lost = Vec::new();
    for (name, id) in voters {
        let ordinal = obs.names.ordinal_of(name).ok_or_else(|| {
            NotYet::Hold(format!(
                "voter {name} ({id:x}) is not one of this cluster's members"
            ))
        })?;
        lost.push(evidence(obs, *id, ordinal)?);
    }
    lost.sort_by(|a, b| a.name.cmp(&b.name));
    let backup = match &obs.recovery.backup {
        Some(Ok(b)) => b.clone(),
        Some(Err(none)) => {
            return Err(NotYet::Hold(format!(
                "no member answers ({why}) and no backup can be restored: {none}"
            )));
        }
        None => return Err(NotYet::Wait("the backups were not read".into())),
    };
    Ok(RecoveryPlan {
        id: format!("backup-{}", backup.name),
        chosen: 0,
        chosen_id: 0,
        kept_revision: backup.revision.unwrap_or_default(),
        last_seen_revision: obs.recovery.last_seen_revision,
        survivors: Vec::new(),
        lost,
        backup: Some(Box::new(backup)),
    })
}

/// The next step of a recovery from a backup.
pub(super) fn in_flight(obs: &Observation, record: &RecoveryStatus) -> Option<Plan> {
    let step = |s| Some(Plan::Act(Step::Recovery(s)));
    match record.phase.as_str() {
        phase::FENCING => step(RecoveryStep::ClearForRestore),
        // Once cleared, a StatefulSet is the one the reseed wrote (its
        // record may not have been written): writing it again is harmless.
        // One still being deleted is the old one: it goes first.
        phase::RESTORING => match (&obs.statefulset, remaining(obs)) {
            (Some(sts), _) if !sts.deleting => step(RecoveryStep::Reseed),
            (Some(_), _) => Some(Plan::Wait(format!(
                "recovery {}: the lost members' StatefulSet goes before member 0 is seeded",
                record.id
            ))),
            (None, Some(left)) => Some(Plan::Wait(format!(
                "recovery {}: the lost members' {left} go before member 0 is seeded",
                record.id
            ))),
            (None, None) => step(RecoveryStep::Reseed),
        },
        // Without a StatefulSet (deleted by hand), the bootstrap rule makes
        // it again over the volumes there are.
        phase::REGROWING
            if obs.statefulset.is_some() && matches!(obs.etcd, EtcdObservation::Unreachable(_)) =>
        {
            Some(Plan::Wait(format!(
                "recovery {}: {} restores backup {} and starts",
                record.id,
                obs.names.pod(0),
                record.backup.as_ref().map_or("", |b| b.name.as_str())
            )))
        }
        phase::REGROWING => regrowing(obs),
        _ => None,
    }
}

/// The old members' pods and volumes still there, as a person reads them.
fn remaining(obs: &Observation) -> Option<String> {
    let mut left = Vec::new();
    if !obs.pods.is_empty() {
        left.push(format!("{} pod(s)", obs.pods.len()));
    }
    if !obs.pvcs.is_empty() {
        left.push(format!("{} PVC(s)", obs.pvcs.len()));
    }
    (!left.is_empty()).then(|| left.join(" and "))
}

#[cfg(test)]
mod tests;
