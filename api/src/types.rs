//! Custom resource types: `EtcdCluster`, `EtcdTemplate`, `ClusterEtcdTemplate`.
//!
//! `EtcdConfig` is the set of fields a template can default. `EtcdCluster.spec`
//! embeds it (flattened) next to the cluster-only fields (which workload cluster,
//! which template, paused), so the three kinds share one vocabulary and template
//! resolution is a field-by-field merge of one type.

// kube's `printcolumn(...)` entries repeat `type_ = ...`, which clippy takes
// for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use crate::destination::{BackupSpec, DURATION_RULE, ObjectStoreDestination};

/// A quantity that is neither negative nor malformed (`500m`, `2Gi`, `1e3`;
/// not `lots`, not `-1`), as the schema of each request and limit states it:
/// a `pattern` costs nothing of the API server's CEL budget, which a rule
/// over two maps of unbounded strings exceeds a hundredfold.
pub const QUANTITY_PATTERN: &str = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// The schema of `resources`: Kubernetes' ResourceRequirements with every
/// request and limit held to [`QUANTITY_PATTERN`].
fn resources_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Option<ResourceRequirements>>();
    if let Some(properties) = schema
        .as_object_mut()
        .and_then(|o| o.get_mut("properties"))
        .and_then(|p| p.as_object_mut())
    {
        for map in ["requests", "limits"] {
            if let Some(values) = properties
                .get_mut(map)
                .and_then(|m| m.get_mut("additionalProperties"))
                .and_then(|v| v.as_object_mut())
            {
                values.insert("pattern".into(), QUANTITY_PATTERN.into());
            }
        }
    }
    schema
}

/// Settings that a template may provide and a cluster may override. Every field
/// is optional here; template resolution turns them into a `ResolvedEtcdSpec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdConfig {
    /// etcd version to run, a full semantic version `MAJOR.MINOR.PATCH` such as `3.5.1`.
    /// Changing it starts a rolling upgrade if the version policy accepts the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // RE2 as the API server evaluates it; semver forbids leading zeros.
    #[x_kube(validation = Rule::new("self.matches('^(0|[1-9][0-9]*)[.](0|[1-9][0-9]*)[.](0|[1-9][0-9]*)$')").message("version must be a full semantic version MAJOR.MINOR.PATCH, e.g. 3.5.1"))]
    // etcdfleet drives etcd 3 only (see version::SUPPORTED_MINORS for the minors).
    #[x_kube(validation = Rule::new("self.startsWith('3.')").message("version must be an etcd 3 version (3.MINOR.PATCH)"))]
    pub version: Option<String>,

    /// Number of voting etcd members: odd, from 1 to 7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 7 && self % 2 == 1").message("replicas must be odd and between 1 and 7 (1, 3, 5 or 7)"))]
    pub replicas: Option<i32>,

    /// Container image repository for etcd; the tag is derived from `version`
    /// (`<repository>:v<version>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Registry host (optional port) and lowercase path, no tag or digest.
    // The length bound keeps the rule within the API server's CEL cost
    // budget (unbounded, its estimated cost is 1.23x the budget and a real
    // API server refuses the CRD).
    #[schemars(length(max = 255))]
    #[x_kube(validation = Rule::new("self.matches('^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$')").message("imageRepository must be an image repository without tag, e.g. gcr.io/etcd-development/etcd"))]
    pub image_repository: Option<String>,

    /// Namespace in the workload cluster that holds the etcd objects (default `etcd-system`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_namespace: Option<String>,

    /// Persistent storage of each member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,

    /// Compute resources of the etcd container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Requests and limits are int-or-string in Kubernetes' schema: the
    // pattern refuses `memory: lots` and negative amounts.
    #[schemars(schema_with = "resources_schema")]
    pub resources: Option<ResourceRequirements>,

    /// Transport security for peer and client traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// Overrides applied to the etcd pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplateOverrides>,

    /// etcd server tuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdTuning>,

    /// Scheduled backups of this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,

    /// What the controller may do on its own when the cluster loses its
    /// quorum for good (default: nothing, a person decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<crate::recovery::RecoverySpec>,
}

/// Persistent volume of each member. On an `EtcdCluster` the class may
/// change and the size may only grow, neither may be removed (the rules live
/// on `EtcdClusterSpec` and in the controller, so templates stay editable:
/// editing a template never changes an existing cluster).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// StorageClass of the member PersistentVolumeClaims. On a cluster a new
    /// class moves the members to it one at a time (docs/storage.md); it
    /// cannot be removed once set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,

    /// Size of each member's volume, e.g. `8Gi`. On a cluster it may grow
    /// (each member's claim is expanded online, docs/storage.md) but never
    /// shrink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // The schema of a Quantity is int-or-string; only a rule rejects `lots`,
    // `0` and `-5Gi`.
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))").message("size must be a positive quantity such as 8Gi"))]
    pub size: Option<Quantity>,
}

/// TLS for etcd peer and client traffic. Certificates are generated by the
/// controller and kept in workload-cluster Secrets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Serve peer and client traffic over mutual TLS (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Additions to the etcd pod template. Maps merge key by key across templates;
/// lists replace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateOverrides {
    /// Extra pod labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Extra pod annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Node selector for the etcd pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations of the etcd pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Affinity of the etcd pods (default: spread members across nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// PriorityClass of the etcd pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

/// etcd server flags the platform may tune.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdTuning {
    /// `--heartbeat-interval` in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 5000").message("heartbeatIntervalMillis must be between 10 and 5000"))]
    pub heartbeat_interval_millis: Option<i32>,
    /// `--election-timeout` in milliseconds (at least five heartbeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 50 && self <= 50000").message("electionTimeoutMillis must be between 50 and 50000"))]
    pub election_timeout_millis: Option<i32>,
    /// `--quota-backend-bytes`. Wins over `quotaBackendPercentOfStorage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_backend_bytes: Option<i64>,
    /// `--quota-backend-bytes` as this percentage of `storage.size`, when
    /// `quotaBackendBytes` is not set: the quota follows the volumes when
    /// they grow, once every member's volume has the room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 95").message("quotaBackendPercentOfStorage must be between 10 and 95"))]
    pub quota_backend_percent_of_storage: Option<i32>,
    /// `--auto-compaction-retention` (periodic mode), e.g. `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // What etcd parses: a number of hours or a Go duration.
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+|([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+)$')").message("autoCompactionRetention must be a number of hours or a duration such as 1h or 30m"))]
    pub auto_compaction_retention: Option<String>,
    /// `--snapshot-count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_count: Option<i64>,
}

/// The workload cluster, Cluster-API style: its kubeconfig is in the Secret
/// `<name>-kubeconfig`, key `value`, in the EtcdCluster's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    /// Name of the workload cluster.
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("clusterRef.name must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub name: String,
}

/// A Secret key holding a kubeconfig, in the EtcdCluster's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigSecretRef {
    /// Secret name.
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("kubeconfigSecretRef.name must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub name: String,
    /// Key in the Secret's data (default `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::names::SECRET_KEY_RULE).message("kubeconfigSecretRef.key must be a Secret key: letters, digits, '-', '.' and '_'"))]
    pub key: Option<String>,
}

/// Kind of template an EtcdCluster refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum TemplateKind {
    /// A namespaced `EtcdTemplate` in the cluster's own namespace.
    EtcdTemplate,
    /// A cluster-scoped `ClusterEtcdTemplate` published by the platform team.
    ClusterEtcdTemplate,
}

/// Reference to the template that provides defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// `EtcdTemplate` (namespaced, same namespace) or `ClusterEtcdTemplate`.
    pub kind: TemplateKind,
    /// Template name.
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("templateRef.name must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub name: String,
}

/// One etcd cluster in one workload cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "etcdfleet.dev",
    version = "v1beta1",
    kind = "EtcdCluster",
    namespaced,
    status = "EtcdClusterStatus",
    shortname = "etcdc",
    category = "etcdfleet",
    doc = "An etcd cluster run by etcdfleet in a workload cluster.",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyMembers"),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.currentVersion"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    cel
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.clusterRef) != has(self.kubeconfigSecretRef)").message("exactly one of clusterRef or kubeconfigSecretRef must be set"))]
// Storage: transition rules on the spec (not on `StorageSpec`, which
// templates share) so that a value may be set the first time (by the user
// or by materialization) and changed afterwards (the controller moves the
// members to another class and grows the volumes, docs/storage.md), but
// never removed, including by removing `storage` as a whole.
#[x_kube(validation = Rule::new("!has(oldSelf.storage) || !has(oldSelf.storage.storageClassName) || (has(self.storage) && has(self.storage.storageClassName))").message("storage.storageClassName cannot be removed once set").field_path(".storage.storageClassName"))]
// Identity: which workload cluster, which namespace in it, and whether etcd
// speaks TLS decide *which* etcd this is. Moving any of them on a running
// cluster would bootstrap a second, empty etcd (or lock the controller out),
// so they are immutable once set. Setting one for the first time is allowed
// here; the controller's recorded `status.identity` refuses that too when it
// differs from what it already manages.
#[x_kube(validation = Rule::new("!has(oldSelf.workloadNamespace) || (has(self.workloadNamespace) && self.workloadNamespace == oldSelf.workloadNamespace)").message("workloadNamespace is immutable once set").field_path(".workloadNamespace"))]
#[x_kube(validation = Rule::new("!has(oldSelf.clusterRef) || (has(self.clusterRef) && self.clusterRef == oldSelf.clusterRef)").message("clusterRef is immutable once set").field_path(".clusterRef"))]
#[x_kube(validation = Rule::new("!has(oldSelf.kubeconfigSecretRef) || (has(self.kubeconfigSecretRef) && self.kubeconfigSecretRef == oldSelf.kubeconfigSecretRef)").message("kubeconfigSecretRef is immutable once set").field_path(".kubeconfigSecretRef"))]
#[x_kube(validation = Rule::new("!has(oldSelf.tls) || !has(oldSelf.tls.enabled) || (has(self.tls) && has(self.tls.enabled) && self.tls.enabled == oldSelf.tls.enabled)").message("tls.enabled is immutable once set").field_path(".tls.enabled"))]
// The size may grow (the controller grows the volumes, docs/storage.md) but
// never be removed; a shrink is refused by the controller, which compares
// the quantities (and sees a template's shrink too).
#[x_kube(validation = Rule::new("!has(oldSelf.storage) || !has(oldSelf.storage.size) || (has(self.storage) && has(self.storage.size))").message("storage.size cannot be removed once set").field_path(".storage.size"))]
// Restore and join are identity too: a running cluster cannot be told it
// came from another snapshot or another etcd, nor be given one after
// creation (a restore is honoured only at the first bootstrap, a join until
// the takeover is complete).
#[x_kube(validation = Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)").message("bootstrap is immutable: it can be set only when the EtcdCluster is created").field_path(".bootstrap"))]
pub struct EtcdClusterSpec {
    /// The workload cluster (kubeconfig Secret `<name>-kubeconfig`, key `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_ref: Option<ClusterRef>,

    /// An explicit kubeconfig Secret, instead of `clusterRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<KubeconfigSecretRef>,

    /// Template that provides the defaults for fields left empty. Used once, when
    /// the cluster is first reconciled; see `status.template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<TemplateRef>,

    /// Stop all writes to the workload cluster and to etcd; status is still reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,

    /// How the cluster starts (e.g. restored from a backup); honoured only
    /// at the first bootstrap and immutable. See `restore::BootstrapSpec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<crate::restore::BootstrapSpec>,

    /// Settings (version, replicas, storage, ...), defaulted from the template.
    #[serde(flatten)]
    pub config: EtcdConfig,
}

/// Customer-owned, namespaced defaults for EtcdClusters in the same namespace.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "etcdfleet.dev",
    version = "v1beta1",
    kind = "EtcdTemplate",
    namespaced,
    shortname = "etcdt",
    category = "etcdfleet",
    doc = "Namespaced defaults for EtcdClusters.",
    printcolumn(name = "Base", type_ = "string", json_path = ".spec.baseTemplate"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    cel
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdTemplateSpec {
    /// A `ClusterEtcdTemplate` this template builds on (its values are overridden by this one's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(crate::names::DNS_SUBDOMAIN_RULE).message("baseTemplate must be an object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    pub base_template: Option<String>,

    /// The defaults.
    #[serde(flatten)]
    pub config: EtcdConfig,
}

/// Platform-wide defaults published by the platform team.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "etcdfleet.dev",
    version = "v1beta1",
    kind = "ClusterEtcdTemplate",
    shortname = "cetcdt",
    category = "etcdfleet",
    doc = "Cluster-wide defaults for EtcdClusters, published by the platform team.",
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    cel
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterEtcdTemplateSpec {
    /// What the template is for, shown to customers choosing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,

    /// The defaults.
    #[serde(flatten)]
    pub config: EtcdConfig,
}

/// Observed state of an EtcdCluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Available, Progressing, Degraded, RemoteReachable, TemplateResolved, VersionAccepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// Voting members observed in etcd (the `/scale` subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,

    /// Voting members that are healthy.
    #[serde(default)]
    pub ready_members: i32,

    /// Label selector of the etcd pods (for the `/scale` subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// The version every member runs, as etcd reports it. While members differ
    /// (an upgrade in flight) it stays at the last version they all ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,

    /// One entry per etcd member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,

    /// The template whose values were written into this cluster's spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<AppliedTemplate>,

    /// The most recent operation the controller took, and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<OperationStatus>,

    /// The etcd this resource manages, recorded before the first write to the
    /// workload cluster. A spec that no longer matches it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<ManagedIdentity>,

    /// The snapshot this cluster was bootstrapped from (`spec.bootstrap.restore`),
    /// as verified before the first workload write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<crate::restore::RestoreRecord>,

    /// The snapshot taken before the last change of etcd minor version (an
    /// upgrade to the next minor, or an online downgrade), when the cluster
    /// has a backup destination (`spec.backup.destination`). A new cluster
    /// can be restored from it (`spec.bootstrap.restore` with its
    /// destination, `objectKey` and `sha256`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_change_snapshot: Option<VersionChangeSnapshot>,

    /// The takeover of a running etcd (`spec.bootstrap.join`): its phase,
    /// the existing members it started with, those removed, and the old
    /// objects nothing uses any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<crate::adopt::AdoptionStatus>,

    /// The `EtcdFleetRollout` whose change this cluster's spec carries, as
    /// the rollout recorded it on the cluster when it wrote the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutRecord>,

    /// The last (or current) rotation of the cluster's CA: its request, its
    /// phase and when it started and last moved on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_rotation: Option<crate::ca_rotation::CaRotationStatus>,

    /// The last (or current) recovery from a permanent loss of quorum
    /// (`spec.recovery`): its phase, the evidence each lost member was
    /// counted lost on, the member it recovered from, the revision kept
    /// and the loss window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recovery: Option<crate::recovery::RecoveryStatus>,

    /// Since when no member has answered the controller while their pods
    /// did not pass etcd's health check either (cleared as soon as one
    /// answers): how long every member has been down, for a recovery that
    /// needs each lost for `lostAfterSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_member_answers_since: Option<Time>,

    /// Failed members replaced (removed, their volumes deleted, joined
    /// again), by member, while a replacement has not cured them: a
    /// member replaced `replacement::MAX_REPLACEMENTS` times without a
    /// healthy period in between is not replaced again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub replacements: Vec<crate::replacement::ReplacementStatus>,
    /// The size every member's volume has: the smallest capacity of their
    /// claims, as last observed. What `etcdfleet plan` compares
    /// `spec.storage.size` with offline (docs/storage.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_size: Option<String>,
}

/// A fleet rollout that changed a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutRecord {
    /// The `EtcdFleetRollout`'s name.
    pub name: String,
    /// What it changed (`version 3.5.35`, `template ClusterEtcdTemplate/ha-3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<String>,
}

/// A snapshot taken, stored and verified before a change of minor version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionChangeSnapshot {
    /// The version the cluster ran.
    pub from: String,
    /// The version it was about to move to.
    pub to: String,
    /// Where the snapshot is.
    pub destination: ObjectStoreDestination,
    /// Key of the snapshot object.
    pub object_key: String,
    /// Hex SHA-256 of the object, verified against what was stored.
    pub sha256: String,
    /// Bytes of the object.
    pub size_bytes: i64,
    /// The member's revision when the snapshot started (it holds at least this).
    pub revision: i64,
    /// The member the snapshot was streamed from.
    pub member: String,
    /// When it was taken (RFC 3339).
    pub taken_at: String,
}

/// What identifies the etcd an EtcdCluster manages.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedIdentity {
    /// The kubeconfig Secret (`name/key`) that reaches the workload cluster.
    pub kubeconfig_secret: String,
    /// Namespace in the workload cluster.
    pub workload_namespace: String,
    /// Whether members speak mutual TLS.
    pub tls: bool,
}

/// One etcd member as observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Member (and pod) name.
    pub name: String,
    /// etcd member id, hexadecimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Peer URLs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_urls: Vec<String>,
    /// Client URLs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_urls: Vec<String>,
    /// etcd server version this member runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Whether this member is the raft leader.
    #[serde(default)]
    pub leader: bool,
    /// Whether this member is a non-voting learner.
    #[serde(default)]
    pub learner: bool,
    /// Whether this member answered a linearizable read in time.
    #[serde(default)]
    pub healthy: bool,
    /// Size of the backend database in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_bytes: Option<i64>,
    /// Bytes of the backend database in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_size_in_use_bytes: Option<i64>,
    /// Why the member is not healthy, if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Since when the member has been seen unhealthy without a break; a member
    /// unhealthy for longer than the failure grace period is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_since: Option<Time>,
}

/// Where the defaults of a cluster came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedTemplate {
    /// `EtcdTemplate` or `ClusterEtcdTemplate` (the one named by `templateRef`).
    pub kind: String,
    /// Template name.
    pub name: String,
    /// The template's `metadata.generation` when it was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Base `ClusterEtcdTemplate` of an `EtcdTemplate`, and its generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_generation: Option<i64>,
    /// Spec fields (JSON paths such as `spec.storage.size`) written from templates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub materialized_fields: Vec<String>,
    /// Template values a rebase did not carry into the spec, each with why
    /// (a volume size smaller than the volumes have: they never shrink).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_carried: Vec<String>,
    /// When the template values were written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<Time>,
}

/// An action taken on the cluster and its outcome.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// What was done, e.g. `AddLearner`, `PromoteLearner`, `RemoveMember`, `UpgradeMember`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The member or object acted on; for a volume record taken while a
    /// member the step before took down is still coming back, that member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `Succeeded` or `Failed`.
    pub outcome: String,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// How many times in a row this operation has failed (retries back off
    /// exponentially on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<i32>,
}
