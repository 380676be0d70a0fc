//! What one EtcdCluster reconcile runs with and answers: the settings,
//! the context shared by all reconciles, the error and the outcome.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use etcdfleet_api::EtcdCluster;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Client, ResourceExt};

use super::memo;
use super::plan::step::Step;
use crate::access::{Access, AccessError, OwnerFilter};
use crate::config::ControllerConfig;
use crate::connector::{ConnectError, WorkloadClusterConnector};
use crate::dialer::EtcdDialer;
use crate::etcd::{Deadlines, EtcdError};
use crate::metrics::Metrics;
use crate::pki::PkiError;
use crate::render::RenderProfile;

/// Finalizer that removes the workload objects when an EtcdCluster is deleted.
pub const FINALIZER: &str = "etcdfleet.dev/cleanup";

/// Tunables of the reconciler.
#[derive(Debug, Clone)]
pub struct ReconcilerSettings {
    /// How long a member may stay unhealthy before it is replaced.
    pub member_failure_grace: Duration,
    /// How long deletion keeps trying to clean an unreachable workload cluster
    /// before it gives up and releases the EtcdCluster (objects are left behind).
    pub deletion_timeout: Duration,
    /// Deadlines of etcd calls made while reconciling.
    pub etcd_deadlines: Deadlines,
    /// Requeue of a converged cluster (remote health polling), before jitter.
    pub requeue_converged: Duration,
    /// Requeue while a step is in progress or the planner waits.
    pub requeue_progress: Duration,
    /// Leaf certificates (server, peer, the controller's client identity) are
    /// reissued when they expire within this long. Leaves are valid 365 days.
    pub cert_renew_before: Duration,
    /// How long a converged cluster's kubeconfig, PKI Secret and static
    /// workload objects are trusted without reading them again (zero: read
    /// every reconcile). See [`memo`].
    pub reread_after: Duration,
    /// Default image of the restore seeder (see `ControllerConfig::seeder_image`).
    pub seeder_image: String,
    /// A CA expiring within this long is rotated on its own (`None`: never).
    pub ca_rotate_before: Option<Duration>,
    /// How long a grown volume may wait for its file system to grow while
    /// its pod runs (the kubelet grows it online when the driver can)
    /// before the member is restarted so it grows at the pod's next start.
    pub resize_restart_after: Duration,
    /// How long a member claim may stay unbound (provisioning takes
    /// seconds) before its events are read and a move to its class holds.
    pub unbound_after: Duration,
}

impl Default for ReconcilerSettings {
    /// The settings of a default controller configuration.
    fn default() -> Self {
        Self::from_config(&ControllerConfig::default())
    }
}

impl ReconcilerSettings {
    /// The settings a controller configuration gives: its timings and seeder
    /// image; the other settings are the reconciler's own.
    pub fn from_config(config: &ControllerConfig) -> Self {
        ReconcilerSettings {
            member_failure_grace: Duration::from_secs(config.member_failure_grace_seconds),
            deletion_timeout: Duration::from_secs(config.deletion_timeout_seconds),
            etcd_deadlines: Deadlines {
                connect: Duration::from_secs(3),
                request: Duration::from_secs(5),
                health: Duration::from_secs(3),
                reconfigure: Duration::from_secs(15),
                promote: Duration::from_secs(5),
                defragment: Duration::from_secs(120),
                snapshot: Duration::from_secs(600),
            },
            requeue_converged: Duration::from_secs(config.requeue_converged_seconds),
            requeue_progress: Duration::from_secs(2),
            cert_renew_before: Duration::from_secs(30 * 86400),
            reread_after: Duration::from_secs(10 * 60),
            seeder_image: config.seeder_image.clone(),
            ca_rotate_before: (config.ca_rotate_before_days > 0)
                .then(|| Duration::from_secs(config.ca_rotate_before_days * 86400)),
            resize_restart_after: Duration::from_secs(30),
            unbound_after: Duration::from_secs(60),
        }
    }
}

/// A cluster's members' last answers without a quorum, by member id.
pub type Answers = std::collections::BTreeMap<u64, Answer>;

/// A member's last answer without a quorum.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: crate::etcd::MemberStatus,
    /// The membership in its own store.
    pub members: Vec<crate::etcd::Member>,
    pub at: std::time::Instant,
    /// The UID of the claim at its ordinal when it answered: the answer
    /// speaks for the data on that volume, and for nothing once the claim
    /// is gone or another.
    pub volume: Option<String>,
}

/// Everything a reconcile needs, shared by all reconciles.
pub struct Context {
    /// The management API, the workload clusters and their etcd, events,
    /// metrics and ownership, as every reconciler reaches them (the context
    /// dereferences to it).
    pub access: Access,
    /// Converged observations, to skip re-reading static objects.
    pub memo: memo::ObservationMemo,
    /// Per cluster, how many short requeues in a row while an operation is
    /// in flight (the next one waits half as long again, up to `requeue_progress`).
    pub in_flight: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Per cluster, how many holds in a row for the same generation (each
    /// waits twice as long as the one before).
    pub held: std::sync::Mutex<std::collections::HashMap<String, (Option<i64>, u32)>>,
    pub settings: ReconcilerSettings,
    pub profile: RenderProfile,
    /// What recoveries from a lost quorum remember between reconciles.
    pub recovery: RecoveryMemory,
}

/// What recoveries from a lost quorum remember per cluster (key
/// `namespace/name`) between reconciles; forgotten when the cluster is
/// deleted.
#[derive(Default)]
pub struct RecoveryMemory {
    /// The highest revision seen while the cluster had its quorum (a
    /// recovery's loss window starts after the revision it keeps).
    pub last_revisions: std::sync::Mutex<std::collections::HashMap<String, i64>>,
    /// Without a quorum, the members' last answers (see
    /// `observe::recovery::local_view`).
    pub member_answers: std::sync::Mutex<std::collections::HashMap<String, Answers>>,
    /// Each backup's verdict (keyed by name and SHA-256), so a cluster
    /// waiting to be recovered does not read its snapshots again on every
    /// reconcile (see `crate::recovery::backup`).
    pub backup_verdicts:
        std::sync::Mutex<std::collections::HashMap<String, crate::recovery::backup::Verdicts>>,
}

impl RecoveryMemory {
    /// Forgets everything remembered of the cluster `key`.
    pub fn forget(&self, key: &str) {
        self.last_revisions
            .lock()
            .expect("revision memory")
            .remove(key);
        self.member_answers
            .lock()
            .expect("answer memory")
            .remove(key);
        (self.backup_verdicts.lock().expect("verdict memory")).remove(key);
    }
}

impl Context {
    pub fn new(
        management: Client,
        connector: WorkloadClusterConnector,
        dialer: Arc<dyn EtcdDialer>,
        settings: ReconcilerSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        Context {
            access: Access::new(
                management,
                connector,
                dialer,
                settings.etcd_deadlines,
                metrics,
            ),
            memo: memo::ObservationMemo::default(),
            in_flight: Default::default(),
            held: Default::default(),
            recovery: Default::default(),
            settings,
            profile: RenderProfile::default(),
        }
    }

    /// Ends reconciles that have not acted yet when `shutdown` is requested.
    pub fn with_shutdown(mut self, shutdown: crate::shutdown::Shutdown) -> Self {
        self.access.shutdown = shutdown;
        self
    }

    /// Restricts the reconciler to the clusters `owns` accepts.
    pub fn with_owner_filter(mut self, owns: OwnerFilter) -> Self {
        self.access.owner_filter = Some(owns);
        self
    }
}

impl Deref for Context {
    type Target = Access;
    fn deref(&self) -> &Access {
        &self.access
    }
}

impl AsRef<Access> for Context {
    fn as_ref(&self) -> &Access {
        &self.access
    }
}

/// Failures of one reconcile. Every variant has a short `reason()` used as a
/// metric label (and, where it concerns the cluster, a condition reason).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("management API: {0}")]
    ManagementApi(#[source] kube::Error),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("workload API of {server}: {source}")]
    WorkloadApi {
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("certificates: {0}")]
    Pki(#[from] PkiError),
    #[error("{0}")]
    Invalid(String),
    /// The snapshot before a change of minor version failed.
    #[error("snapshot before the version change: {message}")]
    Snapshot {
        /// The store's, etcd's or the destination's own reason.
        reason: &'static str,
        message: String,
    },
}

impl Error {
    pub fn reason(&self) -> &'static str {
        match self {
            Error::ManagementApi(_) => "ManagementAPIError",
            Error::Connect(e) => e.reason(),
            Error::WorkloadApi { .. } => "WorkloadAPIError",
            Error::Etcd(e) => e.reason(),
            Error::Pki(e) => e.reason(),
            Error::Invalid(_) => "InvalidObject",
            Error::Snapshot { reason, .. } => reason,
        }
    }
}

/// A failure to reach the cluster, under the reconciler's own reasons.
impl From<AccessError> for Error {
    fn from(e: AccessError) -> Self {
        match e {
            AccessError::ManagementApi(e) => Error::ManagementApi(e),
            AccessError::WorkloadApi { server, source } => Error::WorkloadApi { server, source },
            AccessError::Pki(e) => Error::Pki(e),
            AccessError::Invalid(message) => Error::Invalid(message),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What one reconcile did, for the test driver and the demo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The planner had nothing to do.
    Converged,
    /// The planner waits for something (the message says what).
    Waiting(String),
    /// Nothing changes until a person acts (the message says what to do);
    /// looked at again with exponential backoff.
    Held(String),
    /// A step was taken.
    Acted(Step),
    /// The step the planner chose was not taken because the cluster is paused.
    Paused(Option<String>),
    /// Nothing can be done until the input changes (bad spec, rejected version,
    /// unreachable workload cluster); the conditions say why.
    Blocked(String),
    /// Deletion finished (the finalizer was removed).
    Deleted,
    /// The controller began to stop before this reconcile acted: it ended
    /// there, having taken no step (the next controller starts over).
    Stopped,
}

impl Outcome {
    /// Nothing is under way and the cluster is next looked at on the slow
    /// poll: converged, paused, blocked on its input, or gone.
    pub fn is_at_rest(&self) -> bool {
        matches!(
            self,
            Outcome::Converged
                | Outcome::Paused(_)
                | Outcome::Blocked(_)
                | Outcome::Deleted
                | Outcome::Stopped
        )
    }

    /// Short label of the outcome (trace attribute).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Converged => "converged",
            Outcome::Waiting(_) => "waiting",
            Outcome::Held(_) => "held",
            Outcome::Acted(_) => "acted",
            Outcome::Paused(_) => "paused",
            Outcome::Blocked(_) => "blocked",
            Outcome::Deleted => "deleted",
            Outcome::Stopped => "stopped",
        }
    }
}

/// `ns/name` of a cluster.
pub fn cluster_key(cluster: &EtcdCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// Current time as a Kubernetes `Time`.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}
