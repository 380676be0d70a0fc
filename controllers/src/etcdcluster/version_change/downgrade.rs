//! etcd's online downgrade, one minor down (3.6 → 3.5, 3.7 → 3.6), as
//! etcd's guide does it (docs v3.6 `downgrades/downgrade_3_6`, v3.7
//! `downgrade_3_7`): every member healthy and a snapshot first (the
//! preflight, [`super::preupgrade`]), then `downgrade validate` and
//! `downgrade enable`, then wait until every member's storage version is the
//! target, then replace the members one at a time with the older binary,
//! leader last (the planner's rolling rule). Once every member runs the
//! target minor, the leader ends the downgrade itself.
//!
//! The user asks for it by lowering `spec.version` and annotating the
//! cluster `etcdfleet.dev/allow-downgrade=<that version>`; the version
//! policy refuses it otherwise (`plan::refusal`, before anything here).
//!
//! Where the progress lives: in etcd (the downgrade target, enabled, and
//! each member's storage version, all in `Status`), in the StatefulSet (the
//! template of the older version) and in the pods (which ones run it). A
//! controller that restarts at any point reads them and goes on.
//!
//! Cancelling is setting `spec.version` back: etcd's downgrade is cancelled
//! (the cluster and storage versions return to what the members run) and
//! the acknowledgement withdrawn; the StatefulSet is then written back, and
//! a member already replaced is rolled back up like any upgrade. Before the
//! first member is replaced, that leaves every member as it was.

use etcdfleet_api::version::parse_full_version;

use super::{Gate, VersionStep, minor_of};
use crate::etcd::ClusterHealth;
use crate::etcdcluster::plan::{EtcdObservation, Observation, Plan, Step};

/// The downgrade rule's answer, if it has one (see the module docs).
pub fn next(obs: &Observation) -> Option<Gate> {
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return None;
    };
    obs.statefulset.as_ref()?;
    let requested = parse_full_version(obs.requested_version.as_deref()?)?;
    let wanted = (requested.major, requested.minor);
    let target = etcd_target(health);
    if let Some(target) = &target
        && minor_of(target) != Some(wanted)
    {
        return Some(Gate::Take(Plan::Act(Step::Version(
            VersionStep::CancelDowngrade {
                target: target.clone(),
            },
        ))));
    }
    let running: Vec<(u64, u64)> = health
        .members()
        .iter()
        .filter_map(|m| minor_of(&m.status.as_ref()?.version))
        .collect();
    let higher = running.iter().filter(|v| **v > wanted).count();
    if target.is_none() && higher == 0 {
        return None;
    }
    let label = format!("{}.{}", wanted.0, wanted.1);
    if target.is_none() && higher == running.len() {
        return Some(enable(obs, health, &label));
    }
    // Enabled (or the cluster version is already the lower minor, as in a
    // roll that went back): members are replaced once their data is in the
    // lower minor's schema.
    let behind = not_migrated(obs, health, wanted);
    if behind.is_empty() {
        return None;
    }
    Some(Gate::HoldStatefulSet(format!(
        "online downgrade to {label}: waiting until every member's storage version is \
         {label}.0 ({} not yet); etcd migrates it within seconds of `downgrade enable`",
        behind.join(", ")
    )))
}

/// The downgrade target etcd reports as enabled, if any (3.6+ members).
fn etcd_target(health: &ClusterHealth) -> Option<String> {
    health
        .members()
        .iter()
        .find_map(|m| m.status.as_ref()?.downgrade_target.clone())
}

/// `downgrade enable` once every member is healthy; until then the
/// StatefulSet is held and the other rules go on.
fn enable(obs: &Observation, health: &ClusterHealth, target: &str) -> Gate {
    match health.voters().find(|m| !m.healthy) {
        Some(sick) => Gate::HoldStatefulSet(format!(
            "online downgrade to {target} starts once every member is healthy: {} is not",
            describe(obs, sick)
        )),
        None => Gate::Take(Plan::Act(Step::Version(VersionStep::EnableDowngrade {
            target: target.to_string(),
        }))),
    }
}

/// Members that report a storage version (3.6+) other than `wanted`.
fn not_migrated(obs: &Observation, health: &ClusterHealth, wanted: (u64, u64)) -> Vec<String> {
    health
        .members()
        .iter()
        .filter(|m| {
            m.status.as_ref().is_none_or(|s| {
                !s.storage_version.is_empty() && minor_of(&s.storage_version) != Some(wanted)
            })
        })
        .map(|m| describe(obs, m))
        .collect()
}

fn describe(obs: &Observation, m: &crate::etcd::MemberObservation) -> String {
    m.member
        .peer_urls
        .first()
        .and_then(|u| obs.names.ordinal_of_peer_url(u))
        .map_or_else(|| format!("{:x}", m.member.id), |o| obs.names.pod(o))
}

/// Once the cluster runs the version it acknowledged, converged: the
/// acknowledgement is removed, so it can never authorize a later downgrade.
pub fn forget_acknowledgement(obs: &Observation) -> Option<VersionStep> {
    let acknowledged = obs.downgrade_acknowledged.as_ref()?;
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return None;
    };
    let all_run_it = health.members().iter().all(|m| {
        m.status
            .as_ref()
            .is_some_and(|s| &s.version == acknowledged)
    });
    (obs.requested_version.as_ref() == Some(acknowledged) && all_run_it).then(|| {
        VersionStep::ForgetAcknowledgement {
            version: acknowledged.clone(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{cluster, downgrade_to, set_members, sick};
    use super::*;
    use crate::etcdcluster::plan::{ObjectKind, plan_next_step};

    fn enable_step(target: &str) -> Plan {
        Plan::Act(Step::Version(VersionStep::EnableDowngrade {
            target: target.into(),
        }))
    }

    #[test]
    fn an_acknowledged_downgrade_enables_first_and_writes_the_statefulset_after_the_migration() {
        let obs = downgrade_to(cluster("3.6.16", 3), "3.5.35", true);
        assert_eq!(plan_next_step(&obs), enable_step("3.5"));
        // Enabled: storage versions still move.
        let obs = set_members(obs, |o, s| {
            s.downgrade_target = Some("3.5.0".into());
            s.storage_version = if o == 0 { "3.6.0" } else { "3.5.0" }.into();
        });
        let plan = plan_next_step(&obs);
        assert!(
            matches!(&plan, Plan::Wait(w) if w.contains("storage version") && w.contains("c-etcd-0")),
            "{plan:?}"
        );
        // Migrated: the StatefulSet gets the older version, the roll starts.
        let obs = set_members(obs, |_, s| s.storage_version = "3.5.0".into());
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(vec![ObjectKind::StatefulSet]))
        );
    }

    #[test]
    fn without_the_acknowledgement_nothing_is_enabled() {
        let obs = downgrade_to(cluster("3.6.16", 3), "3.5.35", false);
        let Plan::Refuse(refusal) = plan_next_step(&obs) else {
            panic!("refused: {:?}", plan_next_step(&obs));
        };
        assert!(
            refusal
                .message
                .contains("etcdfleet.dev/allow-downgrade=3.5.35")
        );
    }

    #[test]
    fn enable_waits_for_every_member_to_be_healthy() {
        let obs = sick(downgrade_to(cluster("3.7.3", 3), "3.6.16", true), 1);
        let Some(Gate::HoldStatefulSet(why)) = next(&obs) else {
            panic!("held: {:?}", next(&obs));
        };
        assert!(why.contains("c-etcd-1 is not"), "{why}");
        let plan = plan_next_step(&obs);
        assert!(
            matches!(&plan, Plan::Wait(w) if w.contains("c-etcd-1")),
            "{plan:?}"
        );
    }

    #[test]
    fn a_mixed_cluster_on_the_lower_storage_version_rolls_on_after_a_restart() {
        // One member replaced already; etcd reports the downgrade enabled.
        let obs = downgrade_to(cluster("3.6.16", 3), "3.5.35", true);
        let mut obs = set_members(obs, |o, s| {
            if o == 1 {
                s.version = "3.5.35".into();
                s.storage_version = String::new();
            } else {
                s.storage_version = "3.5.0".into();
                s.downgrade_target = Some("3.5.0".into());
            }
        });
        obs.stale_objects.clear();
        assert_eq!(next(&obs), None, "the rolling rule replaces the rest");
    }

    #[test]
    fn setting_the_version_back_cancels_the_enabled_downgrade() {
        let obs = cluster("3.6.16", 3);
        let obs = set_members(obs, |_, s| {
            s.storage_version = "3.5.0".into();
            s.downgrade_target = Some("3.5.0".into());
        });
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::Version(VersionStep::CancelDowngrade {
                target: "3.5.0".into()
            }))
        );
    }

    #[test]
    fn the_acknowledgement_is_forgotten_once_the_cluster_runs_it_and_only_then() {
        let mut obs = cluster("3.5.35", 3);
        obs.downgrade_acknowledged = Some("3.5.35".into());
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::Version(VersionStep::ForgetAcknowledgement {
                version: "3.5.35".into()
            }))
        );
        // Annotated before the version is lowered: kept.
        let mut obs = cluster("3.6.16", 3);
        obs.downgrade_acknowledged = Some("3.5.35".into());
        assert_eq!(plan_next_step(&obs), Plan::Converged);
    }
}
