//! Prometheus metrics of the controller: reconciles, failures by reason,
//! reconcile and step durations, steps by kind and outcome, planner answers,
//! and clusters by condition; backups: age of the newest successful backup,
//! its size, backup durations and failures. Exposed as text on `/metrics`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepKindLabels {
    step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanLabels {
    plan: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterPhaseLabels {
    cluster: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterReasonLabels {
    cluster: String,
    reason: String,
}

/// The controller's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    reconciles: Counter,
    failures: Family<ReasonLabels, Counter>,
    reconcile_duration: Histogram,
    steps: Family<StepLabels, Counter>,
    step_duration: Family<StepKindLabels, Histogram>,
    plans: Family<PlanLabels, Counter>,
    clusters: Family<ConditionLabels, Gauge>,
    cluster_conditions: Mutex<HashMap<String, Vec<(String, String)>>>,
    backup_age: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    backup_last_success: Mutex<HashMap<String, std::time::SystemTime>>,
    backup_size: Family<ClusterLabels, Gauge>,
    backup_duration: Histogram,
    backup_failures: Family<ClusterReasonLabels, Counter>,
    /// The failure reasons counted per cluster, so a deleted cluster's
    /// series can be dropped.
    backup_failure_reasons: Mutex<HashMap<String, std::collections::BTreeSet<String>>>,
    /// 1 for the phase of a cluster's CA rotation, 0 for its other phases.
    ca_rotation_phase: Family<ClusterPhaseLabels, Gauge>,
    /// The phases with a series, per cluster (to drop them with it).
    ca_rotation_phases: Mutex<HashMap<String, Vec<String>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A planner answer as the `plan` label of the plans counter names it (the
/// planner's answer implements it, so metrics imports no reconciler).
pub trait PlanLabel {
    fn plan_label(&self) -> &'static str;
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("etcdfleet");
        let reconciles = Counter::default();
        let failures = Family::<ReasonLabels, Counter>::default();
        let reconcile_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let steps = Family::<StepLabels, Counter>::default();
        let step_duration = Family::<StepKindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let plans = Family::<PlanLabels, Counter>::default();
        let clusters = Family::<ConditionLabels, Gauge>::default();
        registry.register(
            "reconciles",
            "Reconciles of EtcdClusters",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed reconciles by reason",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            reconcile_duration.clone(),
        );
        registry.register("steps", "Steps taken, by kind and outcome", steps.clone());
        registry.register(
            "step_duration_seconds",
            "Duration of one step, by kind",
            step_duration.clone(),
        );
        registry.register(
            "plans",
            "Planner answers (act, wait, converged)",
            plans.clone(),
        );
        registry.register(
            "clusters",
            "EtcdClusters by condition and status",
            clusters.clone(),
        );
        let backup_age = Family::default();
        let backup_size = Family::default();
        let backup_duration = Histogram::new(exponential_buckets(0.1, 2.0, 14));
        let backup_failures = Family::default();
        registry.register(
            "backup_age_seconds",
            "Age of the newest successful backup, by cluster (namespace/name)",
            backup_age.clone(),
        );
        registry.register(
            "backup_size_bytes",
            "Size of the newest successful backup, by cluster",
            backup_size.clone(),
        );
        registry.register(
            "backup_duration_seconds",
            "Duration of a successful backup (stream, upload, verification)",
            backup_duration.clone(),
        );
        registry.register(
            "backup_failures",
            "Failed backup attempts, by cluster and reason",
            backup_failures.clone(),
        );
        let ca_rotation_phase = Family::default();
        registry.register(
            "ca_rotation_phase",
            "Phase of the last CA rotation, by cluster: 1 for the current phase, 0 for the others",
            ca_rotation_phase.clone(),
        );
        Metrics {
            registry,
            ca_rotation_phase,
            ca_rotation_phases: Mutex::new(HashMap::new()),
            reconciles,
            failures,
            reconcile_duration,
            steps,
            step_duration,
            plans,
            clusters,
            cluster_conditions: Mutex::new(HashMap::new()),
            backup_age,
            backup_last_success: Mutex::new(HashMap::new()),
            backup_size,
            backup_duration,
            backup_failures,
            backup_failure_reasons: Mutex::new(HashMap::new()),
        }
    }

    pub fn observe_reconcile(&self, took: Duration, failure: Option<&str>) {
        self.reconciles.inc();
        self.reconcile_duration.observe(took.as_secs_f64());
        if let Some(reason) = failure {
            self.failures
                .get_or_create(&ReasonLabels {
                    reason: reason.to_string(),
                })
                .inc();
        }
    }

    pub fn observe_step(&self, kind: &str, took: Duration, failure: Option<&str>) {
        self.steps
            .get_or_create(&StepLabels {
                step: kind.to_string(),
                outcome: failure.unwrap_or("ok").to_string(),
            })
            .inc();
        self.step_duration
            .get_or_create(&StepKindLabels {
                step: kind.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn observe_plan(&self, plan: &impl PlanLabel) {
        let plan = plan.plan_label();
        self.plans
            .get_or_create(&PlanLabels {
                plan: plan.to_string(),
            })
            .inc();
    }

    /// Records the phase of one cluster's CA rotation among `phases`
    /// (`None`: the cluster never rotated its CA, or is gone: no series).
    pub fn set_ca_rotation_phase(&self, cluster: &str, phases: &[&str], current: Option<&str>) {
        let mut known = self
            .ca_rotation_phases
            .lock()
            .expect("metrics lock poisoned");
        for phase in known.remove(cluster).unwrap_or_default() {
            self.ca_rotation_phase.remove(&ClusterPhaseLabels {
                cluster: cluster.to_string(),
                phase,
            });
        }
        let Some(now) = current else {
            return;
        };
        for phase in phases {
            self.ca_rotation_phase
                .get_or_create(&ClusterPhaseLabels {
                    cluster: cluster.to_string(),
                    phase: phase.to_string(),
                })
                .set(i64::from(now == *phase));
        }
        known.insert(
            cluster.into(),
            phases.iter().map(|p| p.to_string()).collect(),
        );
    }

    /// Records the conditions of one cluster (`namespace/name`); `None` forgets it.
    pub fn set_cluster_conditions(&self, cluster: &str, conditions: Option<&[Condition]>) {
        let mut all = self
            .cluster_conditions
            .lock()
            .expect("metrics lock poisoned");
        let new: Option<Vec<(String, String)>> = conditions.map(|c| {
            c.iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect()
        });
        let old = all.get(cluster);
        if old == new.as_ref() {
            return;
        }
        // Counted per change, not recounted over every cluster: a fleet's
        // reconciles would otherwise cost O(clusters) each.
        for (condition, status) in old.into_iter().flatten() {
            let labels = ConditionLabels {
                condition: condition.clone(),
                status: status.clone(),
            };
            let left = {
                let gauge = self.clusters.get_or_create(&labels);
                gauge.dec() - 1
            };
            if left <= 0 {
                self.clusters.remove(&labels);
            }
        }
        for (condition, status) in new.iter().flatten() {
            self.clusters
                .get_or_create(&ConditionLabels {
                    condition: condition.clone(),
                    status: status.clone(),
                })
                .inc();
        }
        match new {
            Some(new) => {
                all.insert(cluster.to_string(), new);
            }
            None => {
                all.remove(cluster);
            }
        }
    }

    /// A backup of `cluster` (`namespace/name`) succeeded.
    pub fn observe_backup_success(&self, cluster: &str, size_bytes: u64, took: Duration) {
        self.backup_last_success
            .lock()
            .expect("metrics lock poisoned")
            .insert(cluster.to_string(), std::time::SystemTime::now());
        self.backup_size
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_string(),
            })
            .set(size_bytes as i64);
        self.backup_duration.observe(took.as_secs_f64());
    }

    /// Drops every series of `cluster` (`namespace/name`): it was deleted.
    pub fn forget_cluster(&self, cluster: &str) {
        self.set_cluster_conditions(cluster, None);
        self.set_ca_rotation_phase(cluster, &[], None);
        self.backup_last_success
            .lock()
            .expect("metrics lock poisoned")
            .remove(cluster);
        let labels = ClusterLabels {
            cluster: cluster.to_string(),
        };
        self.backup_age.remove(&labels);
        self.backup_size.remove(&labels);
        let reasons = self
            .backup_failure_reasons
            .lock()
            .expect("metrics lock poisoned")
            .remove(cluster)
            .unwrap_or_default();
        for reason in reasons {
            self.backup_failures.remove(&ClusterReasonLabels {
                cluster: cluster.to_string(),
                reason,
            });
        }
    }

    /// A backup attempt of `cluster` failed with `reason`.
    pub fn observe_backup_failure(&self, cluster: &str, reason: &str) {
        self.backup_failure_reasons
            .lock()
            .expect("metrics lock poisoned")
            .entry(cluster.to_string())
            .or_default()
            .insert(reason.to_string());
        self.backup_failures
            .get_or_create(&ClusterReasonLabels {
                cluster: cluster.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        // Ages are computed when scraped, so they grow between backups.
        for (cluster, at) in self
            .backup_last_success
            .lock()
            .expect("metrics lock poisoned")
            .iter()
        {
            let age = at.elapsed().unwrap_or_default().as_secs_f64();
            self.backup_age
                .get_or_create(&ClusterLabels {
                    cluster: cluster.clone(),
                })
                .set(age);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdcluster::plan::{Plan, Step};

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    #[test]
    fn the_ca_rotation_phase_is_one_for_the_current_phase_and_goes_with_its_cluster() {
        let m = Metrics::new();
        m.set_ca_rotation_phase("a/x", &["Trusting", "Completed"], Some("Trusting"));
        let text = m.encode();
        assert!(
            text.contains(r#"etcdfleet_ca_rotation_phase{cluster="a/x",phase="Trusting"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"etcdfleet_ca_rotation_phase{cluster="a/x",phase="Completed"} 0"#),
            "{text}"
        );
        m.forget_cluster("a/x");
        assert!(!m.encode().contains("cluster=\"a/x\",phase"));
    }

    #[test]
    fn exposition_counts_reconciles_failures_steps_and_clusters_by_condition() {
        let m = Metrics::new();
        m.observe_reconcile(Duration::from_millis(3), None);
        m.observe_reconcile(Duration::from_millis(3), Some("WorkloadAPIUnreachable"));
        m.observe_step("AddLearner", Duration::from_millis(40), None);
        m.observe_plan(&Plan::Act(Step::AddLearner { ordinal: 1 }));
        m.observe_plan(&Plan::Converged);
        m.set_cluster_conditions("a/x", Some(&[condition("Available", "True")]));
        m.set_cluster_conditions("a/y", Some(&[condition("Available", "True")]));
        m.set_cluster_conditions("a/z", Some(&[condition("Available", "False")]));
        let text = m.encode();
        assert!(text.contains("etcdfleet_reconciles_total 2"), "{text}");
        assert!(
            text.contains(
                r#"etcdfleet_reconcile_failures_total{reason="WorkloadAPIUnreachable"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"etcdfleet_steps_total{step="AddLearner",outcome="ok"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"etcdfleet_plans_total{plan="Converged"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"etcdfleet_clusters{condition="Available",status="True"} 2"#),
            "{text}"
        );
        m.observe_backup_success("a/x", 4096, Duration::from_secs(2));
        m.observe_backup_failure("a/x", "ObjectStoreError");
        let text = m.encode();
        for want in [
            r#"etcdfleet_backup_size_bytes{cluster="a/x"} 4096"#,
            r#"etcdfleet_backup_failures_total{cluster="a/x",reason="ObjectStoreError"} 1"#,
            r#"etcdfleet_backup_age_seconds{cluster="a/x"} 0."#,
            "etcdfleet_backup_duration_seconds_count 1",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        // A deleted cluster is forgotten.
        m.set_cluster_conditions("a/y", None);
        assert!(
            m.encode()
                .contains(r#"etcdfleet_clusters{condition="Available",status="True"} 1"#)
        );
        // A change moves the cluster between series; an empty series goes.
        m.set_cluster_conditions("a/x", Some(&[condition("Available", "False")]));
        m.set_cluster_conditions("a/x", Some(&[condition("Available", "False")]));
        let text = m.encode();
        assert!(
            text.contains(r#"etcdfleet_clusters{condition="Available",status="False"} 2"#),
            "{text}"
        );
        assert!(!text.contains(r#"status="True""#), "{text}");
    }

    #[test]
    fn a_deleted_cluster_leaves_no_series_behind() {
        let m = Metrics::new();
        m.set_cluster_conditions("a/gone", Some(&[condition("Available", "True")]));
        m.observe_backup_success("a/gone", 1024, Duration::from_secs(1));
        m.observe_backup_failure("a/gone", "Unreachable");
        m.observe_backup_success("a/kept", 2048, Duration::from_secs(1));
        assert!(m.encode().contains("cluster=\"a/gone\""));
        m.forget_cluster("a/gone");
        let text = m.encode();
        assert!(!text.contains("a/gone"), "{text}");
        assert!(text.contains("cluster=\"a/kept\""), "{text}");
    }
}
