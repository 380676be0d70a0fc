//! When a cluster is looked at again: soon while an operation is in flight,
//! with exponential backoff while it is held or blocked, slowly (with
//! jitter) when converged.

use std::time::Duration;

use etcdfleet_api::EtcdCluster;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::context::{Context, Outcome, ReconcilerSettings, cluster_key};

/// A cluster held for a person is looked at again after 1 s, then twice as
/// long each time it is still held, up to `cap` (five converged polls); a
/// refused or blocked one (bad spec, a conflict, a snapshot that fails its
/// check) starts at `blocked_base` (the converged poll) and doubles the same
/// way. A new generation (the spec changed) starts again. `None` (and the
/// count forgotten) for any other outcome.
pub fn held_requeue(
    held: &std::sync::Mutex<std::collections::HashMap<String, (Option<i64>, u32)>>,
    outcome: &Outcome,
    cluster: &EtcdCluster,
    blocked_base: Duration,
    cap: Duration,
) -> Option<Duration> {
    let key = cluster_key(cluster);
    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
    let base = match outcome {
        Outcome::Held(_) => Duration::from_secs(1),
        Outcome::Blocked(_) => blocked_base,
        _ => {
            held.remove(&key);
            return None;
        }
    };
    let generation = cluster.metadata.generation;
    let attempt = match held.get(&key) {
        Some((g, n)) if *g == generation => n + 1,
        _ => 0,
    };
    held.insert(key, (generation, attempt));
    Some(held_delay(base, attempt, cap))
}

/// `base` × 2^attempt, at most `cap`.
pub fn held_delay(base: Duration, attempt: u32, cap: Duration) -> Duration {
    base.saturating_mul(1u32 << attempt.min(20)).min(cap)
}

/// While an operation is in flight, look again soon: 50 ms after a step
/// (its effect is usually visible within that; [`SEEN_AT_ONCE_POLL`] after a
/// step the next read shows at once), then every 50 ms for the first second
/// of a wait, growing by half to 500 ms apart until about 10 s and then up
/// to `requeue_progress` ([`in_flight_delay`]). `None` once the
/// cluster is converged, paused, blocked or gone (the slow poll applies).
pub fn in_flight_requeue(
    outcome: &Outcome,
    ctx: &Context,
    cluster: &EtcdCluster,
) -> Option<Duration> {
    let key = cluster_key(cluster);
    in_flight_poll(&ctx.in_flight, outcome, key, ctx.settings.requeue_progress)
}

/// [`in_flight_requeue`] on the count of waits in a row kept in `in_flight`.
fn in_flight_poll(
    in_flight: &std::sync::Mutex<std::collections::HashMap<String, u32>>,
    outcome: &Outcome,
    key: String,
    cap: Duration,
) -> Option<Duration> {
    let mut in_flight = in_flight.lock().unwrap_or_else(|p| p.into_inner());
    let attempt = match outcome {
        Outcome::Acted(_) => 0,
        Outcome::Waiting(_) => in_flight.get(&key).map_or(0, |n| n + 1),
        _ => {
            in_flight.remove(&key);
            return None;
        }
    };
    in_flight.insert(key, attempt);
    Some(match outcome {
        Outcome::Acted(step) if step.is_seen_at_once() => SEEN_AT_ONCE_POLL,
        _ => in_flight_delay(attempt, cap),
    })
}

/// After a step whose whole effect the next read shows (workload objects
/// written, a PVC record, a leadership move, the cluster's own annotation;
/// see [`crate::etcdcluster::plan::Step::is_seen_at_once`]): the next step
/// can be planned at once. Each of a roll's StatefulSet write, leadership
/// move and last record waited a full poll before (`make bench`). Not
/// zero, so a planner that kept planning the same write would still be
/// bounded (a reconcile costs about 13 ms: some 30 a second).
pub const SEEN_AT_ONCE_POLL: Duration = Duration::from_millis(20);

/// The first waits of an operation in flight are polled [`FLAT_POLL`]
/// apart: a restarted member answers again 0.1 to 1.2 s after its pod is
/// deleted (etcd's own shutdown waits up to a second for its peer
/// connections), and each poll after it is found up is time lost. Growing
/// from the first wait, a restarted member was seen up to 0.4 s late, a
/// tenth of a three-member roll; at 100 ms apart, about 60 ms late on
/// average (`make bench`). A reconcile of a cluster in flight costs about
/// 13 ms, so 20 a second for a second per restart is the price.
const FLAT_WAITS: u32 = 20;
const FLAT_POLL: Duration = Duration::from_millis(50);

/// Waits polled at most [`FAST_WAIT_POLL`] apart: a learner catching up and
/// etcd's storage-version migration after `downgrade enable` (its monitor
/// runs every 4 s) end within this many polls, about 10 s. Growing freely
/// instead, a 5 s wait was seen up to 1.7 s late, a third of a three-member
/// roll (`make bench`).
const FAST_WAITS: u32 = 40;
const FAST_WAIT_POLL: Duration = Duration::from_millis(500);

/// [`FLAT_POLL`] for the first [`FLAT_WAITS`] attempts, then growing by
/// half from it, at most [`FAST_WAIT_POLL`] until [`FAST_WAITS`] attempts
/// and at most `cap` after them.
pub fn in_flight_delay(attempt: u32, cap: Duration) -> Duration {
    let grown_for = attempt.saturating_sub(FLAT_WAITS - 1).min(32) as i32;
    let grown = FLAT_POLL.mul_f64(1.5f64.powi(grown_for));
    let bound = match attempt {
        a if a < FLAT_WAITS => FLAT_POLL,
        a if a < FAST_WAITS => FAST_WAIT_POLL,
        _ => cap.max(FAST_WAIT_POLL),
    };
    grown.min(bound).min(cap)
}

/// Requeue policy: soon while something is in flight, slowly (with jitter) when converged.
pub fn requeue_for(
    outcome: &Outcome,
    settings: &ReconcilerSettings,
    cluster: &EtcdCluster,
) -> Action {
    match outcome {
        Outcome::Deleted | Outcome::Stopped => Action::await_change(),
        Outcome::Acted(_) => Action::requeue(Duration::from_millis(200)),
        Outcome::Waiting(_) => Action::requeue(settings.requeue_progress),
        Outcome::Converged | Outcome::Paused(_) | Outcome::Blocked(_) | Outcome::Held(_) => {
            Action::requeue(jitter(settings.requeue_converged, &cluster.name_any()))
        }
    }
}

/// Spreads periodic polls of many clusters over time (±20%, stable per cluster).
pub fn jitter(base: Duration, key: &str) -> Duration {
    let h = key.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    });
    let permille = 800 + (h % 400);
    base * permille as u32 / 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdcluster::plan::{ObjectKind, Step};

    #[test]
    fn a_held_cluster_backs_off_exponentially_until_its_spec_changes_or_it_moves() {
        let held = std::sync::Mutex::default();
        let (base, cap) = (Duration::from_secs(60), Duration::from_secs(300));
        let mut cluster = EtcdCluster::new("c", Default::default());
        cluster.metadata.namespace = Some("ns".into());
        cluster.metadata.generation = Some(1);
        let hold = Outcome::Held("quorum lost".into());
        let delays: Vec<u64> = (0..11)
            .map(|_| {
                held_requeue(&held, &hold, &cluster, base, cap)
                    .unwrap()
                    .as_secs()
            })
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        // A spec change (new generation) is looked at again soon.
        cluster.metadata.generation = Some(2);
        assert_eq!(
            held_requeue(&held, &hold, &cluster, base, cap),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            held_requeue(&held, &hold, &cluster, base, cap),
            Some(Duration::from_secs(2))
        );
        // Any other outcome forgets the count; the next hold starts again.
        assert_eq!(
            held_requeue(&held, &Outcome::Converged, &cluster, base, cap),
            None
        );
        assert!(held.lock().unwrap().is_empty());
        // Refused or blocked: from the converged poll, doubling to the cap.
        let blocked = Outcome::Blocked("ObjectOwnedElsewhere".into());
        let delays: Vec<u64> = (0..4)
            .map(|_| {
                held_requeue(&held, &blocked, &cluster, base, cap)
                    .unwrap()
                    .as_secs()
            })
            .collect();
        assert_eq!(delays, [60, 120, 240, 300]);
        held_requeue(&held, &Outcome::Converged, &cluster, base, cap);
        assert_eq!(
            held_requeue(&held, &hold, &cluster, base, cap),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn in_flight_requeues_are_flat_for_a_second_then_grow_to_500ms_then_to_the_progress_poll() {
        let cap = Duration::from_secs(2);
        let delays: Vec<u64> = (0..43)
            .map(|n| in_flight_delay(n, cap).as_millis() as u64)
            .collect();
        assert!(delays[..20].iter().all(|&d| d == 50), "{delays:?}");
        assert_eq!(delays[..20].iter().sum::<u64>(), 1000, "flat for a second");
        assert_eq!(delays[20..26], [75, 112, 168, 253, 379, 500]);
        assert!(delays[25..40].iter().all(|&d| d == 500), "{delays:?}");
        assert_eq!(delays[40..], [2000, 2000, 2000]);
        let fast: u64 = delays[..40].iter().sum();
        assert_eq!(fast, 9487, "the fast polls cover about 10 s of waiting");
        assert_eq!(in_flight_delay(u32::MAX, cap), cap);
        // A progress poll under 500 ms bounds every poll.
        let short = Duration::from_millis(300);
        assert_eq!(in_flight_delay(24, short), short);
        assert_eq!(in_flight_delay(50, short), short);
        assert_eq!(
            in_flight_delay(3, Duration::from_millis(20)),
            Duration::from_millis(20)
        );
    }

    #[test]
    fn a_step_the_next_read_shows_is_followed_at_once_and_the_next_wait_starts_flat() {
        let in_flight = std::sync::Mutex::default();
        let cap = Duration::from_secs(2);
        let poll = |outcome: &Outcome| in_flight_poll(&in_flight, outcome, "ns/c".into(), cap);
        let waiting = Outcome::Waiting("member restarting".into());
        for _ in 0..24 {
            poll(&waiting);
        }
        let record = Outcome::Acted(Step::RecordPvcMember {
            ordinal: 0,
            member_id: 1,
            version: None,
        });
        let restart = Outcome::Acted(Step::RestartMember {
            ordinal: 0,
            member_id: 1,
        });
        assert_eq!(poll(&record), Some(SEEN_AT_ONCE_POLL));
        assert_eq!(SEEN_AT_ONCE_POLL, Duration::from_millis(20));
        let written = Outcome::Acted(Step::WriteObjects(vec![ObjectKind::StatefulSet]));
        assert_eq!(poll(&written), Some(SEEN_AT_ONCE_POLL));
        assert_eq!(
            poll(&waiting),
            Some(Duration::from_millis(50)),
            "a wait after the step starts flat again"
        );
        assert_eq!(poll(&restart), Some(Duration::from_millis(50)));
        assert_eq!(poll(&Outcome::Converged), None);
        assert!(in_flight.lock().unwrap().is_empty());
    }

    #[test]
    fn the_outcomes_polled_slowly_are_the_ones_at_rest() {
        let settings = ReconcilerSettings::default();
        let mut cluster = EtcdCluster::new("c", Default::default());
        cluster.metadata.namespace = Some("ns".into());
        let outcomes = [
            Outcome::Converged,
            Outcome::Paused(None),
            Outcome::Blocked("bad spec".into()),
            Outcome::Deleted,
            Outcome::Waiting("x".into()),
            Outcome::Held("quorum lost".into()),
            Outcome::Acted(Step::AddLearner { ordinal: 1 }),
        ];
        let at_rest: Vec<bool> = outcomes.iter().map(Outcome::is_at_rest).collect();
        assert_eq!(at_rest, [true, true, true, true, false, false, false]);
        // At rest, and not deleted: looked at again on the slow poll.
        for outcome in &outcomes[..3] {
            let action = requeue_for(outcome, &settings, &cluster);
            let slow = Action::requeue(jitter(settings.requeue_converged, "c"));
            assert_eq!(action, slow, "{outcome:?}");
        }
    }

    #[test]
    fn jitter_spreads_polls_within_twenty_percent_and_is_stable() {
        let base = Duration::from_secs(60);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..50 {
            let key = format!("cluster-{i}");
            let d = jitter(base, &key);
            assert!(d >= base * 8 / 10 && d < base * 12 / 10, "{d:?}");
            assert_eq!(d, jitter(base, &key), "stable per cluster");
            seen.insert(d);
        }
        assert!(seen.len() > 10, "spread: {seen:?}");
    }

    #[test]
    fn requeue_is_soon_while_acting_and_slow_when_converged() {
        let settings = ReconcilerSettings::default();
        let cluster = EtcdCluster::new("c", Default::default());
        let converged = requeue_for(&Outcome::Converged, &settings, &cluster);
        let acted = requeue_for(
            &Outcome::Acted(Step::AddLearner { ordinal: 1 }),
            &settings,
            &cluster,
        );
        assert_eq!(acted, Action::requeue(Duration::from_millis(200)));
        assert_eq!(
            requeue_for(&Outcome::Waiting("x".into()), &settings, &cluster),
            Action::requeue(settings.requeue_progress)
        );
        assert_ne!(converged, acted);
        assert_eq!(
            requeue_for(&Outcome::Deleted, &settings, &cluster),
            Action::await_change()
        );
    }
}
