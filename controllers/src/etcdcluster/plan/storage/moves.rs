//! A move to another StorageClass (docs/storage.md): the StatefulSet is
//! created again with the new class in its claim template; a spare member
//! joins on the new class at the ordinal after the last (the scale rules add
//! it: the planner counts it in the desired size while the move is under
//! way, [`with_spare`]); then each member still on another class, followers
//! first and the leader last, is removed, its volume deleted and its ordinal
//! rejoins as a learner on the new class (the repair and scale rules); last
//! the spare leaves (the scale-down rules). The voters never drop below the
//! spec's size, and one learner joins at a time.

use std::collections::BTreeSet;

use super::super::members::Members;
use super::super::observation::{EtcdObservation, Observation, SpareNodes, TargetClass};
use super::super::step::{Plan, Refusal, RemovalCause, Step, StorageStep};
use super::overlap::Overlap;

/// The StatefulSet's claim template names another class than the spec asks.
pub fn move_pending(obs: &Observation) -> bool {
    let s = &obs.storage;
    s.class.is_some() && s.template.as_ref().is_some_and(|(c, _)| *c != s.class)
}

/// Ordinals of the voters etcd reports.
fn voter_ordinals(obs: &Observation) -> BTreeSet<u32> {
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return BTreeSet::new();
    };
    (health.voters())
        .filter_map(|mo| obs.names.ordinal_of_peer_url(mo.member.peer_urls.first()?))
        .collect()
}

/// The observation with the spare counted in the desired size, while a move
/// is under way: the claim template is on the new class, and a member's
/// volume is still on another, or the spare is in and an ordinal below it
/// has no voter on the new class yet.
pub fn with_spare(obs: &Observation) -> Option<Observation> {
    let class = obs.storage.class.as_ref()?;
    let (template, _) = obs.storage.template.as_ref()?;
    if template.as_ref() != Some(class) {
        return None;
    }
    let n = obs.desired_replicas;
    let on_new = |o: &u32| {
        (obs.pvcs.get(o)).is_some_and(|p| !p.deleting && p.size.class.as_ref() == Some(class))
    };
    let old_left = (obs.pvcs.iter())
        .any(|(o, p)| *o < n && !p.deleting && p.size.class.as_ref() != Some(class));
    let voters = voter_ordinals(obs);
    let spare_in = match &obs.etcd {
        EtcdObservation::Observed(h) => (h.members().iter())
            .filter_map(|mo| obs.names.ordinal_of_peer_url(mo.member.peer_urls.first()?))
            .any(|o| o == n),
        EtcdObservation::Unreachable(_) => false,
    };
    let unfinished = (0..n).any(|o| !(on_new(&o) && voters.contains(&o)));
    (old_left || (spare_in && unfinished)).then(|| {
        let mut spared = obs.clone();
        spared.desired_replicas = n + 1;
        spared.storage.spare = Some(n);
        spared
    })
}

/// A move that cannot start: to no class at all, to a class that does not
/// exist or cannot be read.
pub(super) fn refused(obs: &Observation) -> Option<Plan> {
    let s = &obs.storage;
    let (template, _) = s.template.as_ref()?;
    let refuse = |reason: &'static str, why: String| {
        Some(Plan::Refuse(Refusal {
            reason,
            message: format!(
                "spec.storage.storageClassName asks for {:?}, but {why}; nothing is written",
                s.class
            ),
        }))
    };
    match (&s.class, &s.target) {
        (None, _) if template.is_some() => refuse(
            "StorageImmutable",
            format!(
                "the members' volumes are class {template:?}: a class is left only for another \
                 one. Set spec.storage.storageClassName back"
            ),
        ),
        (_, TargetClass::Missing) => refuse(
            "StorageClassMissing",
            "that StorageClass does not exist".into(),
        ),
        (_, TargetClass::Unreadable(e)) => refuse(
            "StorageClassUnreadable",
            format!("that StorageClass could not be read ({e})"),
        ),
        _ => no_spare_node(obs).and_then(|why| refuse("StorageMoveNeedsSpareNode", why)),
    }
}

/// Why a move cannot add its spare member: the pods require a node each,
/// and the Nodes a member could run on are no more than the members. The
/// move adds the spare before it removes anyone, so that the voters never
/// drop below the spec's size; without a node for it, it would wait for
/// ever. (Nodes that cannot be read are not checked here.)
fn no_spare_node(obs: &Observation) -> Option<String> {
    let SpareNodes::Known { eligible } = &obs.storage.spare_nodes else {
        return None;
    };
    let members = obs.desired_replicas;
    (eligible.len() as u32 <= members).then(|| {
        format!(
            "the move adds a spare member ({}) before it removes one, and the pods require a \
             node each (pod anti-affinity on kubernetes.io/hostname): {} of the workload \
             cluster's Nodes can run a member ({}), and {} members need {}. Add a node that \
             can run a member, then the move starts",
            obs.names.pod(members),
            eligible.len(),
            if eligible.is_empty() {
                "none".to_string()
            } else {
                eligible.join(", ")
            },
            members + 1,
            members + 1
        )
    })
}

/// Rule: while a move is pending or under way, a volume on the new class
/// that no provisioner binds holds it, naming the class and what Kubernetes
/// said about the claim.
pub fn unprovisioned(obs: &Observation) -> Option<Plan> {
    if !move_pending(obs) && obs.storage.spare.is_none() {
        return None;
    }
    let class = obs.storage.class.as_ref()?;
    let (ordinal, why) = (obs.pvcs.iter())
        .filter(|(_, p)| p.size.class.as_ref() == Some(class))
        .find_map(|(o, p)| Some((*o, p.size.unprovisioned.as_ref()?)))?;
    Some(Plan::Hold(format!(
        "the move to StorageClass {class} waits: the volume of {} is not provisioned ({why}); \
         fix the class or its provisioner, or set spec.storage.storageClassName back",
        obs.names.pod(ordinal)
    )))
}

/// Rule: a move pending re-creates the StatefulSet with the new class; a
/// move under way, the spare in, removes the next member still on another
/// class (followers first, leadership moved off the leader first).
pub fn move_members(m: &Members) -> Option<Plan> {
    let obs = m.obs;
    if move_pending(obs) {
        return recreate(m);
    }
    let spare = obs.storage.spare?;
    let class = obs.storage.class.as_ref()?;
    let on_old = |o: u32| {
        obs.pvcs
            .get(&o)
            .is_some_and(|p| p.size.class.as_ref() != Some(class))
    };
    let mut old: Vec<(u32, u64)> = (m.health.voters())
        .filter_map(|mo| Some((m.ordinal_of(mo.member.id)?, mo.member.id)))
        .filter(|(o, _)| *o < spare && on_old(*o))
        .collect();
    old.sort_by(|a, b| b.cmp(a)); // the highest ordinal first
    if old.is_empty() {
        return None; // the rejoin and the spare's leaving are the scale rules'
    }
    if let Some(sick) = m.health.voters().find(|mo| !mo.healthy) {
        let who = m.describe(sick.member.id);
        return Some(Plan::Wait(format!(
            "the move to StorageClass {class} waits: {who} is unhealthy"
        )));
    }
    // A replacement etcd has promoted may not serve yet: its pod turns
    // Ready a probe period later. Removing the next member before would
    // take two out of the client Service at once.
    if let Some(o) = m.unready_voter() {
        return Some(Plan::Wait(format!(
            "the move to StorageClass {class} waits: the kubelet does not report pod {} \
             Ready yet",
            obs.names.pod(o)
        )));
    }
    let leader = m.health.leader();
    let &(ordinal, id) = old
        .iter()
        .find(|(_, id)| Some(*id) != leader)
        .unwrap_or(&old[0]);
    if Some(id) == leader {
        let on_new = |o: u32| !on_old(o);
        return Some(match m.pick_new_leader(&on_new, id) {
            Some(to) => Plan::Act(Step::MoveLeader { from: id, to }),
            None => Plan::Wait(format!("the move waits: no member on {class} can lead")),
        });
    }
    Some(match m.health.can_remove(id) {
        Ok(()) => Plan::Act(Step::RemoveMember {
            ordinal: Some(ordinal),
            member_id: id,
            cause: RemovalCause::StorageClassMove,
        }),
        Err(why) => Plan::Wait(format!("the move to StorageClass {class} waits: {why}")),
    })
}

/// The StatefulSet created again with the new class, once nothing that came
/// first is under way (`None`: a later rule drives what comes first).
fn recreate(m: &Members) -> Option<Plan> {
    let obs = m.obs;
    match super::overlap::waits_for(m, false) {
        Some(Overlap::Wait(why)) => {
            return Some(Plan::Wait(format!(
                "the move to another StorageClass waits: {why}"
            )));
        }
        Some(Overlap::Yield) => return None,
        None => {}
    }
    if m.sts.deleting {
        return Some(Plan::Wait(
            "the move waits: the old StatefulSet is still being deleted".into(),
        ));
    }
    if let Some(why) = super::super::version::statefulset_held(obs) {
        return Some(Plan::Wait(format!(
            "re-creating the StatefulSet waits: {why}"
        )));
    }
    Some(Plan::Act(Step::Storage(StorageStep::RecreateStatefulSet {
        class: obs.storage.class.clone(),
        size: obs.storage.size.clone(),
    })))
}
