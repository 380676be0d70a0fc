//! Recovery from a permanent loss of quorum (`spec.recovery.quorumLoss:
//! FromSurvivors | FromBackup`): when a majority of the voters is lost for
//! good, by evidence, the cluster is brought back from the surviving member
//! with the most data, or, under `FromBackup` when no member answers at
//! all, from the newest backup that verifies ([`backup`]). Lost, not unreachable: a voter counts as lost only when
//!
//! - it does not answer the controller and its pod is gone or not Ready
//!   (a voter whose pod is Ready is never lost: the controller may be cut
//!   off from it);
//! - it has been down for the policy's `lostAfter`;
//! - its data is gone: its PVC is gone, holds none of its data (a new claim,
//!   which no member was recorded on, or one recorded for another member),
//!   or its node is gone from the workload cluster;
//!
//! and the workload API answers (this observation read its pods and PVCs).
//! The evidence is recorded before any step; then the lost members are
//! fenced, the chosen member restarts once with `--force-new-cluster`, and
//! the cluster grows back through learners by the membership rules.

use std::cmp::Reverse;

use etcdfleet_api::recovery::{QuorumLossPolicy, RecoveryStatus, SurvivorRecord, phase};

use super::observation::{EtcdObservation, Observation};
use super::quorum::{QUORUM_LOSS_HELP, QuorumView, quorum_view};
use super::step::{Plan, RecoveryPlan, RecoveryStep, Step};
use crate::etcd::{ClusterHealth, MemberObservation};
use lost::{NotYet, evidence};
use regrow::regrowing;

/// Rule: a recovery under way takes its next step; a lost quorum with
/// `FromSurvivors` starts one once the evidence holds (`Manual` leaves the
/// loss to the quorum rule, which holds).
pub(super) fn recovery(obs: &Observation) -> Option<Plan> {
    if let Some(record) = obs.recovery.record.as_ref().filter(|r| r.in_progress()) {
        return in_flight(obs, record);
    }
    if obs.recovery.policy.quorum_loss == QuorumLossPolicy::Manual {
        return None;
    }
    let QuorumView::Lost { healthy, voters } = quorum_view(obs) else {
        return None;
    };
    let lost = format!("quorum lost: only {healthy} of {voters} voting members are healthy");
    if obs.adoption.is_some() {
        return Some(Plan::Hold(format!(
            "{lost}; no recovery while a takeover of a running etcd is under way; \
             {QUORUM_LOSS_HELP}"
        )));
    }
    Some(match judge(obs) {
        Ok(plan) => Plan::Act(Step::Recovery(RecoveryStep::Begin(Box::new(plan)))),
        Err(NotYet::Wait(why)) => Plan::Wait(format!("{lost}; {why}")),
        Err(NotYet::Hold(why)) => Plan::Hold(format!(
            "{lost}; spec.recovery.quorumLoss is {} but no recovery starts: {why}. \
             {QUORUM_LOSS_HELP}",
            obs.recovery.policy.quorum_loss
        )),
    })
}

/// The recovery the evidence supports, or why there is none.
fn judge(obs: &Observation) -> Result<RecoveryPlan, NotYet> {
    // Without a quorum the fresh member list cannot be read: the
    // survivors' own view of the membership stands in for it.
    let health = match (&obs.recovery.local_view, &obs.etcd) {
        (Some(Ok(view)), _) => view,
        (_, EtcdObservation::Observed(health)) => health,
        (view, EtcdObservation::Unreachable(why)) => {
            let why = match view {
                Some(Err(e)) => e.as_str(),
                _ => why.as_str(),
            };
            if obs.recovery.policy.quorum_loss == QuorumLossPolicy::FromBackup {
                return backup::judge(obs, why);
            }
            return Err(NotYet::Hold(format!(
                "no member answers the controller ({why}): none survives to recover from"
            )));
        }
    };
    let mut survivors = Vec::new();
    let mut lost = Vec::new();
    for voter in health.voters() {
        let ordinal = ordinal_of(obs, voter).ok_or_else(|| {
            NotYet::Hold(format!(
                "voter {:x} is not one of this cluster's members",
                voter.member.id
            ))
        })?;
        match &voter.status {
            Some(status) => {
                survivor_volume(obs, voter.member.id, ordinal)?;
                survivors.push((ordinal, voter.member.id, status));
            }
            None => lost.push(evidence(obs, voter.member.id, ordinal)?),
        }
    }
    lost.sort_by(|a, b| a.name.cmp(&b.name));
    let &(chosen, chosen_id, status) = survivors
        .iter()
        .max_by_key(|(o, _, s)| (s.raft_applied_index, s.revision, Reverse(*o)))
        .ok_or_else(|| NotYet::Hold("no voting member answers: none survives".into()))?;
    Ok(RecoveryPlan {
        id: format!("{chosen_id:x}-{}", status.raft_applied_index),
        chosen,
        chosen_id,
        kept_revision: status.revision,
        last_seen_revision: obs.recovery.last_seen_revision,
        survivors: survivors
            .iter()
            .map(|(o, id, s)| SurvivorRecord {
                name: obs.names.pod(*o),
                id: format!("{id:x}"),
                revision: s.revision,
                raft_applied_index: s.raft_applied_index as i64,
            })
            .collect(),
        lost,
        backup: None,
    })
}

/// A survivor is recovered from on its own volume: its PVC must record it.
fn survivor_volume(obs: &Observation, id: u64, ordinal: u32) -> Result<(), NotYet> {
    match obs.pvcs.get(&ordinal) {
        Some(p) if p.member_id == Some(id) && !p.deleting => Ok(()),
        _ => Err(NotYet::Hold(format!(
            "{} answered, but its volume {} does not record it: its data cannot be vouched for",
            obs.names.pod(ordinal),
            obs.names.pvc(ordinal)
        ))),
    }
}

fn ordinal_of(obs: &Observation, m: &MemberObservation) -> Option<u32> {
    let url = m.member.peer_urls.first()?;
    obs.names.ordinal_of_peer_url(url)
}

/// The next step of a recovery under way.
fn in_flight(obs: &Observation, record: &RecoveryStatus) -> Option<Plan> {
    if record.backup.is_some() {
        return backup::in_flight(obs, record);
    }
    let Some(chosen) = obs.names.ordinal_of(&record.member) else {
        return Some(Plan::Hold(format!(
            "recovery {}: the member it recovers from, {}, is not one of this cluster's",
            record.id, record.member
        )));
    };
    match record.phase.as_str() {
        phase::FENCING => Some(Plan::Act(Step::Recovery(RecoveryStep::Fence {
            chosen,
            lost: lost_ordinals(obs, record),
        }))),
        phase::FORCING => Some(forcing(obs, record, chosen)),
        phase::REGROWING => regrowing(obs),
        _ => None,
    }
}

/// Ordinal and member id of each member the record counts as lost.
fn lost_ordinals(obs: &Observation, record: &RecoveryStatus) -> Vec<(u32, u64)> {
    record
        .lost
        .iter()
        .filter_map(|l| {
            let ordinal = obs.names.ordinal_of(&l.name)?;
            let id = u64::from_str_radix(&l.id, 16).ok()?;
            Some((ordinal, id))
        })
        .collect()
}

/// Whether `id` is the only voter, answering and healthy: it forced.
fn forced(health: &ClusterHealth, id: u64) -> bool {
    let voters: Vec<&MemberObservation> = health.voters().collect();
    matches!(voters.as_slice(), [only] if only.member.id == id && only.healthy)
}

/// The force: the template first, then the chosen member restarted onto
/// it, then wait until it serves alone.
fn forcing(obs: &Observation, record: &RecoveryStatus, chosen: u32) -> Plan {
    let id = u64::from_str_radix(&record.member_id, 16).unwrap_or_default();
    if let EtcdObservation::Observed(health) = &obs.etcd
        && forced(health, id)
    {
        return Plan::Act(Step::Recovery(RecoveryStep::EndForce));
    }
    let Some(sts) = obs.statefulset.as_ref() else {
        return Plan::Hold(format!(
            "recovery {}: the StatefulSet is gone while the cluster recovers",
            record.id
        ));
    };
    if sts.forcing.as_deref() != Some(record.id.as_str()) || sts.replicas != chosen + 1 {
        return Plan::Act(Step::Recovery(RecoveryStep::WriteForcingTemplate {
            chosen,
        }));
    }
    let name = obs.names.pod(chosen);
    if !sts.template_seen {
        return Plan::Wait(format!(
            "recovery {}: {name} restarts once the StatefulSet controller has seen the \
             forcing template",
            record.id
        ));
    }
    match obs.pods.get(&chosen) {
        Some(p) if p.forcing.as_deref() == Some(record.id.as_str()) => Plan::Wait(format!(
            "recovery {}: {name} starts etcd once with --force-new-cluster{}",
            record.id,
            p.last_exit
                .as_ref()
                .map(|e| format!("; its etcd container {e}"))
                .unwrap_or_default()
        )),
        Some(p) if p.deleting => Plan::Wait(format!("recovery {}: {name} stops", record.id)),
        Some(_) => Plan::Act(Step::Recovery(RecoveryStep::RestartChosen {
            ordinal: chosen,
        })),
        None => Plan::Wait(format!(
            "recovery {}: the StatefulSet controller recreates {name}",
            record.id
        )),
    }
}

mod backup;
mod lost;
mod regrow;
#[cfg(test)]
mod tests;
