//! What the current wave would do next, judged once when [`super::Work`]
//! is built, from its pending clusters in rollout order: the version gate
//! (every pending cluster allowed the target version before the wave
//! writes anything) and the turn (which cluster is taken next). Both are
//! marks on records, not changes: only the rule that answers with them
//! (`version gate of the wave`, `next cluster`) has them written, so a
//! paused, aborted or halted rollout shows its records as they were judged.

use std::collections::BTreeMap;

use etcdfleet_api::rollout::cluster_state::{FAILED, IN_PROGRESS, PENDING, SKIPPED};
use etcdfleet_api::version::decide;
use etcdfleet_api::{ClusterRolloutStatus, EtcdFleetRolloutSpec};
use k8s_openapi::jiff::Timestamp;

use super::records::Mark;
use super::view::ClusterView;

/// How the current wave's turn ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TurnEnd {
    /// Nothing to write now: as many clusters in flight as allowed, or no
    /// pending cluster of the wave left.
    #[default]
    Wait,
    /// The cluster to write (its mark is the turn's last).
    Write {
        cluster: String,
        resource_version: Option<String>,
        wave: i32,
    },
    /// A cluster not healthy before its change (its mark, failed, is the
    /// turn's last): nothing is written into it, and the rollout halts.
    Unhealthy,
}

/// The current wave's next step: the records it marks, in rollout order,
/// and how it ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    pub marks: Vec<Mark>,
    pub end: TurnEnd,
}

/// The pending records of `wave` whose cluster is selected, in rollout order.
fn pending<'a>(
    records: &'a [ClusterRolloutStatus],
    views: &'a BTreeMap<&str, &'a ClusterView>,
    wave: i32,
) -> impl Iterator<Item = (usize, &'a ClusterView)> + 'a {
    records
        .iter()
        .enumerate()
        .filter(move |(_, rec)| rec.wave == wave && rec.state == PENDING)
        .filter_map(|(i, rec)| views.get(rec.name.as_str()).map(|view| (i, *view)))
}

/// The version gate of `wave`: each pending cluster the version policy
/// refuses the `target` version, failed (empty: the wave may be written).
pub fn version_gate(
    records: &[ClusterRolloutStatus],
    views: &BTreeMap<&str, &ClusterView>,
    wave: i32,
    target: Option<&str>,
) -> Vec<Mark> {
    let Some(target) = target else {
        return Vec::new();
    };
    pending(records, views, wave)
        .filter_map(|(i, view)| {
            let rejection = decide(view.reported.current_version.as_deref(), target).err()?;
            Some(Mark::new(
                i,
                FAILED,
                "VersionRefused",
                format!(
                    "{}: {}; refused before the wave changed any cluster",
                    rejection.reason(),
                    rejection.message()
                ),
            ))
        })
        .collect()
}

/// The turn of `wave`: its pending clusters in rollout order, while fewer
/// than `max_in_flight` are in flight. A paused one is skipped; an
/// unhealthy one fails and ends the turn (nothing is written into a
/// cluster that is not healthy); one whose spec already asks for the
/// change is followed without a write (it is in flight from now); the
/// first other one is written and ends the turn.
pub fn next_turn(
    records: &[ClusterRolloutStatus],
    views: &BTreeMap<&str, &ClusterView>,
    wave: i32,
    spec: &EtcdFleetRolloutSpec,
    now: Timestamp,
    max_in_flight: usize,
) -> Turn {
    let mut in_flight = records.iter().filter(|r| r.state == IN_PROGRESS).count();
    let mut marks = Vec::new();
    for (i, view) in pending(records, views, wave) {
        if in_flight >= max_in_flight {
            break;
        }
        if view.paused {
            let why = "spec.paused is true on the cluster: not changed";
            marks.push(Mark::new(i, SKIPPED, "ClusterPaused", why));
            continue;
        }
        if let Err(why) = view.healthy() {
            marks.push(Mark::new(i, FAILED, "NotHealthyBeforeChange", why));
            let end = TurnEnd::Unhealthy;
            return Turn { marks, end };
        }
        let from = view.reported.current_version.clone();
        if view.spec_matches(spec) {
            let why = "the spec already asks for the change; followed without a write";
            marks.push(Mark::new(i, IN_PROGRESS, "AlreadyRequested", why).taken(now, from));
            in_flight += 1;
            continue;
        }
        let changed = Mark::new(i, IN_PROGRESS, "Changed", "changed by this rollout");
        marks.push(changed.taken(now, from));
        let end = TurnEnd::Write {
            cluster: view.key.clone(),
            resource_version: view.resource_version.clone(),
            wave,
        };
        return Turn { marks, end };
    }
    Turn {
        marks,
        end: TurnEnd::Wait,
    }
}
