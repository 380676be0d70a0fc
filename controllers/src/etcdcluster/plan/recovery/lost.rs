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
    let node = pod
        .and_then(|p| p.node.clone())
        .or_else(|| obs.pvcs.get(&ordinal).and_then(|p| p.node.clone()));
    let node_state = node.as_ref().map(|n| (n, node_state(obs, n)));
    if let Some((n, NodeState::NotReady)) = &node_state {
        facts.push(format!("its node {n} is NotReady"));
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
        Some(_) => match node_state {
            Some((n, NodeState::Gone)) => facts.push(format!(
                "its node {n} is gone from the workload cluster, with the volume {pvc} on it"
            )),
            other => {
                return Err(NotYet::Hold(format!(
                    "{name}'s volume {pvc} may still hold its data{}: it is not counted as lost \
                     (if it is lost for good, delete the PVC)",
                    match other {
                        Some((n, NodeState::Unknown(why))) => {
                            format!(" (its node {n} could not be read: {why})")
                        }
                        Some((n, _)) => format!(" and its node {n} is there"),
                        None => String::new(),
                    }
                )));
            }
        },
    }
    Ok(LostMemberRecord {
        name,
        id: format!("{id:x}"),
        evidence: facts,
    })
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
