//! The evidence that a voter is lost for good (see `super`'s module doc),
//! shared by the recovery from survivors and from a backup.

use etcdfleet_api::recovery::LostMemberRecord;

use super::super::observation::Observation;

/// Why a recovery does not start now.
#[derive(Debug, PartialEq)]
pub(super) enum NotYet {
    /// The evidence may hold soon (a member not yet down for `lostAfter`).
    Wait(String),
    /// The evidence does not hold, or there is nothing to recover from.
    Hold(String),
}

/// The evidence that the voter at `ordinal` is lost for good (see the
/// module doc), or why it is not.
pub(super) fn evidence(
    obs: &Observation,
    id: u64,
    ordinal: u32,
) -> Result<LostMemberRecord, NotYet> {
    let name = obs.names.pod(ordinal);
    let pod = obs.pods.get(&ordinal);
    if pod.is_some_and(|p| p.ready && p.running && !p.deleting) {
        return Err(NotYet::Hold(format!(
            "{name} does not answer the controller but its pod is Ready: it is not lost (the \
             controller may be cut off from it)"
        )));
    }
    let Some(since) = obs.recovery.down_since.get(&id) else {
        return Err(NotYet::Wait(format!(
            "{name} is down; it counts as lost once it has been down for {}s \
             (spec.recovery.lostAfterSeconds) with its data gone",
            obs.recovery.policy.lost_after.as_secs()
        )));
    };
    let mut facts = vec![
        format!(
            "does not answer; its pod {}",
            match pod {
                None => "is gone".to_string(),
                Some(p) if p.deleting => "is being deleted".to_string(),
                Some(p) if !p.running => "is not running".to_string(),
                Some(p) => format!(
                    "is not Ready{}",
                    p.last_exit
                        .as_ref()
                        .map(|e| format!(" (etcd {e})"))
                        .unwrap_or_default()
                ),
            }
        ),
        format!("down since {}", since.strftime("%Y-%m-%dT%H:%M:%SZ")),
    ];
    if let Some(n) = pod.and_then(|p| p.node.as_ref())
        && let NodeState::NotReady = node_state(obs, n)
    {
        facts.push(format!("its pod's node {n} is NotReady"));
    }
    let pvc = obs.names.pvc(ordinal);
    match obs.pvcs.get(&ordinal) {
        None => facts.push(format!("its PVC {pvc} is gone")),
        Some(p) if p.member_id.is_some_and(|m| m != id) => facts.push(format!(
            "its PVC {pvc} holds another member's data, none of its own"
        )),
        // Every voter's volume is recorded when it joins (before its
        // promotion): an unrecorded claim at its ordinal was made after
        // its volume was lost.
        Some(p) if p.member_id.is_none() => facts.push(format!(
            "its PVC {pvc} is a new claim that never held its data (its own was recorded \
             when it joined)"
        )),
        Some(_) => facts.push(local_volume_gone(obs, ordinal).map_err(|why| {
            NotYet::Hold(format!(
                "{name}'s volume {pvc} may still hold its data ({why}): it is not counted as \
                 lost (if it is lost for good, delete the PVC)"
            ))
        })?),
    }
    Ok(LostMemberRecord {
        name,
        id: format!("{id:x}"),
        evidence: facts,
    })
}

/// A kept volume counts as gone only when it is local to a node (its
/// PersistentVolume's required node affinity names one node by
/// `kubernetes.io/hostname`) and that node is gone from the workload
/// cluster: a network volume outlives any node. `Err`: why it may still
/// hold the data.
fn local_volume_gone(obs: &Observation, ordinal: u32) -> Result<String, String> {
    let pvc = obs.names.pvc(ordinal);
    let pinned = match &obs.recovery.pinned {
        None => return Err("its PersistentVolume was not read".into()),
        Some(Err(why)) => return Err(format!("its PersistentVolume could not be read: {why}")),
        Some(Ok(pinned)) => pinned,
    };
    let Some(Some(node)) = pinned.get(&ordinal) else {
        return Err(
            "its PersistentVolume is not local to a node (network storage outlives a node)".into(),
        );
    };
    match node_state(obs, node) {
        NodeState::Gone => Ok(format!(
            "its volume {pvc} is local to node {node}, which is gone from the workload cluster"
        )),
        NodeState::Unknown(why) => Err(format!(
            "its volume is local to node {node}, which could not be read: {why}"
        )),
        NodeState::Ready | NodeState::NotReady => Err(format!(
            "its volume is local to node {node}, which is still there"
        )),
    }
}

enum NodeState {
    Ready,
    NotReady,
    Gone,
    Unknown(String),
}

fn node_state(obs: &Observation, node: &str) -> NodeState {
    match &obs.recovery.nodes {
        None => NodeState::Unknown("not read".into()),
        Some(Err(why)) => NodeState::Unknown(why.clone()),
        Some(Ok(nodes)) => match nodes.get(node) {
            None => NodeState::Gone,
            Some(true) => NodeState::Ready,
            Some(false) => NodeState::NotReady,
        },
    }
}
