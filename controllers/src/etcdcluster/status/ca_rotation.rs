//! A CA rotation in status: `status.caRotation` (request, phase, when it
//! started and last moved on) and the `CARotating` condition, from the
//! rotation step just taken.

use etcdfleet_api::ca_rotation::{CA_ROTATING, CaRotationStatus, phase, roll_stamp};

use super::super::context::now;
use super::super::plan::step::Step;
use super::Builder;

impl Builder {
    /// Records the phase a rotation step moved the rotation to (nothing for
    /// other steps).
    pub(super) fn ca_rotation_moved(&mut self, step: &Step) {
        let Some(to) = phase_after(step) else {
            return;
        };
        let record = match step {
            Step::StartCaRotation { request_id } | Step::RecoverCa { request_id } => {
                CaRotationStatus {
                    request_id: request_id.clone(),
                    phase: to.to_string(),
                    started_time: Some(now()),
                    updated_time: None,
                    prior_roll_stamp: roll_stamp(self.new.ca_rotation.as_ref()),
                }
            }
            _ => match self.new.ca_rotation.clone() {
                Some(r) => CaRotationStatus {
                    phase: to.to_string(),
                    ..r
                },
                None => return,
            },
        };
        let done = !record.in_progress();
        let message = format!("CA rotation {:?}: {step}", record.request_id);
        self.new.ca_rotation = Some(CaRotationStatus {
            updated_time: Some(now()),
            ..record
        });
        self.set(CA_ROTATING, !done, to, message);
    }
}

/// The phase a rotation step ends in.
fn phase_after(step: &Step) -> Option<&'static str> {
    Some(match step {
        Step::StartCaRotation { .. } => phase::PREPARING,
        Step::GenerateNextCa => phase::TRUSTING,
        Step::PromoteNextCa => phase::REISSUING,
        Step::DropPreviousCa => phase::COMPLETING,
        Step::CompleteCaRotation => phase::COMPLETED,
        Step::CancelCaRotation => phase::CANCELLED,
        // The recovered CA and a new one are both in the PKI Secret at once.
        Step::RecoverCa { .. } => phase::TRUSTING,
        _ => return None,
    })
}
