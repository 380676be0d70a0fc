//! Report step of a rollout: the events a person follows (`kubectl describe
//! etcdfleetrollout`), derived from what changed between the status read
//! and the status planned, and the status write itself (only when it
//! changed, conditional on the resourceVersion read).

use std::collections::BTreeMap;

use etcdfleet_api::rollout::cluster_state::{DONE, FAILED, IN_PROGRESS, PENDING, SKIPPED};
use etcdfleet_api::rollout::phase;
use etcdfleet_api::{ClusterRolloutStatus, EtcdFleetRollout, EtcdFleetRolloutStatus};
use kube::Resource;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;

use crate::access::Access;

/// Per kind of change, more clusters than this in one reconcile make one
/// event that counts them (a first reconcile over a fleet that mostly
/// matches already must not publish a thousand events).
const EVENTS_PER_KIND: usize = 5;

/// One event to publish on the rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutEvent {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

fn event(warning: bool, reason: &str, note: String) -> RolloutEvent {
    RolloutEvent {
        warning,
        reason: reason.to_string(),
        note,
    }
}

/// What a record's change of state is called in an event.
fn transition(
    old: Option<&ClusterRolloutStatus>,
    new: &ClusterRolloutStatus,
) -> Option<(bool, &'static str)> {
    let before = old.map_or(PENDING, |r| r.state.as_str());
    if before == new.state {
        return None;
    }
    Some(match new.state.as_str() {
        IN_PROGRESS => (false, "ClusterChanged"),
        DONE => (false, "ClusterDone"),
        FAILED => (true, "ClusterFailed"),
        SKIPPED => (true, "ClusterSkipped"),
        _ => return None,
    })
}

/// The events between two statuses: clusters changed, done, failed,
/// skipped; the phase moving (a wave soaking, halted, complete, paused).
pub fn events(old: &EtcdFleetRolloutStatus, new: &EtcdFleetRolloutStatus) -> Vec<RolloutEvent> {
    let before: BTreeMap<&str, &ClusterRolloutStatus> =
        old.clusters.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut by_kind: BTreeMap<(bool, &str), Vec<&ClusterRolloutStatus>> = BTreeMap::new();
    for rec in &new.clusters {
        if let Some(kind) = transition(before.get(rec.name.as_str()).copied(), rec) {
            by_kind.entry(kind).or_default().push(rec);
        }
    }
    let mut out = Vec::new();
    for ((warning, reason), recs) in by_kind {
        if recs.len() > EVENTS_PER_KIND {
            let names: Vec<&str> = recs
                .iter()
                .take(EVENTS_PER_KIND)
                .map(|r| r.name.as_str())
                .collect();
            out.push(event(
                warning,
                reason,
                format!("{} clusters, e.g. {}", recs.len(), names.join(", ")),
            ));
            continue;
        }
        for rec in recs {
            let why = rec.message.as_deref().unwrap_or_default();
            out.push(event(
                warning,
                reason,
                format!("{} (wave {}): {why}", rec.name, rec.wave),
            ));
        }
    }
    if old.phase != new.phase
        && let Some(p) = new.phase.as_deref()
    {
        let message = new
            .conditions
            .iter()
            .find(|c| c.type_ == etcdfleet_api::rollout::condition::PROGRESSING)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        out.push(event(p == phase::HALTED, p, message));
    }
    out
}

/// Publishes the events of this reconcile on the rollout.
pub async fn publish(rollout: &EtcdFleetRollout, events: &[RolloutEvent], access: &Access) {
    let reference = rollout.object_ref(&());
    for e in events {
        let type_ = if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        access
            .publish_about(&reference, type_, &e.reason, &e.note)
            .await;
    }
}

/// Writes the status if it changed; returns whether it wrote.
pub async fn write(
    rollout: &EtcdFleetRollout,
    new: &EtcdFleetRolloutStatus,
    access: &Access,
) -> Result<bool, kube::Error> {
    let c = &new.counts;
    access.metrics.set_rollout_clusters(
        &rollout.name_any(),
        &[
            (PENDING, c.pending),
            (IN_PROGRESS, c.in_progress),
            (DONE, c.done),
            (FAILED, c.failed),
            (SKIPPED, c.skipped),
        ],
    );
    if rollout.status.as_ref() == Some(new) {
        return Ok(false);
    }
    let api: Api<EtcdFleetRollout> = Api::all(access.management.clone());
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": rollout.resource_version() },
        "status": new,
    });
    api.patch_status(
        &rollout.name_any(),
        &crate::controller_patch_params(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, state: &str) -> ClusterRolloutStatus {
        ClusterRolloutStatus {
            name: name.into(),
            wave: 1,
            state: state.into(),
            message: Some("why".into()),
            ..Default::default()
        }
    }

    #[test]
    fn events_name_each_cluster_that_moved_and_count_a_crowd() {
        let old = EtcdFleetRolloutStatus {
            clusters: vec![rec("ns/a", PENDING), rec("ns/b", IN_PROGRESS)],
            phase: Some(phase::PROGRESSING.into()),
            ..Default::default()
        };
        let mut new = EtcdFleetRolloutStatus {
            clusters: vec![rec("ns/a", IN_PROGRESS), rec("ns/b", FAILED)],
            phase: Some(phase::HALTED.into()),
            ..Default::default()
        };
        let got = events(&old, &new);
        let reasons: Vec<(&str, bool)> =
            got.iter().map(|e| (e.reason.as_str(), e.warning)).collect();
        assert_eq!(
            reasons,
            [
                ("ClusterChanged", false),
                ("ClusterFailed", true),
                ("Halted", true)
            ]
        );
        assert_eq!(got[1].note, "ns/b (wave 1): why");
        new.clusters = (0..20).map(|i| rec(&format!("ns/c{i}"), DONE)).collect();
        new.phase = old.phase.clone();
        let got = events(&old, &new);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].note.starts_with("20 clusters, e.g. ns/c0, "));
    }
}
