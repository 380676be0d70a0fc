//! What one planning pass works on: the input, the one action, a rule's
//! answer, and the judged records ([`Work`]).

use std::collections::BTreeMap;
use std::time::Duration;

use etcdfleet_api::rollout::{ResolvedStrategy, phase};
use etcdfleet_api::{ClusterRolloutStatus, EtcdFleetRolloutSpec, EtcdFleetRolloutStatus};
use k8s_openapi::jiff::Timestamp;

use super::records::{self, Judge};
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
}

impl Outcome {
    pub fn new(phase: &'static str, message: impl Into<String>) -> Self {
        Outcome {
            phase,
            message: message.into(),
            action: Action::None,
            wake: None,
        }
    }

    pub fn wake(mut self, after: Duration) -> Self {
        self.wake = Some(self.wake.map_or(after, |w| w.min(after)));
        self
    }
}

/// A rule of the policy: it answers, or leaves the decision to the next.
pub type Rule = fn(&mut Work) -> Option<Outcome>;

/// The state one planning pass works on: the records, judged, and the input.
pub struct Work<'a> {
    pub input: &'a RolloutInput<'a>,
    pub strategy: Result<ResolvedStrategy, String>,
    pub records: Vec<ClusterRolloutStatus>,
    pub views: BTreeMap<&'a str, &'a ClusterView>,
    pub started_at: Timestamp,
    /// A resume annotation not acted on yet.
    pub resume: bool,
}

impl<'a> Work<'a> {
    /// Assigns new clusters to waves and judges every record from its
    /// cluster as it is now.
    pub fn new(input: &'a RolloutInput<'a>) -> Self {
        let previous = input.previous;
        let strategy = input.spec.strategy.resolve().map_err(|e| e.to_string());
        let complete = previous.phase.as_deref() == Some(phase::COMPLETE);
        let aborted =
            input.spec.abort == Some(true) || previous.phase.as_deref() == Some(phase::ABORTED);
        let started_at = previous.started_at.as_ref().map_or(input.now, |t| t.0);
        let resume = input.resume.is_some() && input.resume != previous.last_resume.as_deref();
        let views: BTreeMap<&str, &ClusterView> =
            input.clusters.iter().map(|v| (v.key.as_str(), v)).collect();
        let mut records = previous.clusters.clone();
        if let Ok(s) = &strategy
            && !complete
        {
            let total = input.clusters.len().max(records.len());
            records = records::assign(
                &records,
                input.clusters,
                s.canary,
                s.wave.of(total),
                !aborted,
            );
            let manager = manager_of(input.name);
            let judge = Judge {
                spec: input.spec,
                manager: &manager,
                now: input.now,
                started_at: Some(started_at),
                progress_deadline: s.progress_deadline,
                resume,
            };
            for rec in &mut records {
                judge.track(rec, views.get(rec.name.as_str()).copied());
            }
        }
        Work {
            input,
            strategy,
            records,
            views,
            started_at,
            resume,
        }
    }

    /// The waves as the records say they are now.
    pub fn waves(&self) -> Vec<Wave> {
        let soak = self.strategy.as_ref().map_or(Duration::ZERO, |s| s.soak);
        waves::waves(&self.records, soak, self.input.now)
    }
}

/// The field manager of a rollout.
pub fn manager_of(rollout: &str) -> String {
    etcdfleet_api::rollout::field_manager(rollout)
}
