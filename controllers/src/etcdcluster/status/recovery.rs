//! A recovery from a lost quorum in status: `status.lastRecovery` (the
//! evidence, the member recovered from, the revision kept, the loss window,
//! the phase) and the `Recovering` condition, from the recovery step just
//! taken.

use etcdfleet_api::recovery::{RECOVERING, RecoveryStatus, loss_window, phase};

use super::super::context::now;
use super::super::plan::step::{RecoveryPlan, RecoveryStep, Step};
use super::Builder;

impl Builder {
    /// Records the phase a recovery step moved the recovery to (nothing
    /// for other steps).
    pub(super) fn recovery_moved(&mut self, step: &Step) {
        let Step::Recovery(step) = step else {
            return;
        };
        let record = match step {
            RecoveryStep::Begin(plan) => begun(plan),
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
                record.member, record.kept_revision, record.loss_window
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
fn begun(plan: &RecoveryPlan) -> RecoveryStatus {
    let member = plan
        .survivors
        .iter()
        .find(|s| s.id == format!("{:x}", plan.chosen_id))
        .map(|s| s.name.clone())
        .unwrap_or_default();
    RecoveryStatus {
        id: plan.id.clone(),
        policy: "FromSurvivors".to_string(),
        phase: phase::FENCING.to_string(),
        started_time: Some(now()),
        updated_time: None,
        completed_time: None,
        member,
        member_id: format!("{:x}", plan.chosen_id),
        kept_revision: plan.kept_revision,
        last_seen_revision: plan.last_seen_revision,
        loss_window: loss_window(plan.kept_revision, plan.last_seen_revision),
        survivors: plan.survivors.clone(),
        lost: plan.lost.clone(),
    }
}

/// The phase a recovery step ends in (`None`: it stays).
fn phase_after(step: &RecoveryStep) -> Option<&'static str> {
    Some(match step {
        RecoveryStep::Begin(_) => phase::FENCING,
        RecoveryStep::Fence { .. } => phase::FORCING,
        RecoveryStep::EndForce => phase::REGROWING,
        RecoveryStep::Complete => phase::COMPLETED,
        RecoveryStep::WriteForcingTemplate { .. } | RecoveryStep::RestartChosen { .. } => {
            return None;
        }
    })
}
