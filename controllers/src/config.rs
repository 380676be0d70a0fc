//! The controller's own configuration: which EtcdClusters this controller
//! owns (namespaces and a label selector), its timings, leader election, the
//! metrics address and the log format.
//!
//! Loaded from a YAML file (`run --config path`), then overridden by flags,
//! then validated into a value whose selector is already parsed. Ownership is
//! the staged-management-cluster rule: the dev, staging and prod management
//! clusters (or shards of one fleet) each reconcile only the clusters their
//! selector picks, so they never touch each other's clusters. The watch is
//! filtered by it, and [`ControllerConfig::owns`] checks it again inside the
//! reconciler (defence in depth).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::time::Duration;

use etcdfleet_api::{EtcdCluster, yaml};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

/// The default `seederImage`: this release's controller image.
pub const DEFAULT_SEEDER_IMAGE: &str = concat!("etcdfleet/controller:v", env!("CARGO_PKG_VERSION"));

/// Why a configuration cannot be used. Messages name the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: yaml::YamlError,
    },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        message: message.into(),
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format {other:?} is neither text nor json")),
        }
    }
}

/// Lease-based leader election (coordination.k8s.io/v1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElectionConfig {
    pub enabled: bool,
    pub lease_name: String,
    /// Namespace of the Lease; the controller's own namespace.
    pub lease_namespace: String,
    /// How long a lease is valid without renewal.
    pub lease_duration_seconds: u64,
    /// How often the holder renews (and a standby retries); default a third
    /// of the lease duration.
    pub renew_interval_seconds: Option<u64>,
    /// How long the holder keeps leading without a successful renewal before
    /// it stops; default two thirds of the lease duration. Shorter than the
    /// lease, so the holder has stopped before another replica may take over.
    pub renew_deadline_seconds: Option<u64>,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            enabled: false,
            lease_name: "etcdfleet-controller".into(),
            lease_namespace: "etcdfleet-system".into(),
            lease_duration_seconds: 15,
            renew_interval_seconds: None,
            renew_deadline_seconds: None,
        }
    }
}

impl LeaderElectionConfig {
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration_seconds)
    }

    /// How often the holder renews and a standby retries.
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval_seconds
            .map_or(self.lease_duration() / 3, Duration::from_secs)
    }

    /// How long the holder leads on without a successful renewal.
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline_seconds
            .map_or(self.lease_duration() * 2 / 3, Duration::from_secs)
    }

    /// The lease timings and names, when leader election is on.
    fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        // Renewal every third of the lease needs whole seconds to work with.
        if self.lease_duration_seconds < 3 {
            return Err(invalid(
                "leaderElection.leaseDurationSeconds",
                "must be at least 3 (the lease is renewed every third of it)",
            ));
        }
        let le = self;
        // The holder must stop leading before its lease can expire for
        // the others, and renew more than once before it gives up.
        if le.renew_interval().is_zero() {
            return Err(invalid(
                "leaderElection.renewIntervalSeconds",
                "must be greater than zero",
            ));
        }
        if le.renew_deadline() >= le.lease_duration() {
            return Err(invalid(
                "leaderElection.renewDeadlineSeconds",
                format!(
                    "{}s must be shorter than leaseDurationSeconds ({}s)",
                    le.renew_deadline().as_secs(),
                    le.lease_duration_seconds
                ),
            ));
        }
        if le.renew_interval() >= le.renew_deadline() {
            return Err(invalid(
                "leaderElection.renewIntervalSeconds",
                format!(
                    "{}s must be shorter than renewDeadlineSeconds ({}s)",
                    le.renew_interval().as_secs(),
                    le.renew_deadline().as_secs()
                ),
            ));
        }
        if !is_dns_subdomain(&self.lease_name) {
            return Err(invalid(
                "leaderElection.leaseName",
                format!("{:?} is not a valid object name", self.lease_name),
            ));
        }
        if !is_dns_label(&self.lease_namespace) {
            return Err(invalid(
                "leaderElection.leaseNamespace",
                format!("{:?} is not a valid namespace name", self.lease_namespace),
            ));
        }
        Ok(())
    }
}

/// The `sharding` section: N replicas of one Deployment share the fleet
/// (docs/sharding.md). Each replica holds a Lease `<leasePrefix><shard>` in
/// the leader election's namespace, with its duration and renewal, and
/// reconciles the clusters labelled `etcdfleet.dev/shard=<shard>`; the
/// leader labels clusters that have no live shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ShardingConfig {
    pub enabled: bool,
    /// This replica's shard; default the pod's name (`POD_NAME`).
    pub shard_name: Option<String>,
    pub lease_prefix: String,
}

impl Default for ShardingConfig {
    fn default() -> Self {
        ShardingConfig {
            enabled: false,
            shard_name: None,
            lease_prefix: "etcdfleet-shard-".into(),
        }
    }
}

impl ShardingConfig {
    /// This replica's shard name (`shardName`, else `POD_NAME`, else the
    /// host name and process id, lowercased).
    pub fn shard(&self) -> String {
        self.shard_name
            .clone()
            .unwrap_or_else(|| replica_identity().to_lowercase().replace('_', "-"))
    }

    /// The Lease configuration of this replica's shard.
    pub fn lease(&self, leader: &LeaderElectionConfig) -> LeaderElectionConfig {
        LeaderElectionConfig {
            enabled: true,
            lease_name: format!("{}{}", self.lease_prefix, self.shard()),
            ..leader.clone()
        }
    }

    fn validate(&self, leader: &LeaderElectionConfig) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if !leader.enabled {
            return Err(invalid(
                "sharding.enabled",
                "needs leaderElection.enabled: the leader labels the clusters of lapsed shards",
            ));
        }
        let shard = self.shard();
        if !is_dns_label(&shard) {
            return Err(invalid(
                "sharding.shardName",
                format!(
                    "{shard:?} is not a DNS label (it is a label value and part of a Lease name)"
                ),
            ));
        }
        let lease = format!("{}{shard}", self.lease_prefix);
        if self.lease_prefix.is_empty() || !is_dns_subdomain(&lease) {
            return Err(invalid(
                "sharding.leasePrefix",
                format!("{lease:?} is not a valid Lease name"),
            ));
        }
        if leader.lease_name.starts_with(&self.lease_prefix) {
            return Err(invalid(
                "sharding.leasePrefix",
                format!(
                    "the leader Lease {:?} starts with it and would count as a shard",
                    leader.lease_name
                ),
            ));
        }
        Ok(())
    }
}

/// This replica's identity: `POD_NAME` in a Deployment; otherwise the
/// host name and process id.
pub fn replica_identity() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "etcdfleet".into());
        format!("{host}_{}", std::process::id())
    })
}

/// The `tracing` section of the controller config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TracingConfig {
    /// OTLP/gRPC endpoint of a collector, e.g. `http://otel-collector:4317`.
    /// Unset: the standard `OTEL_EXPORTER_OTLP_*` environment decides.
    pub otlp_endpoint: Option<String>,
}

/// Which dialer the controller uses (`dialer:` in the controller config).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DialerKind {
    Direct,
    #[default]
    PortForward,
}

impl std::str::FromStr for DialerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "direct" => Ok(DialerKind::Direct),
            "portForward" => Ok(DialerKind::PortForward),
            other => Err(format!(
                "dialer {other:?} is neither direct nor portForward"
            )),
        }
    }
}

/// The configuration as written in the file (camelCase YAML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ControllerConfig {
    /// Namespaces whose EtcdClusters this controller owns; empty = all.
    pub namespaces: Vec<String>,
    /// Kubernetes label selector the EtcdClusters must match.
    pub label_selector: Option<String>,
    pub member_failure_grace_seconds: u64,
    pub deletion_timeout_seconds: u64,
    pub requeue_converged_seconds: u64,
    pub leader_election: LeaderElectionConfig,
    pub sharding: ShardingConfig,
    pub metrics_address: String,
    pub log_format: LogFormat,
    /// OpenTelemetry trace export (off unless an endpoint is set).
    pub tracing: TracingConfig,
    /// How etcd members are reached: `portForward` (through the workload API
    /// server, the default) or `direct` (the management network routes to
    /// workload pods).
    pub dialer: DialerKind,
    /// At most this many EtcdClusters are reconciled at once (per watched
    /// namespace), so a start or a failover does not reconcile the whole
    /// fleet at the same instant.
    pub max_concurrent_reconciles: u16,
    /// Watching every namespace: at most this many of those reconciles are
    /// of one namespace's clusters at once, so no tenant holds every slot.
    pub max_reconciles_per_namespace: u16,
    /// Triggers for one cluster arriving within this window cause one
    /// reconcile, not several.
    pub debounce_milliseconds: u64,
    /// After SIGTERM, how long in-flight reconciles may finish before the
    /// process exits anyway.
    pub shutdown_grace_seconds: u64,
    /// Image with the `etcdfleet` binary (this controller's image): the first
    /// init container of a cluster restoring from a snapshot copies the
    /// seeder from it into the member pod. Recorded per cluster when its
    /// restore is verified, so changing it moves no running cluster.
    pub seeder_image: String,
    /// A cluster whose CA expires within this many days has its CA rotated
    /// (`status.caRotation`, request `expiry-…`); 0 turns it off.
    pub ca_rotate_before_days: u64,
    /// Restore drills (docs/backups.md) running at once in this controller,
    /// across every cluster it owns.
    pub max_concurrent_drills: u16,
    /// A drill whose scratch etcd has served no read after this many
    /// seconds ends as an error (its pod not scheduled, an image not
    /// pulled) and is removed.
    pub drill_timeout_seconds: u64,
    /// What tenants' destinations may use beyond what they name: the
    /// controller's workload identity and local directories, per namespace
    /// (none by default; see `crate::tenancy`).
    pub tenancy: crate::tenancy::TenancyConfig,
    /// The parsed `label_selector`, set by [`ControllerConfig::validate`].
    #[serde(skip)]
    selector: LabelSelector,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            namespaces: Vec::new(),
            label_selector: None,
            member_failure_grace_seconds: 120,
            deletion_timeout_seconds: 600,
            requeue_converged_seconds: 60,
            leader_election: LeaderElectionConfig::default(),
            sharding: ShardingConfig::default(),
            metrics_address: "0.0.0.0:8080".into(),
            log_format: LogFormat::Text,
            tracing: Default::default(),
            dialer: DialerKind::default(),
            max_concurrent_reconciles: 16,
            max_reconciles_per_namespace: 4,
            debounce_milliseconds: 200,
            shutdown_grace_seconds: 10,
            seeder_image: DEFAULT_SEEDER_IMAGE.to_string(),
            ca_rotate_before_days: 90,
            max_concurrent_drills: 2,
            drill_timeout_seconds: 900,
            tenancy: Default::default(),
            selector: LabelSelector::default(),
        }
    }
}

/// Flag values that override the file (`None`/empty: keep the file's value).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub namespaces: Vec<String>,
    pub label_selector: Option<String>,
    pub member_failure_grace_seconds: Option<u64>,
    pub deletion_timeout_seconds: Option<u64>,
    pub requeue_converged_seconds: Option<u64>,
    pub leader_election: Option<bool>,
    pub lease_namespace: Option<String>,
    pub lease_name: Option<String>,
    pub lease_duration_seconds: Option<u64>,
    pub renew_interval_seconds: Option<u64>,
    pub renew_deadline_seconds: Option<u64>,
    pub sharding: Option<bool>,
    pub shard_name: Option<String>,
    pub shard_lease_prefix: Option<String>,
    pub metrics_address: Option<String>,
    pub log_format: Option<LogFormat>,
    pub max_concurrent_reconciles: Option<u16>,
    pub max_reconciles_per_namespace: Option<u16>,
    pub debounce_milliseconds: Option<u64>,
    pub shutdown_grace_seconds: Option<u64>,
    pub dialer: Option<DialerKind>,
    pub otlp_endpoint: Option<String>,
    pub seeder_image: Option<String>,
    pub ca_rotate_before_days: Option<u64>,
    pub max_concurrent_drills: Option<u16>,
    pub drill_timeout_seconds: Option<u64>,
    pub tenancy: crate::tenancy::TenancyOverrides,
}

impl ControllerConfig {
    /// Parses and validates a YAML document (`source` names it in errors):
    /// the configuration itself, or a ConfigMap manifest carrying it under
    /// `data."config.yaml"` (as kustomize generates it from the plain file),
    /// so either form of the shipped file works with `run --config`.
    pub fn from_yaml(yaml: &str, source: &str) -> Result<Self, ConfigError> {
        let parse_error = |source_err| ConfigError::Parse {
            path: source.to_string(),
            source: source_err,
        };
        let doc = yaml::value(yaml).map_err(parse_error)?;
        if doc.get("kind").and_then(|k| k.as_str()) == Some("ConfigMap") {
            let Some(inner) = doc
                .get("data")
                .and_then(|d| d.get("config.yaml"))
                .and_then(|c| c.as_str())
            else {
                return Err(invalid(
                    "data.config.yaml",
                    format!("{source} is a ConfigMap without a config.yaml entry"),
                ));
            };
            return Self::from_yaml(inner, &format!("{source} (data.config.yaml)"));
        }
        // An empty file is the default configuration.
        let config: ControllerConfig = if doc.is_null() {
            ControllerConfig::default()
        } else {
            yaml::from_value(doc).map_err(parse_error)?
        };
        config.validate()
    }

    /// Loads the file (or the defaults without one), applies the flags, validates.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Self, ConfigError> {
        let config = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                Self::from_yaml(&text, &p.display().to_string())?
            }
            None => ControllerConfig::default(),
        };
        config.with_overrides(overrides).validate()
    }

    /// Applies flag values over the file's.
    pub fn with_overrides(mut self, o: Overrides) -> Self {
        if !o.namespaces.is_empty() {
            self.namespaces = o.namespaces;
        }
        if let Some(s) = o.label_selector {
            self.label_selector = Some(s).filter(|s| !s.trim().is_empty());
        }
        if let Some(v) = o.member_failure_grace_seconds {
            self.member_failure_grace_seconds = v;
        }
        if let Some(v) = o.deletion_timeout_seconds {
            self.deletion_timeout_seconds = v;
        }
        if let Some(v) = o.requeue_converged_seconds {
            self.requeue_converged_seconds = v;
        }
        if let Some(v) = o.leader_election {
            self.leader_election.enabled = v;
        }
        if let Some(v) = o.lease_namespace {
            self.leader_election.lease_namespace = v;
        }
        if let Some(v) = o.lease_name {
            self.leader_election.lease_name = v;
        }
        if let Some(v) = o.lease_duration_seconds {
            self.leader_election.lease_duration_seconds = v;
        }
        if let Some(v) = o.renew_interval_seconds {
            self.leader_election.renew_interval_seconds = Some(v);
        }
        if let Some(v) = o.renew_deadline_seconds {
            self.leader_election.renew_deadline_seconds = Some(v);
        }
        if let Some(v) = o.sharding {
            self.sharding.enabled = v;
        }
        if let Some(v) = o.shard_name {
            self.sharding.shard_name = Some(v);
        }
        if let Some(v) = o.shard_lease_prefix {
            self.sharding.lease_prefix = v;
        }
        if let Some(v) = o.metrics_address {
            self.metrics_address = v;
        }
        if let Some(v) = o.log_format {
            self.log_format = v;
        }
        if let Some(v) = o.max_concurrent_reconciles {
            self.max_concurrent_reconciles = v;
        }
        if let Some(v) = o.max_reconciles_per_namespace {
            self.max_reconciles_per_namespace = v;
        }
        if let Some(v) = o.debounce_milliseconds {
            self.debounce_milliseconds = v;
        }
        if let Some(v) = o.shutdown_grace_seconds {
            self.shutdown_grace_seconds = v;
        }
        if let Some(v) = o.dialer {
            self.dialer = v;
        }
        if let Some(v) = o.otlp_endpoint {
            self.tracing.otlp_endpoint = Some(v);
        }
        if let Some(v) = o.ca_rotate_before_days {
            self.ca_rotate_before_days = v;
        }
        if let Some(v) = o.seeder_image {
            self.seeder_image = v;
        }
        if let Some(v) = o.max_concurrent_drills {
            self.max_concurrent_drills = v;
        }
        if let Some(v) = o.drill_timeout_seconds {
            self.drill_timeout_seconds = v;
        }
        o.tenancy.apply(&mut self.tenancy);
        self
    }

    /// Checks every field and parses the selector.
    pub fn validate(mut self) -> Result<Self, ConfigError> {
        if self.seeder_image.trim().is_empty() || self.seeder_image.contains(char::is_whitespace) {
            return Err(invalid(
                "seederImage",
                format!("{:?} is not an image reference", self.seeder_image),
            ));
        }
        for (field, value) in [
            (
                "memberFailureGraceSeconds",
                self.member_failure_grace_seconds,
            ),
            ("deletionTimeoutSeconds", self.deletion_timeout_seconds),
            ("requeueConvergedSeconds", self.requeue_converged_seconds),
            (
                "leaderElection.leaseDurationSeconds",
                self.leader_election.lease_duration_seconds,
            ),
            (
                "maxConcurrentReconciles",
                u64::from(self.max_concurrent_reconciles),
            ),
            (
                "maxReconcilesPerNamespace",
                u64::from(self.max_reconciles_per_namespace),
            ),
            ("shutdownGraceSeconds", self.shutdown_grace_seconds),
            ("maxConcurrentDrills", u64::from(self.max_concurrent_drills)),
            ("drillTimeoutSeconds", self.drill_timeout_seconds),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be greater than zero"));
            }
        }
        self.leader_election.validate()?;
        self.sharding.validate(&self.leader_election)?;
        if let Some((field, message)) = self.tenancy.invalid() {
            return Err(invalid(field, message));
        }
        let mut seen = BTreeSet::new();
        for ns in &self.namespaces {
            if !is_dns_label(ns) {
                return Err(invalid(
                    "namespaces",
                    format!("{ns:?} is not a valid namespace name"),
                ));
            }
            if !seen.insert(ns) {
                return Err(invalid("namespaces", format!("{ns:?} is listed twice")));
            }
        }
        self.selector = match &self.label_selector {
            Some(s) => LabelSelector::parse(s).map_err(|e| invalid("labelSelector", e))?,
            None => LabelSelector::default(),
        };
        if self
            .metrics_address
            .parse::<std::net::SocketAddr>()
            .is_err()
        {
            return Err(invalid(
                "metricsAddress",
                format!(
                    "{:?} is not an address such as 0.0.0.0:8080",
                    self.metrics_address
                ),
            ));
        }
        Ok(self)
    }

    /// The parsed label selector (everything matches without one).
    pub fn selector(&self) -> &LabelSelector {
        &self.selector
    }

    /// Whether this controller owns the cluster: its namespace is one of the
    /// configured ones (or none are configured) and its labels match the selector.
    pub fn owns(&self, cluster: &EtcdCluster) -> bool {
        let ns_ok = self.namespaces.is_empty()
            || cluster
                .namespace()
                .is_some_and(|ns| self.namespaces.contains(&ns));
        ns_ok && self.selector.matches(cluster.labels())
    }

    /// Whether this controller reconciles a fleet rollout: its label
    /// selector takes the rollout's labels, as for clusters (a rollout is
    /// cluster-scoped; the clusters it writes are still only this
    /// controller's own, see [`Self::owns`]).
    pub fn owns_rollout(&self, rollout: &etcdfleet_api::EtcdFleetRollout) -> bool {
        self.selector.matches(rollout.labels())
    }

    /// Why the cluster is not owned (for `Outcome::Blocked` and logs).
    pub fn describe_scope(&self) -> String {
        let ns = if self.namespaces.is_empty() {
            "all namespaces".to_string()
        } else {
            format!("namespaces {}", self.namespaces.join(", "))
        };
        match &self.label_selector {
            Some(s) => format!("{ns}, labels {s:?}"),
            None => ns,
        }
    }
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            // As in Kubernetes: `k!=v` and `k notin (...)` match objects without `k`.
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
        match self {
            Requirement::Equals(k, v) => write!(f, "{k}={v}"),
            Requirement::NotEquals(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, vs) => write!(f, "{k} in ({})", set(vs)),
            Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", set(vs)),
            Requirement::Exists(k) => write!(f, "{k}"),
            Requirement::DoesNotExist(k) => write!(f, "!{k}"),
        }
    }
}

/// A parsed Kubernetes label selector: comma-joined requirements, all of which
/// must hold. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(|r| r.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

impl LabelSelector {
    /// Parses `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`,
    /// joined by commas.
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(input)? {
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("{input:?}: empty requirement (stray comma?)"));
            }
            requirements.push(parse_requirement(part).map_err(|e| format!("{part:?}: {e}"))?);
        }
        Ok(LabelSelector { requirements })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(input: &str) -> Result<Vec<&str>, String> {
    if input.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("{input:?}: unbalanced ')'"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{input:?}: unbalanced '('"));
    }
    parts.push(&input[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok(Requirement::DoesNotExist(key.to_string()));
    }
    if let Some((k, v)) = part.split_once("!=") {
        let (k, v) = (k.trim(), v.trim());
        check_key(k)?;
        check_value(v)?;
        return Ok(Requirement::NotEquals(k.into(), v.into()));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        let (k, v) = (k.trim(), v.trim());
        check_key(k)?;
        check_value(v)?;
        return Ok(Requirement::Equals(k.into(), v.into()));
    }
    if let Some(open) = part.find('(') {
        let head = part[..open].trim();
        let Some(inner) = part[open + 1..].trim_end().strip_suffix(')') else {
            return Err("a set must end with ')'".into());
        };
        let mut words = head.split_whitespace();
        let (Some(key), Some(op), None) = (words.next(), words.next(), words.next()) else {
            return Err("expected `key in (values)` or `key notin (values)`".into());
        };
        check_key(key)?;
        let mut values = BTreeSet::new();
        for v in inner.split(',') {
            let v = v.trim();
            check_value(v)?;
            values.insert(v.to_string());
        }
        if values.is_empty() || inner.trim().is_empty() {
            return Err("a set needs at least one value".into());
        }
        return match op {
            "in" => Ok(Requirement::In(key.into(), values)),
            "notin" => Ok(Requirement::NotIn(key.into(), values)),
            other => Err(format!("unknown operator {other:?}; expected in or notin")),
        };
    }
    check_key(part)?;
    Ok(Requirement::Exists(part.to_string()))
}

/// A label key: `[prefix/]name`, prefix a DNS subdomain, name up to 63
/// characters of alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(format!("label key prefix {p:?} is not a DNS subdomain"));
    }
    if !is_label_name(name) || name.is_empty() {
        return Err(format!(
            "{key:?} is not a valid label key (up to 63 alphanumerics, '-', '_', '.', \
             starting and ending alphanumeric, with an optional DNS prefix and '/')"
        ));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a valid label value (up to 63 alphanumerics, '-', '_', '.', \
             starting and ending alphanumeric)"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.first()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.last()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdcluster::ReconcilerSettings;
    use etcdfleet_api::EtcdClusterSpec;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn cluster(ns: &str, pairs: &[(&str, &str)]) -> EtcdCluster {
        let mut c = EtcdCluster::new("c", EtcdClusterSpec::default());
        c.metadata.namespace = Some(ns.into());
        c.metadata.labels = Some(labels(pairs));
        c
    }

    #[test]
    fn defaults_from_empty_file() {
        let c = ControllerConfig::from_yaml("", "config.yaml").unwrap();
        assert!(c.namespaces.is_empty());
        assert_eq!(c.metrics_address, "0.0.0.0:8080");
        assert_eq!(c.log_format, LogFormat::Text);
        assert!(!c.leader_election.enabled);
        assert_eq!(c.member_failure_grace_seconds, 120);
        assert!(c.selector().is_empty());
    }

    #[test]
    fn parses_full_file() {
        let yaml = r#"
namespaces: [team-a, team-b]
labelSelector: "etcdfleet.dev/stage=prod,tier in (gold, silver),!legacy"
memberFailureGraceSeconds: 300
deletionTimeoutSeconds: 900
requeueConvergedSeconds: 30
leaderElection:
  enabled: true
  leaseName: etcdfleet-prod
  leaseNamespace: etcdfleet-system
  leaseDurationSeconds: 30
metricsAddress: 127.0.0.1:9090
logFormat: json
"#;
        let c = ControllerConfig::from_yaml(yaml, "config.yaml").unwrap();
        assert_eq!(c.namespaces, vec!["team-a", "team-b"]);
        assert_eq!(c.selector().requirements.len(), 3);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.leader_election.lease_duration(), Duration::from_secs(30));
        let s = ReconcilerSettings::from_config(&c);
        assert_eq!(s.member_failure_grace, Duration::from_secs(300));
        assert_eq!(s.deletion_timeout, Duration::from_secs(900));
        assert_eq!(s.requeue_converged, Duration::from_secs(30));
    }

    #[test]
    fn a_configmap_manifest_is_read_through_its_config_entry() {
        let manifest = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: etcdfleet-config}
data:
  config.yaml: |
    namespaces: [team-a]
    maxConcurrentReconciles: 4
"#;
        let c = ControllerConfig::from_yaml(manifest, "cm.yaml").unwrap();
        assert_eq!(c.namespaces, vec!["team-a"]);
        assert_eq!(c.max_concurrent_reconciles, 4);
        let err = ControllerConfig::from_yaml("kind: ConfigMap\ndata: {other: x}\n", "cm.yaml")
            .unwrap_err();
        assert!(err.to_string().starts_with("data.config.yaml"), "{err}");
        let err = ControllerConfig::from_yaml(
            "kind: ConfigMap\ndata:\n  config.yaml: 'namespacs: []'\n",
            "cm.yaml",
        )
        .unwrap_err();
        assert!(err.to_string().contains("namespacs"), "{err}");
    }

    #[test]
    fn a_parse_error_names_the_file_and_the_field() {
        let err = ControllerConfig::from_yaml(
            "leaderElection:\n  enabled: true\n  leaseDurationSeconds: ten\n",
            "config.yaml",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "parsing config.yaml: leaderElection.leaseDurationSeconds: invalid type: string \"ten\", expected u64"
        );
        let err = ControllerConfig::from_yaml("namespaces: [a]\nnamespaces: [b]\n", "config.yaml")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "parsing config.yaml: duplicate mapping key: namespaces at line 2, column 1"
        );
    }

    #[test]
    fn renew_timings_must_fit_inside_the_lease() {
        let ok = ControllerConfig::from_yaml(
            "leaderElection: {enabled: true, leaseDurationSeconds: 3}",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(ok.leader_election.renew_interval(), Duration::from_secs(1));
        assert_eq!(ok.leader_election.renew_deadline(), Duration::from_secs(2));
        for (yaml, field) in [
            (
                "leaderElection: {enabled: true, leaseDurationSeconds: 10, renewDeadlineSeconds: 10}",
                "leaderElection.renewDeadlineSeconds",
            ),
            (
                "leaderElection: {enabled: true, leaseDurationSeconds: 10, renewIntervalSeconds: 7}",
                "leaderElection.renewIntervalSeconds",
            ),
            (
                "leaderElection: {enabled: true, renewIntervalSeconds: 0}",
                "leaderElection.renewIntervalSeconds",
            ),
            ("maxConcurrentReconciles: 0", "maxConcurrentReconciles"),
            ("shutdownGraceSeconds: 0", "shutdownGraceSeconds"),
        ] {
            let err = ControllerConfig::from_yaml(yaml, "c.yaml").unwrap_err();
            assert!(
                err.to_string().starts_with(field),
                "{yaml}: {err} should name {field}"
            );
        }
    }

    #[test]
    fn sharding_needs_leader_election_and_names_that_fit_a_label_and_a_lease() {
        let ok = ControllerConfig::from_yaml(
            "leaderElection: {enabled: true}\nsharding: {enabled: true, shardName: etcdfleet-7d9-x2}",
            "c.yaml",
        )
        .unwrap();
        let lease = ok.sharding.lease(&ok.leader_election);
        assert_eq!(lease.lease_name, "etcdfleet-shard-etcdfleet-7d9-x2");
        assert_eq!(lease.lease_duration_seconds, 15);
        for (yaml, field) in [
            (
                "sharding: {enabled: true, shardName: a}",
                "sharding.enabled",
            ),
            (
                "leaderElection: {enabled: true}\nsharding: {enabled: true, shardName: Not_A_Label}",
                "sharding.shardName",
            ),
            (
                "leaderElection: {enabled: true}\nsharding: {enabled: true, shardName: a, leasePrefix: etcdfleet-}",
                "sharding.leasePrefix",
            ),
            (
                "leaderElection: {enabled: true}\nsharding: {enabled: true, shardName: a, leasePrefix: \"\"}",
                "sharding.leasePrefix",
            ),
        ] {
            let err = ControllerConfig::from_yaml(yaml, "c.yaml").unwrap_err();
            assert!(
                err.to_string().starts_with(field),
                "{yaml}: {err} should name {field}"
            );
        }
        // Off, nothing about it is checked.
        ControllerConfig::from_yaml("sharding: {shardName: Not_A_Label}", "c.yaml").unwrap();
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = ControllerConfig::from_yaml("labelSelectr: a=b\n", "c.yaml").unwrap_err();
        assert!(err.to_string().contains("labelSelectr"), "{err}");
    }

    #[test]
    fn zero_durations_are_rejected_by_name() {
        for (yaml, field) in [
            ("memberFailureGraceSeconds: 0", "memberFailureGraceSeconds"),
            ("deletionTimeoutSeconds: 0", "deletionTimeoutSeconds"),
            ("requeueConvergedSeconds: 0", "requeueConvergedSeconds"),
            (
                "leaderElection: {leaseDurationSeconds: 0}",
                "leaderElection.leaseDurationSeconds",
            ),
        ] {
            let err = ControllerConfig::from_yaml(yaml, "c.yaml").unwrap_err();
            assert!(
                err.to_string().starts_with(field),
                "{yaml}: {err} should name {field}"
            );
        }
    }

    #[test]
    fn bad_values_are_rejected_by_name() {
        for (yaml, field) in [
            ("labelSelector: 'stage in (dev'", "labelSelector"),
            ("labelSelector: 'stage=d ev'", "labelSelector"),
            ("labelSelector: 'a=b,,c=d'", "labelSelector"),
            ("labelSelector: '-bad=x'", "labelSelector"),
            ("labelSelector: 'stage within (a)'", "labelSelector"),
            ("metricsAddress: localhost", "metricsAddress"),
            ("namespaces: [Team_A]", "namespaces"),
            ("namespaces: [a, a]", "namespaces"),
            (
                "leaderElection: {enabled: true, leaseDurationSeconds: 2}",
                "leaderElection.leaseDurationSeconds",
            ),
            (
                "tenancy: {workloadIdentityNamespaces: [Team_A]}",
                "tenancy.workloadIdentityNamespaces",
            ),
            (
                "tenancy: {localDestinationNamespaces: ['']}",
                "tenancy.localDestinationNamespaces",
            ),
        ] {
            let err = ControllerConfig::from_yaml(yaml, "c.yaml").unwrap_err();
            assert!(
                err.to_string().starts_with(field),
                "{yaml}: {err} should name {field}"
            );
        }
    }

    #[test]
    fn the_ca_rotation_window_comes_from_file_and_flag_and_zero_turns_it_off() {
        let default = ReconcilerSettings::from_config(&ControllerConfig::default());
        assert_eq!(
            default.ca_rotate_before,
            Some(Duration::from_secs(90 * 86400))
        );
        let file = ControllerConfig::from_yaml("caRotateBeforeDays: 0\n", "c.yaml").unwrap();
        assert_eq!(
            ReconcilerSettings::from_config(&file).ca_rotate_before,
            None
        );
        let flagged = file.with_overrides(Overrides {
            ca_rotate_before_days: Some(30),
            ..Overrides::default()
        });
        assert_eq!(
            ReconcilerSettings::from_config(&flagged).ca_rotate_before,
            Some(Duration::from_secs(30 * 86400))
        );
    }

    #[test]
    fn flags_override_the_file() {
        let file = ControllerConfig::from_yaml(
            "namespaces: [a]\nlabelSelector: stage=dev\nlogFormat: text\n",
            "c.yaml",
        )
        .unwrap();
        let c = file
            .with_overrides(Overrides {
                namespaces: vec!["b".into()],
                label_selector: Some("stage=prod".into()),
                leader_election: Some(true),
                log_format: Some(LogFormat::Json),
                metrics_address: Some("127.0.0.1:1".into()),
                lease_name: Some("etcdfleet-b".into()),
                lease_duration_seconds: Some(9),
                renew_interval_seconds: Some(2),
                renew_deadline_seconds: Some(6),
                max_concurrent_reconciles: Some(3),
                debounce_milliseconds: Some(0),
                shutdown_grace_seconds: Some(4),
                seeder_image: Some("registry.example/etcdfleet:v9".into()),
                ..Overrides::default()
            })
            .validate()
            .unwrap();
        assert_eq!(c.seeder_image, "registry.example/etcdfleet:v9");
        assert_eq!(
            ReconcilerSettings::from_config(&c).seeder_image,
            "registry.example/etcdfleet:v9"
        );
        assert!(
            ControllerConfig::from_yaml("seederImage: ''\n", "c.yaml")
                .and_then(ControllerConfig::validate)
                .is_err_and(|e| e.to_string().contains("seederImage"))
        );
        assert_eq!(c.namespaces, vec!["b"]);
        assert_eq!(c.label_selector.as_deref(), Some("stage=prod"));
        assert!(c.leader_election.enabled);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.leader_election.lease_name, "etcdfleet-b");
        assert_eq!(c.leader_election.lease_duration(), Duration::from_secs(9));
        assert_eq!(c.leader_election.renew_interval(), Duration::from_secs(2));
        assert_eq!(c.leader_election.renew_deadline(), Duration::from_secs(6));
        assert_eq!(c.max_concurrent_reconciles, 3);
        assert_eq!(c.debounce_milliseconds, 0);
        assert_eq!(c.shutdown_grace_seconds, 4);
        assert!(c.owns(&cluster("b", &[("stage", "prod")])));
        assert!(!c.owns(&cluster("b", &[("stage", "dev")])));
    }

    #[test]
    fn selector_operators() {
        let l = labels(&[("etcdfleet.dev/stage", "prod"), ("tier", "gold")]);
        let yes = [
            "",
            "etcdfleet.dev/stage=prod",
            "etcdfleet.dev/stage==prod",
            "etcdfleet.dev/stage!=dev",
            "etcdfleet.dev/stage in (staging, prod)",
            "etcdfleet.dev/stage notin (dev,staging)",
            "tier",
            "!legacy",
            "missing!=x",
            "missing notin (x)",
            "tier=gold, etcdfleet.dev/stage in (prod)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
        let no = [
            "etcdfleet.dev/stage=dev",
            "etcdfleet.dev/stage!=prod",
            "etcdfleet.dev/stage in (dev,staging)",
            "etcdfleet.dev/stage notin (prod)",
            "legacy",
            "!tier",
            "missing in (x)",
            "tier=gold,etcdfleet.dev/stage=dev",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&l), "{s}");
        }
    }

    #[test]
    fn selector_round_trips_through_display() {
        let s = LabelSelector::parse("a=b,c!=d,e in (g,f),h notin (i),j,!k").unwrap();
        assert_eq!(s.to_string(), "a=b,c!=d,e in (f,g),h notin (i),j,!k");
        assert_eq!(LabelSelector::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn owns_checks_namespace_and_labels() {
        let c = ControllerConfig::from_yaml(
            "namespaces: [team-a]\nlabelSelector: etcdfleet.dev/stage=prod\n",
            "c.yaml",
        )
        .unwrap();
        assert!(c.owns(&cluster("team-a", &[("etcdfleet.dev/stage", "prod")])));
        assert!(!c.owns(&cluster("team-b", &[("etcdfleet.dev/stage", "prod")])));
        assert!(!c.owns(&cluster("team-a", &[("etcdfleet.dev/stage", "dev")])));
        assert!(!c.owns(&cluster("team-a", &[])));
        let all = ControllerConfig::default().validate().unwrap();
        assert!(all.owns(&cluster("anything", &[])));
    }
}
