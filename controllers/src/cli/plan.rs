//! `plan`: what the controller would do next for each cluster, and why,
//! from its manifests with status (`kubectl get etcdclusters -o yaml`).
//! The resolution comes from the controller's one choice of source
//! (`etcdcluster::resolve::resolution_source`), the version verdict from
//! its policy, and the next step from its planner, on the observation the
//! controller's own assembler (`etcdcluster::observe::assemble`) makes of
//! readings taken from the status ([`status_readings`]). What the status
//! cannot say (whether the workload objects exist and match, alarms, raft
//! indexes) is taken to be in order; the volumes have `status.volumeSize`
//! (and their StorageClass is not read). Its `Available` condition says when
//! the last reconcile reached too few members to see a quorum (cut off
//! from Ready pods, or quorum lost): then the members list is as last seen,
//! and the plan is made as the controller made it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::time::Duration;

use etcdfleet_api::conditions;
use etcdfleet_api::template::{Resolution, ResolveError, resolve};
use etcdfleet_api::version::{
    VersionChange, VersionRejection, decide_for, image_repository, parse_full_version,
};
use etcdfleet_api::{EtcdCluster, EtcdClusterStatus, MemberStatus};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::manifests::{Manifests, cluster_id};
use crate::etcd::{ClusterHealth, Member, MemberObservation, MemberStatus as EtcdMemberStatus};
use crate::etcdcluster::observe::assemble::{ObjectsReading, Readings, assemble};
use crate::etcdcluster::observe::history::History;
use crate::etcdcluster::observe::recovery;
use crate::etcdcluster::plan::observation::{ClaimSize, StorageObservation};
use crate::etcdcluster::plan::observation::{
    EtcdObservation, Observation, PodObservation, PvcObservation, StatefulSetObservation,
};
use crate::etcdcluster::plan::plan_next_step;
use crate::etcdcluster::plan::quorum::{QuorumView, quorum_view};
use crate::etcdcluster::plan::step::{Plan, RemovalCause, Step, StorageStep};
use crate::etcdcluster::resolve::{
    ResolutionSource, render_inputs, resolution_source, resolve_own_spec,
};
use crate::render::{Names, RenderInputs};
use etcdfleet_api::recovery::QuorumLossPolicy;

/// The version policy's verdict on a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionVerdict {
    Accepted(VersionChange),
    Rejected(VersionRejection),
}

impl fmt::Display for VersionVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionVerdict::Accepted(VersionChange::Initial { requested }) => {
                write!(f, "accepted: create at {requested}")
            }
            VersionVerdict::Accepted(VersionChange::NoChange { version }) => {
                write!(f, "no-op: already runs {version}")
            }
            VersionVerdict::Accepted(VersionChange::PatchUpgrade { from, to }) => {
                write!(f, "accepted: patch upgrade from {from} to {to}")
            }
            VersionVerdict::Accepted(VersionChange::MinorUpgrade { from, to }) => {
                write!(f, "accepted: minor upgrade from {from} to {to}")
            }
            VersionVerdict::Accepted(VersionChange::Downgrade { from, to }) => {
                write!(f, "accepted: online downgrade from {from} to {to}")
            }
            VersionVerdict::Rejected(r) => write!(
                f,
                "rejected: VersionAccepted=False ({}): {}",
                r.reason(),
                r.message()
            ),
        }
    }
}

/// What `plan` says about one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPlan {
    pub cluster: String,
    /// `Err((reason, message))` when the cluster does not resolve
    /// (`TemplateResolved=False`).
    pub resolve: Result<ResolutionBasis, (String, String)>,
    pub version: Option<VersionVerdict>,
    /// What the controller does next, one line (`upgrade: …`, `scale: …`,
    /// `waiting: …`, `no change`, `blocked: …`).
    pub next: String,
    /// The planner's own answer, when `plan` asked it (the status lists
    /// members); `None` for a cluster it could only describe (it does not
    /// resolve, or it was never observed).
    pub planned: Option<Plan>,
    pub paused: bool,
    /// One line per EtcdBackupSchedule of the cluster given beside it: its
    /// next restore drill ([`super::drill::drill_lines`]).
    pub drills: Vec<String>,
}

/// How a cluster's plan counts toward `plan`'s exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PlanOutcome {
    /// Converged, or paused: the controller would do nothing.
    NoChange,
    /// The controller would act or is waiting to (not converged).
    Changes,
    /// It cannot proceed: the template does not resolve, the version is
    /// rejected, or the next step is blocked.
    Blocked,
}

/// `plan` exit code when every cluster is converged.
pub const EXIT_NO_CHANGE: u8 = 0;
/// `plan` / `render` exit code for input errors: an unreadable file, YAML
/// that does not parse, an object the API server would refuse.
pub const EXIT_INPUT_ERROR: u8 = 2;
/// `plan` exit code when some cluster has changes to make.
pub const EXIT_CHANGES: u8 = 3;
/// `plan` exit code when some cluster is rejected or blocked.
pub const EXIT_BLOCKED: u8 = 4;

/// The exit code of `plan`: input errors first, then blocked, then changes.
pub fn plan_exit_code(plans: &[ClusterPlan], invalid_inputs: usize) -> u8 {
    if invalid_inputs > 0 {
        return EXIT_INPUT_ERROR;
    }
    match plans.iter().map(ClusterPlan::outcome).max() {
        Some(PlanOutcome::Blocked) => EXIT_BLOCKED,
        Some(PlanOutcome::Changes) => EXIT_CHANGES,
        Some(PlanOutcome::NoChange) | None => EXIT_NO_CHANGE,
    }
}

impl ClusterPlan {
    pub fn outcome(&self) -> PlanOutcome {
        let rejected = matches!(self.version, Some(VersionVerdict::Rejected(_)));
        if self.resolve.is_err() || rejected || self.next.starts_with("blocked") {
            PlanOutcome::Blocked
        } else if self.paused || self.next == "no change" {
            PlanOutcome::NoChange
        } else {
            PlanOutcome::Changes
        }
    }
}

impl fmt::Display for ClusterPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "EtcdCluster {}", self.cluster)?;
        match &self.resolve {
            Ok(ResolutionBasis::Templates) => {
                writeln!(f, "  template: TemplateResolved=True (from its templates)")?
            }
            Ok(ResolutionBasis::Materialized) => writeln!(
                f,
                "  template: TemplateResolved=True (template values already in the spec)"
            )?,
            Err((reason, message)) => writeln!(
                f,
                "  template: TemplateResolved=False ({reason}): {message}"
            )?,
        }
        if let Some(v) = &self.version {
            writeln!(f, "  version: {v}")?;
        }
        writeln!(f, "  next: {}", self.next)?;
        for drill in &self.drills {
            writeln!(f, "  drill: {drill}")?;
        }
        if self.paused {
            writeln!(
                f,
                "  paused: spec.paused is true, so the step above is not taken"
            )?;
        }
        Ok(())
    }
}

/// What a resolution was computed from, as `plan` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolutionBasis {
    /// The template chain given, merged under the cluster's spec.
    Templates,
    /// The cluster's own spec: its template values were already written into it.
    Materialized,
}

/// How a cluster resolves, from the source the controller would use (see
/// [`resolution_source`]).
fn resolve_as_the_controller(
    cluster: &EtcdCluster,
    manifests: &Manifests,
) -> Result<(Resolution, ResolutionBasis), ResolveError> {
    match resolution_source(cluster) {
        ResolutionSource::OwnSpec => {
            let basis = match cluster.spec.template_ref {
                Some(_) => ResolutionBasis::Materialized,
                None => ResolutionBasis::Templates,
            };
            resolve_own_spec(&cluster.spec).map(|r| (r, basis))
        }
        ResolutionSource::Templates => {
            let (ct, t) = manifests.templates_for(cluster)?;
            resolve(ct, t, &cluster.spec).map(|r| (r, ResolutionBasis::Templates))
        }
    }
}

/// Plans every cluster in the manifests; `now` and `member_failure_grace`
/// decide which unhealthy members count as failed.
pub fn plan_all(
    manifests: &Manifests,
    now: Timestamp,
    member_failure_grace: Duration,
) -> Vec<ClusterPlan> {
    manifests
        .clusters
        .iter()
        .map(|c| plan_cluster(c, manifests, now, member_failure_grace))
        .collect()
}

/// What the controller would do next for one cluster, and why.
pub fn plan_cluster(
    cluster: &EtcdCluster,
    manifests: &Manifests,
    now: Timestamp,
    member_failure_grace: Duration,
) -> ClusterPlan {
    let id = cluster_id(cluster);
    let paused = cluster.spec.paused == Some(true);
    let (resolution, basis) = match resolve_as_the_controller(cluster, manifests) {
        Ok(r) => r,
        Err(e) => {
            return ClusterPlan {
                cluster: id,
                resolve: Err((e.reason().to_string(), e.to_string())),
                version: None,
                next: format!("blocked: fix {e}"),
                planned: None,
                paused,
                drills: super::drill::drill_lines(cluster, manifests),
            };
        }
    };
    let status = cluster.status.clone().unwrap_or_default();
    let current = status.current_version.clone();
    let requested = resolution.spec.version.to_string();
    let verdict = match decide_for(current.as_deref(), &requested, cluster.annotations()) {
        Ok(change) => VersionVerdict::Accepted(change),
        Err(r) => VersionVerdict::Rejected(r),
    };
    let mut inputs = render_inputs(cluster, &resolution);
    let repository = image_repository(&inputs.image);
    let plan = |next: String, planned: Option<Plan>| ClusterPlan {
        cluster: id.clone(),
        resolve: Ok(basis),
        version: Some(verdict.clone()),
        next,
        planned,
        paused,
        drills: super::drill::drill_lines(cluster, manifests),
    };
    if let Some(next) = without_members(&status, &verdict) {
        return plan(next, None);
    }
    if let VersionVerdict::Rejected(_) = &verdict {
        // The controller holds the StatefulSet at the running version.
        if let Some(v) = current.as_deref().and_then(parse_full_version) {
            inputs.image = format!("{repository}:v{v}");
        }
    }
    let replicas = resolution.spec.replicas.max(1) as u32;
    if status.members.is_empty() {
        let next = format!(
            "create: no members in status yet; write the workload objects and bootstrap \
             member 0 of {replicas} (the others join one at a time as learners)"
        );
        return plan(next, None);
    }
    let readings = status_readings(&inputs, replicas, &status, now, member_failure_grace);
    let mut obs = assemble(readings);
    unanswered_as_reported(&status, &mut obs);
    obs.recovery = offline_recovery(resolution.spec.recovery, &status, &obs, now);
    let planned = plan_next_step(&obs);
    plan(describe_plan(&planned, &obs), Some(planned))
}

/// What a recovery from a lost quorum decides from, offline: the policy,
/// the status's record and failure clock; the workload cluster's volumes
/// and Nodes are not read, so a loss is judged on what the status says.
fn offline_recovery(
    policy: etcdfleet_api::recovery::ResolvedRecovery,
    status: &EtcdClusterStatus,
    obs: &crate::etcdcluster::plan::Observation,
    now: Timestamp,
) -> crate::etcdcluster::plan::RecoveryObservation {
    let down_since = match &obs.etcd {
        EtcdObservation::Observed(h) => {
            crate::etcdcluster::observe::history::down_since(status, h, policy.lost_after, now)
        }
        EtcdObservation::Unreachable(_) => {
            recovery::recorded_down_since(status, policy.lost_after, now)
        }
    };
    let none_answers = matches!(obs.etcd, EtcdObservation::Unreachable(_));
    crate::etcdcluster::plan::RecoveryObservation {
        policy,
        record: status.last_recovery.clone(),
        down_since,
        nodes: Some(Err(
            "etcdfleet plan does not read the workload cluster's volumes or Nodes".into(),
        )),
        last_seen_revision: None,
        local_view: None,
        pinned: Some(Err(
            "etcdfleet plan does not read the workload cluster's PersistentVolumes".into(),
        )),
        recorded_voters: match none_answers {
            true => recovery::recorded_voters(status),
            false => Vec::new(),
        },
        backup: (none_answers && policy.quorum_loss == QuorumLossPolicy::FromBackup)
            .then(|| Err("etcdfleet plan does not read the backups".into())),
    }
}

/// The plan of a status that lists no members, when it is not a new
/// cluster's: one story, never "create" beside a refusal or beside a
/// version the status says runs.
fn without_members(status: &EtcdClusterStatus, verdict: &VersionVerdict) -> Option<String> {
    if !status.members.is_empty() {
        return None;
    }
    match (verdict, status.current_version.as_deref()) {
        (VersionVerdict::Rejected(r), _) => Some(format!(
            "blocked: spec.version is refused ({}); nothing is created or changed until it is fixed",
            r.reason()
        )),
        (_, Some(running)) => Some(format!(
            "observe first: the status records etcd {running} running but lists no members \
             (the last reconcile reached none); the controller reads the members, pods and \
             volumes before acting, and never bootstraps over a cluster that ran"
        )),
        (_, None) => None,
    }
}

/// The readings `plan` has of a cluster, taken from its status: each
/// listed member has its pod (running the image of its reported version)
/// and its PVC; the workload objects and the PKI are taken to be present
/// and current; the status's memory (failure grace, last step) is read as
/// the controller reads it.
pub fn status_readings(
    inputs: &RenderInputs,
    desired_replicas: u32,
    status: &EtcdClusterStatus,
    now: Timestamp,
    member_failure_grace: Duration,
) -> Readings {
    let names: Names = inputs.names();
    let entries = status_entries(&names, &status.members);
    let health = ClusterHealth::new(member_observations(&entries, &names, inputs.tls));
    let history = History::of(status, (Some(&health), &names), member_failure_grace, now);
    let (pods, mut pvcs) = pods_and_volumes_from_status(&entries, inputs);
    let storage = volumes_from_status(status, inputs, &mut pvcs);
    let sts_replicas = pods.keys().max().map_or(0, |o| o + 1);
    Readings {
        names,
        tls: inputs.tls,
        desired_replicas,
        // Ownership, PKI and storage are read from the workload cluster,
        // which `plan` does not contact.
        objects: ObjectsReading {
            pki_present: true,
            ..Default::default()
        },
        statefulset: Some(StatefulSetObservation {
            replicas: sts_replicas,
            image: inputs.image.clone(),
            template_hash: None,
            template_seen: true,
            forcing: None,
            deleting: false,
        }),
        pods,
        pvcs,
        etcd: EtcdObservation::Observed(health),
        // Alarms are not in the status; `plan` cannot see them.
        alarms: Vec::new(),
        storage,
        // The version policy is reported on its own line (VersionAccepted).
        requested_version: None,
        downgrade_acknowledged: None,
        version: Default::default(),
        history,
        // A running cluster: the restore gate applies only before bootstrap.
        restore: Default::default(),
        ca_rotation: Default::default(),
        recovery: Default::default(),
    }
}

/// The volumes as `status.volumeSize` last saw them: every member's claim,
/// and the StatefulSet's claim template, of that size. Without it (a status
/// older than the field) storage is not judged.
fn volumes_from_status(
    status: &EtcdClusterStatus,
    inputs: &RenderInputs,
    pvcs: &mut BTreeMap<u32, PvcObservation>,
) -> StorageObservation {
    let Some(have) = &status.volume_size else {
        return StorageObservation::default();
    };
    for pvc in pvcs.values_mut() {
        pvc.size = ClaimSize {
            class: inputs.storage_class.clone(),
            requested: Some(have.clone()),
            capacity: Some(have.clone()),
            ..ClaimSize::default()
        };
    }
    StorageObservation {
        size: inputs.storage_size.clone(),
        class: inputs.storage_class.clone(),
        template: Some((inputs.storage_class.clone(), Some(have.clone()))),
        ..StorageObservation::default()
    }
}

/// A listed member: its ordinal (from its name or peer URL), an id (its own,
/// else a made-up one no other member has) and its status.
type StatusEntry<'a> = (Option<u32>, u64, &'a MemberStatus);

fn status_entries<'a>(names: &Names, members: &'a [MemberStatus]) -> Vec<StatusEntry<'a>> {
    let mut used_ids = BTreeSet::new();
    members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let ordinal = names.ordinal_of(&m.name).or_else(|| {
                m.peer_urls
                    .iter()
                    .find_map(|u| names.ordinal_of_peer_url(u))
            });
            let id =
                m.id.as_deref()
                    .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                    .filter(|id| *id != 0 && !used_ids.contains(id))
                    .unwrap_or(0x1000 + i as u64);
            used_ids.insert(id);
            (ordinal, id, m)
        })
        .collect()
}

/// What etcd would say about each listed member.
fn member_observations(
    entries: &[StatusEntry<'_>],
    names: &Names,
    tls: bool,
) -> Vec<MemberObservation> {
    let leader = entries
        .iter()
        .find(|(_, _, m)| m.leader && m.healthy && !m.learner)
        .map_or(0, |(_, id, _)| *id);
    entries
        .iter()
        .map(|(ordinal, id, m)| {
            let peer_urls = match ordinal {
                Some(o) => vec![names.peer_url(*o, tls)],
                None => m.peer_urls.clone(),
            };
            let member = Member {
                id: *id,
                name: m.name.clone(),
                peer_urls,
                client_urls: m.client_urls.clone(),
                is_learner: m.learner,
            };
            // Raft indexes are not in the status: healthy members count as caught up.
            let status = m.healthy.then(|| EtcdMemberStatus {
                member_id: *id,
                cluster_id: 0,
                version: m.version.clone().unwrap_or_default(),
                leader,
                raft_index: 1,
                raft_term: 1,
                raft_applied_index: 1,
                db_size: m.db_size_bytes.unwrap_or(0),
                db_size_in_use: m.db_size_in_use_bytes.unwrap_or(0),
                is_learner: m.learner,
                ..Default::default()
            });
            MemberObservation {
                member,
                status,
                healthy: m.healthy,
                error: m.message.clone(),
            }
        })
        .collect()
}

/// The pods and volumes of the listed members at this cluster's ordinals.
fn pods_and_volumes_from_status(
    entries: &[StatusEntry<'_>],
    inputs: &RenderInputs,
) -> (BTreeMap<u32, PodObservation>, BTreeMap<u32, PvcObservation>) {
    let repository = image_repository(&inputs.image).to_string();
    let ordinals: BTreeMap<u32, &MemberStatus> = entries
        .iter()
        .filter_map(|(o, _, m)| o.map(|o| (o, *m)))
        .collect();
    let ids: BTreeMap<u32, u64> = entries
        .iter()
        .filter_map(|(o, id, _)| o.map(|o| (o, *id)))
        .collect();
    let pods = ordinals
        .iter()
        .map(|(o, m)| {
            let image = m
                .version
                .as_deref()
                .and_then(parse_full_version)
                .map_or_else(|| inputs.image.clone(), |v| format!("{repository}:v{v}"));
            (
                *o,
                PodObservation {
                    image,
                    template_hash: None,
                    running: true,
                    ready: m.healthy,
                    restart_count: 0,
                    deleting: false,
                    stuck_deleting: false,
                    ready_means_etcd_healthy: true,
                    last_exit: None,
                    node: None,
                    forcing: None,
                },
            )
        })
        .collect();
    // Offline, volumes are taken as recorded for the member status lists
    // (what the controller would have written): no bookkeeping step shows.
    let pvcs = ids
        .iter()
        .map(|(o, id)| {
            (
                *o,
                PvcObservation {
                    member_id: Some(*id),
                    owner_recorded: true,
                    etcd_version: ordinals.get(o).and_then(|m| m.version.clone()),
                    deleting: false,
                    size: Default::default(),
                },
            )
        })
        .collect();
    (pods, pvcs)
}

/// What the members list cannot say, `Available` does: when the last
/// reconcile reached too few members to see a quorum, the list holds the
/// members as last seen. `MembersUnreachableFromController`: their pods were
/// Ready by etcd's own health check (the controller is cut off, not etcd);
/// `QuorumLost` while the list still shows a quorum healthy: no member
/// answered and their pods were not Ready. Planned as the controller did,
/// so `plan` says what the controller says (no restore advice for a cut-off
/// controller).
fn unanswered_as_reported(status: &EtcdClusterStatus, obs: &mut Observation) {
    let Some(available) = conditions::find(&status.conditions, conditions::AVAILABLE) else {
        return;
    };
    let ready = match available.reason.as_str() {
        conditions::MEMBERS_UNREACHABLE_FROM_CONTROLLER => true,
        conditions::QUORUM_LOST => false,
        _ => return,
    };
    if ready {
        obs.pods.values_mut().for_each(|p| p.ready = true);
    }
    if let QuorumView::Healthy { .. } = quorum_view(obs) {
        obs.etcd = EtcdObservation::Unreachable(format!(
            "the last reconcile reported Available {}: {}",
            available.status, available.reason
        ));
        obs.pods.values_mut().for_each(|p| p.ready = ready);
    }
}

/// One line for the planner's answer, in the operator's words.
pub fn describe_plan(plan: &Plan, obs: &Observation) -> String {
    let step = match plan {
        Plan::Converged => return "no change".to_string(),
        Plan::Wait(why) => return format!("waiting: {why}"),
        // Nothing will move by itself: `plan` exits with the blocked code.
        Plan::Hold(why) => return format!("blocked, needs attention: {why}"),
        Plan::Refuse(r) => return format!("refused ({}): {}", r.reason, r.message),
        Plan::Act(step) => step,
    };
    let health = match &obs.etcd {
        EtcdObservation::Observed(h) => Some(h),
        EtcdObservation::Unreachable(_) => None,
    };
    let pod_of = |id: u64| -> String {
        health
            .and_then(|h| h.member(id))
            .and_then(|m| m.member.peer_urls.first())
            .and_then(|u| obs.names.ordinal_of_peer_url(u))
            .map_or_else(|| format!("{id:x}"), |o| obs.names.pod(o))
    };
    let image = obs
        .statefulset
        .as_ref()
        .map(|s| s.image.clone())
        .unwrap_or_default();
    let rolling = obs.pods.values().any(|p| p.image != image);
    let mut out = String::new();
    let _ = match step {
        Step::RestartMember { ordinal, .. } => write!(
            out,
            "{}: restart member {} onto {image}",
            if rolling { "upgrade" } else { "restart" },
            obs.names.pod(*ordinal)
        ),
        Step::MoveLeader { from, to } => write!(
            out,
            "{}: move leadership from {} to {}",
            if rolling { "upgrade" } else { "scale" },
            pod_of(*from),
            pod_of(*to)
        ),
        Step::RemoveMember {
            member_id, cause, ..
        } => write!(
            out,
            "{}: remove member {} ({member_id:x}){}",
            match cause {
                RemovalCause::ScaleDown => "scale",
                RemovalCause::Failed => "repair",
                RemovalCause::StorageClassMove => "storage",
            },
            pod_of(*member_id),
            match cause {
                RemovalCause::ScaleDown => " to shrink the cluster".to_string(),
                RemovalCause::StorageClassMove => {
                    " : its volume is on the StorageClass the cluster moves off".to_string()
                }
                RemovalCause::Failed => {
                    " : it has been unhealthy past the failure grace period".to_string()
                }
            }
        ),
        Step::PromoteLearner { ordinal, .. } => write!(
            out,
            "scale: promote learner {} to a voting member",
            obs.names.pod(*ordinal)
        ),
        Step::AddLearner { .. } | Step::ScaleStatefulSet { .. } | Step::DeletePvc { .. } => {
            write!(out, "scale: {step}")
        }
        Step::DeleteStaleStorage { .. } | Step::RecordPvcMember { .. } => {
            write!(out, "repair: {step}")
        }
        Step::WriteObjects(_) | Step::Bootstrap { .. } => write!(out, "create: {step}"),
        Step::RecoverFromNoSpace | Step::Defragment { .. } => write!(out, "maintenance: {step}"),
        Step::Version(_) => write!(out, "version: {step}"),
        Step::Storage(StorageStep::ExpandVolume { .. }) => write!(
            out,
            "storage: {step} (the StorageClass must allow expansion: checked against the \
             workload cluster)"
        ),
        Step::Storage(_) => write!(out, "storage: {step}"),
        Step::ImportCa | Step::RetireMember { .. } => write!(out, "adopt: {step}"),
        _ => write!(out, "ca-rotation: {step}"),
    };
    out
}
