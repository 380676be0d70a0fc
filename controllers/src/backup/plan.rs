//! The backup planner: pure decisions on what one `EtcdBackup` reconcile
//! does next, and which member a snapshot is streamed from.

use std::time::Duration;

use etcdfleet_api::backup::{MAX_ATTEMPTS, phase};
use k8s_openapi::jiff::Timestamp;

/// What the planner needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupObservation {
    pub phase: Option<String>,
    pub attempts: i32,
    pub next_attempt_at: Option<Timestamp>,
    pub now: Timestamp,
    /// Why the cluster cannot be backed up now (`None`: it can).
    pub cluster_not_ready: Option<String>,
    /// Another backup of the same cluster that is running.
    pub other_running: Option<String>,
}

/// The next thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupPlan {
    /// Succeeded, or failed for good: nothing more.
    Done,
    /// Try again after the delay.
    Wait { why: String, after: Duration },
    /// Take the snapshot (attempt number `attempt`).
    Take { attempt: i32 },
}

/// Decides the next step of one backup.
pub fn plan_backup(o: &BackupObservation) -> BackupPlan {
    match o.phase.as_deref() {
        Some(phase::SUCCEEDED) | Some(phase::FAILED) => return BackupPlan::Done,
        _ => {}
    }
    if let Some(other) = &o.other_running {
        return BackupPlan::Wait {
            why: format!("backup {other} of the same cluster is running"),
            after: Duration::from_secs(5),
        };
    }
    if let Some(at) = o.next_attempt_at
        && at > o.now
    {
        let secs = (at.as_millisecond() - o.now.as_millisecond()).max(0) as u64;
        return BackupPlan::Wait {
            why: "backing off after a failed attempt".into(),
            after: Duration::from_millis(secs),
        };
    }
    if let Some(why) = &o.cluster_not_ready {
        return BackupPlan::Wait {
            why: why.clone(),
            after: Duration::from_secs(5),
        };
    }
    BackupPlan::Take {
        attempt: o.attempts + 1,
    }
}

/// Whether attempt `attempt` failing ends the backup as `Failed`.
pub fn is_last_attempt(attempt: i32) -> bool {
    attempt >= MAX_ATTEMPTS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs() -> BackupObservation {
        BackupObservation {
            phase: None,
            attempts: 0,
            next_attempt_at: None,
            now: "2026-11-22T06:00:00Z".parse().unwrap(),
            cluster_not_ready: None,
            other_running: None,
        }
    }

    #[test]
    fn planner_table() {
        let now = obs().now;
        let cases: Vec<(&str, BackupObservation, BackupPlan)> = vec![
            (
                "new backup is taken",
                obs(),
                BackupPlan::Take { attempt: 1 },
            ),
            (
                "succeeded is done",
                BackupObservation {
                    phase: Some(phase::SUCCEEDED.into()),
                    ..obs()
                },
                BackupPlan::Done,
            ),
            (
                "failed for good is done",
                BackupObservation {
                    phase: Some(phase::FAILED.into()),
                    ..obs()
                },
                BackupPlan::Done,
            ),
            (
                "one backup per cluster at a time",
                BackupObservation {
                    other_running: Some("b1".into()),
                    ..obs()
                },
                BackupPlan::Wait {
                    why: "backup b1 of the same cluster is running".into(),
                    after: Duration::from_secs(5),
                },
            ),
            (
                "backoff is respected",
                BackupObservation {
                    attempts: 2,
                    next_attempt_at: Some(now + Duration::from_secs(20)),
                    phase: Some(phase::PENDING.into()),
                    ..obs()
                },
                BackupPlan::Wait {
                    why: "backing off after a failed attempt".into(),
                    after: Duration::from_secs(20),
                },
            ),
            (
                "after the backoff the next attempt runs",
                BackupObservation {
                    attempts: 2,
                    next_attempt_at: Some(now - Duration::from_secs(1)),
                    phase: Some(phase::PENDING.into()),
                    ..obs()
                },
                BackupPlan::Take { attempt: 3 },
            ),
            (
                "a cluster that is not ready is waited for",
                BackupObservation {
                    cluster_not_ready: Some("EtcdCluster x is not Available".into()),
                    ..obs()
                },
                BackupPlan::Wait {
                    why: "EtcdCluster x is not Available".into(),
                    after: Duration::from_secs(5),
                },
            ),
        ];
        for (what, o, want) in cases {
            assert_eq!(plan_backup(&o), want, "{what}");
        }
        assert!(!is_last_attempt(MAX_ATTEMPTS - 1));
        assert!(is_last_attempt(MAX_ATTEMPTS));
    }
}
