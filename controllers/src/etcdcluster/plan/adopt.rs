//! Adoption: taking over a running etcd (`spec.bootstrap.join`) without
//! downtime, one safe step at a time.
//!
//! 1. **Preflight** ([`preflight`]), on every reconcile until the first
//!    change: the endpoints' scheme matches `spec.tls`, the credentials hold
//!    a CA, the controller trusts the existing members' servers and they
//!    accept it, every member is healthy, no learner is pending, the
//!    version policy accepts `spec.version` from theirs, no member uses this
//!    cluster's names, and the existing members' peer ports accept the peer
//!    certificate etcdfleet's members will present (and present one that
//!    verifies). A failed check is a refusal: nothing is written anywhere.
//! 2. **The existing CA** becomes this cluster's CA ([`import_ca`]).
//! 3. **Join**: the existing membership is recorded in status first; then
//!    each member of this cluster is added as a learner, started and
//!    promoted once caught up (the learner rules), one at a time
//!    ([`first_member`], [`take_over`]).
//! 4. **Retire**: once this cluster's members are all voters, leadership
//!    moves to one of them and the old members are removed one at a time
//!    under the quorum guard, each removal recorded in status before it is
//!    made.
//!
//! Throughout, a change of the existing membership that etcdfleet did not
//! make (a member appearing, an old member vanishing) halts the takeover
//! ([`adoption_gate`]): another owner is still at work.

use std::collections::BTreeSet;

use etcdfleet_api::adopt::reason;

use crate::etcd::{ClusterHealth, MemberObservation, ProbeError};

use super::members::Members;
use super::observation::{AdoptionObservation, EtcdObservation, Observation, ProbedPort};
use super::step::{ObjectKind, Plan, Refusal, Step};

/// Where a takeover stands, as the planner and the status see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdoptionState {
    /// Nothing changed yet and a check fails: refused.
    Refused(Refusal),
    /// Nothing changed yet and every check passes.
    Ready,
    /// The existing membership changed underneath the takeover.
    Halted(String),
    /// This cluster's members are joining.
    Joining,
    /// This cluster's members hold the cluster; old members are leaving.
    Retiring,
    /// No old member is left.
    Completed,
    /// The takeover started but etcd does not answer: nothing can be said.
    Unknown,
}

/// Whether a member's peer URL is one of this cluster's.
fn is_ours(obs: &Observation, m: &MemberObservation) -> bool {
    m.member
        .peer_urls
        .first()
        .and_then(|u| obs.names.ordinal_of_peer_url(u))
        .is_some()
}

/// The ids of the members that are not this cluster's.
fn old_members(obs: &Observation, health: &ClusterHealth) -> BTreeSet<u64> {
    health
        .members()
        .iter()
        .filter(|m| !is_ours(obs, m))
        .map(|m| m.member.id)
        .collect()
}

/// The takeover started: this cluster has a StatefulSet or a member in etcd.
fn started(obs: &Observation) -> bool {
    obs.statefulset.is_some()
        || matches!(&obs.etcd, EtcdObservation::Observed(h)
            if h.members().iter().any(|m| is_ours(obs, m)))
}

/// Where the takeover of an adopting cluster stands (`None`: it does not adopt).
pub fn adoption_state(obs: &Observation) -> Option<AdoptionState> {
    let a = obs.adoption.as_ref()?;
    if !started(obs) {
        return Some(match preflight(obs, a) {
            Ok(()) => AdoptionState::Ready,
            Err(refusal) => AdoptionState::Refused(refusal),
        });
    }
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return Some(AdoptionState::Unknown);
    };
    if let Some(change) = membership_change(obs, a, health) {
        return Some(AdoptionState::Halted(change));
    }
    let ours = health
        .voters()
        .filter(|m| is_ours(obs, m))
        .filter(|m| {
            let url = m.member.peer_urls.first();
            url.and_then(|u| obs.names.ordinal_of_peer_url(u))
                .is_some_and(|o| o < obs.desired_replicas)
        })
        .count() as u32;
    Some(if ours < obs.desired_replicas {
        AdoptionState::Joining
    } else if !old_members(obs, health).is_empty() {
        AdoptionState::Retiring
    } else {
        AdoptionState::Completed
    })
}

/// A change of the existing membership etcdfleet did not make, described.
fn membership_change(
    obs: &Observation,
    a: &AdoptionObservation,
    health: &ClusterHealth,
) -> Option<String> {
    let old = old_members(obs, health);
    let appeared: Vec<String> = old
        .difference(&a.recorded)
        .map(|id| describe(health, *id))
        .collect();
    let vanished: Vec<String> = a
        .recorded
        .iter()
        .filter(|id| !old.contains(id) && !a.retired.contains(id))
        .map(|id| format!("{id:x}"))
        .collect();
    if appeared.is_empty() && vanished.is_empty() {
        return None;
    }
    let mut what = Vec::new();
    if !appeared.is_empty() {
        what.push(format!("joined: {}", appeared.join(", ")));
    }
    if !vanished.is_empty() {
        what.push(format!(
            "left without etcdfleet removing them: {}",
            vanished.join(", ")
        ));
    }
    Some(format!(
        "the existing cluster's membership changed during the takeover ({}); the takeover \
         halts and changes nothing more, so as not to race another owner. Stop whatever \
         manages the old members (scale its operator to zero). Then remove a member that \
         joined, or, for a member that left, remove its entry from \
         status.adoption.existingMembers (kubectl patch --subresource=status); the takeover \
         resumes once the membership matches that record",
        what.join("; ")
    ))
}

fn describe(health: &ClusterHealth, id: u64) -> String {
    match health.member(id) {
        Some(m) if !m.member.name.is_empty() => format!("{} ({id:x})", m.member.name),
        _ => format!("{id:x}"),
    }
}

fn refuse(reason: &'static str, message: String) -> Result<(), Refusal> {
    Err(Refusal {
        reason,
        message: format!(
            "adoption refused before anything was written (the existing cluster is unchanged): \
             {message}"
        ),
    })
}

/// The checks made before the first change (see the module docs). Pure.
pub fn preflight(obs: &Observation, a: &AdoptionObservation) -> Result<(), Refusal> {
    let scheme = if obs.tls { "https://" } else { "http://" };
    if let Some(url) = a.endpoints.iter().find(|u| !u.starts_with(scheme)) {
        return refuse(
            reason::TLS_MISMATCH,
            format!(
                "endpoint {url} does not match spec.tls.enabled={}: etcdfleet's members must \
                 speak the existing members' scheme on their peer ports",
                obs.tls
            ),
        );
    }
    if let Err(why) = &a.credentials {
        return refuse(reason::CREDENTIALS_INVALID, why.clone());
    }
    server_trust(a)?;
    let health = match &obs.etcd {
        EtcdObservation::Observed(h) => h,
        EtcdObservation::Unreachable(why) => {
            return refuse(
                reason::UNREACHABLE,
                format!(
                    "no existing member answers at {} ({why}); check the endpoints and that the \
                     controller reaches them",
                    a.endpoints.join(", ")
                ),
            );
        }
    };
    members_ready(obs, health, &a.spec_version)?;
    peer_trust(a)
}

/// The controller trusts the existing servers, and they accept its
/// identity.
fn server_trust(a: &AdoptionObservation) -> Result<(), Refusal> {
    let refused = a
        .probes
        .iter()
        .filter(|p| p.port == ProbedPort::Client)
        .find_map(|p| match &p.result {
            Err(e @ (ProbeError::Untrusted(_) | ProbeError::Rejected(_))) => Some((p, e)),
            _ => None,
        });
    match refused {
        Some((p, e)) => refuse(
            reason::SERVER_TRUST_MISSING,
            format!(
                "{}: {e}; the Secret named by credentialsSecretName must hold the CA \
                 (ca.crt, ca.key) that signed the existing members' certificates",
                p.url
            ),
        ),
        None => Ok(()),
    }
}

/// Every existing member healthy, none a learner, no name of this
/// cluster's taken, and a version the policy accepts.
fn members_ready(
    obs: &Observation,
    health: &ClusterHealth,
    requested: &str,
) -> Result<(), Refusal> {
    let taken: Vec<String> = health
        .members()
        .iter()
        .filter(|m| is_ours(obs, m) || obs.names.ordinal_of(&m.member.name).is_some())
        .map(|m| describe(health, m.member.id))
        .collect();
    if !taken.is_empty() {
        return refuse(
            reason::NAMES_CLASH,
            format!(
                "existing member(s) {} use this cluster's member names or peer URLs; give the \
                 EtcdCluster another name or workloadNamespace",
                taken.join(", ")
            ),
        );
    }
    let sick: Vec<String> = health
        .members()
        .iter()
        .filter(|m| !m.healthy)
        .map(|m| {
            format!(
                "{}{}",
                describe(health, m.member.id),
                m.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if !sick.is_empty() {
        return refuse(
            reason::MEMBER_UNHEALTHY,
            format!(
                "existing member(s) not healthy: {}; a takeover starts only from a fully \
                 healthy cluster. Bring them back (or remove them) first",
                sick.join("; ")
            ),
        );
    }
    if let Some(l) = health.learners().next() {
        return refuse(
            reason::LEARNER_SLOT_TAKEN,
            format!(
                "learner {} is pending in the existing cluster and etcd allows one at a time; \
                 promote or remove it first",
                describe(health, l.member.id)
            ),
        );
    }
    version_skew(health, requested)
}

fn version_skew(health: &ClusterHealth, requested: &str) -> Result<(), Refusal> {
    for m in health.members() {
        let Some(running) = m.status.as_ref().map(|s| s.version.as_str()) else {
            continue;
        };
        if let Err(rejection) = etcdfleet_api::version::decide(Some(running), requested) {
            return refuse(
                reason::VERSION_SKEW,
                format!(
                    "existing member {} runs etcd {running} and spec.version is {requested}: {}. \
                     Set spec.version to a version the policy accepts from {running} (the same \
                     version is safest)",
                    describe(health, m.member.id),
                    rejection.message()
                ),
            );
        }
    }
    Ok(())
}

/// The existing members' peer ports accept the peer certificate
/// etcdfleet's members will present and present one its CA verifies.
fn peer_trust(a: &AdoptionObservation) -> Result<(), Refusal> {
    for p in a.probes.iter().filter(|p| p.port == ProbedPort::Peer) {
        let why = match &p.result {
            Ok(true) => continue,
            Ok(false) => "it does not ask peers for a certificate (--peer-client-cert-auth is \
                          off), so whether it would trust etcdfleet's members cannot be checked; \
                          enable peer client certificate authentication first"
                .to_string(),
            Err(ProbeError::Untrusted(e)) => format!(
                "its peer certificate does not verify against the CA in the join credentials \
                 ({e}): etcdfleet's members would not trust it"
            ),
            Err(ProbeError::Rejected(e)) => format!(
                "it refuses a peer certificate issued from the CA in the join credentials ({e}): \
                 add that CA to the existing members' --peer-trusted-ca-file, or give the CA \
                 that signed their peer certificates"
            ),
            // Not a trust failure: checked again on the next reconcile.
            Err(ProbeError::Unreachable(e)) => {
                return refuse(
                    reason::UNREACHABLE,
                    format!("{}: its peer port could not be checked: {e}", p.url),
                );
            }
        };
        return refuse(reason::PEER_TRUST_MISSING, format!("{}: {why}", p.url));
    }
    Ok(())
}

/// Rule: an adopting cluster is refused while a preflight check fails
/// (before the first change), and halts when the existing membership
/// changes underneath it (after).
pub(super) fn adoption_gate(obs: &Observation) -> Option<Plan> {
    match adoption_state(obs)? {
        AdoptionState::Refused(refusal) => Some(Plan::Refuse(refusal)),
        AdoptionState::Halted(why) => Some(Plan::Hold(why)),
        _ => None,
    }
}

/// Rule: the existing CA becomes this cluster's CA before any certificate
/// is issued (TLS clusters).
pub(super) fn import_ca(obs: &Observation) -> Option<Plan> {
    let a = obs.adoption.as_ref()?;
    (obs.tls && !a.ca_imported).then_some(Plan::Act(Step::ImportCa))
}

/// Rule: the first member of this cluster joins the existing cluster as a
/// learner (once the existing membership is recorded), then its
/// StatefulSet is created. Never a bootstrap of a new cluster.
pub(super) fn first_member(obs: &Observation) -> Option<Plan> {
    let a = obs.adoption.as_ref()?;
    if obs.statefulset.is_some() {
        return None;
    }
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return Some(Plan::Wait(
            "the existing cluster does not answer; waiting before the first member joins".into(),
        ));
    };
    let configmap_missing = obs.stale_objects.contains(&ObjectKind::MembersConfigMap);
    if health.members().iter().any(|m| is_ours(obs, m)) {
        // Members of this cluster are in etcd already: its StatefulSet
        // starts them, with the members ConfigMap (which lists the existing
        // members too) in place first, so that none ever starts a new cluster.
        return Some(Plan::Act(if configmap_missing {
            Step::WriteObjects(vec![ObjectKind::MembersConfigMap])
        } else {
            Step::Bootstrap {
                replicas: obs.pvcs.keys().max().map_or(1, |o| o + 1),
            }
        }));
    }
    if a.recorded != old_members(obs, health) {
        return Some(Plan::Wait(
            "recording the existing membership in status before the first change".into(),
        ));
    }
    Some(match health.can_add_learner() {
        Ok(()) => Plan::Act(Step::AddLearner { ordinal: 0 }),
        Err(why) => Plan::Wait(format!("the first member waits to join: {why}")),
    })
}

/// Rule: take the cluster over: this cluster's members join one at a time
/// until they are all voters, then leadership moves to one of them and the
/// old members are removed one at a time (see [`retire`]).
pub(super) fn take_over(m: &Members) -> Option<Plan> {
    let obs = m.obs;
    obs.adoption.as_ref()?;
    let old = old_members(obs, m.health);
    if old.is_empty() {
        return None;
    }
    let desired = obs.desired_replicas;
    let ours = m
        .health
        .voters()
        .filter(|mo| m.ordinal_of(mo.member.id).is_some_and(|o| o < desired))
        .count() as u32;
    if ours < desired {
        return Some(join_next(m));
    }
    Some(retire(m, &old))
}

/// The next member of this cluster joins as a learner, in a fully healthy cluster.
fn join_next(m: &Members) -> Plan {
    let obs = m.obs;
    let Some(next) = (0..obs.desired_replicas).find(|o| m.member_at(*o).is_none()) else {
        return Plan::Wait("every ordinal has a member; waiting for them to become voters".into());
    };
    if obs.pvcs.get(&next).is_some_and(|p| p.member_id.is_some()) {
        return Plan::Act(Step::DeleteStaleStorage {
            ordinal: next,
            force_pod: false,
        });
    }
    if let Some(sick) = m.health.members().iter().find(|mo| !mo.healthy) {
        return Plan::Wait(format!(
            "the takeover waits until every member is healthy: {} is not",
            m.describe(sick.member.id)
        ));
    }
    match m.health.can_add_learner() {
        Ok(()) => Plan::Act(Step::AddLearner { ordinal: next }),
        Err(why) => Plan::Wait(format!("the next member waits to join: {why}")),
    }
}

/// Old members leave one at a time: leadership first moves to a member of
/// this cluster; unhealthy old members go first; each removal must leave a
/// healthy quorum.
fn retire(m: &Members, old: &BTreeSet<u64>) -> Plan {
    let (obs, health) = (m.obs, m.health);
    if let Some(sick) = health
        .voters()
        .find(|mo| !mo.healthy && !old.contains(&mo.member.id))
    {
        return Plan::Wait(format!(
            "old members are removed only while every member of this cluster is healthy: {} is not",
            m.describe(sick.member.id)
        ));
    }
    let Some(leader) = health.leader() else {
        return Plan::Wait("no leader; old members are removed once one is elected".into());
    };
    if old.contains(&leader) {
        return match m.pick_new_leader(&|o| o < obs.desired_replicas, leader) {
            Some(to) => Plan::Act(Step::MoveLeader { from: leader, to }),
            None => Plan::Wait("no member of this cluster can take over leadership yet".into()),
        };
    }
    let mut order: Vec<(bool, u64)> = old
        .iter()
        .filter_map(|id| health.member(*id))
        .map(|mo| (mo.healthy, mo.member.id))
        .collect();
    order.sort();
    let Some(&(_, member_id)) = order.first() else {
        return Plan::Wait("old members are leaving".into());
    };
    match health.can_remove(member_id) {
        Ok(()) => Plan::Act(Step::RetireMember { member_id }),
        Err(why) => Plan::Wait(format!(
            "old member {} waits to be removed: {why}",
            describe(health, member_id)
        )),
    }
}

#[cfg(test)]
mod tests;
