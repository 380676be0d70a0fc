//! The one assembler of the planner's observation. The controller's
//! readers fill [`Readings`] from the workload cluster, etcd and the
//! EtcdCluster (`super::observe`); `etcdfleet plan` fills them from a
//! status it is given (`crate::cli::plan`). [`assemble`] turns either into
//! the same [`Observation`], so `plan` decides as the controller does.
//! Pure.

use std::collections::BTreeMap;

use super::super::plan::observation::{
    CaRotationObservation, EtcdObservation, ForeignObject, Observation, PodObservation,
    PvcObservation, RecoveryObservation, RestoreGate, StatefulSetObservation, StorageObservation,
    VersionObservation,
};
use super::super::plan::step::ObjectKind;
use super::history::History;
use crate::etcd::Alarm;
use crate::render::Names;

/// What the readers found about one cluster.
pub struct Readings {
    pub names: Names,
    pub tls: bool,
    pub desired_replicas: u32,
    /// The workload objects (missing or stale ones, foreign ones) and the PKI.
    pub objects: ObjectsReading,
    pub statefulset: Option<StatefulSetObservation>,
    pub pods: BTreeMap<u32, PodObservation>,
    pub pvcs: BTreeMap<u32, PvcObservation>,
    pub etcd: EtcdObservation,
    pub alarms: Vec<Alarm>,
    /// The storage asked for and the StatefulSet's claim template.
    pub storage: StorageObservation,
    /// The version the spec asks for (`None`: not judged here).
    pub requested_version: Option<String>,
    pub downgrade_acknowledged: Option<String>,
    pub version: VersionObservation,
    /// What the stored status remembers.
    pub history: History,
    pub restore: RestoreGate,
    pub ca_rotation: CaRotationObservation,
    pub recovery: RecoveryObservation,
}

/// The workload objects and the management-side PKI, as read.
#[derive(Debug, Clone, Default)]
pub struct ObjectsReading {
    /// Missing or out of date, in the order they are written.
    pub stale: Vec<ObjectKind>,
    /// At this cluster's names, held by another owner (or nobody).
    pub conflicts: Vec<ForeignObject>,
    /// A workload TLS Secret carries a CA certificate.
    pub tls_secret_ca_present: bool,
    /// The members ConfigMap announces members to start from it.
    pub announces_members: bool,
    /// The management-side PKI Secret exists.
    pub pki_present: bool,
}

/// The planner's observation of the readings. The adoption, when there is
/// one, is added by its own reader (it probes the members it names).
pub fn assemble(r: Readings) -> Observation {
    let objects = r.objects;
    Observation {
        names: r.names,
        tls: r.tls,
        desired_replicas: r.desired_replicas,
        stale_objects: objects.stale,
        members_announced: objects.announces_members,
        statefulset: r.statefulset,
        pods: r.pods,
        pvcs: r.pvcs,
        etcd: r.etcd,
        failed_members: r.history.failed_members,
        failed_long_ago: r.history.failed_long_ago,
        replacements: r.history.replacements,
        alarms: r.alarms,
        conflicts: objects.conflicts,
        // The management-side CA is gone but the workload still trusts one: a
        // lost Secret, not a new cluster (which has neither; nor has a
        // cluster that adopts a running etcd before it imported its CA).
        pki_lost: r.tls
            && !objects.pki_present
            && (objects.tls_secret_ca_present || r.history.had_members),
        storage: r.storage,
        requested_version: r.requested_version,
        downgrade_acknowledged: r.downgrade_acknowledged,
        version: r.version,
        known_voters: r.history.known_voters,
        last_failure: r.history.last_failure,
        restore: r.restore,
        adoption: None,
        ca_rotation: r.ca_rotation,
        recovery: r.recovery,
    }
}
