//! The planner's answers: one step to take, or why none is taken.

use std::fmt;

/// A workload object the planner found missing or out of date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKind {
    /// The management-side Secret with the CA and the controller's client identity.
    Pki,
    Namespace,
    ServerTlsSecret,
    PeerTlsSecret,
    /// The CA bundle clients read (`<cluster>-etcd-ca-bundle`), published
    /// once a CA rotation was asked for.
    CaBundleConfigMap,
    PeerService,
    ClientService,
    PodDisruptionBudget,
    MembersConfigMap,
    StatefulSet,
}

/// Why the controller refuses to act (reported as `Conflict=True`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Condition reason.
    pub reason: &'static str,
    pub message: String,
}

/// A restore's snapshot that cannot be used, as the restore gate says it.
impl From<etcdfleet_api::restore::Refusal> for Refusal {
    fn from(r: etcdfleet_api::restore::Refusal) -> Self {
        Refusal {
            reason: r.reason,
            message: r.message,
        }
    }
}

/// Why a member is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalCause {
    ScaleDown,
    Failed,
    /// Its volume is on the StorageClass the cluster moves off; its ordinal
    /// rejoins on the new one.
    StorageClassMove,
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
    /// `force_pod`: the pod is deleted without a grace period (a delete of
    /// it is stuck: no kubelet confirms its end).
    DeleteStaleStorage {
        ordinal: u32,
        force_pod: bool,
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
    /// A step of a recovery from a lost quorum ([`RecoveryStep`]).
    Recovery(RecoveryStep),
    /// A step of a storage change ([`super::storage`]).
    Storage(StorageStep),
    /// A step of a change of minor version: a snapshot before it, etcd's
    /// online downgrade ([`super::version`]).
    Version(VersionStep),
    /// Adoption: make the existing cluster's CA (from the join credentials)
    /// this cluster's CA, with the controller's client identity issued from it.
    ImportCa,
    /// Adoption: remove an old member of the adopted cluster from the
    /// membership (recorded in status before it is removed). Its pod,
    /// StatefulSet and volume are its owner's and are never touched.
    RetireMember {
        member_id: u64,
    },
    /// CA rotation (see `etcdfleet_api::ca_rotation`): record the request
    /// in status (`Preparing`).
    StartCaRotation {
        request_id: String,
    },
    /// Generate the new CA beside the old one in the PKI Secret; members
    /// and the controller trust both from now on (`Trusting`).
    GenerateNextCa,
    /// The new CA becomes the cluster's CA (the old one stays trusted);
    /// the controller's client identity is issued from it, the members'
    /// certificates follow (`Reissuing`).
    PromoteNextCa,
    /// Drop the old CA from the bundles (`Completing`).
    DropPreviousCa,
    /// Every member trusts and presents the new CA only (`Completed`).
    CompleteCaRotation,
    /// Recover a lost PKI Secret from the members' current trust: the CA
    /// their TLS Secrets hold (no key) stays trusted beside a new CA, the
    /// server certificate serves as the controller's client identity
    /// meanwhile, and the rotation goes on from `Trusting`.
    RecoverCa {
        request_id: String,
    },
    /// Cancel a rotation before anything was reissued: the new CA is
    /// dropped, members return to the old CA alone (`Cancelled`).
    CancelCaRotation,
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
            Step::Storage(step) => step.kind(),
            Step::Recovery(step) => step.kind(),
            Step::ImportCa => "ImportCa",
            Step::RetireMember { .. } => "RetireMember",
            Step::StartCaRotation { .. } => "StartCaRotation",
            Step::GenerateNextCa => "GenerateNextCa",
            Step::PromoteNextCa => "PromoteNextCa",
            Step::DropPreviousCa => "DropPreviousCa",
            Step::CompleteCaRotation => "CompleteCaRotation",
            Step::CancelCaRotation => "CancelCaRotation",
            Step::RecoverCa { .. } => "RecoverCa",
        }
    }

    /// The ordinal of the member this step takes down or brings up on
    /// purpose: until it is healthy again (within the failure grace) its
    /// trouble is planned, reported as progress, never as `Degraded`.
    /// Growing the StatefulSet starts the member at its last ordinal.
    pub fn planned_disruption(&self) -> Option<u32> {
        match self {
            Step::RestartMember { ordinal, .. }
            | Step::AddLearner { ordinal }
            | Step::PromoteLearner { ordinal, .. }
            | Step::DeleteStaleStorage { ordinal, .. }
            | Step::Defragment { ordinal, .. } => Some(*ordinal),
            Step::ScaleStatefulSet { replicas } => replicas.checked_sub(1),
            Step::Recovery(RecoveryStep::RestartChosen { ordinal }) => Some(*ordinal),
            Step::Storage(StorageStep::RestartForResize { ordinal, .. }) => Some(*ordinal),
            Step::Storage(_) => None,
            Step::Recovery(_)
            | Step::WriteObjects(_)
            | Step::Bootstrap { .. }
            | Step::RecordPvcMember { .. }
            | Step::MoveLeader { .. }
            | Step::RemoveMember { .. }
            | Step::DeletePvc { .. }
            | Step::RecoverFromNoSpace
            | Step::Version(_)
            | Step::ImportCa
            | Step::RetireMember { .. }
            | Step::StartCaRotation { .. }
            | Step::GenerateNextCa
            | Step::PromoteNextCa
            | Step::DropPreviousCa
            | Step::CompleteCaRotation
            | Step::CancelCaRotation
            | Step::RecoverCa { .. } => None,
        }
    }

    /// Whether the step's whole effect is done when its call answers and
    /// the next read shows it (a PVC's annotations, the cluster's own
    /// annotation, leadership, which etcd moves before answering, the
    /// workload objects written): nothing else has to happen before the next
    /// step can be planned. A StatefulSet's pods follow it later, but the
    /// steps after its write look at the pods themselves, and the roll
    /// restarts a member only once the StatefulSet controller has seen the
    /// template (`status.observedGeneration`).
    pub fn is_seen_at_once(&self) -> bool {
        matches!(
            self,
            Step::WriteObjects(_)
                | Step::RecordPvcMember { .. }
                | Step::MoveLeader { .. }
                | Step::Version(VersionStep::ForgetAcknowledgement { .. })
                | Step::Storage(StorageStep::ExpandVolume { .. })
        )
    }

    /// Whether the step can lose data or availability if taken wrongly
    /// (never taken in bootstrap mode).
    pub fn is_destructive(&self) -> bool {
        matches!(
            self,
            Step::RemoveMember { .. }
                | Step::RetireMember { .. }
                | Step::DeletePvc { .. }
                | Step::DeleteStaleStorage { .. }
                | Step::RestartMember { .. }
                | Step::Storage(
                    StorageStep::RestartForResize { .. } | StorageStep::RecreateStatefulSet { .. }
                )
                | Step::Recovery(
                    RecoveryStep::Fence { .. }
                        | RecoveryStep::RestartChosen { .. }
                        | RecoveryStep::ClearForRestore
                )
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
            Step::DeleteStaleStorage { ordinal, force_pod } => write!(
                f,
                "delete the pod and PVC of ordinal {ordinal}: they hold a removed member's data{}",
                if *force_pod {
                    " (the pod without a grace period: no kubelet confirms its end)"
                } else {
                    ""
                }
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
                    RemovalCause::StorageClassMove => "a move to another StorageClass",
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
            Step::Storage(step) => step.fmt(f),
            Step::Recovery(step) => step.fmt(f),
            Step::ImportCa => write!(
                f,
                "import the existing cluster's CA as this cluster's CA (adoption)"
            ),
            Step::RetireMember { member_id } => write!(
                f,
                "remove old member {member_id:x} of the adopted cluster from the membership \
                 (its pod and volume are left to their owner)"
            ),
            Step::StartCaRotation { request_id } => {
                write!(f, "start CA rotation {request_id:?}")
            }
            Step::GenerateNextCa => write!(
                f,
                "CA rotation: generate the new CA; members and the controller trust old and new"
            ),
            Step::PromoteNextCa => write!(
                f,
                "CA rotation: reissue the certificates from the new CA (the old CA stays trusted)"
            ),
            Step::DropPreviousCa => write!(f, "CA rotation: drop the old CA from the bundles"),
            Step::CompleteCaRotation => {
                write!(f, "CA rotation completed: only the new CA is trusted")
            }
            Step::CancelCaRotation => write!(
                f,
                "CA rotation cancelled: drop the new CA, members trust the old CA alone"
            ),
            Step::RecoverCa { request_id } => write!(
                f,
                "recover the lost CA Secret ({request_id:?}) from the members' trust, \
                 and rotate to a new CA"
            ),
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

/// A step of a version change (`act::version` takes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionStep {
    /// Stream a snapshot from a healthy member to the backup destination,
    /// verify it and record it in `status.versionChangeSnapshot`.
    SnapshotBefore { from: String, to: String },
    /// `etcdctl downgrade validate <target>`, then `enable <target>`.
    EnableDowngrade { target: String },
    /// `etcdctl downgrade cancel`: the spec no longer asks for the enabled
    /// downgrade. The acknowledgement is withdrawn with it.
    CancelDowngrade { target: String },
    /// Remove `etcdfleet.dev/allow-downgrade` once the cluster runs the
    /// version it acknowledged.
    ForgetAcknowledgement { version: String },
}

impl VersionStep {
    /// Short name for events, metrics and `status.lastOperation.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            VersionStep::SnapshotBefore { .. } => "SnapshotBeforeVersionChange",
            VersionStep::EnableDowngrade { .. } => "EnableDowngrade",
            VersionStep::CancelDowngrade { .. } => "CancelDowngrade",
            VersionStep::ForgetAcknowledgement { .. } => "ForgetDowngradeAcknowledgement",
        }
    }
}

impl fmt::Display for VersionStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionStep::SnapshotBefore { from, to } => write!(
                f,
                "take a snapshot to the backup destination before moving from {from} to {to}"
            ),
            VersionStep::EnableDowngrade { target } => {
                write!(f, "validate and enable etcd's online downgrade to {target}")
            }
            VersionStep::CancelDowngrade { target } => write!(
                f,
                "cancel etcd's downgrade to {target}: the spec no longer asks for it"
            ),
            VersionStep::ForgetAcknowledgement { version } => write!(
                f,
                "remove the downgrade acknowledgement: the cluster runs {version}"
            ),
        }
    }
}

/// What a recovery from a lost quorum starts from: the evidence, the
/// survivors and the member chosen, recorded in `status.lastRecovery`
/// before any step (see `super::recovery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPlan {
    pub id: String,
    /// The survivor with the most data, and its member id.
    pub chosen: u32,
    pub chosen_id: u64,
    pub kept_revision: i64,
    pub last_seen_revision: Option<i64>,
    pub survivors: Vec<etcdfleet_api::recovery::SurvivorRecord>,
    pub lost: Vec<etcdfleet_api::recovery::LostMemberRecord>,
    /// The backup restored when no member survived (`FromBackup`; then
    /// there is no chosen member: ordinal 0 is seeded, `chosen_id` is 0).
    pub backup: Option<Box<etcdfleet_api::recovery::RecoveryBackup>>,
}

/// The steps of a recovery from a lost quorum, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryStep {
    /// Record the evidence and the member chosen (status only): `Fencing`.
    Begin(Box<RecoveryPlan>),
    /// No lost member comes back as the old cluster: the members ConfigMap
    /// names the chosen member alone, no ordinal above it runs, the lost
    /// members' pods go at once, and their volumes that hold their data.
    /// Then `ForcingNewCluster`.
    Fence {
        chosen: u32,
        /// Ordinal and member id of each lost member.
        lost: Vec<(u32, u64)>,
    },
    /// The pod template carries the `force-new-cluster` init containers.
    WriteForcingTemplate { chosen: u32 },
    /// The chosen member restarts onto that template.
    RestartChosen { ordinal: u32 },
    /// The member forced and serves alone: the pod template without the
    /// init containers (`Regrowing`).
    EndForce,
    /// From a backup: every lost member's objects go (the StatefulSet, the
    /// pods, the PVCs, the members ConfigMap; the PKI, Services and the
    /// cluster's name stay), so nothing of the old membership can start
    /// again. Then `RestoringFromBackup`.
    ClearForRestore,
    /// From a backup: the StatefulSet is created again with one member,
    /// seeded from the backup as a new cluster (`Regrowing`).
    Reseed,
    /// Back at its size, every member healthy (status only): `Completed`.
    Complete,
}

impl RecoveryStep {
    /// Short name for events, metrics and `status.lastOperation.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            RecoveryStep::Begin(_) => "BeginRecovery",
            RecoveryStep::Fence { .. } => "FenceLostMembers",
            RecoveryStep::WriteForcingTemplate { .. } => "WriteForcingTemplate",
            RecoveryStep::RestartChosen { .. } => "RestartRecoveringMember",
            RecoveryStep::EndForce => "EndForceNewCluster",
            RecoveryStep::ClearForRestore => "ClearForRestore",
            RecoveryStep::Reseed => "ReseedFromBackup",
            RecoveryStep::Complete => "CompleteRecovery",
        }
    }
}

impl fmt::Display for RecoveryStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryStep::Begin(p) => {
                let lost = p
                    .lost
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if p.lost.len() == 1 { " is" } else { " are" };
                match &p.backup {
                    Some(b) => write!(
                        f,
                        "recovery {}: record the evidence that {lost} lost, and restore the \
                         newest backup that verifies, {} (revision {})",
                        p.id, b.name, p.kept_revision
                    ),
                    None => write!(
                        f,
                        "recovery {}: record the evidence that {lost} lost, and recover from \
                         member {:x} (revision {}, the most data of the survivors)",
                        p.id, p.chosen_id, p.kept_revision
                    ),
                }
            }
            RecoveryStep::Fence { chosen, lost } => write!(
                f,
                "recovery: fence the lost members (ordinals {:?}): delete their pods and the \
                 volumes holding their data, shrink to ordinal {chosen}, announce it alone",
                lost.iter().map(|(o, _)| *o).collect::<Vec<_>>()
            ),
            RecoveryStep::WriteForcingTemplate { chosen } => write!(
                f,
                "recovery: give the pod template the force-new-cluster init container for \
                 ordinal {chosen}"
            ),
            RecoveryStep::RestartChosen { ordinal } => write!(
                f,
                "recovery: restart ordinal {ordinal} to run etcd once with --force-new-cluster"
            ),
            RecoveryStep::EndForce => write!(
                f,
                "recovery: the member serves alone; take the force-new-cluster init container \
                 out of the pod template"
            ),
            RecoveryStep::ClearForRestore => write!(
                f,
                "recovery: delete the lost members' StatefulSet, pods, volumes and members \
                 ConfigMap (the PKI, Services and name stay)"
            ),
            RecoveryStep::Reseed => write!(
                f,
                "recovery: create the StatefulSet with one member, seeded from the backup"
            ),
            RecoveryStep::Complete => write!(f, "recovery complete: every member is back"),
        }
    }
}

/// A step of a storage change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageStep {
    /// Ask for the new size on one member's claim.
    ExpandVolume { ordinal: u32, size: String },
    /// Restart a member whose volume grew but whose file system grows only
    /// when its pod starts again (`FileSystemResizePending`).
    RestartForResize { ordinal: u32, member_id: u64 },
    /// Delete the StatefulSet, leaving its pods and claims running, so the
    /// next write creates it with claim templates of `size`.
    RecreateStatefulSet { class: Option<String>, size: String },
}

impl StorageStep {
    pub fn kind(&self) -> &'static str {
        match self {
            StorageStep::ExpandVolume { .. } => "ExpandVolume",
            StorageStep::RestartForResize { .. } => "RestartForResize",
            StorageStep::RecreateStatefulSet { .. } => "RecreateStatefulSet",
        }
    }
}

impl fmt::Display for StorageStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageStep::ExpandVolume { ordinal, size } => {
                write!(f, "expand the volume of ordinal {ordinal} to {size}")
            }
            StorageStep::RestartForResize { ordinal, member_id } => write!(
                f,
                "restart member {member_id:x} (ordinal {ordinal}) so its file system grows"
            ),
            StorageStep::RecreateStatefulSet { class, size } => write!(
                f,
                "re-create the StatefulSet around its running pods with {size} volume claims{}",
                class
                    .as_ref()
                    .map(|c| format!(" of StorageClass {c}"))
                    .unwrap_or_default()
            ),
        }
    }
}
