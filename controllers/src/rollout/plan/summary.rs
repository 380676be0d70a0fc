//! The status a person reads at a glance: the phase and the three
//! conditions (`Progressing`, `Halted`, `Complete`), `done/total`, the
//! current wave, counts by state, one line per wave and one record per
//! cluster. Built from the judged records and the rule that answered.

use etcdfleet_api::conditions::{condition, set_condition};
use etcdfleet_api::rollout::cluster_state::{DONE, FAILED, IN_PROGRESS, PENDING, SKIPPED};
use etcdfleet_api::rollout::{RolloutCounts, WaveStatus, condition as cond, phase};
use etcdfleet_api::{ClusterRolloutStatus, EtcdFleetRolloutStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::work::{Outcome, Work};

/// Counts of records by state.
pub fn counts(records: &[ClusterRolloutStatus]) -> RolloutCounts {
    let count = |state: &str| records.iter().filter(|r| r.state == state).count() as i32;
    RolloutCounts {
        total: records.len() as i32,
        pending: count(PENDING),
        in_progress: count(IN_PROGRESS),
        done: count(DONE),
        failed: count(FAILED),
        skipped: count(SKIPPED),
    }
}

/// The new status of the rollout: the judged records with the answer's
/// marks written.
pub fn status(work: &Work, outcome: &Outcome) -> EtcdFleetRolloutStatus {
    let (input, previous) = (work.input, work.input.previous);
    let now = Time(input.now);
    let records = work.marked(&outcome.marks);
    let waves = work.waves_of(&records);
    let counts = counts(&records);
    let current = super::waves::current(&waves).map_or(waves.len(), |w| w.wave as usize);
    let failed = records.iter().find(|r| r.state == FAILED).cloned();
    let mut status = EtcdFleetRolloutStatus {
        observed_generation: input.generation,
        conditions: previous.conditions.clone(),
        phase: Some(outcome.phase.to_string()),
        progress: Some(format!("{}/{}", counts.done, counts.total)),
        current_wave: (!waves.is_empty()).then(|| format!("{current}/{}", waves.len())),
        started_at: previous
            .started_at
            .clone()
            .or_else(|| (!records.is_empty()).then_some(Time(work.started_at))),
        completed_at: previous
            .completed_at
            .clone()
            .or_else(|| (outcome.phase == phase::COMPLETE).then(|| now.clone())),
        last_resume: if work.resume {
            input.resume.map(str::to_string)
        } else {
            previous.last_resume.clone()
        },
        counts,
        waves: waves
            .iter()
            .map(|w| WaveStatus {
                wave: w.wave,
                clusters: w.clusters as i32,
                finished: w.finished as i32,
                state: w.state.to_string(),
                soak_until: w.soak_until.map(Time),
            })
            .collect(),
        clusters: records,
    };
    set_conditions(&mut status, work, failed.as_ref(), outcome, now);
    status
}

/// The three conditions; `failed`: the first failed record.
fn set_conditions(
    status: &mut EtcdFleetRolloutStatus,
    work: &Work,
    failed: Option<&ClusterRolloutStatus>,
    outcome: &Outcome,
    now: Time,
) {
    let generation = work.input.generation;
    let c = status.counts.clone();
    let mut set = |type_: &str, value: bool, reason: &str, message: &str| {
        set_condition(
            &mut status.conditions,
            condition(type_, value, reason, message, generation, now.clone()),
        );
    };
    let progressing = matches!(
        outcome.phase,
        phase::PROGRESSING | phase::SOAKING | phase::WAITING_FOR_WINDOW
    );
    set(
        cond::PROGRESSING,
        progressing,
        outcome.phase,
        &outcome.message,
    );
    match (outcome.phase, failed) {
        (phase::HALTED, Some(rec)) => set(
            cond::HALTED,
            true,
            rec.reason.as_deref().unwrap_or("Failed"),
            &outcome.message,
        ),
        (phase::HALTED, None) => set(cond::HALTED, true, "InvalidStrategy", &outcome.message),
        _ => set(
            cond::HALTED,
            false,
            "NoFailure",
            "no cluster failed its gate",
        ),
    }
    if outcome.phase == phase::COMPLETE {
        set(cond::COMPLETE, true, "AllClustersDone", &outcome.message);
    } else {
        let message = format!(
            "{} of {} clusters done, {} skipped",
            c.done, c.total, c.skipped
        );
        set(cond::COMPLETE, false, outcome.phase, &message);
    }
}
