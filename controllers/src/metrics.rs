//! Prometheus metrics of the controller: reconciles, failures by reason,
//! reconcile and step durations, steps by kind and outcome, planner answers,
//! and clusters by condition; per cluster: each condition (status and
//! reason), voting and healthy members, certificate expiry; backups: age of
//! the newest successful backup (read back from the EtcdBackups' status
//! after a restart), its size, backup durations and failures. Exposed as
//! text on `/metrics`.

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
struct ClusterConditionLabels {
    cluster: String,
    condition: String,
    status: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    cluster: String,
    certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    rollout: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutStateLabels {
    rollout: String,
    state: String,
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

/// A condition as the metrics keep it: type, status, reason.
type SeenCondition = (String, String, String);

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
    /// Each cluster's conditions.
    cluster_conditions: Mutex<HashMap<String, Vec<SeenCondition>>>,
    cluster_condition: Family<ClusterConditionLabels, Gauge>,
    cluster_voters: Family<ClusterLabels, Gauge>,
    cluster_healthy_voters: Family<ClusterLabels, Gauge>,
    certificate_expiry: Family<CertificateLabels, Gauge>,
    backup_age: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    backup_last_success: Mutex<HashMap<String, std::time::SystemTime>>,
    backup_size: Family<ClusterLabels, Gauge>,
    backup_duration: Histogram,
    backup_failures: Family<ClusterReasonLabels, Counter>,
    /// The failure reasons counted per cluster, so a deleted cluster's
    /// series can be dropped.
    backup_failure_reasons: Mutex<HashMap<String, std::collections::BTreeSet<String>>>,
    rollout_plan_duration: Histogram,
    rollout_writes: Family<RolloutLabels, Counter>,
    rollout_clusters: Family<RolloutStateLabels, Gauge>,
    /// 1 for the phase of a cluster's CA rotation, 0 for its other phases.
    ca_rotation_phase: Family<ClusterPhaseLabels, Gauge>,
    /// The phases with a series, per cluster (to drop them with it).
    ca_rotation_phases: Mutex<HashMap<String, Vec<String>>>,
    /// Recoveries from a lost quorum started, per cluster.
    quorum_loss_recoveries: Family<ClusterLabels, Counter>,
    drills: DrillSeries,
    shards: ShardSeries,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The counter of recoveries from a lost quorum, by cluster.
fn recoveries_family(r: &mut Registry) -> Family<ClusterLabels, Counter> {
    registered(
        r,
        "quorum_loss_recoveries",
        "Recoveries from a permanent loss of quorum started (spec.recovery), by cluster",
        Family::default(),
    )
}

/// A planner answer as the `plan` label of the plans counter names it (the
/// planner's answer implements it, so metrics imports no reconciler).
pub trait PlanLabel {
    fn plan_label(&self) -> &'static str;
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("etcdfleet");
        let reconciles = registered(
            &mut r,
            "reconciles",
            "Reconciles of EtcdClusters",
            Counter::default(),
        );
        let failures = registered(
            &mut r,
            "reconcile_failures",
            "Failed reconciles by reason",
            Family::<ReasonLabels, Counter>::default(),
        );
        let reconcile_duration = registered(
            &mut r,
            "reconcile_duration_seconds",
            "Duration of one reconcile",
            Histogram::new(exponential_buckets(0.005, 2.0, 14)),
        );
        let steps = registered(
            &mut r,
            "steps",
            "Steps taken, by kind and outcome",
            Family::<StepLabels, Counter>::default(),
        );
        let step_duration = registered(
            &mut r,
            "step_duration_seconds",
            "Duration of one step, by kind",
            Family::<StepKindLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
        );
        let plans = registered(
            &mut r,
            "plans",
            "Planner answers (act, wait, converged)",
            Family::<PlanLabels, Counter>::default(),
        );
        let clusters = registered(
            &mut r,
            "clusters",
            "EtcdClusters by condition and status",
            Family::<ConditionLabels, Gauge>::default(),
        );
        let cluster_condition = registered(
            &mut r,
            "cluster_condition",
            "1 for each condition of each EtcdCluster (namespace/name), with its status and reason",
            Family::default(),
        );
        let cluster_voters = registered(
            &mut r,
            "cluster_voters",
            "Voting members observed in etcd, by cluster",
            Family::default(),
        );
        let cluster_healthy_voters = registered(
            &mut r,
            "cluster_healthy_voters",
            "Voting members that answer a linearizable read, by cluster",
            Family::default(),
        );
        let certificate_expiry = registered(
            &mut r,
            "certificate_expiry_timestamp_seconds",
            "When a cluster's certificate expires (Unix seconds): ca, or the controller's client certificate",
            Family::default(),
        );
        let ca_rotation_phase = registered(
            &mut r,
            "ca_rotation_phase",
            "Phase of the last CA rotation, by cluster: 1 for the current phase, 0 for the others",
            Family::default(),
        );
        let quorum_loss_recoveries = recoveries_family(&mut r);
        let BackupSeries {
            backup_age,
            backup_size,
            backup_duration,
            backup_failures,
        } = BackupSeries::register(&mut r);
        let RolloutSeries {
            rollout_plan_duration,
            rollout_writes,
            rollout_clusters,
        } = RolloutSeries::register(&mut r);
        let drills = DrillSeries::register(&mut r);
        let shards = ShardSeries::register(&mut r);
        Metrics {
            drills,
            shards,
            registry: r,
            ca_rotation_phase,
            ca_rotation_phases: Mutex::new(HashMap::new()),
            quorum_loss_recoveries,
            reconciles,
            failures,
            reconcile_duration,
            steps,
            step_duration,
            plans,
            clusters,
            cluster_conditions: Mutex::new(HashMap::new()),
            cluster_condition,
            cluster_voters,
            cluster_healthy_voters,
            certificate_expiry,
            backup_age,
            backup_last_success: Mutex::new(HashMap::new()),
            backup_size,
            backup_duration,
            backup_failures,
            backup_failure_reasons: Mutex::new(HashMap::new()),
            rollout_plan_duration,
            rollout_writes,
            rollout_clusters,
        }
    }

    /// How many clusters this replica's shard holds, and how many shards
    /// it sees live (sharded mode).
    pub fn set_shard(&self, clusters: usize, live: usize) {
        self.shards.clusters.set(clusters as i64);
        self.shards.live.set(live as i64);
    }

    /// This replica wrote a cluster's shard label, by the rule that moved it.
    pub fn count_shard_move(&self, rule: &str) {
        self.shards
            .moves
            .get_or_create(&ReasonLabels {
                reason: rule.to_string(),
            })
            .inc();
    }

    /// One rollout planning pass took `took`.
    pub fn observe_rollout_plan(&self, took: Duration) {
        self.rollout_plan_duration.observe(took.as_secs_f64());
    }

    /// A rollout wrote one cluster.
    pub fn count_rollout_write(&self, rollout: &str) {
        self.rollout_writes
            .get_or_create(&RolloutLabels {
                rollout: rollout.to_string(),
            })
            .inc();
    }

    /// How many clusters of a rollout are in each state.
    pub fn set_rollout_clusters(&self, rollout: &str, states: &[(&str, i32)]) {
        for (state, n) in states {
            self.rollout_clusters
                .get_or_create(&RolloutStateLabels {
                    rollout: rollout.to_string(),
                    state: state.to_string(),
                })
                .set(i64::from(*n));
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
        let new: Option<Vec<SeenCondition>> = conditions.map(|c| {
            c.iter()
                .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
                .collect()
        });
        let old = all.get(cluster);
        if old == new.as_ref() {
            return;
        }
        // Counted per change, not recounted over every cluster: a fleet's
        // reconciles would otherwise cost O(clusters) each.
        for (condition, status, reason) in old.into_iter().flatten() {
            self.cluster_condition
                .remove(&cluster_condition(cluster, condition, status, reason));
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
        for (condition, status, reason) in new.iter().flatten() {
            self.cluster_condition
                .get_or_create(&cluster_condition(cluster, condition, status, reason))
                .set(1);
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

    /// The voting and healthy voting members of one cluster, as its status says.
    pub fn set_cluster_members(&self, cluster: &str, voters: i32, healthy: i32) {
        let labels = cluster_labels(cluster);
        self.cluster_voters
            .get_or_create(&labels)
            .set(i64::from(voters));
        self.cluster_healthy_voters
            .get_or_create(&labels)
            .set(i64::from(healthy));
    }

    /// When `certificate` (`ca`, `client`) of `cluster` expires, in Unix
    /// seconds; `None` drops the series (no TLS, or no certificate yet).
    pub fn set_certificate_expiry(&self, cluster: &str, certificate: &str, at: Option<i64>) {
        let labels = CertificateLabels {
            cluster: cluster.to_string(),
            certificate: certificate.to_string(),
        };
        match at {
            Some(at) => {
                self.certificate_expiry.get_or_create(&labels).set(at);
            }
            None => {
                self.certificate_expiry.remove(&labels);
            }
        }
    }

    /// A successful backup of `cluster` recorded in an EtcdBackup's status
    /// (read on every reconcile of it, so also after a restart or a
    /// failover): the newest one sets the age and size.
    pub fn observe_backup_recorded(
        &self,
        cluster: &str,
        completed: std::time::SystemTime,
        size_bytes: Option<i64>,
    ) {
        let mut last = self
            .backup_last_success
            .lock()
            .expect("metrics lock poisoned");
        if last.get(cluster).is_some_and(|at| *at >= completed) {
            return;
        }
        last.insert(cluster.to_string(), completed);
        if let Some(size) = size_bytes {
            self.backup_size
                .get_or_create(&cluster_labels(cluster))
                .set(size);
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

    /// The last finished restore drill of `cluster`: `restorable` (1 the
    /// backup restored to what it recorded, 0 it did not; no series after
    /// a drill that could not run), how long the restore took, and when.
    pub fn observe_drill(
        &self,
        cluster: &str,
        restorable: Option<bool>,
        restore: Option<Duration>,
        completed: std::time::SystemTime,
    ) {
        let labels = cluster_labels(cluster);
        if let Some(ok) = restorable {
            self.drills
                .restorable
                .get_or_create(&labels)
                .set(i64::from(ok));
        }
        if let Some(took) = restore {
            self.drills
                .duration
                .get_or_create(&labels)
                .set(took.as_secs_f64());
        }
        let at = completed
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.drills.completed.get_or_create(&labels).set(at);
    }

    /// Counts a recovery from a lost quorum started on `cluster`.
    pub fn observe_recovery_started(&self, cluster: &str) {
        self.quorum_loss_recoveries
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_string(),
            })
            .inc();
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
        self.cluster_voters.remove(&labels);
        self.cluster_healthy_voters.remove(&labels);
        self.quorum_loss_recoveries.remove(&labels);
        self.drills.restorable.remove(&labels);
        self.drills.duration.remove(&labels);
        self.drills.completed.remove(&labels);
        for certificate in ["ca", "client"] {
            self.set_certificate_expiry(cluster, certificate, None);
        }
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
        // Ages are computed when scraped, so they grow between backups. Only
        // clusters this replica reconciles have series: an EtcdBackup left
        // from a deleted cluster must not raise "backup too old" forever.
        let known = self
            .cluster_conditions
            .lock()
            .expect("metrics lock poisoned");
        for (cluster, at) in self
            .backup_last_success
            .lock()
            .expect("metrics lock poisoned")
            .iter()
        {
            let labels = cluster_labels(cluster);
            if known.contains_key(cluster) {
                let age = at.elapsed().unwrap_or_default().as_secs_f64();
                self.backup_age.get_or_create(&labels).set(age);
            } else {
                self.backup_age.remove(&labels);
                self.backup_size.remove(&labels);
            }
        }
        drop(known);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The backup series, registered together.
struct BackupSeries {
    backup_age: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    backup_size: Family<ClusterLabels, Gauge>,
    backup_duration: Histogram,
    backup_failures: Family<ClusterReasonLabels, Counter>,
}

impl BackupSeries {
    fn register(r: &mut Registry) -> Self {
        let backup_age = registered(
            r,
            "backup_age_seconds",
            "Age of the newest successful backup, by cluster (namespace/name)",
            Family::default(),
        );
        let backup_size = registered(
            r,
            "backup_size_bytes",
            "Size of the newest successful backup, by cluster",
            Family::default(),
        );
        let backup_duration = registered(
            r,
            "backup_duration_seconds",
            "Duration of a successful backup (stream, upload, verification)",
            Histogram::new(exponential_buckets(0.1, 2.0, 14)),
        );
        let backup_failures = registered(
            r,
            "backup_failures",
            "Failed backup attempts, by cluster and reason",
            Family::default(),
        );
        BackupSeries {
            backup_age,
            backup_size,
            backup_duration,
            backup_failures,
        }
    }
}

/// The restore drill series, registered together.
struct DrillSeries {
    restorable: Family<ClusterLabels, Gauge>,
    duration: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    completed: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl DrillSeries {
    fn register(r: &mut Registry) -> Self {
        DrillSeries {
            restorable: registered(
                r,
                "backup_restorable",
                "1 when the last restore drill of the cluster's backups restored what the backup \
                 recorded, 0 when it did not",
                Family::default(),
            ),
            duration: registered(
                r,
                "backup_drill_duration_seconds",
                "How long the last drill's restore took, from the start of the download to the \
                 first read served, by cluster",
                Family::default(),
            ),
            completed: registered(
                r,
                "backup_drill_completed_timestamp_seconds",
                "When the last restore drill of the cluster's backups finished (Unix seconds)",
                Family::default(),
            ),
        }
    }
}

/// The sharded mode's series (docs/sharding.md), registered together.
struct ShardSeries {
    clusters: Gauge,
    live: Gauge,
    moves: Family<ReasonLabels, Counter>,
}

impl ShardSeries {
    fn register(r: &mut Registry) -> Self {
        ShardSeries {
            clusters: registered(
                r,
                "shard_clusters",
                "EtcdClusters labelled with this replica's shard (sharded mode)",
                Gauge::default(),
            ),
            live: registered(
                r,
                "shard_live",
                "Shards whose Lease this replica sees live (sharded mode)",
                Gauge::default(),
            ),
            moves: registered(
                r,
                "shard_moves",
                "Shard labels this replica wrote, by the rule that moved the cluster \
                 (ReleaseToItsOwner, AssignUnlabelled, AssignFromLapsedShard)",
                Family::default(),
            ),
        }
    }
}

/// The fleet rollout series, registered together.
struct RolloutSeries {
    rollout_plan_duration: Histogram,
    rollout_writes: Family<RolloutLabels, Counter>,
    rollout_clusters: Family<RolloutStateLabels, Gauge>,
}

impl RolloutSeries {
    fn register(r: &mut Registry) -> Self {
        let rollout_plan_duration = registered(
            r,
            "rollout_plan_duration_seconds",
            "Duration of one rollout planning pass (pure, over the cached clusters)",
            Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
        );
        let rollout_writes = registered(
            r,
            "rollout_cluster_writes",
            "EtcdClusters written by a fleet rollout, by rollout",
            Family::default(),
        );
        let rollout_clusters = registered(
            r,
            "rollout_clusters",
            "Clusters of a fleet rollout by state (Pending, InProgress, Done, Failed, Skipped)",
            Family::default(),
        );
        RolloutSeries {
            rollout_plan_duration,
            rollout_writes,
            rollout_clusters,
        }
    }
}

/// Registers `metric` under `name` and returns it (a handle to the same series).
fn registered<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

fn cluster_labels(cluster: &str) -> ClusterLabels {
    ClusterLabels {
        cluster: cluster.to_string(),
    }
}

fn cluster_condition(
    cluster: &str,
    condition: &str,
    status: &str,
    reason: &str,
) -> ClusterConditionLabels {
    ClusterConditionLabels {
        cluster: cluster.to_string(),
        condition: condition.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
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
        m.set_cluster_conditions("a/kept", Some(&[condition("Available", "True")]));
        m.set_cluster_members("a/gone", 3, 3);
        m.set_certificate_expiry("a/gone", "ca", Some(2_000_000_000));
        m.observe_backup_success("a/kept", 2048, Duration::from_secs(1));
        assert!(m.encode().contains("cluster=\"a/gone\""));
        m.forget_cluster("a/gone");
        let text = m.encode();
        assert!(!text.contains("a/gone"), "{text}");
        assert!(text.contains("cluster=\"a/kept\""), "{text}");
    }

    #[test]
    fn each_cluster_has_its_own_condition_series_with_the_reason() {
        let m = Metrics::new();
        let mut degraded = condition("Degraded", "True");
        degraded.reason = "AlarmNOSPACE".into();
        m.set_cluster_conditions("a/x", Some(&[condition("Available", "True"), degraded]));
        m.set_cluster_conditions("a/y", Some(&[condition("Available", "False")]));
        let text = m.encode();
        for want in [
            r#"etcdfleet_cluster_condition{cluster="a/x",condition="Available",status="True",reason="R"} 1"#,
            r#"etcdfleet_cluster_condition{cluster="a/x",condition="Degraded",status="True",reason="AlarmNOSPACE"} 1"#,
            r#"etcdfleet_cluster_condition{cluster="a/y",condition="Available",status="False",reason="R"} 1"#,
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        // A change replaces the cluster's series; the old one goes.
        m.set_cluster_conditions("a/x", Some(&[condition("Available", "False")]));
        let text = m.encode();
        assert!(!text.contains("AlarmNOSPACE"), "{text}");
        assert!(
            text.contains(r#"etcdfleet_cluster_condition{cluster="a/x",condition="Available",status="False",reason="R"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"cluster="a/x",condition="Available",status="True""#),
            "{text}"
        );
    }

    #[test]
    fn members_and_certificate_expiry_are_per_cluster_gauges() {
        let m = Metrics::new();
        m.set_cluster_members("a/x", 3, 2);
        m.set_certificate_expiry("a/x", "ca", Some(2_000_000_000));
        m.set_certificate_expiry("a/x", "client", Some(1_900_000_000));
        let text = m.encode();
        for want in [
            r#"etcdfleet_cluster_voters{cluster="a/x"} 3"#,
            r#"etcdfleet_cluster_healthy_voters{cluster="a/x"} 2"#,
            r#"etcdfleet_certificate_expiry_timestamp_seconds{cluster="a/x",certificate="ca"} 2000000000"#,
            r#"etcdfleet_certificate_expiry_timestamp_seconds{cluster="a/x",certificate="client"} 1900000000"#,
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        m.set_certificate_expiry("a/x", "client", None);
        assert!(!m.encode().contains(r#"certificate="client""#));
    }

    #[test]
    fn backup_age_comes_back_from_status_after_a_restart() {
        // A new process: nothing taken here, the newest EtcdBackup's status
        // is read back; an older one read later does not move the age.
        let m = Metrics::new();
        m.set_cluster_conditions("a/x", Some(&[condition("Available", "True")]));
        let now = std::time::SystemTime::now();
        let day = Duration::from_secs(86_400);
        m.observe_backup_recorded("a/x", now - day, Some(4096));
        m.observe_backup_recorded("a/x", now - 3 * day, Some(1));
        let text = m.encode();
        let age: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(r#"etcdfleet_backup_age_seconds{cluster="a/x"} "#))
            .unwrap_or_else(|| panic!("no backup age in {text}"))
            .parse()
            .unwrap();
        assert!((86_400.0..86_500.0).contains(&age), "age {age}");
        assert!(
            text.contains(r#"etcdfleet_backup_size_bytes{cluster="a/x"} 4096"#),
            "{text}"
        );
        // Backups of a cluster this replica does not reconcile (deleted,
        // or another stage's) have no series.
        m.observe_backup_recorded("a/deleted", now, Some(1));
        assert!(!m.encode().contains("a/deleted"));
    }
}
