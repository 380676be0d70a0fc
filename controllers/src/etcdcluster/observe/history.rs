//! What the stored status remembers, as the planner needs it: the members
//! past their failure grace (`status.members[].unhealthySince`, so a
//! controller restart does not reset the clock), the last step if it
//! failed, and the voters listed last time. Pure: the controller reads it
//! from the EtcdCluster (`super::observe`), `etcdfleet plan` from the
//! status it is given.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcdfleet_api::replacement::{self, Replacement};
use etcdfleet_api::{EtcdClusterStatus, MemberStatus};
use k8s_openapi::jiff::Timestamp;

use super::super::plan::observation::{FailedStep, READY_POD_GRACE_FACTOR};
use crate::etcd::{ClusterHealth, MemberObservation};
use crate::render::Names;

/// What the stored status remembers (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct History {
    pub failed_members: BTreeSet<u64>,
    pub failed_long_ago: BTreeSet<u64>,
    pub last_failure: Option<FailedStep>,
    pub known_voters: u32,
    /// Members of this cluster were listed (an adopted etcd's old members
    /// are not).
    pub had_members: bool,
    /// Whether each failed member may be replaced now, by member id
    /// (`etcdfleet_api::replacement`).
    pub replacements: BTreeMap<u64, Replacement>,
}

impl History {
    /// The history `status` keeps, judged at `now` against the members
    /// etcd lists (`health`, when it answered) and the failure `grace`.
    pub fn of(
        status: &EtcdClusterStatus,
        (health, names): (Option<&ClusterHealth>, &Names),
        grace: Duration,
        now: Timestamp,
    ) -> Self {
        let failed = |grace| match health {
            Some(h) => failed_members(status, h, grace, now),
            None => BTreeSet::new(),
        };
        let failed_members = failed(grace);
        let replacements = match health {
            Some(h) => replacements(status, (h, names), &failed_members, grace, now),
            None => BTreeMap::new(),
        };
        History {
            replacements,
            failed_members,
            failed_long_ago: failed(grace * READY_POD_GRACE_FACTOR),
            last_failure: last_failure(status, now),
            known_voters: status.members.iter().filter(|m| !m.learner).count() as u32,
            had_members: status
                .members
                .iter()
                .any(|m| names.ordinal_of(&m.name).is_some()),
        }
    }
}

/// For each failed member, whether it may be replaced now: from the
/// replacements its name has had (`status.replacements`) and since when it
/// has been unhealthy this time.
fn replacements(
    status: &EtcdClusterStatus,
    (health, names): (&ClusterHealth, &Names),
    failed: &BTreeSet<u64>,
    grace: Duration,
    now: Timestamp,
) -> BTreeMap<u64, Replacement> {
    let members = health
        .members()
        .iter()
        .filter(|m| failed.contains(&m.member.id));
    members
        .filter_map(|m| {
            let ordinal = names.ordinal_of_peer_url(m.member.peer_urls.first()?)?;
            let name = names.pod(ordinal);
            let made = status.replacements.iter().find(|r| r.member == name);
            let since = recorded(status, m)?.unhealthy_since.as_ref().map(|t| t.0);
            Some((m.member.id, replacement::judge(made, since, grace, now)))
        })
        .collect()
}

/// Members etcd lists as unhealthy whose stored `unhealthySince` is at
/// least `grace` before `now`. A listed member is matched by its id, or by
/// its name where the status recorded no id.
pub fn failed_members(
    status: &EtcdClusterStatus,
    health: &ClusterHealth,
    grace: Duration,
    now: Timestamp,
) -> BTreeSet<u64> {
    down_since(status, health, grace, now).into_keys().collect()
}

/// Members etcd lists as unhealthy whose stored `unhealthySince` is at
/// least `grace` before `now`, with that time.
pub fn down_since(
    status: &EtcdClusterStatus,
    health: &ClusterHealth,
    grace: Duration,
    now: Timestamp,
) -> BTreeMap<u64, Timestamp> {
    health
        .members()
        .iter()
        .filter(|m| !m.healthy)
        .filter_map(|m| {
            let since = recorded(status, m)?.unhealthy_since.as_ref()?.0;
            let down = Duration::try_from(now.duration_since(since)).ok()?;
            (down >= grace).then_some((m.member.id, since))
        })
        .collect()
}

fn recorded<'a>(status: &'a EtcdClusterStatus, m: &MemberObservation) -> Option<&'a MemberStatus> {
    let id = format!("{:x}", m.member.id);
    status.members.iter().find(|s| match &s.id {
        Some(recorded) => *recorded == id,
        None => s.name == m.member.name,
    })
}

/// The last step, if it failed (`status.lastOperation`).
fn last_failure(status: &EtcdClusterStatus, now: Timestamp) -> Option<FailedStep> {
    let op = status.last_operation.as_ref()?;
    (op.outcome == "Failed").then(|| FailedStep {
        kind: op.type_.clone(),
        failures: op.failures.unwrap_or(1).max(1) as u32,
        age: op
            .time
            .as_ref()
            .and_then(|t| Duration::try_from(now.duration_since(t.0)).ok())
            .unwrap_or(Duration::MAX),
        message: op.message.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdcluster::plan::tests::{member, names};

    #[test]
    fn a_member_is_failed_once_its_stored_unhealthy_since_is_older_than_the_grace() {
        let health = ClusterHealth::new(vec![
            member(0, true, true, false),
            member(1, false, false, false),
        ]);
        let since = |ago: i64| {
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ago),
            ))
        };
        let status = |ago| EtcdClusterStatus {
            members: vec![MemberStatus {
                name: names().pod(1),
                id: Some(format!("{:x}", 101)),
                unhealthy_since: since(ago),
                ..Default::default()
            }],
            ..Default::default()
        };
        let grace = Duration::from_secs(120);
        assert!(failed_members(&status(60), &health, grace, Timestamp::now()).is_empty());
        assert_eq!(
            failed_members(&status(600), &health, grace, Timestamp::now()),
            BTreeSet::from([101])
        );
        // A status without ids (as `plan` may be given) matches by name.
        let mut unnamed = status(600);
        unnamed.members[0].id = None;
        assert_eq!(
            failed_members(&unnamed, &health, grace, Timestamp::now()),
            BTreeSet::from([101])
        );
        let history = History::of(
            &status(300),
            (Some(&health), &names()),
            grace,
            Timestamp::now(),
        );
        assert_eq!(history.failed_members, BTreeSet::from([101]));
        assert!(history.failed_long_ago.is_empty(), "five graces not yet");
        assert!(history.had_members);
    }
}
