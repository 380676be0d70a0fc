//! What the planner decides from: everything observed about one etcd
//! cluster, in plain data. The observe stage fills it; the planner's rules
//! only read it.

use std::collections::{BTreeMap, BTreeSet};

use crate::etcd::{Alarm, ClusterHealth, ProbeError};
use crate::render::Names;

use super::step::{ObjectKind, Refusal};

/// The StatefulSet as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatefulSetObservation {
    pub replicas: u32,
    /// Image of the pod template.
    pub image: String,
    /// The inputs hash the pod template carries ([`crate::render::TEMPLATE_HASH`]);
    /// `None` on a StatefulSet written by a release that did not stamp it.
    pub template_hash: Option<String>,
    /// The recovery whose `force-new-cluster` init container the pod
    /// template carries, if any.
    pub forcing: Option<String>,
    /// The StatefulSet controller has seen the spec as written
    /// (`status.observedGeneration` ≥ `metadata.generation`): a pod deleted
    /// now is recreated from this template, not an older one.
    pub template_seen: bool,
    /// A delete is in progress (a finalizer holds it).
    pub deleting: bool,
}

/// How long past its grace period a deleted pod may stay before it counts as
/// stuck (its kubelet gone). A kubelet that is up confirms a pod's end
/// within seconds of its grace period.
pub const STUCK_DELETING_AFTER: std::time::Duration = std::time::Duration::from_secs(15);

/// One pod of the StatefulSet as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodObservation {
    pub image: String,
    /// The pod-template hash the pod was made from (copied from the template).
    pub template_hash: Option<String>,
    pub running: bool,
    pub ready: bool,
    pub restart_count: i32,
    pub deleting: bool,
    /// Deleted, and still there [`STUCK_DELETING_AFTER`] past the end of its
    /// grace period (`metadata.deletionTimestamp`): no kubelet confirms its
    /// end, as when its node is stopped or cut off.
    pub stuck_deleting: bool,
    /// The pod's readiness is etcd's own health check (its template has the
    /// readiness probe; pods of older templates are ready once running).
    pub ready_means_etcd_healthy: bool,
    /// How the etcd container last ended, if it ended since the pod
    /// started, as a person reads it ("exited with code 2 (Error)…").
    /// `None` for a container that has run without ending.
    pub last_exit: Option<String>,
    /// The node the pod was scheduled to.
    pub node: Option<String>,
    /// The recovery whose `force-new-cluster` init container the pod runs
    /// (made from a forcing template), if any.
    pub forcing: Option<String>,
}

/// One member PVC as observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PvcObservation {
    /// The etcd member id whose data this volume holds, once recorded.
    pub member_id: Option<u64>,
    /// This cluster's owner is recorded on it (a PVC recorded for another
    /// owner is a conflict, never used or deleted).
    pub owner_recorded: bool,
    /// The etcd version that last ran on this data, once recorded: what a
    /// cluster recreated over kept volumes must not downgrade or skip.
    pub etcd_version: Option<String>,
    /// A delete is in progress (PVC protection holds it while a pod uses it).
    pub deleting: bool,
    /// Its size, asked for and had ([`super::storage`]).
    pub size: ClaimSize,
}

/// What etcd itself said.
#[derive(Debug, Clone, PartialEq)]
pub enum EtcdObservation {
    /// No member answered.
    Unreachable(String),
    Observed(ClusterHealth),
}

/// Everything the planner decides from.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub names: Names,
    pub tls: bool,
    pub desired_replicas: u32,
    /// Workload objects missing or whose inputs changed (from the render contract).
    pub stale_objects: Vec<ObjectKind>,
    /// The members ConfigMap announces members that may start from it
    /// (bootstrap's `new`, a join's `existing`): a member whose volume is
    /// empty would start from it, so it is closed once no member needs it.
    pub members_announced: bool,
    pub statefulset: Option<StatefulSetObservation>,
    pub pods: BTreeMap<u32, PodObservation>,
    pub pvcs: BTreeMap<u32, PvcObservation>,
    pub etcd: EtcdObservation,
    /// Members unhealthy for longer than the failure grace period.
    pub failed_members: BTreeSet<u64>,
    /// Members unhealthy for longer than [`READY_POD_GRACE_FACTOR`] grace
    /// periods: a member whose pod the kubelet reports ready is replaced only
    /// then (the ready pod is a second vantage point, but a weak one: the
    /// kubelet's check is not etcd's quorum).
    pub failed_long_ago: BTreeSet<u64>,
    /// Whether each failed member may be replaced now, by member id: a
    /// replacement that did not cure it is not made again without a
    /// back-off, nor more than `replacement::MAX_REPLACEMENTS` times.
    pub replacements: BTreeMap<u64, etcdfleet_api::replacement::Replacement>,
    /// Alarms etcd has raised (NOSPACE, CORRUPT).
    pub alarms: Vec<Alarm>,
    /// Workload objects at this cluster's names that another owner (or nobody)
    /// holds. Nothing is written while any exists.
    pub conflicts: Vec<ForeignObject>,
    /// TLS is on, the management-side CA is gone, but the workload cluster
    /// still has certificates from a CA: a new CA would lock every member out.
    pub pki_lost: bool,
    /// The storage the spec asks for and the StatefulSet's claim template
    /// ([`super::storage`]).
    pub storage: StorageObservation,
    /// The version the spec asks for (`MAJOR.MINOR.PATCH`).
    pub requested_version: Option<String>,
    /// The downgrade the cluster acknowledges
    /// ([`etcdfleet_api::version::DOWNGRADE_ANNOTATION`]), if any.
    pub downgrade_acknowledged: Option<String>,
    /// What the version rules need beyond this ([`super::version`]).
    pub version: VersionObservation,
    /// Voters the stored status listed last time: a cluster that had members
    /// and now has none answering has lost quorum, it is not bootstrapping.
    pub known_voters: u32,
    /// The last step, if it failed: a step that keeps failing is retried with
    /// exponential backoff, never in a tight loop.
    pub last_failure: Option<FailedStep>,
    /// A cluster bootstrapping from a snapshot (`spec.bootstrap.restore`):
    /// whether the snapshot was verified (see [`RestoreGate`]).
    pub restore: RestoreGate,
    /// A cluster taking over a running etcd (`spec.bootstrap.join`), until
    /// the takeover is complete (see [`AdoptionObservation`]).
    pub adoption: Option<AdoptionObservation>,
    /// What a rotation of the CA decides from (see [`CaRotationObservation`]).
    pub ca_rotation: CaRotationObservation,
    /// What a recovery from a lost quorum decides from (see [`RecoveryObservation`]).
    pub recovery: RecoveryObservation,
}

/// What a recovery from a permanent loss of quorum decides from
/// (`super::recovery`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecoveryObservation {
    /// `spec.recovery`, with its defaults.
    pub policy: etcdfleet_api::recovery::ResolvedRecovery,
    /// `status.lastRecovery`: the last (or current) recovery.
    pub record: Option<etcdfleet_api::recovery::RecoveryStatus>,
    /// Members down (stored `unhealthySince`) for at least the policy's
    /// `lostAfter`, with the time they went down.
    pub down_since: BTreeMap<u64, k8s_openapi::jiff::Timestamp>,
    /// The workload cluster's Nodes (name → Ready), read only when a
    /// recovery could start; `Err`: they could not be read, and why.
    pub nodes: Option<Result<BTreeMap<String, bool>, String>>,
    /// The highest revision the controller saw while the cluster had its
    /// quorum, since the controller started.
    pub last_seen_revision: Option<i64>,
    /// Without a quorum the member list cannot be read fresh: the members
    /// as the survivor with the most applied entries lists them in its own
    /// store, each with its `Status` if it answered (lately). Read only
    /// when a recovery could start; `Err`: no member answers, and why.
    pub local_view: Option<Result<ClusterHealth, String>>,
    /// The node each member's volume is local to (ordinal → its bound
    /// PersistentVolume's required `kubernetes.io/hostname` affinity;
    /// `None`: not local to a node), read only when a recovery could
    /// start; `Err`: the PersistentVolumes could not be read, and why.
    pub pinned: Option<Result<BTreeMap<u32, Option<String>>, String>>,
    /// Under `FromBackup`, when no member answers: the voters the status
    /// lists (name, id), the membership as last seen.
    pub recorded_voters: Vec<(String, u64)>,
    /// Under `FromBackup`, when no member answers: the newest backup of the
    /// cluster that verifies, or why none does.
    pub backup: Option<Result<etcdfleet_api::recovery::RecoveryBackup, String>>,
}

/// What a rotation of the cluster's CA decides from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaRotationObservation {
    /// The rotation asked for now: the `etcdfleet.dev/rotate-ca`
    /// annotation's value, else `expiry-…` when the CA expires within the
    /// configured window; `None`: none.
    pub requested: Option<String>,
    /// The annotation says `cancel`.
    pub cancel_asked: bool,
    /// A recovery of a lost CA Secret asked for (`etcdfleet.dev/recover-ca`),
    /// as its request id (`recover-<value>`).
    pub recover_asked: Option<String>,
    /// `status.caRotation`: the last (or current) rotation.
    pub record: Option<etcdfleet_api::ca_rotation::CaRotationStatus>,
    /// The PKI Secret holds a rotation's new CA beside the current one.
    pub next_ca: bool,
    /// The PKI Secret still holds the CA a rotation replaced.
    pub previous_ca: bool,
}

/// What a cluster that takes over a running etcd knows besides etcd's own
/// answers (which include the existing members while it adopts).
#[derive(Debug, Clone, PartialEq)]
pub struct AdoptionObservation {
    /// Whether the join credentials can be used; `Err` says why not.
    pub credentials: Result<(), String>,
    /// The management-side PKI Secret exists (the existing CA was imported).
    pub ca_imported: bool,
    /// The client URLs the spec names.
    pub endpoints: Vec<String>,
    /// The version the spec asks for, as written (a rejected version change
    /// leaves the other rules at the running one; a takeover must not start
    /// at a version the spec does not ask for).
    pub spec_version: String,
    /// The existing members recorded (stored status) when the takeover
    /// started, or at the last preflight before it.
    pub recorded: BTreeSet<u64>,
    /// Existing members etcdfleet removed, each recorded before its removal.
    pub retired: BTreeSet<u64>,
    /// TLS probes of the existing members' client and peer ports, made
    /// before the takeover starts (see [`crate::etcd::probe`]).
    pub probes: Vec<TrustProbe>,
    /// Workload objects of the old members nothing uses any more, read
    /// once the last old member left.
    pub deletable: Vec<String>,
}

/// Which port of an existing member a probe asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbedPort {
    /// The client port, shown the controller's client identity.
    Client,
    /// The peer port, shown the peer certificate etcdfleet's members present.
    Peer,
}

/// One TLS probe: `Ok(asked)` when the port answered, `asked` saying
/// whether it asked for a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustProbe {
    pub url: String,
    pub port: ProbedPort,
    pub result: Result<bool, ProbeError>,
}

/// What the version rules ([`super::version`]) see beyond the rest of
/// the observation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionObservation {
    /// The change of minor the spec asks for and the policy accepted
    /// (`from` is `status.currentVersion`), if any.
    pub minor_change: Option<(semver::Version, semver::Version)>,
    /// The cluster's backup destination, as a person reads it, if it has one.
    pub backup_destination: Option<String>,
    /// `status.versionChangeSnapshot` records a snapshot for `minor_change`.
    pub snapshot_taken: bool,
    /// Member pods whose etcd runs with the v2 store enabled.
    pub v2_enabled: Vec<String>,
}

/// The snapshot check of a cluster that restores, made before its first
/// workload write.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RestoreGate {
    /// No restore, or the cluster was bootstrapped already (the field is
    /// honoured only at the first bootstrap).
    #[default]
    NotNeeded,
    /// The backup resolved and the object has the recorded size and SHA-256.
    Verified,
    /// The snapshot cannot be used: nothing is written to the workload cluster.
    Refused(Refusal),
}

/// A workload object this cluster would write or delete, held by another owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignObject {
    /// `Kind/namespace/name`.
    pub object: String,
    /// The value of its owner label; `None` when it has none (made by hand or by
    /// another tool).
    pub owner: Option<String>,
}

/// A step that failed, as recorded in `status.lastOperation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedStep {
    /// `Step::kind()` of the failed step.
    pub kind: String,
    /// Failures in a row.
    pub failures: u32,
    /// Time since the last failure.
    pub age: std::time::Duration,
    /// What failed, as `status.lastOperation.message` says it.
    pub message: String,
}

/// How many failure grace periods a member that does not answer the
/// controller, but whose pod is ready, is given before it is replaced.
pub const READY_POD_GRACE_FACTOR: u32 = 5;

/// A member volume's size, as its claim says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimSize {
    /// `spec.storageClassName` (the default class is filled in by the API
    /// server when the claim is created).
    pub class: Option<String>,
    /// `spec.resources.requests.storage`.
    pub requested: Option<String>,
    /// `status.capacity.storage`: what the volume has.
    pub capacity: Option<String>,
    /// `FileSystemResizePending`: the volume grew, its file system grows
    /// when the pod using it starts again.
    pub restart_pending: bool,
    /// The last resize error Kubernetes reported on the claim, if any.
    pub error: Option<String>,
    /// Unbound for a while: why (its newest event, or how long).
    pub unprovisioned: Option<String>,
}

/// The storage the spec asks for and the storage the StatefulSet has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageObservation {
    /// `spec.storage.size`, resolved.
    pub size: String,
    /// `spec.storage.storageClassName`, resolved.
    pub class: Option<String>,
    /// The StatefulSet's claim template, (class, size), when it exists.
    pub template: Option<(Option<String>, Option<String>)>,
    /// Whether the members' StorageClass lets a claim grow: read only
    /// while a claim is smaller than the spec asks.
    pub expansion: Expansion,
    /// The StorageClass the spec asks for, read only while the StatefulSet's
    /// claim template names another.
    pub target: TargetClass,
    /// While the members move to another StorageClass, the ordinal of the
    /// spare member the move adds (the spec's size): set by the planner,
    /// which counts the spare in the desired size meanwhile.
    pub spare: Option<u32>,
    /// The Nodes a spare member could run on, read only when a move is to
    /// start and the pods require a node each.
    pub spare_nodes: SpareNodes,
}

/// The Nodes a move's spare member could run on (`observe::spare_nodes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SpareNodes {
    /// Not read: no move is to start, or the pods may share a node.
    #[default]
    NotRead,
    /// The names of the Nodes a member pod could be placed on.
    Known { eligible: Vec<String> },
    /// They could not be read (the optional cluster reads are not granted).
    Unreadable(String),
}

/// The StorageClass a move goes to, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TargetClass {
    /// Not read: no move is to start.
    #[default]
    NotRead,
    Exists,
    Missing,
    /// It could not be read, and why.
    Unreadable(String),
}

/// What the members' StorageClass says about growing a claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Expansion {
    /// Not read: nothing has to grow.
    #[default]
    NotRead,
    /// `allowVolumeExpansion: true` on this class.
    Allowed(String),
    /// The class does not allow expansion.
    NotAllowed(String),
    /// The claims name no class: no provisioner can grow them.
    NoClass,
    /// The class is gone.
    Missing(String),
    /// The class could not be read, and why.
    Unreadable { class: String, error: String },
}
