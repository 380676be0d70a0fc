//! Template resolution: `ClusterEtcdTemplate ⊕ EtcdTemplate ⊕ EtcdCluster.spec`.
//!
//! This module owns how the three layers of `EtcdConfig` combine, which layer
//! each resolved field came from, the defaults of last resort, the validation
//! into a fully resolved `ResolvedEtcdSpec`, and `materialize`, which tells the
//! controller which template values to write into a cluster's own spec.
//!
//! Merge rules (later layer wins):
//! - scalars and lists (`tolerations`, `resources.claims`) replace whole;
//! - structs merge field by field, recursively (`storage`, `tls`, `etcd`,
//!   `backup`, `backup.destination`, `podTemplate`, `resources`, `affinity`);
//! - maps (`labels`, `annotations`, `nodeSelector`, `resources.requests`,
//!   `resources.limits`) merge key by key;
//! - the three parts of `affinity` (`nodeAffinity`, `podAffinity`,
//!   `podAntiAffinity`) replace whole: mixing the terms of two layers would
//!   yield a scheduling rule nobody wrote.
//!
//! The merge runs on the JSON form of `EtcdConfig`, so a field added to the type
//! takes part without code here; only maps and atomic structs are listed.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use semver::Version;
use serde_json::{Map, Value};

use crate::types::{
    BackupSpec, ClusterEtcdTemplate, EtcdClusterSpec, EtcdConfig, EtcdTemplate, EtcdTuning,
    PodTemplateOverrides, TemplateKind,
};
use crate::version::{image_for, parse_full_version};

/// Workload namespace of the etcd objects when no layer names one.
pub const DEFAULT_WORKLOAD_NAMESPACE: &str = "etcd-system";
/// Annotation that asks the controller to move a cluster onto the current
/// revision of its template. Removed by the controller once done.
pub const REBASE_ANNOTATION: &str = "etcdfleet.dev/rebase-template";
/// Member volume size when no layer names one.
pub const DEFAULT_STORAGE_SIZE: &str = "8Gi";
/// etcd's own default `--heartbeat-interval`.
pub const DEFAULT_HEARTBEAT_INTERVAL_MILLIS: i32 = 100;
/// etcd's own default `--election-timeout`.
pub const DEFAULT_ELECTION_TIMEOUT_MILLIS: i32 = 1000;
/// 2 GiB, etcd's own default `--quota-backend-bytes`.
pub const DEFAULT_QUOTA_BACKEND_BYTES: i64 = 2 * 1024 * 1024 * 1024;
/// `--snapshot-count` (etcd ≥ 3.5 default; 3.4 used 100000, which holds more
/// entries in memory for no benefit to a controller-managed cluster).
pub const DEFAULT_SNAPSHOT_COUNT: i64 = 10_000;
/// `--auto-compaction-retention` in periodic mode. etcd's default is no
/// compaction; an hour keeps the history a watcher may need to resume while
/// bounding the database (kube-apiserver, when it is the client, compacts more
/// often on its own, which this does not hinder).
pub const DEFAULT_AUTO_COMPACTION_RETENTION: &str = "1h";

/// Maps: merged key by key. Paths as they appear in `Resolution::sources`.
const MAP_PATHS: &[&str] = &[
    "spec.podTemplate.labels",
    "spec.podTemplate.annotations",
    "spec.podTemplate.nodeSelector",
    "spec.resources.requests",
    "spec.resources.limits",
];

/// Objects that replace whole rather than merge.
const ATOMIC_PATHS: &[&str] = &[
    "spec.podTemplate.affinity.nodeAffinity",
    "spec.podTemplate.affinity.podAffinity",
    "spec.podTemplate.affinity.podAntiAffinity",
];

/// The layer a resolved field came from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// The `ClusterEtcdTemplate` of that name.
    ClusterTemplate(String),
    /// The `EtcdTemplate` of that name.
    Template(String),
    /// The `EtcdCluster`'s own spec.
    Cluster,
    /// The controller's default of last resort (not written into the CR).
    Default,
}

impl Source {
    /// Whether this value came from a template (and so gets materialized).
    pub fn is_template(&self) -> bool {
        matches!(self, Source::ClusterTemplate(_) | Source::Template(_))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::ClusterTemplate(name) => write!(f, "ClusterEtcdTemplate/{name}"),
            Source::Template(name) => write!(f, "EtcdTemplate/{name}"),
            Source::Cluster => f.write_str("EtcdCluster"),
            Source::Default => f.write_str("default"),
        }
    }
}

impl fmt::Display for TemplateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TemplateKind::EtcdTemplate => "EtcdTemplate",
            TemplateKind::ClusterEtcdTemplate => "ClusterEtcdTemplate",
        })
    }
}

/// Resolved member storage.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedStorage {
    /// StorageClass; `None` uses the workload cluster's default class.
    pub class: Option<String>,
    /// Volume size of each member.
    pub size: Quantity,
}

/// Resolved etcd server flags.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedTuning {
    pub heartbeat_interval_millis: i32,
    pub election_timeout_millis: i32,
    pub quota_backend_bytes: i64,
    /// The quota is `quotaBackendPercentOfStorage` of the size (and is
    /// written into no spec: it follows the size).
    pub quota_from_storage: bool,
    pub auto_compaction_retention: String,
    pub snapshot_count: i64,
}

/// Everything needed to run a cluster, with every default applied and every
/// value validated. Rendering reads this, never the raw layers.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedEtcdSpec {
    pub version: Version,
    /// Odd, 1 to 7.
    pub replicas: i32,
    /// `<repository>:v<version>`.
    pub image: String,
    pub workload_namespace: String,
    pub storage: ResolvedStorage,
    pub resources: ResourceRequirements,
    pub tls_enabled: bool,
    pub pod: PodTemplateOverrides,
    pub tuning: ResolvedTuning,
    pub backup: Option<BackupSpec>,
    pub recovery: crate::recovery::ResolvedRecovery,
}

/// The outcome of a resolution: the resolved spec, where each field came from,
/// and the merged template values (for `materialize`).
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    pub spec: ResolvedEtcdSpec,
    /// Field path (`spec.storage.size`, `spec.podTemplate.labels['team']`) →
    /// the layer its value came from. Leaves only: maps per key, atomic
    /// objects and lists as one entry.
    pub sources: BTreeMap<String, Source>,
    /// `ClusterEtcdTemplate ⊕ EtcdTemplate`, before the cluster's own values.
    pub template_values: EtcdConfig,
}

impl Resolution {
    /// The field paths each layer supplied.
    pub fn fields_by_source(&self) -> BTreeMap<&Source, Vec<&str>> {
        let mut by_source: BTreeMap<&Source, Vec<&str>> = BTreeMap::new();
        for (path, source) in &self.sources {
            by_source.entry(source).or_default().push(path);
        }
        by_source
    }

    /// Paths whose values came from a template: what `materialize` writes,
    /// recorded in `status.template.materializedFields`.
    pub fn template_supplied_paths(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter(|(_, source)| source.is_template())
            .map(|(path, _)| path.clone())
            .collect()
    }
}

/// Why a cluster's configuration cannot be resolved. Every message starts with
/// the field path it is about.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The template named by `templateRef` (or an EtcdTemplate's base) does not exist.
    #[error("spec.templateRef: {kind} {name:?} not found")]
    TemplateNotFound { kind: TemplateKind, name: String },
    /// The templates handed to `resolve` are not the ones the cluster refers to.
    #[error("spec.templateRef: {0}")]
    TemplateMismatch(String),
    /// An EtcdTemplate's base is not the ClusterEtcdTemplate that was given.
    #[error(
        "spec.templateRef: EtcdTemplate {template:?} names base ClusterEtcdTemplate {base:?}, which was given as {given:?}"
    )]
    BaseTemplateMismatch {
        template: String,
        base: String,
        given: String,
    },
    /// No layer sets a version: there is deliberately no default.
    #[error("spec.version: no version set in the cluster or any template")]
    VersionMissing,
    /// No layer sets the member count.
    #[error("spec.replicas: no replicas set in the cluster or any template")]
    ReplicasMissing,
    /// A value is out of range or malformed.
    #[error("{path}: {message}")]
    InvalidField { path: String, message: String },
}

impl ResolveError {
    /// A stable CamelCase reason for the `TemplateResolved` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            ResolveError::TemplateNotFound { .. } => "TemplateNotFound",
            ResolveError::TemplateMismatch(_) => "TemplateMismatch",
            ResolveError::BaseTemplateMismatch { .. } => "BaseTemplateMismatch",
            ResolveError::VersionMissing => "VersionMissing",
            ResolveError::ReplicasMissing => "ReplicasMissing",
            ResolveError::InvalidField { .. } => "InvalidField",
        }
    }

    fn invalid(path: &str, message: impl Into<String>) -> Self {
        ResolveError::InvalidField {
            path: path.to_string(),
            message: message.into(),
        }
    }
}

/// Resolves a cluster's configuration from its templates and its own spec.
///
/// `template` is the `EtcdTemplate` named by `spec.templateRef` (if it names
/// one) and `cluster_template` the `ClusterEtcdTemplate` named by `templateRef`
/// or by that EtcdTemplate's `baseTemplate`. The caller fetches them; when a
/// fetch finds nothing it reports `ResolveError::TemplateNotFound` itself, or
/// passes `None` and lets this function say which one is missing.
pub fn resolve(
    cluster_template: Option<&ClusterEtcdTemplate>,
    template: Option<&EtcdTemplate>,
    cluster: &EtcdClusterSpec,
) -> Result<Resolution, ResolveError> {
    check_template_chain(cluster_template, template, cluster)?;

    let mut merged = Map::new();
    let mut sources = BTreeMap::new();
    if let Some(ct) = cluster_template {
        let source = Source::ClusterTemplate(ct.name_any());
        merge_into(
            &mut merged,
            &to_json(&ct.spec.config),
            "spec",
            &source,
            &mut sources,
        );
    }
    if let Some(t) = template {
        let source = Source::Template(t.name_any());
        merge_into(
            &mut merged,
            &to_json(&t.spec.config),
            "spec",
            &source,
            &mut sources,
        );
    }
    let template_values = from_json(merged.clone());
    merge_into(
        &mut merged,
        &to_json(&cluster.config),
        "spec",
        &Source::Cluster,
        &mut sources,
    );
    let config = from_json(merged);

    let spec = finish(config, &mut sources)?;
    Ok(Resolution {
        spec,
        sources,
        template_values,
    })
}

/// Resolves a spec on its own, ignoring `templateRef`: how a cluster whose
/// template values were materialized into its spec is resolved.
pub fn resolve_own_spec(spec: &EtcdClusterSpec) -> Result<Resolution, ResolveError> {
    let mut own = spec.clone();
    own.template_ref = None;
    resolve(None, None, &own)
}

/// The template values of the fields `spec` leaves empty: what the controller
/// server-side-applies into the cluster's own spec once, so that later template
/// edits change nothing. Defaults of last resort are not included.
pub fn materialize(spec: &EtcdClusterSpec, resolution: &Resolution) -> EtcdConfig {
    let mut out = Map::new();
    missing_from(
        &to_json(&resolution.template_values),
        &to_json(&spec.config),
        "spec",
        &mut out,
    );
    from_json(out)
}

fn check_template_chain(
    cluster_template: Option<&ClusterEtcdTemplate>,
    template: Option<&EtcdTemplate>,
    cluster: &EtcdClusterSpec,
) -> Result<(), ResolveError> {
    let given = |kind: &str, name: String| format!("{kind} {name:?} was given");
    match &cluster.template_ref {
        None => {
            if let Some(t) = template {
                return Err(ResolveError::TemplateMismatch(format!(
                    "not set, but {}",
                    given("EtcdTemplate", t.name_any())
                )));
            }
            if let Some(ct) = cluster_template {
                return Err(ResolveError::TemplateMismatch(format!(
                    "not set, but {}",
                    given("ClusterEtcdTemplate", ct.name_any())
                )));
            }
        }
        Some(r) if r.kind == TemplateKind::ClusterEtcdTemplate => {
            if let Some(t) = template {
                return Err(ResolveError::TemplateMismatch(format!(
                    "refers to ClusterEtcdTemplate {:?}, but {}",
                    r.name,
                    given("EtcdTemplate", t.name_any())
                )));
            }
            let ct = cluster_template.ok_or_else(|| ResolveError::TemplateNotFound {
                kind: TemplateKind::ClusterEtcdTemplate,
                name: r.name.clone(),
            })?;
            if ct.name_any() != r.name {
                return Err(ResolveError::TemplateMismatch(format!(
                    "refers to ClusterEtcdTemplate {:?}, but {}",
                    r.name,
                    given("ClusterEtcdTemplate", ct.name_any())
                )));
            }
        }
        Some(r) => {
            let t = template.ok_or_else(|| ResolveError::TemplateNotFound {
                kind: TemplateKind::EtcdTemplate,
                name: r.name.clone(),
            })?;
            if t.name_any() != r.name {
                return Err(ResolveError::TemplateMismatch(format!(
                    "refers to EtcdTemplate {:?}, but {}",
                    r.name,
                    given("EtcdTemplate", t.name_any())
                )));
            }
            match (&t.spec.base_template, cluster_template) {
                (None, None) => {}
                (None, Some(ct)) => {
                    return Err(ResolveError::TemplateMismatch(format!(
                        "EtcdTemplate {:?} names no base template, but {}",
                        r.name,
                        given("ClusterEtcdTemplate", ct.name_any())
                    )));
                }
                (Some(base), None) => {
                    return Err(ResolveError::TemplateNotFound {
                        kind: TemplateKind::ClusterEtcdTemplate,
                        name: base.clone(),
                    });
                }
                (Some(base), Some(ct)) if *base != ct.name_any() => {
                    return Err(ResolveError::BaseTemplateMismatch {
                        template: r.name.clone(),
                        base: base.clone(),
                        given: ct.name_any(),
                    });
                }
                (Some(_), Some(_)) => {}
            }
        }
    }
    Ok(())
}

fn to_json(config: &EtcdConfig) -> Map<String, Value> {
    match serde_json::to_value(config) {
        Ok(Value::Object(map)) => map,
        // A struct of optional fields always serializes to an object.
        _ => Map::new(),
    }
}

fn from_json(map: Map<String, Value>) -> EtcdConfig {
    // Built only from serialized EtcdConfig values, so it deserializes back.
    serde_json::from_value(Value::Object(map)).unwrap_or_default()
}

fn child_path(parent: &str, key: &str) -> String {
    if MAP_PATHS.contains(&parent) {
        format!("{parent}['{key}']")
    } else {
        format!("{parent}.{key}")
    }
}

/// Objects at these paths merge key by key; anything else replaces whole.
fn merges_by_key(path: &str, value: &Value) -> bool {
    value.is_object() && !ATOMIC_PATHS.contains(&path)
}

/// Merges `layer` over `acc`, recording the source of every leaf it sets.
fn merge_into(
    acc: &mut Map<String, Value>,
    layer: &Map<String, Value>,
    path: &str,
    source: &Source,
    sources: &mut BTreeMap<String, Source>,
) {
    for (key, value) in layer {
        if value.is_null() {
            continue;
        }
        let path = child_path(path, key);
        match (acc.get_mut(key), value) {
            (Some(Value::Object(below)), Value::Object(above)) if merges_by_key(&path, value) => {
                merge_into(below, above, &path, source, sources);
            }
            _ => {
                acc.insert(key.clone(), value.clone());
                record_leaves(value, &path, source, sources);
            }
        }
    }
}

fn record_leaves(
    value: &Value,
    path: &str,
    source: &Source,
    sources: &mut BTreeMap<String, Source>,
) {
    match value {
        Value::Object(map) if merges_by_key(path, value) => {
            for (key, child) in map {
                record_leaves(child, &child_path(path, key), source, sources);
            }
        }
        Value::Null => {}
        _ => {
            sources.insert(path.to_string(), source.clone());
        }
    }
}

/// Copies into `out` the leaves of `from` that `have` lacks.
fn missing_from(
    from: &Map<String, Value>,
    have: &Map<String, Value>,
    path: &str,
    out: &mut Map<String, Value>,
) {
    for (key, value) in from {
        if value.is_null() {
            continue;
        }
        let path = child_path(path, key);
        match (have.get(key), value) {
            (None | Some(Value::Null), _) => {
                out.insert(key.clone(), value.clone());
            }
            (Some(Value::Object(have)), Value::Object(from)) if merges_by_key(&path, value) => {
                let mut nested = Map::new();
                missing_from(from, have, &path, &mut nested);
                if !nested.is_empty() {
                    out.insert(key.clone(), Value::Object(nested));
                }
            }
            _ => {}
        }
    }
}

/// Applies defaults and validates the merged configuration.
fn finish(
    config: EtcdConfig,
    sources: &mut BTreeMap<String, Source>,
) -> Result<ResolvedEtcdSpec, ResolveError> {
    let mut default = |path: &str| {
        sources.entry(path.to_string()).or_insert(Source::Default);
    };

    let raw_version = config.version.ok_or(ResolveError::VersionMissing)?;
    let version = parse_full_version(&raw_version).ok_or_else(|| {
        ResolveError::invalid(
            "spec.version",
            format!("{raw_version:?} is not a full MAJOR.MINOR.PATCH version"),
        )
    })?;

    let replicas = config.replicas.ok_or(ResolveError::ReplicasMissing)?;
    if !(1..=7).contains(&replicas) || replicas % 2 == 0 {
        let what = if replicas % 2 == 0 {
            "is even"
        } else {
            "is out of range"
        };
        return Err(ResolveError::invalid(
            "spec.replicas",
            format!("{replicas} {what}; replicas must be odd and between 1 and 7"),
        ));
    }

    let workload_namespace = match config.workload_namespace {
        Some(ns) => {
            if !is_dns_label(&ns) {
                return Err(ResolveError::invalid(
                    "spec.workloadNamespace",
                    format!("{ns:?} is not a valid namespace name (lowercase RFC 1123 label)"),
                ));
            }
            ns
        }
        None => {
            default("spec.workloadNamespace");
            DEFAULT_WORKLOAD_NAMESPACE.to_string()
        }
    };

    let storage = config.storage.unwrap_or_default();
    let size = match storage.size {
        Some(size) if size.0.trim().is_empty() => {
            return Err(ResolveError::invalid(
                "spec.storage.size",
                "must not be empty",
            ));
        }
        Some(size) => size,
        None => {
            default("spec.storage.size");
            Quantity(DEFAULT_STORAGE_SIZE.to_string())
        }
    };

    let tls_enabled = match config.tls.and_then(|t| t.enabled) {
        Some(enabled) => enabled,
        None => {
            default("spec.tls.enabled");
            true
        }
    };

    let tuning = resolve_tuning(config.etcd.unwrap_or_default(), &size, &mut default)?;

    if let Some(backup) = &config.backup
        && backup
            .schedule
            .as_deref()
            .is_some_and(|s| !s.trim().is_empty())
        && backup.destination.is_none()
    {
        return Err(ResolveError::invalid(
            "spec.backup.destination",
            "a backup schedule is set but no destination bucket",
        ));
    }

    Ok(ResolvedEtcdSpec {
        image: image_for(config.image_repository.as_deref(), &version),
        version,
        replicas,
        workload_namespace,
        storage: ResolvedStorage {
            class: storage.storage_class_name,
            size,
        },
        resources: config.resources.unwrap_or_default(),
        tls_enabled,
        pod: config.pod_template.unwrap_or_default(),
        tuning,
        recovery: crate::recovery::RecoverySpec::resolve(config.recovery.as_ref()),
        backup: config.backup,
    })
}

fn resolve_tuning(
    t: EtcdTuning,
    size: &Quantity,
    default: &mut impl FnMut(&str),
) -> Result<ResolvedTuning, ResolveError> {
    let from_storage = match (t.quota_backend_bytes, t.quota_backend_percent_of_storage) {
        (None, Some(percent)) => Some(quota_of_storage(size, percent)?),
        _ => None,
    };
    let mut or_default = |value: Option<i64>, path: &str, fallback: i64| {
        value.unwrap_or_else(|| {
            default(path);
            fallback
        })
    };
    let heartbeat = or_default(
        t.heartbeat_interval_millis.map(i64::from),
        "spec.etcd.heartbeatIntervalMillis",
        DEFAULT_HEARTBEAT_INTERVAL_MILLIS.into(),
    );
    let election = or_default(
        t.election_timeout_millis.map(i64::from),
        "spec.etcd.electionTimeoutMillis",
        DEFAULT_ELECTION_TIMEOUT_MILLIS.into(),
    );
    let quota = or_default(
        t.quota_backend_bytes.or(from_storage),
        "spec.etcd.quotaBackendBytes",
        DEFAULT_QUOTA_BACKEND_BYTES,
    );
    let snapshot_count = or_default(
        t.snapshot_count,
        "spec.etcd.snapshotCount",
        DEFAULT_SNAPSHOT_COUNT,
    );
    let auto_compaction_retention = match t.auto_compaction_retention {
        Some(r) => r,
        None => {
            default("spec.etcd.autoCompactionRetention");
            DEFAULT_AUTO_COMPACTION_RETENTION.to_string()
        }
    };

    if heartbeat <= 0 {
        return Err(ResolveError::invalid(
            "spec.etcd.heartbeatIntervalMillis",
            format!("{heartbeat} must be positive"),
        ));
    }
    // etcd refuses to start otherwise ("--election-timeout should be at least
    // as 5 times as --heartbeat-interval").
    if election < 5 * heartbeat {
        return Err(ResolveError::invalid(
            "spec.etcd.electionTimeoutMillis",
            format!("{election} must be at least 5 times heartbeatIntervalMillis ({heartbeat})"),
        ));
    }
    if quota <= 0 {
        return Err(ResolveError::invalid(
            "spec.etcd.quotaBackendBytes",
            format!("{quota} must be positive"),
        ));
    }
    if snapshot_count <= 0 {
        return Err(ResolveError::invalid(
            "spec.etcd.snapshotCount",
            format!("{snapshot_count} must be positive"),
        ));
    }
    Ok(ResolvedTuning {
        // Both were range-checked as i32 values or are i32 defaults.
        heartbeat_interval_millis: heartbeat as i32,
        election_timeout_millis: election as i32,
        quota_backend_bytes: quota,
        quota_from_storage: from_storage.is_some(),
        auto_compaction_retention,
        snapshot_count,
    })
}

/// `percent` of the volume size, for `--quota-backend-bytes`.
fn quota_of_storage(size: &Quantity, percent: i32) -> Result<i64, ResolveError> {
    if !(10..=95).contains(&percent) {
        return Err(ResolveError::invalid(
            "spec.etcd.quotaBackendPercentOfStorage",
            format!("{percent} must be between 10 and 95"),
        ));
    }
    let bytes = crate::quantity::bytes(&size.0)
        .map_err(|e| ResolveError::invalid("spec.storage.size", e))?;
    // At most 95% of an i64: never overflows back.
    Ok((i128::from(bytes) * i128::from(percent) / 100) as i64)
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ClusterEtcdTemplateSpec, EtcdTemplateSpec};

    fn cluster_template(name: &str, yaml: &str) -> ClusterEtcdTemplate {
        let spec: ClusterEtcdTemplateSpec = crate::yaml::from_str(yaml).unwrap();
        ClusterEtcdTemplate::new(name, spec)
    }

    fn template(name: &str, yaml: &str) -> EtcdTemplate {
        let spec: EtcdTemplateSpec = crate::yaml::from_str(yaml).unwrap();
        EtcdTemplate::new(name, spec)
    }

    fn cluster(yaml: &str) -> EtcdClusterSpec {
        crate::yaml::from_str(yaml).unwrap()
    }

    const HA3: &str = r#"
version: 3.5.1
replicas: 3
imageRepository: registry.example.com/etcd
storage: {storageClassName: fast, size: 20Gi}
resources:
  requests: {cpu: 500m, memory: 1Gi}
  limits: {memory: 2Gi}
podTemplate:
  labels: {tier: platform, team: platform}
  nodeSelector: {node-role: etcd}
  tolerations: [{key: dedicated, operator: Equal, value: etcd, effect: NoSchedule}]
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: kubernetes.io/hostname
etcd: {heartbeatIntervalMillis: 200, electionTimeoutMillis: 2000}
"#;

    const CUSTOMER: &str = r#"
baseTemplate: ha-3
replicas: 5
storage: {size: 50Gi}
resources:
  limits: {cpu: "2"}
podTemplate:
  labels: {team: payments}
  tolerations: [{key: payments, operator: Exists}]
etcd: {quotaBackendBytes: 4294967296}
"#;

    fn three_layers(cluster_yaml: &str) -> Resolution {
        resolve(
            Some(&cluster_template("ha-3", HA3)),
            Some(&template("payments", CUSTOMER)),
            &cluster(cluster_yaml),
        )
        .unwrap()
    }

    const CUSTOMER_REF: &str =
        "clusterRef: {name: w1}\ntemplateRef: {kind: EtcdTemplate, name: payments}\n";

    #[test]
    fn cluster_alone_resolves_with_defaults() {
        let r = resolve(
            None,
            None,
            &cluster("clusterRef: {name: w1}\nversion: 3.5.1\nreplicas: 1\n"),
        )
        .unwrap();
        let s = &r.spec;
        assert_eq!(s.version, Version::new(3, 5, 1));
        assert_eq!(s.replicas, 1);
        assert_eq!(s.image, "gcr.io/etcd-development/etcd:v3.5.1");
        assert_eq!(s.workload_namespace, "etcd-system");
        assert_eq!(
            s.storage,
            ResolvedStorage {
                class: None,
                size: Quantity("8Gi".into())
            }
        );
        assert!(s.tls_enabled);
        assert_eq!(s.resources, ResourceRequirements::default());
        assert_eq!(
            s.tuning,
            ResolvedTuning {
                heartbeat_interval_millis: 100,
                election_timeout_millis: 1000,
                quota_backend_bytes: 2_147_483_648,
                quota_from_storage: false,
                auto_compaction_retention: "1h".into(),
                snapshot_count: 10_000,
            }
        );
        assert_eq!(s.backup, None);
        assert_eq!(r.sources["spec.version"], Source::Cluster);
        assert_eq!(r.sources["spec.replicas"], Source::Cluster);
        for path in [
            "spec.workloadNamespace",
            "spec.storage.size",
            "spec.tls.enabled",
            "spec.etcd.heartbeatIntervalMillis",
            "spec.etcd.electionTimeoutMillis",
            "spec.etcd.quotaBackendBytes",
            "spec.etcd.snapshotCount",
            "spec.etcd.autoCompactionRetention",
        ] {
            assert_eq!(r.sources[path], Source::Default, "{path}");
        }
        assert_eq!(r.template_values, EtcdConfig::default());
    }

    #[test]
    fn a_quota_in_percent_of_storage_follows_the_size_and_bytes_win() {
        let of = |extra: &str| {
            resolve(
                None,
                None,
                &cluster(&format!("version: 3.5.2\nreplicas: 3\n{extra}")),
            )
        };
        let r = of("storage: {size: 2Gi}\netcd: {quotaBackendPercentOfStorage: 80}\n").unwrap();
        assert_eq!(r.spec.tuning.quota_backend_bytes, (2 << 30) * 80 / 100);
        assert!(r.spec.tuning.quota_from_storage);
        let r = of("storage: {size: 4Gi}\netcd: {quotaBackendPercentOfStorage: 80}\n").unwrap();
        assert_eq!(r.spec.tuning.quota_backend_bytes, (4 << 30) * 80 / 100);
        // Explicit bytes win, and the quota is then pinned as before.
        let r = of("storage: {size: 2Gi}\netcd: {quotaBackendBytes: 1000000000, quotaBackendPercentOfStorage: 80}\n")
            .unwrap();
        assert_eq!(r.spec.tuning.quota_backend_bytes, 1_000_000_000);
        assert!(!r.spec.tuning.quota_from_storage);
        for (extra, why) in [
            (
                "etcd: {quotaBackendPercentOfStorage: 99}\n",
                "between 10 and 95",
            ),
            (
                "storage: {size: lots}\netcd: {quotaBackendPercentOfStorage: 50}\n",
                "is not a quantity",
            ),
        ] {
            let err = of(extra).unwrap_err().to_string();
            assert!(err.contains(why), "{extra}: {err}");
        }
    }

    #[test]
    fn three_layers_later_wins_field_by_field() {
        let r = three_layers(&format!(
            "{CUSTOMER_REF}version: 3.5.2\nstorage: {{storageClassName: local}}\n"
        ));
        let s = &r.spec;
        // Cluster over template over cluster template.
        assert_eq!(s.version, Version::new(3, 5, 2));
        assert_eq!(r.sources["spec.version"], Source::Cluster);
        assert_eq!(s.replicas, 5);
        assert_eq!(
            r.sources["spec.replicas"],
            Source::Template("payments".into())
        );
        assert_eq!(s.image, "registry.example.com/etcd:v3.5.2");
        assert_eq!(
            r.sources["spec.imageRepository"],
            Source::ClusterTemplate("ha-3".into())
        );
        // Nested struct: class from the cluster, size from the EtcdTemplate.
        assert_eq!(s.storage.class.as_deref(), Some("local"));
        assert_eq!(s.storage.size, Quantity("50Gi".into()));
        assert_eq!(r.sources["spec.storage.storageClassName"], Source::Cluster);
        assert_eq!(
            r.sources["spec.storage.size"],
            Source::Template("payments".into())
        );
        // Tuning merges field by field, defaults fill the rest.
        assert_eq!(s.tuning.heartbeat_interval_millis, 200);
        assert_eq!(s.tuning.election_timeout_millis, 2000);
        assert_eq!(s.tuning.quota_backend_bytes, 4_294_967_296);
        assert_eq!(s.tuning.snapshot_count, 10_000);
        assert_eq!(r.sources["spec.etcd.snapshotCount"], Source::Default);

        let by_source = r.fields_by_source();
        assert!(by_source[&Source::Cluster].contains(&"spec.version"));
        assert!(by_source[&Source::Template("payments".into())].contains(&"spec.replicas"));
        assert!(
            by_source[&Source::ClusterTemplate("ha-3".into())]
                .contains(&"spec.podTemplate.nodeSelector['node-role']")
        );
    }

    #[test]
    fn maps_merge_key_by_key() {
        let r = three_layers(&format!(
            "{CUSTOMER_REF}podTemplate:\n  labels: {{owner: alice}}\n"
        ));
        let labels = r.spec.pod.labels.clone().unwrap();
        assert_eq!(
            labels,
            BTreeMap::from([
                ("owner".to_string(), "alice".to_string()),
                ("team".to_string(), "payments".to_string()),
                ("tier".to_string(), "platform".to_string()),
            ])
        );
        assert_eq!(
            r.sources["spec.podTemplate.labels['owner']"],
            Source::Cluster
        );
        assert_eq!(
            r.sources["spec.podTemplate.labels['team']"],
            Source::Template("payments".into())
        );
        assert_eq!(
            r.sources["spec.podTemplate.labels['tier']"],
            Source::ClusterTemplate("ha-3".into())
        );
        assert_eq!(
            r.spec.pod.node_selector,
            Some(BTreeMap::from([(
                "node-role".to_string(),
                "etcd".to_string()
            )]))
        );
    }

    #[test]
    fn resources_merge_requests_and_limits_key_by_key() {
        let r = three_layers(&format!(
            "{CUSTOMER_REF}resources:\n  requests: {{memory: 3Gi}}\n"
        ));
        let res = &r.spec.resources;
        let q = |s: &str| Quantity(s.to_string());
        assert_eq!(
            res.requests,
            Some(BTreeMap::from([
                ("cpu".to_string(), q("500m")),
                ("memory".to_string(), q("3Gi"))
            ]))
        );
        assert_eq!(
            res.limits,
            Some(BTreeMap::from([
                ("cpu".to_string(), q("2")),
                ("memory".to_string(), q("2Gi"))
            ]))
        );
        assert_eq!(
            r.sources["spec.resources.requests['memory']"],
            Source::Cluster
        );
        assert_eq!(
            r.sources["spec.resources.requests['cpu']"],
            Source::ClusterTemplate("ha-3".into())
        );
        assert_eq!(
            r.sources["spec.resources.limits['cpu']"],
            Source::Template("payments".into())
        );
    }

    #[test]
    fn lists_and_affinity_parts_replace_whole() {
        let r = three_layers(CUSTOMER_REF);
        let tolerations = r.spec.pod.tolerations.clone().unwrap();
        assert_eq!(tolerations.len(), 1, "{tolerations:?}");
        assert_eq!(tolerations[0].key.as_deref(), Some("payments"));
        assert_eq!(
            r.sources["spec.podTemplate.tolerations"],
            Source::Template("payments".into())
        );

        // The cluster's podAntiAffinity replaces the template's as one unit.
        let r = three_layers(&format!(
            "{CUSTOMER_REF}podTemplate:\n  affinity:\n    podAntiAffinity:\n      preferredDuringSchedulingIgnoredDuringExecution:\n        - weight: 10\n          podAffinityTerm: {{topologyKey: topology.kubernetes.io/zone}}\n"
        ));
        let anti = r
            .spec
            .pod
            .affinity
            .clone()
            .unwrap()
            .pod_anti_affinity
            .unwrap();
        assert!(
            anti.required_during_scheduling_ignored_during_execution
                .is_none(),
            "{anti:?}"
        );
        assert_eq!(
            anti.preferred_during_scheduling_ignored_during_execution
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            r.sources["spec.podTemplate.affinity.podAntiAffinity"],
            Source::Cluster
        );
        assert!(
            !r.sources
                .keys()
                .any(|p| p.starts_with("spec.podTemplate.affinity.podAntiAffinity."))
        );
    }

    #[test]
    fn cluster_template_alone() {
        let ct = cluster_template("ha-3", HA3);
        let r = resolve(
            Some(&ct),
            None,
            &cluster(
                "clusterRef: {name: w1}\ntemplateRef: {kind: ClusterEtcdTemplate, name: ha-3}\n",
            ),
        )
        .unwrap();
        assert_eq!(r.spec.replicas, 3);
        assert_eq!(r.spec.version, Version::new(3, 5, 1));
        assert_eq!(r.spec.storage.class.as_deref(), Some("fast"));
        assert_eq!(r.template_values, ct.spec.config);
    }

    #[test]
    fn materialize_returns_only_template_supplied_empty_fields() {
        let spec = cluster(&format!(
            "{CUSTOMER_REF}version: 3.5.2\nstorage: {{storageClassName: local}}\npodTemplate:\n  labels: {{team: mine}}\nresources:\n  requests: {{memory: 3Gi}}\n"
        ));
        let r = resolve(
            Some(&cluster_template("ha-3", HA3)),
            Some(&template("payments", CUSTOMER)),
            &spec,
        )
        .unwrap();
        let m = materialize(&spec, &r);
        // Set by the cluster: not materialized.
        assert_eq!(m.version, None);
        assert_eq!(m.storage.as_ref().unwrap().storage_class_name, None);
        // Empty in the cluster, supplied by a template: materialized.
        assert_eq!(m.replicas, Some(5));
        assert_eq!(
            m.image_repository.as_deref(),
            Some("registry.example.com/etcd")
        );
        assert_eq!(
            m.storage.as_ref().unwrap().size,
            Some(Quantity("50Gi".into()))
        );
        let pod = m.pod_template.as_ref().unwrap();
        assert_eq!(
            pod.labels,
            Some(BTreeMap::from([(
                "tier".to_string(),
                "platform".to_string()
            )]))
        );
        assert_eq!(
            pod.tolerations.as_ref().unwrap()[0].key.as_deref(),
            Some("payments")
        );
        let res = m.resources.as_ref().unwrap();
        assert_eq!(
            res.requests,
            Some(BTreeMap::from([(
                "cpu".to_string(),
                Quantity("500m".into())
            )]))
        );
        // Defaults of last resort are not written into the CR.
        assert_eq!(m.workload_namespace, None);
        assert_eq!(m.tls, None);
        let tuning = m.etcd.as_ref().unwrap();
        assert_eq!(tuning.snapshot_count, None);
        assert_eq!(tuning.heartbeat_interval_millis, Some(200));

        // The materialized fields are exactly the template-sourced paths.
        let paths = r.template_supplied_paths();
        assert!(paths.contains(&"spec.replicas".to_string()));
        assert!(paths.contains(&"spec.podTemplate.labels['tier']".to_string()));
        assert!(!paths.contains(&"spec.version".to_string()));
        assert!(!paths.contains(&"spec.podTemplate.labels['team']".to_string()));

        // Applying the materialized values changes nothing in the resolution,
        // and a second materialize finds nothing left to write.
        let mut filled = spec.clone();
        let mut merged = to_json(&spec.config);
        merge_into(
            &mut merged,
            &to_json(&m),
            "spec",
            &Source::Cluster,
            &mut BTreeMap::new(),
        );
        filled.config = from_json(merged);
        let again = resolve(
            Some(&cluster_template("ha-3", HA3)),
            Some(&template("payments", CUSTOMER)),
            &filled,
        )
        .unwrap();
        assert_eq!(again.spec, r.spec);
        assert_eq!(materialize(&filled, &again), EtcdConfig::default());
    }

    #[test]
    fn missing_version_and_replicas() {
        let err =
            resolve(None, None, &cluster("clusterRef: {name: w}\nreplicas: 3\n")).unwrap_err();
        assert_eq!(err, ResolveError::VersionMissing);
        assert_eq!(err.reason(), "VersionMissing");
        assert_eq!(
            err.to_string(),
            "spec.version: no version set in the cluster or any template"
        );

        let err = resolve(
            None,
            None,
            &cluster("clusterRef: {name: w}\nversion: 3.5.1\n"),
        )
        .unwrap_err();
        assert_eq!(err.reason(), "ReplicasMissing");
        assert!(err.to_string().starts_with("spec.replicas: "), "{err}");
    }

    #[test]
    fn invalid_versions_name_the_field() {
        for bad in ["3.5", "latest", "v3.5.1", "3.5.1-rc.0", "3.5.1.2"] {
            let err = resolve(
                None,
                None,
                &cluster(&format!("version: '{bad}'\nreplicas: 3\n")),
            )
            .unwrap_err();
            assert_eq!(err.reason(), "InvalidField");
            assert_eq!(
                err.to_string(),
                format!("spec.version: {bad:?} is not a full MAJOR.MINOR.PATCH version")
            );
        }
    }

    #[test]
    fn replicas_must_be_odd_and_in_range() {
        for ok in [1, 3, 5, 7] {
            let r = resolve(
                None,
                None,
                &cluster(&format!("version: 3.5.1\nreplicas: {ok}\n")),
            )
            .unwrap();
            assert_eq!(r.spec.replicas, ok);
        }
        let err = resolve(None, None, &cluster("version: 3.5.1\nreplicas: 4\n")).unwrap_err();
        assert_eq!(err.reason(), "InvalidField");
        assert_eq!(
            err.to_string(),
            "spec.replicas: 4 is even; replicas must be odd and between 1 and 7"
        );
        for bad in [-1, 0, 2, 8, 9] {
            let err = resolve(
                None,
                None,
                &cluster(&format!("version: 3.5.1\nreplicas: {bad}\n")),
            )
            .unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with(&format!("spec.replicas: {bad} ")), "{msg}");
            assert!(
                msg.ends_with("replicas must be odd and between 1 and 7"),
                "{msg}"
            );
        }
        // A template's bad value is caught too, and an override fixes it.
        let ct = cluster_template("bad", "version: 3.5.1\nreplicas: 2\n");
        let r = cluster("templateRef: {kind: ClusterEtcdTemplate, name: bad}\n");
        assert!(resolve(Some(&ct), None, &r).is_err());
        let r = cluster("templateRef: {kind: ClusterEtcdTemplate, name: bad}\nreplicas: 3\n");
        assert_eq!(resolve(Some(&ct), None, &r).unwrap().spec.replicas, 3);
    }

    #[test]
    fn other_invalid_fields() {
        let cases = [
            (
                "workloadNamespace: Etcd_System\n",
                "spec.workloadNamespace: \"Etcd_System\" is not a valid namespace name",
            ),
            (
                "storage: {size: ''}\n",
                "spec.storage.size: must not be empty",
            ),
            (
                "etcd: {heartbeatIntervalMillis: 0}\n",
                "spec.etcd.heartbeatIntervalMillis: 0 must be positive",
            ),
            (
                "etcd: {heartbeatIntervalMillis: 300}\n",
                "spec.etcd.electionTimeoutMillis: 1000 must be at least 5 times heartbeatIntervalMillis (300)",
            ),
            (
                "etcd: {quotaBackendBytes: 0}\n",
                "spec.etcd.quotaBackendBytes: 0 must be positive",
            ),
            (
                "etcd: {snapshotCount: -1}\n",
                "spec.etcd.snapshotCount: -1 must be positive",
            ),
            (
                "backup: {schedule: '0 * * * *'}\n",
                "spec.backup.destination: a backup schedule is set but no destination bucket",
            ),
        ];
        for (yaml, expected) in cases {
            let err = resolve(
                None,
                None,
                &cluster(&format!("version: 3.5.1\nreplicas: 3\n{yaml}")),
            )
            .unwrap_err();
            assert_eq!(err.reason(), "InvalidField", "{yaml}");
            assert!(err.to_string().starts_with(expected), "{err} vs {expected}");
        }
    }

    #[test]
    fn template_chain_errors() {
        let ct = cluster_template("ha-3", HA3);
        let other_ct = cluster_template("ha-5", HA3);
        let t = template("payments", CUSTOMER);
        let no_base = template("payments", "replicas: 3\n");
        let to_t = cluster(CUSTOMER_REF);
        let to_ct = cluster("templateRef: {kind: ClusterEtcdTemplate, name: ha-3}\n");

        let err = ResolveError::TemplateNotFound {
            kind: TemplateKind::EtcdTemplate,
            name: "x".into(),
        };
        assert_eq!(
            err.to_string(),
            "spec.templateRef: EtcdTemplate \"x\" not found"
        );
        assert_eq!(err.reason(), "TemplateNotFound");

        // The named template was not handed over.
        let err = resolve(Some(&ct), None, &to_t).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.templateRef: EtcdTemplate \"payments\" not found"
        );
        let err = resolve(None, None, &to_ct).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.templateRef: ClusterEtcdTemplate \"ha-3\" not found"
        );
        // The EtcdTemplate's base is missing.
        let err = resolve(None, Some(&t), &to_t).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.templateRef: ClusterEtcdTemplate \"ha-3\" not found"
        );

        // The base is not the one given.
        let err = resolve(Some(&other_ct), Some(&t), &to_t).unwrap_err();
        assert_eq!(err.reason(), "BaseTemplateMismatch");
        assert_eq!(
            err.to_string(),
            "spec.templateRef: EtcdTemplate \"payments\" names base ClusterEtcdTemplate \"ha-3\", which was given as \"ha-5\""
        );

        // Templates that the cluster does not refer to.
        let mismatches = [
            (
                resolve(Some(&ct), Some(&no_base), &to_t),
                "EtcdTemplate \"payments\" names no base template, but ClusterEtcdTemplate \"ha-3\" was given",
            ),
            (
                resolve(Some(&ct), Some(&t), &to_ct),
                "refers to ClusterEtcdTemplate \"ha-3\", but EtcdTemplate \"payments\" was given",
            ),
            (
                resolve(Some(&other_ct), None, &to_ct),
                "refers to ClusterEtcdTemplate \"ha-3\", but ClusterEtcdTemplate \"ha-5\" was given",
            ),
            (
                resolve(Some(&ct), None, &cluster("version: 3.5.1\n")),
                "not set, but ClusterEtcdTemplate \"ha-3\" was given",
            ),
            (
                resolve(None, Some(&no_base), &cluster("version: 3.5.1\n")),
                "not set, but EtcdTemplate \"payments\" was given",
            ),
            (
                resolve(None, Some(&template("other", "{}")), &to_t),
                "refers to EtcdTemplate \"payments\", but EtcdTemplate \"other\" was given",
            ),
        ];
        for (result, expected) in mismatches {
            let err = result.unwrap_err();
            assert_eq!(err.reason(), "TemplateMismatch");
            assert_eq!(err.to_string(), format!("spec.templateRef: {expected}"));
        }

        // A base-less EtcdTemplate on its own is fine.
        let r = resolve(
            None,
            Some(&template("payments", "version: 3.4.23\nreplicas: 1\n")),
            &to_t,
        )
        .unwrap();
        assert_eq!(r.spec.version, Version::new(3, 4, 23));
        assert_eq!(
            r.sources["spec.version"],
            Source::Template("payments".into())
        );
    }

    #[test]
    fn source_display() {
        assert_eq!(
            Source::ClusterTemplate("ha-3".into()).to_string(),
            "ClusterEtcdTemplate/ha-3"
        );
        assert_eq!(Source::Template("t".into()).to_string(), "EtcdTemplate/t");
        assert_eq!(Source::Cluster.to_string(), "EtcdCluster");
        assert_eq!(Source::Default.to_string(), "default");
        assert!(Source::Template("t".into()).is_template());
        assert!(!Source::Default.is_template());
    }
}
