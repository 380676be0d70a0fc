//! Fleet rollouts: the `EtcdFleetRollout` kind, which moves many
//! `EtcdCluster`s to a new version or template in waves and stops at the
//! first cluster that fails its gate. Pure data and pure helpers (which
//! clusters a selector takes, the maintenance window); the planner that
//! decides what a rollout does next lives in the controller.
//!
//! **Scope: cluster.** A rollout changes clusters in many namespaces, so the
//! right to create one is a cluster-wide right, granted through a
//! ClusterRole binding, like the platform's `ClusterEtcdTemplate`s. A
//! namespaced rollout would let anyone who may create objects in one
//! namespace change clusters in others (or would have to be confined to its
//! own namespace, which is not a fleet). The controller itself writes only
//! the clusters it owns (its configured namespaces and label selector), and
//! reconciles only the rollouts its label selector takes, exactly like its
//! `EtcdCluster`s, so stages and shards never act on each other's rollouts.

// kube's `printcolumn(...)` entries repeat `type_ = ...`, which clippy takes
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelectorRequirement, Time};
use k8s_openapi::jiff::Timestamp;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::backup::{BackupConfigError, parse_duration, parse_schedule};
use crate::destination::DURATION_RULE;
use crate::types::TemplateRef;

/// Annotation a rollout writes, with its change, on every cluster it
/// changes: the rollout's name. The cluster reconciler shows it in
/// `status.rollout`.
pub const ROLLOUT_ANNOTATION: &str = "etcdfleet.dev/rollout";
/// Annotation written with [`ROLLOUT_ANNOTATION`]: what the rollout changed
/// (`version 3.5.35`, `template ClusterEtcdTemplate/ha-3`).
pub const ROLLOUT_CHANGE_ANNOTATION: &str = "etcdfleet.dev/rollout-change";
/// Annotation on a halted rollout: a person fixed or excluded the failed
/// cluster(s); the controller judges them again, goes on, and removes it.
pub const RESUME_ANNOTATION: &str = "etcdfleet.dev/resume";
/// Prefix of the field manager a rollout writes clusters under
/// (`etcdfleet-rollout-<name>`).
pub const FIELD_MANAGER_PREFIX: &str = "etcdfleet-rollout-";

/// Default canary: one cluster in the first wave.
pub const DEFAULT_CANARY: i32 = 1;
/// Default size of a later wave: a quarter of the selected clusters.
pub const DEFAULT_WAVE_PERCENT: i32 = 25;
/// Default number of clusters changed and not yet converged at once.
pub const DEFAULT_MAX_IN_FLIGHT: i32 = 1;
/// Default soak time of a wave.
pub const DEFAULT_SOAK: &str = "5m";
/// Default time a changed cluster has to converge.
pub const DEFAULT_PROGRESS_DEADLINE: &str = "30m";

/// The field manager of rollout `name`.
pub fn field_manager(rollout: &str) -> String {
    format!("{FIELD_MANAGER_PREFIX}{rollout}")
}

/// Condition types of a rollout.
pub mod condition {
    /// True while the rollout changes clusters or waits for them (a wave in
    /// flight, a soak, a maintenance window); False when paused, halted,
    /// aborted or complete.
    pub const PROGRESSING: &str = "Progressing";
    /// True after a cluster failed its gate; nothing more is written until
    /// a person fixes or excludes it and resumes.
    pub const HALTED: &str = "Halted";
    /// True once every selected cluster is done or skipped.
    pub const COMPLETE: &str = "Complete";
}

/// `status.phase` of a rollout: what `kubectl get` shows as its state.
pub mod phase {
    /// A wave is being changed, or waits for its clusters to converge.
    pub const PROGRESSING: &str = "Progressing";
    /// Every cluster of the wave converged; the wave soaks before the next.
    pub const SOAKING: &str = "Soaking";
    /// Outside the maintenance window: no cluster is changed.
    pub const WAITING_FOR_WINDOW: &str = "WaitingForWindow";
    /// `spec.paused`.
    pub const PAUSED: &str = "Paused";
    /// A cluster failed its gate.
    pub const HALTED: &str = "Halted";
    /// `spec.abort`: nothing more is written, ever.
    pub const ABORTED: &str = "Aborted";
    /// Every selected cluster is done or skipped.
    pub const COMPLETE: &str = "Complete";
    /// No cluster is selected (yet).
    pub const NO_CLUSTERS: &str = "NoClusters";
}

/// States of one cluster in a rollout (`status.clusters[].state`).
pub mod cluster_state {
    /// Not changed yet.
    pub const PENDING: &str = "Pending";
    /// Changed, not converged yet.
    pub const IN_PROGRESS: &str = "InProgress";
    /// Converged (or matched the change already, unwritten).
    pub const DONE: &str = "Done";
    /// Failed its gate; the rollout halted on it.
    pub const FAILED: &str = "Failed";
    /// Left alone, with the reason (a person's edit, paused, deleted, excluded).
    pub const SKIPPED: &str = "Skipped";
}

/// Which `EtcdCluster`s a rollout takes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetSelector {
    /// Namespaces to take clusters from; empty: every namespace the
    /// controller watches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Labels a cluster must carry (all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Label requirements a cluster must meet (all of them): operators `In`,
    /// `NotIn`, `Exists`, `DoesNotExist`, as in a Kubernetes label selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
    /// Clusters left out by name (`namespace/name`), e.g. one that failed
    /// its gate and should not hold the rollout any longer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

impl FleetSelector {
    /// Whether the cluster `namespace/name` with `labels` is selected.
    pub fn selects(&self, namespace: &str, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let in_namespace =
            self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace);
        let key = format!("{namespace}/{name}");
        in_namespace
            && !self.exclude.contains(&key)
            && self
                .match_labels
                .iter()
                .flatten()
                .all(|(k, v)| labels.get(k) == Some(v))
            && self
                .match_expressions
                .iter()
                .flatten()
                .all(|r| requirement_holds(r, labels))
    }
}

/// One `matchExpressions` entry against a cluster's labels. An unknown
/// operator matches nothing (the schema's rule refuses it on the way in).
fn requirement_holds(r: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let value = labels.get(&r.key);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// When clusters may be changed: windows that open on a cron schedule (UTC)
/// and stay open for `duration`. A change already written goes on outside
/// the window (an upgrade in flight is never left half done); only new
/// changes wait.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// When a window opens: five cron fields in UTC, e.g. `0 22 * * 1-5`.
    #[x_kube(validation = Rule::new("self.matches('^[^ ]+( [^ ]+){4}$')").message("schedule must have five space-separated cron fields, e.g. '0 22 * * 1-5'"))]
    pub schedule: String,
    /// How long a window stays open, e.g. `4h`.
    #[x_kube(validation = Rule::new(DURATION_RULE).message("duration must be a positive whole number followed by s, m, h or d, e.g. 4h"))]
    pub duration: String,
}

impl MaintenanceWindow {
    /// `Ok(None)` when `now` is inside a window; `Ok(Some(t))` when it is
    /// not, with the time `t` the next window opens.
    pub fn closed_until(&self, now: Timestamp) -> Result<Option<Timestamp>, BackupConfigError> {
        let cron = parse_schedule(&self.schedule)?;
        let open_for = parse_duration(&self.duration)?;
        let utc = |t: Timestamp| t.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
        let last_open = cron
            .find_previous_occurrence(&utc(now), true)
            .ok()
            .map(|z| z.timestamp());
        if let Some(opened) = last_open
            && (now.as_millisecond() - opened.as_millisecond()) < open_for.as_millis() as i64
        {
            return Ok(None);
        }
        Ok(crate::backup::next_run(&cron, now))
    }
}

/// How the selected clusters are changed: waves, concurrency, gates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.waveSize) && has(self.wavePercent))").message("set at most one of waveSize and wavePercent"))]
pub struct RolloutStrategy {
    /// Clusters in the first wave, the canary (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("canary must be at least 1"))]
    pub canary: Option<i32>,
    /// Clusters in each later wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("waveSize must be at least 1"))]
    pub wave_size: Option<i32>,
    /// Each later wave as a percentage of the selected clusters, rounded up
    /// (default 25 when `waveSize` is not set either).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("wavePercent must be between 1 and 100"))]
    pub wave_percent: Option<i32>,
    /// Most clusters changed and not yet converged at once (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("maxInFlight must be at least 1"))]
    pub max_in_flight: Option<i32>,
    /// How long every changed cluster of a wave must stay `Available`,
    /// without alarms and not `Degraded`, after the last of them converged,
    /// before the next wave starts (default `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("soak must be a positive whole number followed by s, m, h or d, e.g. 10m"))]
    pub soak: Option<String>,
    /// A changed cluster that has not converged this long after it was
    /// changed fails its gate (default `30m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DURATION_RULE).message("progressDeadline must be a positive whole number followed by s, m, h or d, e.g. 30m"))]
    pub progress_deadline: Option<String>,
    /// When clusters may be changed; empty: at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_window: Option<MaintenanceWindow>,
}

/// The strategy with its defaults filled in and its durations parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedStrategy {
    pub canary: usize,
    pub wave: WaveSize,
    pub max_in_flight: usize,
    pub soak: Duration,
    pub progress_deadline: Duration,
    pub window: Option<MaintenanceWindow>,
}

/// The size of a wave after the canary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaveSize {
    Count(usize),
    Percent(u32),
}

impl WaveSize {
    /// Clusters per later wave when `total` are selected (at least one).
    pub fn of(self, total: usize) -> usize {
        match self {
            WaveSize::Count(n) => n.max(1),
            WaveSize::Percent(p) => (total * p as usize).div_ceil(100).max(1),
        }
    }
}

impl RolloutStrategy {
    /// The defaults filled in; an unparsable duration or schedule names itself.
    pub fn resolve(&self) -> Result<ResolvedStrategy, BackupConfigError> {
        let positive = |v: Option<i32>, default: i32| v.unwrap_or(default).max(1) as usize;
        let wave = match (self.wave_size, self.wave_percent) {
            (Some(n), _) => WaveSize::Count(n.max(1) as usize),
            (None, Some(p)) => WaveSize::Percent(p.clamp(1, 100) as u32),
            (None, None) => WaveSize::Percent(DEFAULT_WAVE_PERCENT as u32),
        };
        if let Some(window) = &self.maintenance_window {
            parse_schedule(&window.schedule)?;
            parse_duration(&window.duration)?;
        }
        Ok(ResolvedStrategy {
            canary: positive(self.canary, DEFAULT_CANARY),
            wave,
            max_in_flight: positive(self.max_in_flight, DEFAULT_MAX_IN_FLIGHT),
            soak: parse_duration(self.soak.as_deref().unwrap_or(DEFAULT_SOAK))?,
            progress_deadline: parse_duration(
                self.progress_deadline
                    .as_deref()
                    .unwrap_or(DEFAULT_PROGRESS_DEADLINE),
            )?,
            window: self.maintenance_window.clone(),
        })
    }
}

/// Moves the selected `EtcdCluster`s to a version, or rebases them onto a
/// template, in waves: a canary first, then later waves, each gated on its
/// clusters converging and staying healthy for the soak time. Halts at the
/// first cluster that fails its gate and touches no other.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "etcdfleet.dev",
    version = "v1alpha1",
    kind = "EtcdFleetRollout",
    status = "EtcdFleetRolloutStatus",
    shortname = "etcdfr",
    category = "etcdfleet",
    doc = "Moves many EtcdClusters to a new version or template in waves that stop at the first failure.",
    printcolumn(name = "Done", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "Wave", type_ = "string", json_path = ".status.currentWave"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Message",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Progressing\")].message"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    cel
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.version) || has(self.templateRef)").message("a rollout changes something: set version, templateRef or both"))]
// The change is the rollout's identity: clusters already changed would be
// left at a target the rollout no longer names. Make a new rollout instead.
#[x_kube(validation = Rule::new("has(self.version) == has(oldSelf.version) && (!has(self.version) || self.version == oldSelf.version)").message("version is immutable: create a new EtcdFleetRollout").field_path(".version"))]
#[x_kube(validation = Rule::new("has(self.templateRef) == has(oldSelf.templateRef) && (!has(self.templateRef) || self.templateRef == oldSelf.templateRef)").message("templateRef is immutable: create a new EtcdFleetRollout").field_path(".templateRef"))]
#[x_kube(validation = Rule::new("!has(oldSelf.abort) || !oldSelf.abort || (has(self.abort) && self.abort)").message("abort cannot be undone: create a new EtcdFleetRollout").field_path(".abort"))]
pub struct EtcdFleetRolloutSpec {
    /// Which clusters: namespaces, labels, exclusions.
    #[serde(default)]
    pub selector: FleetSelector,

    /// The etcd version every selected cluster moves to (`spec.version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)$')").message("version must be a full semantic version MAJOR.MINOR.PATCH, e.g. 3.5.1"))]
    pub version: Option<String>,

    /// The template every selected cluster is rebased onto: `spec.templateRef`
    /// is set to it and the rebase annotation asks the cluster reconciler
    /// to take its current values (fields a person edited stay theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,

    /// Waves, concurrency, soak, deadline, maintenance window.
    #[serde(default)]
    pub strategy: RolloutStrategy,

    /// Change no further cluster while true; clusters already changed go on
    /// converging and are still watched. False (or removed) resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,

    /// Stop for good: clusters already changed stay changed, untouched ones
    /// stay untouched. Cannot be undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<bool>,
}

impl EtcdFleetRolloutSpec {
    /// What the rollout changes, in words (`version 3.5.35`,
    /// `template ClusterEtcdTemplate/ha-3`, or both).
    pub fn change_summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = &self.version {
            parts.push(format!("version {v}"));
        }
        if let Some(t) = &self.template_ref {
            parts.push(format!("template {:?}/{}", t.kind, t.name));
        }
        parts.join(", ")
    }
}

/// Observed state of a rollout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdFleetRolloutStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Progressing, Halted, Complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Progressing, Soaking, WaitingForWindow, Paused, Halted, Aborted,
    /// Complete or NoClusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Done (converged or already matching) of all selected clusters, e.g. `7/10`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The wave being changed or soaked, of all waves, e.g. `2/4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_wave: Option<String>,
    /// When the rollout first changed or planned anything: edits of a
    /// cluster's field by anyone else after this time are a person's own,
    /// and win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// The value of the resume annotation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resume: Option<String>,
    /// Counts by cluster state.
    #[serde(default)]
    pub counts: RolloutCounts,
    /// One entry per wave.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveStatus>,
    /// One entry per selected cluster, in rollout order; the wave each is
    /// in is fixed when the cluster is first selected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterRolloutStatus>,
}

/// How many clusters are in each state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutCounts {
    #[serde(default)]
    pub total: i32,
    #[serde(default)]
    pub pending: i32,
    #[serde(default)]
    pub in_progress: i32,
    #[serde(default)]
    pub done: i32,
    #[serde(default)]
    pub failed: i32,
    #[serde(default)]
    pub skipped: i32,
}

/// One wave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    /// 1 for the canary.
    pub wave: i32,
    /// Clusters in the wave.
    pub clusters: i32,
    /// Of them done or skipped.
    #[serde(default)]
    pub finished: i32,
    /// Pending, InProgress, Soaking or Done.
    pub state: String,
    /// While soaking: when the soak ends and the next wave may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_until: Option<Time>,
}

/// Wave states.
pub mod wave_state {
    pub const PENDING: &str = "Pending";
    pub const IN_PROGRESS: &str = "InProgress";
    pub const SOAKING: &str = "Soaking";
    pub const DONE: &str = "Done";
}

/// One cluster in a rollout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRolloutStatus {
    /// `namespace/name` of the EtcdCluster.
    pub name: String,
    /// The wave it is in (1 is the canary).
    pub wave: i32,
    /// Pending, InProgress, Done, Failed or Skipped.
    pub state: String,
    /// Why it is in this state, CamelCase (`Converged`, `AlreadyMatched`,
    /// `VersionRefused`, `Degraded`, `ProgressDeadlineExceeded`,
    /// `EditedByPerson`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What a person reads: what happened, and for a failure what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the rollout wrote its change into the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<Time>,
    /// When the cluster converged after the change (the soak counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converged_at: Option<Time>,
    /// The cluster's version before the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_version: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_selector_takes_namespaces_labels_and_leaves_out_exclusions() {
        let selector = FleetSelector {
            namespaces: vec!["team-a".into()],
            match_labels: Some(labels(&[("tier", "gold")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "region".into(),
                operator: "NotIn".into(),
                values: Some(vec!["eu".into()]),
            }]),
            exclude: vec!["team-a/broken".into()],
        };
        let gold = labels(&[("tier", "gold")]);
        assert!(selector.selects("team-a", "shop", &gold));
        assert!(
            !selector.selects("team-b", "shop", &gold),
            "other namespace"
        );
        assert!(!selector.selects("team-a", "broken", &gold), "excluded");
        assert!(
            !selector.selects("team-a", "shop", &labels(&[])),
            "no label"
        );
        let eu = labels(&[("tier", "gold"), ("region", "eu")]);
        assert!(!selector.selects("team-a", "shop", &eu), "NotIn");
        assert!(FleetSelector::default().selects("any", "thing", &labels(&[])));
    }

    #[test]
    fn waves_after_the_canary_are_a_count_or_a_rounded_up_percentage() {
        assert_eq!(WaveSize::Count(3).of(10), 3);
        assert_eq!(WaveSize::Percent(25).of(10), 3);
        assert_eq!(WaveSize::Percent(25).of(2000), 500);
        assert_eq!(WaveSize::Percent(1).of(10), 1, "at least one");
        let resolved = RolloutStrategy::default().resolve().unwrap();
        assert_eq!(resolved.canary, 1);
        assert_eq!(resolved.wave, WaveSize::Percent(25));
        assert_eq!(resolved.max_in_flight, 1);
        assert_eq!(resolved.soak, Duration::from_secs(300));
        assert_eq!(resolved.progress_deadline, Duration::from_secs(1800));
        let bad = RolloutStrategy {
            soak: Some("soon".into()),
            ..Default::default()
        };
        assert!(bad.resolve().is_err());
    }

    #[test]
    fn a_maintenance_window_is_open_for_its_duration_after_each_start() {
        let window = MaintenanceWindow {
            schedule: "0 22 * * *".into(),
            duration: "4h".into(),
        };
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        assert_eq!(
            window.closed_until(at("2026-11-22T23:30:00Z")).unwrap(),
            None
        );
        assert_eq!(
            window.closed_until(at("2026-11-23T01:59:59Z")).unwrap(),
            None
        );
        assert_eq!(
            window.closed_until(at("2026-11-23T02:00:00Z")).unwrap(),
            Some(at("2026-11-23T22:00:00Z"))
        );
        assert_eq!(
            window.closed_until(at("2026-11-23T12:00:00Z")).unwrap(),
            Some(at("2026-11-23T22:00:00Z"))
        );
    }
}
