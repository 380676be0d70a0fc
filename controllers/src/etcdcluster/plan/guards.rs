//! The rules that come before any step: the refusals (acting would harm
//! data or another owner), one rule each, the restore gate, and the backoff
//! of a failing step. Also the identity check admission makes before any
//! workload I/O.

use super::observation::{EtcdObservation, Observation, RestoreGate};
use super::step::{Plan, Refusal};

/// Rule: a restore whose snapshot is missing or corrupt makes nothing: no
/// Service, no Secret, no StatefulSet (a half-made cluster would start
/// empty, or mix data).
pub(super) fn restore_gate(obs: &Observation) -> Option<Plan> {
    if obs.statefulset.is_none()
        && let RestoreGate::Refused(refusal) = &obs.restore
    {
        return Some(Plan::Refuse(refusal.clone()));
    }
    None
}

/// Rule: a step that keeps failing waits out its backoff (no destructive
/// work is redone in a tight loop, e.g. compact + defragment every member).
pub(super) fn failure_backoff(obs: &Observation) -> Option<Plan> {
    let failed = obs.last_failure.as_ref()?;
    let delay = retry_delay(failed.failures);
    (failed.age < delay).then(|| {
        Plan::Hold(format!(
            "{} failed {} time(s) in a row; retrying with backoff (up to {}s between attempts)",
            failed.kind,
            failed.failures,
            delay.as_secs()
        ))
    })
}

/// First retry delay of a failing step; doubles per failure up to [`RETRY_MAX`].
pub const RETRY_BASE: std::time::Duration = std::time::Duration::from_secs(5);
/// Longest delay between retries of a failing step.
pub const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(600);

/// Delay before retrying a step that failed `failures` times in a row: a
/// single failure is retried at once (a lost answer, a blip); from the second
/// on, the delay doubles.
pub fn retry_delay(failures: u32) -> std::time::Duration {
    if failures <= 1 {
        return std::time::Duration::ZERO;
    }
    let exp = (failures - 2).min(16);
    RETRY_BASE.saturating_mul(1u32 << exp).min(RETRY_MAX)
}

/// What identity the spec asks for differs from the recorded one: the
/// message, or `None` when they match (or nothing is recorded yet).
pub fn identity_mismatch(
    recorded: Option<&etcdfleet_api::ManagedIdentity>,
    wanted: &etcdfleet_api::ManagedIdentity,
) -> Option<String> {
    let recorded = recorded?;
    let mut changed = Vec::new();
    if recorded.kubeconfig_secret != wanted.kubeconfig_secret {
        changed.push(format!(
            "workload cluster (kubeconfig Secret {} → {})",
            recorded.kubeconfig_secret, wanted.kubeconfig_secret
        ));
    }
    if recorded.workload_namespace != wanted.workload_namespace {
        changed.push(format!(
            "workloadNamespace ({} → {})",
            recorded.workload_namespace, wanted.workload_namespace
        ));
    }
    if recorded.tls != wanted.tls {
        changed.push(format!("tls.enabled ({} → {})", recorded.tls, wanted.tls));
    }
    (!changed.is_empty()).then(|| {
        format!(
            "the spec moves a running etcd: {}; this would start a second, empty etcd \
             (or lock the controller out of this one). Revert the spec; to move etcd, \
             back it up and restore it into a new EtcdCluster",
            changed.join(", ")
        )
    })
}

/// Rule: workload objects at this cluster's names that another owner (or
/// nobody) holds: nothing is written, adopted or deleted.
pub(super) fn objects_owned_elsewhere(obs: &Observation) -> Option<Plan> {
    if obs.conflicts.is_empty() {
        return None;
    }
    let list: Vec<String> = obs
        .conflicts
        .iter()
        .map(|c| match &c.owner {
            Some(owner) => format!("{} (owned by {owner})", c.object),
            None => format!("{} (not made by etcdfleet: no owner label)", c.object),
        })
        .collect();
    Some(Plan::Refuse(Refusal {
        reason: "ObjectOwnedElsewhere",
        message: format!(
            "workload objects at this cluster's names belong to someone else: {}; \
             nothing is written, adopted or deleted. Rename this EtcdCluster or set a \
             different workloadNamespace",
            list.join(", ")
        ),
    }))
}

/// Rule: the CA Secret is gone while the members use its CA: a new CA
/// would lock every member out.
pub(super) fn pki_lost(obs: &Observation) -> Option<Plan> {
    obs.pki_lost.then(|| {
        Plan::Refuse(Refusal {
            reason: "PkiLost",
            message: format!(
                "the CA Secret {} is gone from the management cluster, but the members still \
                 use certificates of the old CA; a new CA would lock every member out. Restore \
                 the Secret (from a backup of the management cluster), or annotate the \
                 EtcdCluster with etcdfleet.dev/recover-ca=<request-id> to rotate to a new CA \
                 from the members' current trust; nothing is re-keyed until then",
                obs.names.pki_secret()
            ),
        })
    })
}

/// Rule: the version the spec asks for, judged against the data on the
/// volumes as last recorded: decisive when no member runs (a cluster
/// recreated over kept volumes), a second check otherwise.
pub(super) fn version_forbidden_by_volumes(obs: &Observation) -> Option<Plan> {
    let requested = obs.requested_version.as_ref()?;
    obs.pvcs.iter().find_map(|(ordinal, pvc)| {
        let data = pvc.etcd_version.as_ref()?;
        let rejection = etcdfleet_api::version::decide_with(
            Some(data),
            requested,
            obs.downgrade_acknowledged.as_deref(),
        )
        .err()?;
        Some(Plan::Refuse(Refusal {
            reason: "VersionRejected",
            message: format!(
                "PVC {} holds data last run by etcd {data}: {}",
                obs.names.pvc(*ordinal),
                rejection.message()
            ),
        }))
    })
}

/// Rule: the version the spec asks for, judged against the version each
/// member reports running.
pub(super) fn version_forbidden_by_members(obs: &Observation) -> Option<Plan> {
    let requested = obs.requested_version.as_ref()?;
    let EtcdObservation::Observed(health) = &obs.etcd else {
        return None;
    };
    health.members().iter().find_map(|m| {
        let running = m.status.as_ref().map(|s| s.version.as_str())?;
        if running.is_empty() {
            return None;
        }
        let rejection = etcdfleet_api::version::decide_with(
            Some(running),
            requested,
            obs.downgrade_acknowledged.as_deref(),
        )
        .err()?;
        Some(Plan::Refuse(Refusal {
            reason: "VersionRejected",
            message: format!(
                "member {:x} runs {running} (as etcd reports it): {}",
                m.member.id,
                rejection.message()
            ),
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::super::observation::FailedStep;
    use super::super::tests::converged;
    use super::*;

    #[test]
    fn refusals_answer_only_when_something_forbids_acting() {
        let mut obs = converged(3, 3);
        let refusals = [
            objects_owned_elsewhere,
            pki_lost,
            version_forbidden_by_volumes,
            version_forbidden_by_members,
        ];
        assert!(refusals.iter().all(|rule| rule(&obs).is_none()));
        obs.pki_lost = true;
        assert!(matches!(pki_lost(&obs), Some(Plan::Refuse(r)) if r.reason == "PkiLost"));
    }

    #[test]
    fn a_version_the_data_or_a_member_forbids_is_refused() {
        let mut obs = converged(3, 3);
        obs.requested_version = Some("3.4.23".into());
        let refused = |plan: Option<Plan>| match plan {
            Some(Plan::Refuse(r)) => r.reason == "VersionRejected",
            _ => false,
        };
        assert!(refused(version_forbidden_by_volumes(&obs)));
        assert!(refused(version_forbidden_by_members(&obs)));
        obs.pvcs.values_mut().for_each(|p| p.etcd_version = None);
        assert_eq!(version_forbidden_by_volumes(&obs), None);
    }

    #[test]
    fn the_restore_gate_holds_only_before_the_statefulset_exists() {
        let mut obs = converged(3, 3);
        obs.restore = RestoreGate::Refused(Refusal {
            reason: "SnapshotMissing",
            message: "gone".into(),
        });
        assert_eq!(
            restore_gate(&obs),
            None,
            "a running cluster is past its restore"
        );
        obs.statefulset = None;
        assert!(matches!(restore_gate(&obs), Some(Plan::Refuse(_))));
    }

    #[test]
    fn a_failing_step_holds_until_its_backoff_has_passed() {
        let mut obs = converged(1, 1);
        obs.last_failure = Some(FailedStep {
            kind: "Defragment".into(),
            failures: 3,
            age: std::time::Duration::from_secs(1),
            message: "Defragment: timeout".into(),
        });
        assert!(matches!(failure_backoff(&obs), Some(Plan::Hold(_))));
        obs.last_failure.as_mut().unwrap().age = retry_delay(3);
        assert_eq!(failure_backoff(&obs), None);
    }
}
