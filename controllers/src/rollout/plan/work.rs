//! What one planning pass works on: the input, the one action, a rule's
//! answer (with the records it marks), and [`Work`]: everything the rules
//! read, judged once.

use std::collections::BTreeMap;
use std::time::Duration;

use etcdfleet_api::rollout::{ResolvedStrategy, phase};
use etcdfleet_api::{ClusterRolloutStatus, EtcdFleetRolloutSpec, EtcdFleetRolloutStatus};
use k8s_openapi::jiff::Timestamp;

use super::records::{self, Judge, Mark};
use super::turn::{self, Turn};
use super::view::ClusterView;
use super::waves::{self, Wave};

/// Everything the planner decides from.
#[derive(Clone, Debug)]
pub struct RolloutInput<'a> {
    pub name: &'a str,
    pub generation: Option<i64>,
    pub spec: &'a EtcdFleetRolloutSpec,
    /// The status the rollout last wrote.
    pub previous: &'a EtcdFleetRolloutStatus,
    /// The value of the resume annotation, if a person set it.
    pub resume: Option<&'a str>,
    pub now: Timestamp,
    /// The selected clusters this controller owns, in any order.
    pub clusters: &'a [ClusterView],
    /// How often to look again while clusters converge or soak.
    pub poll: Duration,
}

/// The one thing a reconcile does besides writing the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    /// Write the change into this cluster (server-side apply under the
    /// rollout's field manager, conditional on this resourceVersion).
    Apply {
        cluster: String,
        resource_version: Option<String>,
        wave: i32,
    },
    /// Remove the resume annotation, acted on.
    AcknowledgeResume,
}

/// What a rule answers: the rollout's state, what it does, when to look again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// `phase::*`.
    pub phase: &'static str,
    /// What a person reads in the `Progressing` (or `Halted`) condition.
    pub message: String,
    pub action: Action,
    /// Look again after this long at the latest (`None`: on a change only).
    pub wake: Option<Duration>,
    /// The records this answer changes (written into the status).
    pub marks: Vec<Mark>,
}

impl Outcome {
    pub fn new(phase: &'static str, message: impl Into<String>) -> Self {
        Outcome {
            phase,
            message: message.into(),
            action: Action::None,
            wake: None,
            marks: Vec::new(),
        }
    }

    pub fn marking(mut self, marks: Vec<Mark>) -> Self {
        self.marks = marks;
        self
    }

    pub fn wake(mut self, after: Duration) -> Self {
        self.wake = Some(self.wake.map_or(after, |w| w.min(after)));
        self
    }
}

/// A rule of the policy: it reads the judged [`Work`] and answers, or
/// leaves the decision to the next.
pub type Rule = fn(&Work) -> Option<Outcome>;

/// What one planning pass works on, judged once when it is built: the
/// records (each judged from its cluster as it is now, the health of the
/// clusters changed in the current wave included), the waves they make,
/// and what the current wave would do next (its version gate and its
/// turn). Nothing changes it afterwards: every rule only reads it.
pub struct Work<'a> {
    pub input: &'a RolloutInput<'a>,
    pub strategy: Result<ResolvedStrategy, String>,
    pub records: Vec<ClusterRolloutStatus>,
    pub views: BTreeMap<&'a str, &'a ClusterView>,
    pub started_at: Timestamp,
    /// A resume annotation not acted on yet.
    pub resume: bool,
    /// The waves as the judged records say they are.
    pub waves: Vec<Wave>,
    /// The current wave's pending clusters the version policy refuses.
    pub refused: Vec<Mark>,
    /// The current wave's next step.
    pub turn: Turn,
}

impl<'a> Work<'a> {
    /// Assigns new clusters to waves, judges every record from its cluster
    /// as it is now, and what the current wave would do next.
    pub fn new(input: &'a RolloutInput<'a>) -> Self {
        let previous = input.previous;
        let strategy = input.spec.strategy.resolve().map_err(|e| e.to_string());
        let started_at = previous.started_at.as_ref().map_or(input.now, |t| t.0);
        let resume = input.resume.is_some() && input.resume != previous.last_resume.as_deref();
        let views: BTreeMap<&str, &ClusterView> =
            input.clusters.iter().map(|v| (v.key.as_str(), v)).collect();
        let complete = previous.phase.as_deref() == Some(phase::COMPLETE);
        let records = match &strategy {
            // A complete rollout is not judged again (it stays complete).
            Ok(s) if !complete => judged(input, s, &views, started_at, resume),
            _ => previous.clusters.clone(),
        };
        let soak = strategy.as_ref().map_or(Duration::ZERO, |s| s.soak);
        let waves = waves::waves(&records, soak, input.now);
        let (refused, turn) = match (&strategy, waves::current(&waves)) {
            (Ok(s), Some(wave)) => (
                turn::version_gate(&records, &views, wave.wave, input.spec.version.as_deref()),
                turn::next_turn(
                    &records,
                    &views,
                    wave.wave,
                    input.spec,
                    input.now,
                    s.max_in_flight,
                ),
            ),
            _ => (Vec::new(), Turn::default()),
        };
        Work {
            input,
            strategy,
            records,
            views,
            started_at,
            resume,
            waves,
            refused,
            turn,
        }
    }

    /// The records once `marks` (an answer's) are written.
    pub fn marked(&self, marks: &[Mark]) -> Vec<ClusterRolloutStatus> {
        let mut records = self.records.clone();
        for mark in marks {
            mark.write(&mut records);
        }
        records
    }

    /// The waves `records` make (the judged records make [`Work::waves`]).
    pub fn waves_of(&self, records: &[ClusterRolloutStatus]) -> Vec<Wave> {
        let soak = self.strategy.as_ref().map_or(Duration::ZERO, |s| s.soak);
        waves::waves(records, soak, self.input.now)
    }
}

/// The records in rollout order, each judged from its cluster as it is now;
/// then the health of those changed in the current wave.
fn judged(
    input: &RolloutInput,
    strategy: &ResolvedStrategy,
    views: &BTreeMap<&str, &ClusterView>,
    started_at: Timestamp,
    resume: bool,
) -> Vec<ClusterRolloutStatus> {
    let previous = &input.previous.clusters;
    let aborted =
        input.spec.abort == Some(true) || input.previous.phase.as_deref() == Some(phase::ABORTED);
    let total = input.clusters.len().max(previous.len());
    let (canary, wave_size) = (strategy.canary, strategy.wave.of(total));
    let mut records = records::assign(previous, input.clusters, canary, wave_size, !aborted);
    let manager = manager_of(input.name);
    let judge = Judge {
        spec: input.spec,
        manager: &manager,
        now: input.now,
        started_at: Some(started_at),
        progress_deadline: strategy.progress_deadline,
        resume,
    };
    for rec in &mut records {
        judge.track(rec, views.get(rec.name.as_str()).copied());
    }
    let current = waves::waves(&records, strategy.soak, input.now);
    if let Some(wave) = waves::current(&current).map(|w| w.wave) {
        records::judge_health_after_change(&mut records, views, wave);
    }
    records
}

/// The field manager of a rollout.
pub fn manager_of(rollout: &str) -> String {
    etcdfleet_api::rollout::field_manager(rollout)
}
