//! A recovery from a lost quorum in status: `status.lastRecovery` (the
//! evidence, the member recovered from, the revision kept, the loss window,
//! the phase) and the `Recovering` condition, from the recovery step just
//! taken.

use etcdfleet_api::recovery::{
    QuorumLossPolicy, RECOVERING, RecoveryStatus, backup_loss_window, loss_window, phase,
};

use super::super::context::now;
use super::super::plan::step::{RecoveryPlan, RecoveryStep, Step};
use super::Builder;
use crate::render::Names;

impl Builder {
    /// Records the phase a recovery step moved the recovery to (nothing
    /// for other steps).
    pub(super) fn recovery_moved(&mut self, step: &Step) {
        let Step::Recovery(step) = step else {
            return;
        };
        let record = match step {
            RecoveryStep::Begin(plan) => begun(plan, self.names.as_ref()),
            _ => match (self.new.last_recovery.clone(), phase_after(step)) {
                (Some(r), Some(to)) => RecoveryStatus {
                    phase: to.to_string(),
                    completed_time: (to == phase::COMPLETED).then(now),
                    ..r
                },
                _ => return,
            },
        };
        let message = match record.phase.as_str() {
            phase::COMPLETED => format!(
                "recovered from {} (kept revision {}): {}",
                record
                    .backup
                    .as_ref()
                    .map_or(record.member.as_str(), |b| b.name.as_str()),
                record.kept_revision,
                record.loss_window
            ),
            p => format!("recovery {} from {}: {p}: {step}", record.id, record.member),
        };
        let in_progress = record.in_progress();
        let reason = record.phase.clone();
        self.new.last_recovery = Some(RecoveryStatus {
            updated_time: Some(now()),
            ..record
        });
        self.set(RECOVERING, in_progress, &reason, message);
    }
}

/// The record a recovery starts with: `Fencing`.
fn begun(plan: &RecoveryPlan, names: Option<&Names>) -> RecoveryStatus {
    let member = match &plan.backup {
        Some(_) => names.map(|n| n.pod(plan.chosen)).unwrap_or_default(),
        None => (plan.survivors.iter())
            .find(|s| s.id == format!("{:x}", plan.chosen_id))
            .map(|s| s.name.clone())
            .unwrap_or_default(),
    };
    let (policy, member_id, window) = match &plan.backup {
        Some(b) => (
            QuorumLossPolicy::FromBackup,
            String::new(),
            backup_loss_window(
                plan.kept_revision,
                b.completed_time
                    .as_ref()
                    .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                    .as_deref(),
                plan.last_seen_revision,
            ),
        ),
        None => (
            QuorumLossPolicy::FromSurvivors,
            format!("{:x}", plan.chosen_id),
            loss_window(plan.kept_revision, plan.last_seen_revision),
        ),
    };
    RecoveryStatus {
        id: plan.id.clone(),
        policy: policy.to_string(),
        phase: phase::FENCING.to_string(),
        started_time: Some(now()),
        updated_time: None,
        completed_time: None,
        member,
        member_id,
        backup: plan.backup.as_deref().cloned(),
        kept_revision: plan.kept_revision,
        last_seen_revision: plan.last_seen_revision,
        loss_window: window,
        survivors: plan.survivors.clone(),
        lost: plan.lost.clone(),
    }
}

/// The phase a recovery step ends in (`None`: it stays).
fn phase_after(step: &RecoveryStep) -> Option<&'static str> {
    Some(match step {
        RecoveryStep::Begin(_) => phase::FENCING,
        RecoveryStep::Fence { .. } => phase::FORCING,
        RecoveryStep::ClearForRestore => phase::RESTORING,
        RecoveryStep::EndForce | RecoveryStep::Reseed => phase::REGROWING,
        RecoveryStep::Complete => phase::COMPLETED,
        RecoveryStep::WriteForcingTemplate { .. } | RecoveryStep::RestartChosen { .. } => {
            return None;
        }
    })
}
