//! Report step: the new status as a pure function ([`compose`]) of the
//! stored status and what one reconcile learned ([`Learned`]: the
//! template and version verdicts, whether the workload cluster answered,
//! the observation, the restore check, the decision and its outcome). It
//! is written only when it differs from the stored one (by
//! [`super::cluster_object::ClusterObject`]), so a converged cluster costs
//! no write. Conditions keep their `lastTransitionTime` unless their status
//! changes.

use std::collections::BTreeSet;

use etcdfleet_api::conditions::{
    self, AVAILABLE, CONFLICT, DEGRADED, MEMBERS_UNREACHABLE_FROM_CONTROLLER, PROGRESSING,
    QUORUM_HEALTHY, QUORUM_LOST, REMOTE_REACHABLE, TEMPLATE_RESOLVED, VERSION_ACCEPTED,
    VERSION_SUPPORTED,
};
use etcdfleet_api::restore::RestoreRecord;
use etcdfleet_api::template::ResolveError;
use etcdfleet_api::version::{VersionChange, VersionRejection};
use etcdfleet_api::{
    AppliedTemplate, EtcdCluster, EtcdClusterStatus, ManagedIdentity, MemberStatus,
    OperationStatus, VersionChangeSnapshot,
};
use kube::{Resource, ResourceExt};

use super::context::now;
use super::plan::observation::{EtcdObservation, Observation, RestoreGate};
use super::plan::quorum::{QUORUM_LOSS_HELP, QuorumView, quorum_view};
use super::plan::step::{Refusal, RemovalCause, Step};
use super::plan::storage::sizes as storage;

mod adopt;
mod ca_rotation;
mod recovery;
use crate::etcd::{AlarmKind, ClusterHealth};
use crate::render::{self, Names};

/// What one reconcile learned, stage by stage. Each stage returns its part
/// and the pipeline keeps it here; nothing in it decides anything.
#[derive(Default)]
pub struct Learned {
    /// admission: a refusal before any workload I/O (the identity).
    pub admission_refusal: Option<Refusal>,
    /// resolve: the template chain, when it was applied or failed.
    pub template: Option<TemplateOutcome>,
    /// resolve: the spec resolved completely.
    pub resolved: bool,
    /// resolve: the version policy's verdict.
    pub version: Option<VersionVerdict>,
    /// connect, observe: whether the workload API answered.
    pub remote: Option<Remote>,
    /// observe: what the planner saw.
    pub observation: Option<Observation>,
    /// observe: a restoring cluster's snapshot check, and the verified record.
    pub restore: Option<(RestoreGate, Option<RestoreRecord>)>,
    /// plan and act: what the reconcile decided, and how its step went.
    pub decision: Option<Decision>,
    /// act: the identity recorded before the first workload write.
    pub identity: Option<ManagedIdentity>,
    /// act: an old member about to be retired (recorded before the removal).
    pub retiring: Option<u64>,
    /// act: the snapshot taken before a change of minor version.
    pub snapshot: Option<VersionChangeSnapshot>,
}

/// The template chain, as the resolve stage found it.
pub enum TemplateOutcome {
    /// Its values were written into the spec (the record of which template).
    Applied(Option<AppliedTemplate>),
    /// It does not resolve: nothing is changed until the spec is fixed.
    Failed(ResolveError),
}

/// The version policy's verdict on the spec's version.
pub enum VersionVerdict {
    Accepted(VersionChange),
    /// Refused; the cluster keeps `running` (`None`: it never ran).
    Rejected {
        rejection: VersionRejection,
        running: Option<semver::Version>,
    },
}

/// Whether the workload API answered this reconcile.
pub enum Remote {
    Reachable {
        server: String,
    },
    /// Why not: the connector's short reason and its message.
    Unreachable {
        reason: &'static str,
        message: String,
    },
}

/// What the reconcile decided, and how the step went.
pub enum Decision {
    Refused(Refusal),
    /// Paused: the step it would take.
    Paused(Option<String>),
    Converged,
    Waiting(String),
    Held(String),
    /// About to take a step whose intent is recorded first (a retirement).
    Acting,
    /// Took `step`; `error` says how it failed, if it did.
    Acted {
        step: Step,
        error: Option<String>,
    },
}

/// The status [`compose`] made, and what the reconcile says about it.
pub struct Composed {
    pub status: EtcdClusterStatus,
    /// Why the reconcile could not go on, when it could not.
    pub blocked: Option<String>,
    /// An adoption event to publish: `(warning, reason, note)`.
    pub adoption_event: Option<(bool, &'static str, String)>,
}

impl Composed {
    /// Why the reconcile could not go on (for `Outcome::Blocked`).
    pub fn blocked_reason(&self) -> String {
        self.blocked.clone().unwrap_or_else(|| "blocked".into())
    }
}

/// The new status of `cluster` (its stored status, plus what this reconcile
/// `learned`), stage by stage. Pure: no read, no write.
pub fn compose(cluster: &EtcdCluster, learned: &Learned) -> Composed {
    let mut b = Builder::new(cluster);
    if let Some(r) = &learned.admission_refusal {
        b.refused(r);
        return b.done(None);
    }
    b.resolution(learned);
    match &learned.remote {
        Some(Remote::Unreachable { reason, message }) => {
            b.remote_unreachable(reason, message);
            return b.done(None);
        }
        Some(Remote::Reachable { server }) => b.remote_reachable(server),
        None => {}
    }
    let mut adoption_event = None;
    if let Some(obs) = &learned.observation {
        b.observed(obs);
        adoption_event = b.adoption(obs);
    }
    if let Some((gate, record)) = &learned.restore {
        if let Some(record) = record {
            b.new.restore = Some(record.clone());
        }
        b.restore_checked(gate);
    }
    if let Some(decision) = &learned.decision {
        b.decided(decision, learned.identity.as_ref());
        if let (Decision::Acted { step, error: None }, Some(obs)) = (decision, &learned.observation)
        {
            b.replaced(step, obs);
        }
    }
    if let Some(id) = learned.retiring {
        b.record_retirement(id);
    }
    if let Some(snapshot) = &learned.snapshot {
        b.new.version_change_snapshot = Some(snapshot.clone());
    }
    b.done(adoption_event)
}

/// The status being built by [`compose`].
struct Builder {
    generation: Option<i64>,
    old: EtcdClusterStatus,
    new: EtcdClusterStatus,
    blocked: Option<String>,
    /// The naming of the cluster's objects, once observed (names the member
    /// a step acts on in `lastOperation.target`).
    names: Option<Names>,
}

impl Builder {
    fn new(cluster: &EtcdCluster) -> Self {
        let old = cluster.status.clone().unwrap_or_default();
        let mut new = old.clone();
        new.observed_generation = cluster.meta().generation;
        new.rollout = rollout_record(cluster);
        Builder {
            generation: cluster.meta().generation,
            old,
            new,
            blocked: None,
            names: None,
        }
    }

    fn done(self, adoption_event: Option<(bool, &'static str, String)>) -> Composed {
        Composed {
            status: self.new,
            blocked: self.blocked,
            adoption_event,
        }
    }

    /// The resolve stage's verdicts: the template and the version.
    fn resolution(&mut self, learned: &Learned) {
        match &learned.template {
            Some(TemplateOutcome::Failed(e)) => return self.template_failed(e),
            Some(TemplateOutcome::Applied(Some(record))) => {
                self.new.template = Some(record.clone())
            }
            _ => {}
        }
        if learned.resolved {
            self.template_resolved();
        }
        match &learned.version {
            Some(VersionVerdict::Accepted(change)) => {
                self.version_accepted(change);
                self.version_support(change.target());
            }
            Some(VersionVerdict::Rejected { rejection, running }) => {
                self.version_rejected(rejection);
                if let Some(running) = running {
                    self.version_support(running);
                }
            }
            None => {}
        }
    }

    /// What the plan and the act said.
    fn decided(&mut self, decision: &Decision, identity: Option<&ManagedIdentity>) {
        if let Decision::Refused(r) = decision {
            return self.refused(r);
        }
        self.no_conflict();
        if let Decision::Paused(next) = decision {
            return self.paused(next.as_deref());
        }
        if let Some(identity) = identity {
            self.record_identity(identity);
        }
        match decision {
            Decision::Converged => self.converged(),
            Decision::Waiting(why) => self.waiting(why),
            Decision::Held(why) => self.held(why),
            Decision::Acted { step, error } => self.acted(step, error.as_deref()),
            Decision::Refused(_) | Decision::Paused(_) | Decision::Acting => {}
        }
    }

    /// Refuses to act: `Conflict=True`, nothing progresses.
    fn refused(&mut self, refusal: &Refusal) {
        self.set(CONFLICT, true, refusal.reason, refusal.message.clone());
        self.set(
            PROGRESSING,
            false,
            refusal.reason,
            "nothing is written to the workload cluster or etcd until the conflict is resolved",
        );
        self.blocked = Some(refusal.message.clone());
    }

    /// The restore snapshot's check: `RestoreFailed=True` naming the object
    /// and why, or `False` once it verified.
    fn restore_checked(&mut self, gate: &RestoreGate) {
        use etcdfleet_api::restore::RESTORE_FAILED;
        match gate {
            RestoreGate::Refused(r) => self.set(RESTORE_FAILED, true, r.reason, r.message.clone()),
            RestoreGate::Verified => self.set(
                RESTORE_FAILED,
                false,
                "SnapshotVerified",
                "the snapshot exists with the recorded size and SHA-256, and was written by an \
                 etcd minor that spec.version may run on",
            ),
            RestoreGate::NotNeeded => {}
        }
    }

    /// No conflict stands in the way (clears an earlier `Conflict=True`).
    fn no_conflict(&mut self) {
        if self.new.conditions.iter().any(|c| c.type_ == CONFLICT) {
            self.set(CONFLICT, false, "NoConflict", "no conflict");
        }
    }

    /// Records the identity this resource manages (once; see `status.identity`).
    fn record_identity(&mut self, identity: &etcdfleet_api::ManagedIdentity) {
        if self.new.identity.is_none() {
            self.new.identity = Some(identity.clone());
        }
    }

    fn set(&mut self, type_: &str, status: bool, reason: &str, message: impl Into<String>) {
        conditions::set_condition(
            &mut self.new.conditions,
            conditions::condition(type_, status, reason, message, self.generation, now()),
        );
    }

    fn set_unknown(&mut self, type_: &str, reason: &str, message: impl Into<String>) {
        conditions::set_condition(
            &mut self.new.conditions,
            conditions::unknown_condition(type_, reason, message, self.generation, now()),
        );
    }

    /// `Available` (and, when the controller is cut off, `Degraded`) from
    /// what the members answer and what their pods' health checks say (see
    /// [`quorum_view`]). `why`: why no member answered at all, if none did.
    fn quorum(&mut self, obs: &Observation, why: Option<&str>) {
        match quorum_view(obs) {
            QuorumView::Healthy { healthy, voters } => self.set(
                AVAILABLE,
                true,
                QUORUM_HEALTHY,
                format!("{healthy} of {voters} voting members healthy"),
            ),
            QuorumView::Unreachable(cut) => {
                let message = cut.describe(why);
                self.set_unknown(AVAILABLE, MEMBERS_UNREACHABLE_FROM_CONTROLLER, &message);
                self.set_unknown(DEGRADED, MEMBERS_UNREACHABLE_FROM_CONTROLLER, message);
            }
            QuorumView::Lost { healthy, voters } => {
                let message = match why {
                    Some(why) => format!(
                        "none of the {voters} known voting members answers ({why}) and their \
                         pods do not pass etcd's health check either; {QUORUM_LOSS_HELP}"
                    ),
                    None => format!(
                        "only {healthy} of {voters} voting members healthy; etcd cannot serve \
                         writes; {QUORUM_LOSS_HELP}"
                    ),
                };
                self.set(AVAILABLE, false, QUORUM_LOST, message);
            }
            QuorumView::NotStarted => self.set(
                AVAILABLE,
                false,
                "NoMemberAnswers",
                format!(
                    "no etcd member answers: {}",
                    why.unwrap_or("no voting member")
                ),
            ),
        }
    }

    fn template_failed(&mut self, e: &ResolveError) {
        self.set(TEMPLATE_RESOLVED, false, e.reason(), e.to_string());
        self.set(
            PROGRESSING,
            false,
            "InvalidSpec",
            format!("nothing is changed until this is fixed: {e}"),
        );
        self.blocked = Some(e.to_string());
    }

    fn template_resolved(&mut self) {
        let (reason, message) = match &self.new.template {
            Some(t) if !t.not_carried.is_empty() => (
                "NotCarried",
                format!(
                    "spec is complete; defaults were taken from {} {} (generation {}), but \
                     the rebase did not carry: {}",
                    t.kind,
                    t.name,
                    t.generation.unwrap_or_default(),
                    t.not_carried.join("; ")
                ),
            ),
            Some(t) => (
                "Resolved",
                format!(
                    "spec is complete; defaults were taken from {} {} (generation {})",
                    t.kind,
                    t.name,
                    t.generation.unwrap_or_default()
                ),
            ),
            None => ("Resolved", "spec is complete".to_string()),
        };
        self.set(TEMPLATE_RESOLVED, true, reason, message);
    }

    fn version_accepted(&mut self, change: &VersionChange) {
        let (reason, message) = match change {
            VersionChange::Initial { requested } => {
                ("Initial", format!("creating the cluster at {requested}"))
            }
            VersionChange::NoChange { version } => ("Current", format!("running {version}")),
            VersionChange::PatchUpgrade { from, to } => (
                "PatchUpgrade",
                format!("rolling upgrade from {from} to {to}"),
            ),
            VersionChange::MinorUpgrade { from, to } => (
                "MinorUpgrade",
                format!("rolling upgrade from {from} to {to}"),
            ),
            VersionChange::Downgrade { from, to } => (
                "Downgrade",
                format!(
                    "online downgrade from {from} to {to} (acknowledged): etcd's downgrade is \
                     enabled, then members are replaced one at a time, leader last"
                ),
            ),
        };
        self.set(VERSION_ACCEPTED, true, reason, message);
    }

    /// `VersionSupported`: a warning naming the upgrade path when the etcd
    /// project no longer supports `version` or advises against it.
    fn version_support(&mut self, version: &semver::Version) {
        match etcdfleet_api::version::notice(version) {
            Some(notice) => self.set(VERSION_SUPPORTED, false, notice.reason(), notice.message()),
            None => self.set(
                VERSION_SUPPORTED,
                true,
                "Supported",
                format!("etcd {version} is a supported release"),
            ),
        }
    }

    fn version_rejected(&mut self, rejection: &VersionRejection) {
        self.set(
            VERSION_ACCEPTED,
            false,
            rejection.reason(),
            format!(
                "{}; the cluster keeps its current version",
                rejection.message()
            ),
        );
        if self.new.current_version.is_none() {
            self.blocked = Some(rejection.message());
        }
    }

    fn remote_unreachable(&mut self, reason: &str, message: &str) {
        self.set(REMOTE_REACHABLE, false, reason, message);
        self.set(
            PROGRESSING,
            false,
            "WorkloadClusterUnreachable",
            "no action is taken while the workload cluster cannot be reached",
        );
        self.blocked = Some(message.to_string());
    }

    fn remote_reachable(&mut self, server: &str) {
        self.set(
            REMOTE_REACHABLE,
            true,
            "Connected",
            format!("workload API {server} answers"),
        );
    }

    /// What was observed: the members' status, the version they agree on,
    /// and the Available and Degraded conditions.
    fn observed(&mut self, planner: &Observation) {
        self.names = Some(planner.names.clone());
        let names = &planner.names;
        self.new.selector = Some(render::selector_string(names));
        // Without a quorum, the survivors' own view of the membership (read
        // when a recovery could start) keeps each member's failure clock.
        let health = match (&planner.etcd, &planner.recovery.local_view) {
            (EtcdObservation::Observed(health), _) => health,
            (EtcdObservation::Unreachable(_), Some(Ok(view))) => view,
            (EtcdObservation::Unreachable(why), _) => {
                return self.no_member_answers(planner, why);
            }
        };
        self.new.no_member_answers_since = None;
        let members = self.member_statuses(health, names);
        self.new.replicas = health.voter_count() as i32;
        self.new.ready_members = health.healthy_voter_count() as i32;
        // The version is what etcd reports once every member runs the same one;
        // while they differ (an upgrade in flight) the last agreed version stays.
        let versions: BTreeSet<_> = members.iter().map(|m| m.version.clone()).collect();
        if versions.len() == 1
            && let Some(Some(v)) = versions.into_iter().next()
        {
            self.new.current_version = Some(v);
        }
        let (planned, unhealthy): (Vec<&MemberStatus>, Vec<&MemberStatus>) = members
            .iter()
            .filter(|m| !m.healthy)
            .partition(|m| self.planned(m, &planner.failed_members));
        let planned: Vec<String> = planned.iter().map(|m| m.name.clone()).collect();
        let unhealthy: Vec<String> = unhealthy.iter().map(|m| m.name.clone()).collect();
        self.new.members = members;
        self.new.volume_size =
            storage::volume_size(planner).or_else(|| self.old.volume_size.clone());
        self.alarms_and_health(planner, unhealthy, planned);
    }

    fn no_member_answers(&mut self, planner: &Observation, why: &str) {
        self.new.ready_members = 0;
        // Down, not cut off: the pods fail etcd's own health check too.
        let down = matches!(quorum_view(planner), QuorumView::Lost { .. });
        self.new.no_member_answers_since = match down {
            true => (self.old.no_member_answers_since.clone()).or_else(|| Some(now())),
            false => None,
        };
        if self.bootstrapping() {
            // Nothing is down that ever ran: the first member is starting.
            self.set(
                DEGRADED,
                false,
                "Bootstrapping",
                format!("the first member is starting ({why})"),
            );
        } else {
            self.set(
                DEGRADED,
                true,
                "NoMemberAnswers",
                format!("no etcd member answers: {why}"),
            );
        }
        self.quorum(planner, Some(why));
    }

    /// No member has ever been observed: the cluster is being created.
    fn bootstrapping(&self) -> bool {
        self.old.members.is_empty() && self.old.current_version.is_none()
    }

    /// The member the last step took down or brought up on purpose, while
    /// within its failure grace: its trouble is progress, not degradation.
    fn planned(&self, member: &MemberStatus, failed: &BTreeSet<u64>) -> bool {
        let Some(op) = &self.old.last_operation else {
            return false;
        };
        let id = member
            .id
            .as_deref()
            .and_then(|i| u64::from_str_radix(i, 16).ok());
        op.outcome == "Succeeded"
            && op.target.as_deref() == Some(member.name.as_str())
            && id.is_none_or(|id| !failed.contains(&id))
    }

    /// `status.members`, sorted by name; a member's failure grace starts at
    /// its first unhealthy observation and is kept from the stored status.
    fn member_statuses(&self, health: &ClusterHealth, names: &Names) -> Vec<MemberStatus> {
        let leader = health.leader();
        let mut members = Vec::new();
        for m in health.members() {
            let id = format!("{:x}", m.member.id);
            let ordinal = m
                .member
                .peer_urls
                .first()
                .and_then(|u| names.ordinal_of_peer_url(u));
            let previous = self
                .old
                .members
                .iter()
                .find(|s| s.id.as_deref() == Some(&id));
            members.push(MemberStatus {
                name: ordinal.map_or_else(|| m.member.name.clone(), |o| names.pod(o)),
                id: Some(id),
                peer_urls: m.member.peer_urls.clone(),
                client_urls: m.member.client_urls.clone(),
                version: m.status.as_ref().map(|s| s.version.clone()),
                leader: leader == Some(m.member.id),
                learner: m.member.is_learner,
                healthy: m.healthy,
                db_size_bytes: reported_size(
                    m.status.as_ref().map(|s| s.db_size),
                    previous.and_then(|p| p.db_size_bytes),
                ),
                db_size_in_use_bytes: reported_size(
                    m.status.as_ref().map(|s| s.db_size_in_use),
                    previous.and_then(|p| p.db_size_in_use_bytes),
                ),
                message: (!m.healthy)
                    .then(|| m.error.clone())
                    .flatten()
                    .map(|e| conditions::bounded(e, conditions::MESSAGE_LIMIT)),
                unhealthy_since: if m.healthy {
                    None
                } else {
                    previous
                        .and_then(|p| p.unhealthy_since.clone())
                        .or_else(|| Some(now()))
                },
            });
        }
        members.sort_by(|a, b| a.name.cmp(&b.name));
        members
    }

    /// Available (NOSPACE, else quorum) and Degraded (alarms, else the
    /// unhealthy members), once `self.new.members` is set.
    fn alarms_and_health(
        &mut self,
        planner: &Observation,
        unhealthy: Vec<String>,
        planned: Vec<String>,
    ) {
        let alarmed = |kind: AlarmKind| -> Vec<String> {
            planner
                .alarms
                .iter()
                .filter(|a| a.kind == kind)
                .map(|a| {
                    self.new
                        .members
                        .iter()
                        .find(|m| m.id.as_deref() == Some(&format!("{:x}", a.member_id)))
                        .map_or_else(|| format!("{:x}", a.member_id), |m| m.name.clone())
                })
                .collect()
        };
        let (nospace, corrupt) = (alarmed(AlarmKind::NoSpace), alarmed(AlarmKind::Corrupt));
        if !nospace.is_empty() {
            self.set(
                AVAILABLE,
                false,
                "NoSpace",
                format!(
                    "etcd refuses writes: NOSPACE alarm raised by {}",
                    nospace.join(", ")
                ),
            );
        } else {
            self.quorum(planner, None);
        }
        if !corrupt.is_empty() || !nospace.is_empty() {
            let (reason, who) = if corrupt.is_empty() {
                ("AlarmNOSPACE", nospace)
            } else {
                ("AlarmCORRUPT", corrupt)
            };
            self.set(
                DEGRADED,
                true,
                reason,
                format!("etcd alarm raised by {}", who.join(", ")),
            );
        } else if unhealthy.is_empty() && !planned.is_empty() {
            self.set(
                DEGRADED,
                false,
                "PlannedDisruption",
                format!(
                    "{} restarting or joining as planned (see Progressing)",
                    planned.join(", ")
                ),
            );
        } else if unhealthy.is_empty() {
            self.set(
                DEGRADED,
                false,
                "AllMembersHealthy",
                "every member is healthy",
            );
        } else {
            self.set(
                DEGRADED,
                true,
                "MemberUnhealthy",
                format!("unhealthy: {}", unhealthy.join(", ")),
            );
        }
    }

    fn paused(&mut self, next: Option<&str>) {
        let message = match next {
            Some(step) => format!("spec.paused is true; the next step would be: {step}"),
            None => "spec.paused is true; nothing would be done".to_string(),
        };
        self.set(PROGRESSING, false, "Paused", message);
    }

    fn converged(&mut self) {
        self.set(
            PROGRESSING,
            false,
            "Converged",
            "the cluster matches its spec",
        );
    }

    fn waiting(&mut self, why: &str) {
        self.set(PROGRESSING, true, "Waiting", why);
    }

    /// Nothing progresses until a person acts: Progressing is False.
    fn held(&mut self, why: &str) {
        self.set(PROGRESSING, false, "NeedsAttention", why);
    }

    fn acted(&mut self, step: &Step, error: Option<&str>) {
        self.set(PROGRESSING, true, step.kind(), step.to_string());
        // Failures of the same step in a row (the planner backs off on them).
        let failures = match (error, &self.old.last_operation) {
            (None, _) => None,
            (Some(_), Some(prev)) if prev.type_ == step.kind() && prev.outcome == "Failed" => {
                Some(prev.failures.unwrap_or(1).saturating_add(1))
            }
            (Some(_), _) => Some(1),
        };
        let target = step
            .planned_disruption()
            .zip(self.names.as_ref())
            .map(|(ordinal, names)| names.pod(ordinal))
            .or_else(|| self.still_coming_back(step));
        self.new.last_operation = Some(OperationStatus {
            type_: step.kind().to_string(),
            target,
            outcome: if error.is_some() {
                "Failed"
            } else {
                "Succeeded"
            }
            .to_string(),
            message: Some(conditions::bounded(
                match error {
                    Some(e) => format!("{step}: {e}"),
                    None => step.to_string(),
                },
                conditions::MESSAGE_LIMIT,
            )),
            time: Some(now()),
            failures,
        });
        if error.is_none() {
            self.ca_rotation_moved(step);
            self.recovery_moved(step);
            self.restarted(step);
        }
    }

    /// A failed member removed (to be replaced: its volume goes, it joins
    /// again empty) is counted under its name, with how its container last
    /// ended, as the planner judged it (`Observation::replacements`); the
    /// planner bounds the next one by it. At most 16 records are kept, the
    /// oldest going first.
    fn replaced(&mut self, step: &Step, obs: &Observation) {
        use etcdfleet_api::replacement::{Replacement, ReplacementStatus};
        let Step::RemoveMember {
            ordinal: Some(ordinal),
            member_id,
            cause: RemovalCause::Failed,
        } = step
        else {
            return;
        };
        let nth = match obs.replacements.get(member_id) {
            Some(Replacement::Allowed { nth }) => *nth,
            _ => 1,
        };
        let member = obs.names.pod(*ordinal);
        let records = &mut self.new.replacements;
        records.retain(|r| r.member != member);
        records.push(ReplacementStatus {
            member,
            count: nth as i32,
            last_time: Some(now()),
            last_exit: obs.pods.get(ordinal).and_then(|p| p.last_exit.clone()),
        });
        if records.len() > 16 {
            records.sort_by_key(|r| r.last_time.as_ref().map(|t| t.0));
            records.remove(0);
        }
    }

    /// A bookkeeping step (a volume record while a roll waits) taken while
    /// the member the last step took down is still coming back keeps that
    /// member as its target: its trouble stays planned, not `Degraded`.
    fn still_coming_back(&self, step: &Step) -> Option<String> {
        if !matches!(step, Step::RecordPvcMember { .. }) {
            return None;
        }
        let op = self
            .old
            .last_operation
            .as_ref()
            .filter(|op| op.outcome == "Succeeded")?;
        let target = op.target.as_ref()?;
        let member = self.new.members.iter().find(|m| &m.name == target)?;
        (!member.healthy).then(|| target.clone())
    }

    /// A member the controller has just restarted gets its failure grace
    /// afresh: until it is up again, its trouble is the restart's, not the
    /// one it may have had before (a member that could not start on a
    /// version, restarted onto the one its data ran, must not be removed
    /// while it starts).
    fn restarted(&mut self, step: &Step) {
        let Step::RestartMember { member_id, .. } = step else {
            return;
        };
        let id = format!("{member_id:x}");
        if let Some(m) = self
            .new
            .members
            .iter_mut()
            .find(|m| m.id.as_ref() == Some(&id))
        {
            m.unhealthy_since = None;
        }
    }
}

/// The fleet rollout whose change the spec carries, as the rollout wrote
/// it on the cluster with its change (`status.rollout`).
pub fn rollout_record(cluster: &EtcdCluster) -> Option<etcdfleet_api::RolloutRecord> {
    use etcdfleet_api::rollout::{ROLLOUT_ANNOTATION, ROLLOUT_CHANGE_ANNOTATION};
    let annotations = cluster.annotations();
    annotations
        .get(ROLLOUT_ANNOTATION)
        .map(|name| etcdfleet_api::RolloutRecord {
            name: name.clone(),
            change: annotations.get(ROLLOUT_CHANGE_ANNOTATION).cloned(),
        })
}

/// The database size shown in status: the last one shown until it moved by
/// more than a tenth (and at least 1 MiB). A database that grows with every
/// write would otherwise make every poll a status write of every cluster,
/// for a figure nobody acts on at that precision.
pub fn reported_size(now: Option<i64>, shown: Option<i64>) -> Option<i64> {
    match (now, shown) {
        (Some(now), Some(shown)) => {
            let moved = (now - shown).abs();
            Some(if moved > (shown / 10).max(1 << 20) {
                now
            } else {
                shown
            })
        }
        (now, _) => now,
    }
}

#[cfg(test)]
mod tests {
    use etcdfleet_api::{EtcdCluster, EtcdClusterStatus, OperationStatus};

    use super::super::plan::EtcdObservation;
    use super::super::plan::tests::{converged, member, with_members};
    use super::*;

    fn cluster(status: EtcdClusterStatus) -> EtcdCluster {
        let mut c = EtcdCluster::new("c", Default::default());
        c.status = Some(status);
        c
    }

    fn restarted(target: &str) -> EtcdClusterStatus {
        EtcdClusterStatus {
            current_version: Some("3.5.1".into()),
            last_operation: Some(OperationStatus {
                type_: "RestartMember".into(),
                target: Some(target.into()),
                outcome: "Succeeded".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn degraded(report: &Builder) -> (String, String) {
        let c = conditions::find(&report.new.conditions, DEGRADED).expect("Degraded set");
        (c.status.clone(), c.reason.clone())
    }

    /// Three members, the one at `down` not answering.
    fn one_down(down: u32) -> Observation {
        let members = (0..3).map(|o| member(o, o != down, o == 0 && down != 0, false));
        with_members(converged(3, 3), members.collect())
    }

    #[test]
    fn a_member_the_last_step_restarted_is_progress_not_degradation() {
        let mut report = Builder::new(&cluster(restarted("c-etcd-1")));
        report.observed(&one_down(1));
        assert_eq!(
            degraded(&report),
            ("False".to_string(), "PlannedDisruption".to_string())
        );
    }

    #[test]
    fn a_volume_record_while_a_restarted_member_comes_back_keeps_its_restart_planned() {
        // The roll restarted c-etcd-1; while it comes back, the next step
        // records another member's volume. The reconcile after sees
        // c-etcd-1 still down: planned, not Degraded.
        let mut report = Builder::new(&cluster(restarted("c-etcd-1")));
        report.observed(&one_down(1));
        let record = Step::RecordPvcMember {
            ordinal: 2,
            member_id: 102,
            version: Some("3.5.1".into()),
        };
        report.acted(&record, None);
        let op = report.new.last_operation.clone().unwrap();
        assert_eq!(op.target.as_deref(), Some("c-etcd-1"));
        let mut next = Builder::new(&cluster(report.new.clone()));
        next.observed(&one_down(1));
        assert_eq!(
            degraded(&next),
            ("False".to_string(), "PlannedDisruption".to_string())
        );
        // Back up: a record has no target of its own.
        let mut up = Builder::new(&cluster(report.new.clone()));
        up.observed(&converged(3, 3));
        up.acted(&record, None);
        assert_eq!(up.new.last_operation.unwrap().target, None);
    }

    #[test]
    fn a_member_down_that_no_step_took_down_is_degraded() {
        let mut report = Builder::new(&cluster(restarted("c-etcd-2")));
        report.observed(&one_down(1));
        assert_eq!(
            degraded(&report),
            ("True".to_string(), "MemberUnhealthy".to_string())
        );
        // Past its failure grace, a restarted member is trouble too.
        let mut obs = one_down(1);
        obs.failed_members.insert(101);
        let mut report = Builder::new(&cluster(restarted("c-etcd-1")));
        report.observed(&obs);
        assert_eq!(degraded(&report).0, "True");
    }

    #[test]
    fn a_cluster_whose_first_member_is_starting_is_not_degraded() {
        let mut obs = converged(1, 1);
        obs.etcd = EtcdObservation::Unreachable("connection refused".into());
        let mut report = Builder::new(&cluster(EtcdClusterStatus::default()));
        report.observed(&obs);
        assert_eq!(
            degraded(&report),
            ("False".to_string(), "Bootstrapping".to_string())
        );
        // Once a member ran, nobody answering is trouble.
        let mut report = Builder::new(&cluster(restarted("c-etcd-0")));
        report.observed(&obs);
        assert_ne!(degraded(&report).1, "Bootstrapping");
    }

    #[test]
    fn no_member_answers_since_is_kept_while_every_member_is_down_and_cleared_otherwise() {
        let mut down = converged(3, 3);
        down.etcd = EtcdObservation::Unreachable("connection refused".into());
        for pod in down.pods.values_mut() {
            pod.ready = false;
        }
        let mut report = Builder::new(&cluster(restarted("c-etcd-0")));
        report.observed(&down);
        let since = report.new.no_member_answers_since.clone();
        assert!(since.is_some(), "every member down: the clock starts");
        let mut again = Builder::new(&cluster(report.new.clone()));
        again.observed(&down);
        assert_eq!(
            again.new.no_member_answers_since, since,
            "kept, not restarted"
        );
        // Cut off from pods that pass etcd's health check: not down.
        let mut cut_off = down.clone();
        for pod in cut_off.pods.values_mut() {
            pod.ready = true;
            pod.ready_means_etcd_healthy = true;
        }
        let mut report = Builder::new(&cluster(again.new.clone()));
        report.observed(&cut_off);
        assert_eq!(report.new.no_member_answers_since, None);
        // A member answers: cleared.
        let mut report = Builder::new(&cluster(again.new.clone()));
        report.observed(&converged(3, 3));
        assert_eq!(report.new.no_member_answers_since, None);
    }

    #[test]
    fn the_last_operation_names_the_member_a_step_takes_down() {
        let mut report = Builder::new(&cluster(EtcdClusterStatus::default()));
        report.observed(&converged(3, 3));
        report.acted(
            &Step::RestartMember {
                ordinal: 2,
                member_id: 102,
            },
            None,
        );
        let op = report.new.last_operation.as_ref().expect("recorded");
        assert_eq!(op.target.as_deref(), Some("c-etcd-2"));
        report.acted(&Step::ScaleStatefulSet { replicas: 3 }, None);
        let op = report.new.last_operation.as_ref().expect("recorded");
        assert_eq!(
            op.target.as_deref(),
            Some("c-etcd-2"),
            "growing starts the last ordinal"
        );
    }

    #[test]
    fn a_restarted_member_starts_its_failure_grace_afresh() {
        let mut status = restarted("c-etcd-0");
        status.members = vec![MemberStatus {
            name: "c-etcd-1".into(),
            id: Some(format!("{:x}", 101)),
            unhealthy_since: Some(now()),
            ..Default::default()
        }];
        let mut report = Builder::new(&cluster(status));
        report.observed(&one_down(1));
        let since = |r: &Builder| {
            r.new
                .members
                .iter()
                .find(|m| m.name == "c-etcd-1")
                .unwrap()
                .unhealthy_since
                .clone()
        };
        assert!(since(&report).is_some(), "down, and counted");
        report.acted(
            &Step::RestartMember {
                ordinal: 1,
                member_id: 101,
            },
            None,
        );
        assert_eq!(since(&report), None, "the restart's own grace starts");
    }

    #[test]
    fn database_sizes_in_status_move_only_by_a_tenth_or_more() {
        const MIB: i64 = 1 << 20;
        assert_eq!(reported_size(Some(5 * MIB), None), Some(5 * MIB));
        assert_eq!(reported_size(None, Some(5 * MIB)), None);
        // Small growth keeps what was shown: no status write.
        assert_eq!(
            reported_size(Some(5 * MIB + 900_000), Some(5 * MIB)),
            Some(5 * MIB)
        );
        assert_eq!(
            reported_size(Some(109 * MIB), Some(100 * MIB)),
            Some(100 * MIB)
        );
        // More than a tenth (and a MiB) is shown, either way.
        assert_eq!(
            reported_size(Some(112 * MIB), Some(100 * MIB)),
            Some(112 * MIB)
        );
        assert_eq!(
            reported_size(Some(80 * MIB), Some(100 * MIB)),
            Some(80 * MIB)
        );
        assert_eq!(reported_size(Some(7 * MIB), Some(5 * MIB)), Some(7 * MIB));
    }
}
