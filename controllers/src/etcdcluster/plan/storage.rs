//! Storage that changes: `spec.storage.size` grows the members' volumes
//! online, one member at a time (each claim expanded, its file system grown,
//! its pod restarted when the driver needs that), then the StatefulSet is
//! created again around its running pods so its claim template carries the
//! new size, and the members roll onto it (a quota derived from the size
//! follows only then, once every member has the room). A shrink, a class
//! that cannot expand and a change of class are refused before anything is
//! written. See docs/storage.md.

pub mod moves;
pub mod overlap;
pub mod sizes;

use super::members::Members;
use super::observation::{Expansion, Observation};
use super::step::{Plan, Refusal, Step, StorageStep};
use overlap::{Overlap, waits_for};
use sizes::{Sizes, sizes};

/// Rule: a storage change the volumes cannot take is refused, and nothing
/// is written: a change of class, a shrink (of the spec, or of a template
/// it follows), a growth the StorageClass does not allow.
pub(super) fn refused(obs: &Observation) -> Option<Plan> {
    let s = &obs.storage;
    if s.size.is_empty() {
        return None; // not observed (`plan` without the workload cluster)
    }
    if let Some(plan) = moves::refused(obs) {
        return Some(plan);
    }
    let sizes = match sizes(obs) {
        Ok(sizes) => sizes,
        Err(refusal) => return Some(Plan::Refuse(refusal)),
    };
    if sizes.largest() > sizes.want {
        return Some(refuse(
            "StorageShrink",
            format!(
                "spec.storage.size {} is smaller than the members' volumes ({} bytes); a volume \
                 cannot shrink, so nothing is written. Set spec.storage.size back to at least \
                 the volumes' size",
                s.size,
                sizes.largest()
            ),
        ));
    }
    sizes.claim_to_expand()?;
    // Volumes a move replaces do not grow.
    if moves::move_pending(obs) || s.spare.is_some() {
        return None;
    }
    not_expandable(&s.expansion, &s.size)
}

fn not_expandable(expansion: &Expansion, size: &str) -> Option<Plan> {
    let (reason, why) = match expansion {
        Expansion::NotRead | Expansion::Allowed(_) => return None,
        Expansion::NotAllowed(class) => (
            "StorageNotExpandable",
            format!("StorageClass {class:?} does not set allowVolumeExpansion: true"),
        ),
        Expansion::NoClass => (
            "StorageNotExpandable",
            "the members' claims name no StorageClass".to_string(),
        ),
        Expansion::Missing(class) => (
            "StorageNotExpandable",
            format!("StorageClass {class:?} does not exist"),
        ),
        Expansion::Unreadable { class, error } => (
            "StorageClassUnreadable",
            format!("StorageClass {class:?} could not be read ({error})"),
        ),
    };
    Some(refuse(
        reason,
        format!(
            "spec.storage.size asks for {size}, but {why}; the volumes cannot grow, so nothing \
             is written. Use a class that allows expansion, or set spec.storage.size back"
        ),
    ))
}

fn refuse(reason: &'static str, message: String) -> Plan {
    Plan::Refuse(Refusal { reason, message })
}

/// Rule: grow the members' volumes to `spec.storage.size`, one member at a
/// time, then the StatefulSet's claim template.
pub(super) fn grow(m: &Members) -> Option<Plan> {
    let obs = m.obs;
    // A move to another class replaces the volumes: none of them grows.
    if moves::move_pending(obs) || obs.storage.spare.is_some() {
        return None;
    }
    let sizes = sizes(obs).ok()?;
    if !sizes.claims_growing() && !sizes.template_left() {
        return None;
    }
    match waits_for(m, sizes.started()) {
        Some(Overlap::Wait(why)) => {
            return Some(Plan::Wait(format!(
                "volume growth to {} waits: {why}",
                obs.storage.size
            )));
        }
        Some(Overlap::Yield) => return None,
        None => {}
    }
    if let Some(plan) = resizing(m, &sizes) {
        return Some(plan);
    }
    if let Some(sick) = m.health.voters().find(|mo| !mo.healthy) {
        let who = m.describe(sick.member.id);
        return Some(Plan::Wait(format!(
            "volume growth waits: member {who} is unhealthy"
        )));
    }
    let size = obs.storage.size.clone();
    let leader = m.health.leader().and_then(|id| m.ordinal_of(id));
    if let Some(ordinal) = sizes.claim_to_expand_but(leader) {
        return Some(act(StorageStep::ExpandVolume { ordinal, size }));
    }
    if m.sts.deleting {
        return Some(Plan::Wait(
            "volume growth waits: the old StatefulSet is still being deleted".into(),
        ));
    }
    // The StatefulSet is created again from the inputs, version included:
    // a change of version asked meanwhile has its preflight first.
    if let Some(why) = super::version::statefulset_held(obs) {
        return Some(Plan::Wait(format!(
            "re-creating the StatefulSet waits: {why}"
        )));
    }
    let class = obs.storage.class.clone();
    Some(act(StorageStep::RecreateStatefulSet { class, size }))
}

/// A member volume growing now: its file system waits for a restart (one
/// member at a time, under the quorum guard), or its provider is working.
fn resizing(m: &Members, sizes: &Sizes) -> Option<Plan> {
    let obs = m.obs;
    if let Some(&(ordinal, ..)) = sizes.claims.iter().find(|c| c.1.restart_pending) {
        let pod = obs.names.pod(ordinal);
        let Some(member_id) = m.member_at(ordinal) else {
            return Some(Plan::Wait(format!(
                "the volume of {pod} grew; its member is not running"
            )));
        };
        if obs.pods.get(&ordinal).is_none_or(|p| p.deleting) {
            return Some(Plan::Wait(format!(
                "{pod} is restarting so its file system grows"
            )));
        }
        if m.health.leader() == Some(member_id) && m.health.voter_count() > 1 {
            return Some(match m.pick_new_leader(&|_| true, member_id) {
                Some(to) => Plan::Act(Step::MoveLeader {
                    from: member_id,
                    to,
                }),
                None => Plan::Wait(format!("{pod} waits to restart: no member can lead")),
            });
        }
        return Some(match m.health.can_restart(member_id) {
            Ok(()) | Err(crate::etcd::UnsafeReason::SingleMemberDowntime { .. }) => {
                match m.unready_voter().filter(|o| *o != ordinal) {
                    Some(o) => Plan::Wait(format!(
                        "{pod} waits to restart: the kubelet does not report pod {} Ready yet",
                        obs.names.pod(o)
                    )),
                    None => act(StorageStep::RestartForResize { ordinal, member_id }),
                }
            }
            Err(why) => Plan::Wait(format!(
                "the volume of {pod} grew; its restart waits: {why}"
            )),
        });
    }
    let (ordinal, claim, requested, capacity) = sizes
        .claims
        .iter()
        .find(|c| matches!((c.2, c.3), (Some(r), Some(c)) if c < r) || c.3.is_none())?;
    Some(Plan::Wait(format!(
        "the volume of {} is growing: {} of {}{}",
        obs.names.pod(*ordinal),
        capacity.map_or("unknown".into(), etcdfleet_api::quantity::display),
        requested.map_or("unknown".into(), etcdfleet_api::quantity::display),
        claim
            .error
            .as_ref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    )))
}

fn act(step: StorageStep) -> Plan {
    Plan::Act(Step::Storage(step))
}

#[cfg(test)]
mod tests;
