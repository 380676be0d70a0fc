//! The planner: a pure function from everything observed about one etcd
//! cluster to the single most urgent safe next step (or a reason to wait, or
//! nothing). It looks at the whole state every time, never at what changed,
//! so a controller that restarts at any point simply plans again.
//!
//! Order of concerns, most urgent first:
//! 1. the workload objects exist and match their inputs (render contract);
//! 2. bootstrap: with no member answering, only ever add (never remove);
//! 3. a learner in flight is started, then promoted once caught up;
//! 4. a failed member (unhealthy past the grace period) is removed, under the
//!    quorum guard, and its stale storage deleted so it can rejoin fresh;
//! 5. scale down: move leadership away, remove the highest member, shrink,
//!    then delete its PVC;
//! 6. scale up: add the next member as a learner (one at a time);
//! 7. roll members onto the StatefulSet's pod template: followers first,
//!    leader last after moving leadership, one at a time, each gated on full
//!    health.
//!
//! Ahead of 1., a change of minor version runs its own rules
//! ([`super::version_change`]): the preflight (health, a snapshot) and
//! etcd's online downgrade decide, or hold the StatefulSet write that starts
//! the roll while the rules here go on.
//!
//! Before all of these, refusals: a workload object that belongs to another
//! owner, lost PKI, a storage change the StatefulSet cannot take, or a version
//! the members' own reported version forbids. A refusal takes no step at all.
//! And without a quorum in sight ([`quorum_view`]) nothing is done either:
//! said as quorum loss when the members' own health says so, as the
//! controller being cut off when their pods pass etcd's health check.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::etcd::{Alarm, AlarmKind, ClusterHealth};
use crate::render::Names;

/// A member is defragmented when at least this many bytes, and at least half
/// of its database file, are free pages.
pub const DEFRAG_MIN_FREE_BYTES: i64 = 128 * 1024 * 1024;

/// A workload object the planner found missing or out of date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKind {
    /// The management-side Secret with the CA and the controller's client identity.
    Pki,
    Namespace,
    ServerTlsSecret,
    PeerTlsSecret,
    PeerService,
    ClientService,
    PodDisruptionBudget,
    MembersConfigMap,
    StatefulSet,
}

/// The StatefulSet as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatefulSetObservation {
    pub replicas: u32,
    /// Image of the pod template.
    pub image: String,
    /// The inputs hash the pod template carries ([`crate::render::TEMPLATE_HASH`]);
    /// `None` on a StatefulSet written by a release that did not stamp it.
    pub template_hash: Option<String>,
}

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
    /// The pod's readiness is etcd's own health check (its template has the
    /// readiness probe; pods of older templates are ready once running).
    pub ready_means_etcd_healthy: bool,
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
    /// Alarms etcd has raised (NOSPACE, CORRUPT).
    pub alarms: Vec<Alarm>,
    /// Workload objects at this cluster's names that another owner (or nobody)
    /// holds. Nothing is written while any exists.
    pub conflicts: Vec<ForeignObject>,
    /// TLS is on, the management-side CA is gone, but the workload cluster
    /// still has certificates from a CA: a new CA would lock every member out.
    pub pki_lost: bool,
    /// A storage change the StatefulSet cannot take (its claim templates are
    /// immutable): what changed.
    pub storage_change: Option<String>,
    /// The version the spec asks for (`MAJOR.MINOR.PATCH`).
    pub requested_version: Option<String>,
    /// The downgrade the cluster acknowledges
    /// ([`etcdfleet_api::version::DOWNGRADE_ANNOTATION`]), if any.
    pub downgrade_acknowledged: Option<String>,
    /// What the version rules need beyond this ([`super::version_change`]).
    pub version: super::version_change::VersionObservation,
    /// Voters the stored status listed last time: a cluster that had members
    /// and now has none answering has lost quorum, it is not bootstrapping.
    pub known_voters: u32,
    /// The last step, if it failed: a step that keeps failing is retried with
    /// exponential backoff, never in a tight loop.
    pub last_failure: Option<FailedStep>,
    /// A cluster bootstrapping from a snapshot (`spec.bootstrap.restore`):
    /// whether the snapshot was verified (see [`RestoreGate`]).
    pub restore: RestoreGate,
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

/// First retry delay of a failing step; doubles per failure up to [`RETRY_MAX`].
pub const RETRY_BASE: std::time::Duration = std::time::Duration::from_secs(5);
/// Longest delay between retries of a failing step.
pub const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(600);

/// Delay before retrying a step that failed `failures` times in a row: a
/// single failure is retried at once (a lost answer, a blip); from the second
/// on, the delay doubles.
pub fn retry_delay(failures: u32) -> std::time::Duration {
    if failures <= 1 {
        return std::time::Duration::ZERO;
    }
    let exp = (failures - 2).min(16);
    RETRY_BASE.saturating_mul(1u32 << exp).min(RETRY_MAX)
}

/// Why the controller refuses to act (reported as `Conflict=True`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Condition reason.
    pub reason: &'static str,
    pub message: String,
}

/// Why a member is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalCause {
    ScaleDown,
    Failed,
}

/// One action on the workload cluster or on etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create or rewrite workload objects (in this order).
    WriteObjects(Vec<ObjectKind>),
    /// Create the members ConfigMap (if missing) and the StatefulSet with these replicas.
    Bootstrap {
        replicas: u32,
    },
    /// Set StatefulSet replicas (start a pending member, or shrink after a removal).
    ScaleStatefulSet {
        replicas: u32,
    },
    /// Record on a PVC which member's data it holds, its owner and the etcd
    /// version running on it.
    RecordPvcMember {
        ordinal: u32,
        member_id: u64,
        version: Option<String>,
    },
    /// Delete a member's pod and PVC: their data belongs to a removed member.
    DeleteStaleStorage {
        ordinal: u32,
    },
    /// Point the members ConfigMap at the grown cluster and `member add --learner`.
    AddLearner {
        ordinal: u32,
    },
    PromoteLearner {
        ordinal: u32,
        member_id: u64,
    },
    MoveLeader {
        from: u64,
        to: u64,
    },
    RemoveMember {
        ordinal: Option<u32>,
        member_id: u64,
        cause: RemovalCause,
    },
    /// Delete the PVC of a member removed by a scale-down.
    DeletePvc {
        ordinal: u32,
    },
    /// Delete a pod so the StatefulSet recreates it from the current template.
    RestartMember {
        ordinal: u32,
        member_id: u64,
    },
    /// After a NOSPACE alarm: compact the history, defragment every member
    /// (followers first, leader last), then disarm the alarm.
    RecoverFromNoSpace,
    /// Defragment one member whose database is mostly free pages.
    Defragment {
        ordinal: u32,
        member_id: u64,
    },
    /// A step of a change of minor version: a snapshot before it, etcd's
    /// online downgrade ([`super::version_change`]).
    Version(super::version_change::VersionStep),
}

impl Step {
    /// Short name for events, metrics and `status.lastOperation.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::WriteObjects(_) => "WriteObjects",
            Step::Bootstrap { .. } => "Bootstrap",
            Step::ScaleStatefulSet { .. } => "ScaleStatefulSet",
            Step::RecordPvcMember { .. } => "RecordPvcMember",
            Step::DeleteStaleStorage { .. } => "DeleteStaleStorage",
            Step::AddLearner { .. } => "AddLearner",
            Step::PromoteLearner { .. } => "PromoteLearner",
            Step::MoveLeader { .. } => "MoveLeader",
            Step::RemoveMember { .. } => "RemoveMember",
            Step::DeletePvc { .. } => "DeletePvc",
            Step::RestartMember { .. } => "RestartMember",
            Step::RecoverFromNoSpace => "RecoverFromNoSpace",
            Step::Defragment { .. } => "Defragment",
            Step::Version(step) => step.kind(),
        }
    }

    /// Whether the step can lose data or availability if taken wrongly
    /// (never taken in bootstrap mode).
    pub fn is_destructive(&self) -> bool {
        matches!(
            self,
            Step::RemoveMember { .. }
                | Step::DeletePvc { .. }
                | Step::DeleteStaleStorage { .. }
                | Step::RestartMember { .. }
        )
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::WriteObjects(kinds) => write!(f, "write {kinds:?}"),
            Step::Bootstrap { replicas } => {
                write!(
                    f,
                    "bootstrap: create the StatefulSet with {replicas} replica(s)"
                )
            }
            Step::ScaleStatefulSet { replicas } => {
                write!(f, "set StatefulSet replicas to {replicas}")
            }
            Step::RecordPvcMember {
                ordinal,
                member_id,
                version,
            } => {
                write!(
                    f,
                    "record member {member_id:x}{} on the PVC of ordinal {ordinal}",
                    version
                        .as_ref()
                        .map(|v| format!(" (etcd {v})"))
                        .unwrap_or_default()
                )
            }
            Step::DeleteStaleStorage { ordinal } => write!(
                f,
                "delete the pod and PVC of ordinal {ordinal}: they hold a removed member's data"
            ),
            Step::AddLearner { ordinal } => write!(f, "add member {ordinal} as a learner"),
            Step::PromoteLearner { ordinal, member_id } => {
                write!(f, "promote learner {member_id:x} (ordinal {ordinal})")
            }
            Step::MoveLeader { from, to } => write!(f, "move leadership from {from:x} to {to:x}"),
            Step::RemoveMember {
                ordinal,
                member_id,
                cause,
            } => write!(
                f,
                "remove member {member_id:x} (ordinal {}) because of {}",
                ordinal.map_or("unknown".to_string(), |o| o.to_string()),
                match cause {
                    RemovalCause::ScaleDown => "scale-down",
                    RemovalCause::Failed => "failure",
                }
            ),
            Step::DeletePvc { ordinal } => write!(f, "delete the PVC of removed ordinal {ordinal}"),
            Step::RestartMember { ordinal, member_id } => write!(
                f,
                "restart member {member_id:x} (ordinal {ordinal}) onto the StatefulSet's image"
            ),
            Step::RecoverFromNoSpace => write!(
                f,
                "recover from the NOSPACE alarm: compact, defragment every member (leader last), disarm"
            ),
            Step::Defragment { ordinal, member_id } => {
                write!(f, "defragment member {member_id:x} (ordinal {ordinal})")
            }
            Step::Version(step) => step.fmt(f),
        }
    }
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Take this step now.
    Act(Step),
    /// Not converged, but nothing is safe or useful to do now; what it waits
    /// for usually happens by itself soon (a pod starting, a learner catching
    /// up), so it is looked at again soon.
    Wait(String),
    /// Not converged, and nothing changes by itself: a person (or an outside
    /// event) must act — quorum lost, a CORRUPT alarm, a member this
    /// controller does not own, a step failing again and again. Looked at
    /// again with exponential backoff, never in a loop.
    Hold(String),
    /// Nothing to do.
    Converged,
    /// Acting would harm data or another owner; nothing is done until a person
    /// resolves it.
    Refuse(Refusal),
}

/// What identity the spec asks for differs from the recorded one: the
/// message, or `None` when they match (or nothing is recorded yet).
pub fn identity_mismatch(
    recorded: Option<&etcdfleet_api::ManagedIdentity>,
    wanted: &etcdfleet_api::ManagedIdentity,
) -> Option<String> {
    let recorded = recorded?;
    let mut changed = Vec::new();
    if recorded.kubeconfig_secret != wanted.kubeconfig_secret {
        changed.push(format!(
            "workload cluster (kubeconfig Secret {} → {})",
            recorded.kubeconfig_secret, wanted.kubeconfig_secret
        ));
    }
    if recorded.workload_namespace != wanted.workload_namespace {
        changed.push(format!(
            "workloadNamespace ({} → {})",
            recorded.workload_namespace, wanted.workload_namespace
        ));
    }
    if recorded.tls != wanted.tls {
        changed.push(format!("tls.enabled ({} → {})", recorded.tls, wanted.tls));
    }
    (!changed.is_empty()).then(|| {
        format!(
            "the spec moves a running etcd: {}; this would start a second, empty etcd \
             (or lock the controller out of this one). Revert the spec; to move etcd, \
             back it up and restore it into a new EtcdCluster",
            changed.join(", ")
        )
    })
}

/// What a person can do when quorum is lost (no automatic action is safe:
/// only a person knows whether the missing members' disks are coming back).
pub const QUORUM_LOSS_HELP: &str = "if the missing members' pods and volumes can come back, \
     bring them back and the cluster recovers by itself; otherwise restore from a backup \
     snapshot (an EtcdBackup, or `etcdutl snapshot restore` into a new EtcdCluster, \
     following etcd's disaster-recovery guide); the controller removes or restarts nothing \
     while quorum is lost";

/// What can be said about quorum from the controller's two vantage points:
/// the members that answer it, and the pods whose readiness is etcd's own
/// health check in the pod (the kubelet's view from inside the workload
/// cluster). `QuorumLost` is said only when both agree that members are down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuorumView {
    /// A quorum of the voting members answers the controller, healthy.
    Healthy { healthy: u32, voters: u32 },
    /// Fewer than a quorum answer the controller, but counting the members
    /// whose pods pass etcd's own health check there is one: the controller
    /// is cut off from etcd (a network path, the port-forward through the
    /// workload API server), which is not etcd losing its quorum.
    Unreachable(CutOff),
    /// Fewer than a quorum are healthy by what the members themselves say
    /// (their answers, and the health checks in their pods).
    Lost { healthy: u32, voters: u32 },
    /// No voting member is known yet: nothing to say about quorum.
    NotStarted,
}

/// The controller cannot reach enough members to see a quorum, and their
/// pods say they are healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutOff {
    /// Voting members that answered the controller, healthy.
    pub answering: u32,
    /// Voting members that did not answer the controller but whose pods are
    /// Ready by etcd's own health check.
    pub ready_in_pods: u32,
    pub voters: u32,
}

impl CutOff {
    /// What a person reads: what each vantage point says and where to look.
    /// No restore advice: nothing says etcd lost anything.
    pub fn describe(&self, why: Option<&str>) -> String {
        let (answering, ready, voters) = (self.answering, self.ready_in_pods, self.voters);
        let who = if answering == 0 {
            format!("no voting member answers the controller{}", in_parens(why))
        } else {
            format!("only {answering} of {voters} voting members answer the controller")
        };
        format!(
            "{who}, but {} of {voters} pass etcd's own health check in their pods: the \
             controller is cut off from the members, which says nothing about etcd's quorum \
             (that cannot be told from here). Check the network between the controller and the \
             workload cluster (the port-forward through its API server, or the pod network); \
             nothing that needs etcd is done until the members answer again",
            answering + ready
        )
    }
}

fn in_parens(why: Option<&str>) -> String {
    why.map(|w| format!(" ({w})")).unwrap_or_default()
}

/// A pod whose Ready condition is etcd's own health check, passing.
fn ready_by_etcd_health(pod: &PodObservation) -> bool {
    pod.ready && pod.running && !pod.deleting && pod.ready_means_etcd_healthy
}

/// Quorum as the controller can tell it (see [`QuorumView`]). Pure.
pub fn quorum_view(obs: &Observation) -> QuorumView {
    let (answering, silent_ready, voters) = match &obs.etcd {
        EtcdObservation::Unreachable(_) => {
            let ready = obs
                .pods
                .values()
                .filter(|p| ready_by_etcd_health(p))
                .count() as u32;
            (0, ready.min(obs.known_voters), obs.known_voters)
        }
        EtcdObservation::Observed(health) => {
            let ready = health
                .voters()
                .filter(|m| !m.healthy && m.status.is_none())
                .filter_map(|m| m.member.peer_urls.first())
                .filter_map(|u| obs.names.ordinal_of_peer_url(u))
                .filter(|o| obs.pods.get(o).is_some_and(ready_by_etcd_health))
                .count() as u32;
            let healthy = health.healthy_voter_count() as u32;
            (healthy, ready, health.voter_count() as u32)
        }
    };
    let quorum = crate::etcd::quorum(voters as usize) as u32;
    if voters == 0 {
        QuorumView::NotStarted
    } else if answering >= quorum {
        QuorumView::Healthy {
            healthy: answering,
            voters,
        }
    } else if answering + silent_ready >= quorum {
        QuorumView::Unreachable(CutOff {
            answering,
            ready_in_pods: silent_ready,
            voters,
        })
    } else {
        QuorumView::Lost {
            healthy: answering,
            voters,
        }
    }
}

/// No member answers the controller: the StatefulSet is grown to cover
/// every volume with data (no etcd needed), else nothing is done; what is
/// said depends on whether the members' pods are healthy.
fn plan_without_answers(obs: &Observation, sts: &StatefulSetObservation, why: &str) -> Plan {
    let wanted = obs.pvcs.keys().max().map_or(1, |o| o + 1);
    if sts.replicas < wanted {
        return Plan::Act(Step::ScaleStatefulSet { replicas: wanted });
    }
    match quorum_view(obs) {
        QuorumView::Unreachable(cut) => Plan::Hold(cut.describe(Some(why))),
        QuorumView::Lost { .. } | QuorumView::Healthy { .. } => Plan::Hold(format!(
            "quorum lost: none of the {} known voting members answers ({why}) and their pods do \
             not pass etcd's health check either; {QUORUM_LOSS_HELP}",
            obs.known_voters
        )),
        QuorumView::NotStarted => Plan::Wait(format!(
            "no etcd member answers yet ({why}); waiting for {} to start",
            describe_pods(obs)
        )),
    }
}

/// Without quorum etcd can change nothing, and only a person can tell
/// whether the missing members come back: no step at all. Said as quorum
/// loss only when the members' own health says so.
fn quorum_hold(obs: &Observation) -> Option<Plan> {
    match quorum_view(obs) {
        QuorumView::Unreachable(cut) => Some(Plan::Hold(cut.describe(None))),
        QuorumView::Lost { healthy, voters } => Some(Plan::Hold(format!(
            "quorum lost: only {healthy} of {voters} voting members are healthy; {QUORUM_LOSS_HELP}"
        ))),
        QuorumView::Healthy { .. } | QuorumView::NotStarted => None,
    }
}

/// Decides the next step. Pure; see the module docs for the order.
pub fn plan_next_step(obs: &Observation) -> Plan {
    if let Some(refusal) = refusal(obs) {
        return Plan::Refuse(refusal);
    }
    // A restore whose snapshot is missing or corrupt makes nothing: no
    // Service, no Secret, no StatefulSet (a half-made cluster would start
    // empty, or mix data).
    if obs.statefulset.is_none()
        && let RestoreGate::Refused(refusal) = &obs.restore
    {
        return Plan::Refuse(refusal.clone());
    }
    // A change of minor version: its preflight and etcd's online downgrade
    // come before the StatefulSet write that starts the roll.
    super::version_change::gate(obs, plan_steps)
}

/// The rules after the refusals, most urgent first (see the module docs).
fn plan_steps(obs: &Observation) -> Plan {
    // A step that keeps failing waits out its backoff (no destructive work is
    // redone in a tight loop, e.g. compact + defragment every member).
    if let Some(failed) = &obs.last_failure {
        let delay = retry_delay(failed.failures);
        if failed.age < delay {
            return Plan::Hold(format!(
                "{} failed {} time(s) in a row; retrying with backoff (up to {}s between attempts)",
                failed.kind,
                failed.failures,
                delay.as_secs()
            ));
        }
    }
    // 1. Workload objects (the StatefulSet itself is created by bootstrap).
    let (missing_sts, others): (Vec<_>, Vec<_>) = obs
        .stale_objects
        .iter()
        .copied()
        .partition(|k| *k == ObjectKind::StatefulSet && obs.statefulset.is_none());
    // Without a StatefulSet, bootstrap writes the members ConfigMap.
    let others: Vec<_> = others
        .into_iter()
        .filter(|k| *k != ObjectKind::MembersConfigMap || obs.statefulset.is_some())
        .collect();
    if !others.is_empty() {
        return Plan::Act(Step::WriteObjects(others));
    }
    let Some(sts) = &obs.statefulset else {
        debug_assert!(!missing_sts.is_empty() || obs.statefulset.is_none());
        // A StatefulSet lost while PVCs remain is recreated wide enough to start
        // every member that has data, never narrower.
        let replicas = obs.pvcs.keys().max().map_or(1, |o| o + 1);
        return Plan::Act(Step::Bootstrap { replicas });
    };

    // 2. Bootstrap mode: nobody answers. Only ever add.
    let health = match &obs.etcd {
        EtcdObservation::Unreachable(why) => return plan_without_answers(obs, sts, why),
        EtcdObservation::Observed(h) => h,
    };

    let ordinal_of = |id: u64| -> Option<u32> {
        health
            .member(id)
            .and_then(|m| m.member.peer_urls.first())
            .and_then(|u| obs.names.ordinal_of_peer_url(u))
    };
    let member_at = |ordinal: u32| -> Option<u64> {
        health
            .members()
            .iter()
            .find(|m| {
                m.member
                    .peer_urls
                    .iter()
                    .any(|u| obs.names.ordinal_of_peer_url(u) == Some(ordinal))
            })
            .map(|m| m.member.id)
    };

    if let Some(hold) = quorum_hold(obs) {
        return hold;
    }

    // Record which member each PVC holds as soon as both exist, so that data
    // of a member that is later removed is recognised as stale; with it the
    // owner, and the etcd version running on the data (kept volumes of a
    // deleted cluster must not be started on an older or too new etcd).
    // (Owner and version of an already recorded volume are brought up to
    // date once nothing else is left to do, not between the steps of an
    // operation.)
    if let Some(step) = record_pvc_step(obs, health, &ordinal_of, |pvc, _| pvc.member_id.is_none())
    {
        return Plan::Act(step);
    }

    // 3. A learner in flight (one this controller added: a foreign learner,
    // whose peer URL is not ours, is reported and never removed).
    if let Some((learner, ordinal)) = health
        .learners()
        .find_map(|l| ordinal_of(l.member.id).map(|o| (l, o)))
    {
        let id = learner.member.id;
        if sts.replicas <= ordinal {
            return Plan::Act(Step::ScaleStatefulSet {
                replicas: ordinal + 1,
            });
        }
        if let Some(pvc) = obs.pvcs.get(&ordinal)
            && let Some(old) = pvc.member_id
            && old != id
        {
            return Plan::Act(Step::DeleteStaleStorage { ordinal });
        }
        match health.can_promote(id) {
            Ok(()) => {
                return Plan::Act(Step::PromoteLearner {
                    ordinal,
                    member_id: id,
                });
            }
            Err(why) => {
                // A learner whose pod never ran has not failed: it has not started.
                let started = obs.pods.get(&ordinal).is_some_and(|p| p.running);
                if started && obs.failed_members.contains(&id) && health.can_remove(id).is_ok() {
                    return Plan::Act(Step::RemoveMember {
                        ordinal: Some(ordinal),
                        member_id: id,
                        cause: RemovalCause::Failed,
                    });
                }
                // No raft indexes in the message: they change on every write
                // and would turn every reconcile into a status write.
                let why = match why {
                    crate::etcd::UnsafeReason::LearnerBehind { .. } => {
                        "it is catching up with the leader".to_string()
                    }
                    other => other.to_string(),
                };
                return Plan::Wait(format!(
                    "learner {} not promotable yet: {why}",
                    obs.names.pod(ordinal)
                ));
            }
        }
    }

    // 4. Failed voters: only members this controller made (foreign ones are
    // reported, never removed), and only when the workload cluster agrees: a
    // member the controller cannot reach but whose pod passes etcd's own
    // health probe is a network problem between us and it, not a failure.
    for id in &obs.failed_members {
        if let Some(m) = health.member(*id)
            && !m.member.is_learner
            && let Some(o) = ordinal_of(*id)
        {
            // Unreachable (no answer at all, not even status) yet ready: a
            // member that answers but is unhealthy (a wiped disk, another
            // cluster's data) is failed whatever its serializable probe says.
            let ready_pod = obs.pods.get(&o).filter(|p| p.ready && p.running);
            if m.status.is_none() && ready_pod.is_some_and(|p| p.ready_means_etcd_healthy) {
                return Plan::Hold(format!(
                    "member {} does not answer the controller, but etcd's health check in its \
                     pod passes: it is not replaced; check the network between the controller \
                     and the workload cluster (port-forward or pod network)",
                    obs.names.pod(o)
                ));
            }
            if m.status.is_none() && ready_pod.is_some() && !obs.failed_long_ago.contains(id) {
                return Plan::Wait(format!(
                    "member {} does not answer the controller but its pod is ready: not \
                     replaced yet (given {READY_POD_GRACE_FACTOR} failure grace periods); \
                     check the network between the controller and the workload cluster",
                    obs.names.pod(o)
                ));
            }
            let ordinal = Some(o);
            return match health.can_remove(*id) {
                Ok(()) => Plan::Act(Step::RemoveMember {
                    ordinal,
                    member_id: *id,
                    cause: RemovalCause::Failed,
                }),
                Err(why) => Plan::Wait(format!(
                    "member {} has failed but cannot be replaced safely: {why}",
                    ordinal.map_or_else(|| format!("{id:x}"), |o| obs.names.pod(o))
                )),
            };
        }
    }

    // Stale storage: a PVC holding the data of a member that is gone.
    for (ordinal, pvc) in &obs.pvcs {
        if let Some(old) = pvc.member_id
            && health.member(old).is_none()
            && *ordinal < obs.desired_replicas
        {
            return Plan::Act(Step::DeleteStaleStorage { ordinal: *ordinal });
        }
    }

    // Alarms. CORRUPT needs a person; NOSPACE is recovered once every member
    // is healthy (defragmentation blocks the member it runs on).
    if let Some(alarm) = obs.alarms.iter().find(|a| a.kind == AlarmKind::Corrupt) {
        return Plan::Hold(format!(
            "etcd raised a CORRUPT alarm on member {}: its data disagrees with the others; \
             replace that member or restore from a snapshot (no automatic action)",
            ordinal_of(alarm.member_id)
                .map_or_else(|| format!("{:x}", alarm.member_id), |o| obs.names.pod(o))
        ));
    }
    if obs.alarms.iter().any(|a| a.kind == AlarmKind::NoSpace) {
        if let Some(sick) = health.voters().find(|m| !m.healthy) {
            return Plan::Wait(format!(
                "NOSPACE recovery waits until every member is healthy ({:x} is not)",
                sick.member.id
            ));
        }
        return Plan::Act(Step::RecoverFromNoSpace);
    }

    // 5. Scale down: the highest member beyond the desired size goes first.
    // Shrink and clean up after each removal before removing the next.
    let highest_member = health
        .members()
        .iter()
        .filter_map(|m| ordinal_of(m.member.id))
        .max();
    // Never below the desired size: a failed member's ordinal is refilled, not dropped.
    let target = highest_member
        .map_or(1, |o| o + 1)
        .max(obs.desired_replicas);
    if sts.replicas > target {
        return Plan::Act(Step::ScaleStatefulSet { replicas: target });
    }
    // PVCs of members removed by a scale-down, once their pod is gone.
    for ordinal in obs.pvcs.keys() {
        if *ordinal >= sts.replicas
            && *ordinal >= obs.desired_replicas
            && !obs.pods.contains_key(ordinal)
            && member_at(*ordinal).is_none()
        {
            return Plan::Act(Step::DeletePvc { ordinal: *ordinal });
        }
    }

    let mut beyond: Vec<(u32, u64)> = health
        .voters()
        .filter_map(|m| ordinal_of(m.member.id).map(|o| (o, m.member.id)))
        .filter(|(o, _)| *o >= obs.desired_replicas)
        .collect();
    beyond.sort();
    let foreign: Vec<u64> = health
        .members()
        .iter()
        .filter(|m| ordinal_of(m.member.id).is_none())
        .map(|m| m.member.id)
        .collect();
    if let Some(&(ordinal, id)) = beyond.last() {
        // Preflight: shrinking with a member down removes fault tolerance the
        // cluster is already short of (5 → 3 with one down leaves none).
        if let Some(sick) = health.voters().find(|m| !m.healthy) {
            return Plan::Wait(format!(
                "scale-down to {} members waits until every member is healthy: {} is not",
                obs.desired_replicas,
                ordinal_of(sick.member.id)
                    .map_or_else(|| format!("{:x}", sick.member.id), |o| obs.names.pod(o))
            ));
        }
        if health.leader() == Some(id) {
            return match pick_new_leader(health, &|o| o < obs.desired_replicas, &ordinal_of, id) {
                Some(to) => Plan::Act(Step::MoveLeader { from: id, to }),
                None => Plan::Wait(format!(
                    "scale-down waits: {} leads and no other healthy member can take over",
                    obs.names.pod(ordinal)
                )),
            };
        }
        return match health.can_remove(id) {
            Ok(()) => Plan::Act(Step::RemoveMember {
                ordinal: Some(ordinal),
                member_id: id,
                cause: RemovalCause::ScaleDown,
            }),
            Err(why) => Plan::Wait(format!(
                "scale-down waits before removing {}: {why}",
                obs.names.pod(ordinal)
            )),
        };
    }
    if let Some(&id) = foreign.first() {
        return Plan::Hold(format!(
            "member {id:x} has a peer URL this cluster does not own; remove it by hand if it is not wanted"
        ));
    }

    // 6. Scale up through learners, one at a time.
    let voters = health.voter_count() as u32;
    if voters < obs.desired_replicas {
        let Some(next) = (0..obs.desired_replicas).find(|o| member_at(*o).is_none()) else {
            return Plan::Hold(format!(
                "{voters} voting members, {} wanted, but every ordinal is taken: \
                 a member this controller does not own holds one",
                obs.desired_replicas
            ));
        };
        if let Some(pvc) = obs.pvcs.get(&next)
            && pvc.member_id.is_some()
        {
            return Plan::Act(Step::DeleteStaleStorage { ordinal: next });
        }
        // Preflight: grow only a fully healthy cluster (a member that is down
        // is replaced first, or comes back).
        if let Some(sick) = health.voters().find(|m| !m.healthy) {
            return Plan::Wait(format!(
                "scaling to {} members waits until every member is healthy: {} is not{}",
                obs.desired_replicas,
                ordinal_of(sick.member.id)
                    .map_or_else(|| format!("{:x}", sick.member.id), |o| obs.names.pod(o)),
                sick.error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ));
        }
        return match health.can_add_learner() {
            Ok(()) => Plan::Act(Step::AddLearner { ordinal: next }),
            Err(why) => Plan::Wait(format!(
                "scaling to {} members waits until the cluster is healthy: {why}",
                obs.desired_replicas
            )),
        };
    }

    // 7. Roll members onto the StatefulSet's pod template. The template hash
    // covers every input (flags, resources, image, pod overrides); the image is
    // compared only for StatefulSets written before the hash was stamped. An
    // admission webhook that rewrites images (mirror, digest) changes no hash.
    let outdated: Vec<(u32, u64)> = obs
        .pods
        .iter()
        .filter(|(_, p)| match &sts.template_hash {
            Some(h) => p.template_hash.as_ref() != Some(h),
            None => p.image != sts.image,
        })
        .filter_map(|(o, _)| member_at(*o).map(|id| (*o, id)))
        .collect();
    if !outdated.is_empty() {
        if obs.pods.values().any(|p| p.deleting) {
            return Plan::Wait("a member pod is being replaced".to_string());
        }
        if let Some(sick) = health.voters().find(|m| !m.healthy) {
            return Plan::Wait(format!(
                "rolling update waits: member {} is unhealthy",
                ordinal_of(sick.member.id)
                    .map_or_else(|| format!("{:x}", sick.member.id), |o| obs.names.pod(o))
            ));
        }
        if let Some(lagging) = health
            .voters()
            .find(|m| health.lag(m.member.id).is_some_and(|lag| lag > 1000))
        {
            return Plan::Wait(format!(
                "rolling update waits: member {:x} is catching up",
                lagging.member.id
            ));
        }
        let leader = health.leader();
        let (ordinal, id) = outdated
            .iter()
            .copied()
            .find(|(_, id)| Some(*id) != leader)
            .unwrap_or(outdated[0]);
        if Some(id) == leader && voters > 1 {
            return match pick_new_leader(health, &|_| true, &ordinal_of, id) {
                Some(to) => Plan::Act(Step::MoveLeader { from: id, to }),
                None => {
                    Plan::Wait("rolling update waits: no member can take over leadership".into())
                }
            };
        }
        return match health.can_restart(id) {
            Ok(()) => Plan::Act(Step::RestartMember {
                ordinal,
                member_id: id,
            }),
            // A single-member cluster cannot restart without downtime; that is
            // what a one-member cluster signs up for.
            Err(crate::etcd::UnsafeReason::SingleMemberDowntime { .. }) => {
                Plan::Act(Step::RestartMember {
                    ordinal,
                    member_id: id,
                })
            }
            Err(why) => Plan::Wait(format!("rolling update waits: {why}")),
        };
    }

    // Defragment members whose database is mostly free pages, one at a
    // time, followers first and the leader last, only in a healthy cluster.
    if health.members().iter().all(|m| m.healthy) {
        let leader = health.leader();
        let mut fragmented: Vec<(bool, u32, u64)> = health
            .voters()
            .filter_map(|m| {
                let s = m.status.as_ref()?;
                let free = s.db_size.saturating_sub(s.db_size_in_use);
                (s.db_size > 0 && free >= DEFRAG_MIN_FREE_BYTES && free * 2 >= s.db_size)
                    .then_some(())?;
                Some((
                    leader == Some(m.member.id),
                    ordinal_of(m.member.id)?,
                    m.member.id,
                ))
            })
            .collect();
        fragmented.sort();
        if let Some(&(_, ordinal, member_id)) = fragmented.first() {
            return Plan::Act(Step::Defragment { ordinal, member_id });
        }
    }

    if let Some(sick) = health.members().iter().find(|m| !m.healthy) {
        return Plan::Wait(format!(
            "member {} is unhealthy{}",
            ordinal_of(sick.member.id)
                .map_or_else(|| format!("{:x}", sick.member.id), |o| obs.names.pod(o)),
            sick.error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ));
    }
    if let Some(step) = record_pvc_step(obs, health, &ordinal_of, |pvc, running| {
        pvc.member_id.is_some()
            && (!pvc.owner_recorded || (running.is_some() && pvc.etcd_version.as_ref() != running))
    }) {
        return Plan::Act(step);
    }
    Plan::Converged
}

/// The first volume `wanted` says needs its annotations (re)written: one
/// whose member runs in a started pod and holds that member's data (a volume
/// recorded for another member is stale storage, handled on its own).
fn record_pvc_step(
    obs: &Observation,
    health: &ClusterHealth,
    ordinal_of: &dyn Fn(u64) -> Option<u32>,
    wanted: impl Fn(&PvcObservation, Option<&String>) -> bool,
) -> Option<Step> {
    health.members().iter().find_map(|m| {
        let running = m
            .status
            .as_ref()
            .map(|s| s.version.clone())
            .filter(|v| !v.is_empty());
        let ordinal = ordinal_of(m.member.id)?;
        let pvc = obs.pvcs.get(&ordinal)?;
        let ours = pvc.member_id.is_none_or(|id| id == m.member.id);
        (ours && obs.pods.get(&ordinal).is_some_and(|p| p.running) && wanted(pvc, running.as_ref()))
            .then_some(Step::RecordPvcMember {
                ordinal,
                member_id: m.member.id,
                version: running,
            })
    })
}

/// Why nothing may be done at all, if so. Checked before every step.
fn refusal(obs: &Observation) -> Option<Refusal> {
    if !obs.conflicts.is_empty() {
        let list: Vec<String> = obs
            .conflicts
            .iter()
            .map(|c| match &c.owner {
                Some(owner) => format!("{} (owned by {owner})", c.object),
                None => format!("{} (not made by etcdfleet: no owner label)", c.object),
            })
            .collect();
        return Some(Refusal {
            reason: "ObjectOwnedElsewhere",
            message: format!(
                "workload objects at this cluster's names belong to someone else: {}; \
                 nothing is written, adopted or deleted. Rename this EtcdCluster or set a \
                 different workloadNamespace",
                list.join(", ")
            ),
        });
    }
    if obs.pki_lost {
        return Some(Refusal {
            reason: "PkiLost",
            message: format!(
                "the CA Secret {} is gone from the management cluster, but the members still use \
                 certificates of the old CA; a new CA would lock every member out. Restore the \
                 Secret (from a backup of the management cluster); nothing is re-keyed",
                obs.names.pki_secret()
            ),
        });
    }
    if let Some(change) = &obs.storage_change {
        return Some(Refusal {
            reason: "StorageImmutable",
            message: format!(
                "{change}; a StatefulSet's volume claim templates cannot change, so nothing is \
                 written. Revert spec.storage"
            ),
        });
    }
    // Data on the volumes, as last recorded: decisive when no member runs
    // (a cluster recreated over kept volumes), a second check otherwise.
    if let Some(requested) = &obs.requested_version {
        for (ordinal, pvc) in &obs.pvcs {
            if let Some(data) = &pvc.etcd_version
                && let Err(rejection) = etcdfleet_api::version::decide_with(
                    Some(data),
                    requested,
                    obs.downgrade_acknowledged.as_deref(),
                )
            {
                return Some(Refusal {
                    reason: "VersionRejected",
                    message: format!(
                        "PVC {} holds data last run by etcd {data}: {}",
                        obs.names.pvc(*ordinal),
                        rejection.message()
                    ),
                });
            }
        }
    }
    if let (Some(requested), EtcdObservation::Observed(health)) =
        (&obs.requested_version, &obs.etcd)
    {
        for m in health.members() {
            if let Some(running) = m.status.as_ref().map(|s| s.version.as_str())
                && !running.is_empty()
                && let Err(rejection) = etcdfleet_api::version::decide_with(
                    Some(running),
                    requested,
                    obs.downgrade_acknowledged.as_deref(),
                )
            {
                return Some(Refusal {
                    reason: "VersionRejected",
                    message: format!(
                        "member {:x} runs {running} (as etcd reports it): {}",
                        m.member.id,
                        rejection.message()
                    ),
                });
            }
        }
    }
    None
}

/// A healthy voter (other than `from`, passing `eligible` on its ordinal) to
/// hand leadership to: the one with the highest raft index, lowest ordinal on ties.
fn pick_new_leader(
    health: &ClusterHealth,
    eligible: &dyn Fn(u32) -> bool,
    ordinal_of: &dyn Fn(u64) -> Option<u32>,
    from: u64,
) -> Option<u64> {
    health
        .voters()
        .filter(|m| m.healthy && m.member.id != from)
        .filter_map(|m| {
            let o = ordinal_of(m.member.id)?;
            eligible(o).then(|| {
                (
                    m.status.as_ref().map_or(0, |s| s.raft_index),
                    o,
                    m.member.id,
                )
            })
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, _, id)| id)
}

fn describe_pods(obs: &Observation) -> String {
    if obs.pods.is_empty() {
        return "the first member pod".to_string();
    }
    obs.pods
        .iter()
        .map(|(o, p)| {
            format!(
                "{} ({})",
                obs.names.pod(*o),
                if p.ready {
                    "ready".to_string()
                } else if p.running {
                    format!("running, not ready, {} restarts", p.restart_count)
                } else {
                    "not running".to_string()
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::{Member, MemberObservation, MemberStatus};

    const IMG: &str = "etcd:v3.5.1";

    fn names() -> Names {
        Names::new("c", "etcd-system")
    }

    /// A member at `ordinal` with id `100 + ordinal`.
    fn member(ordinal: u32, healthy: bool, leader: bool, learner: bool) -> MemberObservation {
        let id = 100 + u64::from(ordinal);
        MemberObservation {
            member: Member {
                id,
                name: names().pod(ordinal),
                peer_urls: vec![names().peer_url(ordinal, true)],
                client_urls: vec![names().client_url(ordinal, true)],
                is_learner: learner,
            },
            status: healthy.then(|| MemberStatus {
                member_id: id,
                version: "3.5.1".into(),
                leader: if leader { id } else { 0 },
                raft_index: 50,
                raft_term: 2,
                raft_applied_index: 50,
                db_size: 1,
                db_size_in_use: 1,
                is_learner: learner,
                errors: vec![],
                storage_version: String::new(),
                downgrade_target: None,
            }),
            healthy,
            error: (!healthy).then(|| "connection refused".to_string()),
        }
    }

    fn pod(image: &str) -> PodObservation {
        PodObservation {
            image: image.into(),
            template_hash: None,
            running: true,
            ready: true,
            restart_count: 0,
            deleting: false,
            ready_means_etcd_healthy: false,
        }
    }

    /// A converged cluster of `n` members, leader at ordinal 0.
    fn converged(n: u32, desired: u32) -> Observation {
        Observation {
            names: names(),
            tls: true,
            desired_replicas: desired,
            stale_objects: vec![],
            statefulset: Some(StatefulSetObservation {
                replicas: n,
                image: IMG.into(),
                template_hash: None,
            }),
            pods: (0..n).map(|o| (o, pod(IMG))).collect(),
            pvcs: (0..n)
                .map(|o| {
                    (
                        o,
                        PvcObservation {
                            member_id: Some(100 + u64::from(o)),
                            owner_recorded: true,
                            etcd_version: Some("3.5.1".into()),
                        },
                    )
                })
                .collect(),
            etcd: EtcdObservation::Observed(ClusterHealth::new(
                (0..n).map(|o| member(o, true, o == 0, false)).collect(),
            )),
            failed_members: BTreeSet::new(),
            failed_long_ago: BTreeSet::new(),
            alarms: vec![],
            conflicts: vec![],
            pki_lost: false,
            storage_change: None,
            requested_version: None,
            downgrade_acknowledged: None,
            version: Default::default(),
            known_voters: n,
            restore: RestoreGate::NotNeeded,
            last_failure: None,
        }
    }

    fn with_members(mut obs: Observation, members: Vec<MemberObservation>) -> Observation {
        obs.etcd = EtcdObservation::Observed(ClusterHealth::new(members));
        obs
    }

    #[test]
    fn converged_cluster_needs_nothing() {
        assert_eq!(plan_next_step(&converged(3, 3)), Plan::Converged);
    }

    #[test]
    fn missing_objects_are_written_first_and_bootstrap_creates_one_member() {
        let mut obs = converged(0, 3);
        obs.statefulset = None;
        obs.etcd = EtcdObservation::Unreachable("no member pods".into());
        obs.stale_objects = vec![
            ObjectKind::Pki,
            ObjectKind::PeerService,
            ObjectKind::MembersConfigMap,
            ObjectKind::StatefulSet,
        ];
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(vec![
                ObjectKind::Pki,
                ObjectKind::PeerService
            ]))
        );
        obs.stale_objects = vec![ObjectKind::MembersConfigMap, ObjectKind::StatefulSet];
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::Bootstrap { replicas: 1 })
        );
    }

    #[test]
    fn a_refused_restore_writes_nothing_and_a_verified_one_bootstraps() {
        let mut obs = converged(0, 3);
        obs.statefulset = None;
        obs.known_voters = 0;
        obs.etcd = EtcdObservation::Unreachable("no member pods".into());
        obs.stale_objects = vec![
            ObjectKind::Pki,
            ObjectKind::PeerService,
            ObjectKind::MembersConfigMap,
            ObjectKind::StatefulSet,
        ];
        let refused = Refusal {
            reason: "ChecksumMismatch",
            message: "snapshot object shop/1.db has SHA-256 ..".into(),
        };
        obs.restore = RestoreGate::Refused(refused.clone());
        assert_eq!(plan_next_step(&obs), Plan::Refuse(refused));
        obs.restore = RestoreGate::Verified;
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(vec![
                ObjectKind::Pki,
                ObjectKind::PeerService
            ]))
        );
    }

    #[test]
    fn a_lost_statefulset_is_recreated_wide_enough_for_every_volume() {
        let mut obs = converged(3, 3);
        obs.statefulset = None;
        obs.pods.clear();
        obs.etcd = EtcdObservation::Unreachable("down".into());
        obs.stale_objects = vec![ObjectKind::StatefulSet];
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::Bootstrap { replicas: 3 })
        );
    }

    #[test]
    fn bootstrap_mode_only_waits_or_adds() {
        let mut obs = converged(3, 1);
        obs.known_voters = 0;
        obs.etcd = EtcdObservation::Unreachable("connection refused".into());
        obs.failed_members = BTreeSet::from([101]);
        match plan_next_step(&obs) {
            Plan::Wait(why) => assert!(why.contains("no etcd member answers"), "{why}"),
            other => panic!("expected wait, got {other:?}"),
        }
        // A StatefulSet scaled below its volumes is widened, never narrowed.
        obs.statefulset.as_mut().unwrap().replicas = 1;
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::ScaleStatefulSet { replicas: 3 })
        );
    }

    #[test]
    fn scale_up_adds_one_learner_then_starts_then_promotes() {
        let obs = converged(1, 3);
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::AddLearner { ordinal: 1 })
        );

        // learner added, not started yet
        let mut learner = member(1, false, false, true);
        learner.member.name.clear();
        learner.member.client_urls.clear();
        let obs2 = with_members(obs.clone(), vec![member(0, true, true, false), learner]);
        assert_eq!(
            plan_next_step(&obs2),
            Plan::Act(Step::ScaleStatefulSet { replicas: 2 })
        );

        // started and caught up
        let mut obs3 = with_members(
            obs.clone(),
            vec![member(0, true, true, false), member(1, true, false, true)],
        );
        obs3.statefulset.as_mut().unwrap().replicas = 2;
        obs3.pods.insert(1, pod(IMG));
        obs3.pvcs.insert(
            1,
            PvcObservation {
                member_id: Some(101),
                owner_recorded: true,
                etcd_version: Some("3.5.1".into()),
            },
        );
        assert_eq!(
            plan_next_step(&obs3),
            Plan::Act(Step::PromoteLearner {
                ordinal: 1,
                member_id: 101
            })
        );
    }

    #[test]
    fn a_new_volume_is_recorded_with_its_member() {
        let mut obs = with_members(
            converged(2, 3),
            vec![member(0, true, true, false), member(1, true, false, true)],
        );
        obs.pvcs.insert(1, PvcObservation::default());
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RecordPvcMember {
                ordinal: 1,
                member_id: 101,
                version: Some("3.5.1".into()),
            })
        );
    }

    #[test]
    fn a_learner_behind_waits() {
        let mut behind = member(1, true, false, true);
        behind.status.as_mut().unwrap().raft_index = 10;
        let obs = with_members(converged(2, 3), vec![member(0, true, true, false), behind]);
        match plan_next_step(&obs) {
            Plan::Wait(why) => {
                assert!(why.contains("not promotable"), "{why}");
                // Stable while the learner catches up: no raft index in it.
                assert!(!why.contains("10") && !why.contains("50"), "{why}");
            }
            other => panic!("expected wait, got {other:?}"),
        }
    }

    #[test]
    fn scaling_waits_while_a_member_is_down_and_says_why() {
        let obs = with_members(
            converged(3, 5),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, false),
            ],
        );
        match plan_next_step(&obs) {
            Plan::Wait(why) => {
                assert!(
                    why.contains("scaling to 5 members waits until every member is healthy"),
                    "{why}"
                );
                assert!(why.contains("c-etcd-2 is not"), "{why}");
            }
            other => panic!("expected wait, got {other:?}"),
        }
        // With two of three down there is no quorum: it waits and says why.
        let obs = with_members(
            converged(3, 5),
            vec![
                member(0, true, true, false),
                member(1, false, false, false),
                member(2, false, false, false),
            ],
        );
        match plan_next_step(&obs) {
            Plan::Hold(why) => assert!(why.contains("quorum lost"), "{why}"),
            other => panic!("expected a hold, got {other:?}"),
        }
    }

    #[test]
    fn scale_down_moves_leadership_away_then_removes_the_highest_member() {
        let obs = with_members(
            converged(5, 3),
            (0..5).map(|o| member(o, true, o == 4, false)).collect(),
        );
        match plan_next_step(&obs) {
            Plan::Act(Step::MoveLeader { from: 104, to }) => assert!(to < 103, "{to}"),
            other => panic!("expected MoveLeader, got {other:?}"),
        }
        let obs = converged(5, 3);
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember {
                ordinal: Some(4),
                member_id: 104,
                cause: RemovalCause::ScaleDown
            })
        );
    }

    #[test]
    fn after_a_removal_the_statefulset_shrinks_and_then_the_pvc_goes() {
        let mut obs = with_members(
            converged(5, 3),
            (0..4).map(|o| member(o, true, o == 0, false)).collect(),
        );
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::ScaleStatefulSet { replicas: 4 })
        );
        obs.statefulset.as_mut().unwrap().replicas = 4;
        obs.pods.remove(&4);
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::DeletePvc { ordinal: 4 })
        );
        // The pod still running: the PVC waits for it.
        obs.pods.insert(4, pod(IMG));
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember {
                ordinal: Some(3),
                member_id: 103,
                cause: RemovalCause::ScaleDown
            })
        );
    }

    #[test]
    fn a_failed_member_is_removed_its_storage_deleted_and_it_rejoins_as_a_learner() {
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, false),
            ],
        );
        obs.failed_members = BTreeSet::from([102]);
        obs.pods.get_mut(&2).unwrap().ready = false;
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember {
                ordinal: Some(2),
                member_id: 102,
                cause: RemovalCause::Failed
            })
        );
        // removed: its volume still holds member 102's data
        let mut obs = with_members(
            converged(3, 3),
            vec![member(0, true, true, false), member(1, true, false, false)],
        );
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::DeleteStaleStorage { ordinal: 2 })
        );
        // fresh volume: it comes back as a learner at the same ordinal
        obs.pvcs.insert(2, PvcObservation::default());
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::AddLearner { ordinal: 2 })
        );
    }

    #[test]
    fn volumes_record_their_owner_and_the_etcd_version_running_on_them() {
        let mut obs = converged(3, 3);
        obs.pvcs.get_mut(&1).unwrap().owner_recorded = false;
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RecordPvcMember {
                ordinal: 1,
                member_id: 101,
                version: Some("3.5.1".into()),
            })
        );
        // After an upgrade the version on the volume follows the member.
        let mut obs = converged(3, 3);
        obs.pvcs.get_mut(&2).unwrap().etcd_version = Some("3.4.23".into());
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RecordPvcMember {
                ordinal: 2,
                member_id: 102,
                version: Some("3.5.1".into()),
            })
        );
        // A volume recorded for another member is stale storage, not re-recorded.
        let mut obs = converged(3, 3);
        let pvc = obs.pvcs.get_mut(&2).unwrap();
        pvc.member_id = Some(999);
        pvc.owner_recorded = false;
        assert!(!matches!(
            plan_next_step(&obs),
            Plan::Act(Step::RecordPvcMember { .. })
        ));
    }

    #[test]
    fn kept_volumes_of_a_newer_or_much_older_etcd_refuse_the_bootstrap() {
        // The cluster was deleted with its volumes kept, and recreated.
        let mut obs = converged(3, 3);
        obs.statefulset = None;
        obs.pods.clear();
        obs.etcd = EtcdObservation::Unreachable("no pods".into());
        obs.known_voters = 0;
        obs.requested_version = Some("3.4.23".into());
        match plan_next_step(&obs) {
            Plan::Refuse(r) => {
                assert_eq!(r.reason, "VersionRejected");
                assert!(
                    r.message.contains("data-c-etcd-0") && r.message.contains("3.5.1"),
                    "{}",
                    r.message
                );
                assert!(r.message.contains("downgrade"), "{}", r.message);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        for pvc in obs.pvcs.values_mut() {
            pvc.etcd_version = Some("3.3.27".into());
        }
        obs.requested_version = Some("3.5.1".into());
        assert!(matches!(plan_next_step(&obs), Plan::Refuse(_)));
        // The same version (or the next minor) starts on the kept data.
        for pvc in obs.pvcs.values_mut() {
            pvc.etcd_version = Some("3.5.1".into());
        }
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::Bootstrap { replicas: 3 })
        );
    }

    #[test]
    fn a_failed_member_is_not_removed_when_that_would_lose_quorum() {
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, false, false, false),
                member(2, false, false, false),
            ],
        );
        obs.failed_members = BTreeSet::from([101, 102]);
        match plan_next_step(&obs) {
            Plan::Hold(why) => {
                assert!(why.contains("quorum lost"), "{why}");
                assert!(why.contains("restore from a backup"), "{why}");
            }
            other => panic!("expected a hold, got {other:?}"),
        }
    }

    #[test]
    fn a_stuck_learner_is_removed() {
        let mut obs = with_members(
            converged(2, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, true),
            ],
        );
        obs.statefulset.as_mut().unwrap().replicas = 3;
        obs.pods.insert(2, pod(IMG));
        obs.pvcs.insert(
            2,
            PvcObservation {
                member_id: Some(102),
                owner_recorded: true,
                ..Default::default()
            },
        );
        obs.failed_members = BTreeSet::from([102]);
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember {
                ordinal: Some(2),
                member_id: 102,
                cause: RemovalCause::Failed
            })
        );
    }

    #[test]
    fn rolling_upgrade_goes_followers_first_then_moves_leadership_then_the_leader() {
        const NEW: &str = "etcd:v3.5.2";
        let mut obs = converged(3, 3);
        obs.statefulset.as_mut().unwrap().image = NEW.into();
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RestartMember {
                ordinal: 1,
                member_id: 101
            })
        );
        obs.pods.insert(1, pod(NEW));
        obs.pods.insert(2, pod(NEW));
        match plan_next_step(&obs) {
            Plan::Act(Step::MoveLeader { from: 100, to }) => assert!(to == 101 || to == 102),
            other => panic!("expected MoveLeader, got {other:?}"),
        }
        let mut obs2 = with_members(
            obs.clone(),
            (0..3).map(|o| member(o, true, o == 1, false)).collect(),
        );
        obs2.pods.insert(1, pod(NEW));
        assert_eq!(
            plan_next_step(&obs2),
            Plan::Act(Step::RestartMember {
                ordinal: 0,
                member_id: 100
            })
        );
    }

    #[test]
    fn rolling_upgrade_waits_while_any_member_is_unhealthy() {
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, false, false, false),
                member(2, true, false, false),
            ],
        );
        obs.statefulset.as_mut().unwrap().image = "etcd:v3.5.2".into();
        match plan_next_step(&obs) {
            Plan::Wait(why) => assert!(why.contains("c-etcd-1 is unhealthy"), "{why}"),
            other => panic!("expected wait, got {other:?}"),
        }
    }

    #[test]
    fn a_single_member_cluster_is_restarted_for_an_upgrade() {
        let mut obs = converged(1, 1);
        obs.statefulset.as_mut().unwrap().image = "etcd:v3.5.2".into();
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RestartMember {
                ordinal: 0,
                member_id: 100
            })
        );
    }

    #[test]
    fn nospace_is_recovered_once_every_member_is_healthy() {
        let mut obs = converged(3, 3);
        obs.alarms = vec![Alarm {
            member_id: 101,
            kind: AlarmKind::NoSpace,
        }];
        assert_eq!(plan_next_step(&obs), Plan::Act(Step::RecoverFromNoSpace));
        let mut sick = with_members(
            obs.clone(),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, false),
            ],
        );
        sick.alarms = obs.alarms.clone();
        match plan_next_step(&sick) {
            Plan::Wait(why) => assert!(why.contains("NOSPACE recovery waits"), "{why}"),
            other => panic!("expected wait, got {other:?}"),
        }
    }

    #[test]
    fn a_corrupt_alarm_is_left_to_a_person() {
        let mut obs = converged(3, 3);
        obs.alarms = vec![Alarm {
            member_id: 102,
            kind: AlarmKind::Corrupt,
        }];
        match plan_next_step(&obs) {
            Plan::Hold(why) => {
                assert!(why.contains("CORRUPT") && why.contains("c-etcd-2"), "{why}")
            }
            other => panic!("expected a hold, got {other:?}"),
        }
    }

    #[test]
    fn fragmented_members_are_defragmented_followers_first_leader_last() {
        let fragmented = |o: u32, leader: bool| {
            let mut m = member(o, true, leader, false);
            let s = m.status.as_mut().unwrap();
            s.db_size = 512 << 20;
            s.db_size_in_use = 100 << 20;
            m
        };
        let obs = with_members(
            converged(3, 3),
            vec![
                fragmented(0, true),
                member(1, true, false, false),
                fragmented(2, false),
            ],
        );
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::Defragment {
                ordinal: 2,
                member_id: 102
            })
        );
        let obs = with_members(
            converged(3, 3),
            vec![
                fragmented(0, true),
                member(1, true, false, false),
                member(2, true, false, false),
            ],
        );
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::Defragment {
                ordinal: 0,
                member_id: 100
            })
        );
        // Small databases are left alone however fragmented.
        let mut small = member(1, true, false, false);
        small.status.as_mut().unwrap().db_size = 10 << 20;
        let obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                small,
                member(2, true, false, false),
            ],
        );
        assert_eq!(plan_next_step(&obs), Plan::Converged);
    }

    fn foreign(id: u64, healthy: bool, learner: bool) -> MemberObservation {
        let mut m = member(0, healthy, false, learner);
        m.member.id = id;
        m.member.name = "someone-else".into();
        m.member.peer_urls = vec!["https://10.9.9.9:2380".into()];
        m.member.client_urls = vec!["https://10.9.9.9:2379".into()];
        if let Some(s) = m.status.as_mut() {
            s.member_id = id;
        }
        m
    }

    fn refused(plan: Plan) -> Refusal {
        match plan {
            Plan::Refuse(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_object_owned_by_another_cluster_refuses_every_step() {
        let mut obs = converged(3, 3);
        obs.stale_objects = vec![ObjectKind::StatefulSet];
        obs.conflicts = vec![ForeignObject {
            object: "StatefulSet/etcd-system/c-etcd".into(),
            owner: Some("team-b.c".into()),
        }];
        let r = refused(plan_next_step(&obs));
        assert_eq!(r.reason, "ObjectOwnedElsewhere");
        assert!(
            r.message
                .contains("StatefulSet/etcd-system/c-etcd (owned by team-b.c)"),
            "{}",
            r.message
        );
        obs.conflicts[0].owner = None;
        assert!(
            refused(plan_next_step(&obs))
                .message
                .contains("no owner label")
        );
    }

    #[test]
    fn lost_pki_and_untakeable_storage_changes_are_refused() {
        let mut obs = converged(3, 3);
        obs.pki_lost = true;
        obs.stale_objects = vec![ObjectKind::Pki];
        assert_eq!(refused(plan_next_step(&obs)).reason, "PkiLost");
        let mut obs = converged(3, 3);
        obs.storage_change = Some("size 8Gi → 16Gi".into());
        assert_eq!(refused(plan_next_step(&obs)).reason, "StorageImmutable");
    }

    #[test]
    fn identity_mismatch_names_what_moved_and_nothing_recorded_passes() {
        let recorded = etcdfleet_api::ManagedIdentity {
            kubeconfig_secret: "a-kubeconfig/value".into(),
            workload_namespace: "etcd-system".into(),
            tls: true,
        };
        assert_eq!(identity_mismatch(None, &recorded), None);
        assert_eq!(identity_mismatch(Some(&recorded), &recorded), None);
        let mut moved = recorded.clone();
        moved.workload_namespace = "other".into();
        moved.tls = false;
        let why = identity_mismatch(Some(&recorded), &moved).unwrap();
        assert!(
            why.contains("workloadNamespace (etcd-system → other)"),
            "{why}"
        );
        assert!(why.contains("tls.enabled (true → false)"), "{why}");
    }

    #[test]
    fn a_version_below_what_etcd_reports_is_refused() {
        // A CR recreated over retained volumes: no status, members at 3.5.1.
        let mut obs = converged(3, 3);
        obs.requested_version = Some("3.4.23".into());
        assert_eq!(refused(plan_next_step(&obs)).reason, "VersionRejected");
        obs.requested_version = Some("3.5.1".into());
        assert_eq!(plan_next_step(&obs), Plan::Converged);
    }

    #[test]
    fn foreign_members_are_reported_never_removed() {
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, true, false, false),
                foreign(999, false, true),
            ],
        );
        obs.failed_members = BTreeSet::from([999]);
        match plan_next_step(&obs) {
            Plan::Hold(why) => assert!(why.contains("3e7") && why.contains("by hand"), "{why}"),
            other => panic!("expected a hold, got {other:?}"),
        }
        // A failed foreign voter is not removed either.
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, true, false, false),
                foreign(999, false, false),
            ],
        );
        obs.failed_members = BTreeSet::from([999]);
        assert!(matches!(plan_next_step(&obs), Plan::Hold(_)));
    }

    #[test]
    fn a_member_unreachable_from_the_controller_but_ready_in_its_pod_is_not_failed() {
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                member(2, false, false, false),
            ],
        );
        obs.failed_members = BTreeSet::from([102]);
        match plan_next_step(&obs) {
            Plan::Wait(why) => assert!(why.contains("pod is ready"), "{why}"),
            other => panic!("expected wait, got {other:?}"),
        }
        // Past the longer grace, it is replaced after all: without a
        // readiness probe, ready only means the process runs.
        obs.failed_long_ago = BTreeSet::from([102]);
        assert!(matches!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember { member_id: 102, .. })
        ));
        // When readiness is etcd's own health check, the workload cluster's
        // view wins however long the controller cannot reach it.
        obs.pods.get_mut(&2).unwrap().ready_means_etcd_healthy = true;
        match plan_next_step(&obs) {
            Plan::Hold(why) => {
                assert!(
                    why.contains("etcd's health check in its pod passes"),
                    "{why}"
                )
            }
            other => panic!("expected a hold, got {other:?}"),
        }
        // Not ready (etcd's check fails too): a failed member, replaced.
        obs.pods.get_mut(&2).unwrap().ready = false;
        assert!(matches!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember { member_id: 102, .. })
        ));
    }

    #[test]
    fn a_learner_whose_pod_never_started_is_not_failed() {
        let mut learner = member(2, false, false, true);
        learner.member.name.clear();
        let mut obs = with_members(
            converged(2, 3),
            vec![
                member(0, true, true, false),
                member(1, true, false, false),
                learner,
            ],
        );
        obs.statefulset.as_mut().unwrap().replicas = 3;
        obs.pods.insert(
            2,
            PodObservation {
                running: false,
                ready: false,
                ..pod(IMG)
            },
        );
        obs.failed_members = BTreeSet::from([102]);
        assert!(matches!(plan_next_step(&obs), Plan::Wait(_)));
    }

    #[test]
    fn scale_down_is_refused_while_a_member_is_unhealthy() {
        let obs = with_members(
            converged(5, 3),
            (0..5).map(|o| member(o, o != 1, o == 0, false)).collect(),
        );
        match plan_next_step(&obs) {
            Plan::Wait(why) => {
                assert!(
                    why.contains("scale-down to 3 members waits") && why.contains("c-etcd-1"),
                    "{why}"
                )
            }
            other => panic!("expected wait, got {other:?}"),
        }
    }

    #[test]
    fn quorum_loss_takes_no_step_and_says_what_a_person_can_do() {
        let mut obs = converged(3, 3);
        obs.etcd = EtcdObservation::Unreachable("context deadline exceeded".into());
        obs.failed_members = BTreeSet::from([100, 101]);
        match plan_next_step(&obs) {
            Plan::Hold(why) => {
                assert!(
                    why.contains("quorum lost") && why.contains("snapshot"),
                    "{why}"
                )
            }
            other => panic!("expected wait, got {other:?}"),
        }
    }

    #[test]
    fn a_controller_cut_off_from_members_ready_in_their_pods_holds_without_claiming_quorum_loss() {
        let cut_off = |why: &str| {
            assert!(
                why.contains("cut off")
                    && why.contains("network")
                    && !why.contains("quorum lost")
                    && !why.contains("restore")
                    && !why.contains("snapshot"),
                "{why}"
            )
        };
        let by_health = |obs: &mut Observation, ordinals: &[u32]| {
            for o in ordinals {
                obs.pods.get_mut(o).unwrap().ready_means_etcd_healthy = true;
            }
        };
        // No member answers; every pod passes etcd's own health check.
        let mut obs = converged(3, 3);
        obs.etcd = EtcdObservation::Unreachable("connection refused".into());
        by_health(&mut obs, &[0, 1, 2]);
        assert_eq!(
            quorum_view(&obs),
            QuorumView::Unreachable(CutOff {
                answering: 0,
                ready_in_pods: 3,
                voters: 3
            })
        );
        match plan_next_step(&obs) {
            Plan::Hold(why) => cut_off(&why),
            other => panic!("expected a hold, got {other:?}"),
        }
        // Two of three ready are still a quorum by the pods' view.
        obs.pods.get_mut(&2).unwrap().ready = false;
        assert!(matches!(quorum_view(&obs), QuorumView::Unreachable(_)));
        // One of three (another being replaced): the members' own health
        // says quorum is lost.
        obs.pods.get_mut(&1).unwrap().deleting = true;
        assert_eq!(
            quorum_view(&obs),
            QuorumView::Lost {
                healthy: 0,
                voters: 3
            }
        );
        match plan_next_step(&obs) {
            Plan::Hold(why) => assert!(why.contains("quorum lost"), "{why}"),
            other => panic!("expected a hold, got {other:?}"),
        }

        // One member answers, two do not but pass their pods' check.
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, false, false, false),
                member(2, false, false, false),
            ],
        );
        by_health(&mut obs, &[1, 2]);
        match plan_next_step(&obs) {
            Plan::Hold(why) => cut_off(&why),
            other => panic!("expected a hold, got {other:?}"),
        }
        // Ready without etcd's health check behind it is no vantage point.
        let mut obs = with_members(
            converged(3, 3),
            vec![
                member(0, true, true, false),
                member(1, false, false, false),
                member(2, false, false, false),
            ],
        );
        assert!(matches!(quorum_view(&obs), QuorumView::Lost { .. }));
        // A cluster no voter was ever seen of is not started, not lost.
        obs.etcd = EtcdObservation::Unreachable("no member pods".into());
        obs.known_voters = 0;
        assert_eq!(quorum_view(&obs), QuorumView::NotStarted);
        assert!(matches!(plan_next_step(&obs), Plan::Wait(_)));
    }

    #[test]
    fn a_pod_from_an_older_template_is_rolled_and_a_rewritten_image_is_not() {
        let mut obs = converged(3, 3);
        obs.statefulset.as_mut().unwrap().template_hash = Some("new".into());
        for p in obs.pods.values_mut() {
            p.template_hash = Some("old".into());
        }
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::RestartMember {
                ordinal: 1,
                member_id: 101
            })
        );
        // Every pod from the current template, images rewritten by a webhook.
        for p in obs.pods.values_mut() {
            p.template_hash = Some("new".into());
            p.image = "mirror.example/etcd@sha256:abc".into();
        }
        assert_eq!(plan_next_step(&obs), Plan::Converged);
    }

    #[test]
    fn a_step_that_keeps_failing_backs_off_exponentially() {
        assert_eq!(retry_delay(1), std::time::Duration::ZERO);
        assert_eq!(retry_delay(2), RETRY_BASE);
        assert_eq!(retry_delay(3), RETRY_BASE * 2);
        assert_eq!(retry_delay(40), RETRY_MAX);
        let mut obs = converged(3, 3);
        obs.alarms = vec![Alarm {
            member_id: 101,
            kind: AlarmKind::NoSpace,
        }];
        obs.last_failure = Some(FailedStep {
            kind: "RecoverFromNoSpace".into(),
            failures: 3,
            age: std::time::Duration::from_secs(2),
            message: "RecoverFromNoSpace: etcd unreachable".into(),
        });
        match plan_next_step(&obs) {
            Plan::Hold(why) => assert!(why.contains("failed 3 time(s)"), "{why}"),
            other => panic!("expected a hold, got {other:?}"),
        }
        obs.last_failure.as_mut().unwrap().age = std::time::Duration::from_secs(11);
        assert_eq!(plan_next_step(&obs), Plan::Act(Step::RecoverFromNoSpace));
    }

    #[test]
    fn destructive_steps_are_marked() {
        assert!(Step::DeletePvc { ordinal: 1 }.is_destructive());
        assert!(!Step::AddLearner { ordinal: 1 }.is_destructive());
    }
}
