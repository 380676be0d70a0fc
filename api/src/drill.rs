//! Restore drills, the pure part: the policy in force, which backup the
//! next drill takes and when, what the scratch etcd must show for a backup
//! to pass ([`judge`]), and what the last drill still proves ([`proof`]).
//! No I/O: the backup controller observes and acts (docs/backups.md).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::backup::{
    BackupConfigError, DataFingerprint, DrillResult, drill_result, parse_duration,
};
use crate::destination::DrillPolicy;

/// How long a passed drill proves its backups restorable when the policy
/// does not say.
pub const DEFAULT_FRESH_FOR: Duration = Duration::from_secs(7 * 86_400);

/// The drill policy in force ([`Drills::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drills {
    pub every_nth_backup: u32,
    pub fresh_for: Duration,
    pub node_selector: BTreeMap<String, String>,
    pub suspended: bool,
}

impl Drills {
    /// Field by field, the schedule's policy over the cluster's
    /// (`spec.backup.drill`, which templates default); `None` when neither
    /// asks for drills.
    pub fn resolve(
        schedule: Option<&DrillPolicy>,
        cluster: Option<&DrillPolicy>,
    ) -> Result<Option<Drills>, BackupConfigError> {
        if schedule.is_none() && cluster.is_none() {
            return Ok(None);
        }
        fn pick<T>(
            schedule: Option<&DrillPolicy>,
            cluster: Option<&DrillPolicy>,
            field: impl Fn(&DrillPolicy) -> Option<T>,
        ) -> Option<T> {
            schedule
                .and_then(&field)
                .or_else(|| cluster.and_then(&field))
        }
        let every = pick(schedule, cluster, |p| p.every_nth_backup);
        let fresh_for = pick(schedule, cluster, |p| p.fresh_for.clone());
        let node_selector = pick(schedule, cluster, |p| p.node_selector.clone());
        let suspended = pick(schedule, cluster, |p| p.suspend);
        Ok(Some(Drills {
            every_nth_backup: every.unwrap_or(1).max(1) as u32,
            fresh_for: fresh_for
                .as_deref()
                .map(parse_duration)
                .transpose()?
                .unwrap_or(DEFAULT_FRESH_FOR),
            node_selector: node_selector.unwrap_or_default(),
            suspended: suspended.unwrap_or(false),
        }))
    }
}

/// A successful backup of the schedule, as the next drill's choice sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub completed: Timestamp,
}

/// What the next drill does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Drill this backup now.
    Drill(String),
    /// Drill after this many more successful backups.
    AfterBackups(u32),
    Suspended,
    /// No successful backup yet.
    NoBackup,
}

impl std::fmt::Display for Next {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Next::Drill(b) => write!(f, "now: {b}"),
            Next::AfterBackups(1) => write!(f, "after the next successful backup"),
            Next::AfterBackups(n) => write!(f, "after {n} more successful backups"),
            Next::Suspended => write!(f, "suspended (drill.suspend)"),
            Next::NoBackup => write!(f, "after the first successful backup"),
        }
    }
}

/// The next drill: the newest successful backup once `every_nth_backup`
/// successful backups were taken after the last drilled one (at once when
/// none was drilled, or the drilled one is gone). A backup is drilled once:
/// its result stands until a newer backup is due.
pub fn next_drill(policy: &Drills, backups: &[Candidate], last: Option<&DrillResult>) -> Next {
    if policy.suspended {
        return Next::Suspended;
    }
    let mut newest_first: Vec<&Candidate> = backups.iter().collect();
    newest_first.sort_by(|a, b| b.completed.cmp(&a.completed).then(b.name.cmp(&a.name)));
    let Some(newest) = newest_first.first() else {
        return Next::NoBackup;
    };
    let since_last = match last.map(|l| &l.backup) {
        None => None,
        Some(drilled) => newest_first.iter().position(|b| &b.name == drilled),
    };
    match since_last {
        Some(newer) if (newer as u32) < policy.every_nth_backup => {
            Next::AfterBackups(policy.every_nth_backup - newer as u32)
        }
        _ => Next::Drill(newest.name.clone()),
    }
}

/// What the scratch etcd said once it served: its revision, and at the
/// fingerprint's revision (after compacting to the fingerprint's compacted
/// revision, so both hashes cover the same history) its hash and key count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub revision: i64,
    pub at_fingerprint: Option<AtRevision>,
    /// Keys of the sample read back whole (values included).
    pub keys_read: u64,
}

/// etcd's `HashKV` and a count-only range at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtRevision {
    pub compact_revision: i64,
    pub hash: i64,
    pub key_count: i64,
}

/// What a drill concluded about the backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Passed(String),
    Failed {
        reason: &'static str,
        message: String,
    },
}

/// Failure reasons that speak of the backup itself (its object or data).
pub mod reason {
    /// The object does not match the size or SHA-256 the backup recorded.
    pub const OBJECT_CHANGED: &str = "ObjectChanged";
    /// The object is whole but etcd could not restore or serve it.
    pub const NOT_RESTORABLE: &str = "NotRestorable";
    pub const REVISION_BEHIND: &str = "RevisionBehind";
    pub const COMPACTION_DIFFERS: &str = "CompactionDiffers";
    pub const KEY_COUNT_DIFFERS: &str = "KeyCountDiffers";
    pub const HASH_DIFFERS: &str = "HashDiffers";
}

/// Judges what the restored etcd showed against what the backup recorded:
/// at least the backup's revision, and at the fingerprint's revision the
/// same compaction, key count and hash as the member had. A backup without
/// a fingerprint (taken by a release before drills) passes on revision and
/// reads alone, and says so.
pub fn judge(backup_revision: i64, fingerprint: Option<&DataFingerprint>, r: &Reading) -> Verdict {
    let failed = |reason, message| Verdict::Failed { reason, message };
    if r.revision < backup_revision {
        return failed(
            reason::REVISION_BEHIND,
            format!(
                "the restored etcd is at revision {}; the backup recorded at least {backup_revision}",
                r.revision
            ),
        );
    }
    let Some(fp) = fingerprint else {
        return Verdict::Passed(format!(
            "restored to revision {} and served {} keys; no fingerprint was recorded with this \
             backup (taken before drills), so its hash and key count were not compared",
            r.revision, r.keys_read
        ));
    };
    let Some(at) = &r.at_fingerprint else {
        return failed(
            reason::NOT_RESTORABLE,
            format!(
                "the restored etcd could not hash its keys at revision {}",
                fp.revision
            ),
        );
    };
    if at.compact_revision != fp.compact_revision {
        return failed(
            reason::COMPACTION_DIFFERS,
            format!(
                "the restored data is compacted at revision {}, the member's was at {} when the \
                 backup was taken",
                at.compact_revision, fp.compact_revision
            ),
        );
    }
    if at.key_count != fp.key_count {
        return failed(
            reason::KEY_COUNT_DIFFERS,
            format!(
                "{} keys at revision {} in the restored etcd, {} in the member when the backup \
                 was taken",
                at.key_count, fp.revision, fp.key_count
            ),
        );
    }
    if at.hash != fp.hash {
        return failed(
            reason::HASH_DIFFERS,
            format!(
                "the key space at revision {} hashes to {:08x} restored, {:08x} in the member",
                fp.revision, at.hash, fp.hash
            ),
        );
    }
    Verdict::Passed(format!(
        "restored to revision {}; at revision {} its {} keys hash to {:08x}, as in the member \
         when the backup was taken; {} keys read back",
        r.revision, fp.revision, at.key_count, at.hash, r.keys_read
    ))
}

/// What the last drill proves about a cluster's backups now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// Passed within the freshness window.
    Proven {
        backup: String,
    },
    /// Passed, but longer ago than the freshness window.
    Stale {
        backup: String,
        age: Duration,
    },
    /// The newest drill failed: that backup does not restore.
    Failed {
        backup: String,
        reason: String,
        message: String,
    },
    /// The newest drill could not run (its pod, the store, a timeout): it
    /// says nothing of the backup.
    Inconclusive {
        backup: String,
        message: String,
    },
    Never,
}

/// What `last` proves at `now`.
pub fn proof(last: Option<&DrillResult>, fresh_for: Duration, now: Timestamp) -> Proof {
    let Some(last) = last else {
        return Proof::Never;
    };
    let backup = last.backup.clone();
    match last.result.as_str() {
        drill_result::PASSED => {
            let done = last.completed_at.as_ref().map_or(now, |t| t.0);
            let age =
                Duration::from_secs(now.as_second().saturating_sub(done.as_second()).max(0) as u64);
            if age > fresh_for {
                Proof::Stale { backup, age }
            } else {
                Proof::Proven { backup }
            }
        }
        drill_result::FAILED => Proof::Failed {
            backup,
            reason: last.reason.clone().unwrap_or_default(),
            message: last.message.clone(),
        },
        _ => Proof::Inconclusive {
            backup,
            message: last.message.clone(),
        },
    }
}

/// Why a drill does not start on a cluster with these conditions: one
/// that is not Available, or is Progressing (a version change, a volume
/// change, a roll or a recovery under way), is not drilled until it is
/// settled.
pub fn unsettled(cluster: &str, conditions: &[Condition]) -> Option<String> {
    if !crate::conditions::is_true(conditions, crate::conditions::AVAILABLE) {
        return Some(format!("EtcdCluster {cluster} is not Available"));
    }
    crate::conditions::is_true(conditions, crate::conditions::PROGRESSING)
        .then(|| format!("EtcdCluster {cluster} is Progressing (a change is under way)"))
}

/// The EtcdCluster condition saying whether its backups restore.
pub const RESTORABLE_CONDITION: &str = "BackupsRestorable";

/// The `BackupsRestorable` condition a proof gives: status (`None`:
/// Unknown), reason and message.
pub fn condition_of(proof: &Proof, fresh_for: Duration) -> (Option<bool>, &'static str, String) {
    let hours = |d: Duration| d.as_secs() / 3600;
    match proof {
        Proof::Proven { backup } => (
            Some(true),
            "DrillPassed",
            format!("the last restore drill (backup {backup}) restored what the backup recorded"),
        ),
        Proof::Failed {
            backup,
            reason,
            message,
        } => (
            Some(false),
            "DrillFailed",
            format!("the last restore drill of backup {backup} failed ({reason}): {message}"),
        ),
        Proof::Stale { backup, age } => (
            None,
            "DrillStale",
            format!(
                "the last passed restore drill (backup {backup}) is {} h old, more than the {} h \
                 it counts for (drill.freshFor)",
                hours(*age),
                hours(fresh_for)
            ),
        ),
        Proof::Inconclusive { backup, message } => (
            None,
            "DrillError",
            format!("the last restore drill (backup {backup}) could not run: {message}"),
        ),
        Proof::Never => (
            None,
            "NoDrillYet",
            "no restore drill has run yet".to_string(),
        ),
    }
}

/// Whether a backup may seed an automatic recovery: not when its last
/// drill failed (an inconclusive drill does not count against it).
pub fn fit_for_recovery(last: Option<&DrillResult>) -> bool {
    last.is_none_or(|d| d.result != drill_result::FAILED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn backups(n: i64) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                name: format!("b{i}"),
                completed: at(i * 3600),
            })
            .collect()
    }

    fn result(backup: &str, result: &str, done: i64) -> DrillResult {
        DrillResult {
            backup: backup.into(),
            result: result.into(),
            completed_at: Some(Time(at(done))),
            ..Default::default()
        }
    }

    fn every(n: u32) -> Drills {
        Drills {
            every_nth_backup: n,
            fresh_for: DEFAULT_FRESH_FOR,
            node_selector: BTreeMap::new(),
            suspended: false,
        }
    }

    #[test]
    fn the_newest_backup_is_drilled_every_nth_backup() {
        let six = backups(6);
        assert_eq!(next_drill(&every(1), &[], None), Next::NoBackup);
        assert_eq!(next_drill(&every(3), &six, None), Next::Drill("b5".into()));
        let drilled = |b: &str| result(b, drill_result::PASSED, 0);
        assert_eq!(
            next_drill(&every(1), &six, Some(&drilled("b5"))),
            Next::AfterBackups(1)
        );
        assert_eq!(
            next_drill(&every(1), &six, Some(&drilled("b4"))),
            Next::Drill("b5".into())
        );
        assert_eq!(
            next_drill(&every(3), &six, Some(&drilled("b4"))),
            Next::AfterBackups(2)
        );
        assert_eq!(
            next_drill(&every(3), &six, Some(&drilled("b2"))),
            Next::Drill("b5".into())
        );
        // The drilled backup was pruned: the newest is drilled.
        assert_eq!(
            next_drill(&every(3), &six, Some(&drilled("gone"))),
            Next::Drill("b5".into())
        );
        // A failed drill is not repeated on the same backup.
        let failed = result("b5", drill_result::FAILED, 0);
        assert_eq!(
            next_drill(&every(1), &six, Some(&failed)),
            Next::AfterBackups(1)
        );
        let mut off = every(1);
        off.suspended = true;
        assert_eq!(next_drill(&off, &six, None), Next::Suspended);
        assert_eq!(
            Next::AfterBackups(2).to_string(),
            "after 2 more successful backups"
        );
    }

    #[test]
    fn the_policy_resolves_field_by_field_from_the_schedule_then_the_cluster() {
        assert_eq!(Drills::resolve(None, None), Ok(None));
        let cluster = DrillPolicy {
            every_nth_backup: Some(4),
            fresh_for: Some("2d".into()),
            ..Default::default()
        };
        let schedule = DrillPolicy {
            every_nth_backup: Some(2),
            ..Default::default()
        };
        let d = Drills::resolve(Some(&schedule), Some(&cluster))
            .unwrap()
            .unwrap();
        assert_eq!(d.every_nth_backup, 2);
        assert_eq!(d.fresh_for, Duration::from_secs(2 * 86_400));
        let d = Drills::resolve(None, Some(&DrillPolicy::default()))
            .unwrap()
            .unwrap();
        assert_eq!((d.every_nth_backup, d.fresh_for), (1, DEFAULT_FRESH_FOR));
        let bad = DrillPolicy {
            fresh_for: Some("soon".into()),
            ..Default::default()
        };
        assert!(Drills::resolve(Some(&bad), None).is_err());
    }

    fn fingerprint() -> DataFingerprint {
        DataFingerprint {
            revision: 120,
            compact_revision: 40,
            hash: 0xdead_beef,
            key_count: 17,
        }
    }

    fn reading(compact: i64, hash: i64, keys: i64) -> Reading {
        Reading {
            revision: 125,
            at_fingerprint: Some(AtRevision {
                compact_revision: compact,
                hash,
                key_count: keys,
            }),
            keys_read: 10,
        }
    }

    fn failure(v: Verdict) -> &'static str {
        match v {
            Verdict::Failed { reason, .. } => reason,
            Verdict::Passed(why) => panic!("passed: {why}"),
        }
    }

    #[test]
    fn a_drill_passes_only_when_revision_compaction_count_and_hash_match() {
        let fp = fingerprint();
        let good = reading(40, 0xdead_beef, 17);
        let Verdict::Passed(why) = judge(120, Some(&fp), &good) else {
            panic!("failed")
        };
        assert!(why.contains("17 keys hash to deadbeef"), "{why}");
        assert_eq!(
            failure(judge(130, Some(&fp), &good)),
            reason::REVISION_BEHIND
        );
        assert_eq!(
            failure(judge(120, Some(&fp), &reading(41, 0xdead_beef, 17))),
            reason::COMPACTION_DIFFERS
        );
        assert_eq!(
            failure(judge(120, Some(&fp), &reading(40, 0xdead_beef, 16))),
            reason::KEY_COUNT_DIFFERS
        );
        assert_eq!(
            failure(judge(120, Some(&fp), &reading(40, 0xbeef, 17))),
            reason::HASH_DIFFERS
        );
        let unhashed = Reading {
            at_fingerprint: None,
            ..good.clone()
        };
        assert_eq!(
            failure(judge(120, Some(&fp), &unhashed)),
            reason::NOT_RESTORABLE
        );
        // Without a fingerprint, revision and reads alone, said so.
        let Verdict::Passed(why) = judge(120, None, &unhashed) else {
            panic!("failed")
        };
        assert!(why.contains("not compared"), "{why}");
    }

    #[test]
    fn the_last_drill_proves_restorable_until_it_ages_and_a_failure_unfits_its_backup() {
        let day = Duration::from_secs(86_400);
        let now = at(3 * 86_400);
        assert_eq!(proof(None, day, now), Proof::Never);
        let passed = result("b1", drill_result::PASSED, 3 * 86_400 - 3600);
        assert_eq!(
            proof(Some(&passed), day, now),
            Proof::Proven {
                backup: "b1".into()
            }
        );
        let old = result("b1", drill_result::PASSED, 0);
        assert!(matches!(proof(Some(&old), day, now), Proof::Stale { age, .. } if age == 3 * day));
        let mut failed = result("b2", drill_result::FAILED, 0);
        failed.reason = Some(reason::HASH_DIFFERS.into());
        assert!(
            matches!(proof(Some(&failed), day, now), Proof::Failed { reason, .. } if reason == reason::HASH_DIFFERS)
        );
        let error = result("b3", drill_result::ERROR, 0);
        assert!(matches!(
            proof(Some(&error), day, now),
            Proof::Inconclusive { .. }
        ));
        assert!(fit_for_recovery(None));
        assert!(fit_for_recovery(Some(&passed)));
        assert!(fit_for_recovery(Some(&error)));
        assert!(!fit_for_recovery(Some(&failed)));
        let (status, reason, message) = condition_of(&proof(Some(&failed), day, now), day);
        assert_eq!((status, reason), (Some(false), "DrillFailed"));
        assert!(
            message.contains("b2") && message.contains(reason::HASH_DIFFERS),
            "{message}"
        );
        let (status, reason, message) = condition_of(&proof(Some(&old), day, now), day);
        assert_eq!((status, reason), (None, "DrillStale"));
        assert!(
            message.contains("72 h old, more than the 24 h"),
            "{message}"
        );
    }

    #[test]
    fn a_drill_waits_while_the_cluster_is_not_available_or_a_change_is_under_way() {
        use crate::conditions::{AVAILABLE, PROGRESSING, condition};
        let now = Time(at(0));
        let c = |t: &str, s: bool, reason: &str| condition(t, s, reason, "", None, now.clone());
        let settled = [
            c(AVAILABLE, true, "QuorumHealthy"),
            c(PROGRESSING, false, "Converged"),
        ];
        assert_eq!(unsettled("a", &settled), None);
        // A version change, a volume change, a roll: the step in flight.
        for step in ["UpgradeMember", "ExpandVolume", "RestartMember", "Waiting"] {
            let changing = [
                c(AVAILABLE, true, "QuorumHealthy"),
                c(PROGRESSING, true, step),
            ];
            let why = unsettled("a", &changing).expect("a change under way waits");
            assert!(why.contains("EtcdCluster a is Progressing"), "{why}");
        }
        // A lost quorum (a recovery follows), or no status yet.
        let lost = [
            c(AVAILABLE, false, "QuorumLost"),
            c(PROGRESSING, false, "NeedsAttention"),
        ];
        let why = unsettled("a", &lost).expect("an unavailable cluster waits");
        assert!(why.contains("EtcdCluster a is not Available"), "{why}");
        assert!(unsettled("a", &[]).is_some());
    }
}
