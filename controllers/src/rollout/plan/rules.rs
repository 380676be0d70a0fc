//! The rules of the rollout policy, each small and pure, in the order
//! [`super::RULES`] lists them. A rule reads the judged [`Work`] and
//! answers with an [`Outcome`] or `None` ("not mine"); it changes nothing.
//! The two that change records (the wave's version gate, the next cluster)
//! answer with the marks [`Work`] judged for them.

use std::time::Duration;

use etcdfleet_api::ClusterRolloutStatus;
use etcdfleet_api::rollout::cluster_state::{DONE, FAILED, IN_PROGRESS, SKIPPED};
use etcdfleet_api::rollout::{phase, wave_state};

use super::records::Mark;
use super::turn::TurnEnd;
use super::work::{Action, Outcome, Work};

/// A strategy that does not parse (a schedule croner refuses): nothing is
/// changed until the spec is fixed.
pub fn invalid_strategy(work: &Work) -> Option<Outcome> {
    let e = work.strategy.as_ref().err()?;
    Some(Outcome::new(
        phase::HALTED,
        format!("spec.strategy is invalid: {e}; nothing is changed until it is fixed"),
    ))
}

/// `spec.abort`: stopped for good. Changed clusters stay changed, untouched
/// ones untouched; clusters still converging are still watched.
pub fn aborted(work: &Work) -> Option<Outcome> {
    let aborted = work.input.spec.abort == Some(true)
        || work.input.previous.phase.as_deref() == Some(phase::ABORTED);
    aborted.then(|| {
        let outcome = Outcome::new(
            phase::ABORTED,
            "aborted: clusters already changed stay changed, the others are not touched",
        );
        watch_while_in_flight(work, &work.records, outcome)
    })
}

/// A complete rollout stays complete: clusters selected later are not its business.
pub fn stays_complete(work: &Work) -> Option<Outcome> {
    (work.input.previous.phase.as_deref() == Some(phase::COMPLETE))
        .then(|| Outcome::new(phase::COMPLETE, complete_message(work)))
}

/// A person set the resume annotation: the failed clusters were judged
/// again (done if now converged, their deadline again if changed, their
/// turn again if never written); the annotation is removed.
pub fn resume(work: &Work) -> Option<Outcome> {
    work.input.resume?;
    let mut outcome = Outcome::new(
        phase::PROGRESSING,
        "resumed: the failed clusters were judged again",
    );
    outcome.action = Action::AcknowledgeResume;
    Some(outcome.wake(Duration::ZERO))
}

/// A cluster failed its gate (judged so with the records: refused, an
/// alarm, past its deadline, or unhealthy after its change in this wave):
/// nothing more is written until a person fixes or excludes it and
/// resumes. Clusters already changed are still watched.
pub fn halted(work: &Work) -> Option<Outcome> {
    let failed = work.records.iter().any(|r| r.state == FAILED);
    failed.then(|| halt(work, Vec::new()))
}

/// Halted on the failed records, once `marks` are written.
fn halt(work: &Work, marks: Vec<Mark>) -> Outcome {
    let records = work.marked(&marks);
    let failed: Vec<String> = records
        .iter()
        .filter(|r| r.state == FAILED)
        .map(|r| {
            format!(
                "{} ({}: {})",
                r.name,
                r.reason.as_deref().unwrap_or(""),
                r.message.as_deref().unwrap_or("")
            )
        })
        .collect();
    let outcome = Outcome::new(
        phase::HALTED,
        format!(
            "halted at {}; no other cluster is changed. Fix the cluster, or leave it out \
             (spec.selector.exclude), then resume: kubectl annotate etcdfleetrollout {} {}=now",
            failed.join("; "),
            work.input.name,
            etcdfleet_api::rollout::RESUME_ANNOTATION
        ),
    );
    watch_while_in_flight(work, &records, outcome.marking(marks))
}

/// No cluster selected: nothing to do until one is.
pub fn no_clusters(work: &Work) -> Option<Outcome> {
    work.records.is_empty().then(|| {
        Outcome::new(
            phase::NO_CLUSTERS,
            "no EtcdCluster this controller owns matches spec.selector",
        )
        .wake(work.input.poll)
    })
}

/// Every wave done (its clusters done or skipped, its soak over).
pub fn complete(work: &Work) -> Option<Outcome> {
    super::waves::current(&work.waves)
        .is_none()
        .then(|| Outcome::new(phase::COMPLETE, complete_message(work)))
}

fn complete_message(work: &Work) -> String {
    let count = |state: &str| work.records.iter().filter(|r| r.state == state).count();
    format!(
        "complete: {} of {} clusters done, {} skipped",
        count(DONE),
        work.records.len(),
        count(SKIPPED)
    )
}

/// `spec.paused`: no cluster is changed; those in flight are still watched.
pub fn paused(work: &Work) -> Option<Outcome> {
    (work.input.spec.paused == Some(true)).then(|| {
        let outcome = Outcome::new(
            phase::PAUSED,
            "paused: no further cluster is changed until spec.paused is false",
        );
        watch_while_in_flight(work, &work.records, outcome)
    })
}

/// The current wave's clusters converged; the next wave waits for the soak.
pub fn soaking(work: &Work) -> Option<Outcome> {
    let waves = &work.waves;
    let wave = super::waves::current(waves)?;
    if wave.state != wave_state::SOAKING {
        return None;
    }
    let until = wave.soak_until?;
    let left = Duration::from_millis(
        (until.as_millisecond() - work.input.now.as_millisecond()).max(0) as u64,
    );
    Some(
        Outcome::new(
            phase::SOAKING,
            format!(
                "wave {} of {} converged; soaking until {until} (every changed cluster must \
                 stay Available, without alarms and not Degraded)",
                wave.wave,
                waves.len()
            ),
        )
        .wake(left)
        .wake(work.input.poll),
    )
}

/// Before the wave writes anything: every pending cluster of the current
/// wave must be allowed the target version by the version policy. Those
/// refused fail, and the rollout halts with nothing written.
pub fn wave_gate(work: &Work) -> Option<Outcome> {
    (!work.refused.is_empty()).then(|| halt(work, work.refused.clone()))
}

/// Outside the maintenance window no cluster is changed.
pub fn window(work: &Work) -> Option<Outcome> {
    let window = work.strategy.as_ref().ok()?.window.as_ref()?;
    let opens = match window.closed_until(work.input.now) {
        Ok(None) => return None,
        Ok(Some(at)) => at,
        Err(e) => {
            return Some(Outcome::new(
                phase::HALTED,
                format!("spec.strategy.maintenanceWindow: {e}"),
            ));
        }
    };
    let wait = Duration::from_millis(
        (opens.as_millisecond() - work.input.now.as_millisecond()).max(0) as u64,
    );
    let outcome = Outcome::new(
        phase::WAITING_FOR_WINDOW,
        format!("outside the maintenance window; the next one opens at {opens}"),
    )
    .wake(wait);
    Some(watch_while_in_flight(work, &work.records, outcome))
}

/// As many clusters in flight as the strategy allows: wait for one to converge.
pub fn in_flight(work: &Work) -> Option<Outcome> {
    let max = work.strategy.as_ref().ok()?.max_in_flight;
    (in_flight_count(&work.records) >= max).then(|| waiting(work))
}

fn in_flight_count(records: &[ClusterRolloutStatus]) -> usize {
    records.iter().filter(|r| r.state == IN_PROGRESS).count()
}

/// The current wave's turn (judged with the records, see [`super::turn`]):
/// the next cluster written, or one unhealthy before its change halting
/// the rollout, or, with nothing to write, a wait for the clusters it
/// skipped (paused) or followed (their spec already asks for the change).
pub fn next_cluster(work: &Work) -> Option<Outcome> {
    let marks = work.turn.marks.clone();
    match &work.turn.end {
        TurnEnd::Write {
            cluster,
            resource_version,
            wave,
        } => {
            let mut outcome = Outcome::new(
                phase::PROGRESSING,
                format!("wave {wave}: changing {cluster}"),
            );
            outcome.action = Action::Apply {
                cluster: cluster.clone(),
                resource_version: resource_version.clone(),
                wave: *wave,
            };
            Some(outcome.marking(marks).wake(Duration::ZERO))
        }
        TurnEnd::Unhealthy => Some(halt(work, marks)),
        TurnEnd::Wait if marks.is_empty() => None,
        TurnEnd::Wait => Some(waiting_after(work, marks)),
    }
}

/// Waiting for the clusters in flight.
pub fn waiting(work: &Work) -> Outcome {
    waiting_after(work, Vec::new())
}

/// Waiting for the clusters in flight once `marks` are written.
fn waiting_after(work: &Work, marks: Vec<Mark>) -> Outcome {
    let records = work.marked(&marks);
    let in_flight: Vec<&str> = records
        .iter()
        .filter(|r| r.state == IN_PROGRESS)
        .map(|r| r.name.as_str())
        .collect();
    let wave = super::waves::current(&work.waves_of(&records)).map_or(0, |w| w.wave);
    Outcome::new(
        phase::PROGRESSING,
        format!(
            "wave {wave}: waiting for {} to converge",
            if in_flight.is_empty() {
                "the wave".to_string()
            } else {
                in_flight.join(", ")
            }
        ),
    )
    .marking(marks)
    .wake(work.input.poll)
}

/// While clusters converge or soak (in `records`, an answer's), look again
/// every poll.
fn watch_while_in_flight(
    work: &Work,
    records: &[ClusterRolloutStatus],
    outcome: Outcome,
) -> Outcome {
    let soaking = |w: &super::waves::Wave| w.state == wave_state::SOAKING;
    let watching = in_flight_count(records) > 0
        || super::waves::current(&work.waves_of(records)).is_some_and(soaking);
    if watching {
        outcome.wake(work.input.poll)
    } else {
        outcome
    }
}
