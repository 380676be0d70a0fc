//! The rules of a change of minor version, beyond the rolling restart
//! every version change shares: the preflight before a change of minor
//! starts, and etcd's online downgrade.
//!
//! **Preflight** (an upgrade to the next minor, or an online downgrade). It
//! guards the write that starts the roll, the StatefulSet's with the new
//! version, and answers, in this order:
//!
//! 1. a member whose etcd runs with the v2 store enabled, on the way to
//!    3.6: refused. etcd's 3.6 upgrade guide asks for `etcdutl check
//!    v2store` exactly then (docs v3.6 `upgrades/upgrade_3_6`, "V2 Store":
//!    only when `--enable-v2` or `ETCD_ENABLE_V2=true` is configured).
//!    etcdfleet never renders either, so only a member started by hand with
//!    them meets this rule; the refusal says what to run;
//! 2. a voting member that is not healthy: the StatefulSet is held (the
//!    other rules go on: a failed member is replaced on the old version);
//! 3. a backup destination and no snapshot recorded for this change: take
//!    one (streamed from a healthy member, verified, recorded in
//!    `status.versionChangeSnapshot`). After a failed snapshot the change is
//!    refused, naming the failure, until a retry (with the planner's
//!    backoff) succeeds.
//!
//! That every member runs at least the gate patch is the version policy's
//! own check of each member's reported version (the refusals): a member
//! below the gate refuses the change with nothing touched.
//!
//! **Online downgrade**, one minor down (3.6 → 3.5, 3.7 → 3.6), as etcd's
//! guide does it (docs v3.6 `downgrades/downgrade_3_6`, v3.7
//! `downgrade_3_7`): the preflight, then `downgrade validate` and
//! `downgrade enable`, then a wait until every member's storage version is
//! the target, then the members replaced one at a time with the older
//! binary, leader last (the rolling rule). Once every member runs the target
//! minor, the leader ends the downgrade itself. The user asks for it by
//! lowering `spec.version` and annotating the cluster
//! `etcdfleet.dev/allow-downgrade=<that version>`; the version policy
//! refuses it otherwise (the refusals, before anything here).
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
//!
//! In [`super::RULES`]: [`preflight`] before the backoff of a failing step
//! (a failed snapshot is answered with its own reason), [`downgrade`] after
//! it, both before the workload objects are written; while either holds the
//! StatefulSet ([`statefulset_held`]) the stale-objects rule leaves it out
//! and the other rules go on, and a cluster otherwise converged waits
//! ([`held`]); last of all, [`forget_acknowledgement`].

use etcdfleet_api::version::{DOWNGRADE_ANNOTATION, parse_full_version};

use super::guards::retry_delay;
use super::observation::{EtcdObservation, Observation};
use super::step::{ObjectKind, Plan, Refusal, Step, VersionStep};
use crate::etcd::{ClusterHealth, MemberObservation};

/// What the preflight and the downgrade answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Gate {
    /// This is the plan.
    Take(Plan),
    /// The StatefulSet must not be written yet (`why`); every other rule
    /// plans as usual, and a cluster otherwise converged waits.
    HoldStatefulSet(String),
}

/// Rule: the preflight of a minor change decides (a refusal, the snapshot
/// before it) — seated before the backoff of a failing step, so a failed
/// snapshot is answered with its own reason.
pub fn preflight(obs: &Observation) -> Option<Plan> {
    // A volume growth under way finishes first (its rule answers); the
    // StatefulSet write that would start the roll is held meanwhile.
    if super::storage::sizes::growth_under_way(obs) {
        return None;
    }
    match preflight_gate(obs)? {
        Gate::Take(plan) => Some(plan),
        Gate::HoldStatefulSet(_) => None,
    }
}

/// Rule: etcd's online downgrade decides (enable, cancel).
pub fn downgrade(obs: &Observation) -> Option<Plan> {
    if super::storage::sizes::growth_under_way(obs) {
        return None;
    }
    match downgrade_gate(obs)? {
        Gate::Take(plan) => Some(plan),
        Gate::HoldStatefulSet(_) => None,
    }
}

/// Why the StatefulSet write that starts the roll of a minor change must
/// wait, if it must: the rule that writes stale objects leaves it out, and
/// every other rule plans as usual (a failed member is replaced on the
/// version it runs).
pub fn statefulset_held(obs: &Observation) -> Option<String> {
    if !statefulset_pending(obs) {
        return None;
    }
    let hold = |gate| match gate {
        Some(Gate::HoldStatefulSet(why)) => Some(why),
        _ => None,
    };
    hold(preflight_gate(obs)).or_else(|| hold(downgrade_gate(obs)))
}

/// Rule: nothing else to do, but the StatefulSet is held: wait, saying why.
pub fn held(obs: &Observation) -> Option<Plan> {
    statefulset_held(obs).map(Plan::Wait)
}

/// Rule (the last): converged on the version a downgrade acknowledged, the
/// acknowledgement is removed.
pub fn forget_acknowledgement(obs: &Observation) -> Option<Plan> {
    acknowledgement_to_forget(obs).map(|step| Plan::Act(Step::Version(step)))
}

/// `MAJOR.MINOR` of a version etcd reports (`3.6.16`, `3.5.0`); `None` for
/// anything else (an empty storage version of a 3.5 member).
pub fn minor_of(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Condition reason of a change refused for its snapshot.
pub const SNAPSHOT_FAILED: &str = "SnapshotBeforeVersionChangeFailed";
/// Condition reason of a change refused for the v2 store.
pub const V2_STORE_ENABLED: &str = "V2StoreEnabled";

/// The preflight's answer, if it has one (see the module docs).
fn preflight_gate(obs: &Observation) -> Option<Gate> {
    let (from, to) = obs.version.minor_change.as_ref()?;
    obs.statefulset.as_ref()?;
    if !statefulset_pending(obs) {
        return None;
    }
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return None;
    };
    let change = if to > from {
        "minor upgrade"
    } else {
        "online downgrade"
    };
    if from.minor < 6 && to.minor >= 6 && !obs.version.v2_enabled.is_empty() {
        return Some(Gate::Take(Plan::Refuse(Refusal {
            reason: V2_STORE_ENABLED,
            message: format!(
                "the {change} from {from} to {to} is refused: {} run etcd with the v2 store \
                 enabled (--enable-v2), which 3.6 removed. As etcd's 3.6 upgrade guide asks, run \
                 `etcdutl check v2store` on each member's data directory, migrate or remove any \
                 custom v2 data, and start the members without --enable-v2; set version back to \
                 {from} meanwhile",
                obs.version.v2_enabled.join(", ")
            ),
        })));
    }
    if let Some(sick) = health.voters().find(|m| !m.healthy) {
        return Some(Gate::HoldStatefulSet(format!(
            "the {change} from {from} to {to} starts once every member is healthy: {} is not",
            sick.member.peer_urls.first().map_or_else(
                || format!("{:x}", sick.member.id),
                |u| obs
                    .names
                    .ordinal_of_peer_url(u)
                    .map_or(u.clone(), |o| obs.names.pod(o)),
            )
        )));
    }
    let destination = obs.version.backup_destination.as_ref()?;
    if obs.version.snapshot_taken {
        return None;
    }
    let step = VersionStep::SnapshotBefore {
        from: from.to_string(),
        to: to.to_string(),
    };
    if let Some(failed) = &obs.last_failure
        && failed.kind == step.kind()
        && failed.age < retry_delay(failed.failures)
    {
        return Some(Gate::Take(Plan::Refuse(Refusal {
            reason: SNAPSHOT_FAILED,
            message: format!(
                "the {change} from {from} to {to} is refused until a snapshot to {destination} \
                 succeeds (failed {} time(s), retried with backoff): {}. Fix the destination or \
                 its credentials, or set version back to {from}{}; nothing was changed",
                failed.failures,
                failed.message,
                if to < from {
                    format!(" and remove {DOWNGRADE_ANNOTATION}")
                } else {
                    String::new()
                }
            ),
        })));
    }
    Some(Gate::Take(Plan::Act(Step::Version(step))))
}

/// The downgrade rule's answer, if it has one (see the module docs).
fn downgrade_gate(obs: &Observation) -> Option<Gate> {
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

fn describe(obs: &Observation, m: &MemberObservation) -> String {
    m.member
        .peer_urls
        .first()
        .and_then(|u| obs.names.ordinal_of_peer_url(u))
        .map_or_else(|| format!("{:x}", m.member.id), |o| obs.names.pod(o))
}

/// Once the cluster runs the version it acknowledged, converged: the
/// acknowledgement is removed, so it can never authorize a later downgrade.
fn acknowledgement_to_forget(obs: &Observation) -> Option<VersionStep> {
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

/// Whether the StatefulSet still has to be (re)written: the roll of a
/// version change has not started.
/// The StatefulSet is to be written: it is stale, or a volume growth is to
/// create it again.
fn statefulset_pending(obs: &Observation) -> bool {
    obs.stale_objects.contains(&ObjectKind::StatefulSet)
        || super::storage::sizes::recreate_pending(obs)
}

#[cfg(test)]
mod fixtures {
    //! Observations of a converged cluster on a version, and the edits the
    //! version rules' tests make to them.
    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::super::observation::{
        EtcdObservation, FailedStep, Observation, PodObservation, PvcObservation, RestoreGate,
        StatefulSetObservation,
    };
    use super::super::step::ObjectKind;
    use crate::etcd::{ClusterHealth, Member, MemberObservation, MemberStatus};
    use crate::render::Names;

    fn member(names: &Names, ordinal: u32, version: &str) -> MemberObservation {
        let id = 100 + u64::from(ordinal);
        MemberObservation {
            member: Member {
                id,
                name: names.pod(ordinal),
                peer_urls: vec![names.peer_url(ordinal, true)],
                client_urls: vec![names.client_url(ordinal, true)],
                is_learner: false,
            },
            status: Some(MemberStatus {
                member_id: id,
                cluster_id: 0,
                version: version.into(),
                leader: 100,
                raft_index: 50,
                raft_term: 2,
                raft_applied_index: 50,
                revision: 40,
                db_size: 1,
                db_size_in_use: 1,
                is_learner: false,
                errors: vec![],
                storage_version: String::new(),
                downgrade_target: None,
            }),
            healthy: true,
            error: None,
        }
    }

    /// `n` healthy members on `version`, the spec asking for it, converged.
    pub fn cluster(version: &str, n: u32) -> Observation {
        let names = Names::new("c", "etcd-system");
        let image = format!("etcd:v{version}");
        let pod = PodObservation {
            image: image.clone(),
            template_hash: None,
            running: true,
            ready: true,
            restart_count: 0,
            deleting: false,
            stuck_deleting: false,
            ready_means_etcd_healthy: false,
            last_exit: None,
            node: None,
            forcing: None,
        };
        let pvc = |o: u32| PvcObservation {
            member_id: Some(100 + u64::from(o)),
            owner_recorded: true,
            etcd_version: Some(version.into()),
            deleting: false,
            size: Default::default(),
        };
        Observation {
            tls: true,
            desired_replicas: n,
            stale_objects: vec![],
            members_announced: false,
            statefulset: Some(StatefulSetObservation {
                replicas: n,
                image,
                template_hash: None,
                template_seen: true,
                forcing: None,
                deleting: false,
            }),
            pods: (0..n).map(|o| (o, pod.clone())).collect(),
            pvcs: (0..n).map(|o| (o, pvc(o))).collect(),
            etcd: EtcdObservation::Observed(ClusterHealth::new(
                (0..n).map(|o| member(&names, o, version)).collect(),
            )),
            names,
            failed_members: BTreeSet::new(),
            failed_long_ago: BTreeSet::new(),
            replacements: Default::default(),
            alarms: vec![],
            conflicts: vec![],
            pki_lost: false,
            storage: Default::default(),
            requested_version: Some(version.into()),
            downgrade_acknowledged: None,
            version: Default::default(),
            known_voters: n,
            last_failure: None,
            restore: RestoreGate::NotNeeded,
            adoption: None,
            ca_rotation: Default::default(),
            recovery: Default::default(),
        }
    }

    /// The spec asks for `to`, a minor away; the StatefulSet is not
    /// rewritten yet.
    pub fn minor_change(mut obs: Observation, to: &str) -> Observation {
        let from = obs.requested_version.clone().unwrap();
        obs.requested_version = Some(to.into());
        obs.version.minor_change = Some((from.parse().unwrap(), to.parse().unwrap()));
        obs.stale_objects = vec![ObjectKind::StatefulSet];
        obs
    }

    /// A downgrade to `to`, acknowledged or not.
    pub fn downgrade_to(obs: Observation, to: &str, acknowledged: bool) -> Observation {
        let mut obs = minor_change(obs, to);
        obs.downgrade_acknowledged = acknowledged.then(|| to.to_string());
        obs
    }

    /// Member `ordinal` does not answer.
    pub fn sick(obs: Observation, ordinal: u32) -> Observation {
        set(obs, |o, m| {
            if o == ordinal {
                m.status = None;
                m.healthy = false;
                m.error = Some("connection refused".into());
            }
        })
    }

    /// Edits what every member's status says.
    pub fn set_members(obs: Observation, edit: impl Fn(u32, &mut MemberStatus)) -> Observation {
        set(obs, |o, m| {
            if let Some(s) = m.status.as_mut() {
                edit(o, s);
            }
        })
    }

    fn set(mut obs: Observation, edit: impl Fn(u32, &mut MemberObservation)) -> Observation {
        let EtcdObservation::Observed(health) = &obs.etcd else {
            return obs;
        };
        let members = health
            .members()
            .iter()
            .cloned()
            .map(|mut m| {
                edit((m.member.id - 100) as u32, &mut m);
                m
            })
            .collect();
        obs.etcd = EtcdObservation::Observed(ClusterHealth::new(members));
        obs
    }

    /// The last step failed `failures` times, `age_secs` ago.
    pub fn failed(kind: &str, failures: u32, age_secs: u64, message: &str) -> FailedStep {
        FailedStep {
            kind: kind.into(),
            failures,
            age: Duration::from_secs(age_secs),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{cluster, downgrade_to, failed, minor_change, set_members, sick};
    use super::*;
    use crate::etcdcluster::plan::plan_next_step;

    #[test]
    fn nothing_to_check_without_a_change_of_minor_or_once_the_roll_started() {
        let obs = cluster("3.5.35", 3);
        assert_eq!(preflight_gate(&obs), None);
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.backup_destination = Some("s3://b".into());
        obs.stale_objects.clear();
        assert_eq!(preflight_gate(&obs), None, "the StatefulSet was written");
    }

    #[test]
    fn a_snapshot_comes_first_when_the_cluster_has_a_destination() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        assert_eq!(
            preflight_gate(&obs),
            None,
            "no destination: nothing to take"
        );
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(vec![ObjectKind::StatefulSet]))
        );
        obs.version.backup_destination = Some("s3://b/p".into());
        let snapshot = Plan::Act(Step::Version(VersionStep::SnapshotBefore {
            from: "3.5.35".into(),
            to: "3.6.16".into(),
        }));
        assert_eq!(plan_next_step(&obs), snapshot);
        obs.version.snapshot_taken = true;
        assert_eq!(
            plan_next_step(&obs),
            Plan::Act(Step::WriteObjects(vec![ObjectKind::StatefulSet]))
        );
    }

    #[test]
    fn a_failed_snapshot_refuses_the_change_naming_the_failure_until_the_retry() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.backup_destination = Some("s3://b/p".into());
        obs.last_failure = Some(failed(
            "SnapshotBeforeVersionChange",
            2,
            1,
            "store: access denied",
        ));
        let Plan::Refuse(refusal) = plan_next_step(&obs) else {
            panic!("refused: {:?}", plan_next_step(&obs));
        };
        assert_eq!(refusal.reason, SNAPSHOT_FAILED);
        for words in [
            "minor upgrade from 3.5.35 to 3.6.16 is refused",
            "s3://b/p",
            "store: access denied",
            "set version back to 3.5.35",
        ] {
            assert!(refusal.message.contains(words), "{}", refusal.message);
        }
        // Past the backoff: the snapshot is tried again.
        obs.last_failure = Some(failed("SnapshotBeforeVersionChange", 2, 60, "x"));
        assert!(matches!(
            plan_next_step(&obs),
            Plan::Act(Step::Version(VersionStep::SnapshotBefore { .. }))
        ));
    }

    #[test]
    fn an_unhealthy_member_holds_the_statefulset_but_not_the_other_rules() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.backup_destination = Some("s3://b".into());
        obs = sick(obs, 2);
        let Some(Gate::HoldStatefulSet(why)) = preflight_gate(&obs) else {
            panic!("held: {:?}", preflight_gate(&obs));
        };
        assert!(why.contains("c-etcd-2 is not"), "{why}");
        // No snapshot, no StatefulSet write: the planner waits on the member.
        let plan = plan_next_step(&obs);
        assert!(
            matches!(&plan, Plan::Wait(w) if w.contains("c-etcd-2")),
            "{plan:?}"
        );
        // A failed member is still replaced (on the version it runs).
        obs.failed_members.insert(102);
        obs.failed_long_ago.insert(102);
        assert!(matches!(
            plan_next_step(&obs),
            Plan::Act(Step::RemoveMember { member_id: 102, .. })
        ));
    }

    #[test]
    fn the_v2_store_refuses_the_way_to_3_6_naming_etcdutl_check_v2store() {
        let mut obs = minor_change(cluster("3.5.35", 3), "3.6.16");
        obs.version.v2_enabled = vec!["c-etcd-1".into()];
        let Plan::Refuse(refusal) = plan_next_step(&obs) else {
            panic!("refused");
        };
        assert_eq!(refusal.reason, V2_STORE_ENABLED);
        assert!(refusal.message.contains("etcdutl check v2store"));
        assert!(refusal.message.contains("c-etcd-1"));
        // 3.4 → 3.5 does not need it.
        let mut obs = minor_change(cluster("3.4.23", 3), "3.5.35");
        obs.version.v2_enabled = vec!["c-etcd-1".into()];
        assert_eq!(preflight_gate(&obs), None);
    }

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
        let Some(Gate::HoldStatefulSet(why)) = downgrade_gate(&obs) else {
            panic!("held: {:?}", downgrade_gate(&obs));
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
        assert_eq!(
            downgrade_gate(&obs),
            None,
            "the rolling rule replaces the rest"
        );
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
