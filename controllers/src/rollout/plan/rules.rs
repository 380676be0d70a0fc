//! The rules of the rollout policy, each small and pure, in the order
//! [`super::RULES`] lists them. A rule answers with an [`Outcome`] or
//! `None` ("not mine"); a few mark records first (a failure the wave's gate
//! finds) and leave the answer to `halted`.

use std::time::Duration;

use etcdfleet_api::rollout::cluster_state::{DONE, FAILED, IN_PROGRESS, PENDING, SKIPPED};
use etcdfleet_api::rollout::{phase, wave_state};
use etcdfleet_api::version::decide;

use super::records::{set, time};
use super::work::{Action, Outcome, Work};

/// A strategy that does not parse (a schedule croner refuses): nothing is
/// changed until the spec is fixed.
pub fn invalid_strategy(work: &mut Work) -> Option<Outcome> {
    let e = work.strategy.as_ref().err()?;
    Some(Outcome::new(
        phase::HALTED,
        format!("spec.strategy is invalid: {e}; nothing is changed until it is fixed"),
    ))
}

/// Clusters this rollout changed in the current wave must stay `Available`,
/// without alarms and not `Degraded`, once converged: through the rest of
/// the wave and its soak. One that does not fails its gate.
pub fn watch_health(work: &mut Work) -> Option<Outcome> {
    let wave = super::waves::current(&work.waves())?.wave;
    for rec in work.records.iter_mut() {
        if rec.wave != wave || rec.state != DONE || rec.changed_at.is_none() {
            continue;
        }
        let Some(view) = work.views.get(rec.name.as_str()) else {
            continue;
        };
        let why = view.alarm().or_else(|| view.healthy().err());
        if let Some(why) = why {
            set(
                rec,
                FAILED,
                "UnhealthyAfterChange",
                format!("converged, then stopped being healthy before the wave finished: {why}"),
            );
        }
    }
    None
}

/// `spec.abort`: stopped for good. Changed clusters stay changed, untouched
/// ones untouched; clusters still converging are still watched.
pub fn aborted(work: &mut Work) -> Option<Outcome> {
    let aborted = work.input.spec.abort == Some(true)
        || work.input.previous.phase.as_deref() == Some(phase::ABORTED);
    aborted.then(|| {
        let outcome = Outcome::new(
            phase::ABORTED,
            "aborted: clusters already changed stay changed, the others are not touched",
        );
        watch_while_in_flight(work, outcome)
    })
}

/// A complete rollout stays complete: clusters selected later are not its business.
pub fn stays_complete(work: &mut Work) -> Option<Outcome> {
    (work.input.previous.phase.as_deref() == Some(phase::COMPLETE))
        .then(|| Outcome::new(phase::COMPLETE, complete_message(work)))
}

/// A person set the resume annotation: the failed clusters were judged
/// again (done if now converged, their deadline again if changed, their
/// turn again if never written); the annotation is removed.
pub fn resume(work: &mut Work) -> Option<Outcome> {
    work.input.resume?;
    let mut outcome = Outcome::new(
        phase::PROGRESSING,
        "resumed: the failed clusters were judged again",
    );
    outcome.action = Action::AcknowledgeResume;
    Some(outcome.wake(Duration::ZERO))
}

/// A cluster failed its gate: nothing more is written until a person fixes
/// or excludes it and resumes. Clusters already changed are still watched.
pub fn halted(work: &mut Work) -> Option<Outcome> {
    let failed: Vec<String> = work
        .records
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
    if failed.is_empty() {
        return None;
    }
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
    Some(watch_while_in_flight(work, outcome))
}

/// No cluster selected: nothing to do until one is.
pub fn no_clusters(work: &mut Work) -> Option<Outcome> {
    work.records.is_empty().then(|| {
        Outcome::new(
            phase::NO_CLUSTERS,
            "no EtcdCluster this controller owns matches spec.selector",
        )
        .wake(work.input.poll)
    })
}

/// Every wave done (its clusters done or skipped, its soak over).
pub fn complete(work: &mut Work) -> Option<Outcome> {
    super::waves::current(&work.waves())
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
pub fn paused(work: &mut Work) -> Option<Outcome> {
    (work.input.spec.paused == Some(true)).then(|| {
        let outcome = Outcome::new(
            phase::PAUSED,
            "paused: no further cluster is changed until spec.paused is false",
        );
        watch_while_in_flight(work, outcome)
    })
}

/// The current wave's clusters converged; the next wave waits for the soak.
pub fn soaking(work: &mut Work) -> Option<Outcome> {
    let waves = work.waves();
    let wave = super::waves::current(&waves)?;
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
/// wave must be allowed the target version by the version policy. A
/// refused one fails, and `halted` answers with nothing written.
pub fn wave_gate(work: &mut Work) -> Option<Outcome> {
    let target = work.input.spec.version.as_deref()?;
    let wave = super::waves::current(&work.waves())?.wave;
    let mut refused = false;
    for rec in work.records.iter_mut() {
        if rec.wave != wave || rec.state != PENDING {
            continue;
        }
        let Some(view) = work.views.get(rec.name.as_str()) else {
            continue;
        };
        if let Err(rejection) = decide(view.reported.current_version.as_deref(), target) {
            set(
                rec,
                FAILED,
                "VersionRefused",
                format!(
                    "{}: {}; refused before the wave changed any cluster",
                    rejection.reason(),
                    rejection.message()
                ),
            );
            refused = true;
        }
    }
    if refused { halted(work) } else { None }
}

/// Outside the maintenance window no cluster is changed.
pub fn window(work: &mut Work) -> Option<Outcome> {
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
    Some(watch_while_in_flight(work, outcome))
}

/// As many clusters in flight as the strategy allows: wait for one to converge.
pub fn in_flight(work: &mut Work) -> Option<Outcome> {
    let max = work.strategy.as_ref().ok()?.max_in_flight;
    (in_flight_count(work) >= max).then(|| waiting(work))
}

fn in_flight_count(work: &Work) -> usize {
    work.records
        .iter()
        .filter(|r| r.state == IN_PROGRESS)
        .count()
}

/// The next pending cluster of the current wave, in rollout order: a
/// paused one is skipped, an unhealthy one fails (nothing is written into
/// a cluster that is not healthy), one whose spec already asks for the
/// change is followed without a write, and the first other one is written.
pub fn next_cluster(work: &mut Work) -> Option<Outcome> {
    let wave = super::waves::current(&work.waves())?.wave;
    let max = work.strategy.as_ref().ok()?.max_in_flight;
    let (now, spec) = (work.input.now, work.input.spec);
    for i in 0..work.records.len() {
        if in_flight_count(work) >= max {
            return None;
        }
        let rec = &work.records[i];
        if rec.wave != wave || rec.state != PENDING {
            continue;
        }
        let Some(view) = work.views.get(rec.name.as_str()).copied() else {
            continue;
        };
        let rec = &mut work.records[i];
        if view.paused {
            set(
                rec,
                SKIPPED,
                "ClusterPaused",
                "spec.paused is true on the cluster: not changed",
            );
            continue;
        }
        if let Err(why) = view.healthy() {
            set(rec, FAILED, "NotHealthyBeforeChange", why);
            return halted(work);
        }
        rec.changed_at = Some(time(now));
        rec.from_version = view.reported.current_version.clone();
        if view.spec_matches(spec) {
            set(
                rec,
                IN_PROGRESS,
                "AlreadyRequested",
                "the spec already asks for the change; followed without a write",
            );
            continue;
        }
        set(rec, IN_PROGRESS, "Changed", "changed by this rollout");
        let mut outcome = Outcome::new(
            phase::PROGRESSING,
            format!("wave {wave}: changing {}", view.key),
        );
        outcome.action = Action::Apply {
            cluster: view.key.clone(),
            resource_version: view.resource_version.clone(),
            wave,
        };
        return Some(outcome.wake(Duration::ZERO));
    }
    None
}

/// Waiting for the clusters in flight.
pub fn waiting(work: &Work) -> Outcome {
    let in_flight: Vec<&str> = work
        .records
        .iter()
        .filter(|r| r.state == IN_PROGRESS)
        .map(|r| r.name.as_str())
        .collect();
    let wave = super::waves::current(&work.waves()).map_or(0, |w| w.wave);
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
    .wake(work.input.poll)
}

/// While clusters converge or soak, look again every poll.
fn watch_while_in_flight(work: &Work, outcome: Outcome) -> Outcome {
    let watching = in_flight_count(work) > 0
        || super::waves::current(&work.waves()).is_some_and(|w| w.state == wave_state::SOAKING);
    if watching {
        outcome.wake(work.input.poll)
    } else {
        outcome
    }
}
